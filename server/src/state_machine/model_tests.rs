//! Random command sequences applied to the state machine and to a naive model, with every
//! invariant checked after every entry, then replayed and restored from a snapshot.

use std::collections::BTreeMap;

use proptest::prelude::*;
use proptest::sample::Index;

use super::*;
use crate::limits::{
    CLIENT_NAME_BYTES_MAX, EXPIRE_SESSIONS_PER_COMMAND_MAX, LOCKS_PER_SESSION_MAX,
    LOCK_NAME_BYTES_MAX, REQUESTS_REMEMBERED_PER_SESSION_MAX, SESSIONS_MAX, SESSION_TTL_MS_MAX,
    SESSION_TTL_MS_MIN, WAITERS_PER_LOCK_MAX,
};

/// The rules written as plainly as possible: lists searched from the front, whole
/// commands compared instead of fingerprints, no indexes kept in step with each other.
#[derive(Clone, Debug, Default)]
struct Model {
    /// In creation order, which is id order.
    sessions: Vec<ModelSession>,
    /// Held locks only, in no particular order.
    locks: Vec<ModelLock>,
}

#[derive(Clone, Debug)]
struct ModelSession {
    id: SessionId,
    ttl_ms: u64,
    client_name: String,
    /// The last commands that took effect for this session, with their answers.
    answers: Vec<(Command, Response)>,
}

#[derive(Clone, Debug)]
struct ModelLock {
    name: String,
    holder: SessionId,
    token: Token,
    since_ms: u64,
    waiters: Vec<SessionId>,
}

fn rejected(kind: ErrorKind) -> Response {
    Response::Rejected(CommandError {
        kind,
        message: String::new(),
    })
}

fn name_is_valid(name: &str) -> bool {
    !name.is_empty() && name.len() <= LOCK_NAME_BYTES_MAX
}

impl Model {
    fn apply(&mut self, index: u64, stamp_ms: u64, command: &Command) -> (Response, Vec<Event>) {
        let request = match command {
            Command::CreateSession { request, .. }
            | Command::CloseSession { request, .. }
            | Command::Acquire { request, .. }
            | Command::CancelWait { request, .. }
            | Command::Release { request, .. } => Some(*request),
            Command::ExpireSessions { .. } => None,
        };
        if let Some(request) = request {
            let earlier = self
                .sessions
                .iter()
                .flat_map(|session| session.answers.iter())
                .find(|(earlier, _)| earlier.request() == Some(request))
                .cloned();
            if let Some((earlier, answer)) = earlier {
                if earlier != *command {
                    return (rejected(ErrorKind::RequestIdReused), vec![]);
                }
                if let (
                    Response::Acquire(AcquireOutcome::Queued { .. }),
                    Command::Acquire { session, name, .. },
                ) = (&answer, command)
                {
                    let outcome = match self.lock(name) {
                        Some(lock) if lock.holder == *session => {
                            AcquireOutcome::Granted { token: lock.token }
                        }
                        Some(lock) => match lock.waiters.iter().position(|w| w == session) {
                            Some(position) => AcquireOutcome::Queued {
                                position: position as u32,
                            },
                            None => AcquireOutcome::TimedOut,
                        },
                        None => AcquireOutcome::TimedOut,
                    };
                    return (Response::Acquire(outcome), vec![]);
                }
                return (answer, vec![]);
            }
        }

        let mut events = Vec::new();
        let response = self.execute(index, stamp_ms, command, &mut events);
        let owner = match (&response, command) {
            (Response::SessionCreated { session, .. }, _) => Some(*session),
            (
                Response::Acquire(_) | Response::WaitCancelled(_) | Response::Released { .. },
                Command::Acquire { session, .. }
                | Command::CancelWait { session, .. }
                | Command::Release { session, .. },
            ) => Some(*session),
            _ => None,
        };
        if let Some(owner) = owner {
            let session = self
                .sessions
                .iter_mut()
                .find(|session| session.id == owner)
                .unwrap();
            session.answers.push((command.clone(), response.clone()));
            if session.answers.len() > REQUESTS_REMEMBERED_PER_SESSION_MAX {
                session.answers.remove(0);
            }
        }
        (response, events)
    }

