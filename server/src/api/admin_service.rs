//! The `Admin` gRPC service: a node's status and membership changes.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use leasehold_proto as pb;
use leasehold_proto::admin_server::Admin;
use leasehold_proto::errors::error_status;
use leasehold_proto::ErrorReason;
use openraft::{ChangeMembers, ServerState};
use tonic::{Request, Response, Status};

use crate::api::auth::{audit, Auth, Who, STATUS_RPC};
use crate::api::convert;
use crate::api::lock_delay::level_ready;
use crate::machine::{
    ClusterRecord, Command, QuotaChange, Quotas, RequestId, Response as MachineResponse, Shares, Tenant,
    COMMAND_LEVEL_END_SESSION, COMMAND_LEVEL_SHARES,
};
use crate::raft::disk::Disk;
use crate::raft::incarnations::Incarnations;
use crate::raft::network::Network;
use crate::raft::replica::Replica;
use crate::raft::types::{Node, RaftMetrics, MEMBERS_MAX};
use crate::shell::clock::RATE_PER_MILLE_MAX;
use crate::shell::credentials::secret_hash;
use crate::shell::entropy::Entropy;

/// The most the disk fault knob adds to a sync.
const SYNC_DELAY_MS_MAX: u64 = 10_000;

pub struct AdminService {
    pub replica: Arc<Replica>,
    pub auth: Arc<Auth>,
    /// The peer connections, for the retire notice to a removed node.
    pub network: Network,
    /// Whether the node serves without TLS (--insecure-plaintext), shown in Status.
    pub insecure_plaintext: bool,
    /// Whether the clock fault knob is enabled (--test-clock-knob).
    pub clock_knob: bool,
    /// The disk whose syncs the disk fault knob slows (--test-disk-knob); `None` when
    /// the knob is off.
    pub disk_knob: Option<Arc<dyn Disk>>,
    /// This node's data directory's incarnation (shown in Status), and what the
    /// leader heard of each member's, which `member add` clears for the node it adds.
    pub incarnations: Arc<Incarnations>,
    /// The planted bug of --test-keep-learner-on-add: a learner added again keeps
    /// its recorded incarnation. False in production.
    pub keep_learner_on_add: bool,
}

pub fn state_name(state: ServerState) -> &'static str {
    match state {
        ServerState::Leader => "leader",
        ServerState::Follower => "follower",
        ServerState::Candidate => "candidate",
        ServerState::Learner => "learner",
        ServerState::Shutdown => "shutdown",
    }
}

/// A new tenant token: 32 random bytes in hex behind a prefix that says what it is.
fn new_tenant_token(entropy: &Entropy) -> String {
    let bytes: [u8; 32] = entropy.bytes();
    let hex: String = bytes.iter().map(|byte| format!("{byte:02x}")).collect();
    format!("tenant_{hex}")
}

/// The quotas a request asks for; 0 (or none) takes the default.
fn quotas(requested: Option<pb::Quotas>) -> Quotas {
    let requested = requested.unwrap_or_default();
    let default = Quotas::default();
    let or_default = |value: u32, default: u32| if value == 0 { default } else { value };
    Quotas {
        sessions: or_default(requested.max_sessions, default.sessions),
        holds: or_default(requested.max_holds, default.holds),
        waiters: or_default(requested.max_waiters, default.waiters),
    }
}

/// The quotas a `SetTenantQuotas` changes: those given as 0 keep their values.
fn quota_change(requested: Option<pb::Quotas>) -> QuotaChange {
    let requested = requested.unwrap_or_default();
    let given = |value: u32| (value != 0).then_some(value);
    QuotaChange {
        sessions: given(requested.max_sessions),
        holds: given(requested.max_holds),
        waiters: given(requested.max_waiters),
    }
}

/// The share change a request asks for, if any: a weight of 0 and an unset rate quota
/// change nothing.
fn shares_change(requested: Option<&pb::Quotas>) -> Option<(Option<u32>, Option<u32>)> {
    let requested = requested?;
    let weight = (requested.weight != 0).then_some(requested.weight);
    (weight.is_some() || requested.max_ops_per_second.is_some()).then_some((weight, requested.max_ops_per_second))
}

fn tenant_info(tenant: &Tenant, shares: Shares) -> pb::TenantInfo {
    pb::TenantInfo {
        name: tenant.name.to_string(),
        quotas: Some(pb::Quotas {
            max_sessions: tenant.quotas.sessions,
            max_holds: tenant.quotas.holds,
            max_waiters: tenant.quotas.waiters,
            weight: shares.weight,
            max_ops_per_second: Some(shares.ops_per_s),
        }),
        sessions: u64::from(tenant.usage.sessions),
        holds: u64::from(tenant.usage.holds),
        waiters: u64::from(tenant.usage.waiters),
        state_bytes: tenant.usage.bytes,
    }
}

