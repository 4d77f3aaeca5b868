//! Table tests: one test per rule, asserting on responses, events and the whole state.

use std::collections::BTreeSet;

use super::listing::{list_all, LISTED_PER_QUEUE_MAX};
use super::lock::{Holder, Lock};
use super::semaphore::Semaphore;
use super::session::{Claim, ClientName, Role};
use super::*;
use crate::machine::limits::{
    CLIENT_NAME_BYTES_MAX, ELECTION_VALUE_BYTES_MAX, EXPIRE_SESSIONS_PER_COMMAND_MAX, LOCKS_PER_SESSION_MAX,
    LOCK_DELAYS_ENDED_PER_COMMAND_MAX, LOCK_DELAY_MS_MAX, LOCK_NAME_BYTES_MAX, REQUESTS_REMEMBERED_PER_SESSION_MAX,
    SEMAPHORE_LIMIT_MAX, SESSIONS_MAX, SESSION_TTL_MS_MAX, SESSION_TTL_MS_MIN, WAITERS_PER_LOCK_MAX,
};

const CLIENT_ID: u64 = 7;
const TTL_MS: u64 = 10_000;

/// A state machine fed like the openraft store feeds it, checking every invariant after
/// every entry.
struct Harness {
    machine: StateMachine,
    index: u64,
    sequence: u64,
}

fn stamp_ms(index: u64) -> u64 {
    1_700_000_000_000 + index * 10
}

impl Harness {
    fn new() -> Self {
        let mut machine = StateMachine::new();
        // Openraft's initial membership entry sits at index 0.
        machine.apply_empty(0);
        Harness { machine, index: 0, sequence: 0 }
    }

    fn request(&mut self) -> RequestId {
        self.sequence += 1;
        RequestId { client_id: CLIENT_ID, sequence: self.sequence }
    }

    fn next_index(&self) -> u64 {
        self.index + 1
    }

    fn apply(&mut self, command: &Command) -> (Response, Vec<Event>) {
        let result = self.apply_unchecked(command);
        self.machine.check_invariants();
        result
    }

    /// For building large states, where checking after every entry would be slow.
    fn apply_unchecked(&mut self, command: &Command) -> (Response, Vec<Event>) {
        self.index += 1;
        self.machine.apply(self.index, stamp_ms(self.index), command)
    }

    fn create_command(&mut self, client_name: &str) -> Command {
        Command::CreateSession { request: self.request(), ttl_ms: TTL_MS, client_name: client_name.to_owned() }
    }

    fn create(&mut self, client_name: &str) -> SessionId {
        let command = self.create_command(client_name);
        let (response, events) = self.apply(&command);
        assert!(events.is_empty());
        match response {
            Response::SessionCreated { session, .. } => session,
            other => panic!("expected a session, got {other:?}"),
        }
    }

    fn acquire_command(&mut self, session: SessionId, name: &str, wait: bool) -> Command {
        Command::Acquire { request: self.request(), session, name: name.to_owned(), wait }
    }

    fn acquire(&mut self, session: SessionId, name: &str, wait: bool) -> (Response, Vec<Event>) {
        let command = self.acquire_command(session, name, wait);
        self.apply(&command)
    }

    /// Acquires a free lock and returns the token.
    fn grant(&mut self, session: SessionId, name: &str) -> Token {
        let index = self.next_index();
        let (response, events) = self.acquire(session, name, true);
        assert_eq!(response, granted_response(index));
        assert_eq!(events, vec![granted(name, session, index)]);
        index
    }

    /// Queues on a held lock and returns the position.
    fn queue(&mut self, session: SessionId, name: &str) -> u32 {
        let (response, events) = self.acquire(session, name, true);
        assert!(events.is_empty());
        match response {
            Response::Acquire(AcquireOutcome::Queued { position }) => position,
            other => panic!("expected to queue, got {other:?}"),
        }
    }

    fn release_command(&mut self, session: SessionId, name: &str, token: Token) -> Command {
        Command::Release { request: self.request(), session, name: name.to_owned(), token }
    }

    fn release(&mut self, session: SessionId, name: &str, token: Token) -> (Response, Vec<Event>) {
        let command = self.release_command(session, name, token);
        self.apply(&command)
    }

    fn cancel(&mut self, session: SessionId, name: &str) -> (Response, Vec<Event>) {
        let command = Command::CancelWait { request: self.request(), session, name: name.to_owned() };
        self.apply(&command)
    }

    fn close(&mut self, session: SessionId) -> (Response, Vec<Event>) {
        let command = Command::CloseSession { request: self.request(), session };
        self.apply(&command)
    }

    fn expire(&mut self, sessions: &[SessionId]) -> (Response, Vec<Event>) {
        self.apply(&Command::ExpireSessions { sessions: sessions.to_vec() })
    }

    /// Applies a command that must be rejected, asserts that it changed nothing but the
    /// last applied index, and returns the error.
    fn reject(&mut self, command: &Command) -> CommandError {
        let before = self.machine.clone();
        let (response, events) = self.apply(command);
        assert!(events.is_empty());
        assert_unchanged(&before, &self.machine);
        match response {
            Response::Rejected(error) => error,
            other => panic!("expected a rejection of {command:?}, got {other:?}"),
        }
    }

    /// Applies a retry that must change nothing but the last applied index.
    fn retry(&mut self, command: &Command) -> Response {
        let before = self.machine.clone();
        let (response, events) = self.apply(command);
        assert!(events.is_empty(), "a retry has no effects");
        assert_unchanged(&before, &self.machine);
        response
    }
}

fn assert_unchanged(before: &StateMachine, after: &StateMachine) {
    let mut expected = before.clone();
    expected.last_applied = after.last_applied;
    assert_eq!(&expected, after, "the state changed");
}

fn granted_response(token: Token) -> Response {
    Response::Acquire(AcquireOutcome::Granted { token })
}

fn queued_response(position: u32) -> Response {
    Response::Acquire(AcquireOutcome::Queued { position })
}

fn granted(name: &str, session: SessionId, token: Token) -> Event {
    Event::Granted { kind: ResourceKind::Lock, name: name.to_owned(), session, token }
}

fn released(name: &str, session: SessionId, token: Token) -> Event {
    Event::Released { kind: ResourceKind::Lock, name: name.to_owned(), session, token }
}

fn ended(session: SessionId, expired: bool) -> Event {
    Event::SessionEnded { session, expired }
}

fn waiters(harness: &Harness, name: &str) -> Vec<SessionId> {
    harness
        .machine
        .describe_lock(ADMIN_TENANT, name)
        .map(|view| view.waiters.iter().map(|waiter| waiter.session).collect())
        .unwrap_or_default()
}

fn holder(harness: &Harness, name: &str) -> Option<(SessionId, Token)> {
    harness.machine.describe_lock(ADMIN_TENANT, name).map(|view| (view.holder.session, view.holder.token))
}

// Semaphores and elections: commands and expected values.

impl Harness {
    fn sem_acquire_command(&mut self, session: SessionId, name: &str, limit: u32, wait: bool) -> Command {
        Command::SemAcquire { request: self.request(), session, name: name.to_owned(), limit, wait }
    }

    fn sem_acquire(&mut self, session: SessionId, name: &str, limit: u32, wait: bool) -> (Response, Vec<Event>) {
        let command = self.sem_acquire_command(session, name, limit, wait);
        self.apply(&command)
    }

    /// Acquires a free permit and returns its token.
    fn permit(&mut self, session: SessionId, name: &str, limit: u32) -> Token {
        let index = self.next_index();
        let (response, events) = self.sem_acquire(session, name, limit, true);
        assert_eq!(response, Response::SemAcquire(AcquireOutcome::Granted { token: index }));
        assert_eq!(events, vec![sem_granted(name, session, index)]);
        index
    }

    /// Queues on a full semaphore and returns the position.
    fn sem_queue(&mut self, session: SessionId, name: &str, limit: u32) -> u32 {
        let (response, events) = self.sem_acquire(session, name, limit, true);
        assert!(events.is_empty());
        match response {
            Response::SemAcquire(AcquireOutcome::Queued { position }) => position,
            other => panic!("expected to queue, got {other:?}"),
        }
    }

    fn sem_release_command(&mut self, session: SessionId, name: &str, token: Token) -> Command {
        Command::SemRelease { request: self.request(), session, name: name.to_owned(), token }
    }

    fn sem_release(&mut self, session: SessionId, name: &str, token: Token) -> (Response, Vec<Event>) {
        let command = self.sem_release_command(session, name, token);
        self.apply(&command)
    }

    fn set_limit_command(&mut self, session: SessionId, name: &str, limit: u32) -> Command {
        Command::SemSetLimit { request: self.request(), session, name: name.to_owned(), limit, tenant: None }
    }

    fn campaign_command(&mut self, session: SessionId, name: &str, value: &str, wait: bool) -> Command {
        Command::Campaign { request: self.request(), session, name: name.to_owned(), value: value.to_owned(), wait }
    }

    fn campaign(&mut self, session: SessionId, name: &str, value: &str, wait: bool) -> (Response, Vec<Event>) {
        let command = self.campaign_command(session, name, value, wait);
        self.apply(&command)
    }

    /// Campaigns in a vacant election and returns the leader's token.
    fn elect(&mut self, session: SessionId, name: &str, value: &str) -> Token {
        let index = self.next_index();
        let (response, events) = self.campaign(session, name, value, true);
        assert_eq!(response, Response::Campaign(AcquireOutcome::Granted { token: index }));
        assert_eq!(events, vec![elected(name, session, index), leader_changed(&self.machine, name),]);
        index
    }

    fn campaign_queue(&mut self, session: SessionId, name: &str, value: &str) -> u32 {
        let (response, events) = self.campaign(session, name, value, true);
        assert!(events.is_empty());
        match response {
            Response::Campaign(AcquireOutcome::Queued { position }) => position,
            other => panic!("expected to queue, got {other:?}"),
        }
    }

    fn campaign_cancel(&mut self, session: SessionId, name: &str) -> (Response, Vec<Event>) {
        let command = Command::CampaignCancelWait { request: self.request(), session, name: name.to_owned() };
        self.apply(&command)
    }

    fn proclaim_command(&mut self, session: SessionId, name: &str, token: Token, value: &str) -> Command {
        Command::Proclaim { request: self.request(), session, name: name.to_owned(), token, value: value.to_owned() }
    }

    fn resign_command(&mut self, session: SessionId, name: &str, token: Token) -> Command {
        Command::Resign { request: self.request(), session, name: name.to_owned(), token }
    }

    fn resign(&mut self, session: SessionId, name: &str, token: Token) -> (Response, Vec<Event>) {
        let command = self.resign_command(session, name, token);
        self.apply(&command)
    }
}

fn sem_granted(name: &str, session: SessionId, token: Token) -> Event {
    Event::Granted { kind: ResourceKind::Semaphore, name: name.to_owned(), session, token }
}

fn elected(name: &str, session: SessionId, token: Token) -> Event {
    Event::Granted { kind: ResourceKind::Election, name: name.to_owned(), session, token }
}

fn resigned(name: &str, session: SessionId, token: Token) -> Event {
    Event::Released { kind: ResourceKind::Election, name: name.to_owned(), session, token }
}

/// The announcement of the election's current state.
fn leader_changed(machine: &StateMachine, name: &str) -> Event {
    Event::LeaderChanged {
        tenant: ADMIN_TENANT,
        name: name.to_owned(),
        leader: machine.describe_election(ADMIN_TENANT, name).map(|view| view.leader),
    }
}

fn sem_holders(harness: &Harness, name: &str) -> Vec<(SessionId, Token)> {
    harness
        .machine
        .describe_semaphore(ADMIN_TENANT, name)
        .map(|view| view.holders.iter().map(|holder| (holder.session, holder.token)).collect())
        .unwrap_or_default()
}

fn sem_waiters(harness: &Harness, name: &str) -> Vec<SessionId> {
    harness
        .machine
        .describe_semaphore(ADMIN_TENANT, name)
        .map(|view| view.waiters.iter().map(|waiter| waiter.session).collect())
        .unwrap_or_default()
}

fn leader(harness: &Harness, name: &str) -> Option<(SessionId, Token, String)> {
    harness
        .machine
        .describe_election(ADMIN_TENANT, name)
        .map(|view| (view.leader.session, view.leader.token, view.leader.value))
}

fn campaigners(harness: &Harness, name: &str) -> Vec<SessionId> {
    harness
        .machine
        .describe_election(ADMIN_TENANT, name)
        .map(|view| view.waiters.iter().map(|waiter| waiter.session).collect())
        .unwrap_or_default()
}

// Sessions.

#[test]
fn create_session_takes_the_entry_index_as_id_and_the_requested_ttl() {
    let mut harness = Harness::new();
    let index = harness.next_index();
    let request = harness.request();
    let (response, events) =
        harness.apply(&Command::CreateSession { request, ttl_ms: 2_500, client_name: "worker-1".to_owned() });
    assert_eq!(response, Response::SessionCreated { session: index, ttl_ms: 2_500 });
    assert!(events.is_empty());
    assert_eq!(harness.machine.session_ttl_ms(index), Some(2_500));
    assert_eq!(
        harness.machine.describe_session(index),
        Some(SessionView {
            id: index,
            ttl_ms: 2_500,
            tenant: ADMIN_TENANT,
            client_name: "worker-1".to_owned(),
            created_index: index,
            held: vec![],
            waiting: vec![],
            permits: vec![],
            waiting_semaphores: vec![],
            leading: vec![],
            campaigning: vec![],
        })
    );
    assert_eq!(harness.machine.last_applied_index(), index);
}

#[test]
fn sessions_are_listed_in_id_order_with_their_ttl() {
    let mut harness = Harness::new();
    let first = harness.create("first");
    let second = harness.create("second");
    let third = harness.create("third");
    harness.close(second);
    let listed: Vec<(SessionId, u64, String)> = harness
        .machine
        .sessions()
        .map(|session| (session.id(), session.ttl_ms(), session.client_name().to_owned()))
        .collect();
    assert_eq!(listed, vec![(first, TTL_MS, "first".to_owned()), (third, TTL_MS, "third".to_owned())]);
    assert_eq!(harness.machine.session_count(), 2);
    assert_eq!(harness.machine.session_ttl_ms(second), None);
    assert_eq!(harness.machine.describe_session(second), None);
}

