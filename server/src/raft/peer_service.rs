//! The `Peer` gRPC service: Raft RPCs from other nodes, and the leader's notice to a
//! node it removed. Served on the peer address only.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use leasehold_proto::errors::error_status;
use leasehold_proto::peer_server::Peer;
use leasehold_proto::ErrorReason;
use leasehold_proto::{
    MemberProgress, RaftMessage, ReplicationRequest, ReplicationResponse, RetireRequest, RetireResponse,
};
use openraft::raft::{AppendEntriesRequest, InstallSnapshotRequest, VoteRequest, VoteResponse};
use tokio::sync::watch;
use tonic::{Request, Response, Status};

use crate::raft::codec;
use crate::raft::incarnations::Incarnations;
use crate::raft::network::CLUSTER_HEADER;
use crate::raft::types::{NodeId, Raft, TypeConfig};
use crate::shell::clock::{LogLimiter, Stopwatch};
use crate::shell::peer_contacts::PeerContacts;
use crate::shell::tls::node_id_presented;

pub struct PeerService {
    pub raft: Raft,
    pub cluster_name: String,
    /// Set to true when the leader says this node was removed from the cluster.
    pub retired: watch::Sender<bool>,
    pub takeover: Takeover,
    /// With TLS: a message is taken only from a peer whose certificate names the node
    /// the message says it comes from (the cluster CA signed it, or the handshake
    /// failed). Off with --insecure-plaintext, where nothing on the port can be believed.
    pub identities_checked: bool,
    /// Refused peers are logged at most once a second.
    pub refusals: LogLimiter,
    /// The incarnation checks of every Raft message, and this node's on every answer.
    pub incarnations: Arc<Incarnations>,
    /// When each peer was last heard from, for the status page.
    pub contacts: Arc<PeerContacts>,
}

/// The most campaigns started at once to outbid one candidate's term; a candidate
/// further ahead is left to the ordinary election timers.
const TAKEOVER_CAMPAIGNS_MAX: u64 = 4;

/// `Takeover::took_over_ms` before the first takeover.
const NEVER: u64 = u64::MAX;

/// Shortens an election that openraft 0.9 would otherwise lose time on.
///
/// When the leader dies, the follower whose timer fires first campaigns. If its log
/// is shorter than another follower's, that follower refuses its vote, and openraft
/// then has the two collide: the refusing follower campaigns later in the same term
/// (refused, the candidate voted for itself), and the refused candidate keeps a flag
/// that delays its next campaigns by twice the maximum election timeout, even in a
/// later failover. Every client then waits one to two extra election rounds.
///
/// A follower that refuses a candidate for its shorter log, and has itself heard no
/// leader for longer than the leader lease (so openraft's own timer is about to fire
/// too), campaigns at once with a term above the candidate's. Only the timing of an
/// election changes; who may win, and everything that makes elections safe, stays
/// with openraft.
pub struct Takeover {
    /// openraft's leader lease: the maximum election timeout.
    lease: Duration,
    /// The least time between two takeovers: the minimum election timeout.
    pause: Duration,
    started: Stopwatch,
    /// Milliseconds after `started` at which an AppendEntries last arrived.
    heard_leader_ms: AtomicU64,
    /// Milliseconds after `started` of the last takeover (`NEVER` before the first).
    took_over_ms: AtomicU64,
}

impl Takeover {
    pub fn new(election_timeout_min_ms: u64, election_timeout_max_ms: u64) -> Takeover {
        Takeover {
            lease: Duration::from_millis(election_timeout_max_ms),
            pause: Duration::from_millis(election_timeout_min_ms),
            started: Stopwatch::start(),
            heard_leader_ms: AtomicU64::new(0),
            took_over_ms: AtomicU64::new(NEVER),
        }
    }

    fn now_ms(&self) -> u64 {
        self.started.elapsed_ms()
    }

    fn heard_leader(&self) {
        self.heard_leader_ms.store(self.now_ms(), Ordering::Relaxed);
    }

