//! The `Peer` gRPC service: Raft RPCs from other nodes, and the leader's notice to a
//! node it removed. Served on the peer address only.

use leasehold_proto::peer_server::Peer;
use leasehold_proto::{RaftMessage, RetireRequest, RetireResponse};
use openraft::raft::{AppendEntriesRequest, InstallSnapshotRequest, VoteRequest};
use tokio::sync::watch;
use tonic::{Request, Response, Status};

use crate::codec;
use crate::raft_types::{NodeId, Raft, TypeConfig};

pub struct PeerService {
    pub raft: Raft,
    pub cluster_name: String,
    /// Set to true when the leader says this node was removed from the cluster.
    pub retired: watch::Sender<bool>,
}

fn decode<T: serde::de::DeserializeOwned>(message: &RaftMessage) -> Result<T, Status> {
    codec::decode(&message.payload)
        .map_err(|error| Status::invalid_argument(format!("malformed raft message: {error}")))
}

fn reply<T: serde::Serialize>(value: &T) -> Result<Response<RaftMessage>, Status> {
    Ok(Response::new(RaftMessage { payload: codec::encode(value) }))
}

#[tonic::async_trait]
impl Peer for PeerService {
    async fn vote(&self, request: Request<RaftMessage>) -> Result<Response<RaftMessage>, Status> {
        let vote: VoteRequest<NodeId> = decode(request.get_ref())?;
        reply(&self.raft.vote(vote).await)
    }

    async fn append_entries(&self, request: Request<RaftMessage>) -> Result<Response<RaftMessage>, Status> {
        let append: AppendEntriesRequest<TypeConfig> = decode(request.get_ref())?;
        reply(&self.raft.append_entries(append).await)
    }

    async fn install_snapshot(&self, request: Request<RaftMessage>) -> Result<Response<RaftMessage>, Status> {
        let install: InstallSnapshotRequest<TypeConfig> = decode(request.get_ref())?;
        reply(&self.raft.install_snapshot(install).await)
    }

    async fn retire(&self, request: Request<RetireRequest>) -> Result<Response<RetireResponse>, Status> {
        if request.get_ref().cluster_name != self.cluster_name {
            return Err(Status::failed_precondition(format!(
                "this node belongs to cluster {:?}, not {:?}",
                self.cluster_name,
                request.get_ref().cluster_name
            )));
        }
        tracing::warn!("the leader removed this node from the cluster; it stops serving");
        self.retired.send_replace(true);
        Ok(Response::new(RetireResponse {}))
    }
}
