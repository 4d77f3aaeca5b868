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
//! - `command.rs`: `Command`, `RequestId` and the fingerprint that tells a retry from a
//!   reuse of its request id.
//! - `response.rs`: `Response` and the outcomes of acquire and cancel.
//! - `event.rs`: `Event`, the effects of an entry.
//! - `error.rs`: `CommandError`, one constructor per broken rule.
//! - `session.rs`: `Session`, its remembered answers, and the session commands:
//!   create, close, expire, and ending sessions in one entry.
//! - `lock.rs`: `Lock`, one entry of the lock table, and the lock commands.
//! - `semaphore.rs`: `Semaphore`, one entry of the semaphore table, and the semaphore
//!   commands.
//! - `election.rs`: `Election`, one entry of the election table, and the election
//!   commands.
//! - `view.rs`: the read-only answers of the queries.
//! - `invariants.rs`: `check_invariants`, the named checks every replica's state passes.
//! - `limits.rs`: every bound on the replicated state.
//! - `tests.rs`: table tests of every rule; `model_tests.rs`: random command sequences
//!   against a naive model.
//! - `scenarios.rs`: runs the scenario scripts in `testdata/*.txt` (commands, then the
//!   responses and events they must print).

mod command;
mod election;
mod error;
mod event;
mod invariants;
pub mod limits;
mod lock;
mod response;
mod semaphore;
mod session;
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

pub use command::{Command, RequestId};
pub use error::{CommandError, ErrorKind};
pub use event::{Event, WaitFailure};
pub use response::{AcquireOutcome, CancelOutcome, Response};
pub use session::Session;
pub use view::{
    ElectionView, FenceStatus, HeldLock, HolderView, LeaderView, LockView, SemaphoreView, SessionView, WaiterView,
};

use election::Election;
use error::{request_id_reused, token_not_yet_applied};
use lock::Lock;
use semaphore::Semaphore;
use session::{push_compact, Answer, ClientName, Remembered, Role};

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
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(from = "DecodedMachine")]
pub struct StateMachine {
    /// `None` before the first entry. Openraft's first entry, the initial membership,
    /// sits at index 0, so 0 cannot mean "nothing applied".
    last_applied: Option<u64>,
    /// Boxed: a map slot then holds a pointer instead of the whole `Session`, and
    /// since ids only grow, new sessions land at the map's right edge, where its nodes
    /// stay about half full. That halves what each session costs in map nodes.
    sessions: BTreeMap<SessionId, Box<Session>>,
    /// Only held locks have an entry; see `Lock`.
    /// Keyed by `Box<str>` rather than `String`: 8 bytes less in every slot.
    locks: BTreeMap<Box<str>, Lock>,
    /// Only semaphores with holders or waiters have an entry; see `Semaphore`.
    semaphores: BTreeMap<String, Semaphore>,
    /// Only elections with a leader have an entry; see `Election`.
    elections: BTreeMap<String, Election>,
    /// Which session each remembered `CreateSession` request created, so that a retry
    /// of it, whose client does not know its session yet, finds the answer. Every
    /// other request names its session and is looked up among that session's own
    /// remembered answers: request ids are scoped to their session.
    creations: BTreeMap<RequestId, SessionId>,
    /// Every live session's client name, once, with the number of sessions that share
    /// it. A process that opens many sessions (a worker pool) names them all alike, and
    /// its name is often longer than the rest of an idle session. Not in snapshots (each
    /// session carries its name there); rebuilt when one is decoded.
    #[serde(skip)]
    client_names: BTreeMap<ClientName, u32>,
}

/// `StateMachine` as snapshots encode it: decoded into this, then its client names
/// are shared again.
#[derive(Deserialize)]
struct DecodedMachine {
    last_applied: Option<u64>,
    sessions: BTreeMap<SessionId, Box<Session>>,
    locks: BTreeMap<Box<str>, Lock>,
    semaphores: BTreeMap<String, Semaphore>,
    elections: BTreeMap<String, Election>,
    /// `creations`, which snapshots of earlier versions filled with every remembered
    /// request: decoded to keep the encoding, then rebuilt from the sessions'
    /// remembered answers instead.
    #[allow(dead_code)]
    creations: BTreeMap<RequestId, SessionId>,
}