    /// After this node answered `request` with `response`: campaigns if the answer
    /// refused a candidate with a shorter log while no leader is heard.
    fn consider(&self, raft: &Raft, request: &VoteRequest<NodeId>, response: &VoteResponse<NodeId>) {
        let now_ms = self.now_ms();
        let silent_for = Duration::from_millis(now_ms.saturating_sub(self.heard_leader_ms.load(Ordering::Relaxed)));
        let Some(campaigns) = campaigns_to_outbid(request, response, silent_for, self.lease) else {
            return;
        };
        let last = self.took_over_ms.load(Ordering::Relaxed);
        if last != NEVER && now_ms < last + self.pause.as_millis() as u64 {
            return;
        }
        if self.took_over_ms.compare_exchange(last, now_ms, Ordering::Relaxed, Ordering::Relaxed).is_err() {
            return;
        }
        tracing::info!(
            candidate = %request.vote,
            candidate_last_log = ?request.last_log_id,
            my_last_log = ?response.last_log_id,
            silent_ms = silent_for.as_millis() as u64,
            campaigns,
            "refused a candidate with a shorter log while no leader is heard: campaigning at once"
        );
        let raft = raft.clone();
        tokio::spawn(async move {
            // Each campaign raises this node's term by one; the core takes them in order.
            for _ in 0..campaigns {
                if raft.trigger().elect().await.is_err() {
                    break;
                }
            }
        });
    }
}

/// How many campaigns this node must start, one after another, for its term to end
/// above the candidate's; `None` when it should leave the election to the timers:
/// the vote was granted, a leader was heard within its lease (the refusal may have
/// been the lease's), the candidate's log is not shorter, this node's term already
/// caught up, or the candidate is too far ahead.
fn campaigns_to_outbid(
    request: &VoteRequest<NodeId>,
    response: &VoteResponse<NodeId>,
    silent_for: Duration,
    lease: Duration,
) -> Option<u64> {
    if response.vote_granted || silent_for <= lease || response.last_log_id <= request.last_log_id {
        return None;
    }
    let mine = response.vote.leader_id().get_term();
    let theirs = request.vote.leader_id().get_term();
    if mine >= theirs {
        return None;
    }
    let campaigns = theirs - mine + 1;
    (campaigns <= TAKEOVER_CAMPAIGNS_MAX).then_some(campaigns)
}

impl PeerService {
    /// Refuses a Raft message from a node of another cluster (or one that does not
    /// say), so that a peer address pointing at the wrong cluster fails loudly instead
    /// of mixing two clusters' votes and logs.
    fn check_cluster<T>(&self, request: &Request<T>) -> Result<(), Status> {
        let sender = request.metadata().get(CLUSTER_HEADER).and_then(|value| value.to_str().ok());
        if sender == Some(self.cluster_name.as_str()) {
            return Ok(());
        }
        Err(wrong_cluster(match sender {
            Some(sender) => format!("this node belongs to cluster {:?}, not {sender:?}", self.cluster_name),
            None => format!(
                "a Raft message without the {CLUSTER_HEADER} header; this node belongs to cluster {:?}",
                self.cluster_name
            ),
        }))
    }
}

impl PeerService {
    /// The node the peer's certificate names, read before anything the peer sent is
    /// decoded, so that a peer without a node's certificate gets no further. None when
    /// identities are not checked (plaintext).
    fn presented_node<T>(&self, request: &Request<T>, rpc: &str) -> Result<Option<NodeId>, Status> {
        if !self.identities_checked {
            return Ok(None);
        }
        let certificates = request.peer_certs();
        node_id_presented(certificates.as_deref().map(Vec::as_slice))
            .map(Some)
            .map_err(|presented| self.refuse(request, rpc, format!("the peer presented {presented}")))
    }

