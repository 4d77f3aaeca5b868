//! One node's view of the replicated state, as the gRPC services use it: propose a
//! command and get its applied response, confirm leadership (batched), and read the
//! state linearizably.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold_proto::errors::{error_status, METADATA_LEADER, METADATA_LEADER_ID, METADATA_RETRY_AFTER_MS};
use leasehold_proto::ErrorReason;
use openraft::error::{CheckIsLeaderError, ClientWriteError, ForwardToLeader, RaftError};
use openraft::ServerState;
use tokio::sync::{mpsc, oneshot, watch, Notify};
use tokio::time::Instant;
use tonic::metadata::MetadataValue;
use tonic::Status;

use crate::machine::{
    Caller, Command, CommandError, Response, Shares, StateMachine, Submission, TenantId, ADMIN_TENANT,
};
use crate::raft::rates::{TenantRates, EARLY_REFUSAL_PAUSE_MS};
use crate::raft::state_machine_store::Shared;
use crate::raft::tenant_queues::{Filling, QueueKey, Refused, TenantQueues, QUANTUM_COMMANDS};
use crate::raft::types::{Node, NodeId, Proposal, Raft};
use crate::shell::clock::Clock;
use crate::shell::clock::LogLimiter;
use crate::shell::disk::DiskSpace;
use crate::shell::entropy::Entropy;

/// The metadata key that carries the leader's client address on a not-leader error.
pub const LEADER_METADATA_KEY: &str = "leasehold-leader";
/// Leadership confirmations waiting for the next quorum round at most.
pub const LEADER_CHECKS_QUEUED_MAX: usize = 65_536;
/// How long a linearizable read waits for this node to apply up to the read index.
pub const READ_APPLY_WAIT_MS_MAX: u64 = 5_000;

type LeaderCheckReply = oneshot::Sender<Result<u64, Status>>;

/// How long a client's command waits, on a leader, for the members it heard from to
/// be recorded (see `Incarnations::clients_may_commit`) before it is refused as
/// unavailable. The recorder proposes the record as soon as it hears a member.
pub const RECORD_WAIT_MS_MAX: u64 = 5_000;

/// Commands waiting for a log entry at most, all tenants together; past it every
/// command is refused with `OVERLOADED` until the queue drains.
pub const PROPOSALS_QUEUED_MAX: usize = 65_536;
/// Commands one tenant may have waiting for a log entry on the leader, by default
/// (`--tenant-queue-max`); past it the tenant's commands are refused with
/// `OVERLOADED` and a retry-after. Enough for a few thousand clients of a tenant with
/// a request each in flight.
pub const TENANT_QUEUED_MAX_DEFAULT: usize = 4_096;
/// The retry-after an `OVERLOADED` refusal gives, at least and at most.
pub const RETRY_AFTER_MS_MIN: u64 = 10;
pub const RETRY_AFTER_MS_MAX: u64 = 2_000;
/// Commands in one log entry at most.
pub const COMMANDS_PER_ENTRY_MAX: usize = 512;
/// Entries being committed at once. While they are, new commands gather into the
/// next entry, so the batch grows with the load and one fsync and one replication
/// round commit many commands.
pub const ENTRIES_IN_FLIGHT_MAX: usize = 2;
/// Commands per entry, on average over the last entries, from which an entry is
/// committed alone. openraft 0.9 appends the leader's log one entry at a time and
/// waits for its fsync, so under load a second entry in flight overlaps little and
/// splits the batch in two (more entries, fsyncs and replication rounds for the same
/// commands); with few commands per entry (a chain of lock handoffs, light load) it
/// lets a command start its commit without waiting for an unrelated one. On the
/// 2-core machine, 4 alternating 10 s runs each, medians: lock-cycle at 64 clients
/// 5,552 cycles/s against 5,211 with two entries always and 5,713 with one;
/// contended at 16 clients 525 handoffs/s against 537 and 494.
pub const ALONE_ENTRY_COMMANDS_MIN: u64 = 8;

/// A command waiting for its entry, and who waits for its answer.
struct Pending {
    submission: Submission,
    reply: oneshot::Sender<Result<Response, Status>>,
}