/// One audit line for an admin action (the secrets it makes are never logged).
fn unexpected(response: MachineResponse) -> Status {
    error_status(ErrorReason::Internal, format!("unexpected answer from the state machine: {response:?}"), &[])
}

/// Raft refused a membership change; `message` says why.
/// How long a learner being added may go without acknowledging more of the log
/// before the addition is refused.
pub const CATCH_UP_STALL_MS: u64 = 10_000;
/// How long a membership change waits for the voters to acknowledge the leader's
/// probe entry.
pub const REACHABLE_PROBE_MS: u64 = 2_000;
/// How long the leader waits for a removed voter, kept as a learner for the while, to
/// take the configuration without it before telling it to retire.
pub const RETIRE_CATCH_UP_MS: u64 = 2_000;

fn refused(message: String) -> Status {
    error_status(ErrorReason::MembershipRefused, message, &[])
}

/// Waits for Raft's metrics to change, until `until`. Refused once Raft has stopped
/// on this node (a fatal error): its metrics end, and `changed` would answer at once,
/// for ever, so a loop waiting on them would spin until its deadline (and, on a
/// simulator's clock, which does not move while the node runs, for good).
async fn next_metrics(
    metrics: &mut tokio::sync::watch::Receiver<RaftMetrics>,
    until: tokio::time::Instant,
    change: &str,
) -> Result<(), Status> {
    match tokio::time::timeout_at(until, metrics.changed()).await {
        Ok(Err(_)) => Err(refused(format!("cannot {change}: Raft stopped on this node"))),
        Ok(Ok(())) | Err(_) => Ok(()),
    }
}

pub fn members(metrics: &RaftMetrics, record: &ClusterRecord) -> Vec<pb::Member> {
    let membership = metrics.membership_config.membership();
    let voters: BTreeSet<u64> = membership.voter_ids().collect();
    membership
        .nodes()
        .map(|(id, node)| pb::Member {
            node_id: *id,
            client_addr: node.client_addr.clone(),
            peer_addr: node.peer_addr.clone(),
            role: if voters.contains(id) { "voter" } else { "learner" }.to_string(),
            incarnation: record.incarnation(*id).unwrap_or(0),
            round_trip: None,
        })
        .collect()
}

impl AdminService {
    fn require_leader(&self) -> Result<(), Status> {
        if self.replica.is_leader() {
            Ok(())
        } else {
            Err(self.replica.leader_hint())
        }
    }

    /// Tells a node the cluster removed to stop serving; it may be down, which is fine
    /// (a node that never hears it is no longer contacted, and its votes are refused).
    async fn tell_to_retire(&self, node_id: u64, incarnation: u64, peer_addr: &str, caught_up: bool) {
        if !caught_up {
            tracing::warn!(node_id, "the removed node did not take the configuration without it in time");
        }
        match self.network.retire(node_id, peer_addr, incarnation).await {
            Ok(()) => tracing::info!(target: "audit", node_id, "the removed node took the retire notice"),
            Err(status) => tracing::warn!(node_id, %status, "the removed node did not take the retire notice"),
        }
    }

    fn members_now(&self) -> Vec<pb::Member> {
        members(&self.replica.raft.metrics().borrow(), &self.replica.shared.cluster_record.borrow())
    }

