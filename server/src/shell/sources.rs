//! Connection budgets per source address, for the listeners that take connections
//! from anyone who can reach them, before any credential is checked: one address
//! cannot hold all of a port's handshake slots or connections, so clients from other
//! addresses still get in while it floods the port.
//!
//! A `Slot` counts one connection of a source from its accept to its close, and while
//! its handshake runs, one handshake too; both counts drop when the slot is dropped.
//! `Counted` carries the slot along with the connection's stream. `admitted` is the
//! accept loop every such port runs, with its handshake (TLS, or none) as a parameter.

use std::collections::HashMap;
use std::fmt::Display;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Semaphore};
use tokio_stream::wrappers::ReceiverStream;

/// How long a new connection may stay silent before its first bytes (of a TLS
/// handshake, or of a request): an idle socket holds a slot no longer than this.
pub const FIRST_BYTES_TIMEOUT_MS: u64 = 2_000;
/// Handshakes in progress on one port at most; more connections are closed at once.
pub const HANDSHAKES_IN_PROGRESS_MAX: usize = 256;
/// Accepted connections waiting for the server to take them at most.
pub const HANDSHAKEN_QUEUED_MAX: usize = 128;
/// A refused connection is logged at most once per this interval and port (a client
/// with a wrong certificate retries without end).
pub const REFUSAL_LOG_INTERVAL_MS: u64 = 1_000;

/// The connections `listener` accepts, each after `handshake` (a TLS handshake, or
/// none), counted against its source address's `limits` for as long as it is open.
/// The accept loop never waits: a connection whose source is at its limits, or that
/// finds every one of the port's `HANDSHAKES_IN_PROGRESS_MAX` handshake slots taken,
/// is closed at once, so a flood from one address leaves the others' connections to
/// be accepted. A connection must send its first bytes within
/// `FIRST_BYTES_TIMEOUT_MS`; `handshake` bounds its own time. Refusals go to
/// `refused` (which rate-limits its log); a connection closed before it sent anything
/// is a port probe (a health check, a test waiting for the port), not a refusal. The
/// stream ends when its reader goes away.
pub fn admitted<S, H, F>(
    port: &'static str,
    listener: TcpListener,
    limits: SourceLimits,
    refused: impl Fn(SocketAddr, &dyn Display) + Clone + Send + Sync + 'static,
    handshake: H,
) -> ReceiverStream<io::Result<Counted<S>>>
where
    S: Send + 'static,
    H: Fn(TcpStream) -> F + Send + 'static,
    F: Future<Output = io::Result<S>> + Send + 'static,
{
    let (handshaken, incoming) = mpsc::channel(HANDSHAKEN_QUEUED_MAX);
    let handshakes = Arc::new(Semaphore::new(HANDSHAKES_IN_PROGRESS_MAX));
    let sources = Sources::new(limits);
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                _ = handshaken.closed() => return,
                accepted = listener.accept() => accepted,
            };
            let (stream, peer) = match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of file descriptors, say: pause rather than spin.
                    tracing::warn!(port, %error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let slot = match sources.admit(peer.ip()) {
                Ok(slot) => slot,
                Err(Refusal::Handshakes) => {
                    let held = limits.handshakes;
                    refused(peer, &format_args!("its address already has {held} handshakes in progress"));
                    continue;
                }
                Err(Refusal::Connections) => {
                    let held = limits.connections;
                    refused(peer, &format_args!("its address already has {held} connections open"));
                    continue;
                }
            };
            let Ok(permit) = handshakes.clone().try_acquire_owned() else {
                refused(peer, &"every handshake slot of the port is taken");
                continue;
            };
            // Small answers must not wait for the peer's delayed ACK (about 40 ms).
            let _ = stream.set_nodelay(true);
            let handshaken = handshaken.clone();
            let refused = refused.clone();
            let handshake = handshake(stream);
            tokio::spawn(async move {
                let mut slot = slot;
                match handshake.await {
                    Ok(stream) => {
                        drop(permit);
                        slot.handshaken();
                        let _ = handshaken.send(Ok(Counted::new(stream, slot))).await;
                    }
                    Err(error) if error.kind() == io::ErrorKind::UnexpectedEof => {}
                    Err(error) => refused(peer, &error),
                }
            });
        }
    });
    ReceiverStream::new(incoming)
}