/// Work this node did as leader, for the metrics page: commands per entry and
/// keepalives per leadership round show how well the batching works.
#[derive(Default)]
pub struct Counters {
    /// Log entries this node proposed with commands.
    pub entries_proposed: AtomicU64,
    /// Commands in those entries.
    pub commands_proposed: AtomicU64,
    /// Rounds of leadership confirmation with a quorum.
    pub leadership_rounds: AtomicU64,
    /// Requests those rounds answered (keepalives and linearizable reads).
    pub leadership_checks: AtomicU64,
    /// Requests refused because the state was at its budget.
    pub budget_refusals: AtomicU64,
    /// Commands refused from the applied state before they were proposed, because no
    /// entry could make them succeed (a gone session, a stale token, a wrong secret).
    pub refused_early: AtomicU64,
    /// Commands refused because their tenant's queue for the log was full.
    pub refused_overloaded: AtomicU64,
    /// Early refusals answered after a pause (their tenant was past
    /// `rates::EARLY_REFUSALS_PER_S_UNPAUSED`).
    pub refusals_paced: AtomicU64,
    /// Commands refused because their tenant was past its rate quota.
    pub refused_rate_limited: AtomicU64,
}

/// Upper bounds of the commit-wait histogram's buckets, in seconds.
pub const COMMIT_WAIT_BUCKETS_SECONDS: [f64; 12] =
    [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0];

/// How long a tenant's admitted commands waited on the leader until their entry was
/// applied: the queue, the append, replication and apply. What a tenant's share of
/// the commit path comes to, in time.
#[derive(Default, Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommitWaits {
    /// Commands that waited up to each bound of `COMMIT_WAIT_BUCKETS_SECONDS`
    /// (cumulative, as Prometheus counts).
    pub buckets: [u64; COMMIT_WAIT_BUCKETS_SECONDS.len()],
    pub count: u64,
    pub sum_micros: u64,
}

impl CommitWaits {
    pub fn record(&mut self, waited: Duration) {
        let seconds = waited.as_secs_f64();
        for (bucket, bound) in self.buckets.iter_mut().zip(COMMIT_WAIT_BUCKETS_SECONDS) {
            if seconds <= bound {
                *bucket += 1;
            }
        }
        self.count += 1;
        self.sum_micros += u64::try_from(waited.as_micros()).unwrap_or(u64::MAX);
    }
}

/// What the leader did with one tenant's commands, for the metrics page.
#[derive(Default, Clone, Copy, Debug, PartialEq, Eq)]
pub struct TenantCounts {
    /// Queued for the log.
    pub admitted: u64,
    /// How long the admitted commands waited for their entry to be applied.
    pub commit_waits: CommitWaits,
    /// Refused from the applied state before the log (see `Replica::leader_view`).
    pub refused_early: u64,
    /// Refused with `OVERLOADED`.
    pub overloaded: u64,
    /// Refused with `RATE_LIMITED`.
    pub rate_limited: u64,
}

pub struct Replica {
    pub raft: Raft,
    pub shared: Arc<Shared>,
    pub node_id: NodeId,
    pub cluster_name: String,
    pub clock: Clock,
    /// The node's only source of random choices (session secrets, tenant tokens,
    /// cluster ids).
    pub entropy: Arc<Entropy>,
    pub counters: Arc<Counters>,
    /// The estimated size of the replicated state past which new state is refused.
    state_budget_bytes: u64,
    /// Budget refusals are logged at most once a second.
    budget_refusals_logged: LogLimiter,
    /// The data directory's free space: below its reserve, new state is refused.
    pub disk: Arc<DiskSpace>,
    leader_checks: mpsc::Sender<LeaderCheckReply>,
    admission: Arc<Admission>,
    /// Each tenant's rate quota and the pace of its early refusals, on this leader.
    rates: TenantRates,
    /// Per tenant (the cluster's own commands under `None`), what this node did with
    /// its commands as leader.
    tenant_counts: Mutex<HashMap<QueueKey, TenantCounts>>,
    /// False while, as leader, a member this node heard from is not recorded yet:
    /// clients' commands wait (the recorder keeps it; see `record_members`).
    clients_may_commit: watch::Sender<bool>,
}