    /// Waits until learner `node_id` has acknowledged the leader's log up to its last
    /// index as of now (later entries keep coming; this one is a fixed goal). Refused
    /// when its acknowledged index has not moved for `CATCH_UP_STALL_MS`: the node does
    /// not run, cannot be reached, or is another incarnation than the one recorded. It
    /// stays a learner (it counts for no quorum); `member remove` takes it out, and
    /// `member add` again promotes it once it runs.
    async fn wait_caught_up(&self, node_id: u64) -> Result<(), Status> {
        let goal = self.replica.raft.metrics().borrow().last_log_index.unwrap_or(0);
        let mut metrics = self.replica.raft.metrics();
        let mut best: Option<u64> = None;
        let mut stalled_since = tokio::time::Instant::now();
        loop {
            let (acknowledged, leading) = {
                let now = metrics.borrow_and_update();
                let acknowledged = now
                    .replication
                    .as_ref()
                    .and_then(|replication| replication.get(&node_id).cloned().flatten())
                    .map(|log_id| log_id.index);
                (acknowledged, now.state == ServerState::Leader)
            };
            if !leading {
                return Err(self.replica.leader_hint());
            }
            if acknowledged.is_some_and(|index| index >= goal) {
                return Ok(());
            }
            if acknowledged > best {
                best = acknowledged;
                stalled_since = tokio::time::Instant::now();
            }
            let stall_ends = stalled_since + Duration::from_millis(CATCH_UP_STALL_MS);
            if tokio::time::Instant::now() >= stall_ends {
                let lacked = match best {
                    None => "it never acknowledged an entry (is it running, on these addresses, as a new \
                             incarnation if its data was lost?)"
                        .to_string(),
                    Some(index) => format!("it acknowledged the log up to index {index} only"),
                };
                return Err(refused(format!(
                    "node {node_id} did not catch up with the leader's log (index {goal}) within {} s of no \
                     progress: {lacked}; it stays a learner, which counts for no quorum: `member add` again once \
                     it runs, or `member remove` it",
                    CATCH_UP_STALL_MS / 1_000
                )));
            }
            next_metrics(&mut metrics, stall_ends, &format!("add node {node_id}")).await?;
        }
    }

    /// Refuses a change to `voters` unless a majority of them answers now: the
    /// leader commits an empty entry and waits `REACHABLE_PROBE_MS` for the voters to
    /// acknowledge it. A change that leaves fewer reachable voters than a quorum
    /// would stop the cluster from committing anything until they are back.
    async fn require_reachable_quorum(&self, voters: &BTreeSet<u64>, change: &str) -> Result<(), Status> {
        self.replica
            .propose_quietly(Command::ExpireSessions { sessions: Vec::new() })
            .await
            .map_err(|error| refused(format!("cannot {change}: the leader could not commit an entry: {error}")))?;
        let probe = self.replica.raft.metrics().borrow().last_log_index.unwrap_or(0);
        let leader = self.replica.node_id;
        let reachable = |metrics: &RaftMetrics| -> BTreeSet<u64> {
            let replication = metrics.replication.as_ref();
            voters
                .iter()
                .copied()
                .filter(|voter| {
                    *voter == leader
                        || replication
                            .and_then(|replication| replication.get(voter).cloned().flatten())
                            .is_some_and(|log_id| log_id.index >= probe)
                })
                .collect()
        };
        let quorum = voters.len() / 2 + 1;
        let mut metrics = self.replica.raft.metrics();
        let deadline = tokio::time::Instant::now() + Duration::from_millis(REACHABLE_PROBE_MS);
        loop {
            let answered = reachable(&metrics.borrow_and_update());
            if answered.len() == voters.len() {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                if answered.len() >= quorum {
                    return Ok(());
                }
                let silent: Vec<u64> = voters.difference(&answered).copied().collect();
                return Err(refused(format!(
                    "cannot {change}: of the voters it would leave, {voters:?}, only {answered:?} acknowledged the \
                     leader within {REACHABLE_PROBE_MS} ms ({silent:?} did not), fewer than a quorum of {quorum}: \
                     the cluster could commit nothing until they are back"
                )));
            }
            next_metrics(&mut metrics, deadline, change).await?;
        }
    }

    /// The tenant `name` as the local state has it (the leader's, just after its
    /// command applied).
    /// Ok once a tenant's share may be changed (every member's build knows shares).
    async fn shares_ready(&self) -> Result<(), Status> {
        level_ready(&self.replica, &self.incarnations, COMMAND_LEVEL_SHARES, "a tenant's weight or rate quota", "first")
            .await
    }

    async fn set_quotas(&self, who: &Who, request: RequestId, name: &str, quotas: QuotaChange) -> Result<(), Status> {
        let command = Command::SetTenantQuotas { request, name: name.to_string(), quotas };
        match self.replica.propose(who.caller(&[]), command).await? {
            MachineResponse::TenantQuotasSet { .. } => Ok(()),
            MachineResponse::Rejected(error) => Err(convert::command_error(error)),
            other => Err(unexpected(other)),
        }
    }

    async fn set_shares(
        &self,
        who: &Who,
        request: RequestId,
        name: &str,
        weight: Option<u32>,
        ops_per_s: Option<u32>,
    ) -> Result<(), Status> {
        let command = Command::SetTenantShares { request, name: name.to_string(), weight, ops_per_s };
        match self.replica.propose(who.caller(&[]), command).await? {
            MachineResponse::TenantQuotasSet { .. } => Ok(()),
            MachineResponse::Rejected(error) => Err(convert::command_error(error)),
            other => Err(unexpected(other)),
        }
    }

