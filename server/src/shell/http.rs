//! The node's small HTTP/1.1 servers (the status page, the metrics) on hyper, behind
//! the same connection budgets as the gRPC ports (`sources::admitted`): HTTPS with
//! the node's certificate, or plain HTTP with --insecure-plaintext, a cap on the
//! connections served at once and per source address, deadlines for a request's
//! head and for a client that reads nothing of an answer, and a longest life for a
//! connection.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tokio_stream::{Stream, StreamExt};

use crate::shell::sources::{plain_admitted, SourceLimits, WriteDeadline};
use crate::shell::tls::{tls_incoming, ServerTls};

/// What one HTTP port allows.
#[derive(Clone, Copy, Debug)]
pub struct HttpLimits {
    /// Connections served at once; more wait in the accept queue.
    pub connections: usize,
    /// What one source address may hold.
    pub sources: SourceLimits,
    /// A request whose head is not complete by then ends its connection.
    pub header_timeout_ms: u64,
    /// A connection whose client reads none of an answer for this long is closed.
    pub write_timeout_ms: u64,
    /// The largest request head read.
    pub request_bytes_max: usize,
    /// A connection is closed after this long whatever it does (a scraper connects
    /// again); `None`: as long as it is used.
    pub lifetime_ms: Option<u64>,
}

/// The bearer token a request carries (`Authorization: Bearer <token>`); empty when
/// it carries none.
pub fn bearer_token<B>(request: &Request<B>) -> &str {
    request
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
        .map(str::trim)
        .unwrap_or("")
}

/// A connection after its handshake, TLS or plain.
trait Connection: AsyncRead + AsyncWrite + Send + Unpin {}
impl<S: AsyncRead + AsyncWrite + Send + Unpin> Connection for S {}

type Connections = Pin<Box<dyn Stream<Item = std::io::Result<Box<dyn Connection>>> + Send>>;

/// Serves `answer` on `listener` until `stopped`: HTTPS when `tls`, else plain HTTP,
/// within `limits`.
pub async fn serve<A, F>(
    port: &'static str,
    listener: TcpListener,
    tls: Option<Arc<ServerTls>>,
    limits: HttpLimits,
    mut stopped: watch::Receiver<bool>,
    answer: A,
) where
    A: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<Full<Bytes>>> + Send + 'static,
{
    let mut incoming: Connections = match tls {
        Some(tls) => Box::pin(
            tls_incoming(listener, tls, limits.sources)
                .map(|stream| stream.map(|stream| Box::new(stream) as Box<dyn Connection>)),
        ),
        None => Box::pin(
            plain_admitted(port, listener, limits.sources)
                .map(|stream| stream.map(|stream| Box::new(stream) as Box<dyn Connection>)),
        ),
    };
    let connections = Arc::new(Semaphore::new(limits.connections));
    loop {
        let Ok(permit) = connections.clone().acquire_owned().await else { return };
        let stream = tokio::select! {
            stream = incoming.next() => stream,
            _ = stopped.wait_for(|stop| *stop) => return,
        };
        let stream = match stream {
            Some(Ok(stream)) => stream,
            Some(Err(_)) => continue,
            None => return,
        };
        let answer = answer.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let answer = answer.clone();
                async move { Ok::<_, Infallible>(answer(request).await) }
            });
            let stream = WriteDeadline::new(stream, Duration::from_millis(limits.write_timeout_ms));
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(Duration::from_millis(limits.header_timeout_ms))
                .max_buf_size(limits.request_bytes_max)
                .serve_connection(TokioIo::new(stream), service);
            match limits.lifetime_ms {
                Some(lifetime) => {
                    let _ = tokio::time::timeout(Duration::from_millis(lifetime), connection).await;
                }
                None => {
                    let _ = connection.await;
                }
            }
            drop(permit);
        });
    }
}
