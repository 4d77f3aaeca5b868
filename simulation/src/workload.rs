//! Simulated workers: each a turmoil client host with the real client library, taking
//! locks on a few names, appending to a list in the fault suite's fenced store under
//! each grant (a fenced read, then a write) and releasing; and, one round in five
//! each, taking a permit of a semaphore or campaigning in an election (worker 1
//! also observes the election). All of it is recorded as the fault suite's history
//! (times are simulated nanoseconds). Now and then a worker stalls while it holds a
//! lock, as a process in a long GC pause does: cut off from every node for longer
//! than its session's TTL, then it writes what it was about to. One acquire in three
//! asks for a lock-delay. Workers run until the healed phase after the last fault
//! has lasted its time.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold_jepsen::fenced_store::FencedStore;
use leasehold_jepsen::history::{
    lock_delay_value, Function, Kind, Phase, Record, LOCK_DELAYED, NOT_ACQUIRED, NOT_ELECTED, SEMAPHORE_FULL,
};
use leasehold_jepsen::workload::{outcome_of, release_outcome, SEMAPHORE_LIMIT};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::host::{client_endpoint, node_ip, worker_ip, ADMIN_TOKEN};
use crate::network;

/// The session TTL of every worker.
pub const SESSION_TTL_MS: u64 = 2_000;
/// How long an acquire waits in the lock's queue at most.
pub const ACQUIRE_WAIT_MS: u64 = 400;
/// The names the workers contend for.
pub const KEYS: [&str; 2] = ["orders/1", "orders/2"];
/// The semaphore the workers take permits of (`SEMAPHORE_LIMIT` of them at most).
pub const SEMAPHORE: &str = "jobs";
/// The election the workers campaign in, and worker 1 observes.
pub const ELECTION: &str = "report-cron";
/// Of ten rounds, how many take a semaphore permit and how many campaign; the rest
/// take a lock.
const SEMAPHORE_ROUNDS: u64 = 2;
const ELECTION_ROUNDS: u64 = 2;
/// How long a permit or a leadership is held at most.
const HOLD_MS_MAX: u64 = 150;

/// One stall in this many grants.
pub const STALL_ONE_IN: u64 = 12;
/// How long a stall lasts: past the session's TTL and its drift allowance.
pub const STALL_MS: u64 = SESSION_TTL_MS + 1_000;
/// One acquire in this many asks for `LOCK_DELAY_MS` of lock-delay.
const LOCK_DELAY_ONE_IN: u64 = 3;
pub const LOCK_DELAY_MS: u64 = 500;

/// What every worker of a run shares: the history, the fenced store, the stalls, and
/// when the faults were healed.
#[derive(Clone)]
pub struct Shared {
    pub records: Arc<Mutex<Vec<Record>>>,
    pub store: FencedStore,
    /// Each stall: (worker, simulated ns it began, ns it ended).
    pub stalls: Arc<Mutex<Vec<(u64, u64, u64)>>>,
    /// When the last fault was healed (simulated ns; `u64::MAX` until then): the
    /// workers' final phase begins, and they stop `healed` later.
    healed_ns: Arc<AtomicU64>,
}

impl Shared {
    /// `fencing` off is the control: the store takes every write.
    pub fn new(fencing: bool) -> Shared {
        Shared {
            records: Arc::default(),
            store: FencedStore::new(fencing),
            stalls: Arc::default(),
            healed_ns: Arc::new(AtomicU64::new(u64::MAX)),
        }
    }

    /// The faults were healed at `at_ns` (simulated).
    pub fn heal(&self, at_ns: u64) {
        self.healed_ns.store(at_ns, Ordering::SeqCst);
    }

    fn healed_ns(&self) -> u64 {
        self.healed_ns.load(Ordering::SeqCst)
    }
}

pub fn now_ns() -> u64 {
    turmoil::sim_elapsed().unwrap_or_default().as_nanos() as u64
}