impl Replica {
    pub fn new(
        raft: Raft,
        shared: Arc<Shared>,
        node_id: NodeId,
        cluster_name: String,
        clock: Clock,
        state_budget_bytes: u64,
        disk: Arc<DiskSpace>,
        tenant_queued_max: usize,
        entropy: Arc<Entropy>,
    ) -> Arc<Self> {
        let counters = Arc::new(Counters::default());
        let (leader_checks, queue) = mpsc::channel(LEADER_CHECKS_QUEUED_MAX);
        tokio::spawn(run_leader_checks(raft.clone(), queue, counters.clone()));
        let admission = Arc::new(Admission::new(tenant_queued_max));
        tokio::spawn(run_proposals(raft.clone(), clock.clone(), admission.clone(), counters.clone()));
        Arc::new(Self {
            raft,
            shared,
            node_id,
            cluster_name,
            clock,
            entropy,
            counters,
            state_budget_bytes,
            budget_refusals_logged: LogLimiter::new(Duration::from_secs(1)),
            disk,
            leader_checks,
            admission,
            rates: TenantRates::default(),
            tenant_counts: Mutex::new(HashMap::new()),
            clients_may_commit: watch::Sender::new(false),
        })
    }

    /// Whether this node, as leader, lets clients' commands into the log (the members
    /// it heard from are recorded).
    pub fn set_clients_may_commit(&self, may: bool) {
        self.clients_may_commit.send_if_modified(|current| std::mem::replace(current, may) != may);
    }

    /// Waits until clients' commands may enter the log, if this node leads; a follower
    /// answers at once (it forwards nothing, and says who leads).
    async fn wait_for_the_record(&self) -> Result<(), Status> {
        if *self.clients_may_commit.borrow() || self.raft.metrics().borrow().state != ServerState::Leader {
            return Ok(());
        }
        let mut may = self.clients_may_commit.subscribe();
        let waited = tokio::time::timeout(Duration::from_millis(RECORD_WAIT_MS_MAX), async {
            may.wait_for(|may| *may).await.map(|_| ())
        })
        .await;
        match waited {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(shutting_down()),
            Err(_) => Err(Status::unavailable(format!(
                "node {} leads a cluster whose members' incarnations are not recorded yet (a member heard from is \
                 not in the log's record); try again",
                self.node_id
            ))),
        }
    }

    /// Appends `command`, sent by `caller`, to the log and returns what applying it
    /// answered. Concurrent commands share log entries (see `run_proposals`).
    pub async fn propose(&self, caller: Caller, command: Command) -> Result<Response, Status> {
        let key: QueueKey = caller.tenant();
        let mut weight = Shares::default().weight;
        if caller != Caller::Cluster {
            if let Some((refusal, shares)) = self.leader_view(&caller, &command) {
                if let Err(retry_after_ms) = self.rates.take(key, shares.ops_per_s, self.clock.now_ms()) {
                    self.counters.refused_rate_limited.fetch_add(1, Ordering::Relaxed);
                    self.count(key, |counts| counts.rate_limited += 1);
                    return Err(rate_limited(shares.ops_per_s, retry_after_ms));
                }
                if let Some(refusal) = refusal {
                    self.counters.refused_early.fetch_add(1, Ordering::Relaxed);
                    self.count(key, |counts| counts.refused_early += 1);
                    if self.rates.refusal_paced(key, self.clock.now_ms()) {
                        self.counters.refusals_paced.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(Duration::from_millis(EARLY_REFUSAL_PAUSE_MS)).await;
                    }
                    return Ok(Response::Rejected(refusal));
                }
                weight = shares.weight;
            }
            self.wait_for_the_record().await?;
        }
        let (reply, answer) = oneshot::channel();
        let submission = Submission { caller, command };
        if let Err(status) = self.admission.admit(key, weight, Pending { submission, reply }) {
            self.counters.refused_overloaded.fetch_add(1, Ordering::Relaxed);
            self.count(key, |counts| counts.overloaded += 1);
            return Err(status);
        }
        self.count(key, |counts| counts.admitted += 1);
        let admitted_at = Instant::now();
        let applied = answer.await.map_err(|_| shutting_down())?;
        let waited = admitted_at.elapsed();
        self.count(key, |counts| counts.commit_waits.record(waited));
        applied
    }

    /// Commands waiting for a log entry on this node, all tenants.
    pub fn queued_commands(&self) -> usize {
        self.admission.queued()
    }

    fn count(&self, key: QueueKey, change: impl FnOnce(&mut TenantCounts)) {
        change(self.tenant_counts.lock().unwrap().entry(key).or_default());
    }

