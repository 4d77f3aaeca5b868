//! TLS on both ports, with rustls (ring). The node's certificates, keys and CAs are
//! read at start and again on SIGHUP; a new handshake uses what was read last, and
//! connections already open keep theirs, so rotating a certificate drops no session.
//!
//! * The client port presents `tls_cert`; with `client_ca` it also asks clients for
//!   a certificate (optional: a client may use a bearer token instead) and maps a
//!   verified one to its tenant (`leasehold_proto::identity`).
//! * The peer port is mutual: a node presents `peer_cert` both as a server and as a
//!   client, and accepts only peers whose certificate the cluster CA (`peer_ca`)
//!   signed. Which node a peer is, is read from its certificate (`node_id_presented`)
//!   and checked against the sender a Raft message claims.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use leasehold_proto::identity;
use rustls::crypto::CryptoProvider;
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tokio_stream::wrappers::ReceiverStream;

use crate::shell::clock::LogLimiter;
use crate::shell::sources::{admitted, after_first_bytes, Counted, SourceLimits, REFUSAL_LOG_INTERVAL_MS};

/// How long a client or peer may take to complete its TLS handshake.
pub const HANDSHAKE_TIMEOUT_MS: u64 = 10_000;

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certificates = CertificateDer::pem_file_iter(path)
        .map_err(|error| format!("{}: {error}", path.display()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| format!("{}: {error}", path.display()))?;
    if certificates.is_empty() {
        return Err(format!("{}: no PEM certificate in the file", path.display()));
    }
    Ok(certificates)
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, String> {
    PrivateKeyDer::from_pem_file(path)
        .map_err(|error| format!("{}: no usable PEM private key: {error}", path.display()))
}

fn read_roots(path: &Path) -> Result<Arc<RootCertStore>, String> {
    let mut roots = RootCertStore::empty();
    for certificate in read_certificates(path)? {
        roots.add(certificate).map_err(|error| format!("{}: not a CA certificate: {error}", path.display()))?;
    }
    Ok(Arc::new(roots))
}

/// A certificate and its key, and whether (and from which CA) the other side must
/// present one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// The CA of the other side's certificates; none: the other side presents none.
    pub ca: Option<PathBuf>,
}

/// Whether a port requires the other side's certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientCertificates {
    Required,
    Optional,
}

/// One port's TLS server configuration, swapped whole on reload.
pub struct ServerTls {
    /// "client", "peer" or "status", for messages.
    port: &'static str,
    files: TlsFiles,
    client_certificates: ClientCertificates,
    /// The application protocol offered: gRPC's HTTP/2, or HTTP/1.1 for the status page.
    alpn: &'static [u8],
    config: RwLock<Arc<ServerConfig>>,
    refusals: LogLimiter,
}

impl ServerTls {
    /// Reads the files; an error names the file and what is wrong with it.
    pub fn load(
        port: &'static str,
        files: TlsFiles,
        client_certificates: ClientCertificates,
    ) -> Result<Arc<ServerTls>, String> {
        ServerTls::load_with(port, files, client_certificates, b"h2")
    }

    /// The status page's HTTPS: the client port's certificate, HTTP/1.1, and no client
    /// certificate asked for (a browser proves nothing with one; the page asks for the
    /// admin credential).
    pub fn load_https(port: &'static str, client_port: &TlsFiles) -> Result<Arc<ServerTls>, String> {
        let files = TlsFiles { ca: None, ..client_port.clone() };
        ServerTls::load_with(port, files, ClientCertificates::Optional, b"http/1.1")
    }

    fn load_with(
        port: &'static str,
        files: TlsFiles,
        client_certificates: ClientCertificates,
        alpn: &'static [u8],
    ) -> Result<Arc<ServerTls>, String> {
        let config = build_server_config(&files, client_certificates, alpn)?;
        Ok(Arc::new(ServerTls {
            port,
            files,
            client_certificates,
            alpn,
            config: RwLock::new(config),
            refusals: LogLimiter::new(Duration::from_millis(REFUSAL_LOG_INTERVAL_MS)),
        }))
    }

