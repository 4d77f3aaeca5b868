//! Raft RPCs to peers over tonic: one lazily connected channel per target, reused
//! for every RPC; outgoing connections bound to this node's own peer IP so that a
//! partition between two node addresses really separates them. With TLS, every
//! connection presents this node's peer certificate and accepts the target only if
//! the cluster CA signed its certificate for that node's id (`node-<id>.leasehold`);
//! each (re)connection uses the certificates read last (see `shell::tls`).

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use leasehold_proto::identity::node_identity;
use rustls_pki_types::ServerName;
use tokio::net::TcpSocket;

use leasehold_proto::peer_client::PeerClient;
use leasehold_proto::{PingRequest, RaftMessage};
use openraft::error::{
    InstallSnapshotError, NetworkError, PayloadTooLarge, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse, VoteRequest,
    VoteResponse,
};
use openraft::Vote;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::transport::{Channel, Endpoint};

use crate::raft::codec;
use crate::raft::incarnations::Incarnations;
use crate::raft::round_trips::{RoundTrips, Slot, PROBE_TIMEOUT_MS};
use crate::raft::types::{Node, NodeId, TypeConfig};
use crate::shell::peer_contacts::{Heard, PeerContacts};
use crate::shell::sockets::{self, Sockets};
use crate::shell::tls::PeerClientTls;

/// How long a connection attempt to a peer may take before the RPC fails.
pub const PEER_CONNECT_TIMEOUT_MS: u64 = 500;
/// HTTP/2 pings notice a dead peer connection (e.g. after a partition) and reconnect.
pub const PEER_KEEPALIVE_INTERVAL_MS: u64 = 1_000;
pub const PEER_KEEPALIVE_TIMEOUT_MS: u64 = 1_000;
/// Raft messages can carry a snapshot chunk or a batch of entries.
pub const PEER_MESSAGE_BYTES_MAX: usize = 64 * 1024 * 1024;
/// The request header naming the sender's cluster on every Raft RPC; a node of
/// another cluster refuses the message (HTTP/2 header compression sends the name
/// once per connection).
pub const CLUSTER_HEADER: &str = "leasehold-cluster";

/// Cheap to clone: clones share the connections.
#[derive(Clone)]
pub struct Network {
    inner: Arc<NetworkInner>,
}

struct NetworkInner {
    /// This node's peer IP, used as the source address of outgoing connections.
    local_ip: Option<IpAddr>,
    /// This node's cluster name, sent as `CLUSTER_HEADER`.
    cluster: MetadataValue<Ascii>,
    /// One HTTP/2 connection per peer, shared by every client openraft asks for:
    /// replication streams, votes, and the heartbeats of each leadership check (which
    /// asks for a fresh client every time and must not open a connection).
    channels: Mutex<BTreeMap<(NodeId, String), Channel>>,
    /// How peers are dialed.
    dialing: Dialing,
    /// This node's incarnation for the messages' headers, and the checks of answers.
    incarnations: Arc<Incarnations>,
    /// When each peer last answered, for the status page.
    contacts: Arc<PeerContacts>,
    /// The round trips of heartbeats and probes to each peer.
    round_trips: Arc<RoundTrips>,
    /// How far each follower acknowledged this node's log, under which leader vote:
    /// a follower that later lacks an entry it acknowledged under the same leader lost
    /// its log (see `Acknowledged`).
    acknowledged: Mutex<BTreeMap<NodeId, Acknowledged>>,
}

/// How a node dials its peers.
#[derive(Clone)]
pub enum Dialing {
    /// TCP, --insecure-plaintext.
    Plaintext,
    /// TCP and TLS with this node's certificate.
    Tls(Arc<PeerClientTls>),
    /// Through a simulator's network, in plaintext (`shell::sockets`).
    Simulated(Arc<dyn Sockets>),
}

/// The last index a follower acknowledged (AppendEntries or a snapshot) under one
/// leader's vote.
///
/// Raft assumes a follower never loses what it acknowledged; openraft 0.9 asserts it,
/// and in a release build with overflow checks its leader panics in the arithmetic of
/// its next send to a follower whose log went backwards (a data directory wiped before
/// its incarnation was recorded, a disk that lied about an fsync). The leader checks
/// every answer against this instead: an answer saying that the follower lacks an entry
/// it acknowledged is not handed to openraft, and the follower counts as unreachable
/// (nothing it says is counted) until a new leader starts over with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Acknowledged {
    vote: Vote<NodeId>,
    index: u64,
}