/// Waits for `stream`'s first bytes, at most `FIRST_BYTES_TIMEOUT_MS`; then hands
/// the stream on (a peek, not `readable()`, which may be ready before any byte came).
pub async fn after_first_bytes(stream: TcpStream) -> io::Result<TcpStream> {
    let mut first = [0u8; 1];
    match tokio::time::timeout(Duration::from_millis(FIRST_BYTES_TIMEOUT_MS), stream.peek(&mut first)).await {
        Ok(Ok(read)) if read > 0 => Ok(stream),
        Ok(Ok(_)) => Err(io::ErrorKind::UnexpectedEof.into()),
        Ok(Err(error)) => Err(error),
        Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, "it sent nothing")),
    }
}

/// The plaintext connections `listener` accepts, held to the same budgets as TLS
/// ones (`admitted`), each after its first bytes (`after_first_bytes`).
pub fn plain_admitted(
    port: &'static str,
    listener: TcpListener,
    limits: SourceLimits,
) -> ReceiverStream<io::Result<Counted<TcpStream>>> {
    let log = Arc::new(crate::shell::clock::LogLimiter::new(Duration::from_millis(REFUSAL_LOG_INTERVAL_MS)));
    let refused = move |peer: SocketAddr, problem: &dyn Display| {
        if log.allow() {
            tracing::warn!(target: "audit", port, %peer, %problem, "refused a connection (logged at most once a second per port)");
        }
    };
    admitted(port, listener, limits, refused, after_first_bytes)
}

/// What one source address may hold on one port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SourceLimits {
    /// Connections that have not finished their handshake.
    pub handshakes: usize,
    /// Open connections, handshakes included.
    pub connections: usize,
}

#[derive(Default, Debug)]
struct Counts {
    handshakes: usize,
    connections: usize,
}

/// The connections of each source address on one port.
#[derive(Debug)]
pub struct Sources {
    limits: SourceLimits,
    counts: Mutex<HashMap<IpAddr, Counts>>,
}

/// Why a connection was not admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    Handshakes,
    Connections,
}

impl Sources {
    pub fn new(limits: SourceLimits) -> Arc<Sources> {
        Arc::new(Sources { limits, counts: Mutex::new(HashMap::new()) })
    }

    /// Admits a new connection of `source` in its handshake, unless the source is at
    /// one of its limits.
    pub fn admit(self: &Arc<Self>, source: IpAddr) -> Result<Slot, Refusal> {
        let mut counts = self.counts.lock().unwrap();
        let count = counts.entry(source).or_default();
        if count.connections >= self.limits.connections {
            return Err(Refusal::Connections);
        }
        if count.handshakes >= self.limits.handshakes {
            return Err(Refusal::Handshakes);
        }
        count.connections += 1;
        count.handshakes += 1;
        Ok(Slot { sources: self.clone(), source, in_handshake: true })
    }

    /// The connections and handshakes `source` holds now.
    #[cfg(test)]
    fn held(&self, source: IpAddr) -> (usize, usize) {
        let counts = self.counts.lock().unwrap();
        counts.get(&source).map_or((0, 0), |count| (count.connections, count.handshakes))
    }

    /// Source addresses that hold a connection now.
    #[cfg(test)]
    fn sources(&self) -> usize {
        self.counts.lock().unwrap().len()
    }
}

/// One connection of a source, counted until dropped.
#[derive(Debug)]
pub struct Slot {
    sources: Arc<Sources>,
    source: IpAddr,
    in_handshake: bool,
}