    fn execute(
        &mut self,
        index: u64,
        stamp_ms: u64,
        command: &Command,
        events: &mut Vec<Event>,
    ) -> Response {
        match command {
            Command::CreateSession {
                ttl_ms,
                client_name,
                ..
            } => {
                if client_name.len() > CLIENT_NAME_BYTES_MAX
                    || *ttl_ms < SESSION_TTL_MS_MIN
                    || *ttl_ms > SESSION_TTL_MS_MAX
                {
                    return rejected(ErrorKind::InvalidArgument);
                }
                if self.sessions.len() >= SESSIONS_MAX {
                    return rejected(ErrorKind::LimitExceeded);
                }
                self.sessions.push(ModelSession {
                    id: index,
                    ttl_ms: *ttl_ms,
                    client_name: client_name.clone(),
                    answers: vec![],
                });
                Response::SessionCreated {
                    session: index,
                    ttl_ms: *ttl_ms,
                }
            }
            Command::CloseSession { session, .. } => {
                if !self.is_live(*session) {
                    return rejected(ErrorKind::UnknownSession);
                }
                self.end(index, stamp_ms, &[*session], false, events);
                Response::SessionClosed
            }
            Command::ExpireSessions { sessions } => {
                if sessions.len() > EXPIRE_SESSIONS_PER_COMMAND_MAX {
                    return rejected(ErrorKind::LimitExceeded);
                }
                let mut expired = Vec::new();
                for session in sessions {
                    if self.is_live(*session) && !expired.contains(session) {
                        expired.push(*session);
                    }
                }
                self.end(index, stamp_ms, &expired, true, events);
                Response::SessionsExpired { expired }
            }
            Command::Acquire {
                session,
                name,
                wait,
                ..
            } => {
                if !name_is_valid(name) {
                    return rejected(ErrorKind::InvalidArgument);
                }
                if !self.is_live(*session) {
                    return rejected(ErrorKind::UnknownSession);
                }
                let count = self.lock_count_of(*session);
                let Some(lock) = self.lock(name) else {
                    if count >= LOCKS_PER_SESSION_MAX {
                        return rejected(ErrorKind::LimitExceeded);
                    }
                    self.locks.push(ModelLock {
                        name: name.clone(),
                        holder: *session,
                        token: index,
                        since_ms: stamp_ms,
                        waiters: vec![],
                    });
                    events.push(Event::Granted {
                        name: name.clone(),
                        session: *session,
                        token: index,
                    });
                    return Response::Acquire(AcquireOutcome::Granted { token: index });
                };
                if lock.holder == *session {
                    return Response::Acquire(AcquireOutcome::Granted { token: lock.token });
                }
                if !wait {
                    return Response::Acquire(AcquireOutcome::Busy {
                        holder: lock.holder,
                        token: lock.token,
                    });
                }
                if let Some(position) = lock.waiters.iter().position(|w| w == session) {
                    return Response::Acquire(AcquireOutcome::Queued {
                        position: position as u32,
                    });
                }
                if count >= LOCKS_PER_SESSION_MAX || lock.waiters.len() >= WAITERS_PER_LOCK_MAX {
                    return rejected(ErrorKind::LimitExceeded);
                }
                let lock = self.lock_mut(name);
                lock.waiters.push(*session);
                Response::Acquire(AcquireOutcome::Queued {
                    position: (lock.waiters.len() - 1) as u32,
                })
            }
            Command::CancelWait { session, name, .. } => {
                if !name_is_valid(name) {
                    return rejected(ErrorKind::InvalidArgument);
                }
                if !self.is_live(*session) {
                    return rejected(ErrorKind::UnknownSession);
                }
                let Some(lock) = self.locks.iter_mut().find(|lock| lock.name == *name) else {
                    return Response::WaitCancelled(CancelOutcome::NotWaiting);
                };
                if lock.holder == *session {
                    return Response::WaitCancelled(CancelOutcome::AlreadyGranted {
                        token: lock.token,
                    });
                }
                let before = lock.waiters.len();
                lock.waiters.retain(|w| w != session);
                if lock.waiters.len() == before {
                    return Response::WaitCancelled(CancelOutcome::NotWaiting);
                }
                events.push(Event::WaitFailed {
                    name: name.clone(),
                    session: *session,
                    reason: WaitFailure::Cancelled,
                });
                Response::WaitCancelled(CancelOutcome::Cancelled)
            }
            Command::Release {
                session,
                name,
                token,
                ..
            } => {
                if !name_is_valid(name) {
                    return rejected(ErrorKind::InvalidArgument);
                }
                if !self.is_live(*session) {
                    return rejected(ErrorKind::UnknownSession);
                }
                match self.lock(name) {
                    Some(lock) if lock.holder == *session && lock.token == *token => {}
                    _ => return rejected(ErrorKind::NotHolder),
                }
                events.push(Event::Released {
                    name: name.clone(),
                    session: *session,
                    token: *token,
                });
                self.pass_on(index, stamp_ms, name, events);
                Response::Released { token: *token }
            }
        }
    }