impl Network {
    /// `cluster_name` was validated with the configuration (letters, digits, '-',
    /// '_' and '.'), so it is a valid header value.
    pub fn new(
        local_ip: Option<IpAddr>,
        cluster_name: &str,
        dialing: Dialing,
        incarnations: Arc<Incarnations>,
        contacts: Arc<PeerContacts>,
    ) -> Self {
        let cluster = MetadataValue::try_from(cluster_name).expect("a validated cluster name is a header value");
        Self {
            inner: Arc::new(NetworkInner {
                local_ip,
                cluster,
                channels: Mutex::new(BTreeMap::new()),
                dialing,
                incarnations,
                contacts,
                round_trips: Arc::default(),
                acknowledged: Mutex::new(BTreeMap::new()),
            }),
        }
    }

    /// Notes that `target` acknowledged the log up to `index` under `vote`.
    fn acknowledged(&self, target: NodeId, vote: Vote<NodeId>, index: u64) {
        let mut acknowledged = self.inner.acknowledged.lock().unwrap();
        let entry = acknowledged.entry(target).or_insert(Acknowledged { vote, index });
        if entry.vote != vote {
            *entry = Acknowledged { vote, index };
        }
        entry.index = entry.index.max(index);
    }

    /// Forgets what `target` acknowledged: it is being added again, with whatever log
    /// its data directory holds now.
    pub fn forget_acknowledged(&self, target: NodeId) {
        self.inner.acknowledged.lock().unwrap().remove(&target);
    }

    /// The last index `target` acknowledged under `vote`, if it acknowledged any.
    fn acknowledged_under(&self, target: NodeId, vote: Vote<NodeId>) -> Option<u64> {
        let acknowledged = self.inner.acknowledged.lock().unwrap();
        acknowledged
            .get(&target)
            .filter(|acknowledged| acknowledged.vote == vote)
            .map(|acknowledged| acknowledged.index)
    }

    fn client(&self, target: NodeId, address: &str) -> Option<PeerClient<Channel>> {
        self.channel(target, address).map(|channel| {
            PeerClient::new(channel)
                .max_decoding_message_size(PEER_MESSAGE_BYTES_MAX)
                .max_encoding_message_size(PEER_MESSAGE_BYTES_MAX)
        })
    }

    /// Tells a node the leader removed from the membership to stop serving: the
    /// incarnation the record held (0: none), so that a new one ignores it.
    pub async fn retire(&self, target: NodeId, address: &str, incarnation: u64) -> Result<(), tonic::Status> {
        let Some(mut client) = self.client(target, address) else {
            return Err(tonic::Status::invalid_argument(format!("peer address {address:?} is not valid")));
        };
        let mut notice = tonic::Request::new(leasehold_proto::RetireRequest {
            cluster_name: self.cluster_name().to_string(),
            incarnation,
        });
        notice.set_timeout(Duration::from_millis(PEER_CONNECT_TIMEOUT_MS * 4));
        client.retire(notice).await.map(|_| ())
    }

    /// Asks the leader for its replication progress (a follower's status page).
    pub async fn replication(
        &self,
        leader: NodeId,
        address: &str,
    ) -> Result<leasehold_proto::ReplicationResponse, tonic::Status> {
        let Some(mut client) = self.client(leader, address) else {
            return Err(tonic::Status::invalid_argument(format!("peer address {address:?} is not valid")));
        };
        let mut request =
            tonic::Request::new(leasehold_proto::ReplicationRequest { cluster_name: self.cluster_name().to_string() });
        request.set_timeout(Duration::from_millis(PEER_CONNECT_TIMEOUT_MS));
        client.replication(request).await.map(tonic::Response::into_inner)
    }

    /// The round trips measured to each peer (`raft::round_trips`).
    pub fn round_trips(&self) -> &Arc<RoundTrips> {
        &self.inner.round_trips
    }

    /// Measures the round trip to `target` with a Ping, recorded with the others to
    /// it. An UNIMPLEMENTED answer (a build before Ping, during a rolling upgrade)
    /// came back over the network as well, and counts; any other failure is not a
    /// round trip, and the next probe tries again.
    pub async fn probe(&self, target: NodeId, address: &str) {
        let Some(mut client) = self.client(target, address) else {
            return;
        };
        let round_trips = &self.inner.round_trips;
        let mut request = tonic::Request::new(PingRequest { cluster_name: self.cluster_name().to_string() });
        let timeout = Duration::from_millis(PROBE_TIMEOUT_MS);
        request.set_timeout(timeout);
        let sent_us = round_trips.now_us();
        match tokio::time::timeout(timeout, client.ping(request)).await {
            Ok(Ok(_)) => round_trips.record(&round_trips.slot(target), sent_us),
            Ok(Err(status)) if status.code() == tonic::Code::Unimplemented => {
                round_trips.record(&round_trips.slot(target), sent_us)
            }
            Ok(Err(status)) => tracing::debug!(target, %status, "a round-trip probe failed"),
            Err(_) => tracing::debug!(target, "a round-trip probe was not answered in time"),
        }
    }

