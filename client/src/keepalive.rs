//! One keepalive stream per client serves every session of that client.
//!
//! A task owns the stream and a schedule of its sessions: each is sent a keepalive
//! `KEEPALIVES_PER_TTL` times per TTL, and its (state, deadline) is re-evaluated
//! exactly when it could change — no polling over all sessions. The deadline is
//! conservative: the send time of the last answered keepalive plus the TTL the
//! leader granted, less the clock-drift allowance and margin of
//! `leasehold_proto::lease::client_lease_ms`, so that it passes before the leader
//! could expire the session. The task starts with the first session and ends with the last,
//! so an idle client holds no task and no stream.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use tokio::time::Instant;

use leasehold_proto as pb;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;

use crate::client::{Client, RetryPause, ATTEMPT_TIMEOUT_MS, RETRY_PAUSE_MS};
use crate::session::SessionState;

/// Keepalives are sent this many times per TTL: more often than the leader's quiet
/// threshold (see `leasehold_proto::lease`), so that a live session is never
/// checkpointed.
pub use leasehold_proto::lease::KEEPALIVES_PER_TTL;
/// The session is in jeopardy when less than TTL / this is left.
pub const JEOPARDY_TTL_DIVISOR: u32 = 2;
/// Keepalive requests buffered for the stream before sends are retried later.
pub const KEEPALIVE_REQUESTS_QUEUED_MAX: usize = 4_096;

pub(crate) type StateSender = watch::Sender<(SessionState, Instant)>;

pub(crate) enum Command {
    Register { session_id: u64, secret: Vec<u8>, ttl: Duration, deadline: Instant, state: StateSender },
    Deregister { session_id: u64 },
}

struct Tracked {
    /// The session's secret, which every keepalive carries.
    secret: Vec<u8>,
    ttl: Duration,
    deadline: Instant,
    next_send: Instant,
    /// When the keepalive now in flight was sent.
    sent_at: Option<Instant>,
    /// The time this session is scheduled to be looked at again.
    wake: Instant,
    state: StateSender,
}

impl Tracked {
    fn interval(&self) -> Duration {
        self.ttl / KEEPALIVES_PER_TTL
    }

    fn evaluate(&self, now: Instant) -> SessionState {
        if now >= self.deadline {
            SessionState::Lost
        } else if self.deadline - now < self.ttl / JEOPARDY_TTL_DIVISOR {
            SessionState::Jeopardy
        } else {
            SessionState::Alive
        }
    }

    /// Publishes the state if it changed; returns it.
    fn publish(&self, now: Instant) -> SessionState {
        let value = self.evaluate(now);
        let current = *self.state.borrow();
        if current != (value, self.deadline) {
            self.state.send_replace((value, self.deadline));
        }
        value
    }

    /// The next moment anything about this session can change.
    fn next_wake(&self, now: Instant) -> Instant {
        let jeopardy_at = self.deadline.checked_sub(self.ttl / JEOPARDY_TTL_DIVISOR).unwrap_or(now);
        let mut wake = self.next_send.min(self.deadline);
        if jeopardy_at > now {
            wake = wake.min(jeopardy_at);
        }
        if let Some(sent) = self.sent_at {
            // Unanswered for a whole interval: time to try another node.
            wake = wake.min(sent + self.interval());
        }
        wake.max(now)
    }
}

/// The part of a lease of `granted_ms` (at most the session's TTL) the client counts
/// on from the moment it sent the request that got it.
pub(crate) fn counted_on(granted_ms: u64, ttl: Duration) -> Duration {
    let granted_ms = granted_ms.min(ttl.as_millis() as u64);
    Duration::from_millis(leasehold_proto::lease::client_lease_ms(granted_ms))
}

/// Hands a new session to the client's keepalive task, starting the task if needed.
pub(crate) fn register(
    client: &Client,
    session_id: u64,
    secret: Vec<u8>,
    ttl: Duration,
    deadline: Instant,
    state: StateSender,
) {
    let mut slot = client.inner.keepalives.lock().unwrap();
    let mut command = Command::Register { session_id, secret, ttl, deadline, state };
    if let Some(sender) = slot.as_ref() {
        match sender.send(command) {
            Ok(()) => return,
            Err(mpsc::error::SendError(returned)) => command = returned,
        }
    }
    let (sender, receiver) = mpsc::unbounded_channel();
    let _ = sender.send(command);
    *slot = Some(sender);
    tokio::spawn(run(client.clone(), receiver));
}