    /// Per tenant that sent this node commands as leader: what it did with them, and
    /// how many wait for an entry now. Tenants not in `live` (removed since) are
    /// forgotten.
    pub fn tenant_counts(&self, live: impl Fn(TenantId) -> bool) -> Vec<(TenantId, TenantCounts, usize)> {
        let mut counts = self.tenant_counts.lock().unwrap();
        counts.retain(|key, _| key.is_none_or(&live));
        let mut rows: Vec<(TenantId, TenantCounts, usize)> = counts
            .iter()
            .filter_map(|(key, counts)| key.map(|tenant| (tenant, *counts, self.admission.queued_of(*key))))
            .collect();
        rows.sort_by_key(|(tenant, _, _)| *tenant);
        rows
    }

    /// What a leader decides from its applied state before queueing a client's
    /// command: the refusal it gives at once to a command that no entry could make
    /// succeed (see `StateMachine::certain_refusal`: it costs no log entry, so a client
    /// that repeats such commands slows no one else) or that would take its tenant
    /// past its holds quota with its held-back grants counted (see
    /// `StateMachine::held_back_quota_refusal`), and the caller's tenant's share of
    /// the leader. `None` on a follower, which proposes nothing and answers with the
    /// leader as before.
    fn leader_view(&self, caller: &Caller, command: &Command) -> Option<(Option<CommandError>, Shares)> {
        if !self.is_leader() {
            return None;
        }
        let applied = self.shared.applied.read().unwrap();
        let machine = &applied.machine;
        let shares = caller.tenant().map(|tenant| machine.tenant_shares(tenant)).unwrap_or_default();
        let refusal =
            machine.certain_refusal(caller, command).or_else(|| machine.held_back_quota_refusal(caller, command));
        Some((refusal, shares))
    }

    /// Proposes a command on behalf of the cluster (session expiry): no client waits.
    pub async fn propose_quietly(&self, command: Command) -> Result<Response, String> {
        self.propose(Caller::Cluster, command).await.map_err(|status| status.message().to_string())
    }

    pub fn state_budget_bytes(&self) -> u64 {
        self.state_budget_bytes
    }

    /// Refuses a request that would add state (a session, a hold, a wait, a tenant)
    /// while the replicated state is at its budget; releases, closes and expiries are
    /// never refused, so the cluster can always shrink back. The check reads the size
    /// as last applied, so commands already in flight may take it a little past.
    /// `asking` is the tenant whose request it is (`ADMIN_TENANT` for the admin):
    /// only the admin is told which tenant uses most.
    pub fn check_budget(&self, asking: TenantId) -> Result<(), Status> {
        if self.disk.is_low() {
            let free = self.disk.free_bytes().unwrap_or(0);
            let reserve = self.disk.reserve_bytes();
            if self.budget_refusals_logged.allow() {
                tracing::warn!(
                    free_bytes = free,
                    reserve_bytes = reserve,
                    "the data directory's disk is below its reserve: refusing new sessions, locks and waits (logged at \
                     most once a second)"
                );
            }
            return Err(error_status(
                ErrorReason::DiskLow,
                format!(
                    "node {}'s data directory has {free} bytes free, below its reserve of {reserve} \
                     (--disk-reserve-bytes): new sessions, holds, waits and tenants are refused until space is freed. \
                     Releases, closes and expiries still work",
                    self.node_id
                ),
                &[("free_bytes", free.to_string()), ("reserve_bytes", reserve.to_string())],
            ));
        }
        let used = self.shared.state_bytes.load(Ordering::Relaxed);
        if used < self.state_budget_bytes {
            return Ok(());
        }
        self.counters.budget_refusals.fetch_add(1, Ordering::Relaxed);
        let (largest, largest_bytes, asking_bytes) = {
            let applied = self.shared.applied.read().unwrap();
            let (_, largest) = applied.machine.state_bytes();
            let (largest, largest_bytes) = largest.map(|(name, bytes)| (name.to_string(), bytes)).unwrap_or_default();
            (largest, largest_bytes, applied.machine.tenant_bytes(asking))
        };
        if self.budget_refusals_logged.allow() {
            tracing::warn!(
                used_bytes = used,
                budget_bytes = self.state_budget_bytes,
                largest_tenant = %largest,
                largest_tenant_bytes = largest_bytes,
                "the replicated state is at its budget: refusing new sessions, locks and waits (logged at most once a second)"
            );
        }
        // Only the admin learns who uses most, and the cluster's figures: to a tenant,
        // another tenant's name and size are none of its business.
        if asking != ADMIN_TENANT {
            return Err(error_status(
                ErrorReason::BudgetExceeded,
                format!(
                    "the cluster's replicated state is at its budget: new sessions, holds and waits are refused \
                     until some are released (this tenant's part: {asking_bytes} estimated bytes). Releases, closes \
                     and expiries still work"
                ),
                &[("tenant_bytes", asking_bytes.to_string())],
            ));
        }
        Err(error_status(
            ErrorReason::BudgetExceeded,
            format!(
                "the replicated state is at its budget ({used} of {} estimated bytes); the tenant using most is \
                 {largest:?} ({largest_bytes} bytes). Releases, closes and expiries still work",
                self.state_budget_bytes
            ),
            &[
                ("budget_bytes", self.state_budget_bytes.to_string()),
                ("used_bytes", used.to_string()),
                ("largest_tenant", largest),
            ],
        ))
    }