struct Worker {
    /// The value of the next record (an increment's id).
    value: Option<String>,
    /// The `alive_ns` of the next record (a release's invoke).
    alive_ns: Option<u64>,
    process: u64,
    sequence: u64,
    shared: Shared,
    phase: Phase,
}

impl Worker {
    #[allow(clippy::too_many_arguments)]
    fn record(
        &mut self,
        sequence: u64,
        kind: Kind,
        function: Function,
        key: &str,
        session: u64,
        token: Option<u64>,
        error: Option<String>,
    ) {
        let record = Record {
            process: self.process,
            sequence,
            kind,
            function,
            key: key.to_string(),
            session,
            token,
            value: self.value.take(),
            error,
            alive_ns: self.alive_ns.take(),
            leader_session: None,
            evidence: None,
            phase: self.phase,
            time_ns: now_ns(),
        };
        self.shared.records.lock().unwrap().push(record);
    }

    /// Records the invoke of a release or resign, with the send time of the
    /// session's last answered keepalive (see `Record::alive_ns`).
    fn invoke_ending(&mut self, function: Function, key: &str, session: &leasehold::Session, token: u64) -> u64 {
        self.alive_ns = Some(last_answered_keepalive_ns(session));
        self.invoke(function, key, session.id(), Some(token))
    }

    /// Records how a release or resign ended, and returns it.
    fn record_ending(
        &mut self,
        sequence: u64,
        function: Function,
        key: &str,
        session: u64,
        token: u64,
        result: leasehold::Result<()>,
    ) -> Kind {
        match result {
            Ok(()) => {
                self.record(sequence, Kind::Ok, function, key, session, Some(token), None);
                Kind::Ok
            }
            Err(error) => {
                let (kind, reason) = release_outcome(&error);
                self.record(sequence, kind, function, key, session, Some(token), Some(reason));
                kind
            }
        }
    }

    fn invoke(&mut self, function: Function, key: &str, session: u64, token: Option<u64>) -> u64 {
        // An operation invoked after the heal belongs to the final phase (check (g)).
        if now_ns() >= self.shared.healed_ns() {
            self.phase = Phase::Final;
        }
        self.sequence += 1;
        let sequence = self.sequence;
        self.record(sequence, Kind::Invoke, function, key, session, token, None);
        sequence
    }
}

