//! The replicated state machine of locks, semaphores and elections: pure and
//! deterministic.
//!
//! Every replica applies the same committed commands in log order and must end in the
//! same state, so nothing here reads a clock, draws a random number, does IO or iterates
//! a randomly seeded map. Time enters only as data: the leader decides that a session
//! expired and commits `ExpireSessions`; the entry's wall-clock stamp is kept for display
//! and never decides anything. A fencing token is the log index of the entry whose
//! application granted the lock, so tokens of one lock strictly increase and are never
//! handed out twice, whatever happens to leaders and nodes. The same holds for the
//! leadership of an election. A semaphore permit's token is the index of its granting
//! entry too, but several permits granted in one entry share it: permit tokens are unique
//! per grant to one session of one semaphore and increase over the grants, not per slot.
//!
//! Locks, semaphores and elections live in separate namespaces (`ResourceKind`): lock
//! "x", semaphore "x" and election "x" are three different things. A session's
//! `LOCKS_PER_SESSION_MAX` counts all three together.
//!
//! `apply` returns the answer for the proposing client and the effects for the async
//! shell as data (`Event`); the shell wakes waiting RPCs with them.
//!
//! # Layout
//!
//! - `mod.rs`: `StateMachine`, `apply` (retries, then the command) and the queries.
//! - `caller.rs`: `Caller`, who a command comes from (the cluster, the admin, a
//!   tenant), with tenant ids and secret hashes.
//! - `command.rs`: `Command`, `RequestId`, `Submission` (a command and its caller) and
//!   the fingerprint that tells a retry from a reuse of its request id.
//! - `response.rs`: `Response` and the outcomes of acquire and cancel.
//! - `event.rs`: `Event`, the effects of an entry.
//! - `error.rs`: `CommandError`, one constructor per broken rule.
//! - `session.rs`: `Session`, its remembered answers, and the session commands:
//!   create, close, expire, and ending sessions in one entry.
//! - `lock.rs`: `Lock`, one entry of the lock table, and the lock commands.
//! - `delay.rs`: lock-delay: grants held back after their holder's session expired,
//!   and the command that ends a delay.
//! - `members.rs`: `ClusterRecord`, the cluster's id and its members' incarnations.
//! - `semaphore.rs`: `Semaphore`, one entry of the semaphore table, and the semaphore
//!   commands.
//! - `election.rs`: `Election`, one entry of the election table, and the election
//!   commands.
//! - `tenant.rs`: `Tenant`, the namespaces, `authorize` (who may run a command),
//!   usage against quotas, and the tenant commands.
//! - `early_refusal.rs`: `certain_refusal`, the refusals a leader may answer before a
//!   command costs a log entry, because no later entry can undo them.
//! - `view.rs`: the read-only answers of the queries.
//! - `listing.rs`: bounded, searchable pages of every table, for the status page.
//! - `invariants.rs`: `check_invariants`, the named checks every replica's state passes.
//! - `limits.rs`: every bound on the replicated state, and `Quotas`, one tenant's.
//! - `tests.rs`: table tests of every rule; `model_tests.rs`: random command sequences
//!   against a naive model.
//! - `scenarios.rs`: runs the scenario scripts in `testdata/*.txt` (commands, then the
//!   responses and events they must print).

mod caller;
mod command;
mod delay;
mod early_refusal;
mod election;
mod error;
mod event;
mod invariants;
pub mod limits;
mod listing;
mod lock;
mod members;
mod response;
mod semaphore;
mod session;
mod tenant;
mod view;

#[cfg(test)]
mod model_tests;
#[cfg(test)]
mod scenarios;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use thin_vec::ThinVec;

use crate::machine::limits::REQUESTS_REMEMBERED_PER_SESSION_MAX;

pub use command::{
    Command, RequestId, COMMAND_LEVEL, COMMAND_LEVEL_CHECKPOINT, COMMAND_LEVEL_END_SESSION, COMMAND_LEVEL_LOCK_DELAY,
    COMMAND_LEVEL_RECORD_MEMBER, COMMAND_LEVEL_SHARES,
};
pub use delay::{DelayKey, HeldBack};
pub use error::{is_tenant_label, CommandError, ErrorKind};
pub use event::{Event, WaitFailure};
pub use listing::{InTenant, Listing, Search, SessionRow, Walk};
pub use response::{AcquireOutcome, CancelOutcome, Response};
pub use session::Session;
pub use view::{
    ElectionView, FenceStatus, HeldLock, HolderView, LeaderView, LockView, SemaphoreView, SessionView, WaiterView,
};

pub use caller::{Caller, SecretHash, TenantId, ADMIN_TENANT, ADMIN_TENANT_NAME};
pub use command::Submission;
pub use limits::{QuotaChange, Quotas, Shares};
pub use members::{ClusterRecord, Recorded};
pub use tenant::{Tenant, Usage};