    pub fn member_client_addr(&self, node_id: NodeId) -> Option<String> {
        let metrics = self.raft.metrics();
        let membership = metrics.borrow().membership_config.clone();
        membership.membership().get_node(&node_id).map(|node| node.client_addr.clone())
    }

    /// The leader as this node knows it.
    pub fn leader_hint(&self) -> Status {
        let leader_id = self.raft.metrics().borrow().current_leader;
        let leader_addr = leader_id.and_then(|id| self.member_client_addr(id));
        not_leader_status(self.node_id, leader_id, leader_addr)
    }

    pub fn is_leader(&self) -> bool {
        self.raft.metrics().borrow().state == ServerState::Leader
    }

    /// Confirms with a quorum that this node is still the leader and returns the read
    /// index. Concurrent callers share one confirmation round.
    pub async fn confirm_leadership(&self) -> Result<u64, Status> {
        let (reply, answer) = oneshot::channel();
        self.leader_checks.send(reply).await.map_err(|_| shutting_down())?;
        answer.await.map_err(|_| shutting_down())?
    }

    /// Runs `read` on the state after confirming leadership and applying up to the
    /// read index (linearizable), or at once on this node's state when `stale`.
    pub async fn read<T>(&self, stale: bool, read: impl FnOnce(&StateMachine) -> T) -> Result<T, Status> {
        if !stale {
            self.confirm_and_apply().await?;
        }
        let applied = self.shared.applied.read().unwrap();
        Ok(read(&applied.machine))
    }

    /// Confirms with a quorum that this node is still the leader and waits until it
    /// applied up to the read index: everything committed before, including every
    /// entry of earlier terms (the read index is at least the first entry of this
    /// leader's term). What is read or answered after this is linearizable.
    pub async fn confirm_and_apply(&self) -> Result<(), Status> {
        let read_index = self.confirm_leadership().await?;
        let mut applied = self.shared.applied_index.subscribe();
        let caught_up = tokio::time::timeout(Duration::from_millis(READ_APPLY_WAIT_MS_MAX), async {
            applied.wait_for(|index| *index >= read_index).await.is_ok()
        })
        .await;
        if caught_up != Ok(true) {
            return Err(error_status(
                ErrorReason::ReadNotApplied,
                "the leader did not apply up to the read index in time",
                &[],
            ));
        }
        Ok(())
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.admission.close();
    }
}

/// `RATE_LIMITED`: the tenant is past its rate quota on this leader; nothing was done.
fn rate_limited(ops_per_s: u32, retry_after_ms: u64) -> Status {
    let retry_after_ms = retry_after_ms.clamp(RETRY_AFTER_MS_MIN, RETRY_AFTER_MS_MAX);
    error_status(
        ErrorReason::RateLimited,
        format!(
            "this tenant's rate quota is {ops_per_s} commands a second and the leader has taken that many; nothing \
             was done: retry after {retry_after_ms} ms"
        ),
        &[(METADATA_RETRY_AFTER_MS, retry_after_ms.to_string()), ("ops_per_s", ops_per_s.to_string())],
    )
}