#[test]
fn ttl_and_name_bounds_are_inclusive() {
    let mut harness = Harness::new();
    for ttl_ms in [SESSION_TTL_MS_MIN, SESSION_TTL_MS_MAX] {
        let request = harness.request();
        let (response, _) =
            harness.apply(&Command::CreateSession { request, ttl_ms, client_name: "c".repeat(CLIENT_NAME_BYTES_MAX) });
        assert!(matches!(response, Response::SessionCreated { ttl_ms: granted, .. } if granted == ttl_ms));
    }
    let session = harness.create("");
    harness.grant(session, &"n".repeat(LOCK_NAME_BYTES_MAX));
}

// Acquire.

#[test]
fn acquire_of_a_free_lock_grants_with_the_entry_index_as_token() {
    let mut harness = Harness::new();
    let session = harness.create("a");
    let index = harness.next_index();
    let token = harness.grant(session, "orders");
    assert_eq!(token, index);
    assert_eq!(
        harness.machine.describe_lock(ADMIN_TENANT, "orders"),
        Some(LockView {
            name: "orders".to_owned(),
            holder: HolderView {
                session,
                client_name: "a".to_owned(),
                token,
                since_ms: stamp_ms(index),
                lock_delay_ms: 0,
                held_back_until_ms: None,
            },
            waiters: vec![],
        })
    );
    assert_eq!(
        harness.machine.describe_session(session).unwrap().held,
        vec![HeldLock { name: "orders".to_owned(), token, since_ms: stamp_ms(index) }]
    );
    assert_eq!(harness.machine.lock_count(), 1);
}

#[test]
fn acquire_of_a_held_lock_by_its_holder_returns_the_existing_token() {
    let mut harness = Harness::new();
    let session = harness.create("a");
    let token = harness.grant(session, "orders");
    for wait in [true, false] {
        let (response, events) = harness.acquire(session, "orders", wait);
        assert_eq!(response, granted_response(token));
        assert!(events.is_empty(), "no new grant, no event");
    }
    assert_eq!(holder(&harness, "orders"), Some((session, token)));
}

#[test]
fn try_lock_of_a_lock_held_by_another_is_busy() {
    let mut harness = Harness::new();
    let a = harness.create("a");
    let b = harness.create("b");
    let token = harness.grant(a, "orders");
    let before = harness.machine.clone();
    let (response, events) = harness.acquire(b, "orders", false);
    assert_eq!(response, Response::Acquire(AcquireOutcome::Busy { holder: a, token }));
    assert!(events.is_empty());
    assert!(waiters(&harness, "orders").is_empty());
    // Only the remembered answer was added.
    assert_eq!(before.namespaces, harness.machine.namespaces);
}

#[test]
fn waiting_acquires_queue_in_arrival_order() {
    let mut harness = Harness::new();
    let a = harness.create("a");
    let b = harness.create("b");
    let c = harness.create("c");
    let d = harness.create("d");
    harness.grant(a, "orders");
    assert_eq!(harness.queue(c, "orders"), 0);
    assert_eq!(harness.queue(b, "orders"), 1);
    assert_eq!(harness.queue(d, "orders"), 2);
    assert_eq!(waiters(&harness, "orders"), vec![c, b, d]);
    let view = harness.machine.describe_lock(ADMIN_TENANT, "orders").unwrap();
    assert_eq!(view.waiters[1].client_name, "b");
    assert_eq!(harness.machine.describe_session(b).unwrap().waiting, vec!["orders".to_owned()]);
}

#[test]
fn waiting_again_returns_the_current_position_without_a_second_entry() {
    let mut harness = Harness::new();
    let a = harness.create("a");
    let b = harness.create("b");
    let c = harness.create("c");
    harness.grant(a, "orders");
    harness.queue(b, "orders");
    harness.queue(c, "orders");
    assert_eq!(harness.queue(c, "orders"), 1);
    assert_eq!(waiters(&harness, "orders"), vec![b, c]);
    // A try-lock while waiting answers whether the session holds the lock now; it stays
    // queued.
    let (response, _) = harness.acquire(c, "orders", false);
    assert!(matches!(
        response,
        Response::Acquire(AcquireOutcome::Busy { holder, .. }) if holder == a
    ));
    assert_eq!(waiters(&harness, "orders"), vec![b, c]);
}

// Release, cancel, close and expiry: see testdata/release.txt, cancel_wait.txt and
// close_and_expiry.txt.

#[test]
fn expiry_order_within_one_entry_does_not_change_the_state() {
    let build = |order: &dyn Fn(SessionId, SessionId) -> Vec<SessionId>| {
        let mut harness = Harness::new();
        let a = harness.create("a");
        let b = harness.create("b");
        let c = harness.create("c");
        harness.grant(a, "one");
        harness.grant(b, "two");
        harness.queue(b, "one");
        harness.queue(a, "two");
        harness.queue(c, "two");
        harness.expire(&order(a, b));
        harness.machine
    };
    assert_eq!(build(&|a, b| vec![a, b]), build(&|a, b| vec![b, a]));
}

// Retries.

#[test]
fn retried_acquire_returns_the_same_token_and_grants_nothing_new() {
    let mut harness = Harness::new();
    let a = harness.create("a");
    let command = harness.acquire_command(a, "orders", true);
    let index = harness.next_index();
    let (response, _) = harness.apply(&command);
    assert_eq!(response, granted_response(index));
    assert_eq!(harness.retry(&command), granted_response(index));
    // Even after the holder released: the retry gets the stored answer, not a new grant.
    harness.release(a, "orders", index);
    assert_eq!(harness.retry(&command), granted_response(index));
    assert_eq!(harness.machine.describe_lock(ADMIN_TENANT, "orders"), None);
}

#[test]
fn retried_queued_acquire_reports_where_the_wait_stands_now() {
    let mut harness = Harness::new();
    let a = harness.create("a");
    let b = harness.create("b");
    let c = harness.create("c");
    let d = harness.create("d");
    let token = harness.grant(a, "orders");
    let wait_c = harness.acquire_command(c, "orders", true);
    harness.queue(b, "orders");
    assert_eq!(harness.apply(&wait_c).0, queued_response(1));
    harness.queue(d, "orders");

    assert_eq!(harness.retry(&wait_c), queued_response(1));
    assert_eq!(waiters(&harness, "orders"), vec![b, c, d], "no second entry");

    harness.cancel(b, "orders");
    assert_eq!(harness.retry(&wait_c), queued_response(0));

    let index = harness.next_index();
    harness.release(a, "orders", token);
    assert_eq!(harness.retry(&wait_c), granted_response(index));

    harness.release(c, "orders", index);
    assert_eq!(harness.retry(&wait_c), Response::Acquire(AcquireOutcome::TimedOut));
    assert_eq!(waiters(&harness, "orders"), Vec::<u64>::new());
    assert_eq!(holder(&harness, "orders").map(|(session, _)| session), Some(d));
}

#[test]
fn retried_queued_acquire_after_its_wait_was_cancelled_times_out() {
    let mut harness = Harness::new();
    let a = harness.create("a");
    let b = harness.create("b");
    harness.grant(a, "orders");
    let wait_b = harness.acquire_command(b, "orders", true);
    harness.apply(&wait_b);
    harness.cancel(b, "orders");
    assert_eq!(harness.retry(&wait_b), Response::Acquire(AcquireOutcome::TimedOut));
    assert!(waiters(&harness, "orders").is_empty());
}

#[test]
fn retried_create_session_returns_the_same_session() {
    let mut harness = Harness::new();
    let command = harness.create_command("a");
    let index = harness.next_index();
    let (response, _) = harness.apply(&command);
    let created = Response::SessionCreated { session: index, ttl_ms: TTL_MS };
    assert_eq!(response, created);
    assert_eq!(harness.retry(&command), created);
    assert_eq!(harness.machine.session_count(), 1);
}

#[test]
fn create_session_answer_is_forgotten_once_a_request_names_the_session() {
    let mut harness = Harness::new();
    let command = harness.create_command("a");
    let (response, _) = harness.apply(&command);
    let Response::SessionCreated { session: a, .. } = response else { panic!("{response:?}") };
    // A rejected request changes nothing, so the answer is still there.
    let (response, _) = harness.acquire(a, "", false);
    assert!(matches!(response, Response::Rejected(_)), "{response:?}");
    assert_eq!(harness.retry(&command), response_created(a));
    harness.grant(a, "orders");
    // The client knew its session id when it asked for the lock: a late retry of the
    // creation is a new request and makes a new session.
    let index = harness.next_index();
    let (response, _) = harness.apply(&command);
    assert_eq!(response, response_created(index));
    assert_eq!(harness.machine.session_count(), 2);
}

fn response_created(session: SessionId) -> Response {
    Response::SessionCreated { session, ttl_ms: TTL_MS }
}

#[test]
fn retried_release_and_cancel_return_the_stored_answer() {
    let mut harness = Harness::new();
    let a = harness.create("a");
    let b = harness.create("b");
    let token = harness.grant(a, "orders");
    harness.queue(b, "orders");
    let release = harness.release_command(a, "orders", token);
    let index = harness.next_index();
    harness.apply(&release);
    assert_eq!(harness.retry(&release), Response::Released { token });
    assert_eq!(holder(&harness, "orders"), Some((b, index)));

    let cancel = Command::CancelWait { request: harness.request(), session: a, name: "orders".to_owned() };
    harness.apply(&cancel);
    harness.queue(a, "orders");
    // The stored answer, even though a waits again now.
    assert_eq!(harness.retry(&cancel), Response::WaitCancelled(CancelOutcome::NotWaiting));
    assert_eq!(waiters(&harness, "orders"), vec![a]);
}

#[test]
fn request_id_reused_for_another_command_is_rejected() {
    let mut harness = Harness::new();
    let a = harness.create("a");
    let command = harness.acquire_command(a, "orders", true);
    harness.apply(&command);
    let Command::Acquire { request, .. } = command else { unreachable!() };
    // Request ids are scoped to their session (see `request_ids_are_scoped_to_their_session`).
    let others = [
        Command::Acquire { request, session: a, name: "users".to_owned(), wait: true },
        Command::Acquire { request, session: a, name: "orders".to_owned(), wait: false },
        Command::Release { request, session: a, name: "orders".to_owned(), token: 3 },
        Command::CloseSession { request, session: a },
    ];
    for other in &others {
        let error = harness.reject(other);
        assert_eq!(error.kind, ErrorKind::RequestIdReused);
        assert_eq!(
            error.message,
            format!(
                "request id (client {CLIENT_ID}, sequence {}) was already used for a different \
                 command; a retry must repeat its command unchanged, and a new command needs a \
                 new sequence number",
                request.sequence
            )
        );
    }
}

#[test]
fn rejected_commands_are_not_remembered() {
    let mut harness = Harness::new();
    let a = harness.create("a");
    let token = harness.grant(a, "orders");
    let request = harness.request();
    let wrong = Command::Release { request, session: a, name: "orders".to_owned(), token: token + 1 };
    harness.reject(&wrong);
    // The rejection had no effect, so the id is free for the corrected command.
    let right = Command::Release { request, session: a, name: "orders".to_owned(), token };
    assert_eq!(harness.apply(&right).0, Response::Released { token });
}

#[test]
fn only_the_last_answers_of_a_session_are_remembered() {
    let mut harness = Harness::new();
    let create = harness.create_command("a");
    let (response, _) = harness.apply(&create);
    let Response::SessionCreated { session: a, .. } = response else { panic!("expected a session") };
    let mut acquires = Vec::new();
    for number in 0..REQUESTS_REMEMBERED_PER_SESSION_MAX {
        let command = harness.acquire_command(a, &format!("lock-{number}"), true);
        harness.apply(&command);
        acquires.push(command);
    }
    assert_eq!(harness.machine.sessions[&a].remembered.len(), REQUESTS_REMEMBERED_PER_SESSION_MAX);
    // The creation's answer was forgotten at the first acquire: its id is new again.
    let Command::CreateSession { request, .. } = create else { unreachable!() };
    assert!(!harness.machine.creations.contains_key(&request));
    // The newest are still there.
    let newest = acquires.last().unwrap().clone();
    let index = harness.index;
    assert_eq!(harness.retry(&newest), granted_response(index));
    // One more evicts the oldest acquire's answer: its id is new again.
    let command = harness.acquire_command(a, "lock-last", true);
    harness.apply(&command);
    let evicted = on_another_lock(&acquires[0], "another-lock");
    assert!(
        matches!(harness.apply(&evicted).0, Response::Acquire(AcquireOutcome::Granted { .. })),
        "an evicted request id is new again"
    );
}

/// The same acquire, request id included, on the lock `name`.
fn on_another_lock(acquire: &Command, name: &str) -> Command {
    let mut command = acquire.clone();
    let Command::Acquire { name: lock, .. } = &mut command else { panic!("not an acquire: {acquire:?}") };
    *lock = name.to_owned();
    command
}

#[test]
fn answers_are_forgotten_when_their_session_ends() {
    let mut harness = Harness::new();
    let a = harness.create("a");
    let b = harness.create("b");
    let acquire_a = harness.acquire_command(a, "orders", true);
    harness.apply(&acquire_a);
    harness.grant(b, "users");
    let waiting = harness.create("waiting");
    harness.close(a);
    harness.expire(&[b, waiting]);
    assert!(harness.machine.creations.is_empty());
    let error = harness.reject(&acquire_a);
    assert_eq!(error.kind, ErrorKind::UnknownSession);
}

// Validation.