    fn cluster_name(&self) -> &str {
        self.inner.cluster.to_str().expect("the cluster name is ASCII")
    }

    fn channel(&self, target: NodeId, address: &str) -> Option<Channel> {
        let inner = &self.inner;
        let mut channels = inner.channels.lock().unwrap();
        let key = (target, address.to_string());
        if let Some(channel) = channels.get(&key) {
            return Some(channel.clone());
        }
        let endpoint = peer_endpoint(address, inner.local_ip).ok()?;
        let channel = match &inner.dialing {
            Dialing::Plaintext => endpoint.connect_lazy(),
            Dialing::Tls(tls) => {
                endpoint.connect_with_connector_lazy(tls_connector(tls.clone(), target, inner.local_ip))
            }
            Dialing::Simulated(sockets) => endpoint.connect_with_connector_lazy(sockets::connector(sockets.clone())),
        };
        channels.insert(key, channel.clone());
        Some(channel)
    }
}

/// Dials a peer over TLS: TCP from this node's peer IP, then a handshake that presents
/// this node's certificate and requires the target's to name `node-<target>.leasehold`.
/// Each connection reads the TLS configuration anew, so a reload reaches the next one.
fn tls_connector(
    tls: Arc<PeerClientTls>,
    target: NodeId,
    local_ip: Option<IpAddr>,
) -> impl tower::Service<
    tonic::codegen::http::Uri,
    Response = TokioIo<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>,
    Error = std::io::Error,
    Future = impl Send,
> + Clone
       + Send
       + 'static {
    tower::service_fn(move |uri: tonic::codegen::http::Uri| {
        let config = tls.config();
        async move {
            let authority = uri.authority().map(|authority| authority.as_str().to_string()).unwrap_or_default();
            let address: SocketAddr = tokio::net::lookup_host(&authority)
                .await?
                .next()
                .ok_or_else(|| std::io::Error::other(format!("{authority} resolves to no address")))?;
            let socket = if address.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
            if let Some(ip) = local_ip.filter(|ip| ip.is_ipv4() == address.is_ipv4()) {
                socket.bind(SocketAddr::new(ip, 0))?;
            }
            let stream = socket.connect(address).await?;
            stream.set_nodelay(true)?;
            let name = ServerName::try_from(node_identity(target)).map_err(std::io::Error::other)?;
            let stream = tokio_rustls::TlsConnector::from(config).connect(name, stream).await?;
            Ok(TokioIo::new(stream))
        }
    })
}

fn peer_endpoint(address: &str, local_ip: Option<IpAddr>) -> Result<Endpoint, tonic::transport::Error> {
    Ok(Endpoint::from_shared(format!("http://{address}"))?
        .connect_timeout(Duration::from_millis(PEER_CONNECT_TIMEOUT_MS))
        .http2_keep_alive_interval(Duration::from_millis(PEER_KEEPALIVE_INTERVAL_MS))
        .keep_alive_timeout(Duration::from_millis(PEER_KEEPALIVE_TIMEOUT_MS))
        .keep_alive_while_idle(true)
        .tcp_nodelay(true)
        .local_address(local_ip))
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = PeerConnection;

    async fn new_client(&mut self, target: NodeId, node: &Node) -> PeerConnection {
        let client = self.client(target, &node.peer_addr);
        PeerConnection {
            network: self.clone(),
            target,
            address: node.peer_addr.clone(),
            cluster: self.inner.cluster.clone(),
            incarnations: self.inner.incarnations.clone(),
            contacts: self.inner.contacts.clone(),
            heard: self.inner.contacts.slot(target),
            round_trips: self.inner.round_trips.clone(),
            round_trip: self.inner.round_trips.slot(target),
            client,
        }
    }
}