pub fn not_leader_status(node_id: NodeId, leader_id: Option<NodeId>, leader_addr: Option<String>) -> Status {
    let message = match (&leader_id, &leader_addr) {
        (Some(id), Some(address)) => {
            format!("node {node_id} is not the leader; the leader is node {id} at {address}")
        }
        _ => format!("node {node_id} is not the leader and knows no leader yet; retry shortly"),
    };
    let address = leader_addr.unwrap_or_default();
    let mut status = error_status(
        ErrorReason::NotLeader,
        message,
        &[(METADATA_LEADER, address.clone()), (METADATA_LEADER_ID, leader_id.unwrap_or(0).to_string())],
    );
    // Also in the response metadata, empty when no leader is known, for clients that
    // do not read the status details.
    let value = MetadataValue::try_from(address.as_str()).unwrap_or_else(|_| MetadataValue::from_static(""));
    status.metadata_mut().insert(LEADER_METADATA_KEY, value);
    status
}

/// The status of a request the node could not serve because it is stopping.
pub fn shutting_down() -> Status {
    error_status(ErrorReason::ShuttingDown, "the node is shutting down", &[])
}

/// Commands per entry, averaged over about the last 8 entries: whether the leader
/// is loaded enough to commit each entry alone (see `ALONE_ENTRY_COMMANDS_MIN`).
#[derive(Debug, Default)]
struct EntryLoad {
    /// The average, in sixteenths of a command.
    average16: u64,
}

impl EntryLoad {
    /// Counts an entry of `commands` and says whether it is committed alone.
    fn commit_alone(&mut self, commands: usize) -> bool {
        self.average16 = self.average16 - self.average16 / 8 + commands as u64 * 2;
        self.average16 >= ALONE_ENTRY_COMMANDS_MIN * 16
    }
}

/// The leader's admission of commands: the per-tenant queues the proposer fills
/// entries from, and what a tenant is told when its queue is full.
pub struct Admission {
    queues: Mutex<TenantQueues<Pending>>,
    ready: Notify,
    closed: AtomicBool,
    /// How long the last entries took from proposal to answer, on average (in
    /// microseconds, about the last 8 entries): the basis of the retry-after a full
    /// queue answers with.
    entry_commit_us: AtomicU64,
}

impl Admission {
    fn new(tenant_queued_max: usize) -> Self {
        Admission {
            queues: Mutex::new(TenantQueues::new(tenant_queued_max)),
            ready: Notify::new(),
            closed: AtomicBool::new(false),
            entry_commit_us: AtomicU64::new(0),
        }
    }

    /// Queues `pending` for the proposer, or refuses it with `OVERLOADED` and a
    /// retry-after when its tenant's queue (or all queues together) is full. A
    /// refused command did nothing.
    fn admit(&self, key: QueueKey, weight: u32, pending: Pending) -> Result<(), Status> {
        let refused = {
            let mut queues = self.queues.lock().unwrap();
            if queues.len() >= PROPOSALS_QUEUED_MAX {
                let queued = queues.queued_of(key);
                Some((queued, queues.len(), 0))
            } else {
                match queues.push(key, weight, pending) {
                    Ok(()) => None,
                    Err((Refused::TenantFull { queued, last_share }, _)) => Some((queued, queued, last_share)),
                }
            }
        };
        match refused {
            None => {
                self.ready.notify_one();
                Ok(())
            }
            Some((queued, ahead, last_share)) => Err(self.overloaded(key, queued, ahead, last_share)),
        }
    }

    /// `OVERLOADED` with a retry-after: about how long the `ahead` commands take to
    /// drain at the share the tenant last had of an entry.
    fn overloaded(&self, key: QueueKey, queued: usize, ahead: usize, last_share: usize) -> Status {
        let entry_ms = self.entry_commit_us.load(Ordering::Relaxed).div_ceil(1_000).max(1);
        let entries = ahead.div_ceil(last_share.max(QUANTUM_COMMANDS)) as u64;
        let retry_after_ms = (entries * entry_ms).clamp(RETRY_AFTER_MS_MIN, RETRY_AFTER_MS_MAX);
        let whose = match key {
            Some(_) => "this tenant's",
            None => "the cluster's",
        };
        error_status(
            ErrorReason::Overloaded,
            format!(
                "the leader has {queued} of {whose} commands queued for the log, its limit (--tenant-queue-max); \
                 nothing was done: retry after {retry_after_ms} ms"
            ),
            &[(METADATA_RETRY_AFTER_MS, retry_after_ms.to_string()), ("queued", queued.to_string())],
        )
    }

