//! The slow-link nemesis: a delaying TCP proxy in front of every node's peer port.
//!
//! This kernel has no netem, so delay is added in user space. With `--nemesis
//! slow-link` each node listens for peers on its own address at the peer port +
//! `LISTEN_PORT_OFFSET` (`--test-peer-listen-addr`) while members dial its usual peer
//! address, where this proxy listens and forwards. Nodes bind their outgoing peer
//! connections to their own address, so the proxy knows both ends of every link by
//! the connection's source address: while a node is slow, every byte to or from it
//! waits its link's delay plus a random jitter, in order (a later byte never
//! overtakes an earlier one). Partitions still work: the proxy listens on the node's
//! own address, so a rule between two node addresses cuts the dialling side's link.
//!
//! What differs from a direct link: a connection to a node that is down is accepted by
//! the proxy and closed at once (instead of refused).

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// The port a node really listens on for peers: its peer port plus this.
pub const LISTEN_PORT_OFFSET: u16 = 50;

/// How long the proxy waits for the node behind it to accept.
const UPSTREAM_CONNECT_MS: u64 = 1_000;

/// The bytes the proxy reads at once.
const CHUNK_BYTES: usize = 64 << 10;

/// The delay of a slow node's links: each byte waits `delay` plus up to `jitter`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slowness {
    pub delay: Duration,
    pub jitter: Duration,
}

/// Every node's proxy, and which nodes are slow now.
#[derive(Debug)]
pub struct Links {
    state: Mutex<State>,
    seed: u64,
}

#[derive(Debug, Default)]
struct State {
    /// Node by the address it binds its outgoing peer connections to; `None` for an
    /// address several nodes share (127.0.0.1 in the host's namespace), whose
    /// connections are slowed by their destination only.
    nodes: BTreeMap<IpAddr, Option<u64>>,
    /// Nodes whose proxy runs: the address the node itself listens on.
    served: BTreeMap<u64, String>,
    slow: BTreeMap<u64, Slowness>,
}

impl Links {
    pub fn new(seed: u64) -> Arc<Links> {
        Arc::new(Links { state: Mutex::new(State::default()), seed })
    }

    /// The address beside `peer_addr` (same host, the port + `LISTEN_PORT_OFFSET`): where
    /// a node with its own address listens for peers behind its proxy.
    pub fn beside(peer_addr: &str) -> String {
        let (host, port) = peer_addr.rsplit_once(':').expect("a peer address has a port");
        let port: u16 = port.parse().expect("a peer port is a number");
        format!("{host}:{}", port + LISTEN_PORT_OFFSET)
    }

    /// Where node `id` listens for peers behind its proxy, once `serve` started it.
    pub fn listen_addr_of(&self, id: u64) -> Option<String> {
        self.state.lock().unwrap().served.get(&id).cloned()
    }

    /// Starts node `id`'s proxy on `peer_addr`, forwarding to `node_addr` where the
    /// node listens (once per node; its addresses never change). Needs a tokio runtime.
    pub fn serve(self: &Arc<Self>, id: u64, peer_addr: &str, node_addr: String) {
        let listen: SocketAddr = peer_addr.parse().expect("a peer address is an IP address and a port");
        let upstream: SocketAddr = node_addr.parse().expect("a listen address");
        {
            let mut state = self.state.lock().unwrap();
            if state.served.contains_key(&id) {
                return;
            }
            let shared = state.nodes.get(&listen.ip()).is_some_and(|other| *other != Some(id));
            state.nodes.insert(listen.ip(), if shared { None } else { Some(id) });
            state.served.insert(id, node_addr);
        }
        let listener = std::net::TcpListener::bind(listen)
            .unwrap_or_else(|error| panic!("the slow-link proxy of node {id} cannot listen on {listen}: {error}"));
        listener.set_nonblocking(true).expect("a non-blocking listener");
        let listener = TcpListener::from_std(listener).expect("a tokio listener (inside the runtime)");
        let links = self.clone();
        tokio::spawn(async move {
            let mut connections = 0u64;
            loop {
                let Ok((downstream, source)) = listener.accept().await else {
                    continue;
                };
                connections += 1;
                let from = links.state.lock().unwrap().nodes.get(&source.ip()).copied().flatten();
                let random = StdRng::seed_from_u64(links.seed ^ (id << 32) ^ connections);
                tokio::spawn(links.clone().forward(downstream, upstream, from, id, random));
            }
        });
    }

    /// Makes every link of `node` slow, or fast again with `None`.
    pub fn set(&self, node: u64, slowness: Option<Slowness>) {
        let mut state = self.state.lock().unwrap();
        match slowness {
            Some(slowness) => state.slow.insert(node, slowness),
            None => state.slow.remove(&node),
        };
    }

    /// Makes every link fast.
    pub fn heal(&self) {
        self.state.lock().unwrap().slow.clear();
    }