use error::{request_id_reused, token_not_yet_applied};
use session::{push_compact, Answer, ClientName, Remembered, Role};
use tenant::{Namespace, EMPTY_NAMESPACE};

/// The log index of the entry that created the session: unique and deterministic.
pub type SessionId = u64;

/// A fencing token: the log index of the entry whose application granted the lock, the
/// semaphore permit or the leadership.
pub type Token = u64;

/// What a name refers to. Locks, semaphores and elections live in separate namespaces:
/// lock "x", semaphore "x" and election "x" are three different things.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ResourceKind {
    Lock,
    Semaphore,
    Election,
}

impl ResourceKind {
    /// The word for it in messages.
    pub fn noun(self) -> &'static str {
        match self {
            ResourceKind::Lock => "lock",
            ResourceKind::Semaphore => "semaphore",
            ResourceKind::Election => "election",
        }
    }
}

/// The whole replicated state. Snapshots serialize it as it is, and replicas that applied
/// the same entries compare equal.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(from = "DecodedMachine")]
pub struct StateMachine {
    /// `None` before the first entry. Openraft's first entry, the initial membership,
    /// sits at index 0, so 0 cannot mean "nothing applied".
    last_applied: Option<u64>,
    /// Boxed: a map slot then holds a pointer instead of the whole `Session`, and
    /// since ids only grow, new sessions land at the map's right edge, where its nodes
    /// stay about half full. That halves what each session costs in map nodes.
    sessions: BTreeMap<SessionId, Box<Session>>,
    /// Each tenant's locks, semaphores and elections; a tenant with none in use has no
    /// entry. See `tenant::Namespace`.
    namespaces: BTreeMap<TenantId, Namespace>,
    /// Every tenant, the admin namespace (`ADMIN_TENANT`) always among them.
    tenants: BTreeMap<TenantId, Tenant>,
    /// The id the next tenant gets: ids are never reused, so a removed tenant's
    /// sessions cannot come back under another's name.
    next_tenant_id: TenantId,
    /// Which session each remembered `CreateSession` request created, so that a retry
    /// of it, whose client does not know its session yet, finds the answer. Every
    /// other request names its session and is looked up among that session's own
    /// remembered answers: request ids are scoped to their session. Not in snapshots;
    /// rebuilt from the sessions' remembered answers when one is decoded.
    #[serde(skip)]
    creations: BTreeMap<RequestId, SessionId>,
    /// Every live session's client name, once, with the number of sessions that share
    /// it. A process that opens many sessions (a worker pool) names them all alike, and
    /// its name is often longer than the rest of an idle session. Not in snapshots (each
    /// session carries its name there); rebuilt when one is decoded.
    #[serde(skip)]
    client_names: BTreeMap<ClientName, u32>,
    /// Tenants by the hash of their token, for authenticating requests. Not in
    /// snapshots; rebuilt from the tenants when one is decoded.
    #[serde(skip)]
    tenants_by_token: BTreeMap<SecretHash, TenantId>,
    /// Every session by its tenant, so that a tenant's listing walks its own sessions
    /// only. Not in snapshots; rebuilt from the sessions when one is decoded.
    #[serde(skip)]
    sessions_by_tenant: std::collections::BTreeSet<(TenantId, SessionId)>,
    /// The sum of every tenant's `usage.bytes`, kept as they change. Not in
    /// snapshots; summed again when one is decoded.
    #[serde(skip)]
    bytes_total: u64,
    /// The cluster's id and its members' incarnations (see `members`). Snapshots
    /// carry it after the machine (see the state machine store), not in it, so that
    /// snapshots written before it existed still decode.
    #[serde(skip)]
    cluster: ClusterRecord,
    /// Sessions the leader checkpointed as quiet, with the time their lease had left
    /// then and the index of the checkpoint's entry (see `Command::CheckpointSessions`);
    /// a subset of `sessions`. Snapshots carry it after the cluster record, so that
    /// older snapshots still decode.
    #[serde(skip)]
    quiet: BTreeMap<SessionId, (u32, u64)>,
    /// The highest command level (see `command::COMMAND_LEVEL`) of 2 or above the log
    /// has used: every member's build knew it then, so a new leader may use it without
    /// hearing every member again. Snapshots carry it after `quiet`.
    #[serde(skip)]
    command_level: u32,
    /// The lock-delay of each hold or wait that asked for one (see `delay`). Snapshots
    /// carry it after `command_level`, once the log used lock-delay.
    #[serde(skip)]
    claim_delays: BTreeMap<delay::ClaimKey, u32>,
    /// Grants held back after their holder's session expired, until the leader ends
    /// their delay (see `delay`). Snapshots carry it after `claim_delays`.
    #[serde(skip)]
    held_back: BTreeMap<DelayKey, HeldBack>,
    /// The tenants given a share other than the default (see `limits::Shares`).
    /// Snapshots carry it after `held_back`, once the log used shares.
    #[serde(skip)]
    tenant_shares: BTreeMap<TenantId, Shares>,
}