/// Stops keeping a session alive (it was closed or dropped).
pub(crate) fn deregister(client: &Client, session_id: u64) {
    if let Some(sender) = client.inner.keepalives.lock().unwrap().as_ref() {
        let _ = sender.send(Command::Deregister { session_id });
    }
}

struct Stream {
    /// The node the stream is open to.
    endpoint: String,
    requests: mpsc::Sender<pb::KeepAliveRequest>,
    answers: tonic::Streaming<pb::KeepAliveResponse>,
}

async fn open(client: &Client, endpoint: String) -> Result<Stream, tonic::Status> {
    let channel = client.channel(&endpoint).map_err(|error| tonic::Status::unavailable(error.to_string()))?;
    let (requests, outgoing) = mpsc::channel(KEEPALIVE_REQUESTS_QUEUED_MAX);
    let mut leasehold = Client::leasehold(channel);
    let opening = leasehold.keep_alive(ReceiverStream::new(outgoing));
    match tokio::time::timeout(Duration::from_millis(ATTEMPT_TIMEOUT_MS), opening).await {
        Ok(Ok(response)) => Ok(Stream { endpoint, requests, answers: response.into_inner() }),
        Ok(Err(status)) => Err(status),
        Err(_) => Err(tonic::Status::unavailable(format!("{endpoint} did not open a keepalive stream in time"))),
    }
}

struct Schedule {
    sessions: BTreeMap<u64, Tracked>,
    due: BTreeSet<(Instant, u64)>,
}

impl Schedule {
    fn reschedule(&mut self, session_id: u64, now: Instant) {
        let Some(tracked) = self.sessions.get_mut(&session_id) else { return };
        self.due.remove(&(tracked.wake, session_id));
        tracked.wake = tracked.next_wake(now);
        self.due.insert((tracked.wake, session_id));
    }

    fn remove(&mut self, session_id: u64) {
        if let Some(tracked) = self.sessions.remove(&session_id) {
            self.due.remove(&(tracked.wake, session_id));
        }
    }

    fn handle(&mut self, command: Command) {
        let now = Instant::now();
        match command {
            Command::Register { session_id, secret, ttl, deadline, state } => {
                let next_send = now + ttl / KEEPALIVES_PER_TTL;
                let tracked = Tracked { secret, ttl, deadline, next_send, sent_at: None, wake: now, state };
                self.sessions.insert(session_id, tracked);
                self.reschedule(session_id, now);
            }
            Command::Deregister { session_id } => self.remove(session_id),
        }
    }

    /// Every keepalive in flight is lost with the stream; the deadlines stay.
    fn forget_in_flight(&mut self) {
        let ids: Vec<u64> = self.sessions.keys().copied().collect();
        let now = Instant::now();
        for id in ids {
            if let Some(tracked) = self.sessions.get_mut(&id) {
                if tracked.sent_at.take().is_some() {
                    tracked.next_send = now;
                }
            }
            self.reschedule(id, now);
        }
    }
}