    /// The delay of the next bytes on a link between the nodes `ends` (`None`: an
    /// address that is no node's, a client or a tool): the slower end's.
    fn delay(&self, ends: [Option<u64>; 2], random: &mut StdRng) -> Duration {
        let state = self.state.lock().unwrap();
        let slowness = ends
            .into_iter()
            .flatten()
            .filter_map(|node| state.slow.get(&node).copied())
            .max_by_key(|slowness| slowness.delay);
        match slowness {
            None => Duration::ZERO,
            Some(Slowness { delay, jitter }) => {
                let jitter_us = jitter.as_micros() as u64;
                delay + Duration::from_micros(if jitter_us == 0 { 0 } else { random.random_range(0..=jitter_us) })
            }
        }
    }

    async fn forward(
        self: Arc<Self>,
        downstream: TcpStream,
        upstream: SocketAddr,
        from: Option<u64>,
        to: u64,
        random: StdRng,
    ) {
        let connected =
            tokio::time::timeout(Duration::from_millis(UPSTREAM_CONNECT_MS), TcpStream::connect(upstream)).await;
        let Ok(Ok(upstream)) = connected else {
            return;
        };
        let _ = downstream.set_nodelay(true);
        let _ = upstream.set_nodelay(true);
        let (down_read, down_write) = downstream.into_split();
        let (up_read, up_write) = upstream.into_split();
        // Each direction is its own link: from → to, and the answers to → from.
        let there = pump(self.clone(), down_read, up_write, [from, Some(to)], random.clone());
        let back = pump(self, up_read, down_write, [Some(to), from], random);
        // When one direction ends (a node closed or died), the other is dropped too.
        tokio::select! {
            _ = there => {}
            _ = back => {}
        }
    }
}

/// Copies one direction of a connection, every chunk delivered no earlier than its
/// link's delay after it was read, and in order.
async fn pump(
    links: Arc<Links>,
    mut reader: tokio::net::tcp::OwnedReadHalf,
    mut writer: tokio::net::tcp::OwnedWriteHalf,
    ends: [Option<u64>; 2],
    mut random: StdRng,
) {
    let (sender, mut receiver) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let deliver = async move {
        while let Some((due, bytes)) = receiver.recv().await {
            tokio::time::sleep_until(due).await;
            if writer.write_all(&bytes).await.is_err() {
                return;
            }
        }
        let _ = writer.shutdown().await;
    };
    let read = async move {
        let mut last_due = Instant::now();
        loop {
            let mut buffer = vec![0u8; CHUNK_BYTES];
            let read = match reader.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(read) => read,
            };
            buffer.truncate(read);
            let delay = links.delay(ends, &mut random);
            last_due = last_due.max(Instant::now() + delay);
            if sender.send((last_due, buffer)).is_err() {
                return;
            }
        }
    };
    // The reader ends first (EOF); the deliverer then drains what is queued and
    // shuts the write side down.
    tokio::join!(read, deliver);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sends `message` through the proxy to the echo server and reads it back.
    async fn round_trip(stream: &mut TcpStream, message: &[u8]) -> Duration {
        let started = Instant::now();
        stream.write_all(message).await.unwrap();
        let mut answer = vec![0u8; message.len()];
        stream.read_exact(&mut answer).await.unwrap();
        assert_eq!(answer, message, "the bytes come back whole and in order");
        started.elapsed()
    }

    #[test]
    fn the_listen_address_is_beside_the_peer_address() {
        assert_eq!(Links::beside("127.0.0.11:7200"), "127.0.0.11:7250");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_slow_node_delays_both_directions_and_keeps_the_order() {
        // A node "2" behind a proxy on 127.0.0.1, an echo server at its listen address.
        let [port, node_port] = crate::cluster::free_ports::<2>();
        let (peer_addr, node_addr) = (format!("127.0.0.1:{port}"), format!("127.0.0.1:{node_port}"));
        let echo = TcpListener::bind(&node_addr).await.expect("a reserved port is free");
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = echo.accept().await {
                tokio::spawn(async move {
                    let mut buffer = [0u8; 1024];
                    while let Ok(read) = stream.read(&mut buffer).await {
                        if read == 0 || stream.write_all(&buffer[..read]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        let links = Links::new(7);
        links.serve(2, &peer_addr, node_addr);
        let mut stream = TcpStream::connect(&peer_addr).await.expect("the proxy accepts");
        let fast = round_trip(&mut stream, b"fast").await;
        assert!(fast < Duration::from_millis(50), "an unslowed link adds no delay: {fast:?}");
        links.set(2, Some(Slowness { delay: Duration::from_millis(60), jitter: Duration::from_millis(20) }));
        let slow = round_trip(&mut stream, b"slow and in order").await;
        assert!(slow >= Duration::from_millis(120), "both directions wait at least the delay: {slow:?}");
        links.heal();
        let healed = round_trip(&mut stream, b"healed").await;
        assert!(healed < Duration::from_millis(50), "healed: {healed:?}");
    }
}