impl Default for StateMachine {
    fn default() -> StateMachine {
        StateMachine {
            last_applied: None,
            sessions: BTreeMap::new(),
            namespaces: BTreeMap::new(),
            tenants: BTreeMap::from([(ADMIN_TENANT, StateMachine::admin_tenant())]),
            next_tenant_id: ADMIN_TENANT + 1,
            creations: BTreeMap::new(),
            client_names: BTreeMap::new(),
            tenants_by_token: BTreeMap::new(),
            sessions_by_tenant: std::collections::BTreeSet::new(),
            bytes_total: 0,
            cluster: ClusterRecord::default(),
            quiet: BTreeMap::new(),
            command_level: 0,
            claim_delays: BTreeMap::new(),
            held_back: BTreeMap::new(),
            tenant_shares: BTreeMap::new(),
        }
    }
}

/// `StateMachine` as snapshots encode it: decoded into this, then its derived tables
/// (creations, shared client names, tokens) are built again.
#[derive(Deserialize)]
struct DecodedMachine {
    last_applied: Option<u64>,
    sessions: BTreeMap<SessionId, Box<Session>>,
    namespaces: BTreeMap<TenantId, Namespace>,
    tenants: BTreeMap<TenantId, Tenant>,
    next_tenant_id: TenantId,
}

impl From<DecodedMachine> for StateMachine {
    fn from(decoded: DecodedMachine) -> StateMachine {
        let DecodedMachine { last_applied, sessions, namespaces, tenants, next_tenant_id } = decoded;
        let mut machine = StateMachine {
            last_applied,
            sessions,
            namespaces,
            tenants,
            next_tenant_id,
            creations: BTreeMap::new(),
            client_names: BTreeMap::new(),
            tenants_by_token: BTreeMap::new(),
            sessions_by_tenant: std::collections::BTreeSet::new(),
            bytes_total: 0,
            cluster: ClusterRecord::default(),
            quiet: BTreeMap::new(),
            command_level: 0,
            claim_delays: BTreeMap::new(),
            held_back: BTreeMap::new(),
            tenant_shares: BTreeMap::new(),
        };
        let mut client_names = BTreeMap::new();
        for session in machine.sessions.values_mut() {
            session.client_name = share_name(&mut client_names, &session.client_name);
            for remembered in &session.remembered {
                if let Answer::SessionCreated { .. } = remembered.answer {
                    machine.creations.insert(remembered.request, session.id);
                }
            }
        }
        machine.client_names = client_names;
        machine.sessions_by_tenant = machine.sessions.values().map(|session| (session.tenant, session.id)).collect();
        for (id, tenant) in &machine.tenants {
            if let Some(token_hash) = tenant.token_hash {
                machine.tenants_by_token.insert(token_hash, *id);
            }
        }
        machine.bytes_total = machine.tenants.values().map(|tenant| tenant.usage.bytes).sum();
        machine
    }
}

/// The shared copy of `name` for one more session, added to `names` if it is new.
fn share_name(names: &mut BTreeMap<ClientName, u32>, name: &str) -> ClientName {
    if let Some((shared, sessions)) = names.get_key_value(name) {
        let shared = shared.clone();
        *names.get_mut(name).expect("found above") = sessions + 1;
        return shared;
    }
    let shared = ClientName::new(name);
    names.insert(shared.clone(), 1);
    shared
}

/// One session fewer uses `name`; the last one takes it out of `names`.
fn unshare_name(names: &mut BTreeMap<ClientName, u32>, name: &str) {
    let sessions = names.get_mut(name).expect("every session's client name is in the table");
    *sessions -= 1;
    if *sessions == 0 {
        names.remove(name);
    }
}

impl StateMachine {
    pub fn new() -> Self {
        StateMachine::default()
    }

    /// Applies the command of the entry at `index` as the cluster itself, whose commands
    /// are not checked against any credential (see `apply_as`). `stamp_ms` is the
    /// leader's wall-clock stamp of the entry: informational only, used for "since"
    /// fields, never for decisions.
    ///
    /// A rejected command changes nothing but the last applied index. A command whose
    /// request id was applied before changes nothing either: it gets the stored answer,
    /// or `RequestIdReused` if its body differs.
    ///
    /// # Panics
    ///
    /// If `index` is not after the last applied index: entries must come in log order,
    /// and a replica that sees otherwise must stop rather than diverge.
    pub fn apply(&mut self, index: u64, stamp_ms: u64, command: &Command) -> (Response, Vec<Event>) {
        self.apply_as(index, stamp_ms, &Caller::Cluster, command)
    }

