//! One GET to a node's HTTP port (metrics, status page), over HTTPS trusting the
//! cluster CA, or plain HTTP; with a bearer token when one is given. Enough HTTP/1.1
//! for what the tests read: a status code and a body, the connection closed after.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Context};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long one GET may take, connect to last byte.
pub const GET_DEADLINE: Duration = Duration::from_secs(10);

/// An answer: the status code and the body.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    pub body: String,
}

/// `GET path` from `address` (host:port): over TLS trusting `ca_file` when given,
/// else plain HTTP; `token` as `Authorization: Bearer`.
pub async fn get(address: &str, ca_file: Option<&Path>, token: Option<&str>, path: &str) -> anyhow::Result<Answer> {
    tokio::time::timeout(GET_DEADLINE, get_unbounded(address, ca_file, token, path))
        .await
        .map_err(|_| anyhow!("GET {path} from {address}: no answer within {GET_DEADLINE:?}"))?
}

async fn get_unbounded(
    address: &str,
    ca_file: Option<&Path>,
    token: Option<&str>,
    path: &str,
) -> anyhow::Result<Answer> {
    let stream = TcpStream::connect(address).await.with_context(|| format!("connect to {address}"))?;
    let authorization = token.map(|token| format!("Authorization: Bearer {token}\r\n")).unwrap_or_default();
    let request = format!("GET {path} HTTP/1.1\r\nHost: {address}\r\n{authorization}Connection: close\r\n\r\n");
    let response = match ca_file {
        None => exchange(stream, &request).await?,
        Some(ca_file) => {
            let mut roots = rustls::RootCertStore::empty();
            for certificate in CertificateDer::pem_file_iter(ca_file).context("read the CA")? {
                roots.add(certificate.context("a CA certificate")?)?;
            }
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let mut config = rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()?
                .with_root_certificates(roots)
                .with_no_client_auth();
            config.alpn_protocols = vec![b"http/1.1".to_vec()];
            let host = address.rsplit_once(':').map_or(address, |(host, _)| host);
            let name = ServerName::try_from(host.to_string()).context("a server name")?;
            let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
            let stream = connector.connect(name, stream).await.with_context(|| format!("TLS to {address}"))?;
            exchange(stream, &request).await?
        }
    };
    let (head, body) = response.split_once("\r\n\r\n").ok_or_else(|| anyhow!("no end of head in {response:?}"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| anyhow!("no status in {head:?}"))?;
    Ok(Answer { status, body: body.to_string() })
}

async fn exchange(mut stream: impl AsyncRead + AsyncWrite + Unpin, request: &str) -> anyhow::Result<String> {
    stream.write_all(request.as_bytes()).await?;
    let mut response = Vec::new();
    // A TLS peer that closes without close_notify still sent the whole answer.
    match stream.read_to_end(&mut response).await {
        Ok(_) => {}
        Err(error) if error.kind() == std::io::ErrorKind::UnexpectedEof && !response.is_empty() => {}
        Err(error) => return Err(error.into()),
    }
    Ok(String::from_utf8_lossy(&response).into_owned())
}