    /// Refuses a Raft message that claims to come from another node than the one the
    /// peer's certificate names.
    fn check_claim<T>(
        &self,
        request: &Request<T>,
        rpc: &str,
        presented: Option<NodeId>,
        claimed: NodeId,
    ) -> Result<(), Status> {
        match presented {
            Some(presented) if presented != claimed => Err(self.refuse(
                request,
                rpc,
                format!("it claims to come from node {claimed}, but the peer's certificate names node {presented}"),
            )),
            _ => Ok(()),
        }
    }

    /// Refuses a request that names another cluster in its body (Retire, Replication).
    fn check_cluster_named(&self, cluster_name: &str) -> Result<(), Status> {
        if cluster_name == self.cluster_name {
            return Ok(());
        }
        Err(wrong_cluster(format!("this node belongs to cluster {:?}, not {cluster_name:?}", self.cluster_name)))
    }

    /// Refuses a retire notice or a replication question from a node that is not a
    /// member this node knows.
    fn check_member<T>(&self, request: &Request<T>, rpc: &str, presented: Option<NodeId>) -> Result<(), Status> {
        match presented {
            Some(presented)
                if self.raft.metrics().borrow().membership_config.membership().get_node(&presented).is_none() =>
            {
                Err(self.refuse(
                    request,
                    rpc,
                    format!("the peer's certificate names node {presented}, which is not a member"),
                ))
            }
            _ => Ok(()),
        }
    }

    /// The refusal of a peer's message, logged on the audit target (rate-limited).
    fn refuse<T>(&self, request: &Request<T>, rpc: &str, problem: String) -> Status {
        let remote = request.remote_addr().map(|address| address.to_string()).unwrap_or_default();
        if self.refusals.allow() {
            tracing::warn!(target: "audit", rpc, %remote, %problem, "refused a peer's Raft message");
        }
        error_status(ErrorReason::WrongPeer, format!("{rpc} refused: {problem}"), &[])
    }
}

fn wrong_cluster(message: String) -> Status {
    error_status(ErrorReason::WrongCluster, message, &[])
}

fn decode<T: serde::de::DeserializeOwned>(message: &RaftMessage) -> Result<T, Status> {
    codec::decode(&message.payload)
        .map_err(|error| error_status(ErrorReason::InvalidArgument, format!("malformed raft message: {error}"), &[]))
}

impl PeerService {
    fn reply<T: serde::Serialize>(&self, value: &T) -> Result<Response<RaftMessage>, Status> {
        let mut response = Response::new(RaftMessage { payload: codec::encode(value) });
        self.incarnations.stamp_answer(response.metadata_mut());
        Ok(response)
    }
}

#[tonic::async_trait]
impl Peer for PeerService {
    async fn vote(&self, request: Request<RaftMessage>) -> Result<Response<RaftMessage>, Status> {
        let presented = self.presented_node(&request, "Vote")?;
        self.check_cluster(&request)?;
        let vote: VoteRequest<NodeId> = decode(request.get_ref())?;
        let claimed = vote.vote.leader_id().voted_for().unwrap_or(0);
        self.check_claim(&request, "Vote", presented, claimed)?;
        self.incarnations.check_request(request.metadata(), "Vote", claimed)?;
        let answer = self.raft.vote(vote.clone()).await;
        if let Ok(response) = &answer {
            self.takeover.consider(&self.raft, &vote, response);
        }
        self.reply(&answer)
    }

    async fn append_entries(&self, request: Request<RaftMessage>) -> Result<Response<RaftMessage>, Status> {
        let presented = self.presented_node(&request, "AppendEntries")?;
        self.check_cluster(&request)?;
        let append: AppendEntriesRequest<TypeConfig> = decode(request.get_ref())?;
        let claimed = append.vote.leader_id().voted_for().unwrap_or(0);
        self.check_claim(&request, "AppendEntries", presented, claimed)?;
        self.incarnations.check_request(request.metadata(), "AppendEntries", claimed)?;
        self.takeover.heard_leader();
        self.contacts.heard(claimed);
        self.reply(&self.raft.append_entries(append).await)
    }