    /// `apply` for a command sent by `caller`: refused unless the caller may send it
    /// (see `tenant`), and carried out in the caller's namespace.
    pub fn apply_as(
        &mut self,
        index: u64,
        stamp_ms: u64,
        caller: &Caller,
        command: &Command,
    ) -> (Response, Vec<Event>) {
        self.advance(index);
        self.apply_at(index, stamp_ms, caller, command)
    }

    /// Applies the commands of one entry in order, each seeing the effects of those
    /// before it, and each granting with `index` as its token. The proposer puts
    /// several commands in one entry only when each has a `batch_key` (see
    /// `Command::batch_key`); anything else is refused here. Several commands may touch
    /// the same name: a release, resign or proclaim presenting a token granted in this
    /// entry is refused, so a grant made in this entry cannot end in it, and no two
    /// grants of one lock or election share the entry's index.
    ///
    /// # Panics
    ///
    /// If `index` is not after the last applied index, or the batch breaks the rule.
    pub fn apply_batch(
        &mut self,
        index: u64,
        stamp_ms: u64,
        submissions: &[Submission],
    ) -> Vec<(Response, Vec<Event>)> {
        assert!(
            batch_is_valid(submissions.iter().map(|submission| &submission.command)),
            "a command that needs an entry of its own shares one: {submissions:?}"
        );
        self.advance(index);
        submissions
            .iter()
            .map(|submission| self.apply_at(index, stamp_ms, &submission.caller, &submission.command))
            .collect()
    }

    /// Applies one more command in the entry at `index`, which was applied last, as if
    /// it had come after the others in `apply_batch`: for tests that build batches one
    /// command at a time.
    #[cfg(test)]
    pub(crate) fn apply_joining(&mut self, index: u64, stamp_ms: u64, command: &Command) -> (Response, Vec<Event>) {
        assert_eq!(self.last_applied, Some(index), "joins the last applied entry");
        assert!(command.batch_key().is_some(), "{command:?} needs an entry of its own");
        self.apply_at(index, stamp_ms, &Caller::Cluster, command)
    }

    fn apply_at(&mut self, index: u64, stamp_ms: u64, caller: &Caller, command: &Command) -> (Response, Vec<Event>) {
        let mut events = Vec::new();
        let response = match self.authorize(caller, command) {
            Err(error) => Response::Rejected(error),
            Ok(()) => match command.request() {
                None => self.execute(index, stamp_ms, caller, command, &mut events),
                Some(request) => {
                    let fingerprint = command.fingerprint();
                    match self.recall(request, fingerprint, command) {
                        Some(response) => self.recalled(caller, request, command, response),
                        None => {
                            let response = self.execute(index, stamp_ms, caller, command, &mut events);
                            self.remember(request, fingerprint, command, &response);
                            response
                        }
                    }
                }
            },
        };
        if matches!(response, Response::Rejected(_)) {
            assert!(events.is_empty(), "a rejected command has no effects");
        }
        // Count the sessions whose lists changed into their tenants' usage: the acting
        // session (or the new one) and every session an event names.
        let acting = match response {
            Response::SessionCreated { session, .. } => Some(session),
            _ => command.session(),
        };
        for session in acting.into_iter().chain(events.iter().filter_map(Event::session_touched)) {
            self.account(session);
        }
        (response, events)
    }

    /// The stored answer to a retried request, as the caller gets it. A retried
    /// `CreateSession` is the only one that changes anything: its first answer was lost
    /// with the secret in it, so the session takes the retry's secret (the session is
    /// unused, since no request has named it yet). Another tenant's retry of the id is
    /// a reuse of it.
    fn recalled(&mut self, caller: &Caller, request: RequestId, command: &Command, response: Response) -> Response {
        let (Command::CreateSession { .. }, Response::SessionCreated { session, .. }) = (command, &response) else {
            return response;
        };
        let created = self.sessions.get_mut(session).expect("a remembered creation's session lives");
        let (tenant, secret) = match *caller {
            Caller::Cluster => (ADMIN_TENANT, SecretHash::default()),
            Caller::Admin { secret } => (ADMIN_TENANT, secret),
            Caller::Tenant { tenant, secret } => (tenant, secret),
        };
        if created.tenant != tenant {
            return Response::Rejected(request_id_reused(request));
        }
        created.secret = secret;
        response
    }

    /// Applied for log entries that carry no command (openraft's blank and membership
    /// entries), so that the last applied index stays exact.
    ///
    /// # Panics
    ///
    /// If `index` is not after the last applied index.
    pub fn apply_empty(&mut self, index: u64) {
        self.advance(index);
    }

