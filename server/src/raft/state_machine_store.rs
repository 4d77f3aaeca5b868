//! openraft's state machine: the pure `StateMachine` in memory, its snapshots in
//! RocksDB, and the shell that acts on its effects (waking waiting acquires,
//! tracking session deadlines).
//!
//! After a restart the state is the latest snapshot; openraft then re-applies the
//! committed entries after it from the log, so nothing acknowledged is lost.

use std::io::Cursor;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, RwLock};

use openraft::storage::RaftStateMachine;
use openraft::{AnyError, EntryPayload, ErrorSubject, ErrorVerb, OptionalSend, RaftSnapshotBuilder, StorageIOError};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::machine::{
    Caller, ClusterRecord, Command, DelayKey, Event, Response, SessionId, StateMachine, Submission, WaitFailure,
};
use crate::raft::applier::Applier;
use crate::raft::blocking::Blocking;
use crate::raft::codec;
use crate::raft::disk::{Disk, Durability, Family, KEY_SNAPSHOT};
use crate::raft::quiet_deadlines::QuietDeadlines;
use crate::raft::types::{Entry, LogId, NodeId, Snapshot, SnapshotMeta, StorageError, StoredMembership, TypeConfig};
use crate::shell::clock::Stopwatch;
use crate::shell::credentials::Credentials;
use crate::shell::fail_stop;
use crate::shell::lock_delays::LockDelays;
use crate::shell::observers::{Change, Observers};
use crate::shell::session_deadlines::SessionDeadlines;
use crate::shell::wait_histograms::WaitHistograms;
use crate::shell::wait_registry::{WaitOutcome, WaitRegistry};
use crate::shell::watched::WatchedGrants;

/// The replicated state as applied on this node.
#[derive(Clone, Default)]
pub struct AppliedState {
    pub machine: StateMachine,
    pub last_applied: Option<LogId>,
    pub membership: StoredMembership,
}

/// One line on the `audit` target for an admin change this node applied from the log,
/// with the entry, the leader that proposed it, the caller the entry carries and the
/// outcome. Every node writes it as it applies, so a change that reached the log by
/// any path is in every node's audit log, not only in the log of the node whose
/// client port took the request.
fn audit_admin_change(log_id: LogId, submission: &Submission, response: &Response) {
    let (rpc, name, session) = match &submission.command {
        Command::AddTenant { name, .. } => ("AddTenant", name, None),
        Command::RotateTenantToken { name, .. } => ("RotateTenantToken", name, None),
        Command::SetTenantQuotas { name, .. } => ("SetTenantQuotas", name, None),
        Command::RemoveTenant { name, .. } => ("RemoveTenant", name, None),
        Command::EndSession { tenant, session, .. } => ("EndSession", tenant, Some(*session)),
        _ => return,
    };
    let outcome = match response {
        Response::Rejected(error) => format!("refused: {error}"),
        _ => "applied".to_string(),
    };
    tracing::info!(
        target: "audit",
        rpc,
        tenant = %name,
        session,
        caller = %match submission.caller {
            Caller::Cluster => "the cluster".to_string(),
            Caller::Admin { .. } => "the admin".to_string(),
            Caller::Tenant { tenant, .. } => format!("tenant #{tenant}"),
        },
        index = log_id.index,
        term = log_id.leader_id.term,
        proposed_by = log_id.leader_id.node_id,
        %outcome,
        "admin change applied from the log"
    );
}

/// What a snapshot holds besides its metadata: the machine (see
/// `StateMachine::snapshot_into`) behind the format version.
struct SnapshotBody {
    machine: StateMachine,
}

impl SnapshotBody {
    fn encode(machine: &StateMachine) -> Vec<u8> {
        machine.snapshot_into(codec::versioned_buffer())
    }

    fn decode(bytes: &[u8]) -> Result<SnapshotBody, codec::CodecError> {
        Ok(SnapshotBody { machine: StateMachine::from_snapshot(codec::versioned_body(bytes)?)? })
    }
}