    fn tenant_info(&self, name: &str) -> Result<pb::TenantInfo, Status> {
        let applied = self.replica.shared.applied.read().unwrap();
        let tenant = applied
            .machine
            .tenant_by_name(name)
            .map(|(id, tenant)| tenant_info(tenant, applied.machine.tenant_shares(id)));
        tenant.ok_or_else(|| error_status(ErrorReason::UnknownTenant, format!("tenant {name:?} does not exist"), &[]))
    }
}

/// What a tenant's credential is told of a node: what a client needs to find the
/// leader and fail over (the members' client addresses, roles, the leader, the term
/// and indexes) and its own namespace's counts, which `status` already holds. The
/// peer addresses, incarnations, cluster id, free disk and the state's budget are
/// the operator's, and are left out.
fn for_a_tenant(status: pb::StatusResponse) -> pb::StatusResponse {
    let members = status
        .members
        .into_iter()
        .map(|member| pb::Member { peer_addr: String::new(), incarnation: 0, round_trip: None, ..member })
        .collect();
    pb::StatusResponse {
        members,
        state_budget_bytes: 0,
        cluster_id: String::new(),
        incarnation: 0,
        disk_free_bytes: 0,
        disk_reserve_bytes: 0,
        ..status
    }
}

/// A backup file is sent in pieces of this many bytes.
pub const SNAPSHOT_CHUNK_BYTES: usize = 1 << 20;

type SnapshotStream = std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<pb::SnapshotChunk, Status>> + Send>>;

#[tonic::async_trait]
impl Admin for AdminService {
    type SnapshotStream = SnapshotStream;

    async fn snapshot(&self, request: Request<pb::SnapshotRequest>) -> Result<Response<SnapshotStream>, Status> {
        let who = self.auth.who("Admin.Snapshot", &request)?;
        who.require_admin("take a snapshot of the whole state")?;
        self.require_leader()?;
        let cluster_name = self.replica.cluster_name.clone();
        let taken_unix_ms = self.replica.clock.unix_ms();
        // Encoded under the read lock, at the applied index, after a quorum confirmed
        // the leadership: a linearizable point.
        let (header, file) = self
            .replica
            .read(false, |machine| crate::raft::backup::encode(&cluster_name, machine, taken_unix_ms))
            .await?;
        audit("Snapshot", &who, &format!("the state at index {} ({} bytes)", header.index, file.len()));
        let sha256 = crate::raft::backup::sha256_text(&file);
        let total_bytes = file.len() as u64;
        let cluster_id = header.cluster_id.map(|id| format!("{id:032x}")).unwrap_or_default();
        let chunks: Vec<Result<pb::SnapshotChunk, Status>> = file
            .chunks(SNAPSHOT_CHUNK_BYTES)
            .enumerate()
            .map(|(number, data)| {
                let first = number == 0;
                Ok(pb::SnapshotChunk {
                    data: data.to_vec(),
                    index: if first { header.index } else { 0 },
                    cluster_id: if first { cluster_id.clone() } else { String::new() },
                    total_bytes: if first { total_bytes } else { 0 },
                    sha256: if first { sha256.clone() } else { String::new() },
                })
            })
            .collect();
        Ok(Response::new(Box::pin(tokio_stream::iter(chunks))))
    }