    /// The index of the last applied entry, 0 before any. `last_applied` tells the two
    /// meanings of 0 apart.
    pub fn last_applied_index(&self) -> u64 {
        self.last_applied.unwrap_or(0)
    }

    /// The index of the last applied entry, `None` before any.
    pub fn last_applied(&self) -> Option<u64> {
        self.last_applied
    }

    /// Lock `name` in `tenant`'s namespace; `None` when it is free.
    pub fn describe_lock(&self, tenant: TenantId, name: &str) -> Option<LockView> {
        let lock = self.namespace(tenant).locks.get(name)?;
        Some(LockView {
            name: name.to_owned(),
            holder: self.holder_view(tenant, ResourceKind::Lock, name, &lock.holder),
            waiters: self.waiter_views(lock.waiters.iter().copied()),
        })
    }

    pub fn describe_session(&self, session: SessionId) -> Option<SessionView> {
        let session = self.sessions.get(&session)?;
        let namespace = self.namespace(session.tenant);
        Some(SessionView {
            id: session.id,
            ttl_ms: session.ttl_ms(),
            tenant: session.tenant,
            client_name: session.client_name.to_string(),
            created_index: session.created_index(),
            held: session
                .held
                .iter()
                .map(|name| {
                    let holder = &self.lock(session.tenant, name).holder;
                    HeldLock { name: name.clone(), token: holder.token, since_ms: holder.since_ms }
                })
                .collect(),
            waiting: session.waiting.to_vec(),
            permits: session
                .claimed(ResourceKind::Semaphore, Role::Holds)
                .map(|name| {
                    let holder =
                        namespace.semaphores[name].holder(session.id).expect("a session lists only permits it holds");
                    HeldLock { name: name.to_owned(), token: holder.token, since_ms: holder.since_ms }
                })
                .collect(),
            waiting_semaphores: session.claimed(ResourceKind::Semaphore, Role::Waits).map(str::to_owned).collect(),
            leading: session
                .claimed(ResourceKind::Election, Role::Holds)
                .map(|name| {
                    let leader = &namespace.elections[name].leader;
                    HeldLock { name: name.to_owned(), token: leader.token, since_ms: leader.since_ms }
                })
                .collect(),
            campaigning: session.claimed(ResourceKind::Election, Role::Waits).map(str::to_owned).collect(),
        })
    }

    /// `None` when the semaphore has neither holders nor waiters: it has no entry then,
    /// and the next acquirer sets its limit.
    pub fn describe_semaphore(&self, tenant: TenantId, name: &str) -> Option<SemaphoreView> {
        let semaphore = self.namespace(tenant).semaphores.get(name)?;
        Some(SemaphoreView {
            name: name.to_owned(),
            limit: semaphore.limit,
            holders: semaphore
                .holders
                .iter()
                .map(|holder| self.holder_view(tenant, ResourceKind::Semaphore, name, holder))
                .collect(),
            waiters: self.waiter_views(semaphore.waiters.iter().copied()),
        })
    }

    /// `None` when the election is vacant.
    pub fn describe_election(&self, tenant: TenantId, name: &str) -> Option<ElectionView> {
        let election = self.namespace(tenant).elections.get(name)?;
        Some(ElectionView {
            name: name.to_owned(),
            leader: self.leader_view(tenant, name).expect("a stored election has a leader"),
            waiters: self.waiter_views(election.waiters.iter().map(|waiter| waiter.session)),
        })
    }