/// One worker's life: its final phase begins when the faults are healed (`Shared::heal`,
/// at `faulty` or later) and it stops `healed` after that. No stall begins unless it
/// ends before `faulty`, so that the final phase shows whether every worker is served.
pub async fn run_worker(
    process: u64,
    nodes: u64,
    seed: u64,
    faulty: Duration,
    healed: Duration,
    shared: Shared,
) -> turmoil::Result {
    let mut random = StdRng::seed_from_u64(seed ^ (process << 40));
    let endpoints: Vec<String> = (1..=nodes).map(client_endpoint).collect();
    let client = leasehold::Client::lazy(&endpoints)?
        .with_dialer(network::dialer())
        .with_token(ADMIN_TOKEN)?
        .with_client_name(format!("worker-{process}"))
        .with_request_deadline(Duration::from_secs(3));
    if process == 1 {
        tokio::spawn(observe(client.clone(), observer_process(process), faulty + healed, shared.clone()));
    }
    let mut worker = Worker { value: None, alive_ns: None, process, sequence: 0, shared, phase: Phase::Main };
    let mut session: Option<leasehold::Session> = None;
    let elapsed = || turmoil::sim_elapsed().unwrap_or_default();
    let healed_ns = healed.as_nanos() as u64;
    while now_ns() < worker.shared.healed_ns().saturating_add(healed_ns) {
        if session.as_ref().is_none_or(|session| session.state() == leasehold::SessionState::Lost) {
            let sequence = worker.invoke(Function::Session, "", 0, None);
            match client.session(Duration::from_millis(SESSION_TTL_MS)).await {
                Ok(opened) => {
                    worker.record(sequence, Kind::Ok, Function::Session, "", opened.id(), None, None);
                    session = Some(opened);
                }
                Err(error) => {
                    worker.record(
                        sequence,
                        outcome_of(&error),
                        Function::Session,
                        "",
                        0,
                        None,
                        Some(error.to_string()),
                    );
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            }
        }
        let current = session.clone().expect("a session");
        let round = random.random_range(0..10);
        if round < SEMAPHORE_ROUNDS + ELECTION_ROUNDS {
            let lost = if round < SEMAPHORE_ROUNDS {
                semaphore_round(&mut worker, &current, &mut random).await
            } else {
                election_round(&mut worker, &current, &mut random).await
            };
            if lost {
                // Whether this session holds what it asked for is unknown.
                session = None;
            }
            continue;
        }
        let key = KEYS[random.random_range(0..KEYS.len())];
        let lock_delay = (random.random_range(0..LOCK_DELAY_ONE_IN) == 0).then_some(LOCK_DELAY_MS);
        worker.value = lock_delay.map(lock_delay_value);
        let sequence = worker.invoke(Function::Acquire, key, current.id(), None);
        let wait = Duration::from_millis(ACQUIRE_WAIT_MS);
        let guard = match current.acquire_with_delay(key, wait, lock_delay.map(Duration::from_millis)).await {
            Ok(leasehold::Acquired::Granted(guard)) => {
                worker.record(sequence, Kind::Ok, Function::Acquire, key, current.id(), Some(guard.token()), None);
                guard
            }
            Ok(leasehold::Acquired::NotAcquired(not_acquired)) => {
                // In a lock-delay the holder fields name the expired grant, which holds
                // nothing: a refusal of its own kind (checks (i) and (j) read both).
                let error = if not_acquired.delay_until_unix_ms.is_some() { LOCK_DELAYED } else { NOT_ACQUIRED };
                worker.value = Some(format!("holder-token={}", not_acquired.holder_token));
                worker.record(sequence, Kind::Fail, Function::Acquire, key, current.id(), None, Some(error.into()));
                continue;
            }
            Err(error) => {
                let outcome = outcome_of(&error);
                worker.record(sequence, outcome, Function::Acquire, key, current.id(), None, Some(error.to_string()));
                if outcome == Kind::Info {
                    // Whether this session holds the lock is unknown: go on under a new one.
                    session = None;
                } else {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                continue;
            }
        };
        // Work under the lock, now and then stalled past the lease, then the
        // increment: a fenced read and a write, which the store refuses if a newer
        // grant has read or written since.
        let token = guard.token();
        if random.random_range(0..STALL_ONE_IN) == 0 && elapsed() + Duration::from_millis(STALL_MS) < faulty {
            let began = now_ns();
            stall(process, nodes).await;
            worker.shared.stalls.lock().unwrap().push((process, began, now_ns()));
        } else {
            tokio::time::sleep(Duration::from_millis(random.random_range(0..40))).await;
        }
        increment(&mut worker, key, current.id(), token, &mut random).await;
        worker.alive_ns = Some(last_answered_keepalive_ns(&current));
        let sequence = worker.invoke(Function::Release, key, current.id(), Some(token));
        match guard.release().await {
            Ok(()) => worker.record(sequence, Kind::Ok, Function::Release, key, current.id(), Some(token), None),
            Err(error) => {
                let (kind, reason) = release_outcome(&error);
                worker.record(sequence, kind, Function::Release, key, current.id(), Some(token), Some(reason));
            }
        }
    }
    Ok(())
}

/// Takes a permit of `SEMAPHORE`, waiting a moment at most, holds it and gives it
/// back. True when an answer was lost, so that the session may hold a permit the
/// worker does not know of: the worker then goes on under a new session.
async fn semaphore_round(worker: &mut Worker, session: &leasehold::Session, random: &mut StdRng) -> bool {
    let id = session.id();
    let sequence = worker.invoke(Function::SemAcquire, SEMAPHORE, id, None);
    let wait = Duration::from_millis(random.random_range(0..=ACQUIRE_WAIT_MS));
    match session.semaphore(SEMAPHORE, SEMAPHORE_LIMIT).acquire_within(wait).await {
        Ok(Ok(permit)) => {
            let token = permit.token();
            worker.record(sequence, Kind::Ok, Function::SemAcquire, SEMAPHORE, id, Some(token), None);
            tokio::time::sleep(Duration::from_millis(random.random_range(0..=HOLD_MS_MAX))).await;
            let sequence = worker.invoke_ending(Function::SemRelease, SEMAPHORE, session, token);
            let result = permit.release().await;
            worker.record_ending(sequence, Function::SemRelease, SEMAPHORE, id, token, result) == Kind::Info
        }
        Ok(Err(full)) => {
            worker.value = Some(format!("holders={} limit={}", full.holders, full.limit));
            worker.record(sequence, Kind::Fail, Function::SemAcquire, SEMAPHORE, id, None, Some(SEMAPHORE_FULL.into()));
            false
        }
        Err(error) => {
            let outcome = outcome_of(&error);
            worker.record(sequence, outcome, Function::SemAcquire, SEMAPHORE, id, None, Some(error.to_string()));
            outcome == Kind::Info
        }
    }
}

/// Campaigns in `ELECTION` with the worker's id as its value, waiting a moment at
/// most; when elected, leads a moment (one time in three proclaiming a new value
/// halfway) and resigns. True when an answer was lost (see `semaphore_round`).
async fn election_round(worker: &mut Worker, session: &leasehold::Session, random: &mut StdRng) -> bool {
    let id = session.id();
    let value = worker.process.to_string();
    worker.value = Some(value.clone());
    let sequence = worker.invoke(Function::Campaign, ELECTION, id, None);
    let wait = Duration::from_millis(random.random_range(0..=ACQUIRE_WAIT_MS));
    match session.campaign_within(ELECTION, &value, wait).await {
        Ok(Ok(leadership)) => {
            let token = leadership.token();
            worker.value = Some(value.clone());
            worker.record(sequence, Kind::Ok, Function::Campaign, ELECTION, id, Some(token), None);
            let hold_ms = random.random_range(0..=HOLD_MS_MAX);
            tokio::time::sleep(Duration::from_millis(hold_ms / 2)).await;
            if random.random_range(0..3) == 0 {
                let announced = format!("{value}.{}", worker.sequence + 1);
                worker.value = Some(announced.clone());
                let sequence = worker.invoke(Function::Proclaim, ELECTION, id, Some(token));
                let result = leadership.proclaim(&announced).await;
                worker.value = Some(announced);
                match result {
                    Ok(()) => worker.record(sequence, Kind::Ok, Function::Proclaim, ELECTION, id, Some(token), None),
                    Err(error) => {
                        let outcome = outcome_of(&error);
                        let error = Some(error.to_string());
                        worker.record(sequence, outcome, Function::Proclaim, ELECTION, id, Some(token), error);
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(hold_ms - hold_ms / 2)).await;
            let sequence = worker.invoke_ending(Function::Resign, ELECTION, session, token);
            let result = leadership.resign().await;
            worker.record_ending(sequence, Function::Resign, ELECTION, id, token, result) == Kind::Info
        }
        Ok(Err(leader)) => {
            let holder = leader.map(|leader| format!("leader-token={}", leader.token));
            worker.value = Some(holder.unwrap_or_else(|| "vacant".into()));
            worker.record(sequence, Kind::Fail, Function::Campaign, ELECTION, id, None, Some(NOT_ELECTED.into()));
            false
        }
        Err(error) => {
            let outcome = outcome_of(&error);
            worker.record(sequence, outcome, Function::Campaign, ELECTION, id, None, Some(error.to_string()));
            outcome == Kind::Info
        }
    }
}

/// The process number of the observer that worker `process` runs beside its rounds.
pub fn observer_process(process: u64) -> u64 {
    100 + process
}

/// Records every state of `ELECTION` one observe stream delivers, in order, until
/// `stop_at` (simulated time).
pub async fn observe(client: leasehold::Client, process: u64, stop_at: Duration, shared: Shared) {
    let mut observer = Worker { value: None, alive_ns: None, process, sequence: 0, shared, phase: Phase::Main };
    let mut states = client.observe(ELECTION);
    let left = || stop_at.saturating_sub(turmoil::sim_elapsed().unwrap_or_default());
    while let Ok(Some(state)) = tokio::time::timeout(left(), futures::StreamExt::next(&mut states)).await {
        // A stream error is no state: the stream reconnects by itself.
        let Ok(state) = state else { continue };
        observer.sequence += 1;
        let mut record = Record {
            process,
            sequence: observer.sequence,
            kind: Kind::Invoke,
            function: Function::Observe,
            key: ELECTION.to_string(),
            session: 0,
            token: state.as_ref().map(|leader| leader.token),
            value: state.as_ref().map(|leader| leader.value.clone()),
            error: None,
            alive_ns: None,
            leader_session: state.as_ref().map(|leader| leader.session_id),
            evidence: None,
            phase: observer.phase,
            time_ns: now_ns(),
        };
        observer.shared.records.lock().unwrap().push(record.clone());
        record.kind = Kind::Ok;
        observer.shared.records.lock().unwrap().push(record);
    }
}

/// A process pause: this worker's host is cut off from every node for `STALL_MS`,
/// so its keepalives do not arrive and its session expires meanwhile.
async fn stall(process: u64, nodes: u64) {
    let me = worker_ip(process);
    for node in 1..=nodes {
        turmoil::partition(me, node_ip(node));
    }
    tokio::time::sleep(Duration::from_millis(STALL_MS)).await;
    for node in 1..=nodes {
        turmoil::repair(me, node_ip(node));
    }
}

/// Appends a unique id to the list under `key` with `token`: a fenced read, a pause
/// to think, the write.
async fn increment(worker: &mut Worker, key: &str, session: u64, token: u64, random: &mut StdRng) {
    let id = format!("{}.{}", worker.process, worker.sequence + 1);
    worker.value = Some(id.clone());
    let sequence = worker.invoke(Function::Increment, key, session, Some(token));
    let list = match worker.shared.store.fenced_read(key, token) {
        Ok(Some((_, list))) => list,
        Ok(None) => String::new(),
        Err(fence) => {
            worker.value = Some(id);
            let error = format!("REJECTED {fence}");
            worker.record(sequence, Kind::Fail, Function::Increment, key, session, Some(token), Some(error));
            return;
        }
    };
    tokio::time::sleep(Duration::from_millis(random.random_range(0..5))).await;
    let written = if list.is_empty() { id.clone() } else { format!("{list},{id}") };
    let result = worker.shared.store.write(key, token, &written);
    worker.value = Some(id);
    match result {
        Ok(()) => worker.record(sequence, Kind::Ok, Function::Increment, key, session, Some(token), None),
        Err(highest) => {
            let error = format!("REJECTED {highest}");
            worker.record(sequence, Kind::Fail, Function::Increment, key, session, Some(token), Some(error))
        }
    }
}

/// The simulated time at which the session's last answered keepalive was sent: its
/// conservative deadline less the part of a TTL the client counts on (see
/// `Record::alive_ns`). The deadline is on this host's tokio clock, as is `now`.
pub fn last_answered_keepalive_ns(session: &leasehold::Session) -> u64 {
    let ttl_ms = session.ttl().as_millis() as u64;
    let counted_on = Duration::from_millis(leasehold::proto::lease::client_lease_ms(ttl_ms));
    let now = tokio::time::Instant::now().into_std();
    let sent = session.deadline().checked_sub(counted_on).unwrap_or(now);
    now_ns().saturating_sub(now.saturating_duration_since(sent).as_nanos() as u64)
}