/// The latest snapshot as stored under `KEY_SNAPSHOT`.
#[derive(Deserialize)]
struct StoredSnapshot {
    meta: SnapshotMeta,
    data: Vec<u8>,
}

/// `StoredSnapshot` as it is encoded, borrowing the snapshot's bytes (a byte slice
/// encodes like the `Vec<u8>` it is read back into).
#[derive(Serialize)]
struct StoredSnapshotRef<'a> {
    meta: &'a SnapshotMeta,
    data: &'a [u8],
}

/// State shared between the Raft state-machine worker and the gRPC handlers.
pub struct Shared {
    pub applied: RwLock<AppliedState>,
    pub wait_registry: WaitRegistry,
    pub observers: Observers,
    pub deadlines: SessionDeadlines,
    /// Semaphore wait times, for the fairness metrics.
    pub semaphore_waits: WaitHistograms,
    /// The last applied index, for handlers that wait for the state to catch up.
    pub applied_index: watch::Sender<u64>,
    /// The tenants' credentials as last applied.
    pub credentials: Credentials,
    /// The replicated state's estimated size as last applied, for the budget check.
    pub state_bytes: AtomicU64,
    /// The cluster's id and its members' incarnations as last applied, for the peer
    /// messages' checks (a copy, changed only when the record changes).
    pub cluster_record: watch::Sender<Arc<ClusterRecord>>,
    /// The highest command level the applied log used, for the peer messages (a
    /// build below it cannot apply this log).
    pub log_command_level: watch::Sender<u32>,
    /// --test-panic-on-lock: the lock whose acquire panics when applied.
    pub test_panic_on_lock: OnceLock<String>,
    /// The names the operator watches, and their grants (set once at start).
    pub watched: OnceLock<WatchedGrants>,
    /// This node's record of the deadlines the checkpoints it applied gave.
    pub quiet_deadlines: QuietDeadlines,
    /// When each held-back grant's lock-delay ends on this node's clock.
    pub lock_delays: LockDelays,
}

impl Shared {
    /// Whether the last applied (so committed) membership lists `node`, as a voter or
    /// a learner: the peer port takes Raft messages from such a node while its own
    /// log already holds a later, uncommitted membership without it.
    pub fn applied_membership_has(&self, node: NodeId) -> bool {
        self.applied.read().unwrap().membership.membership().get_node(&node).is_some()
    }

    /// Publishes the applied cluster record to the peer messages' checks, if it changed.
    fn publish_cluster_record(&self) {
        let record = self.applied.read().unwrap().machine.cluster_record().clone();
        self.cluster_record.send_if_modified(|published| {
            let changed = **published != record;
            if changed {
                *published = Arc::new(record);
            }
            changed
        });
        self.publish_command_level();
    }

    fn publish_command_level(&self) {
        let level = self.applied.read().unwrap().machine.command_level();
        self.log_command_level.send_if_modified(|published| std::mem::replace(published, level) != level);
    }

    /// Every held-back grant with its whole delay, for arming the timers afresh.
    pub fn held_back_delays(machine: &StateMachine) -> Vec<(DelayKey, u64)> {
        machine.held_back().map(|(key, held)| (key.clone(), u64::from(held.delay_ms))).collect()
    }

    /// Every live session as (id, TTL, the time it has left now by its checkpoint,
    /// if any), from the applied state and this node's record of its checkpoints.
    pub fn session_ttls(machine: &StateMachine, quiet: &QuietDeadlines) -> Vec<(SessionId, u64, Option<u64>)> {
        machine
            .sessions()
            .map(|session| {
                let id = session.id();
                let left = machine
                    .quiet_checkpoint(id)
                    .map(|(remaining_ms, index)| quiet.remaining_ms(id, index, remaining_ms));
                (id, session.ttl_ms(), left)
            })
            .collect()
    }
}