    /// Reads the files again into a new configuration, without installing it.
    fn rebuild(&self) -> Result<Arc<ServerConfig>, String> {
        build_server_config(&self.files, self.client_certificates, self.alpn)
            .map_err(|error| format!("{} port: {error}", self.port))
    }

    fn install(&self, config: Arc<ServerConfig>) {
        *self.config.write().unwrap() = config;
    }

    fn acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(self.config.read().unwrap().clone())
    }

    fn log_refusal(&self, peer: std::net::SocketAddr, error: &dyn std::fmt::Display) {
        if self.refusals.allow() {
            tracing::warn!(
                target: "audit",
                port = self.port,
                %peer,
                %error,
                "refused a TLS handshake (logged at most once a second per port)"
            );
        }
    }
}

fn build_server_config(
    files: &TlsFiles,
    client_certificates: ClientCertificates,
    alpn: &[u8],
) -> Result<Arc<ServerConfig>, String> {
    let provider = provider();
    let chain = read_certificates(&files.cert)?;
    let key = read_key(&files.key)?;
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|error| error.to_string())?;
    let builder = match &files.ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let verifier = WebPkiClientVerifier::builder_with_provider(read_roots(ca)?, provider);
            let verifier = match client_certificates {
                ClientCertificates::Required => verifier.build(),
                ClientCertificates::Optional => verifier.allow_unauthenticated().build(),
            }
            .map_err(|error| format!("{}: {error}", ca.display()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_single_cert(chain, key).map_err(|error| {
        format!("{} and {}: the key does not fit the certificate: {error}", files.cert.display(), files.key.display())
    })?;
    // One protocol per port: gRPC's HTTP/2 (a client that negotiates nothing else is
    // refused by tonic), or the status page's HTTP/1.1.
    config.alpn_protocols = vec![alpn.to_vec()];
    Ok(Arc::new(config))
}

/// The TLS client configuration a node dials its peers with: its peer certificate as
/// its identity, the cluster CA as the only root.
pub struct PeerClientTls {
    files: TlsFiles,
    config: RwLock<Arc<ClientConfig>>,
}

impl PeerClientTls {
    pub fn load(files: TlsFiles) -> Result<Arc<PeerClientTls>, String> {
        let config = build_client_config(&files)?;
        Ok(Arc::new(PeerClientTls { files, config: RwLock::new(config) }))
    }

    /// The configuration of the next handshake.
    pub fn config(&self) -> Arc<ClientConfig> {
        self.config.read().unwrap().clone()
    }
}

fn build_client_config(files: &TlsFiles) -> Result<Arc<ClientConfig>, String> {
    let ca = files.ca.as_ref().expect("peers always verify each other");
    let roots = read_roots(ca)?;
    let chain = read_certificates(&files.cert)?;
    let key = read_key(&files.key)?;
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|error| error.to_string())?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .map_err(|error| {
            format!(
                "{} and {}: the key does not fit the certificate: {error}",
                files.cert.display(),
                files.key.display()
            )
        })?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// Every TLS configuration of a node, reloaded together.
pub struct NodeTls {
    pub client_port: Arc<ServerTls>,
    pub peer_port: Arc<ServerTls>,
    pub peer_client: Arc<PeerClientTls>,
    /// The status page's HTTPS, when --status-addr is set.
    pub status_port: Option<Arc<ServerTls>>,
    /// The metrics' HTTPS, when --metrics-addr is set.
    pub metrics_port: Option<Arc<ServerTls>>,
}

impl NodeTls {
    /// Reads every file again; installs the new configurations only if all of them
    /// load, so a half-written certificate changes nothing (send SIGHUP again once
    /// the files are complete).
    pub fn reload(&self) -> Result<(), String> {
        let client_port = self.client_port.rebuild()?;
        let peer_port = self.peer_port.rebuild()?;
        let peer_client = build_client_config(&self.peer_client.files).map_err(|error| format!("peers: {error}"))?;
        let https_ports = [&self.status_port, &self.metrics_port].into_iter().flatten();
        let https_ports: Vec<_> =
            https_ports.map(|port| port.rebuild().map(|config| (port, config))).collect::<Result<_, _>>()?;
        self.client_port.install(client_port);
        self.peer_port.install(peer_port);
        for (port, config) in https_ports {
            port.install(config);
        }
        *self.peer_client.config.write().unwrap() = peer_client;
        Ok(())
    }
}

/// The connections `listener` accepts, each after a completed TLS handshake with the
/// configuration current at that moment, held to the budgets of `sources::admitted`:
/// per source address (`limits`), `HANDSHAKES_IN_PROGRESS_MAX` at once, first bytes
/// within `FIRST_BYTES_TIMEOUT_MS`, and the handshake done within
/// `HANDSHAKE_TIMEOUT_MS`. Refusals are logged (rate-limited). The stream ends when
/// its reader goes away.
pub fn tls_incoming(
    listener: TcpListener,
    tls: Arc<ServerTls>,
    limits: SourceLimits,
) -> ReceiverStream<Result<Counted<TlsStream<TcpStream>>, io::Error>> {
    let refusals = tls.clone();
    let refused =
        move |peer: std::net::SocketAddr, problem: &dyn std::fmt::Display| refusals.log_refusal(peer, problem);
    admitted(tls.port, listener, limits, refused, move |stream| {
        let acceptor = tls.acceptor();
        async move {
            let stream = after_first_bytes(stream).await?;
            match tokio::time::timeout(Duration::from_millis(HANDSHAKE_TIMEOUT_MS), acceptor.accept(stream)).await {
                Ok(handshaken) => handshaken,
                Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, "the handshake timed out")),
            }
        }
    })
}

