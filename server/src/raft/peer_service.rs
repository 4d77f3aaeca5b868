//! The `Peer` gRPC service: Raft RPCs from other nodes, the leader's notice to a
//! node it removed, its replication progress, and the round-trip probe. Served on the
//! peer address only.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use leasehold_proto::errors::error_status;
use leasehold_proto::peer_server::Peer;
use leasehold_proto::ErrorReason;
use leasehold_proto::{
    MemberProgress, PingRequest, PingResponse, RaftMessage, ReplicationRequest, ReplicationResponse, RetireRequest,
    RetireResponse,
};
use openraft::raft::{AppendEntriesRequest, InstallSnapshotRequest, VoteRequest, VoteResponse};
use openraft::Vote;
use tokio::sync::watch;
use tonic::{Request, Response, Status};

use crate::raft::codec;
use crate::raft::incarnations::{Authority, Incarnations};
use crate::raft::network::CLUSTER_HEADER;
use crate::raft::state_machine_store::Shared;
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
    /// The applied (committed) membership, read when a sender is not in the
    /// membership this node's log holds last.
    pub shared: Arc<Shared>,
    /// The configured initial members: whom a node that is in no cluster yet takes
    /// Raft messages from. Empty for a node started to be added with `member add`
    /// (without initial members, or with --new-incarnation): it takes them from any
    /// node of the cluster CA until its log holds a membership.
    pub initial_members: BTreeSet<NodeId>,
}

/// The most campaigns started at once to outbid one candidate's term; a candidate
/// further ahead is left to the ordinary election timers.
const TAKEOVER_CAMPAIGNS_MAX: u64 = 4;