    fn end(
        &mut self,
        index: u64,
        stamp_ms: u64,
        ending: &[SessionId],
        expired: bool,
        events: &mut Vec<Event>,
    ) {
        for lock in &mut self.locks {
            for waiter in &lock.waiters {
                if ending.contains(waiter) {
                    events.push(Event::WaitFailed {
                        name: lock.name.clone(),
                        session: *waiter,
                        reason: WaitFailure::SessionEnded,
                    });
                }
            }
            lock.waiters.retain(|waiter| !ending.contains(waiter));
        }
        let freed: Vec<String> = self
            .locks
            .iter()
            .filter(|lock| ending.contains(&lock.holder))
            .map(|lock| lock.name.clone())
            .collect();
        for name in freed {
            let lock = self.lock(&name).unwrap();
            events.push(Event::Released {
                name: name.clone(),
                session: lock.holder,
                token: lock.token,
            });
            self.pass_on(index, stamp_ms, &name, events);
        }
        self.sessions
            .retain(|session| !ending.contains(&session.id));
        for session in ending {
            events.push(Event::SessionEnded {
                session: *session,
                expired,
            });
        }
    }

    /// The holder is gone: the first waiter gets the lock, or the lock becomes free.
    fn pass_on(&mut self, index: u64, stamp_ms: u64, name: &str, events: &mut Vec<Event>) {
        let lock = self.lock_mut(name);
        if lock.waiters.is_empty() {
            self.locks.retain(|lock| lock.name != name);
            return;
        }
        let next = lock.waiters.remove(0);
        lock.holder = next;
        lock.token = index;
        lock.since_ms = stamp_ms;
        events.push(Event::Granted {
            name: name.to_owned(),
            session: next,
            token: index,
        });
    }

    fn is_live(&self, session: SessionId) -> bool {
        self.sessions.iter().any(|live| live.id == session)
    }

    fn lock_count_of(&self, session: SessionId) -> usize {
        self.locks
            .iter()
            .filter(|lock| lock.holder == session || lock.waiters.contains(&session))
            .count()
    }

    fn lock(&self, name: &str) -> Option<&ModelLock> {
        self.locks.iter().find(|lock| lock.name == name)
    }

    fn lock_mut(&mut self, name: &str) -> &mut ModelLock {
        self.locks
            .iter_mut()
            .find(|lock| lock.name == name)
            .unwrap()
    }
}

// The generated operations, turned into commands against the current state.

const NAMES: [&str; 3] = ["alpha", "beta", "gamma"];
const CLIENTS: u64 = 3;
const UNKNOWN_SESSION: SessionId = 1_000_000_007;