    async fn status(&self, request: Request<pb::StatusRequest>) -> Result<Response<pb::StatusResponse>, Status> {
        let who = self.auth.who(STATUS_RPC, &request)?;
        let metrics = self.replica.raft.metrics().borrow().clone();
        let commit_index = self
            .replica
            .raft
            .with_raft_state(|state| state.committed.map(|log_id| log_id.index).unwrap_or(0))
            .await
            .unwrap_or(0);
        let leader_client_addr =
            metrics.current_leader.and_then(|id| self.replica.member_client_addr(id)).unwrap_or_default();
        let record = self.replica.shared.cluster_record.borrow().clone();
        let (sessions, locks, semaphores, elections, state_bytes) = {
            let applied = self.replica.shared.applied.read().unwrap();
            let machine = &applied.machine;
            match who {
                Who::Admin => (
                    machine.session_count(),
                    machine.lock_count(),
                    machine.semaphore_count(),
                    machine.election_count(),
                    machine.state_bytes().0,
                ),
                Who::Tenant(ref tenant) => {
                    let (sessions, locks, semaphores, elections) = machine.tenant_counts(tenant.id);
                    (sessions, locks, semaphores, elections, machine.tenant_bytes(tenant.id))
                }
            }
        };
        let (sessions, locks, semaphores, elections) =
            (sessions as u64, locks as u64, semaphores as u64, elections as u64);
        let status = pb::StatusResponse {
            node_id: metrics.id,
            state: state_name(metrics.state).to_string(),
            term: metrics.current_term,
            leader_id: metrics.current_leader.unwrap_or(0),
            leader_client_addr,
            last_log_index: metrics.last_log_index.unwrap_or(0),
            commit_index,
            applied_index: metrics.last_applied.map(|log_id| log_id.index).unwrap_or(0),
            snapshot_index: metrics.snapshot.map(|log_id| log_id.index).unwrap_or(0),
            members: convert::with_round_trips(members(&metrics, &record), self.network.round_trips()),
            cluster_name: self.replica.cluster_name.clone(),
            insecure_plaintext: self.insecure_plaintext,
            state_bytes,
            state_budget_bytes: self.replica.state_budget_bytes(),
            cluster_id: record.cluster_id.map(|id| format!("{id:032x}")).unwrap_or_default(),
            incarnation: self.incarnations.incarnation(),
            disk_free_bytes: self.replica.disk.free_bytes().unwrap_or(0),
            disk_reserve_bytes: self.replica.disk.reserve_bytes(),
            sessions,
            locks,
            semaphores,
            elections,
        };
        Ok(Response::new(if who == Who::Admin { status } else { for_a_tenant(status) }))
    }