#[derive(Clone)]
pub struct StateMachineStore {
    shared: Arc<Shared>,
    disk: Arc<dyn Disk>,
    /// Where the state is built (see `applier`).
    applier: Applier,
    /// Where a snapshot is encoded.
    blocking: Blocking,
}

/// What applying a run of entries produced, besides the state itself.
struct AppliedRun {
    responses: Vec<Vec<Response>>,
    events: Vec<(u64, Event)>,
    last_index: u64,
}

/// Checks a state decoded from a snapshot before it serves anything: every invariant of
/// the machine, and the two copies of the last applied index (openraft's in the
/// snapshot's metadata, the machine's own) agree. A snapshot that fails is refused, so
/// that a node stops rather than serve, or build on, a state no replica could reach.
fn check_loaded(machine: &StateMachine, last_applied: Option<LogId>) -> Result<(), String> {
    let index = last_applied.map(|log_id| log_id.index);
    if index != machine.last_applied() {
        return Err(format!(
            "the snapshot was taken at index {index:?}, but its state says it applied up to {:?}",
            machine.last_applied()
        ));
    }
    fail_stop::catching(|| machine.check_invariants())
        .map_err(|reason| format!("the snapshot's state breaks an invariant: {reason}"))
}

fn snapshot_error(error: impl std::error::Error + 'static) -> StorageError {
    StorageIOError::new(ErrorSubject::Snapshot(None), ErrorVerb::Write, AnyError::new(&error)).into()
}

impl StateMachineStore {
    /// Loads the latest snapshot, if any, as the starting state.
    pub fn open(
        disk: Arc<dyn Disk>,
        deadlines: SessionDeadlines,
        lock_delays: LockDelays,
        blocking: Blocking,
    ) -> Result<Self, String> {
        let applier = Applier::start(blocking).map_err(|error| format!("cannot start the applier thread: {error}"))?;
        let stored =
            disk.get(Family::Meta, KEY_SNAPSHOT).map_err(|error| format!("cannot read the snapshot: {error}"))?;
        let applied = match stored {
            None => AppliedState::default(),
            Some(bytes) => applier.run_blocking(move || {
                let decoding = Stopwatch::start();
                let stored: StoredSnapshot =
                    codec::decode(&bytes).map_err(|error| format!("the stored snapshot is corrupt: {error}"))?;
                let body = SnapshotBody::decode(&stored.data)
                    .map_err(|error| format!("the stored snapshot is corrupt: {error}"))?;
                let decoded_ms = decoding.elapsed_ms();
                let checking = Stopwatch::start();
                check_loaded(&body.machine, stored.meta.last_log_id)
                    .map_err(|error| format!("the stored snapshot is refused: {error}"))?;
                tracing::info!(
                    index = stored.meta.last_log_id.map(|log_id| log_id.index).unwrap_or(0),
                    bytes = bytes.len(),
                    decoded_ms,
                    checked_ms = checking.elapsed_ms(),
                    "loaded the stored snapshot"
                );
                Ok::<_, String>(AppliedState {
                    machine: body.machine,
                    last_applied: stored.meta.last_log_id,
                    membership: stored.meta.last_membership,
                })
            })?,
        };
        let quiet_deadlines = QuietDeadlines::new(disk.clone(), deadlines.clock().clone());
        let checkpoints = applied.machine.quiet_checkpoints().collect();
        quiet_deadlines.retain(applied.last_applied.map(|log_id| log_id.index).unwrap_or(0), &checkpoints);
        let ttls = Shared::session_ttls(&applied.machine, &quiet_deadlines);
        let applied_record = applied.machine.cluster_record().clone();
        let log_command_level = applied.machine.command_level();
        let deadlines = applier.run_blocking(move || {
            deadlines.restart_all(ttls);
            deadlines
        });
        let last_index = applied.last_applied.map(|log_id| log_id.index).unwrap_or(0);
        lock_delays.restart_all(Shared::held_back_delays(&applied.machine));
        let shared = Arc::new(Shared {
            applied: RwLock::new(applied),
            wait_registry: WaitRegistry::default(),
            observers: Observers::default(),
            deadlines,
            semaphore_waits: WaitHistograms::default(),
            applied_index: watch::Sender::new(last_index),
            credentials: Credentials::default(),
            state_bytes: AtomicU64::new(0),
            cluster_record: watch::Sender::new(Arc::new(applied_record.clone())),
            log_command_level: watch::Sender::new(log_command_level),
            test_panic_on_lock: OnceLock::new(),
            watched: OnceLock::new(),
            quiet_deadlines,
            lock_delays,
        });
        shared.state_bytes.store(shared.applied.read().unwrap().machine.state_bytes().0, Ordering::Relaxed);
        shared.credentials.refresh(&shared.applied.read().unwrap().machine);
        Ok(Self { shared, disk, applier, blocking })
    }