/// The DNS names a certificate presents, for messages.
pub fn presented_names(certificate: &CertificateDer<'_>) -> Vec<String> {
    match webpki::EndEntityCert::try_from(certificate) {
        Ok(certificate) => certificate.valid_dns_names().map(str::to_owned).collect(),
        Err(_) => Vec::new(),
    }
}

/// The node a peer's verified certificate chain names (`node-<id>.leasehold`); the
/// error says what it presented instead.
pub fn node_id_presented(chain: Option<&[CertificateDer<'static>]>) -> Result<u64, String> {
    let Some(leaf) = chain.and_then(|chain| chain.first()) else {
        return Err("no certificate".to_string());
    };
    let names = presented_names(leaf);
    let mut ids = names.iter().filter_map(|name| identity::node_id_of(name));
    match (ids.next(), ids.next()) {
        (Some(id), None) => Ok(id),
        (Some(_), Some(_)) => Err(format!("a certificate naming several nodes: {names:?}")),
        (None, _) => Err(format!("a certificate naming no node: {names:?}")),
    }
}

/// A tenant a client's verified certificate names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantPresented {
    pub tenant: String,
    /// The certificate tag (`identity::certificate_tag`); `None` for a certificate
    /// in the untagged form, which no longer authenticates.
    pub tag: Option<String>,
}

/// The tenant a client's verified certificate chain names
/// (`<tenant>.<tag>.tenant.leasehold`); `None` when it names none or several.
pub fn tenant_presented(chain: &[CertificateDer<'static>]) -> Option<TenantPresented> {
    let names = presented_names(chain.first()?);
    let mut tenants = names.iter().filter_map(|name| identity::tenant_of(name));
    match (tenants.next(), tenants.next()) {
        (Some(name), None) => Some(TenantPresented {
            tenant: name.tenant().to_string(),
            tag: match name {
                identity::TenantName::Tagged { tag, .. } => Some(tag.to_string()),
                identity::TenantName::Untagged { .. } => None,
            },
        }),
        _ => None,
    }
}