    fn note_entry_commit(&self, took: Duration) {
        let took = took.as_micros().min(u64::MAX as u128) as u64;
        let average = self.entry_commit_us.load(Ordering::Relaxed);
        let next = if average == 0 { took } else { average - average / 8 + took / 8 };
        self.entry_commit_us.store(next, Ordering::Relaxed);
    }

    /// Commands queued, all tenants.
    pub fn queued(&self) -> usize {
        self.queues.lock().unwrap().len()
    }

    /// Commands `key` has queued.
    pub fn queued_of(&self, key: QueueKey) -> usize {
        self.queues.lock().unwrap().queued_of(key)
    }

    /// The next entry's commands; waits while nothing is queued. `None` once closed.
    async fn next_entry(&self) -> Option<(Vec<Pending>, Filling)> {
        loop {
            if self.closed.load(Ordering::Acquire) {
                return None;
            }
            let (entry, filling) = self.queues.lock().unwrap().take_entry(COMMANDS_PER_ENTRY_MAX, batchable);
            if !entry.is_empty() {
                return Some((entry, filling));
            }
            self.ready.notified().await;
        }
    }

    fn top_up(&self, entry: &mut Vec<Pending>, filling: &mut Filling) {
        self.queues.lock().unwrap().top_up(entry, filling, COMMANDS_PER_ENTRY_MAX, batchable);
    }

    /// Refuses everything queued and stops the proposer.
    fn close(&self) {
        self.closed.store(true, Ordering::Release);
        for pending in self.queues.lock().unwrap().drain() {
            let _ = pending.reply.send(Err(shutting_down()));
        }
        self.ready.notify_one();
    }
}

fn batchable(pending: &Pending) -> bool {
    pending.submission.command.batch_key().is_some()
}

/// Batches proposals into log entries, filled from the tenants' queues in turn (see
/// `TenantQueues`). Commands that touch one resource each share entries, several on
/// the same resource included (the state machine keeps a grant from ending in the
/// entry that made it, so a name is still granted at most once per entry); a command
/// that must be alone (creating, closing or expiring sessions) gets its own.
async fn run_proposals(raft: Raft, clock: Clock, admission: Arc<Admission>, counters: Arc<Counters>) {
    let in_flight = Arc::new(tokio::sync::Semaphore::new(ENTRIES_IN_FLIGHT_MAX));
    let mut load = EntryLoad::default();
    loop {
        let Ok(mut permit) = in_flight.clone().acquire_owned().await else { return };
        let Some((mut batch, mut filling)) = admission.next_entry().await else { return };
        if load.commit_alone(batch.len()) {
            // Under load: this entry is committed alone, so that the commands that
            // come meanwhile gather into one next entry instead of two.
            let Ok(other) = in_flight.clone().acquire_many_owned((ENTRIES_IN_FLIGHT_MAX - 1) as u32).await else {
                return;
            };
            permit.merge(other);
            admission.top_up(&mut batch, &mut filling);
        }
        counters.entries_proposed.fetch_add(1, Ordering::Relaxed);
        counters.commands_proposed.fetch_add(batch.len() as u64, Ordering::Relaxed);
        let raft = raft.clone();
        let stamp_ms = clock.unix_ms();
        let admission = admission.clone();
        tokio::spawn(async move {
            let (commands, replies): (Vec<Submission>, Vec<_>) =
                batch.into_iter().map(|pending| (pending.submission, pending.reply)).unzip();
            let count = commands.len();
            let started = Instant::now();
            match raft.client_write(Proposal { stamp_ms, commands: commands.into() }).await {
                Ok(written) if written.data.len() == count => {
                    admission.note_entry_commit(started.elapsed());
                    for (reply, response) in replies.into_iter().zip(written.data) {
                        let _ = reply.send(Ok(response));
                    }
                }
                Ok(written) => {
                    let status = error_status(
                        ErrorReason::Internal,
                        format!("{count} commands got {} answers", written.data.len()),
                        &[],
                    );
                    for reply in replies {
                        let _ = reply.send(Err(status.clone()));
                    }
                }
                Err(error) => {
                    let status = write_error(&raft, error);
                    for reply in replies {
                        let _ = reply.send(Err(status.clone()));
                    }
                }
            }
            drop(permit);
        });
    }
}