async fn run(client: Client, mut commands: mpsc::UnboundedReceiver<Command>) {
    let mut schedule = Schedule { sessions: BTreeMap::new(), due: BTreeSet::new() };
    let mut stream: Option<Stream> = None;
    loop {
        if schedule.sessions.is_empty() {
            stream = None;
            // Exit only if no registration is racing in: decide under the slot's lock.
            let next = {
                let mut slot = client.inner.keepalives.lock().unwrap();
                match commands.try_recv() {
                    Ok(command) => Some(command),
                    Err(_) => {
                        *slot = None;
                        None
                    }
                }
            };
            match next {
                Some(command) => {
                    schedule.handle(command);
                    continue;
                }
                None => return,
            }
        }
        if stream.is_none() {
            let endpoint = client.preferred_endpoint();
            match open(&client, endpoint.clone()).await {
                Ok(opened) => stream = Some(opened),
                Err(status) => {
                    client.follow_hint(&endpoint, &status);
                    // Keep publishing states (a session may run out meanwhile).
                    expire_due(&mut schedule, Instant::now());
                    tokio::select! {
                        command = commands.recv() => if let Some(command) = command { schedule.handle(command) },
                        _ = tokio::time::sleep(RetryPause::first()) => {}
                    }
                    continue;
                }
            }
        }
        let next_due =
            schedule.due.first().map(|(when, _)| *when).unwrap_or_else(|| Instant::now() + Duration::from_secs(1));
        let open_stream = stream.as_mut().expect("opened above");
        tokio::select! {
            command = commands.recv() => match command {
                Some(command) => schedule.handle(command),
                None => return,
            },
            answer = open_stream.answers.message() => match answer {
                Ok(Some(answer)) => {
                    let now = Instant::now();
                    if let Some(tracked) = schedule.sessions.get_mut(&answer.session_id) {
                        if !answer.alive {
                            tracked.state.send_replace((SessionState::Lost, now));
                            schedule.remove(answer.session_id);
                        } else {
                            if let Some(sent) = tracked.sent_at.take() {
                                tracked.deadline = tracked.deadline.max(sent + counted_on(answer.ttl_ms, tracked.ttl));
                            }
                            tracked.publish(now);
                            schedule.reschedule(answer.session_id, now);
                        }
                    }
                }
                Ok(None) => {
                    client.rotate(&open_stream.endpoint);
                    stream = None;
                    schedule.forget_in_flight();
                }
                Err(status) => {
                    client.follow_hint(&open_stream.endpoint, &status);
                    stream = None;
                    schedule.forget_in_flight();
                }
            },
            _ = tokio::time::sleep_until(next_due) => {
                if !process_due(&mut schedule, stream.as_ref().expect("open")) {
                    // A keepalive went unanswered for a whole interval: another node.
                    client.rotate(&stream.as_ref().expect("open").endpoint);
                    stream = None;
                    schedule.forget_in_flight();
                }
            }
        }
    }
}

/// Publishes states that changed without a stream; drops lost sessions.
fn expire_due(schedule: &mut Schedule, now: Instant) {
    let ids: Vec<u64> = schedule.sessions.keys().copied().collect();
    for id in ids {
        let lost =
            schedule.sessions.get(&id).map(|tracked| tracked.publish(now) == SessionState::Lost).unwrap_or(false);
        if lost || schedule.sessions.get(&id).is_some_and(|tracked| tracked.state.is_closed()) {
            schedule.remove(id);
        }
    }
}

/// Handles every session whose time came. Returns false when the stream looks dead.
///
/// Only the entries due when it starts are handled: a session whose next wake is
/// `now` again (its keepalive is overdue) is looked at on the next turn, after the
/// caller had a chance to reconnect, so the loop always ends.
fn process_due(schedule: &mut Schedule, stream: &Stream) -> bool {
    let now = Instant::now();
    let mut healthy = true;
    let due: Vec<(Instant, u64)> = schedule.due.iter().take_while(|(when, _)| *when <= now).copied().collect();
    for (when, id) in due {
        schedule.due.remove(&(when, id));
        let Some(tracked) = schedule.sessions.get_mut(&id) else { continue };
        if tracked.state.is_closed() || tracked.publish(now) == SessionState::Lost {
            schedule.sessions.remove(&id);
            continue;
        }
        match tracked.sent_at {
            Some(sent) if now - sent >= tracked.interval() => healthy = false,
            Some(_) => {}
            None if now >= tracked.next_send => {
                let keepalive = pb::KeepAliveRequest { session_id: id, session_secret: tracked.secret.clone() };
                match stream.requests.try_send(keepalive) {
                    Ok(()) => {
                        tracked.sent_at = Some(now);
                        tracked.next_send = now + tracked.interval();
                    }
                    Err(mpsc::error::TrySendError::Full(_)) => {
                        tracked.next_send = now + Duration::from_millis(RETRY_PAUSE_MS)
                    }
                    Err(mpsc::error::TrySendError::Closed(_)) => healthy = false,
                }
            }
            None => {}
        }
        // Never earlier than the next millisecond: an overdue session must not make
        // the task spin before it reconnects.
        tracked.wake = tracked.next_wake(now).max(now + Duration::from_millis(1));
        schedule.due.insert((tracked.wake, id));
    }
    healthy
}