pub struct PeerConnection {
    /// For the record of what each follower acknowledged.
    network: Network,
    target: NodeId,
    address: String,
    cluster: MetadataValue<Ascii>,
    incarnations: Arc<Incarnations>,
    contacts: Arc<PeerContacts>,
    /// This target's slot in `contacts`, looked up once per connection.
    heard: Heard,
    /// The round trips of empty AppendEntries (heartbeats), recorded on its time.
    round_trips: Arc<RoundTrips>,
    /// This target's slot in `round_trips`, looked up once per connection.
    round_trip: Slot,
    /// None when the address could not even be parsed; every RPC then fails.
    client: Option<PeerClient<Channel>>,
}

#[derive(Debug, thiserror::Error)]
#[error("peer {address}: {message}")]
struct PeerError {
    address: String,
    message: String,
}

impl PeerConnection {
    async fn call<Request, Response, E>(
        &mut self,
        kind: RpcKind,
        request: &Request,
        option: &RPCOption,
    ) -> Result<Response, RPCError<NodeId, Node, RaftError<NodeId, E>>>
    where
        Request: Serialize,
        Response: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        self.send(kind, codec::encode(request), false, option).await
    }

    /// Sends one encoded Raft message and decodes the answer; the round trip is
    /// recorded when `timed` (an empty AppendEntries: see `raft::round_trips`).
    async fn send<Response, E>(
        &mut self,
        kind: RpcKind,
        payload: Vec<u8>,
        timed: bool,
        option: &RPCOption,
    ) -> Result<Response, RPCError<NodeId, Node, RaftError<NodeId, E>>>
    where
        Response: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let address = self.address.clone();
        let error = |message: String| PeerError { address: address.clone(), message };
        let Some(client) = self.client.as_mut() else {
            return Err(RPCError::Unreachable(Unreachable::new(&error("the peer address is not valid".into()))));
        };
        let mut message = tonic::Request::new(RaftMessage { payload });
        message.set_timeout(option.hard_ttl());
        message.metadata_mut().insert(CLUSTER_HEADER, self.cluster.clone());
        self.incarnations.stamp_request(self.target, message.metadata_mut());
        let forgotten = self.incarnations.forgotten(self.target);
        let sent_us = if timed { self.round_trips.now_us() } else { 0 };
        let reply = match kind {
            RpcKind::Vote => client.vote(message).await,
            RpcKind::AppendEntries => client.append_entries(message).await,
            RpcKind::InstallSnapshot => client.install_snapshot(message).await,
        };
        let reply = match reply {
            Ok(reply) => {
                if !self.incarnations.answered_since(self.target, forgotten) {
                    // The operator added the node again meanwhile: this answer may be
                    // the replaced incarnation's, and must not be recorded for the new.
                    let problem =
                        format!("an answer to a message sent before node {} was added again: not counted", self.target);
                    return Err(RPCError::Unreachable(Unreachable::new(&error(problem))));
                }
                if let Err(problem) = self.incarnations.check_answer(self.target, reply.metadata()) {
                    // Not counted: to openraft, the member did not answer.
                    return Err(RPCError::Unreachable(Unreachable::new(&error(problem))));
                }
                self.contacts.heard_in(&self.heard);
                if timed {
                    self.round_trips.record(&self.round_trip, sent_us);
                }
                reply.into_inner()
            }
            Err(status) if status.code() == tonic::Code::Unavailable => {
                return Err(RPCError::Unreachable(Unreachable::new(&error(status.message().to_string()))))
            }
            Err(status) => {
                self.incarnations.on_refusal(&status);
                return Err(RPCError::Network(NetworkError::new(&error(status.to_string()))));
            }
        };
        let result: Result<Response, RaftError<NodeId, E>> = codec::decode(&reply.payload)
            .map_err(|decode| RPCError::Network(NetworkError::new(&error(format!("bad reply: {decode}")))))?;
        result.map_err(|remote| RPCError::RemoteError(RemoteError::new(self.target, remote)))
    }
}

/// The room a Raft message leaves for everything around its payload (gRPC framing,
/// headers); a payload up to the rest is sent as it is.
pub const PEER_MESSAGE_HEADROOM_BYTES: usize = 64 * 1024;

/// `None` when an AppendEntries payload of `bytes` with `entries` entries fits in one
/// peer message; else how many entries a smaller batch may carry (at least one: a
/// single entry is far below the limit, see `COMMANDS_PER_ENTRY_MAX`).
fn entries_that_fit(bytes: usize, entries: usize) -> Option<u64> {
    let room = PEER_MESSAGE_BYTES_MAX - PEER_MESSAGE_HEADROOM_BYTES;
    if bytes <= room || entries <= 1 {
        return None;
    }
    // The entries' share of the bytes, scaled to the room, with a margin for entries
    // larger than the average.
    let fitting = (entries as u128 * room as u128 / bytes as u128) as u64 * 3 / 4;
    Some(fitting.max(1))
}