#[test]
fn invalid_commands_are_rejected_with_the_rule_and_change_nothing() {
    let mut harness = Harness::new();
    let a = harness.create("a");
    let b = harness.create("b");
    harness.grant(a, "orders");
    harness.queue(b, "orders");
    let long_name = "x".repeat(LOCK_NAME_BYTES_MAX + 1);
    let request = RequestId { client_id: 99, sequence: 1 };
    let named = |name: &str| {
        vec![
            Command::Acquire { request, session: a, name: name.to_owned(), wait: true },
            Command::CancelWait { request, session: a, name: name.to_owned() },
            Command::Release { request, session: a, name: name.to_owned(), token: 1 },
        ]
    };
    let unknown = 999;
    let mut cases: Vec<(Command, ErrorKind, String)> = vec![
        (
            Command::CreateSession { request, ttl_ms: TTL_MS, client_name: "c".repeat(CLIENT_NAME_BYTES_MAX + 1) },
            ErrorKind::InvalidArgument,
            "client name is 129 bytes; the limit is 128 (CLIENT_NAME_BYTES_MAX)".to_owned(),
        ),
        (
            Command::CreateSession { request, ttl_ms: SESSION_TTL_MS_MIN - 1, client_name: String::new() },
            ErrorKind::InvalidArgument,
            "session ttl is 999 ms; the minimum is 1000 ms (SESSION_TTL_MS_MIN)".to_owned(),
        ),
        (
            Command::CreateSession { request, ttl_ms: SESSION_TTL_MS_MAX + 1, client_name: String::new() },
            ErrorKind::InvalidArgument,
            "session ttl is 3600001 ms; the maximum is 3600000 ms (SESSION_TTL_MS_MAX)".to_owned(),
        ),
        (
            Command::CloseSession { request, session: unknown },
            ErrorKind::UnknownSession,
            "session 999 does not exist: it was never created, was closed, or expired".to_owned(),
        ),
        (
            Command::ExpireSessions { sessions: vec![a; EXPIRE_SESSIONS_PER_COMMAND_MAX + 1] },
            ErrorKind::LimitExceeded,
            "expire command lists 1025 sessions; the limit is 1024 \
             (EXPIRE_SESSIONS_PER_COMMAND_MAX)"
                .to_owned(),
        ),
    ];
    for command in named("") {
        cases.push((
            command,
            ErrorKind::InvalidArgument,
            "lock name is empty; a lock name needs at least one byte".to_owned(),
        ));
    }
    for command in named(&long_name) {
        cases.push((
            command,
            ErrorKind::InvalidArgument,
            "lock name is 257 bytes; the limit is 256 (LOCK_NAME_BYTES_MAX)".to_owned(),
        ));
    }
    for mut command in named("orders") {
        match &mut command {
            Command::Acquire { session, .. }
            | Command::CancelWait { session, .. }
            | Command::Release { session, .. } => *session = unknown,
            _ => unreachable!(),
        }
        cases.push((
            command,
            ErrorKind::UnknownSession,
            "session 999 does not exist: it was never created, was closed, or expired".to_owned(),
        ));
    }
    for (command, kind, message) in &cases {
        let error = harness.reject(command);
        assert_eq!((&error.kind, &error.message), (kind, message), "{command:?}");
        assert_eq!(
            error.to_string(),
            format!("{kind:?}: {message}"),
            "the display form carries the kind and the message"
        );
    }
}

#[test]
fn locks_per_session_limit_counts_held_and_waiting() {
    let mut harness = Harness::new();
    let a = harness.create("a");
    let b = harness.create("b");
    let half = LOCKS_PER_SESSION_MAX / 2;
    for number in 0..half {
        let command = harness.acquire_command(a, &format!("held-{number}"), true);
        harness.apply_unchecked(&command);
        let command = harness.acquire_command(b, &format!("other-{number}"), true);
        harness.apply_unchecked(&command);
    }
    for number in 0..LOCKS_PER_SESSION_MAX - half {
        let command = harness.acquire_command(a, &format!("other-{number}"), true);
        harness.apply_unchecked(&command);
    }
    let command = harness.acquire_command(b, "other-extra", true);
    harness.apply_unchecked(&command);
    harness.machine.check_invariants();
    let view = harness.machine.describe_session(a).unwrap();
    assert_eq!(view.held.len() + view.waiting.len(), LOCKS_PER_SESSION_MAX);

    for command in [
        harness.acquire_command(a, "fresh", true),
        harness.acquire_command(a, "fresh", false),
        harness.acquire_command(a, "other-extra", true),
    ] {
        let error = harness.reject(&command);
        assert_eq!(error.kind, ErrorKind::LimitExceeded);
        assert_eq!(
            error.message,
            format!(
                "session {a} holds or waits on 1024 locks, semaphore permits and elections \
                 together; the limit is 1024 (LOCKS_PER_SESSION_MAX)"
            )
        );
    }
    // What adds nothing is still answered at the limit.
    assert_eq!(harness.acquire(a, "held-0", true).0, granted_response(a + 2));
    assert_eq!(harness.acquire(a, "other-0", true).0, queued_response(0));
    assert!(matches!(harness.acquire(a, "other-extra", false).0, Response::Acquire(AcquireOutcome::Busy { .. })));
}

#[test]
fn waiters_per_lock_limit_is_enforced() {
    let mut harness = Harness::new();
    let holder_session = harness.create("holder");
    harness.grant(holder_session, "orders");
    for _ in 0..WAITERS_PER_LOCK_MAX {
        let command = harness.create_command("waiter");
        let (Response::SessionCreated { session, .. }, _) = harness.apply_unchecked(&command) else {
            panic!("expected a session")
        };
        let command = harness.acquire_command(session, "orders", true);
        harness.apply_unchecked(&command);
    }
    let late = harness.create("late");
    harness.machine.check_invariants();
    assert_eq!(waiters(&harness, "orders").len(), WAITERS_PER_LOCK_MAX);
    let command = harness.acquire_command(late, "orders", true);
    let error = harness.reject(&command);
    assert_eq!(error.kind, ErrorKind::LimitExceeded);
    assert_eq!(error.message, "lock \"orders\" has 4096 waiters; the limit is 4096 (WAITERS_PER_LOCK_MAX)");
}

#[test]
fn sessions_limit_is_enforced() {
    let mut harness = Harness::new();
    // Built directly: a million applies would dominate the test run.
    let count = SESSIONS_MAX as u64;
    let client_name = ClientName::new("");
    harness.machine.client_names.insert(client_name.clone(), count as u32);
    harness.machine.sessions = (1..=count)
        .map(|id| {
            let mut session = Session {
                id,
                ttl_ms: TTL_MS as u32,
                tenant: ADMIN_TENANT,
                client_name: client_name.clone(),
                held: thin_vec::ThinVec::new(),
                waiting: thin_vec::ThinVec::new(),
                claims: thin_vec::ThinVec::new(),
                remembered: thin_vec::ThinVec::new(),
                secret: SecretHash::default(),
                counted: Default::default(),
            };
            session.counted = session.counted_now();
            (id, Box::new(session))
        })
        .collect();
    harness.machine.sessions_by_tenant = (1..=count).map(|id| (ADMIN_TENANT, id)).collect();
    let bytes: u64 = harness.machine.sessions.values().map(|session| u64::from(session.counted.bytes)).sum();
    let admin = harness.machine.tenants.get_mut(&ADMIN_TENANT).unwrap();
    admin.usage.sessions = count as u32;
    admin.usage.bytes = bytes;
    harness.machine.bytes_total = bytes;
    harness.machine.last_applied = Some(count);
    harness.index = count;
    harness.machine.check_invariants();
    let command = harness.create_command("one too many");
    let error = harness.reject(&command);
    assert_eq!(error.kind, ErrorKind::LimitExceeded);
    assert_eq!(error.message, "there are 1000000 sessions; the limit is 1000000 (SESSIONS_MAX)");
    harness.expire(&[1]);
    let index = harness.next_index();
    assert_eq!(harness.create("fits again"), index);
}

// Log order and the empty entries.

#[test]
fn empty_entries_advance_the_last_applied_index() {
    let mut machine = StateMachine::new();
    assert_eq!(machine.last_applied(), None);
    assert_eq!(machine.last_applied_index(), 0);
    machine.apply_empty(0);
    assert_eq!(machine.last_applied(), Some(0));
    machine.apply_empty(5);
    assert_eq!(machine.last_applied_index(), 5);
    machine.check_invariants();
}

#[test]
#[should_panic(expected = "entries are applied in log order: index 3 after 3")]
fn applying_an_index_twice_panics() {
    let mut harness = Harness::new();
    harness.create("a");
    harness.create("b");
    harness.machine.apply_empty(3);
    harness.machine.apply_empty(3);
}

#[test]
#[should_panic(expected = "entries are applied in log order")]
fn applying_an_older_index_panics() {
    let mut machine = StateMachine::new();
    machine.apply_empty(4);
    machine.apply(2, 0, &Command::ExpireSessions { sessions: vec![] });
}

// Fences.

#[test]
fn check_fence_answers_current_only_for_the_current_grant() {
    let mut harness = Harness::new();
    let a = harness.create("a");
    let b = harness.create("b");
    let first = harness.grant(a, "orders");
    assert_eq!(harness.machine.check_fence(ADMIN_TENANT, "orders", first), FenceStatus::Current);
    assert_eq!(harness.machine.check_fence(ADMIN_TENANT, "orders", first + 1), FenceStatus::Superseded);
    assert_eq!(harness.machine.check_fence(ADMIN_TENANT, "users", first), FenceStatus::Superseded);
    harness.queue(b, "orders");
    let second = harness.next_index();
    harness.release(a, "orders", first);
    assert_eq!(harness.machine.check_fence(ADMIN_TENANT, "orders", first), FenceStatus::Superseded);
    assert_eq!(harness.machine.check_fence(ADMIN_TENANT, "orders", second), FenceStatus::Current);
    harness.close(b);
    assert_eq!(harness.machine.check_fence(ADMIN_TENANT, "orders", second), FenceStatus::Superseded);
}

// Fingerprints and snapshots.