fn write_error(raft: &Raft, error: RaftError<NodeId, ClientWriteError<NodeId, Node>>) -> Status {
    let metrics = raft.metrics();
    let metrics = metrics.borrow();
    if let Some(forward) = error.forward_to_leader() {
        return forward_status(&metrics, forward);
    }
    match error {
        RaftError::APIError(ClientWriteError::ChangeMembershipError(error)) => {
            error_status(ErrorReason::MembershipRefused, error.to_string(), &[])
        }
        other => {
            error_status(ErrorReason::CommitUncertain, format!("node {} cannot commit now: {other}", metrics.id), &[])
        }
    }
}

/// UNAVAILABLE naming the leader a not-leader error points at, with its client
/// address from the membership when the error does not carry the node.
fn forward_status(metrics: &crate::raft::types::RaftMetrics, forward: &ForwardToLeader<NodeId, Node>) -> Status {
    let leader_addr = forward.leader_node.as_ref().map(|node| node.client_addr.clone()).or_else(|| {
        forward
            .leader_id
            .and_then(|id| metrics.membership_config.membership().get_node(&id).map(|node| node.client_addr.clone()))
    });
    not_leader_status(metrics.id, forward.leader_id, leader_addr)
}

/// Serves leadership confirmations: every request that queued while a round was in
/// flight is answered by the next single round.
async fn run_leader_checks(raft: Raft, mut queue: mpsc::Receiver<LeaderCheckReply>, counters: Arc<Counters>) {
    while let Some(first) = queue.recv().await {
        let mut batch = vec![first];
        while let Ok(more) = queue.try_recv() {
            batch.push(more);
        }
        counters.leadership_rounds.fetch_add(1, Ordering::Relaxed);
        counters.leadership_checks.fetch_add(batch.len() as u64, Ordering::Relaxed);
        let result = match raft.get_read_log_id().await {
            Ok((read_log_id, _)) => Ok(read_log_id.map(|log_id| log_id.index).unwrap_or(0)),
            Err(error) => Err(check_error(&raft, error)),
        };
        for reply in batch {
            let _ = reply.send(result.clone());
        }
    }
}

fn check_error(raft: &Raft, error: RaftError<NodeId, CheckIsLeaderError<NodeId, Node>>) -> Status {
    let metrics = raft.metrics();
    let metrics = metrics.borrow();
    if let Some(forward) = error.forward_to_leader() {
        return forward_status(&metrics, forward);
    }
    error_status(
        ErrorReason::LeadershipUnconfirmed,
        format!("node {} could not confirm its leadership: {error}", metrics.id),
        &[],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commit_waits_count_each_wait_in_every_bucket_at_or_above_it() {
        let mut waits = CommitWaits::default();
        waits.record(Duration::from_micros(700));
        waits.record(Duration::from_millis(30));
        waits.record(Duration::from_secs(20));
        assert_eq!(waits.buckets, [1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2]);
        assert_eq!(waits.count, 3, "the wait past the last bound is counted in +Inf only");
        assert_eq!(waits.sum_micros, 20_030_700);
    }

    #[test]
    fn a_chain_of_single_commands_is_pipelined() {
        let mut load = EntryLoad::default();
        assert!((0..1_000).all(|_| !load.commit_alone(1)));
        assert!((0..1_000).all(|_| !load.commit_alone(ALONE_ENTRY_COMMANDS_MIN as usize - 1)));
    }

    #[test]
    fn sustained_big_entries_are_committed_alone_and_the_load_falling_ends_it() {
        let mut load = EntryLoad::default();
        let alone: Vec<bool> = (0..20).map(|_| load.commit_alone(27)).collect();
        let first_alone = alone.iter().position(|alone| *alone).expect("27 commands per entry is a load");
        assert!(first_alone > 0, "one big entry after idle time does not switch at once");
        assert!(alone[first_alone..].iter().all(|alone| *alone));
        // A small entry between big ones (the clients of the last entry not back
        // yet) does not split the next batch.
        assert!(load.commit_alone(2));
        assert!(load.commit_alone(27));
        let after: Vec<bool> = (0..40).map(|_| load.commit_alone(1)).collect();
        assert!(after[0], "one small entry does not end it");
        assert!(!after[39], "entries of one command for a while end it");
    }
}
