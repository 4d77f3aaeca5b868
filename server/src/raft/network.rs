//! Raft RPCs to peers over tonic: one lazily connected channel per target, reused
//! for every RPC; outgoing connections bound to this node's own peer IP so that a
//! partition between two node addresses really separates them.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Duration;

use leasehold_proto::peer_client::PeerClient;
use leasehold_proto::RaftMessage;
use openraft::error::{InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse, VoteRequest,
    VoteResponse,
};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::transport::{Channel, Endpoint};

use crate::raft::codec;
use crate::raft::types::{Node, NodeId, TypeConfig};

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

pub struct Network {
    /// This node's peer IP, used as the source address of outgoing connections.
    local_ip: Option<IpAddr>,
    /// This node's cluster name, sent as `CLUSTER_HEADER`.
    cluster: MetadataValue<Ascii>,
    /// One HTTP/2 connection per peer address, shared by every client openraft asks
    /// for: replication streams, votes, and the heartbeats of each leadership check
    /// (which asks for a fresh client every time and must not open a connection).
    channels: Mutex<BTreeMap<String, Channel>>,
}

impl Network {
    /// `cluster_name` was validated with the configuration (letters, digits, '-',
    /// '_' and '.'), so it is a valid header value.
    pub fn new(local_ip: Option<IpAddr>, cluster_name: &str) -> Self {
        let cluster = MetadataValue::try_from(cluster_name).expect("a validated cluster name is a header value");
        Self { local_ip, cluster, channels: Mutex::new(BTreeMap::new()) }
    }

    fn channel(&self, address: &str) -> Option<Channel> {
        let mut channels = self.channels.lock().unwrap();
        if let Some(channel) = channels.get(address) {
            return Some(channel.clone());
        }
        let channel = peer_endpoint(address, self.local_ip).ok()?.connect_lazy();
        channels.insert(address.to_string(), channel.clone());
        Some(channel)
    }
}

pub fn peer_endpoint(address: &str, local_ip: Option<IpAddr>) -> Result<Endpoint, tonic::transport::Error> {
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
        let client = self.channel(&node.peer_addr).map(|channel| {
            PeerClient::new(channel)
                .max_decoding_message_size(PEER_MESSAGE_BYTES_MAX)
                .max_encoding_message_size(PEER_MESSAGE_BYTES_MAX)
        });
        PeerConnection { target, address: node.peer_addr.clone(), cluster: self.cluster.clone(), client }
    }
}

pub struct PeerConnection {
    target: NodeId,
    address: String,
    cluster: MetadataValue<Ascii>,
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
        let address = self.address.clone();
        let error = |message: String| PeerError { address: address.clone(), message };
        let Some(client) = self.client.as_mut() else {
            return Err(RPCError::Unreachable(Unreachable::new(&error("the peer address is not valid".into()))));
        };
        let mut message = tonic::Request::new(RaftMessage { payload: codec::encode(request) });
        message.set_timeout(option.hard_ttl());
        message.metadata_mut().insert(CLUSTER_HEADER, self.cluster.clone());
        let reply = match kind {
            RpcKind::Vote => client.vote(message).await,
            RpcKind::AppendEntries => client.append_entries(message).await,
            RpcKind::InstallSnapshot => client.install_snapshot(message).await,
        };
        let reply = match reply {
            Ok(reply) => reply.into_inner(),
            Err(status) if status.code() == tonic::Code::Unavailable => {
                return Err(RPCError::Unreachable(Unreachable::new(&error(status.message().to_string()))))
            }
            Err(status) => return Err(RPCError::Network(NetworkError::new(&error(status.to_string())))),
        };
        let result: Result<Response, RaftError<NodeId, E>> = codec::decode(&reply.payload)
            .map_err(|decode| RPCError::Network(NetworkError::new(&error(format!("bad reply: {decode}")))))?;
        result.map_err(|remote| RPCError::RemoteError(RemoteError::new(self.target, remote)))
    }
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
        self.call(RpcKind::AppendEntries, &request, &option).await
    }

    async fn install_snapshot(
        &mut self,
        request: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse<NodeId>, RPCError<NodeId, Node, RaftError<NodeId, InstallSnapshotError>>> {
        self.call(RpcKind::InstallSnapshot, &request, &option).await
    }

    async fn vote(
        &mut self,
        request: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, Node, RaftError<NodeId>>> {
        self.call(RpcKind::Vote, &request, &option).await
    }
}