impl Slot {
    /// The handshake finished: the connection no longer counts as one in handshake.
    pub fn handshaken(&mut self) {
        if std::mem::take(&mut self.in_handshake) {
            let mut counts = self.sources.counts.lock().unwrap();
            counts.get_mut(&self.source).expect("a slot's source is counted").handshakes -= 1;
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut counts = self.sources.counts.lock().unwrap();
        let count = counts.get_mut(&self.source).expect("a slot's source is counted");
        count.connections -= 1;
        if self.in_handshake {
            count.handshakes -= 1;
        }
        if count.connections == 0 {
            counts.remove(&self.source);
        }
    }
}

/// A connection's stream with the slot that counts it.
#[derive(Debug)]
pub struct Counted<S> {
    inner: S,
    _slot: Slot,
}

impl<S> Counted<S> {
    pub fn new(inner: S, slot: Slot) -> Counted<S> {
        Counted { inner, _slot: slot }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Counted<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
        buffer: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(context, buffer)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Counted<S> {
    fn poll_write(mut self: Pin<&mut Self>, context: &mut Context<'_>, buffer: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(context, buffer)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
        buffers: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(context, buffers)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(context)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(context)
    }
}

impl<S: tonic::transport::server::Connected> tonic::transport::server::Connected for Counted<S> {
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

/// A stream whose writes fail once one has made no progress for `timeout`: a client
/// that asks and never reads the answer frees its connection then, instead of
/// holding it for as long as it likes.
#[derive(Debug)]
pub struct WriteDeadline<S> {
    inner: S,
    timeout: Duration,
    stalled: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<S> WriteDeadline<S> {
    pub fn new(inner: S, timeout: Duration) -> WriteDeadline<S> {
        WriteDeadline { inner, timeout, stalled: None }
    }

    /// After a write or flush that is pending: an error once the stall has lasted
    /// `timeout`, else pending (woken by the timer too).
    fn stall<T>(&mut self, context: &mut Context<'_>) -> Poll<io::Result<T>> {
        let timeout = self.timeout;
        let stalled = self.stalled.get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        match stalled.as_mut().poll(context) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the peer read nothing for {} ms", timeout.as_millis()),
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for WriteDeadline<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
        buffer: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(context, buffer)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for WriteDeadline<S> {
    fn poll_write(mut self: Pin<&mut Self>, context: &mut Context<'_>, buffer: &[u8]) -> Poll<io::Result<usize>> {
        match Pin::new(&mut self.inner).poll_write(context, buffer) {
            Poll::Pending => self.stall(context),
            ready => {
                self.stalled = None;
                ready
            }
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<io::Result<()>> {
        match Pin::new(&mut self.inner).poll_flush(context) {
            Poll::Pending => self.stall(context),
            ready => {
                self.stalled = None;
                ready
            }
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(context)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: SourceLimits = SourceLimits { handshakes: 2, connections: 3 };

    #[test]
    fn a_source_is_held_to_its_limits_and_others_are_not_touched() {
        let sources = Sources::new(LIMITS);
        let flooding: IpAddr = "127.0.0.2".parse().unwrap();
        let other: IpAddr = "127.0.0.1".parse().unwrap();
        let mut first = sources.admit(flooding).expect("the first handshake");
        let _second = sources.admit(flooding).expect("the second handshake");
        assert_eq!(sources.admit(flooding).unwrap_err(), Refusal::Handshakes);
        let _elsewhere = sources.admit(other).expect("another source is not limited by the first");
        first.handshaken();
        let _third = sources.admit(flooding).expect("a handshake slot freed by a finished handshake");
        assert_eq!(sources.held(flooding), (3, 2));
        assert_eq!(sources.admit(flooding).unwrap_err(), Refusal::Connections);
        drop(first);
        assert_eq!(sources.held(flooding), (2, 2));
        assert_eq!(sources.admit(flooding).unwrap_err(), Refusal::Handshakes, "two handshakes still run");
    }

    /// A peer that reads nothing: the writer's next write that cannot go on fails
    /// after the timeout; one that reads keeps the writer going.
    #[tokio::test]
    async fn a_write_that_makes_no_progress_fails_after_the_timeout() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let timeout = Duration::from_millis(300);
        let (ours, mut theirs) = tokio::io::duplex(64);
        let mut ours = WriteDeadline::new(ours, timeout);
        ours.write_all(&[1; 64]).await.expect("the buffer takes the first 64 bytes");
        let mut read = [0; 64];
        theirs.read_exact(&mut read).await.expect("the peer reads them");
        ours.write_all(&[2; 64]).await.expect("a peer that reads keeps the writer going");
        let started = tokio::time::Instant::now();
        let stuck = ours.write_all(&[3; 1]);
        let error = tokio::time::timeout(Duration::from_secs(30), stuck)
            .await
            .expect("the write deadline ends the write, long before this one")
            .expect_err("nobody reads the second 64 bytes");
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
        assert!(started.elapsed() >= timeout, "not before the timeout: {:?}", started.elapsed());
    }

    #[test]
    fn a_source_whose_connections_all_closed_is_forgotten() {
        let sources = Sources::new(LIMITS);
        let source: IpAddr = "::1".parse().unwrap();
        let mut slot = sources.admit(source).unwrap();
        slot.handshaken();
        slot.handshaken();
        assert_eq!(sources.held(source), (1, 0), "a second handshaken changes nothing");
        drop(slot);
        assert_eq!((sources.held(source), sources.sources()), ((0, 0), 0));
    }
}