    pub fn shared(&self) -> Arc<Shared> {
        self.shared.clone()
    }

    fn dispatch(&self, events: Vec<(u64, Event)>) {
        for (index, event) in events {
            match event {
                Event::Granted { kind, name, session, token } => {
                    self.shared.wait_registry.wake(kind, session, &name, WaitOutcome::Granted { token })
                }
                Event::WaitFailed { kind, name, session, reason } => {
                    let outcome = match reason {
                        WaitFailure::SessionEnded => WaitOutcome::SessionEnded,
                        WaitFailure::Cancelled => WaitOutcome::Cancelled,
                    };
                    self.shared.wait_registry.wake(kind, session, &name, outcome)
                }
                Event::LeaderChanged { tenant, name, leader } => {
                    self.shared.observers.publish(tenant, &name, Change { index, leader })
                }
                Event::SessionEnded { session, .. } => {
                    self.shared.deadlines.session_ended(session);
                    self.shared.quiet_deadlines.forget(session);
                }
                Event::DelayStarted { key, delay_ms } => self.shared.lock_delays.started(key, delay_ms),
                Event::DelayEnded { key } => self.shared.lock_delays.ended(&key),
                Event::Released { .. } => {}
            }
        }
    }

    fn persist_snapshot(&self, meta: &SnapshotMeta, data: &[u8]) -> Result<(), StorageError> {
        let stored = StoredSnapshotRef { meta, data };
        self.disk.put(Family::Meta, KEY_SNAPSHOT, codec::encode(&stored), Durability::Synced).map_err(snapshot_error)
    }
}