impl From<DecodedMachine> for StateMachine {
    fn from(decoded: DecodedMachine) -> StateMachine {
        let DecodedMachine { last_applied, sessions, locks, semaphores, elections, creations: _ } = decoded;
        let mut machine = StateMachine {
            last_applied,
            sessions,
            locks,
            semaphores,
            elections,
            creations: BTreeMap::new(),
            client_names: BTreeMap::new(),
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

    /// Applies the command of the entry at `index`. `stamp_ms` is the leader's wall-clock
    /// stamp of the entry: informational only, used for "since" fields, never for
    /// decisions.
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
        self.advance(index);
        self.apply_at(index, stamp_ms, command)
    }

    /// Applies the commands of one entry in order, each seeing the effects of those
    /// before it, and each granting with `index` as its token. The proposer puts
    /// several commands in one entry only when each has a `batch_key` (see
    /// `Command::batch_key`); anything else is refused here. Several commands may touch
    /// the same name: a release, resign or proclaim presenting a token granted in this
    /// entry is refused, so a grant made in this entry cannot end in it, and no two
    /// grants of one lock or election share the entry's index.
    ///
    /// Nodes built before commands on one name could share an entry refuse such a
    /// batch (they panic on it): every node of a cluster must run this version or a
    /// later one before a leader of this version proposes. Nodes built before request
    /// ids were scoped to their session also answer a request that reuses another
    /// session's request id differently (refused there, applied here).
    ///
    /// # Panics
    ///
    /// If `index` is not after the last applied index, or the batch breaks the rule.
    pub fn apply_batch(&mut self, index: u64, stamp_ms: u64, commands: &[Command]) -> Vec<(Response, Vec<Event>)> {
        assert!(batch_is_valid(commands), "a command that needs an entry of its own shares one: {commands:?}");
        self.advance(index);
        commands.iter().map(|command| self.apply_at(index, stamp_ms, command)).collect()
    }

    /// Applies one more command in the entry at `index`, which was applied last, as if
    /// it had come after the others in `apply_batch`: for tests that build batches one
    /// command at a time.
    #[cfg(test)]
    pub(crate) fn apply_joining(&mut self, index: u64, stamp_ms: u64, command: &Command) -> (Response, Vec<Event>) {
        assert_eq!(self.last_applied, Some(index), "joins the last applied entry");
        assert!(command.batch_key().is_some(), "{command:?} needs an entry of its own");
        self.apply_at(index, stamp_ms, command)
    }

    fn apply_at(&mut self, index: u64, stamp_ms: u64, command: &Command) -> (Response, Vec<Event>) {
        let mut events = Vec::new();
        let response = match command.request() {
            None => self.execute(index, stamp_ms, command, &mut events),
            Some(request) => {
                let fingerprint = command.fingerprint();
                match self.recall(request, fingerprint, command) {
                    Some(response) => response,
                    None => {
                        let response = self.execute(index, stamp_ms, command, &mut events);
                        self.remember(request, fingerprint, command, &response);
                        response
                    }
                }
            }
        };
        if matches!(response, Response::Rejected(_)) {
            assert!(events.is_empty(), "a rejected command has no effects");
        }
        (response, events)
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

    pub fn describe_lock(&self, name: &str) -> Option<LockView> {
        let lock = self.locks.get(name)?;
        Some(LockView {
            name: name.to_owned(),
            holder: HolderView {
                session: lock.holder.session,
                client_name: self.session(lock.holder.session).client_name.to_string(),
                token: lock.holder.token,
                since_ms: lock.holder.since_ms,
            },
            waiters: self.waiter_views(lock.waiters.iter().copied()),
        })
    }

    pub fn describe_session(&self, session: SessionId) -> Option<SessionView> {
        let session = self.sessions.get(&session)?;
        Some(SessionView {
            id: session.id,
            ttl_ms: session.ttl_ms,
            client_name: session.client_name.to_string(),
            created_index: session.created_index(),
            held: session
                .held
                .iter()
                .map(|name| {
                    let holder = &self.lock(name).holder;
                    HeldLock { name: name.clone(), token: holder.token, since_ms: holder.since_ms }
                })
                .collect(),
            waiting: session.waiting.to_vec(),
            permits: session
                .claimed(ResourceKind::Semaphore, Role::Holds)
                .map(|name| {
                    let holder =
                        self.semaphores[name].holder(session.id).expect("a session lists only permits it holds");
                    HeldLock { name: name.to_owned(), token: holder.token, since_ms: holder.since_ms }
                })
                .collect(),
            waiting_semaphores: session.claimed(ResourceKind::Semaphore, Role::Waits).map(str::to_owned).collect(),
            leading: session
                .claimed(ResourceKind::Election, Role::Holds)
                .map(|name| {
                    let leader = &self.elections[name].leader;
                    HeldLock { name: name.to_owned(), token: leader.token, since_ms: leader.since_ms }
                })
                .collect(),
            campaigning: session.claimed(ResourceKind::Election, Role::Waits).map(str::to_owned).collect(),
        })
    }

    /// `None` when the semaphore has neither holders nor waiters: it has no entry then,
    /// and the next acquirer sets its limit.
    pub fn describe_semaphore(&self, name: &str) -> Option<SemaphoreView> {
        let semaphore = self.semaphores.get(name)?;
        Some(SemaphoreView {
            name: name.to_owned(),
            limit: semaphore.limit,
            holders: semaphore
                .holders
                .iter()
                .map(|holder| HolderView {
                    session: holder.session,
                    client_name: self.session(holder.session).client_name.to_string(),
                    token: holder.token,
                    since_ms: holder.since_ms,
                })
                .collect(),
            waiters: self.waiter_views(semaphore.waiters.iter().copied()),
        })
    }

    /// `None` when the election is vacant.
    pub fn describe_election(&self, name: &str) -> Option<ElectionView> {
        let election = self.elections.get(name)?;
        Some(ElectionView {
            name: name.to_owned(),
            leader: self.leader_view(name).expect("a stored election has a leader"),
            waiters: self.waiter_views(election.waiters.iter().map(|waiter| waiter.session)),
        })
    }

    /// Every semaphore in use, ordered by name: its limit and how many hold and wait, for
    /// the fairness gauges.
    pub fn semaphore_stats(&self) -> impl Iterator<Item = (&str, u32, usize, usize)> + '_ {
        self.semaphores
            .iter()
            .map(|(name, semaphore)| (name.as_str(), semaphore.limit, semaphore.holders.len(), semaphore.waiters.len()))
    }

    /// Semaphores with holders or waiters; unused ones are not stored.
    pub fn semaphore_count(&self) -> usize {
        self.semaphores.len()
    }

    /// Elections with a leader; vacant ones are not stored.
    pub fn election_count(&self) -> usize {
        self.elections.len()
    }

    /// Every live session, ordered by id. The leader walks this to arm every session's
    /// deadline afresh when it takes office.
    pub fn sessions(&self) -> impl Iterator<Item = &Session> + '_ {
        self.sessions.values().map(|session| &**session)
    }