/// Why an answer that the follower lacks the entry at `conflict_at` cannot be true of
/// a follower that acknowledged the log up to `acknowledged` under the same leader;
/// None when it can.
fn went_backwards(acknowledged: Option<u64>, conflict_at: Option<u64>) -> Option<String> {
    let (acknowledged, conflict_at) = (acknowledged?, conflict_at?);
    (conflict_at <= acknowledged).then(|| {
        format!(
            "it acknowledged this leader's log up to index {acknowledged}, and now lacks index {conflict_at}: its data \
             directory was wiped or replaced, or its disk lost acknowledged writes"
        )
    })
}

#[derive(Clone, Copy)]
enum RpcKind {
    Vote,
    AppendEntries,
    InstallSnapshot,
}

impl RaftNetwork<TypeConfig> for PeerConnection {
    async fn append_entries(
        &mut self,
        request: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, Node, RaftError<NodeId>>> {
        let payload = codec::encode(&request);
        if let Some(entries) = entries_that_fit(payload.len(), request.entries.len()) {
            // Too big for one peer message: openraft sends the batch again in smaller
            // pieces of at most this many entries, instead of retrying it forever.
            return Err(RPCError::PayloadTooLarge(PayloadTooLarge::new_entries_hint(entries)));
        }
        let vote = request.vote;
        let conflict_at = request.prev_log_id.map(|log_id| log_id.index);
        let sent_up_to = request.entries.last().map(|entry| entry.log_id.index).or(conflict_at);
        let heartbeat = request.entries.is_empty();
        let response: AppendEntriesResponse<NodeId> =
            self.send(RpcKind::AppendEntries, payload, heartbeat, &option).await?;
        match &response {
            AppendEntriesResponse::Success => {
                if let Some(index) = sent_up_to {
                    self.network.acknowledged(self.target, vote, index);
                }
            }
            AppendEntriesResponse::PartialSuccess(Some(matching)) => {
                self.network.acknowledged(self.target, vote, matching.index);
            }
            AppendEntriesResponse::Conflict => {
                let acknowledged = self.network.acknowledged_under(self.target, vote);
                if let Some(problem) = went_backwards(acknowledged, conflict_at) {
                    tracing::error!(target = self.target, %problem, "a follower's log went backwards: its answers are not counted");
                    let error = PeerError { address: self.address.clone(), message: problem };
                    return Err(RPCError::Unreachable(Unreachable::new(&error)));
                }
            }
            _ => {}
        }
        Ok(response)
    }

    async fn install_snapshot(
        &mut self,
        request: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse<NodeId>, RPCError<NodeId, Node, RaftError<NodeId, InstallSnapshotError>>> {
        let vote = request.vote;
        let last = request.meta.last_log_id.map(|log_id| log_id.index).filter(|_| request.done);
        let response: InstallSnapshotResponse<NodeId> = self.call(RpcKind::InstallSnapshot, &request, &option).await?;
        if let Some(index) = last.filter(|_| response.vote == vote) {
            self.network.acknowledged(self.target, vote, index);
        }
        Ok(response)
    }

    async fn vote(
        &mut self,
        request: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, Node, RaftError<NodeId>>> {
        self.call(RpcKind::Vote, &request, &option).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_follower_lacking_an_entry_it_acknowledged_went_backwards() {
        assert!(went_backwards(Some(10), Some(10)).is_some(), "it acknowledged index 10");
        assert!(went_backwards(Some(10), Some(3)).is_some());
        assert_eq!(went_backwards(Some(10), Some(11)), None, "a conflict above what it acknowledged");
        assert_eq!(went_backwards(None, Some(3)), None, "nothing acknowledged under this leader");
        assert_eq!(went_backwards(Some(10), None), None);
    }

    #[test]
    fn a_batch_too_big_for_one_message_is_cut_to_what_fits() {
        let room = PEER_MESSAGE_BYTES_MAX - PEER_MESSAGE_HEADROOM_BYTES;
        assert_eq!(entries_that_fit(room, 1_000), None);
        assert_eq!(entries_that_fit(room * 4, 1), None, "one entry is sent as it is");
        let hint = entries_that_fit(room * 4, 1_000).expect("four times too big");
        assert!((1..=250).contains(&hint), "{hint}");
        assert_eq!(entries_that_fit(room * 1_000, 10), Some(1));
    }
}