#[derive(Clone, Debug)]
enum Op {
    Create {
        client: u64,
        ttl: u8,
        long_client_name: bool,
    },
    Close {
        client: u64,
        session: Index,
    },
    Expire {
        sessions: Vec<Index>,
    },
    Acquire {
        client: u64,
        session: Index,
        name: u8,
        wait: bool,
    },
    Cancel {
        client: u64,
        session: Index,
        name: u8,
        /// Picks `session` among the lock's waiters, if it has any.
        waiter: bool,
    },
    Release {
        client: u64,
        session: Index,
        name: u8,
        token: u8,
    },
    /// Applies an earlier command again, unchanged; mostly one of the last few, as a
    /// client retries its latest requests.
    Retry {
        earlier: Index,
        recent: bool,
    },
    /// A fresh command that carries an earlier command's request id.
    Reuse {
        earlier: Index,
        fresh: Box<Op>,
    },
    /// An entry without a command.
    Empty,
}

fn fresh_op() -> impl Strategy<Value = Op> {
    let client = 0..CLIENTS;
    prop_oneof![
        3 => (client.clone(), any::<u8>(), prop::bool::weighted(0.03)).prop_map(
            |(client, ttl, long_client_name)| Op::Create { client, ttl, long_client_name }
        ),
        1 => (client.clone(), any::<Index>())
            .prop_map(|(client, session)| Op::Close { client, session }),
        1 => prop::collection::vec(any::<Index>(), 0..4)
            .prop_map(|sessions| Op::Expire { sessions }),
        8 => (client.clone(), any::<Index>(), any::<u8>(), prop::bool::weighted(0.8)).prop_map(
            |(client, session, name, wait)| Op::Acquire { client, session, name, wait }
        ),
        2 => (client.clone(), any::<Index>(), any::<u8>(), prop::bool::weighted(0.7)).prop_map(
            |(client, session, name, waiter)| Op::Cancel { client, session, name, waiter }
        ),
        4 => (client, any::<Index>(), any::<u8>(), any::<u8>()).prop_map(
            |(client, session, name, token)| Op::Release { client, session, name, token }
        ),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        14 => fresh_op(),
        4 => (any::<Index>(), prop::bool::weighted(0.7))
            .prop_map(|(earlier, recent)| Op::Retry { earlier, recent }),
        1 => (any::<Index>(), fresh_op())
            .prop_map(|(earlier, fresh)| Op::Reuse { earlier, fresh: Box::new(fresh) }),
        1 => Just(Op::Empty),
    ]
}

/// One log entry as the store would see it, with the answer it got the first time.
#[derive(Clone, Debug)]
struct Entry {
    index: u64,
    stamp_ms: u64,
    command: Option<Command>,
    response: Option<Response>,
}

struct Run {
    machine: StateMachine,
    model: Model,
    index: u64,
    sequences: [u64; CLIENTS as usize],
    /// Every session ever created, dead ones included, so that commands name them too.
    created: Vec<SessionId>,
    log: Vec<Entry>,
    /// Every grant of each name, in order, to check that tokens strictly increase.
    grants: BTreeMap<String, Vec<Token>>,
}

impl Run {
    fn new() -> Self {
        let mut run = Run {
            machine: StateMachine::new(),
            model: Model::default(),
            index: 0,
            sequences: [0; CLIENTS as usize],
            created: vec![],
            log: vec![],
            grants: BTreeMap::new(),
        };
        run.machine.apply_empty(0);
        run.log.push(Entry {
            index: 0,
            stamp_ms: 0,
            command: None,
            response: None,
        });
        run
    }

    fn request(&mut self, client: u64) -> RequestId {
        let sequence = &mut self.sequences[client as usize];
        *sequence += 1;
        RequestId {
            client_id: client,
            sequence: *sequence,
        }
    }

    /// Mostly a live session; sometimes one that ended or never existed.
    fn session(&self, pick: &Index) -> SessionId {
        const LIVE_WEIGHT: usize = 8;
        let live: Vec<SessionId> = self
            .model
            .sessions
            .iter()
            .map(|session| session.id)
            .collect();
        let slot = pick.index(live.len() * LIVE_WEIGHT + self.created.len() + 1);
        if slot < live.len() * LIVE_WEIGHT {
            return live[slot % live.len()];
        }
        self.created
            .get(slot - live.len() * LIVE_WEIGHT)
            .copied()
            .unwrap_or(UNKNOWN_SESSION)
    }