/// How long a retire notice waits for this node to apply the configuration that no
/// longer lists it as a voter (the leader sent it once this node had it; the commit
/// comes with the next heartbeat).
const RETIRE_CONFIRM_MS: u64 = 1_000;

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

    /// Refuses a Raft message (Vote, AppendEntries, InstallSnapshot) from a node that is
    /// not a member, before anything it sent is decoded or believed.
    ///
    /// Raft needs messages only from members: a leader or candidate is a voter of the
    /// configuration its log holds, and a receiver learns of every configuration that
    /// includes it from the log it replicates. So a node takes them from a node of the
    /// membership its log holds last (joint configurations and learners included), or
    /// of the last committed one it applied (a leader that removed itself commits that
    /// removal before it steps down). A node that is in no cluster yet (its log holds
    /// no membership) takes them from its configured initial members, or, started
    /// without any to be added with `member add`, from any node of the cluster CA, since
    /// it has nothing to protect until the leader brings it in.
    ///
    /// Refusing a message is always safe in Raft (it is a lost message); what this
    /// closes is a certificate of a node that was never added, or was removed, taking
    /// part: appending entries (the callers they carry are believed when applied),
    /// deposing the leader with a higher term, or sending headers that stop a node.
    fn check_raft_member<T>(&self, request: &Request<T>, rpc: &str, node: NodeId) -> Result<(), Status> {
        let in_no_cluster = {
            let metrics = self.raft.metrics();
            let metrics = metrics.borrow();
            let membership = metrics.membership_config.membership();
            if membership.get_node(&node).is_some() {
                return Ok(());
            }
            let empty = membership.nodes().next().is_none();
            empty
        };
        if in_no_cluster && (self.initial_members.is_empty() || self.initial_members.contains(&node)) {
            return Ok(());
        }
        if !in_no_cluster && self.shared.applied_membership_has(node) {
            return Ok(());
        }
        let problem = if in_no_cluster {
            format!("the peer's certificate names node {node}, which is not one of this new node's initial members")
        } else {
            format!("the peer's certificate names node {node}, which is not a member of this cluster (never added, or removed)")
        };
        Err(self.refuse(request, rpc, problem))
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

impl PeerService {
    /// The checks of a Raft message before its payload is decoded: the peer's
    /// certificate names a node (None in plaintext), that node is a member, and the
    /// message names this node's cluster.
    fn admit<T>(&self, request: &Request<T>, rpc: &str) -> Result<Option<NodeId>, Status> {
        let presented = self.presented_node(request, rpc)?;
        if let Some(node) = presented {
            self.check_raft_member(request, rpc, node)?;
        }
        self.check_cluster(request)?;
        Ok(presented)
    }

    /// The checks once the payload is decoded: the node it claims to come from is the
    /// one the certificate names (in plaintext: a member), and its headers.
    fn admit_claim<T>(
        &self,
        request: &Request<T>,
        rpc: &str,
        presented: Option<NodeId>,
        vote: &Vote<NodeId>,
        authority: Authority,
    ) -> Result<NodeId, Status> {
        let claimed = vote.leader_id().voted_for().unwrap_or(0);
        self.check_claim(request, rpc, presented, claimed)?;
        if presented.is_none() {
            self.check_raft_member(request, rpc, claimed)?;
        }
        self.incarnations.check_request(request.metadata(), rpc, claimed, authority)?;
        Ok(claimed)
    }

    /// Whether an AppendEntries or InstallSnapshot comes from a leader this node would
    /// follow: its vote is at least the one this node holds. Only such a message is
    /// believed about this node (see `Authority`).
    fn authority_of(&self, vote: &Vote<NodeId>) -> Authority {
        if *vote >= self.raft.metrics().borrow().vote {
            Authority::Current
        } else {
            Authority::Other
        }
    }

    /// Whether a Vote comes from a candidate this node could vote for: its vote is at
    /// least the one this node holds and its log at least as long.
    fn authority_of_candidate(&self, vote: &VoteRequest<NodeId>) -> Authority {
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow();
        let log_as_long = vote.last_log_id.map(|log_id| log_id.index) >= metrics.last_log_index;
        if vote.vote >= metrics.vote && log_as_long {
            Authority::Current
        } else {
            Authority::Other
        }
    }
}

#[tonic::async_trait]
impl Peer for PeerService {
    async fn vote(&self, request: Request<RaftMessage>) -> Result<Response<RaftMessage>, Status> {
        let presented = self.admit(&request, "Vote")?;
        let vote: VoteRequest<NodeId> = decode(request.get_ref())?;
        let authority = self.authority_of_candidate(&vote);
        self.admit_claim(&request, "Vote", presented, &vote.vote, authority)?;
        let answer = self.raft.vote(vote.clone()).await;
        if let Ok(response) = &answer {
            self.takeover.consider(&self.raft, &vote, response);
        }
        self.reply(&answer)
    }

    async fn append_entries(&self, request: Request<RaftMessage>) -> Result<Response<RaftMessage>, Status> {
        let presented = self.admit(&request, "AppendEntries")?;
        let append: AppendEntriesRequest<TypeConfig> = decode(request.get_ref())?;
        let authority = self.authority_of(&append.vote);
        let claimed = self.admit_claim(&request, "AppendEntries", presented, &append.vote, authority)?;
        self.takeover.heard_leader();
        self.contacts.heard(claimed);
        self.reply(&self.raft.append_entries(append).await)
    }

    async fn install_snapshot(&self, request: Request<RaftMessage>) -> Result<Response<RaftMessage>, Status> {
        let presented = self.admit(&request, "InstallSnapshot")?;
        let install: InstallSnapshotRequest<TypeConfig> = decode(request.get_ref())?;
        let authority = self.authority_of(&install.vote);
        self.admit_claim(&request, "InstallSnapshot", presented, &install.vote, authority)?;
        self.reply(&self.raft.install_snapshot(install).await)
    }

    /// A retire notice is taken only from the leader this node follows, only by the
    /// incarnation it names and a node in a cluster, and only once
    /// this node's own committed membership no longer lists it as a voter (the leader
    /// keeps a removed voter as a learner until it took that configuration): no
    /// certificate, a member's or the leader's, can stop a voter by saying so.
    async fn retire(&self, request: Request<RetireRequest>) -> Result<Response<RetireResponse>, Status> {
        let presented = self.presented_node(&request, "Retire")?;
        self.check_member(&request, "Retire", presented)?;
        self.check_cluster_named(&request.get_ref().cluster_name)?;
        if let Some(sender) = presented {
            let leader = self.raft.metrics().borrow().current_leader;
            if leader != Some(sender) {
                return Err(self.refuse(
                    &request,
                    "Retire",
                    format!("node {sender} is not this node's leader (that is {leader:?})"),
                ));
            }
        }
        let addressed = request.get_ref().incarnation;
        if addressed != 0 && addressed != self.incarnations.incarnation() {
            return Err(self.refuse(
                &request,
                "Retire",
                format!(
                    "the notice is for incarnation {addressed} of this node, which is incarnation {} (started to \
                     replace it)",
                    self.incarnations.incarnation()
                ),
            ));
        }
        let in_a_cluster = self.raft.metrics().borrow().membership_config.membership().voter_ids().next().is_some();
        if !in_a_cluster {
            // A new incarnation waiting to be added: a late notice of the removal of
            // the node it replaces is not for it.
            return Err(self.refuse(
                &request,
                "Retire",
                "this node is in no cluster yet (a new incarnation waiting to be added)".to_string(),
            ));
        }
        let no_longer_a_voter = self
            .raft
            .wait(Some(Duration::from_millis(RETIRE_CONFIRM_MS)))
            .metrics(
                |metrics| {
                    let stored = &metrics.membership_config;
                    let committed = stored.log_id() <= &metrics.last_applied;
                    committed && !stored.membership().voter_ids().any(|voter| voter == metrics.id)
                },
                "the committed membership no longer lists this node as a voter",
            )
            .await
            .is_ok();
        if !no_longer_a_voter {
            return Err(self.refuse(
                &request,
                "Retire",
                "this node is still a voter of its committed membership".to_string(),
            ));
        }
        tracing::warn!(target: "audit", "the leader removed this node from the cluster; it stops serving");
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

    /// A member measuring its round trip to this node (`raft::round_trips`): answered
    /// at once, after the checks of a Replication question.
    async fn ping(&self, request: Request<PingRequest>) -> Result<Response<PingResponse>, Status> {
        let presented = self.presented_node(&request, "Ping")?;
        self.check_member(&request, "Ping", presented)?;
        self.check_cluster_named(&request.get_ref().cluster_name)?;
        Ok(Response::new(PingResponse {}))
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