    /// Every semaphore in use, ordered by tenant and name: its tenant's name, its name,
    /// limit and how many hold and wait, for the fairness gauges.
    pub fn semaphore_stats(&self) -> impl Iterator<Item = (&str, &str, u32, usize, usize)> + '_ {
        self.namespaces.iter().flat_map(move |(tenant, namespace)| {
            let tenant = self.tenant_name(*tenant);
            namespace.semaphores.iter().map(move |(name, semaphore)| {
                (tenant, name.as_str(), semaphore.limit, semaphore.holders.len(), semaphore.waiters.len())
            })
        })
    }

    /// Semaphores with holders or waiters; unused ones are not stored.
    pub fn semaphore_count(&self) -> usize {
        self.namespaces.values().map(|namespace| namespace.semaphores.len()).sum()
    }

    /// Elections with a leader; vacant ones are not stored.
    pub fn election_count(&self) -> usize {
        self.namespaces.values().map(|namespace| namespace.elections.len()).sum()
    }

    /// Every live session, ordered by id. The leader walks this to arm every session's
    /// deadline afresh when it takes office.
    pub fn sessions(&self) -> impl Iterator<Item = &Session> + '_ {
        self.sessions.values().map(|session| &**session)
    }

    /// Live sessions from id `first` on, ordered by id: a page of `ListSessions`.
    pub fn sessions_from(&self, first: SessionId) -> impl Iterator<Item = &Session> + '_ {
        self.sessions.range(first..).map(|(_, session)| &**session)
    }

    /// `tenant`'s sessions from id `first` on, in id order: a walk of that tenant's
    /// sessions only.
    pub fn tenant_sessions_from(&self, tenant: TenantId, first: SessionId) -> impl Iterator<Item = &Session> + '_ {
        self.sessions_by_tenant.range((tenant, first)..=(tenant, SessionId::MAX)).map(|(_, id)| &*self.sessions[id])
    }

    pub fn session_ttl_ms(&self, session: SessionId) -> Option<u64> {
        self.sessions.get(&session).map(|session| session.ttl_ms())
    }

    /// A live session, for the checks the gRPC layer makes before a keepalive.
    pub fn session_of(&self, session: SessionId) -> Option<&Session> {
        self.sessions.get(&session).map(|session| &**session)
    }

    pub fn session_count(&self) -> usize {
        self.sessions.len()
    }

    /// One tenant's part of the counts above: its sessions, held locks, semaphores in
    /// use and elections with a leader.
    pub fn tenant_counts(&self, tenant: TenantId) -> (usize, usize, usize, usize) {
        let namespace = self.namespace(tenant);
        let sessions = self.tenants.get(&tenant).map_or(0, |entry| entry.usage.sessions as usize);
        (sessions, namespace.locks.len(), namespace.semaphores.len(), namespace.elections.len())
    }

    /// Held locks; free locks are not stored.
    pub fn lock_count(&self) -> usize {
        self.namespaces.values().map(|namespace| namespace.locks.len()).sum()
    }

    /// Whether a write fenced with `token` may still proceed on the lock `name` of
    /// `tenant`'s namespace.
    pub fn check_fence(&self, tenant: TenantId, name: &str, token: Token) -> FenceStatus {
        self.check_fence_of(ResourceKind::Lock, tenant, name, token)
    }

    /// `check_fence` for any kind of resource. For an election, `token` must be the
    /// current leadership. For a semaphore, some permit granted with `token` must still
    /// be held; since permits granted in one entry share its index, the token names that
    /// grant, not one slot.
    pub fn check_fence_of(&self, kind: ResourceKind, tenant: TenantId, name: &str, token: Token) -> FenceStatus {
        let namespace = self.namespace(tenant);
        let current = match kind {
            // A grant held back for its lock-delay (see `delay`) keeps its table slot,
            // but its session is gone: it fences nothing any more.
            ResourceKind::Lock => namespace
                .locks
                .get(name)
                .is_some_and(|lock| lock.holder.token == token && self.sessions.contains_key(&lock.holder.session)),
            ResourceKind::Semaphore => namespace.semaphores.get(name).is_some_and(|semaphore| {
                semaphore
                    .holders
                    .iter()
                    .any(|holder| holder.token == token && self.sessions.contains_key(&holder.session))
            }),
            ResourceKind::Election => {
                namespace.elections.get(name).is_some_and(|election| election.leader.token == token)
            }
        };
        if current {
            FenceStatus::Current
        } else {
            FenceStatus::Superseded
        }
    }

    /// A holder as describe answers show it: a live session, or the expired session
    /// of a grant held back for its lock-delay.
    fn holder_view(&self, tenant: TenantId, kind: ResourceKind, name: &str, holder: &lock::Holder) -> HolderView {
        let (client_name, lock_delay_ms, held_back_until_ms) = match self.sessions.get(&holder.session) {
            Some(session) => (session.client_name.to_string(), self.grant_delay_ms(holder.session, kind, name), None),
            None => {
                let held = self
                    .held_back_grant(tenant, kind, name, holder.session)
                    .unwrap_or_else(|| panic!("{kind:?} {name:?} is held by a gone session and not held back"));
                (held.client_name.clone(), u64::from(held.delay_ms), Some(held.until_ms))
            }
        };
        HolderView {
            session: holder.session,
            client_name,
            token: holder.token,
            since_ms: holder.since_ms,
            lock_delay_ms,
            held_back_until_ms,
        }
    }

    fn waiter_views(&self, waiters: impl Iterator<Item = SessionId>) -> Vec<WaiterView> {
        waiters
            .map(|waiter| WaiterView { session: waiter, client_name: self.session(waiter).client_name.to_string() })
            .collect()
    }

    fn advance(&mut self, index: u64) {
        if let Some(last_applied) = self.last_applied {
            assert!(index > last_applied, "entries are applied in log order: index {index} after {last_applied}");
        }
        self.last_applied = Some(index);
    }

    /// The answer to a request id seen before, or `None` for a new request.
    fn recall(&self, request: RequestId, fingerprint: u64, command: &Command) -> Option<Response> {
        let owner = match command.session() {
            Some(session) => session,
            None => *self.creations.get(&request)?,
        };
        let remembered =
            self.sessions.get(&owner)?.remembered.iter().find(|remembered| remembered.request == request)?;
        if remembered.fingerprint != fingerprint {
            return Some(Response::Rejected(request_id_reused(request)));
        }
        // A wait moves on after its answer was given: tell the retry where it stands now,
        // so that it neither queues twice nor waits for a grant that came and went.
        match (remembered.answer, command) {
            (
                Answer::Acquire(AcquireOutcome::Queued { .. }),
                Command::Acquire { session, name, .. } | Command::AcquireWithDelay { session, name, .. },
            ) => Some(Response::Acquire(self.wait_outcome(*session, name))),
            (
                Answer::Acquire(AcquireOutcome::Queued { .. }),
                Command::SemAcquire { session, name, .. } | Command::SemAcquireWithDelay { session, name, .. },
            ) => Some(Response::SemAcquire(self.sem_wait_outcome(*session, name))),
            (Answer::Acquire(AcquireOutcome::Queued { .. }), Command::Campaign { session, name, .. }) => {
                Some(Response::Campaign(self.campaign_wait_outcome(*session, name)))
            }
            (answer, command) => Some(answer.to_response(command)),
        }
    }

    fn remember(&mut self, request: RequestId, fingerprint: u64, command: &Command, response: &Response) {
        let Some(answer) = Answer::from_response(response) else {
            return;
        };
        let owner = match answer {
            Answer::SessionCreated { session, .. } => session,
            _ => command.session().expect("every command with a remembered answer names its session"),
        };
        let session = self.sessions.get_mut(&owner).expect("a command that took effect leaves its session alive");
        // A command that names the session proves its client got the session id, so
        // the answer to `CreateSession` is not needed any more: forgetting it keeps
        // an idle session that holds a lock down to one remembered answer.
        if let Some(Remembered { answer: Answer::SessionCreated { .. }, request: created, .. }) =
            session.remembered.first().copied()
        {
            session.remembered.remove(0);
            let forgotten_owner = self.creations.remove(&created);
            assert_eq!(forgotten_owner, Some(owner));
        }
        if session.remembered.len() == REQUESTS_REMEMBERED_PER_SESSION_MAX {
            let evicted = session.remembered.remove(0);
            if let Answer::SessionCreated { .. } = evicted.answer {
                self.creations.remove(&evicted.request);
            }
        }
        assert!(
            session.remembered.iter().all(|remembered| remembered.request != request),
            "a new request id is not remembered by its session yet"
        );
        push_compact(&mut session.remembered, Remembered { request, fingerprint, answer });
        if let Answer::SessionCreated { .. } = answer {
            let previous = self.creations.insert(request, owner);
            assert!(previous.is_none(), "a new CreateSession request id is not remembered yet");
        }
    }

    /// Carries out a command that is not a retry.
    fn execute(
        &mut self,
        index: u64,
        stamp_ms: u64,
        caller: &Caller,
        command: &Command,
        events: &mut Vec<Event>,
    ) -> Response {
        // A token that is not older than this entry can only match a grant made in
        // it, by a command before this one in the batch: refuse it, so that the grant
        // does not end in the entry that made it. Other wrong tokens get the usual
        // answer from the command's own check, which says what the session holds.
        if let (Some((kind, name, token)), Some(session)) = (command.presented_token(), command.session()) {
            let tenant = self.sessions.get(&session).map(|session| session.tenant);
            if token >= index
                && tenant.is_some_and(|tenant| self.check_fence_of(kind, tenant, name, token) == FenceStatus::Current)
            {
                return Response::Rejected(token_not_yet_applied(kind, session, name, token, index));
            }
        }
        if let Err(error) = command.validate_fields() {
            return Response::Rejected(error);
        }
        let result = match command {
            Command::CreateSession { request: _, ttl_ms, client_name } => {
                self.create_session(index, caller, *ttl_ms, client_name)
            }
            Command::CloseSession { request: _, session } => self.close_session(index, stamp_ms, *session, events),
            Command::ExpireSessions { sessions } => self.expire_sessions(index, stamp_ms, sessions, events),
            Command::Acquire { request: _, session, name, wait } => {
                self.acquire(index, stamp_ms, *session, name, *wait, 0, events).map(Response::Acquire)
            }
            Command::AcquireWithDelay { request: _, session, name, wait, delay_ms } => {
                self.acquire(index, stamp_ms, *session, name, *wait, *delay_ms, events).map(Response::Acquire)
            }
            Command::CancelWait { request: _, session, name } => {
                self.cancel_wait(*session, name, events).map(Response::WaitCancelled)
            }
            Command::Release { request: _, session, name, token } => {
                self.release(index, stamp_ms, *session, name, *token, events)
            }
            Command::SemAcquire { request: _, session, name, limit, wait } => {
                self.sem_acquire(index, stamp_ms, *session, name, *limit, *wait, 0, events).map(Response::SemAcquire)
            }
            Command::SemAcquireWithDelay { request: _, session, name, limit, wait, delay_ms } => self
                .sem_acquire(index, stamp_ms, *session, name, *limit, *wait, *delay_ms, events)
                .map(Response::SemAcquire),
            Command::SemRelease { request: _, session, name, token } => {
                self.sem_release(index, stamp_ms, *session, name, *token, events)
            }
            Command::SemSetLimit { request: _, session, name, limit, tenant } => {
                self.sem_set_limit(index, stamp_ms, *session, name, *limit, *tenant, events)
            }
            Command::SemCancelWait { request: _, session, name } => {
                self.sem_cancel_wait(*session, name, events).map(Response::WaitCancelled)
            }
            Command::Campaign { request: _, session, name, value, wait } => {
                self.campaign(index, stamp_ms, *session, name, value, *wait, events).map(Response::Campaign)
            }
            Command::CampaignCancelWait { request: _, session, name } => {
                self.campaign_cancel_wait(*session, name, events).map(Response::WaitCancelled)
            }
            Command::Proclaim { request: _, session, name, token, value } => {
                self.proclaim(*session, name, *token, value, events)
            }
            Command::Resign { request: _, session, name, token } => {
                self.resign(index, stamp_ms, *session, name, *token, events)
            }
            Command::AddTenant { request, name, token_hash, quotas } => {
                self.add_tenant(*request, name, *token_hash, *quotas)
            }
            Command::RotateTenantToken { request: _, name, token_hash } => self.rotate_tenant_token(name, *token_hash),
            Command::SetTenantQuotas { request: _, name, quotas } => self.set_tenant_quotas(name, *quotas),
            Command::SetTenantShares { request: _, name, weight, ops_per_s } => {
                self.set_tenant_shares(name, *weight, *ops_per_s)
            }
            Command::RemoveTenant { request: _, name } => self.remove_tenant(index, stamp_ms, name, events),
            Command::EndSession { request: _, tenant, session } => {
                self.end_session(index, stamp_ms, tenant, *session, events)
            }
            Command::RecordMember { cluster_id, node, incarnation } => {
                self.record_member(index, *cluster_id, *node, *incarnation)
            }
            Command::CheckpointSessions { quiet, resumed } => self.checkpoint_sessions(index, quiet, resumed),
            Command::EndLockDelays { ended } => self.end_lock_delays(index, stamp_ms, ended, events),
        };
        result.unwrap_or_else(Response::Rejected)
    }

    fn session(&self, session: SessionId) -> &Session {
        self.sessions.get(&session).unwrap_or_else(|| panic!("session {session} is referenced but does not exist"))
    }

    fn session_mut(&mut self, session: SessionId) -> &mut Session {
        self.sessions.get_mut(&session).unwrap_or_else(|| panic!("session {session} is referenced but does not exist"))
    }

    /// `tenant`'s locks, semaphores and elections (none when it has none in use).
    fn namespace(&self, tenant: TenantId) -> &Namespace {
        self.namespaces.get(&tenant).unwrap_or(&EMPTY_NAMESPACE)
    }

    fn namespace_mut(&mut self, tenant: TenantId) -> &mut Namespace {
        self.namespaces.entry(tenant).or_default()
    }

    /// Drops `tenant`'s namespace once nothing in it is in use, so that replicas that
    /// went through different histories to the same state compare equal.
    fn drop_namespace_if_unused(&mut self, tenant: TenantId) {
        if self.namespaces.get(&tenant).is_some_and(Namespace::is_empty) {
            self.namespaces.remove(&tenant);
        }
    }
}

/// Whether `commands` may share one log entry: one command of any kind, or several
/// that each touch one resource (the same one or not).
pub fn batch_is_valid<'a>(commands: impl IntoIterator<Item = &'a Command>) -> bool {
    let mut count = 0;
    let mut all_batchable = true;
    for command in commands {
        count += 1;
        all_batchable &= command.batch_key().is_some();
    }
    count <= 1 || all_batchable
}

fn position_u32(position: usize) -> u32 {
    u32::try_from(position).expect("WAITERS_PER_LOCK_MAX fits a u32")
}

/// Removes `name` from a session's list, keeping the order of the rest.
fn remove_name(names: &mut ThinVec<String>, name: &str) {
    let position = names
        .iter()
        .position(|listed| listed == name)
        .unwrap_or_else(|| panic!("lock {name:?} is missing from the session's list"));
    names.remove(position);
}