    fn name(pick: u8) -> String {
        match pick % 32 {
            30 => String::new(),
            31 => "x".repeat(LOCK_NAME_BYTES_MAX + 1),
            other => NAMES[usize::from(other) % NAMES.len()].to_owned(),
        }
    }

    fn command(&mut self, op: &Op) -> Option<Command> {
        let earlier_commands: Vec<&Command> = self
            .log
            .iter()
            .filter_map(|entry| entry.command.as_ref())
            .filter(|command| command.request().is_some())
            .collect();
        Some(match op {
            Op::Empty => return None,
            Op::Retry { earlier, recent } => {
                if earlier_commands.is_empty() {
                    return None;
                }
                let window = if *recent {
                    earlier_commands.len().min(6)
                } else {
                    earlier_commands.len()
                };
                let offset = earlier_commands.len() - window;
                earlier_commands[offset + earlier.index(window)].clone()
            }
            Op::Reuse { earlier, fresh } => {
                if earlier_commands.is_empty() {
                    return None;
                }
                let request = earlier_commands[earlier.index(earlier_commands.len())]
                    .request()
                    .unwrap();
                let mut command = self.command(fresh)?;
                match &mut command {
                    Command::CreateSession { request: slot, .. }
                    | Command::CloseSession { request: slot, .. }
                    | Command::Acquire { request: slot, .. }
                    | Command::CancelWait { request: slot, .. }
                    | Command::Release { request: slot, .. } => *slot = request,
                    Command::ExpireSessions { .. } => {}
                }
                command
            }
            Op::Create {
                client,
                ttl,
                long_client_name,
            } => Command::CreateSession {
                request: self.request(*client),
                ttl_ms: match ttl % 32 {
                    0 => SESSION_TTL_MS_MIN - 1,
                    1 => SESSION_TTL_MS_MAX + 1,
                    2 => SESSION_TTL_MS_MIN,
                    3 => SESSION_TTL_MS_MAX,
                    _ => 5_000,
                },
                client_name: if *long_client_name {
                    "c".repeat(CLIENT_NAME_BYTES_MAX + 1)
                } else {
                    format!("client-{client}")
                },
            },
            Op::Close { client, session } => Command::CloseSession {
                request: self.request(*client),
                session: self.session(session),
            },
            Op::Expire { sessions } => Command::ExpireSessions {
                sessions: sessions.iter().map(|pick| self.session(pick)).collect(),
            },
            Op::Acquire {
                client,
                session,
                name,
                wait,
            } => Command::Acquire {
                request: self.request(*client),
                session: self.session(session),
                name: Self::name(*name),
                wait: *wait,
            },
            Op::Cancel {
                client,
                session,
                name,
                waiter,
            } => {
                let name = Self::name(*name);
                let waiters = self
                    .model
                    .lock(&name)
                    .map(|lock| lock.waiters.clone())
                    .unwrap_or_default();
                let session = if *waiter && !waiters.is_empty() {
                    waiters[session.index(waiters.len())]
                } else {
                    self.session(session)
                };
                Command::CancelWait {
                    request: self.request(*client),
                    session,
                    name,
                }
            }
            Op::Release {
                client,
                session,
                name,
                token,
            } => {
                let name = Self::name(*name);
                let current = self.model.lock(&name).map(|lock| (lock.holder, lock.token));
                let history = self.grants.get(&name).cloned().unwrap_or_default();
                let (session, token) = match (token % 8, current) {
                    // Mostly the holder with its token, as a correct client does.
                    (0..=5, Some(current)) => current,
                    (6, _) if !history.is_empty() => (
                        self.session(session),
                        history[usize::from(*token) % history.len()],
                    ),
                    _ => (self.session(session), u64::from(*token)),
                };
                Command::Release {
                    request: self.request(*client),
                    session,
                    name,
                    token,
                }
            }
        })
    }