    async fn add_member(
        &self,
        request: Request<pb::AddMemberRequest>,
    ) -> Result<Response<pb::AddMemberResponse>, Status> {
        let who = self.auth.who("Admin.AddMember", &request)?;
        who.require_admin("add a member")?;
        self.require_leader()?;
        let request = request.into_inner();
        audit(
            "AddMember",
            &who,
            &format!("node {} at {} / {}", request.node_id, request.client_addr, request.peer_addr),
        );
        if request.node_id == 0 {
            return Err(convert::invalid_argument("node_id must be a positive integer"));
        }
        for (what, address) in [("client_addr", &request.client_addr), ("peer_addr", &request.peer_addr)] {
            if std::net::ToSocketAddrs::to_socket_addrs(address.as_str()).is_err() {
                return Err(convert::invalid_argument(format!("{what} {address:?} is not a host:port address")));
            }
        }
        let current = self.members_now();
        if current.iter().any(|member| member.node_id == request.node_id && member.role == "voter") {
            return Err(error_status(
                ErrorReason::AlreadyMember,
                format!("node {} is already a voter", request.node_id),
                &[],
            ));
        }
        if current.len() >= MEMBERS_MAX && !current.iter().any(|member| member.node_id == request.node_id) {
            return Err(error_status(
                ErrorReason::LimitExceeded,
                format!("the cluster has {MEMBERS_MAX} members, the most supported (MEMBERS_MAX)"),
                &[],
            ));
        }
        let node_id = request.node_id;
        if current.iter().any(|member| member.node_id == node_id) && !self.keep_learner_on_add {
            // A learner left by an earlier add (refused, or started on a data
            // directory since replaced): it leaves first, which drops its recorded
            // incarnation, so that the incarnation that answers this add is recorded.
            // A learner counts for no quorum, and a voter is never replaced this way.
            tracing::info!(node_id, "the node is a learner already: removing it before adding it again");
            self.replica
                .raft
                .change_membership(ChangeMembers::RemoveNodes(BTreeSet::from([node_id])), false)
                .await
                .map_err(|error| refused(format!("cannot add node {node_id} again: {error}")))?;
        }
        // What this leader heard of an earlier incarnation of the node (a late answer
        // from before it was removed) must not be recorded for the one added now.
        if !self.keep_learner_on_add {
            self.incarnations.forget(node_id);
        }
        self.network.forget_acknowledged(node_id);
        let node = Node { client_addr: request.client_addr, peer_addr: request.peer_addr };
        tracing::info!(node_id, %node, "adding a learner and waiting for it to catch up");
        self.replica
            .raft
            .add_learner(node_id, node, false)
            .await
            .map_err(|error| refused(format!("cannot add node {node_id}: {error}")))?;
        self.wait_caught_up(node_id).await?;
        if !request.learner_only {
            let mut voters: BTreeSet<u64> =
                self.replica.raft.metrics().borrow().membership_config.voter_ids().collect();
            voters.insert(node_id);
            self.require_reachable_quorum(&voters, &format!("promote node {node_id}")).await?;
            tracing::info!(node_id, "promoting the learner to voter");
            self.replica
                .raft
                .change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([node_id])), true)
                .await
                .map_err(|error| refused(format!("cannot promote node {node_id}: {error}")))?;
        }
        Ok(Response::new(pb::AddMemberResponse { members: self.members_now() }))
    }

    async fn skew_clock(
        &self,
        request: Request<pb::SkewClockRequest>,
    ) -> Result<Response<pb::SkewClockResponse>, Status> {
        let who = self.auth.who("Admin.SkewClock", &request)?;
        who.require_admin("skew the clock")?;
        if !self.clock_knob {
            return Err(error_status(
                ErrorReason::ClockKnobOff,
                "the clock knob is off; start the node with --test-clock-knob",
                &[],
            ));
        }
        let request = request.into_inner();
        if request.rate_per_mille == 0 || request.rate_per_mille > RATE_PER_MILLE_MAX {
            return Err(convert::invalid_argument(format!(
                "rate_per_mille must be 1 to {RATE_PER_MILLE_MAX}, got {}",
                request.rate_per_mille
            )));
        }
        tracing::warn!(rate_per_mille = request.rate_per_mille, jump_ms = request.jump_ms, "clock fault injected");
        self.replica.clock.skew(request.rate_per_mille, request.jump_ms);
        Ok(Response::new(pb::SkewClockResponse {}))
    }

    async fn slow_disk(&self, request: Request<pb::SlowDiskRequest>) -> Result<Response<pb::SlowDiskResponse>, Status> {
        let who = self.auth.who("Admin.SlowDisk", &request)?;
        who.require_admin("slow the disk")?;
        let Some(disk) = &self.disk_knob else {
            return Err(error_status(
                ErrorReason::ClockKnobOff,
                "the disk knob is off; start the node with --test-disk-knob",
                &[],
            ));
        };
        let delay_ms = request.into_inner().sync_delay_ms;
        if delay_ms > SYNC_DELAY_MS_MAX {
            return Err(convert::invalid_argument(format!(
                "sync_delay_ms must be at most {SYNC_DELAY_MS_MAX}, got {delay_ms}"
            )));
        }
        if !disk.slow_syncs(Duration::from_millis(delay_ms)) {
            return Err(error_status(ErrorReason::ClockKnobOff, "this node's disk has no knob", &[]));
        }
        tracing::warn!(sync_delay_ms = delay_ms, "disk fault injected");
        Ok(Response::new(pb::SlowDiskResponse {}))
    }

    async fn remove_member(
        &self,
        request: Request<pb::RemoveMemberRequest>,
    ) -> Result<Response<pb::RemoveMemberResponse>, Status> {
        let who = self.auth.who("Admin.RemoveMember", &request)?;
        who.require_admin("remove a member")?;
        self.require_leader()?;
        let node_id = request.into_inner().node_id;
        audit("RemoveMember", &who, &format!("node {node_id}"));
        let current = self.members_now();
        let Some(removed) = current.iter().find(|member| member.node_id == node_id).cloned() else {
            return Err(error_status(ErrorReason::UnknownMember, format!("node {node_id} is not a member"), &[]));
        };
        let voters = current.iter().filter(|member| member.role == "voter").count();
        if removed.role == "voter" && voters <= 1 {
            return Err(error_status(ErrorReason::LastVoter, "cannot remove the last voter", &[]));
        }
        if removed.role == "voter" {
            let mut voters: BTreeSet<u64> =
                self.replica.raft.metrics().borrow().membership_config.voter_ids().collect();
            voters.remove(&node_id);
            self.require_reachable_quorum(&voters, &format!("remove node {node_id}")).await?;
        }
        tracing::info!(node_id, "removing a member");
        // The incarnation removed: a notice that arrives late must not stop the one
        // started to replace it.
        let incarnation = self.replica.shared.cluster_record.borrow().incarnation(node_id).unwrap_or(0);
        let leader_id = self.replica.raft.metrics().borrow().id;
        if removed.role == "voter" && node_id != leader_id {
            // A retiring node checks that its own committed membership no longer lists
            // it as a voter (`PeerService::retire`). openraft stops replicating to a
            // node as soon as the configuration without it is appended, so the node
            // would never see it: it stays a learner until it has taken that
            // configuration, is told to retire, and only then leaves the membership.
            self.replica
                .raft
                .change_membership(ChangeMembers::RemoveVoters(BTreeSet::from([node_id])), true)
                .await
                .map_err(|error| refused(format!("cannot remove node {node_id}: {error}")))?;
            let without = self.replica.raft.metrics().borrow().membership_config.log_id().map(|log_id| log_id.index);
            let took = self
                .replica
                .raft
                .wait(Some(Duration::from_millis(RETIRE_CATCH_UP_MS)))
                .metrics(
                    |metrics| {
                        let progress = metrics.replication.as_ref().and_then(|progress| progress.get(&node_id));
                        progress.copied().flatten().map(|log_id| log_id.index) >= without
                    },
                    "the removed voter took the configuration without it",
                )
                .await
                .is_ok();
            self.tell_to_retire(node_id, incarnation, &removed.peer_addr, took).await;
            self.replica
                .raft
                .change_membership(ChangeMembers::RemoveNodes(BTreeSet::from([node_id])), false)
                .await
                .map_err(|error| refused(format!("cannot remove node {node_id}: {error}")))?;
        } else {
            // A learner (its membership never lists it as a voter) is told once it
            // left; the leader removing itself retires when its own membership no
            // longer holds it (`watch_membership`).
            let change = if removed.role == "voter" {
                ChangeMembers::RemoveVoters(BTreeSet::from([node_id]))
            } else {
                ChangeMembers::RemoveNodes(BTreeSet::from([node_id]))
            };
            self.replica
                .raft
                .change_membership(change, false)
                .await
                .map_err(|error| refused(format!("cannot remove node {node_id}: {error}")))?;
            // A voter removed with `retain = false` may still be listed as a learner by
            // an older config; drop it entirely.
            if self.members_now().iter().any(|member| member.node_id == node_id) {
                let _ = self
                    .replica
                    .raft
                    .change_membership(ChangeMembers::RemoveNodes(BTreeSet::from([node_id])), false)
                    .await;
            }
            if node_id != leader_id {
                self.tell_to_retire(node_id, incarnation, &removed.peer_addr, true).await;
            }
        }
        Ok(Response::new(pb::RemoveMemberResponse { members: self.members_now() }))
    }

    async fn add_tenant(
        &self,
        request: Request<pb::AddTenantRequest>,
    ) -> Result<Response<pb::AddTenantResponse>, Status> {
        let who = self.auth.who("Admin.AddTenant", &request)?;
        who.require_admin("add a tenant")?;
        let request = request.into_inner();
        audit("AddTenant", &who, &format!("tenant {:?}", request.name));
        let request_id = convert::request_id(request.request_id)?;
        let shares = shares_change(request.quotas.as_ref());
        if shares.is_some() {
            self.shares_ready().await?;
        }
        let quotas = quotas(request.quotas);
        let token = new_tenant_token(&self.replica.entropy);
        let command = Command::AddTenant {
            request: request_id,
            name: request.name.clone(),
            token_hash: secret_hash(token.as_bytes()),
            quotas,
        };
        self.replica.check_budget(who.tenant())?;
        match self.replica.propose(who.caller(&[]), command).await? {
            MachineResponse::TenantAdded { .. } => {
                if let Some((weight, ops_per_s)) = shares {
                    self.set_shares(&who, request_id, &request.name, weight, ops_per_s).await?;
                }
                Ok(Response::new(pb::AddTenantResponse { tenant: Some(self.tenant_info(&request.name)?), token }))
            }
            MachineResponse::Rejected(error) => Err(convert::command_error(error)),
            other => Err(unexpected(other)),
        }
    }

    async fn list_tenants(
        &self,
        request: Request<pb::ListTenantsRequest>,
    ) -> Result<Response<pb::ListTenantsResponse>, Status> {
        let who = self.auth.who("Admin.ListTenants", &request)?;
        who.require_admin("list the tenants")?;
        let tenants = self
            .replica
            .read(false, |machine| {
                machine.tenants().map(|(id, tenant)| tenant_info(tenant, machine.tenant_shares(id))).collect()
            })
            .await?;
        Ok(Response::new(pb::ListTenantsResponse { tenants }))
    }

    async fn rotate_tenant_token(
        &self,
        request: Request<pb::RotateTenantTokenRequest>,
    ) -> Result<Response<pb::RotateTenantTokenResponse>, Status> {
        let who = self.auth.who("Admin.RotateTenantToken", &request)?;
        who.require_admin("rotate a tenant's token")?;
        let request = request.into_inner();
        audit("RotateTenantToken", &who, &format!("tenant {:?}", request.name));
        let token = new_tenant_token(&self.replica.entropy);
        let command = Command::RotateTenantToken {
            request: convert::request_id(request.request_id)?,
            name: request.name,
            token_hash: secret_hash(token.as_bytes()),
        };
        match self.replica.propose(who.caller(&[]), command).await? {
            MachineResponse::TenantTokenRotated { .. } => Ok(Response::new(pb::RotateTenantTokenResponse { token })),
            MachineResponse::Rejected(error) => Err(convert::command_error(error)),
            other => Err(unexpected(other)),
        }
    }

    async fn set_tenant_quotas(
        &self,
        request: Request<pb::SetTenantQuotasRequest>,
    ) -> Result<Response<pb::SetTenantQuotasResponse>, Status> {
        let who = self.auth.who("Admin.SetTenantQuotas", &request)?;
        who.require_admin("change a tenant's quotas")?;
        let request = request.into_inner();
        audit("SetTenantQuotas", &who, &format!("tenant {:?}: {:?}", request.name, request.quotas));
        let request_id = convert::request_id(request.request_id)?;
        let shares = shares_change(request.quotas.as_ref());
        let change = quota_change(request.quotas);
        if let Some((weight, ops_per_s)) = shares {
            self.shares_ready().await?;
            if change != QuotaChange::default() {
                self.set_quotas(&who, request_id, &request.name, change).await?;
            }
            self.set_shares(&who, request_id, &request.name, weight, ops_per_s).await?;
        } else {
            self.set_quotas(&who, request_id, &request.name, change).await?;
        }
        Ok(Response::new(pb::SetTenantQuotasResponse { tenant: Some(self.tenant_info(&request.name)?) }))
    }

    async fn remove_tenant(
        &self,
        request: Request<pb::RemoveTenantRequest>,
    ) -> Result<Response<pb::RemoveTenantResponse>, Status> {
        let who = self.auth.who("Admin.RemoveTenant", &request)?;
        who.require_admin("remove a tenant")?;
        let request = request.into_inner();
        audit("RemoveTenant", &who, &format!("tenant {:?}", request.name));
        let command = Command::RemoveTenant { request: convert::request_id(request.request_id)?, name: request.name };
        match self.replica.propose(who.caller(&[]), command).await? {
            MachineResponse::TenantRemoved { sessions_ended, .. } => {
                Ok(Response::new(pb::RemoveTenantResponse { sessions_ended }))
            }
            MachineResponse::Rejected(error) => Err(convert::command_error(error)),
            other => Err(unexpected(other)),
        }
    }

    async fn end_session(
        &self,
        request: Request<pb::EndSessionRequest>,
    ) -> Result<Response<pb::EndSessionResponse>, Status> {
        let who = self.auth.who("Admin.EndSession", &request)?;
        who.require_admin("end another's session")?;
        let request = request.into_inner();
        if request.tenant.is_empty() {
            return Err(convert::invalid_argument(
                "tenant is required: the name of the session's tenant (\"admin\" for the admin's own sessions)",
            ));
        }
        let command = Command::EndSession {
            request: convert::request_id(request.request_id)?,
            tenant: request.tenant,
            session: convert::session_id(request.session_id)?,
        };
        level_ready(
            &self.replica,
            &self.incarnations,
            COMMAND_LEVEL_END_SESSION,
            "ending a tenant's session",
            "or remove the tenant",
        )
        .await?;
        if let Command::EndSession { tenant, session, .. } = &command {
            audit("EndSession", &who, &format!("session {session} of tenant {tenant:?}"));
        }
        match self.replica.propose(who.caller(&[]), command).await? {
            MachineResponse::SessionClosed => Ok(Response::new(pb::EndSessionResponse {})),
            MachineResponse::Rejected(error) => Err(convert::command_error(error)),
            other => Err(unexpected(other)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `member add` or `remove` in progress when Raft stops on a fatal error must
    /// end, not wait on metrics that answer "closed" at once, for ever.
    #[tokio::test]
    async fn a_wait_on_the_metrics_of_a_stopped_raft_is_refused_at_once() {
        let (sender, mut metrics) = tokio::sync::watch::channel(RaftMetrics::new_initial(1));
        let until = tokio::time::Instant::now() + Duration::from_secs(3_600);
        sender.send_modify(|metrics| metrics.current_term = 2);
        next_metrics(&mut metrics, until, "add node 2").await.expect("a change while Raft runs");
        drop(sender);
        let refused = tokio::time::timeout(Duration::from_secs(30), next_metrics(&mut metrics, until, "add node 2"));
        let status = refused.await.expect("refused long before the hour's deadline").expect_err("Raft stopped");
        assert_eq!(status.message(), "cannot add node 2: Raft stopped on this node");
        assert!(tokio::time::Instant::now() < until, "refused at once, not at the deadline");
    }
}
