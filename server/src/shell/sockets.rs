//! Where a node's connections come from when they do not come from the operating
//! system: a simulator's network (`Sockets`), handed in through
//! `node::Environment::sockets`.
//!
//! A node that serves clients binds real TCP listeners and dials real peers (TLS on
//! both ports, see `shell::tls`); none of this module is on that path. Under a
//! simulator the client and peer servers accept the simulator's connections in
//! plaintext, and peers are dialed through it, so that the gRPC services, tonic and
//! hyper run unchanged over a network that the simulator's seed drives.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::{Connected, TcpConnectInfo};

/// A connection's byte stream, whatever carries it.
pub trait Connection: AsyncRead + AsyncWrite + Send + Unpin + 'static {}

impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> Connection for T {}

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A listener of a simulated network.
pub trait Listener: Send + 'static {
    /// The next connection and the address it came from.
    fn accept(&mut self) -> BoxFuture<'_, io::Result<(Box<dyn Connection>, SocketAddr)>>;
    fn local_addr(&self) -> io::Result<SocketAddr>;
}

/// A simulated network: binds listeners and dials addresses (`host:port`).
pub trait Sockets: Send + Sync + 'static {
    fn bind(&self, address: SocketAddr) -> BoxFuture<'_, io::Result<Box<dyn Listener>>>;
    fn connect(&self, authority: String) -> BoxFuture<'static, io::Result<Box<dyn Connection>>>;
}

/// An accepted connection as tonic's server takes it: the byte stream with the
/// addresses of both ends (what `Request::remote_addr` reads).
pub struct Accepted {
    connection: Box<dyn Connection>,
    local: SocketAddr,
    remote: SocketAddr,
}

impl Connected for Accepted {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        TcpConnectInfo { local_addr: Some(self.local), remote_addr: Some(self.remote) }
    }
}

impl AsyncRead for Accepted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
        buffer: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.connection).poll_read(context, buffer)
    }
}

impl AsyncWrite for Accepted {
    fn poll_write(mut self: Pin<&mut Self>, context: &mut Context<'_>, bytes: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.connection).poll_write(context, bytes)
    }

    fn poll_flush(mut self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.connection).poll_flush(context)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.connection).poll_shutdown(context)
    }
}

/// Connections accepted on `listener`, as a stream for `serve_with_incoming`. The
/// accepting task ends when the server stops reading the stream.
pub fn incoming(mut listener: Box<dyn Listener>) -> ReceiverStream<io::Result<Accepted>> {
    let (accepted, stream) = mpsc::channel(16);
    tokio::spawn(async move {
        let Ok(local) = listener.local_addr() else { return };
        loop {
            let next = tokio::select! {
                _ = accepted.closed() => return,
                next = listener.accept() => next,
            };
            let next = next.map(|(connection, remote)| Accepted { connection, local, remote });
            if accepted.send(next).await.is_err() {
                return;
            }
        }
    });
    ReceiverStream::new(stream)
}

/// A tonic connector that dials through `sockets` (`Endpoint::connect_with_connector`).
pub fn connector(
    sockets: Arc<dyn Sockets>,
) -> impl tower::Service<
    tonic::codegen::http::Uri,
    Response = TokioIo<Box<dyn Connection>>,
    Error = io::Error,
    Future = impl Send,
> + Clone
       + Send
       + 'static {
    tower::service_fn(move |uri: tonic::codegen::http::Uri| {
        let authority = uri.authority().map(|authority| authority.as_str().to_string()).unwrap_or_default();
        let connecting = sockets.connect(authority);
        async move { connecting.await.map(TokioIo::new) }
    })
}