    fn step(&mut self, op: &Op, gap: u64) {
        let index = self.index + 1 + gap;
        self.index = index;
        // Without a live session nearly every command would be rejected.
        let op = match op {
            Op::Acquire { client, .. } | Op::Cancel { client, .. } | Op::Release { client, .. }
                if self.model.sessions.is_empty() =>
            {
                &Op::Create {
                    client: *client,
                    ttl: 10,
                    long_client_name: false,
                }
            }
            other => other,
        };
        match self.command(op) {
            Some(command) => self.apply(index, command),
            None => {
                self.machine.apply_empty(index);
                self.log.push(Entry {
                    index,
                    stamp_ms: stamp_ms(index),
                    command: None,
                    response: None,
                });
            }
        }
    }

    /// Applies to both and compares everything.
    fn apply(&mut self, index: u64, command: Command) {
        let stamp_ms = stamp_ms(index);
        let before = self.model.clone();

        let (response, events) = self.machine.apply(index, stamp_ms, &command);
        self.machine.check_invariants();
        assert_eq!(self.machine.last_applied_index(), index);
        let (model_response, model_events) = self.model.apply(index, stamp_ms, &command);
        assert_eq!(
            without_message(&response),
            model_response,
            "{command:?} at {index}"
        );
        assert_eq!(
            sorted(&events),
            sorted(&model_events),
            "{command:?} at {index}"
        );

        self.check_grants(index, &command, &before, &events);
        self.check_views();
        if let Response::SessionCreated { session, .. } = response {
            if !self.created.contains(&session) {
                self.created.push(session);
            }
        }
        self.log.push(Entry {
            index,
            stamp_ms,
            command: Some(command),
            response: Some(response),
        });
    }

    /// Grants go to the first waiter that survives the entry, at most once per lock, with
    /// this entry's index as a token higher than every earlier token of the name.
    fn check_grants(&mut self, index: u64, command: &Command, before: &Model, events: &[Event]) {
        for event in events {
            let Event::Granted {
                name,
                session,
                token,
            } = event
            else {
                continue;
            };
            assert_eq!(*token, index);
            let history = self.grants.entry(name.clone()).or_default();
            if let Some(last) = history.last() {
                assert!(token > last, "token {token} of {name:?} after {last}");
            }
            history.push(*token);
            match before.lock(name) {
                None => assert!(
                    matches!(command, Command::Acquire { session: acquirer, name: acquired, .. }
                        if acquirer == session && acquired == name),
                    "a free lock is granted only to its acquirer"
                ),
                Some(lock) => {
                    let first_survivor = lock
                        .waiters
                        .iter()
                        .find(|waiter| self.machine.session_ttl_ms(**waiter).is_some());
                    assert_eq!(first_survivor, Some(session), "FIFO hand-over of {name:?}");
                }
            }
        }
    }

    /// The queries describe the same locks and sessions as the model.
    fn check_views(&self) {
        assert_eq!(self.machine.lock_count(), self.model.locks.len());
        let ids: Vec<SessionId> = self.machine.sessions().map(Session::id).collect();
        let model_ids: Vec<SessionId> = self.model.sessions.iter().map(|s| s.id).collect();
        assert_eq!(ids, model_ids);
        for name in NAMES {
            let view = self.machine.describe_lock(name).map(|view| {
                let waiters: Vec<SessionId> = view.waiters.iter().map(|w| w.session).collect();
                (
                    view.holder.session,
                    view.holder.token,
                    view.holder.since_ms,
                    waiters,
                )
            });
            let model = self
                .model
                .lock(name)
                .map(|lock| (lock.holder, lock.token, lock.since_ms, lock.waiters.clone()));
            assert_eq!(view, model, "lock {name:?}");
        }
        for session in &self.model.sessions {
            let view = self.machine.describe_session(session.id).unwrap();
            assert_eq!(view.ttl_ms, session.ttl_ms);
            assert_eq!(view.client_name, session.client_name);
            let mut held: Vec<(String, Token)> = view
                .held
                .iter()
                .map(|held| (held.name.clone(), held.token))
                .collect();
            held.sort();
            let mut model_held: Vec<(String, Token)> = self
                .model
                .locks
                .iter()
                .filter(|lock| lock.holder == session.id)
                .map(|lock| (lock.name.clone(), lock.token))
                .collect();
            model_held.sort();
            assert_eq!(held, model_held);
            let mut waiting = view.waiting.clone();
            waiting.sort();
            let mut model_waiting: Vec<String> = self
                .model
                .locks
                .iter()
                .filter(|lock| lock.waiters.contains(&session.id))
                .map(|lock| lock.name.clone())
                .collect();
            model_waiting.sort();
            assert_eq!(waiting, model_waiting);
        }
    }
}