#[test]
fn fnv1a_matches_the_published_test_vectors() {
    assert_eq!(command::fnv1a(b""), 0xcbf2_9ce4_8422_2325);
    assert_eq!(command::fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    assert_eq!(command::fnv1a(b"foobar"), 0x8594_4171_f739_67e8);
}

#[test]
fn fingerprints_are_pinned_because_they_live_in_snapshots() {
    let request = RequestId { client_id: 1, sequence: 2 };
    let acquire = Command::Acquire { request, session: 3, name: "orders".to_owned(), wait: true };
    // Changing the encoding would make a retry after an upgrade look like a reuse. The
    // value was computed apart from this code, from the encoding the doc comment gives:
    // tag 4, session 3 and the length 6 as 8 little-endian bytes each, "orders", wait 1.
    assert_eq!(acquire.fingerprint(), 0x5b15_187a_c20b_be12);
    let other_request = Command::Acquire {
        request: RequestId { client_id: 9, sequence: 9 },
        session: 3,
        name: "orders".to_owned(),
        wait: true,
    };
    assert_eq!(other_request.fingerprint(), acquire.fingerprint());
    let variants = [
        Command::Acquire { request, session: 4, name: "orders".to_owned(), wait: true },
        Command::Acquire { request, session: 3, name: "order".to_owned(), wait: true },
        Command::Acquire { request, session: 3, name: "orders".to_owned(), wait: false },
        Command::CancelWait { request, session: 3, name: "orders".to_owned() },
        Command::Release { request, session: 3, name: "orders".to_owned(), token: 0 },
    ];
    for variant in &variants {
        assert_ne!(variant.fingerprint(), acquire.fingerprint(), "{variant:?}");
    }

    // Computed apart from this code too: tag 7, session 3, length 6, "orders", limit 2
    // (8 bytes), wait 1; and tag 11, session 3, length 6, "orders", length 1, "v", wait 1.
    let sem_acquire = Command::SemAcquire { request, session: 3, name: "orders".to_owned(), limit: 2, wait: true };
    assert_eq!(sem_acquire.fingerprint(), 0x397a_fc90_ddb8_d093);
    let campaign =
        Command::Campaign { request, session: 3, name: "orders".to_owned(), value: "v".to_owned(), wait: true };
    assert_eq!(campaign.fingerprint(), 0x8c43_f2ad_1ebe_9b76);
    // Every kind of command, and every field, changes the fingerprint.
    let name = || "orders".to_owned();
    let commands = [
        acquire.clone(),
        sem_acquire.clone(),
        Command::SemAcquire { request, session: 3, name: name(), limit: 3, wait: true },
        Command::SemAcquire { request, session: 3, name: name(), limit: 2, wait: false },
        Command::SemRelease { request, session: 3, name: name(), token: 2 },
        Command::SemSetLimit { request, session: 3, name: name(), limit: 2, tenant: None },
        Command::SemCancelWait { request, session: 3, name: name() },
        campaign.clone(),
        Command::Campaign { request, session: 3, name: name(), value: "w".to_owned(), wait: true },
        Command::CampaignCancelWait { request, session: 3, name: name() },
        Command::Proclaim { request, session: 3, name: name(), token: 2, value: "v".to_owned() },
        Command::Proclaim { request, session: 3, name: name(), token: 2, value: "w".to_owned() },
        Command::Resign { request, session: 3, name: name(), token: 2 },
        Command::Release { request, session: 3, name: name(), token: 2 },
    ];
    let fingerprints: BTreeSet<u64> = commands.iter().map(Command::fingerprint).collect();
    assert_eq!(fingerprints.len(), commands.len());
}

#[test]
fn snapshot_round_trips_through_postcard() {
    let mut harness = Harness::new();
    let a = harness.create("a");
    let b = harness.create("b");
    harness.grant(a, "orders");
    harness.queue(b, "orders");
    harness.grant(b, "users");
    harness.permit(a, "tenant", 1);
    harness.sem_queue(b, "tenant", 1);
    harness.elect(b, "scheduler", "b");
    harness.campaign_queue(a, "scheduler", "a");
    let bytes = postcard::to_stdvec(&harness.machine).unwrap();
    let restored: StateMachine = postcard::from_bytes(&bytes).unwrap();
    assert_eq!(restored, harness.machine);
    assert_eq!(postcard::to_stdvec(&restored).unwrap(), bytes);
}

#[test]
fn sessions_of_one_client_share_its_name_until_the_last_one_ends() {
    let mut harness = Harness::new();
    let a = harness.create("worker-pool@host-1:4242");
    let b = harness.create("worker-pool@host-1:4242");
    let c = harness.create("reporter");
    let shared = |machine: &StateMachine, x: SessionId, y: SessionId| {
        machine.sessions[&x].client_name.same_copy(&machine.sessions[&y].client_name)
    };
    assert!(shared(&harness.machine, a, b));
    assert_eq!(harness.machine.client_names.len(), 2);

    // Snapshots carry each session's name; decoding shares them again.
    let restored: StateMachine = postcard::from_bytes(&postcard::to_stdvec(&harness.machine).unwrap()).unwrap();
    restored.check_invariants();
    assert!(shared(&restored, a, b));
    assert_eq!(restored, harness.machine);

    harness.close(a);
    assert_eq!(harness.machine.client_names.len(), 2, "session b still uses the name");
    harness.expire(&[b, c]);
    assert!(harness.machine.client_names.is_empty());
}

#[test]
#[cfg(target_pointer_width = "64")]
fn an_idle_session_stays_small() {
    use std::mem::size_of;
    // Inline sizes; the heap adds one slot per listed name and remembered answer.
    // One empty `Vec` of claims is all that semaphores and elections add to a session
    // that uses neither.
    assert!(size_of::<Session>() <= 80, "{}", size_of::<Session>());
    assert!(size_of::<Claim>() <= 32, "{}", size_of::<Claim>());
    assert!(size_of::<Lock>() <= 32, "{}", size_of::<Lock>());
    assert!(size_of::<Remembered>() <= 48, "{}", size_of::<Remembered>());

    let mut harness = Harness::new();
    let a = harness.create("a");
    harness.grant(a, "orders");
    let session = &harness.machine.sessions[&a];
    assert_eq!(session.held.capacity(), 1);
    assert_eq!(session.waiting.capacity(), 0);
    assert_eq!(session.claims.capacity(), 0);
    // The acquire named the session, so the creation's answer was forgotten.
    assert_eq!(session.remembered.capacity(), 1);
    assert!(harness.machine.creations.is_empty());
}

// Semaphores: the scenarios are in testdata/semaphores.txt.

#[test]
fn bad_semaphore_commands_are_rejected_with_the_rule() {
    let mut harness = Harness::new();
    let a = harness.create("a");
    harness.permit(a, "tenant", 2);
    let limit_message = |limit: u32| {
        format!(
            "semaphore limit is {limit}; it must be at least 1 and at most 10000 \
             (SEMAPHORE_LIMIT_MAX)"
        )
    };
    let cases = [
        (harness.sem_acquire_command(a, "fresh", 0, true), ErrorKind::InvalidArgument, limit_message(0)),
        (
            harness.sem_acquire_command(a, "fresh", SEMAPHORE_LIMIT_MAX + 1, true),
            ErrorKind::InvalidArgument,
            limit_message(SEMAPHORE_LIMIT_MAX + 1),
        ),
        (harness.set_limit_command(a, "tenant", 0), ErrorKind::InvalidArgument, limit_message(0)),
        (
            harness.set_limit_command(a, "tenant", SEMAPHORE_LIMIT_MAX + 1),
            ErrorKind::InvalidArgument,
            limit_message(SEMAPHORE_LIMIT_MAX + 1),
        ),
        (
            harness.set_limit_command(a, "unused", 3),
            ErrorKind::InvalidArgument,
            "semaphore \"unused\" has no holders; the next acquirer sets its limit, so there \
             is no limit to change"
                .to_owned(),
        ),
        (
            harness.sem_acquire_command(a, "", 2, true),
            ErrorKind::InvalidArgument,
            "semaphore name is empty; a semaphore name needs at least one byte".to_owned(),
        ),
        (
            harness.set_limit_command(a, &"x".repeat(LOCK_NAME_BYTES_MAX + 1), 2),
            ErrorKind::InvalidArgument,
            "semaphore name is 257 bytes; the limit is 256 (LOCK_NAME_BYTES_MAX)".to_owned(),
        ),
        (
            harness.sem_acquire_command(999, "tenant", 2, true),
            ErrorKind::UnknownSession,
            "session 999 does not exist: it was never created, was closed, or expired".to_owned(),
        ),
        (
            harness.set_limit_command(999, "tenant", 2),
            ErrorKind::UnknownSession,
            "session 999 does not exist: it was never created, was closed, or expired".to_owned(),
        ),
    ];
    for (command, kind, message) in &cases {
        let error = harness.reject(command);
        assert_eq!((&error.kind, &error.message), (kind, message), "{command:?}");
    }
    // The bounds themselves are allowed.
    harness.permit(a, "one", 1);
    harness.permit(a, "many", SEMAPHORE_LIMIT_MAX);
}

#[test]
fn retried_semaphore_commands_get_their_answers_and_change_nothing() {
    let mut harness = Harness::new();
    let a = harness.create("a");
    let b = harness.create("b");
    let acquire_a = harness.sem_acquire_command(a, "tenant", 1, true);
    let token = harness.next_index();
    harness.apply(&acquire_a);
    let wait_b = harness.sem_acquire_command(b, "tenant", 1, true);
    assert_eq!(harness.apply(&wait_b).0, Response::SemAcquire(AcquireOutcome::Queued { position: 0 }));
    assert_eq!(harness.retry(&wait_b), Response::SemAcquire(AcquireOutcome::Queued { position: 0 }));
    assert_eq!(sem_waiters(&harness, "tenant"), vec![b], "no second place in line");

    let set_limit = harness.set_limit_command(a, "tenant", 1);
    let answer = harness.apply(&set_limit).0;
    assert_eq!(harness.retry(&set_limit), answer);

    let release = harness.sem_release_command(a, "tenant", token);
    let granted_b = harness.next_index();
    harness.apply(&release);
    assert_eq!(
        harness.retry(&release),
        Response::SemReleased { token },
        "a retried release does not release the next grant"
    );
    assert_eq!(harness.retry(&acquire_a), Response::SemAcquire(AcquireOutcome::Granted { token }));
    assert_eq!(
        harness.retry(&wait_b),
        Response::SemAcquire(AcquireOutcome::Granted { token: granted_b }),
        "a retried wait reports the grant that came since"
    );
    harness.sem_release(b, "tenant", granted_b);
    assert_eq!(harness.retry(&wait_b), Response::SemAcquire(AcquireOutcome::TimedOut));

    // The same request id with another body is a reuse.
    let mut reused = wait_b.clone();
    if let Command::SemAcquire { limit, .. } = &mut reused {
        *limit = 2;
    }
    assert_eq!(harness.reject(&reused).kind, ErrorKind::RequestIdReused);
}

// Elections.

#[test]
fn campaign_in_a_vacant_election_leads_with_the_entry_index_and_its_value() {
    let mut harness = Harness::new();
    let a = harness.create("a");
    let token = harness.elect(a, "scheduler", "10.0.0.1:7000");
    let view = harness.machine.describe_election(ADMIN_TENANT, "scheduler").unwrap();
    let leader = LeaderView {
        session: a,
        client_name: "a".to_owned(),
        token,
        since_ms: stamp_ms(token),
        value: "10.0.0.1:7000".to_owned(),
    };
    assert_eq!(view, ElectionView { name: "scheduler".to_owned(), leader: leader.clone(), waiters: vec![] });
    assert_eq!(
        leader_changed(&harness.machine, "scheduler"),
        Event::LeaderChanged { tenant: ADMIN_TENANT, name: "scheduler".to_owned(), leader: Some(leader) }
    );
    assert_eq!(harness.machine.election_count(), 1);
    assert_eq!(
        harness.machine.describe_session(a).unwrap().leading,
        vec![HeldLock { name: "scheduler".to_owned(), token, since_ms: stamp_ms(token) }]
    );
    assert_eq!(
        harness.machine.check_fence_of(ResourceKind::Election, ADMIN_TENANT, "scheduler", token),
        FenceStatus::Current
    );
}

#[test]
fn campaign_by_the_leader_keeps_token_and_value_others_are_busy_or_queue() {
    let mut harness = Harness::new();
    let a = harness.create("a");
    let b = harness.create("b");
    let c = harness.create("c");
    let token = harness.elect(a, "scheduler", "a-value");
    let (response, events) = harness.campaign(a, "scheduler", "other", true);
    assert_eq!(response, Response::Campaign(AcquireOutcome::Granted { token }));
    assert!(events.is_empty());
    assert_eq!(leader(&harness, "scheduler"), Some((a, token, "a-value".to_owned())));
    let (response, events) = harness.campaign(b, "scheduler", "b-value", false);
    assert_eq!(response, Response::Campaign(AcquireOutcome::Busy { holder: a, token }));
    assert!(events.is_empty());
    assert_eq!(harness.campaign_queue(b, "scheduler", "b-value"), 0);
    assert_eq!(harness.campaign_queue(c, "scheduler", "c-value"), 1);
    assert_eq!(harness.campaign_queue(b, "scheduler", "changed"), 0);
    assert_eq!(campaigners(&harness, "scheduler"), vec![b, c]);
    assert_eq!(harness.machine.describe_session(b).unwrap().campaigning, vec!["scheduler".to_owned()]);
}

#[test]
fn proclaim_changes_the_value_and_keeps_the_token() {
    let mut harness = Harness::new();
    let a = harness.create("a");
    let token = harness.elect(a, "scheduler", "old");
    let command = harness.proclaim_command(a, "scheduler", token, "new");
    let (response, events) = harness.apply(&command);
    assert_eq!(response, Response::Proclaimed { token });
    assert_eq!(events, vec![leader_changed(&harness.machine, "scheduler")]);
    assert_eq!(leader(&harness, "scheduler"), Some((a, token, "new".to_owned())));
    // The same value again is no change and is not announced.
    let command = harness.proclaim_command(a, "scheduler", token, "new");
    let (response, events) = harness.apply(&command);
    assert_eq!(response, Response::Proclaimed { token });
    assert!(events.is_empty());
}

#[test]
fn proclaim_and_resign_without_the_current_leadership_are_rejected() {
    let mut harness = Harness::new();
    let a = harness.create("a");
    let b = harness.create("b");
    let stale = harness.elect(a, "scheduler", "a");
    harness.resign(a, "scheduler", stale);
    let token = harness.elect(a, "scheduler", "a");
    let cases = [
        (
            harness.proclaim_command(a, "scheduler", stale, "x"),
            format!(
                "session {a} cannot proclaim in election \"scheduler\" with token {stale}: this \
                 session leads it with token {token}; only the leader can, with the token of \
                 its current leadership"
            ),
        ),
        (
            harness.resign_command(a, "scheduler", stale),
            format!(
                "session {a} cannot resign in election \"scheduler\" with token {stale}: this \
                 session leads it with token {token}; only the leader can, with the token of \
                 its current leadership"
            ),
        ),
        (
            harness.proclaim_command(b, "scheduler", token, "x"),
            format!(
                "session {b} cannot proclaim in election \"scheduler\" with token {token}: \
                 session {a} leads it with token {token}; only the leader can, with the token \
                 of its current leadership"
            ),
        ),
        (
            harness.resign_command(b, "vacant", token),
            format!(
                "session {b} cannot resign in election \"vacant\" with token {token}: the \
                 election is vacant; only the leader can, with the token of its current \
                 leadership"
            ),
        ),
    ];
    for (command, message) in &cases {
        let error = harness.reject(command);
        assert_eq!((error.kind, &error.message), (ErrorKind::NotElectionLeader, message));
    }
    let value_message = "election value is 1025 bytes; the limit is 1024 \
                         (ELECTION_VALUE_BYTES_MAX)";
    let long = "v".repeat(ELECTION_VALUE_BYTES_MAX + 1);
    for command in
        [harness.proclaim_command(a, "scheduler", token, &long), harness.campaign_command(b, "scheduler", &long, true)]
    {
        let error = harness.reject(&command);
        assert_eq!((error.kind, error.message.as_str()), (ErrorKind::InvalidArgument, value_message));
    }
    let longest = "v".repeat(ELECTION_VALUE_BYTES_MAX);
    let command = harness.proclaim_command(a, "scheduler", token, &longest);
    assert_eq!(harness.apply(&command).0, Response::Proclaimed { token });
    let command = harness.campaign_command(a, "", "x", true);
    assert_eq!(harness.reject(&command).message, "election name is empty; an election name needs at least one byte");
}

#[test]
fn resign_hands_leadership_to_the_next_campaigner_with_its_value() {
    let mut harness = Harness::new();
    let a = harness.create("a");
    let b = harness.create("b");
    let c = harness.create("c");
    let first = harness.elect(a, "scheduler", "a-value");
    harness.campaign_queue(b, "scheduler", "b-value");
    harness.campaign_queue(c, "scheduler", "c-value");
    let second = harness.next_index();
    let (response, events) = harness.resign(a, "scheduler", first);
    assert_eq!(response, Response::Resigned { token: first });
    assert_eq!(
        events,
        vec![
            resigned("scheduler", a, first),
            elected("scheduler", b, second),
            leader_changed(&harness.machine, "scheduler"),
        ]
    );
    assert_eq!(leader(&harness, "scheduler"), Some((b, second, "b-value".to_owned())));
    assert_eq!(campaigners(&harness, "scheduler"), vec![c]);
    assert_eq!(
        harness.machine.check_fence_of(ResourceKind::Election, ADMIN_TENANT, "scheduler", first),
        FenceStatus::Superseded
    );
    let third = harness.next_index();
    harness.resign(b, "scheduler", second);
    assert_eq!(leader(&harness, "scheduler"), Some((c, third, "c-value".to_owned())));
    let (_, events) = harness.resign(c, "scheduler", third);
    assert_eq!(
        events,
        vec![
            resigned("scheduler", c, third),
            Event::LeaderChanged { tenant: ADMIN_TENANT, name: "scheduler".to_owned(), leader: None },
        ]
    );
    assert_eq!(harness.machine.describe_election(ADMIN_TENANT, "scheduler"), None);
    assert_eq!(harness.machine.election_count(), 0);
}

#[test]
fn session_end_hands_leadership_on_and_fails_its_campaigns() {
    let mut harness = Harness::new();
    let a = harness.create("a");
    let b = harness.create("b");
    let c = harness.create("c");
    let first = harness.elect(a, "scheduler", "a-value");
    let other = harness.elect(c, "cron", "c-value");
    harness.campaign_queue(b, "scheduler", "b-value");
    harness.campaign_queue(a, "cron", "a-cron");
    let index = harness.next_index();
    let (_, events) = harness.expire(&[a]);
    assert_eq!(
        events,
        vec![
            Event::WaitFailed {
                kind: ResourceKind::Election,
                name: "cron".to_owned(),
                session: a,
                reason: WaitFailure::SessionEnded,
            },
            resigned("scheduler", a, first),
            elected("scheduler", b, index),
            leader_changed(&harness.machine, "scheduler"),
            ended(a, true),
        ]
    );
    assert_eq!(leader(&harness, "scheduler"), Some((b, index, "b-value".to_owned())));
    assert_eq!(leader(&harness, "cron"), Some((c, other, "c-value".to_owned())));
    assert!(campaigners(&harness, "cron").is_empty());
    let (_, events) = harness.close(b);
    assert_eq!(
        events,
        vec![
            resigned("scheduler", b, index),
            Event::LeaderChanged { tenant: ADMIN_TENANT, name: "scheduler".to_owned(), leader: None },
            ended(b, false),
        ]
    );
}

#[test]
fn campaign_cancel_wait_removes_the_campaigner_or_reports_the_leadership() {
    let mut harness = Harness::new();
    let a = harness.create("a");
    let b = harness.create("b");
    let token = harness.elect(a, "scheduler", "a");
    harness.campaign_queue(b, "scheduler", "b");
    let (response, events) = harness.campaign_cancel(b, "scheduler");
    assert_eq!(response, Response::WaitCancelled(CancelOutcome::Cancelled));
    assert_eq!(
        events,
        vec![Event::WaitFailed {
            kind: ResourceKind::Election,
            name: "scheduler".to_owned(),
            session: b,
            reason: WaitFailure::Cancelled,
        }]
    );
    assert!(campaigners(&harness, "scheduler").is_empty());
    let (response, _) = harness.campaign_cancel(b, "scheduler");
    assert_eq!(response, Response::WaitCancelled(CancelOutcome::NotWaiting));
    let (response, _) = harness.campaign_cancel(a, "scheduler");
    assert_eq!(response, Response::WaitCancelled(CancelOutcome::AlreadyGranted { token }));
}

#[test]
fn retried_election_commands_get_their_answers_and_change_nothing() {
    let mut harness = Harness::new();
    let a = harness.create("a");
    let b = harness.create("b");
    let campaign_a = harness.campaign_command(a, "scheduler", "a", true);
    let token = harness.next_index();
    harness.apply(&campaign_a);
    let campaign_b = harness.campaign_command(b, "scheduler", "b", true);
    harness.apply(&campaign_b);
    assert_eq!(harness.retry(&campaign_b), Response::Campaign(AcquireOutcome::Queued { position: 0 }));
    let proclaim = harness.proclaim_command(a, "scheduler", token, "a2");
    harness.apply(&proclaim);
    assert_eq!(harness.retry(&proclaim), Response::Proclaimed { token });
    let resign = harness.resign_command(a, "scheduler", token);
    let next = harness.next_index();
    harness.apply(&resign);
    assert_eq!(
        harness.retry(&resign),
        Response::Resigned { token },
        "a retried resign does not end the next leadership"
    );
    assert_eq!(harness.retry(&campaign_a), Response::Campaign(AcquireOutcome::Granted { token }));
    assert_eq!(harness.retry(&campaign_b), Response::Campaign(AcquireOutcome::Granted { token: next }));
    let mut reused = proclaim.clone();
    if let Command::Proclaim { value, .. } = &mut reused {
        *value = "other".to_owned();
    }
    assert_eq!(harness.reject(&reused).kind, ErrorKind::RequestIdReused);
}

// Locks, semaphores and elections together.

#[test]
fn locks_semaphores_and_elections_of_one_name_are_separate() {
    let mut harness = Harness::new();
    let a = harness.create("a");
    let b = harness.create("b");
    let lock = harness.grant(a, "x");
    let permit = harness.permit(b, "x", 1);
    let leadership = harness.elect(a, "x", "value");
    assert_eq!(holder(&harness, "x"), Some((a, lock)));
    assert_eq!(sem_holders(&harness, "x"), vec![(b, permit)]);
    assert_eq!(leader(&harness, "x").map(|l| l.1), Some(leadership));
    assert_eq!(harness.machine.check_fence(ADMIN_TENANT, "x", permit), FenceStatus::Superseded);
    assert_eq!(
        harness.machine.check_fence_of(ResourceKind::Semaphore, ADMIN_TENANT, "x", lock),
        FenceStatus::Superseded
    );
    let view = harness.machine.describe_session(a).unwrap();
    assert_eq!(view.held.len(), 1);
    assert!(view.permits.is_empty());
    assert_eq!(view.leading.len(), 1);
    let (_, events) = harness.close(a);
    assert_eq!(
        events,
        vec![
            released("x", a, lock),
            resigned("x", a, leadership),
            Event::LeaderChanged { tenant: ADMIN_TENANT, name: "x".to_owned(), leader: None },
            ended(a, false),
        ]
    );
    assert_eq!(sem_holders(&harness, "x"), vec![(b, permit)]);
}

#[test]
fn the_per_session_limit_counts_locks_permits_and_elections_together() {
    let mut harness = Harness::new();
    let a = harness.create("a");
    let b = harness.create("b");
    harness.grant(b, "busy-lock");
    harness.permit(b, "busy-semaphore", 1);
    harness.elect(b, "busy-election", "b");
    for number in 0..LOCKS_PER_SESSION_MAX - 6 {
        let command = harness.acquire_command(a, &format!("lock-{number}"), true);
        harness.apply_unchecked(&command);
    }
    harness.permit(a, "semaphore", 2);
    harness.sem_queue(a, "busy-semaphore", 1);
    harness.elect(a, "election", "a");
    harness.campaign_queue(a, "busy-election", "a");
    harness.queue(a, "busy-lock");
    let command = harness.acquire_command(a, "last-lock", true);
    harness.apply(&command);
    assert_eq!(harness.machine.sessions[&a].resource_count(), LOCKS_PER_SESSION_MAX);
    let message = format!(
        "session {a} holds or waits on 1024 locks, semaphore permits and elections together; \
         the limit is 1024 (LOCKS_PER_SESSION_MAX)"
    );
    for command in [
        harness.acquire_command(a, "fresh", true),
        harness.sem_acquire_command(a, "fresh", 1, true),
        harness.sem_acquire_command(a, "fresh", 1, false),
        harness.campaign_command(a, "fresh", "a", false),
    ] {
        let error = harness.reject(&command);
        assert_eq!((error.kind, &error.message), (ErrorKind::LimitExceeded, &message));
    }
    // What adds nothing is still answered at the limit.
    assert!(matches!(
        harness.sem_acquire(a, "semaphore", 2, true).0,
        Response::SemAcquire(AcquireOutcome::Granted { .. })
    ));
    assert_eq!(
        harness.sem_acquire(a, "busy-semaphore", 1, true).0,
        Response::SemAcquire(AcquireOutcome::Queued { position: 0 })
    );
    assert!(matches!(harness.campaign(a, "election", "a", true).0, Response::Campaign(AcquireOutcome::Granted { .. })));
    assert_eq!(
        harness.campaign(a, "busy-election", "a", true).0,
        Response::Campaign(AcquireOutcome::Queued { position: 0 })
    );
}

// The invariant checker itself.

/// Returns the state and sessions a (holds "orders"), b (waits on it), c (holds "users").
fn corruptible() -> (StateMachine, SessionId, SessionId, SessionId) {
    let mut harness = Harness::new();
    let a = harness.create("a");
    let b = harness.create("b");
    let c = harness.create("c");
    harness.grant(a, "orders");
    harness.queue(b, "orders");
    harness.grant(c, "users");
    (harness.machine, a, b, c)
}

#[test]
#[should_panic(expected = "which does not exist")]
fn invariants_catch_a_dead_session_holding_a_lock() {
    let (mut machine, a, _, _) = corruptible();
    let gone = machine.sessions.remove(&a).unwrap();
    machine.sessions_by_tenant.remove(&(gone.tenant, gone.id));
    unshare_name(&mut machine.client_names, &gone.client_name);
    machine.check_invariants();
}

#[test]
#[should_panic(expected = "the client name table does not count the sessions using each name")]
fn invariants_catch_a_client_name_kept_after_its_sessions_ended() {
    let (mut machine, a, _, _) = corruptible();
    let gone = machine.sessions.remove(&a).unwrap();
    machine.sessions_by_tenant.remove(&(gone.tenant, gone.id));
    machine.check_invariants();
}

#[test]
#[should_panic(expected = "the index of sessions by tenant is out of step")]
fn invariants_catch_a_session_missing_from_the_tenant_index() {
    let (mut machine, a, _, _) = corruptible();
    let tenant = machine.sessions[&a].tenant;
    machine.sessions_by_tenant.remove(&(tenant, a));
    machine.check_invariants();
}

#[test]
#[should_panic(expected = "but another session holds it")]
fn invariants_catch_two_sessions_claiming_one_lock() {
    let (mut machine, _, _, c) = corruptible();
    machine.sessions.get_mut(&c).unwrap().held.push("orders".to_owned());
    machine.check_invariants();
}

#[test]
#[should_panic(expected = "lists lock \"orders\" as held twice")]
fn invariants_catch_a_lock_listed_twice_by_its_holder() {
    let (mut machine, a, _, _) = corruptible();
    machine.sessions.get_mut(&a).unwrap().held.push("orders".to_owned());
    machine.check_invariants();
}

#[test]
#[should_panic(expected = "both holds and waits")]
fn invariants_catch_a_holder_that_also_waits() {
    let (mut machine, a, _, _) = corruptible();
    machine.namespaces.get_mut(&ADMIN_TENANT).unwrap().locks.get_mut("orders").unwrap().waiters.push(a);
    machine.sessions.get_mut(&a).unwrap().waiting.push("orders".to_owned());
    machine.check_invariants();
}

#[test]
#[should_panic(expected = "is queued twice")]
fn invariants_catch_a_duplicate_waiter() {
    let (mut machine, _, b, _) = corruptible();
    machine.namespaces.get_mut(&ADMIN_TENANT).unwrap().locks.get_mut("orders").unwrap().waiters.push(b);
    machine.check_invariants();
}

#[test]
#[should_panic(expected = "does not list it")]
fn invariants_catch_a_queue_the_session_does_not_know_about() {
    let (mut machine, _, b, _) = corruptible();
    machine.sessions.get_mut(&b).unwrap().waiting.clear();
    machine.check_invariants();
}

#[test]
#[should_panic(expected = "after the last applied index")]
fn invariants_catch_a_token_from_the_future() {
    let (mut machine, _, _, _) = corruptible();
    machine.namespaces.get_mut(&ADMIN_TENANT).unwrap().locks.get_mut("users").unwrap().holder.token = 1_000;
    machine.check_invariants();
}

#[test]
#[should_panic(expected = "but the creation index disagrees")]
fn invariants_catch_a_forgotten_creation_index_entry() {
    let mut harness = Harness::new();
    harness.create("a");
    let request = *harness.machine.creations.keys().next().unwrap();
    harness.machine.creations.remove(&request);
    harness.machine.check_invariants();
}

#[test]
fn request_ids_are_scoped_to_their_session() {
    let mut harness = Harness::new();
    let a = harness.create("a");
    let b = harness.create("b");
    let acquire_a = harness.acquire_command(a, "orders", true);
    harness.apply(&acquire_a);
    // Another session's command with the same id is a new request of that session...
    let Command::Acquire { request, .. } = acquire_a else { unreachable!() };
    let acquire_b = Command::Acquire { request, session: b, name: "users".to_owned(), wait: true };
    assert!(matches!(harness.apply(&acquire_b).0, Response::Acquire(AcquireOutcome::Granted { .. })));
    // ...and within a session, a reused id with another body is still refused.
    let reused = on_another_lock(&acquire_b, "other");
    assert_eq!(harness.reject(&reused).kind, ErrorKind::RequestIdReused);
}

/// Returns a state where a and b hold permits of "tenant" (limit 2), a leads "scheduler"
/// and b campaigns in it, and c holds nothing.
fn corruptible_semaphore_and_election() -> (StateMachine, SessionId, SessionId, SessionId) {
    let mut harness = Harness::new();
    let a = harness.create("a");
    let b = harness.create("b");
    let c = harness.create("c");
    harness.permit(a, "tenant", 2);
    harness.permit(b, "tenant", 2);
    harness.elect(a, "scheduler", "a");
    harness.campaign_queue(b, "scheduler", "b");
    harness.machine.apply_empty(harness.index + 1);
    (harness.machine, a, b, c)
}

#[test]
#[should_panic(expected = "which exceeds its limit 2")]
fn invariants_catch_a_semaphore_with_one_holder_too_many() {
    let (mut machine, _, _, c) = corruptible_semaphore_and_election();
    let token = machine.last_applied_index();
    machine.namespaces.get_mut(&ADMIN_TENANT).unwrap().semaphores.get_mut("tenant").unwrap().holders.push(Holder {
        session: c,
        token,
        since_ms: 0,
    });
    machine.sessions.get_mut(&c).unwrap().add_claim(ResourceKind::Semaphore, Role::Holds, "tenant");
    machine.check_invariants();
}

#[test]
fn invariants_accept_more_holders_than_a_lowered_limit() {
    let (mut machine, a, _, _) = corruptible_semaphore_and_election();
    let index = machine.last_applied_index() + 1;
    let request = RequestId { client_id: 1, sequence: 1 };
    let command = Command::SemSetLimit { request, session: a, name: "tenant".to_owned(), limit: 1, tenant: None };
    machine.apply(index, stamp_ms(index), &command);
    machine.check_invariants();
    assert_eq!(machine.describe_semaphore(ADMIN_TENANT, "tenant").unwrap().holders.len(), 2);
}

#[test]
#[should_panic(expected = "under its limit 2 while sessions wait")]
fn invariants_catch_a_free_permit_left_while_sessions_wait() {
    let (mut machine, _, b, c) = corruptible_semaphore_and_election();
    let semaphore = machine.namespaces.get_mut(&ADMIN_TENANT).unwrap().semaphores.get_mut("tenant").unwrap();
    semaphore.holders.retain(|holder| holder.session != b);
    semaphore.waiters.push(c);
    let session_b = machine.sessions.get_mut(&b).unwrap();
    session_b.remove_claim(ResourceKind::Semaphore, Role::Holds, "tenant");
    machine.sessions.get_mut(&c).unwrap().add_claim(ResourceKind::Semaphore, Role::Waits, "tenant");
    machine.check_invariants();
}

#[test]
#[should_panic(expected = "but another session leads it")]
fn invariants_catch_two_leaders_of_one_election() {
    let (mut machine, _, _, c) = corruptible_semaphore_and_election();
    machine.sessions.get_mut(&c).unwrap().add_claim(ResourceKind::Election, Role::Holds, "scheduler");
    machine.check_invariants();
}

#[test]
#[should_panic(expected = "or both holds and waits on it")]
fn invariants_catch_a_leader_that_also_campaigns() {
    let (mut machine, a, _, _) = corruptible_semaphore_and_election();
    machine
        .namespaces
        .get_mut(&ADMIN_TENANT)
        .unwrap()
        .elections
        .get_mut("scheduler")
        .unwrap()
        .waiters
        .push(super::election::Campaigner { session: a, value: String::new() });
    machine.sessions.get_mut(&a).unwrap().add_claim(ResourceKind::Election, Role::Waits, "scheduler");
    machine.check_invariants();
}

#[test]
#[should_panic(expected = "is unused but keeps an entry")]
fn invariants_catch_an_empty_semaphore_entry() {
    let (mut machine, _, _, _) = corruptible_semaphore_and_election();
    machine
        .namespaces
        .get_mut(&ADMIN_TENANT)
        .unwrap()
        .semaphores
        .insert("empty".to_owned(), Semaphore { limit: 1, limit_set_index: 1, holders: vec![], waiters: vec![] });
    machine.check_invariants();
}

#[test]
#[should_panic(expected = "does not list it")]
fn invariants_catch_a_permit_the_session_does_not_list() {
    let (mut machine, a, _, _) = corruptible_semaphore_and_election();
    machine.sessions.get_mut(&a).unwrap().claims.retain(|claim| claim.kind != ResourceKind::Semaphore);
    machine.check_invariants();
}

#[test]
#[should_panic(expected = "no permit to grant")]
fn the_grant_path_refuses_a_permit_beyond_the_limit() {
    let (mut machine, _, _, c) = corruptible_semaphore_and_election();
    let index = machine.last_applied_index();
    let mut events = Vec::new();
    machine.grant_permit(index, 0, ADMIN_TENANT, "tenant", c, &mut events);
}

// ---------------------------------------------------------------- batched entries

#[test]
fn a_batch_applies_commands_on_different_resources_at_one_index_as_if_one_by_one() {
    let mut batched = Harness::new();
    let a = batched.create("a");
    let b = batched.create("b");
    let a_token = batched.grant(a, "x");
    let waiter = batched.queue(b, "x");
    assert_eq!(waiter, 0);
    let mut sequential = Harness { machine: batched.machine.clone(), index: batched.index, sequence: batched.sequence };

    let commands = vec![
        batched.release_command(a, "x", a_token),
        batched.acquire_command(a, "y", true),
        Command::SemAcquire { request: batched.request(), session: a, name: "x".into(), limit: 2, wait: false },
    ];
    let index = batched.next_index();
    let results = batched.machine.apply_batch(index, stamp_ms(index), &as_cluster(&commands));
    batched.index = index;
    batched.machine.check_invariants();

    // The same commands alone, each at the entry's index, give the same answers.
    let mut expected = Vec::new();
    for command in &commands {
        let mut alone = sequential.machine.clone();
        alone.last_applied = None;
        expected.push(alone.apply(index, stamp_ms(index), command));
        sequential.machine = alone;
    }
    assert_eq!(results, expected);
    // Two grants of two different names share the entry's index as their token.
    let lock_x = batched.machine.describe_lock(ADMIN_TENANT, "x").unwrap();
    let lock_y = batched.machine.describe_lock(ADMIN_TENANT, "y").unwrap();
    assert_eq!((lock_x.holder.session, lock_x.holder.token), (b, index));
    assert_eq!((lock_y.holder.session, lock_y.holder.token), (a, index));
}

#[test]
fn commands_on_one_resource_each_may_share_an_entry_and_session_commands_may_not() {
    let mut harness = Harness::new();
    let a = harness.create("a");
    let acquire_x = harness.acquire_command(a, "x", true);
    let acquire_x_again = harness.acquire_command(a, "x", true);
    let acquire_y = harness.acquire_command(a, "y", true);
    let create = harness.create_command("c");
    let close = Command::CloseSession { request: harness.request(), session: a };
    let semaphore_x =
        Command::SemAcquire { request: harness.request(), session: a, name: "x".into(), limit: 1, wait: true };
    assert!(batch_is_valid(&[acquire_x.clone(), acquire_y.clone(), semaphore_x]));
    assert!(batch_is_valid(&[acquire_x.clone(), acquire_x_again]), "one lock twice");
    assert!(!batch_is_valid(&[acquire_x.clone(), create.clone()]), "creating a session takes its own entry");
    assert!(!batch_is_valid(&[close, acquire_x]), "ending a session takes its own entry");
    assert!(batch_is_valid(&[create]), "alone, any command is fine");
}

#[test]
#[should_panic(expected = "needs an entry of its own")]
fn a_batch_with_a_session_command_is_refused() {
    let mut harness = Harness::new();
    let a = harness.create("a");
    let commands = vec![harness.acquire_command(a, "x", true), harness.create_command("b")];
    let index = harness.next_index();
    harness.machine.apply_batch(index, stamp_ms(index), &as_cluster(&commands));
}

/// Commands on one lock in one entry: the release hands the lock over once, and the
/// new holder's token, which is the entry's own index, cannot end that grant in the
/// same entry; so no two grants of the lock share a token.
#[test]
fn a_grant_cannot_end_in_the_entry_that_made_it() {
    let mut harness = Harness::new();
    let a = harness.create("a");
    let b = harness.create("b");
    let c = harness.create("c");
    let token = harness.grant(a, "x");
    harness.queue(b, "x");
    let index = harness.next_index();
    let commands = vec![
        harness.release_command(a, "x", token),
        harness.release_command(b, "x", index),
        harness.acquire_command(c, "x", true),
        harness.acquire_command(a, "y", false),
        harness.release_command(a, "y", index),
        harness.acquire_command(c, "y", false),
    ];
    let results = harness.machine.apply_batch(index, stamp_ms(index), &as_cluster(&commands));
    harness.index = index;
    harness.machine.check_invariants();
    let responses: Vec<&Response> = results.iter().map(|(response, _)| response).collect();
    assert_eq!(responses[0], &Response::Released { token });
    assert!(matches!(responses[1], Response::Rejected(CommandError { kind: ErrorKind::NotHolder, .. })));
    assert_eq!(responses[2], &Response::Acquire(AcquireOutcome::Queued { position: 0 }));
    assert_eq!(responses[3], &Response::Acquire(AcquireOutcome::Granted { token: index }));
    assert!(matches!(responses[4], Response::Rejected(CommandError { kind: ErrorKind::NotHolder, .. })));
    assert_eq!(responses[5], &Response::Acquire(AcquireOutcome::Busy { holder: a, token: index }));
    let x = harness.machine.describe_lock(ADMIN_TENANT, "x").unwrap();
    assert_eq!((x.holder.session, x.holder.token), (b, index));
    let y = harness.machine.describe_lock(ADMIN_TENANT, "y").unwrap();
    assert_eq!((y.holder.session, y.holder.token), (a, index));

    // In a later entry the same tokens release as usual.
    let release = harness.release_command(b, "x", index);
    let (response, _) = harness.apply(&release);
    assert_eq!(response, Response::Released { token: index });
}

#[test]
fn a_leadership_cannot_end_in_the_entry_that_made_it() {
    let mut harness = Harness::new();
    let a = harness.create("a");
    let b = harness.create("b");
    let campaign = harness.campaign_command(a, "e", "va", false);
    let (response, _) = harness.apply(&campaign);
    let Response::Campaign(AcquireOutcome::Granted { token }) = response else { panic!("{response:?}") };
    let campaign = harness.campaign_command(b, "e", "vb", true);
    harness.apply(&campaign);
    let index = harness.next_index();
    let commands = vec![
        Command::Resign { request: harness.request(), session: a, name: "e".into(), token },
        Command::Resign { request: harness.request(), session: b, name: "e".into(), token: index },
        Command::Proclaim { request: harness.request(), session: b, name: "e".into(), token: index, value: "x".into() },
    ];
    let results = harness.machine.apply_batch(index, stamp_ms(index), &as_cluster(&commands));
    harness.index = index;
    harness.machine.check_invariants();
    assert_eq!(results[0].0, Response::Resigned { token });
    for (response, _) in &results[1..] {
        assert!(
            matches!(response, Response::Rejected(CommandError { kind: ErrorKind::NotElectionLeader, .. })),
            "{response:?}"
        );
    }
    let leader = harness.machine.describe_election(ADMIN_TENANT, "e").unwrap().leader;
    assert_eq!((leader.session, leader.token, leader.value.as_str()), (b, index, "vb"));
}

/// `commands` as the cluster sends them (unchecked), for `apply_batch`.
fn as_cluster(commands: &[Command]) -> Vec<Submission> {
    commands.iter().map(|command| Submission { caller: Caller::Cluster, command: command.clone() }).collect()
}

// ---------------------------------------------------------------- tenants and callers

/// A harness whose commands come from callers: the admin makes tenants, tenants make
/// sessions with secrets.
struct Tenants {
    harness: Harness,
}

const ADMIN: Caller = Caller::Admin { secret: [0; 16] };

fn token(byte: u8) -> SecretHash {
    [byte; 16]
}

impl Tenants {
    fn new() -> Tenants {
        Tenants { harness: Harness::new() }
    }

    fn apply(&mut self, caller: &Caller, command: Command) -> (Response, Vec<Event>) {
        let index = self.harness.next_index();
        let before = self.harness.machine.clone();
        let (response, events) = self.harness.machine.apply_as(index, stamp_ms(index), caller, &command);
        self.harness.index = index;
        self.harness.machine.check_invariants();
        if matches!(response, Response::Rejected(_)) {
            assert!(events.is_empty());
            let mut unchanged = before;
            unchanged.last_applied = Some(index);
            assert_eq!(unchanged, self.harness.machine, "a refused command changed the state");
        }
        (response, events)
    }

    fn refused(&mut self, caller: &Caller, command: Command) -> CommandError {
        match self.apply(caller, command).0 {
            Response::Rejected(error) => error,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    fn add_tenant(&mut self, name: &str, quotas: Quotas) -> TenantId {
        let request = self.harness.request();
        let command = Command::AddTenant { request, name: name.into(), token_hash: token(name.as_bytes()[0]), quotas };
        match self.apply(&ADMIN, command).0 {
            Response::TenantAdded { tenant } => tenant,
            other => panic!("add tenant {name}: {other:?}"),
        }
    }

    fn session(&mut self, tenant: TenantId, secret: u8) -> SessionId {
        let command = self.harness.create_command("worker");
        match self.apply(&Caller::Tenant { tenant, secret: [secret; 16] }, command).0 {
            Response::SessionCreated { session, .. } => session,
            other => panic!("create session: {other:?}"),
        }
    }

    fn acquire(&mut self, tenant: TenantId, secret: u8, session: SessionId, name: &str, wait: bool) -> Response {
        let command = self.harness.acquire_command(session, name, wait);
        self.apply(&Caller::Tenant { tenant, secret: [secret; 16] }, command).0
    }
}

fn metadata(error: &CommandError, key: &str) -> Option<String> {
    error.metadata.iter().find(|(name, _)| name == key).map(|(_, value)| value.clone())
}

#[test]
fn two_tenants_hold_locks_of_one_name_in_their_own_namespaces() {
    let mut tenants = Tenants::new();
    let a = tenants.add_tenant("alpha", Quotas::default());
    let b = tenants.add_tenant("beta", Quotas::default());
    let session_a = tenants.session(a, 1);
    let session_b = tenants.session(b, 2);
    let Response::Acquire(AcquireOutcome::Granted { token: token_a }) =
        tenants.acquire(a, 1, session_a, "orders/42", false)
    else {
        panic!("alpha's lock is free")
    };
    let Response::Acquire(AcquireOutcome::Granted { token: token_b }) =
        tenants.acquire(b, 2, session_b, "orders/42", false)
    else {
        panic!("beta's orders/42 is another lock, free too")
    };
    assert!(token_b > token_a, "tokens are log indexes: one order across tenants");
    let machine = &tenants.harness.machine;
    assert_eq!(machine.describe_lock(a, "orders/42").unwrap().holder.session, session_a);
    assert_eq!(machine.describe_lock(b, "orders/42").unwrap().holder.session, session_b);
    assert_eq!(machine.check_fence(a, "orders/42", token_b), FenceStatus::Superseded, "a fence is per namespace");
    assert!(machine.describe_lock(ADMIN_TENANT, "orders/42").is_none());
}

#[test]
fn a_session_acts_only_for_its_tenant_with_its_secret() {
    let mut tenants = Tenants::new();
    let a = tenants.add_tenant("alpha", Quotas::default());
    let b = tenants.add_tenant("beta", Quotas::default());
    let session = tenants.session(a, 1);
    let Response::Acquire(AcquireOutcome::Granted { token }) = tenants.acquire(a, 1, session, "x", false) else {
        panic!("free")
    };

    // The right tenant without the secret: refused, whatever the command.
    let release = Command::Release { request: tenants.harness.request(), session, name: "x".into(), token };
    let error = tenants.refused(&Caller::Tenant { tenant: a, secret: [9; 16] }, release.clone());
    assert_eq!(error.kind, ErrorKind::WrongSessionSecret);
    assert_eq!(metadata(&error, "session_id"), Some(session.to_string()));
    let close = Command::CloseSession { request: tenants.harness.request(), session };
    assert_eq!(
        tenants.refused(&Caller::Tenant { tenant: a, secret: [0; 16] }, close).kind,
        ErrorKind::WrongSessionSecret
    );

    // Another tenant, even with the secret: the same answer as a session that does not
    // exist, word for word, so that the id tells it nothing.
    let error = tenants.refused(&Caller::Tenant { tenant: b, secret: [1; 16] }, release);
    let missing = SessionId::MAX;
    let unknown = Command::Release { request: tenants.harness.request(), session: missing, name: "x".into(), token };
    let unknown = tenants.refused(&Caller::Tenant { tenant: b, secret: [1; 16] }, unknown);
    assert_eq!(error.kind, ErrorKind::UnknownSession);
    assert_eq!(error.message, unknown.message.replace(&missing.to_string(), &session.to_string()));
    assert!(!error.message.contains("alpha"), "{}", error.message);

    // The admin is not the session's tenant either.
    let acquire = tenants.harness.acquire_command(session, "y", false);
    assert_eq!(tenants.refused(&Caller::Admin { secret: [1; 16] }, acquire).kind, ErrorKind::PermissionDenied);
    assert_eq!(tenants.harness.machine.describe_lock(a, "x").unwrap().holder.token, token);
}

#[test]
fn tenant_management_and_expiry_are_not_a_tenants_to_send() {
    let mut tenants = Tenants::new();
    let a = tenants.add_tenant("alpha", Quotas::default());
    let caller = Caller::Tenant { tenant: a, secret: [1; 16] };
    let add = Command::AddTenant {
        request: tenants.harness.request(),
        name: "mallory".into(),
        token_hash: token(7),
        quotas: Quotas::default(),
    };
    assert_eq!(tenants.refused(&caller, add).kind, ErrorKind::PermissionDenied);
    let remove = Command::RemoveTenant { request: tenants.harness.request(), name: "alpha".into() };
    assert_eq!(tenants.refused(&caller, remove).kind, ErrorKind::PermissionDenied);
    let session = tenants.session(a, 1);
    let expire = Command::ExpireSessions { sessions: vec![session] };
    assert_eq!(tenants.refused(&caller, expire).kind, ErrorKind::PermissionDenied);
    assert!(tenants.harness.machine.session_of(session).is_some());
}

#[test]
fn quotas_refuse_new_sessions_holds_and_waits_and_free_up_as_they_end() {
    let mut tenants = Tenants::new();
    let quotas = Quotas { sessions: 2, holds: 1, waiters: 1 };
    let a = tenants.add_tenant("alpha", quotas);
    let first = tenants.session(a, 1);
    let second = tenants.session(a, 1);
    let create = tenants.harness.create_command("third");
    let error = tenants.refused(&Caller::Tenant { tenant: a, secret: [1; 16] }, create);
    assert_eq!(error.kind, ErrorKind::QuotaExceeded);
    assert_eq!(
        (metadata(&error, "quota"), metadata(&error, "limit"), metadata(&error, "usage")),
        (Some("sessions".into()), Some("2".into()), Some("2".into()))
    );

    assert!(matches!(tenants.acquire(a, 1, first, "x", false), Response::Acquire(AcquireOutcome::Granted { .. })));
    let error = match tenants.acquire(a, 1, first, "y", false) {
        Response::Rejected(error) => error,
        other => panic!("a second hold is over the quota: {other:?}"),
    };
    assert_eq!((error.kind, metadata(&error, "quota")), (ErrorKind::QuotaExceeded, Some("holds".into())));
    // A wait is counted apart from the holds.
    assert!(matches!(tenants.acquire(a, 1, second, "x", true), Response::Acquire(AcquireOutcome::Queued { .. })));
    let third = {
        let close = Command::CloseSession { request: tenants.harness.request(), session: first };
        tenants.apply(&Caller::Tenant { tenant: a, secret: [1; 16] }, close);
        tenants.session(a, 1)
    };
    // Closing `first` handed x to `second` (its wait became the tenant's one hold)
    // and freed a session slot.
    let usage = tenants.harness.machine.tenant_by_name("alpha").unwrap().1.usage;
    assert_eq!((usage.sessions, usage.holds, usage.waiters), (2, 1, 0));
    assert!(matches!(tenants.acquire(a, 1, third, "x", true), Response::Acquire(AcquireOutcome::Queued { .. })));
    let error = match tenants.acquire(a, 1, third, "z", true) {
        Response::Rejected(error) => error,
        other => panic!("z is free, but a new hold is over the quota: {other:?}"),
    };
    assert_eq!(metadata(&error, "quota"), Some("holds".into()));
}

#[test]
fn a_retried_add_tenant_takes_the_retrys_token_and_another_request_is_refused() {
    let mut tenants = Tenants::new();
    let request = tenants.harness.request();
    let add = |token_hash| Command::AddTenant { request, name: "alpha".into(), token_hash, quotas: Quotas::default() };
    let Response::TenantAdded { tenant } = tenants.apply(&ADMIN, add(token(1))).0 else { panic!("added") };
    // The answer was lost; the retry made another token, which replaces the first.
    assert_eq!(tenants.apply(&ADMIN, add(token(2))).0, Response::TenantAdded { tenant });
    let machine = &tenants.harness.machine;
    assert!(machine.tenant_by_token(&token(1)).is_none(), "the lost answer's token does not work");
    assert_eq!(machine.tenant_by_token(&token(2)).map(|(id, _)| id), Some(tenant));
    let again = Command::AddTenant {
        request: tenants.harness.request(),
        name: "alpha".into(),
        token_hash: token(3),
        quotas: Quotas::default(),
    };
    assert_eq!(tenants.refused(&ADMIN, again).kind, ErrorKind::TenantExists);
}

#[test]
fn rotating_a_token_replaces_it_and_removing_a_tenant_ends_its_sessions() {
    let mut tenants = Tenants::new();
    let a = tenants.add_tenant("alpha", Quotas::default());
    let b = tenants.add_tenant("beta", Quotas::default());
    let rotate =
        Command::RotateTenantToken { request: tenants.harness.request(), name: "alpha".into(), token_hash: token(9) };
    tenants.apply(&ADMIN, rotate);
    assert!(tenants.harness.machine.tenant_by_token(&token(b'a')).is_none(), "the old token stops working");
    assert_eq!(tenants.harness.machine.tenant_by_token(&token(9)).map(|(id, _)| id), Some(a));

    let holder = tenants.session(a, 1);
    tenants.acquire(a, 1, holder, "x", false);
    let other = tenants.session(b, 2);
    tenants.acquire(b, 2, other, "x", false);
    let remove = Command::RemoveTenant { request: tenants.harness.request(), name: "alpha".into() };
    let (response, events) = tenants.apply(&ADMIN, remove);
    assert_eq!(response, Response::TenantRemoved { tenant: a, sessions_ended: 1 });
    assert!(events.contains(&Event::SessionEnded { session: holder, expired: false }));
    let machine = &tenants.harness.machine;
    assert!(machine.session_of(holder).is_none() && machine.tenant_by_token(&token(9)).is_none());
    assert!(machine.describe_lock(b, "x").is_some(), "another tenant's lock of the same name stays");
    let unknown = Command::RemoveTenant { request: tenants.harness.request(), name: "alpha".into() };
    assert_eq!(tenants.refused(&ADMIN, unknown).kind, ErrorKind::UnknownTenant);
    let admin = Command::RemoveTenant { request: tenants.harness.request(), name: "admin".into() };
    assert_eq!(tenants.refused(&ADMIN, admin).kind, ErrorKind::UnknownTenant, "the admin namespace stays");
}

#[test]
fn a_tenant_removed_between_authentication_and_apply_is_refused_and_changes_nothing() {
    // The gRPC layer authenticates against the tenants as last applied; RemoveTenant
    // can be applied before the command it let through.
    let mut tenants = Tenants::new();
    let a = tenants.add_tenant("alpha", Quotas::default());
    let holder = tenants.session(a, 1);
    let remove = Command::RemoveTenant { request: tenants.harness.request(), name: "alpha".into() };
    tenants.apply(&ADMIN, remove);
    let caller = Caller::Tenant { tenant: a, secret: [1; 16] };
    let create = tenants.harness.create_command("late");
    assert_eq!(tenants.refused(&caller, create).kind, ErrorKind::Unauthenticated);
    let acquire = tenants.harness.acquire_command(holder, "x", false);
    assert_eq!(tenants.refused(&caller, acquire).kind, ErrorKind::Unauthenticated);
    let close = Command::CloseSession { request: tenants.harness.request(), session: holder };
    assert_eq!(tenants.refused(&caller, close).kind, ErrorKind::Unauthenticated);
}

#[test]
fn only_the_semaphores_tenant_or_the_admin_changes_its_limit() {
    let mut tenants = Tenants::new();
    let a = tenants.add_tenant("alpha", Quotas::default());
    let b = tenants.add_tenant("beta", Quotas::default());
    let holder = tenants.session(a, 1);
    let acquire = tenants.harness.sem_acquire_command(holder, "jobs", 3, false);
    tenants.apply(&Caller::Tenant { tenant: a, secret: [1; 16] }, acquire);
    let set = |tenants: &mut Tenants, session: SessionId, limit: u32, tenant: Option<TenantId>| Command::SemSetLimit {
        request: tenants.harness.request(),
        session,
        name: "jobs".into(),
        limit,
        tenant,
    };

    // Beta's session, naming alpha's semaphore: refused; without naming it, beta's
    // own "jobs" is unused.
    let intruder = tenants.session(b, 2);
    let beta = Caller::Tenant { tenant: b, secret: [2; 16] };
    let command = set(&mut tenants, intruder, 1, Some(a));
    assert_eq!(tenants.refused(&beta, command).kind, ErrorKind::PermissionDenied);
    let command = set(&mut tenants, intruder, 1, None);
    assert_eq!(tenants.refused(&beta, command).kind, ErrorKind::InvalidArgument);

    // The admin, with a session of its own, names alpha's semaphore.
    let admin_session = {
        let command = tenants.harness.create_command("operator");
        match tenants.apply(&ADMIN, command).0 {
            Response::SessionCreated { session, .. } => session,
            other => panic!("{other:?}"),
        }
    };
    let command = set(&mut tenants, admin_session, 5, Some(a));
    assert_eq!(tenants.apply(&ADMIN, command).0, Response::SemLimitSet { limit: 5, previous: 3 });
    let command = set(&mut tenants, holder, 4, Some(a));
    let alpha = Caller::Tenant { tenant: a, secret: [1; 16] };
    assert_eq!(tenants.apply(&alpha, command).0, Response::SemLimitSet { limit: 4, previous: 5 });
    assert_eq!(tenants.harness.machine.describe_semaphore(a, "jobs").map(|view| view.limit), Some(4));
}

#[test]
fn setting_some_quotas_keeps_the_others_and_lowering_one_takes_nothing_away() {
    let mut tenants = Tenants::new();
    let a = tenants.add_tenant("alpha", Quotas { sessions: 5, holds: 50, waiters: 500 });
    let first = tenants.session(a, 1);
    let second = tenants.session(a, 1);
    let set = |tenants: &mut Tenants, quotas: QuotaChange| {
        let command = Command::SetTenantQuotas { request: tenants.harness.request(), name: "alpha".into(), quotas };
        assert_eq!(tenants.apply(&ADMIN, command).0, Response::TenantQuotasSet { tenant: a });
        tenants.harness.machine.tenant_by_name("alpha").unwrap().1.quotas
    };
    // Two admins, each changing one quota: neither undoes the other.
    set(&mut tenants, QuotaChange { holds: Some(7), ..QuotaChange::default() });
    let quotas = set(&mut tenants, QuotaChange { waiters: Some(9), ..QuotaChange::default() });
    assert_eq!(quotas, Quotas { sessions: 5, holds: 7, waiters: 9 });
    // Below the usage: both sessions stay, a third is refused.
    set(&mut tenants, QuotaChange { sessions: Some(1), ..QuotaChange::default() });
    let machine = &tenants.harness.machine;
    assert!(machine.session_of(first).is_some() && machine.session_of(second).is_some());
    let create = tenants.harness.create_command("third");
    let error = tenants.refused(&Caller::Tenant { tenant: a, secret: [1; 16] }, create);
    assert_eq!(error.kind, ErrorKind::QuotaExceeded);
    let unknown = Command::SetTenantQuotas {
        request: tenants.harness.request(),
        name: "gamma".into(),
        quotas: QuotaChange { sessions: Some(1), ..QuotaChange::default() },
    };
    assert_eq!(tenants.refused(&ADMIN, unknown).kind, ErrorKind::UnknownTenant);
}

#[test]
fn a_retried_create_session_takes_the_retrys_secret_unless_another_tenant_retries() {
    let mut tenants = Tenants::new();
    let a = tenants.add_tenant("alpha", Quotas::default());
    let b = tenants.add_tenant("beta", Quotas::default());
    let create = tenants.harness.create_command("worker");
    let Response::SessionCreated { session, .. } =
        tenants.apply(&Caller::Tenant { tenant: a, secret: [1; 16] }, create.clone()).0
    else {
        panic!("created")
    };
    let retried = tenants.apply(&Caller::Tenant { tenant: a, secret: [2; 16] }, create.clone()).0;
    assert!(matches!(retried, Response::SessionCreated { session: again, .. } if again == session));
    assert!(tenants.harness.machine.session_of(session).unwrap().has_secret(&[2; 16]));
    let stolen = tenants.refused(&Caller::Tenant { tenant: b, secret: [3; 16] }, create);
    assert_eq!(stolen.kind, ErrorKind::RequestIdReused);
    assert!(tenants.harness.machine.session_of(session).unwrap().has_secret(&[2; 16]));
}

#[test]
fn tenant_names_are_dns_labels_and_admin_is_reserved() {
    let mut tenants = Tenants::new();
    for bad in ["", "Upper", "has space", "-edge", "edge-", "a.b", "admin", &"x".repeat(64)] {
        let command = Command::AddTenant {
            request: tenants.harness.request(),
            name: bad.into(),
            token_hash: token(5),
            quotas: Quotas::default(),
        };
        assert_eq!(tenants.refused(&ADMIN, command).kind, ErrorKind::InvalidArgument, "{bad:?}");
    }
}

#[test]
fn the_state_budget_counts_sessions_holds_and_names() {
    let mut tenants = Tenants::new();
    let a = tenants.add_tenant("alpha", Quotas::default());
    let (empty, _) = tenants.harness.machine.state_bytes();
    let session = tenants.session(a, 1);
    let (with_session, largest) = tenants.harness.machine.state_bytes();
    assert_eq!(with_session - empty, u64::from(crate::machine::limits::SESSION_STATE_BYTES) + "worker".len() as u64);
    assert_eq!(largest.map(|(name, _)| name), Some("alpha"));
    tenants.acquire(a, 1, session, "orders/42", false);
    let (with_lock, _) = tenants.harness.machine.state_bytes();
    assert_eq!(
        with_lock - with_session,
        u64::from(crate::machine::limits::CLAIM_STATE_BYTES) + "orders/42".len() as u64
    );
    let close = Command::CloseSession { request: tenants.harness.request(), session };
    tenants.apply(&Caller::Tenant { tenant: a, secret: [1; 16] }, close);
    assert_eq!(tenants.harness.machine.state_bytes().0, empty);
}

#[test]
#[should_panic(expected = "usage is not what its sessions have")]
fn invariants_catch_a_tenant_usage_that_does_not_count_its_sessions() {
    let mut tenants = Tenants::new();
    let a = tenants.add_tenant("alpha", Quotas::default());
    let session = tenants.session(a, 1);
    tenants.acquire(a, 1, session, "x", false);
    tenants.harness.machine.tenants.get_mut(&a).unwrap().usage.holds = 0;
    tenants.harness.machine.check_invariants();
}

#[test]
#[should_panic(expected = "held by another tenant's session")]
fn invariants_catch_a_lock_in_another_tenants_namespace() {
    let mut tenants = Tenants::new();
    let a = tenants.add_tenant("alpha", Quotas::default());
    let b = tenants.add_tenant("beta", Quotas::default());
    let session = tenants.session(a, 1);
    tenants.acquire(a, 1, session, "x", false);
    let machine = &mut tenants.harness.machine;
    // A copy of alpha's lock in beta's namespace, held by alpha's session.
    let namespace = machine.namespaces[&a].clone();
    machine.namespaces.insert(b, namespace);
    machine.check_invariants();
}

// Lock-delay (see `delay`).

const DELAY_MS: u64 = 5_000;

impl Harness {
    fn acquire_with_delay(
        &mut self,
        session: SessionId,
        name: &str,
        wait: bool,
        delay_ms: u64,
    ) -> (Response, Vec<Event>) {
        let command =
            Command::AcquireWithDelay { request: self.request(), session, name: name.to_owned(), wait, delay_ms };
        self.apply(&command)
    }

    fn end_delays(&mut self, ended: &[DelayKey]) -> (Response, Vec<Event>) {
        self.apply(&Command::EndLockDelays { ended: ended.to_vec() })
    }
}

fn delay_key(kind: ResourceKind, name: &str, session: SessionId) -> DelayKey {
    DelayKey { tenant: ADMIN_TENANT, kind, name: name.to_owned(), session }
}

#[test]
fn an_expired_holders_delayed_lock_goes_to_nobody_until_the_delay_ends_then_to_the_first_waiter() {
    let mut harness = Harness::new();
    let (a, b, c, d) = (harness.create("a"), harness.create("b"), harness.create("c"), harness.create("d"));
    let token = harness.next_index();
    assert_eq!(harness.acquire_with_delay(a, "mail", true, DELAY_MS).0, granted_response(token));
    assert_eq!(harness.machine.command_level(), COMMAND_LEVEL_LOCK_DELAY, "the log used lock-delay");
    assert_eq!(harness.queue(b, "mail"), 0);
    assert_eq!(harness.queue(c, "mail"), 1);

    let expiry = harness.next_index();
    let (_, events) = harness.expire(&[a]);
    let key = delay_key(ResourceKind::Lock, "mail", a);
    assert_eq!(
        events,
        vec![released("mail", a, token), Event::DelayStarted { key: key.clone(), delay_ms: DELAY_MS }, ended(a, true)],
        "the lock is released by the expiry but handed to nobody"
    );
    let view = harness.machine.describe_lock(ADMIN_TENANT, "mail").expect("a held-back lock is described");
    assert_eq!((view.holder.session, view.holder.token), (a, token), "the expired grant is shown");
    assert_eq!(view.holder.client_name, "a", "the expired holder's name outlives its session");
    assert_eq!(view.holder.lock_delay_ms, DELAY_MS);
    assert_eq!(view.holder.held_back_until_ms, Some(stamp_ms(expiry) + DELAY_MS));
    assert_eq!(waiters(&harness, "mail"), vec![b, c], "the waiters keep their places");
    assert_eq!(harness.machine.check_fence(ADMIN_TENANT, "mail", token), FenceStatus::Superseded);
    assert_eq!(
        harness.acquire(d, "mail", false).0,
        Response::Acquire(AcquireOutcome::Busy { holder: a, token }),
        "a try-lock during the delay is refused"
    );
    assert_eq!(harness.queue(d, "mail"), 2, "a new waiter queues behind");

    let end = harness.next_index();
    let (response, events) = harness.end_delays(&[key.clone()]);
    assert_eq!(response, Response::LockDelaysEnded { ended: 1 });
    assert_eq!(events, vec![Event::DelayEnded { key: key.clone() }, granted("mail", b, end)]);
    assert_eq!(holder(&harness, "mail"), Some((b, end)), "the first waiter holds it, fenced by the ending entry");
    assert_eq!(waiters(&harness, "mail"), vec![c, d]);
    assert_eq!(harness.machine.held_back_count(), 0);

    let before = harness.machine.clone();
    let (response, events) = harness.end_delays(&[key]);
    assert_eq!(response, Response::LockDelaysEnded { ended: 0 }, "a duplicate end is harmless");
    assert!(events.is_empty());
    assert_unchanged(&before, &harness.machine);
}

#[test]
fn a_delayed_lock_with_no_waiter_is_free_when_its_delay_ends() {
    let mut harness = Harness::new();
    let a = harness.create("a");
    harness.acquire_with_delay(a, "mail", true, DELAY_MS);
    harness.expire(&[a]);
    assert_eq!(harness.machine.lock_count(), 1, "held back, not free");
    let (_, events) = harness.end_delays(&[delay_key(ResourceKind::Lock, "mail", a)]);
    assert_eq!(events, vec![Event::DelayEnded { key: delay_key(ResourceKind::Lock, "mail", a) }]);
    assert_eq!(harness.machine.lock_count(), 0);
    assert_eq!(harness.machine.describe_lock(ADMIN_TENANT, "mail"), None);
}

#[test]
fn a_release_or_a_close_hands_a_delayed_lock_on_at_once() {
    let mut harness = Harness::new();
    let (a, b, c) = (harness.create("a"), harness.create("b"), harness.create("c"));
    let token = harness.next_index();
    harness.acquire_with_delay(a, "mail", true, DELAY_MS);
    harness.queue(b, "mail");
    let handed = harness.next_index();
    let (_, events) = harness.release(a, "mail", token);
    assert_eq!(events, vec![released("mail", a, token), granted("mail", b, handed)], "no delay after a release");
    harness.acquire_with_delay(c, "mail", true, DELAY_MS);
    // b holds without a delay; c waits with one, and its wait carries it to its grant.
    let closed = harness.next_index();
    harness.close(b);
    assert_eq!(holder(&harness, "mail"), Some((c, closed)));
    assert_eq!(harness.machine.grant_delay_ms(c, ResourceKind::Lock, "mail"), DELAY_MS);
    harness.close(c);
    assert_eq!(harness.machine.lock_count(), 0, "a close ends no delay");
    assert_eq!(harness.machine.held_back_count(), 0);
}

#[test]
fn a_holder_without_a_delay_is_handed_on_at_expiry_as_before() {
    let mut harness = Harness::new();
    let (a, b) = (harness.create("a"), harness.create("b"));
    let token = harness.grant(a, "mail");
    // Asking again with a delay does not change the grant it holds.
    assert_eq!(harness.acquire_with_delay(a, "mail", true, DELAY_MS).0, granted_response(token));
    harness.queue(b, "mail");
    let handed = harness.next_index();
    harness.expire(&[a]);
    assert_eq!(holder(&harness, "mail"), Some((b, handed)));
}

#[test]
fn a_delayed_permit_counts_against_the_limit_until_its_delay_ends() {
    let mut harness = Harness::new();
    let (a, b, c) = (harness.create("a"), harness.create("b"), harness.create("c"));
    let token = harness.next_index();
    let command = Command::SemAcquireWithDelay {
        request: harness.request(),
        session: a,
        name: "jobs".to_owned(),
        limit: 2,
        wait: true,
        delay_ms: DELAY_MS,
    };
    assert_eq!(harness.apply(&command).0, Response::SemAcquire(AcquireOutcome::Granted { token }));
    harness.permit(b, "jobs", 2);
    assert_eq!(harness.sem_queue(c, "jobs", 2), 0);
    harness.expire(&[a]);
    assert_eq!(sem_holders(&harness, "jobs").len(), 2, "the expired permit still counts");
    assert_eq!(sem_waiters(&harness, "jobs"), vec![c], "so the waiter waits");
    assert_eq!(
        harness.machine.check_fence_of(ResourceKind::Semaphore, ADMIN_TENANT, "jobs", token),
        FenceStatus::Superseded
    );
    let end = harness.next_index();
    let key = delay_key(ResourceKind::Semaphore, "jobs", a);
    let (_, events) = harness.end_delays(&[key.clone()]);
    assert_eq!(events, vec![Event::DelayEnded { key }, sem_granted("jobs", c, end)]);
    assert!(sem_waiters(&harness, "jobs").is_empty());
}

#[test]
fn a_lock_delay_out_of_range_is_refused_and_changes_nothing() {
    let mut harness = Harness::new();
    let a = harness.create("a");
    for delay_ms in [0, LOCK_DELAY_MS_MAX + 1] {
        let command = Command::AcquireWithDelay {
            request: harness.request(),
            session: a,
            name: "mail".to_owned(),
            wait: true,
            delay_ms,
        };
        let error = harness.reject(&command);
        assert_eq!(error.kind, ErrorKind::InvalidArgument);
        assert!(error.message.contains("LOCK_DELAY_MS_MAX"), "{}", error.message);
    }
    let too_many = vec![delay_key(ResourceKind::Lock, "mail", a); LOCK_DELAYS_ENDED_PER_COMMAND_MAX + 1];
    assert_eq!(harness.reject(&Command::EndLockDelays { ended: too_many }).kind, ErrorKind::LimitExceeded);
}

#[test]
fn a_snapshot_in_the_middle_of_a_delay_restores_it_and_the_delay_ends_after_the_restore() {
    let mut harness = Harness::new();
    let (a, b) = (harness.create("a"), harness.create("b"));
    harness.acquire_with_delay(a, "mail", true, DELAY_MS);
    harness.queue(b, "mail");
    harness.expire(&[a]);
    let bytes = harness.machine.snapshot_into(Vec::new());
    let restored = StateMachine::from_snapshot(&bytes).expect("the snapshot decodes");
    restored.check_invariants();
    assert_eq!(restored, harness.machine, "the held-back lock and its waiter are in the snapshot");
    assert_eq!(restored.held_back().count(), 1);
    harness.machine = restored;
    let end = harness.next_index();
    harness.end_delays(&[delay_key(ResourceKind::Lock, "mail", a)]);
    assert_eq!(holder(&harness, "mail"), Some((b, end)));
}

#[test]
fn the_status_listings_page_through_the_tables_and_search_them() {
    let mut harness = Harness::new();
    let worker = harness.create("payments-worker");
    let other = harness.create("report-cron");
    let tokens: Vec<Token> = (0..5).map(|n| harness.grant(worker, &format!("orders/{n}"))).collect();
    harness.queue(other, "orders/3");
    let everything = Search::new("");
    let first = list_all(0, 2, |walk| harness.machine.list_locks(&everything, walk, 2));
    assert_eq!((first.total, first.matched), (5, 5));
    assert_eq!(first.rows.iter().map(|row| row.view.name.as_str()).collect::<Vec<_>>(), ["orders/0", "orders/1"]);
    assert_eq!(first.rows[0].view.holder.token, tokens[0]);
    assert_eq!(first.rows[0].tenant, ADMIN_TENANT_NAME);
    let last = list_all(4, 2, |walk| harness.machine.list_locks(&everything, walk, 2));
    assert_eq!(last.rows.iter().map(|row| row.view.name.as_str()).collect::<Vec<_>>(), ["orders/4"]);
    let searched = list_all(0, 10, |walk| harness.machine.list_locks(&Search::new("ORDERS/3"), walk, 2));
    assert_eq!((searched.total, searched.matched, searched.rows.len()), (5, 1, 1));
    assert_eq!((searched.rows[0].waiters, searched.rows[0].view.waiters[0].session), (1, other));

    let sessions = list_all(0, 10, |walk| harness.machine.list_sessions(&Search::new("cron"), walk, 2));
    assert_eq!((sessions.total, sessions.matched), (2, 1));
    assert_eq!((sessions.rows[0].id, sessions.rows[0].holds, sessions.rows[0].waits), (other, 0, 1));
    let by_id = list_all(0, 10, |walk| harness.machine.list_sessions(&Search::new(&worker.to_string()), walk, 2));
    assert_eq!(by_id.rows.iter().map(|row| (row.id, row.holds)).collect::<Vec<_>>(), [(worker, 5)]);
}

#[test]
fn a_listed_queue_is_cut_to_its_first_waiters_and_counts_the_rest() {
    let mut harness = Harness::new();
    let holder = harness.create("holder");
    harness.grant(holder, "busy");
    let waiters: Vec<SessionId> = (0..LISTED_PER_QUEUE_MAX + 3).map(|n| harness.create(&format!("w{n}"))).collect();
    for waiter in &waiters {
        harness.queue(*waiter, "busy");
    }
    let listed = list_all(0, 1, |walk| harness.machine.list_locks(&Search::new(""), walk, 2));
    let row = &listed.rows[0];
    assert_eq!(row.waiters, LISTED_PER_QUEUE_MAX + 3);
    let shown: Vec<SessionId> = row.view.waiters.iter().map(|waiter| waiter.session).collect();
    assert_eq!(shown, waiters[..LISTED_PER_QUEUE_MAX], "the first in line, in order");
}

#[test]
fn a_walk_in_steps_lists_every_tenants_locks_in_order_across_their_namespaces() {
    let mut tenants = Tenants::new();
    let alpha = tenants.add_tenant("alpha", Quotas::default());
    let beta = tenants.add_tenant("beta", Quotas::default());
    let (session_a, session_b) = (tenants.session(alpha, 1), tenants.session(beta, 2));
    for name in ["x/1", "x/2", "x/3"] {
        tenants.acquire(alpha, 1, session_a, name, false);
        tenants.acquire(beta, 2, session_b, name, false);
    }
    let machine = &tenants.harness.machine;
    let rows = |listing: Listing<InTenant<LockView>>| -> Vec<String> {
        listing.rows.into_iter().map(|row| format!("{}:{}", row.tenant, row.view.name)).collect()
    };
    let whole = ["alpha:x/1", "alpha:x/2", "alpha:x/3", "beta:x/1", "beta:x/2", "beta:x/3"];
    for rows_per_step in 1..=7 {
        let everything = Search::new("");
        assert_eq!(rows(list_all(0, 10, |walk| machine.list_locks(&everything, walk, rows_per_step))), whole);
        let searched = Search::new("x/2");
        let listing = list_all(0, 10, |walk| machine.list_locks(&searched, walk, rows_per_step));
        assert_eq!((listing.total, listing.matched), (6, 2));
        assert_eq!(rows(listing), ["alpha:x/2", "beta:x/2"], "{rows_per_step} rows per step");
        let second_page = list_all(2, 3, |walk| machine.list_locks(&everything, walk, rows_per_step));
        assert_eq!(rows(second_page), whole[2..5]);
    }
}