/// Stores `machine` as the snapshot of a fresh database, with `meta` (its last log
/// id and membership): a restored node loads it as its state at start.
pub fn seed(disk: &dyn Disk, machine: &StateMachine, meta: &SnapshotMeta) -> Result<(), String> {
    check_loaded(machine, meta.last_log_id)?;
    let data = SnapshotBody::encode(machine);
    let stored = StoredSnapshotRef { meta, data: &data };
    disk.put(Family::Meta, KEY_SNAPSHOT, codec::encode(&stored), Durability::Synced)
        .map_err(|error| format!("cannot write the snapshot: {error}"))
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachineStore {
    async fn build_snapshot(&mut self) -> Result<Snapshot, StorageError> {
        let store = self.clone();
        self.blocking
            .run(move || {
                // Encoded under the read lock rather than cloned and encoded outside it:
                // encoding is faster than a clone of every session and lock, and a clone
                // would double the node's memory for the moment.
                let (data, last_applied, membership) = {
                    let applied = store.shared.applied.read().unwrap();
                    let data = SnapshotBody::encode(&applied.machine);
                    (data, applied.last_applied, applied.membership.clone())
                };
                let snapshot_id = match last_applied {
                    Some(log_id) => format!("{}-{}-{}", log_id.leader_id.term, log_id.leader_id.node_id, log_id.index),
                    None => "empty".to_string(),
                };
                let meta = SnapshotMeta { last_log_id: last_applied, last_membership: membership, snapshot_id };
                store.persist_snapshot(&meta, &data)?;
                crate::shell::memory::release_freed_memory();
                Ok(Snapshot { meta, snapshot: Box::new(Cursor::new(data)) })
            })
            .await
    }
}

/// Applies `entries` in order; on the applier thread, so that the state's blocks and
/// the session deadlines are allocated there.
fn apply_entries(shared: &Shared, entries: &[Entry]) -> AppliedRun {
    let mut responses = Vec::with_capacity(entries.len());
    let mut events = Vec::new();
    let mut created = Vec::new();
    let mut checkpoints = Vec::new();
    let mut tenants_changed = false;
    let mut record_changed = false;
    let last_index;
    {
        let mut applied = shared.applied.write().unwrap();
        for entry in entries {
            let index = entry.log_id.index;
            fail_stop::applying(Some((index, entry.log_id.leader_id.term)));
            applied.last_applied = Some(entry.log_id);
            match &entry.payload {
                EntryPayload::Blank => {
                    applied.machine.apply_empty(index);
                    responses.push(Vec::new());
                }
                EntryPayload::Membership(membership) => {
                    applied.membership = StoredMembership::new(Some(entry.log_id), membership.clone());
                    applied.machine.apply_empty(index);
                    applied.machine.retain_members(|node| membership.get_node(&node).is_some());
                    record_changed = true;
                    responses.push(Vec::new());
                }
                EntryPayload::Normal(proposal) => {
                    if let Some(name) = shared.test_panic_on_lock.get() {
                        panic_on_lock(name, &proposal.commands);
                    }
                    let results = applied.machine.apply_batch(index, proposal.stamp_ms, &proposal.commands);
                    let mut entry_responses = Vec::with_capacity(results.len());
                    for (submission, (response, entry_events)) in proposal.commands.iter().zip(results) {
                        audit_admin_change(entry.log_id, submission, &response);
                        match &response {
                            Response::SessionCreated { session, ttl_ms } => created.push((*session, *ttl_ms)),
                            Response::SessionsCheckpointed { quiet, resumed } => {
                                checkpoints.push((index, quiet.clone(), resumed.clone()))
                            }
                            Response::TenantAdded { .. }
                            | Response::TenantTokenRotated { .. }
                            | Response::TenantRemoved { .. } => tenants_changed = true,
                            Response::MemberRecorded { .. } => record_changed = true,
                            _ => {}
                        }
                        if let Some(watched) = shared.watched.get().filter(|watched| !watched.is_empty()) {
                            for event in &entry_events {
                                if let Event::Granted { name, session, .. } = event {
                                    let machine = &applied.machine;
                                    if let Some(tenant) = machine.session_of(*session).map(|found| found.tenant()) {
                                        watched.granted(machine.tenant_name(tenant), name, proposal.stamp_ms);
                                    }
                                }
                            }
                        }
                        events.extend(entry_events.into_iter().map(|event| (index, event)));
                        entry_responses.push(response);
                    }
                    responses.push(entry_responses);
                }
            }
        }
        // openraft's copy of the last applied index and the machine's own must agree; a
        // replica that sees otherwise stops here rather than diverge.
        assert_eq!(
            applied.last_applied.map(|log_id| log_id.index),
            applied.machine.last_applied(),
            "the applied log id and the machine's last applied index disagree"
        );
        fail_stop::applying(None);
        last_index = applied.last_applied.map(|log_id| log_id.index).unwrap_or(0);
        shared.state_bytes.store(applied.machine.bytes_total(), Ordering::Relaxed);
    }
    for (session, ttl_ms) in created {
        shared.deadlines.session_created(session, ttl_ms);
    }
    for (index, quiet, resumed) in checkpoints {
        for (session, remaining_ms) in quiet {
            // Applied again after a restart, a checkpoint gives what is left of the
            // deadline its first apply on this boot gave, not its whole time again.
            let left_ms = shared.quiet_deadlines.remaining_ms(session, index, remaining_ms);
            shared.deadlines.checkpointed(session, left_ms);
        }
        for session in resumed {
            shared.quiet_deadlines.forget(session);
            shared.deadlines.resumed(session);
        }
    }
    if tenants_changed {
        shared.credentials.refresh(&shared.applied.read().unwrap().machine);
    }
    if record_changed {
        shared.publish_cluster_record();
    } else {
        shared.publish_command_level();
    }
    AppliedRun { responses, events, last_index }
}

/// --test-panic-on-lock: a deterministic bug in apply, hit by an acquire of `name`.
fn panic_on_lock(name: &str, submissions: &[Submission]) {
    let hit = |submission: &Submission| matches!(&submission.command, Command::Acquire { name: acquired, .. } if acquired == name);
    if submissions.iter().any(hit) {
        panic!("--test-panic-on-lock: applying an acquire of {name}");
    }
}

impl RaftStateMachine<TypeConfig> for StateMachineStore {
    type SnapshotBuilder = Self;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), StorageError> {
        let applied = self.shared.applied.read().unwrap();
        Ok((applied.last_applied, applied.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Vec<Response>>, StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<Entry> = entries.into_iter().collect();
        let shared = self.shared.clone();
        let (entries, run) = self
            .applier
            .run(move || {
                let run = apply_entries(&shared, &entries);
                (entries, run)
            })
            .await;
        // Dropped here, on the worker that decoded them (see `applier`).
        drop(entries);
        self.dispatch(run.events);
        self.shared.applied_index.send_replace(run.last_index);
        Ok(run.responses)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError> {
        let data = snapshot.into_inner();
        let last_log_id = meta.last_log_id;
        let (data, body) = self
            .applier
            .run(move || {
                let body = SnapshotBody::decode(&data)
                    .map_err(|error| format!("the snapshot is corrupt: {error}"))
                    .and_then(|body| check_loaded(&body.machine, last_log_id).map(|()| body));
                (data, body)
            })
            .await;
        let body = body.map_err(|error| {
            tracing::error!(%error, snapshot = %meta.snapshot_id, "refusing a snapshot from the leader");
            let error = std::io::Error::other(error);
            StorageIOError::new(ErrorSubject::Snapshot(Some(meta.signature())), ErrorVerb::Read, AnyError::new(&error))
        })?;
        self.persist_snapshot(meta, &data)?;
        let last_index = meta.last_log_id.map(|log_id| log_id.index).unwrap_or(0);
        let checkpoints = body.machine.quiet_checkpoints().collect();
        self.shared.quiet_deadlines.retain(last_index, &checkpoints);
        let sessions = Shared::session_ttls(&body.machine, &self.shared.quiet_deadlines);
        self.shared.lock_delays.restart_all(Shared::held_back_delays(&body.machine));
        {
            let mut applied = self.shared.applied.write().unwrap();
            *applied = AppliedState {
                machine: body.machine,
                last_applied: meta.last_log_id,
                membership: meta.last_membership.clone(),
            };
        }
        let shared = self.shared.clone();
        self.applier.run(move || shared.deadlines.restart_all(sessions)).await;
        let shared = self.shared.clone();
        self.shared.wait_registry.wake_decided(|kind, session, name| {
            let applied = shared.applied.read().unwrap();
            crate::shell::wait_registry::decision(&applied.machine, kind, session, name)
        });
        self.shared.observers.reset();
        {
            let applied = self.shared.applied.read().unwrap();
            self.shared.credentials.refresh(&applied.machine);
            self.shared.state_bytes.store(applied.machine.bytes_total(), Ordering::Relaxed);
        }
        self.shared.publish_cluster_record();
        self.shared.applied_index.send_replace(last_index);
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, StorageError> {
        let Some(bytes) = self.disk.get(Family::Meta, KEY_SNAPSHOT).map_err(snapshot_error)? else {
            return Ok(None);
        };
        let stored: StoredSnapshot = codec::decode(&bytes).map_err(snapshot_error)?;
        Ok(Some(Snapshot { meta: stored.meta, snapshot: Box::new(Cursor::new(stored.data)) }))
    }
}