fn stamp_ms(index: u64) -> u64 {
    1_000_000 + index * 7
}

fn without_message(response: &Response) -> Response {
    match response {
        Response::Rejected(error) => {
            assert!(!error.message.is_empty(), "a rejection explains itself");
            rejected(error.kind)
        }
        other => other.clone(),
    }
}

/// Events compared as a multiset: the model does not reproduce the order within an
/// entry, which the replay test pins down instead.
fn sorted(events: &[Event]) -> Vec<Event> {
    let mut events = events.to_vec();
    events.sort();
    events
}

fn replay(machine: &mut StateMachine, log: &[Entry]) {
    for entry in log {
        match &entry.command {
            None => machine.apply_empty(entry.index),
            Some(command) => {
                let (response, _) = machine.apply(entry.index, entry.stamp_ms, command);
                assert_eq!(Some(response), entry.response, "replay of {command:?}");
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn machine_agrees_with_the_model_and_replays_identically(
        ops in prop::collection::vec((op(), 0u64..3), 1..100),
        cut in any::<Index>(),
    ) {
        let mut run = Run::new();
        for (op, gap) in &ops {
            run.step(op, *gap);
        }

        let mut replayed = StateMachine::new();
        replay(&mut replayed, &run.log);
        prop_assert_eq!(&replayed, &run.machine);

        // A snapshot taken mid-way, restored and continued, ends in the same state as
        // the run that never stopped.
        let cut = cut.index(run.log.len() + 1);
        let mut first_half = StateMachine::new();
        replay(&mut first_half, &run.log[..cut]);
        let bytes = postcard::to_stdvec(&first_half).unwrap();
        let mut restored: StateMachine = postcard::from_bytes(&bytes).unwrap();
        prop_assert_eq!(&restored, &first_half);
        replay(&mut restored, &run.log[cut..]);
        restored.check_invariants();
        prop_assert_eq!(&restored, &run.machine);
        let mut continued = first_half.clone();
        replay(&mut continued, &run.log[cut..]);
        prop_assert_eq!(&continued, &run.machine);
    }
}

/// The checks above must be able to fail: a hand-over to the last waiter instead of the
/// first is caught.
#[test]
#[should_panic(expected = "FIFO hand-over")]
fn the_grant_check_catches_a_lifo_hand_over() {
    let mut run = Run::new();
    for client in 0..3 {
        run.step(
            &Op::Create {
                client,
                ttl: 10,
                long_client_name: false,
            },
            0,
        );
    }
    // The first session holds, the other two wait.
    for (client, session) in run.created.clone().into_iter().enumerate() {
        let request = run.request(client as u64);
        run.index += 1;
        let command = Command::Acquire {
            request,
            session,
            name: NAMES[0].to_owned(),
            wait: true,
        };
        run.apply(run.index, command);
    }
    let mut before = run.model.clone();
    before.locks[0].waiters.reverse();
    let lock = run.model.lock(NAMES[0]).unwrap().clone();
    let command = Command::Release {
        request: run.request(0),
        session: lock.holder,
        name: lock.name,
        token: lock.token,
    };
    let index = run.index + 1;
    let (_, events) = run.machine.apply(index, stamp_ms(index), &command);
    run.check_grants(index, &command, &before, &events);
}