    async fn install_snapshot(&self, request: Request<RaftMessage>) -> Result<Response<RaftMessage>, Status> {
        let presented = self.presented_node(&request, "InstallSnapshot")?;
        self.check_cluster(&request)?;
        let install: InstallSnapshotRequest<TypeConfig> = decode(request.get_ref())?;
        let claimed = install.vote.leader_id().voted_for().unwrap_or(0);
        self.check_claim(&request, "InstallSnapshot", presented, claimed)?;
        self.incarnations.check_request(request.metadata(), "InstallSnapshot", claimed)?;
        self.reply(&self.raft.install_snapshot(install).await)
    }

    async fn retire(&self, request: Request<RetireRequest>) -> Result<Response<RetireResponse>, Status> {
        let presented = self.presented_node(&request, "Retire")?;
        self.check_member(&request, "Retire", presented)?;
        self.check_cluster_named(&request.get_ref().cluster_name)?;
        tracing::warn!("the leader removed this node from the cluster; it stops serving");
        self.retired.send_replace(true);
        Ok(Response::new(RetireResponse {}))
    }

    async fn replication(&self, request: Request<ReplicationRequest>) -> Result<Response<ReplicationResponse>, Status> {
        let presented = self.presented_node(&request, "Replication")?;
        self.check_member(&request, "Replication", presented)?;
        self.check_cluster_named(&request.get_ref().cluster_name)?;
        let metrics = self.raft.metrics().borrow().clone();
        let Some(replication) = metrics.replication.as_ref() else {
            return Err(Status::failed_precondition(format!(
                "node {} is not the leader: only the leader knows the replication progress",
                metrics.id
            )));
        };
        let members = (metrics.membership_config.membership().nodes())
            .map(|(id, _)| MemberProgress {
                node_id: *id,
                matched_index: replication.get(id).copied().flatten().map(|matched| matched.index),
                last_contact_ms: if *id == metrics.id { None } else { self.contacts.since_ms(*id) },
            })
            .collect();
        Ok(Response::new(ReplicationResponse {
            leader_id: metrics.id,
            term: metrics.current_term,
            last_log_index: metrics.last_log_index.unwrap_or(0),
            members,
        }))
    }
}

#[cfg(test)]
mod tests {
    use openraft::{CommittedLeaderId, LogId, Vote};

    use super::*;

    const LEASE: Duration = Duration::from_millis(300);

    fn log(term: u64, index: u64) -> Option<LogId<NodeId>> {
        Some(LogId::new(CommittedLeaderId::new(term, 2), index))
    }

    /// Node 3 (last log 5-101, still following the dead leader 2 of term 5) is asked
    /// by candidate 1 of term `term` whose log ends at `candidate_index`.
    fn ask(term: u64, candidate_index: u64, granted: bool, silent_ms: u64) -> Option<u64> {
        let request = VoteRequest::new(Vote::new(term, 1), log(5, candidate_index));
        let response = VoteResponse::new(Vote::new_committed(5, 2), log(5, 101), granted);
        campaigns_to_outbid(&request, &response, Duration::from_millis(silent_ms), LEASE)
    }

    #[test]
    fn a_refused_shorter_candidate_with_no_leader_heard_is_outbid() {
        // Term 6 against this node's 5: campaigns at 6 and 7; 7 wins the candidate's vote.
        assert_eq!(ask(6, 100, false, 400), Some(2));
        assert_eq!(ask(8, 100, false, 400), Some(4));
    }

    #[test]
    fn the_timers_decide_otherwise() {
        assert_eq!(ask(6, 100, false, 300), None, "a leader heard within its lease");
        assert_eq!(ask(6, 101, false, 400), None, "the candidate's log is as long");
        assert_eq!(ask(6, 102, false, 400), None, "the candidate's log is longer");
        assert_eq!(ask(6, 100, true, 400), None, "the vote was granted");
        assert_eq!(ask(5, 100, false, 400), None, "the candidate's term is not above this node's");
        assert_eq!(ask(9, 100, false, 400), None, "the candidate is too far ahead");
    }
}