    pub fn session_ttl_ms(&self, session: SessionId) -> Option<u64> {
        self.sessions.get(&session).map(|session| session.ttl_ms)
    }

    pub fn session_count(&self) -> usize {
        self.sessions.len()
    }

    /// Held locks; free locks are not stored.
    pub fn lock_count(&self) -> usize {
        self.locks.len()
    }

    /// Whether a write fenced with `token` may still proceed on the resource `name`.
    pub fn check_fence(&self, name: &str, token: Token) -> FenceStatus {
        self.check_fence_of(ResourceKind::Lock, name, token)
    }

    /// `check_fence` for any kind of resource. For an election, `token` must be the
    /// current leadership. For a semaphore, some permit granted with `token` must still
    /// be held; since permits granted in one entry share its index, the token names that
    /// grant, not one slot.
    pub fn check_fence_of(&self, kind: ResourceKind, name: &str, token: Token) -> FenceStatus {
        let current = match kind {
            ResourceKind::Lock => self.locks.get(name).is_some_and(|lock| lock.holder.token == token),
            ResourceKind::Semaphore => self
                .semaphores
                .get(name)
                .is_some_and(|semaphore| semaphore.holders.iter().any(|holder| holder.token == token)),
            ResourceKind::Election => self.elections.get(name).is_some_and(|election| election.leader.token == token),
        };
        if current {
            FenceStatus::Current
        } else {
            FenceStatus::Superseded
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
            (Answer::Acquire(AcquireOutcome::Queued { .. }), Command::Acquire { session, name, .. }) => {
                Some(Response::Acquire(self.wait_outcome(*session, name)))
            }
            (Answer::Acquire(AcquireOutcome::Queued { .. }), Command::SemAcquire { session, name, .. }) => {
                Some(Response::SemAcquire(self.sem_wait_outcome(*session, name)))
            }
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
    fn execute(&mut self, index: u64, stamp_ms: u64, command: &Command, events: &mut Vec<Event>) -> Response {
        // A token that is not older than this entry can only match a grant made in
        // it, by a command before this one in the batch: refuse it, so that the grant
        // does not end in the entry that made it. Other wrong tokens get the usual
        // answer from the command's own check, which says what the session holds.
        if let (Some((kind, name, token)), Some(session)) = (command.presented_token(), command.session()) {
            if token >= index && self.check_fence_of(kind, name, token) == FenceStatus::Current {
                return Response::Rejected(token_not_yet_applied(kind, session, name, token, index));
            }
        }
        let result = match command {
            Command::CreateSession { request: _, ttl_ms, client_name } => {
                self.create_session(index, *ttl_ms, client_name)
            }
            Command::CloseSession { request: _, session } => self.close_session(index, stamp_ms, *session, events),
            Command::ExpireSessions { sessions } => self.expire_sessions(index, stamp_ms, sessions, events),
            Command::Acquire { request: _, session, name, wait } => {
                self.acquire(index, stamp_ms, *session, name, *wait, events).map(Response::Acquire)
            }
            Command::CancelWait { request: _, session, name } => {
                self.cancel_wait(*session, name, events).map(Response::WaitCancelled)
            }
            Command::Release { request: _, session, name, token } => {
                self.release(index, stamp_ms, *session, name, *token, events)
            }
            Command::SemAcquire { request: _, session, name, limit, wait } => {
                self.sem_acquire(index, stamp_ms, *session, name, *limit, *wait, events).map(Response::SemAcquire)
            }
            Command::SemRelease { request: _, session, name, token } => {
                self.sem_release(index, stamp_ms, *session, name, *token, events)
            }
            Command::SemSetLimit { request: _, session, name, limit } => {
                self.sem_set_limit(index, stamp_ms, *session, name, *limit, events)
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
        };
        result.unwrap_or_else(Response::Rejected)
    }

    fn session(&self, session: SessionId) -> &Session {
        self.sessions.get(&session).unwrap_or_else(|| panic!("session {session} is referenced but does not exist"))
    }

    fn session_mut(&mut self, session: SessionId) -> &mut Session {
        self.sessions.get_mut(&session).unwrap_or_else(|| panic!("session {session} is referenced but does not exist"))
    }

    fn lock(&self, name: &str) -> &Lock {
        self.locks.get(name).unwrap_or_else(|| panic!("lock {name:?} is referenced but not held"))
    }

    fn lock_mut(&mut self, name: &str) -> &mut Lock {
        self.locks.get_mut(name).unwrap_or_else(|| panic!("lock {name:?} is referenced but not held"))
    }
}

/// Whether `commands` may share one log entry: one command of any kind, or several
/// that each touch one resource (the same one or not).
pub fn batch_is_valid(commands: &[Command]) -> bool {
    if commands.len() <= 1 {
        return true;
    }
    commands.iter().all(|command| command.batch_key().is_some())
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
