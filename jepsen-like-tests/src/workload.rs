//! Workloads and the worker process that runs one (`leasehold-jepsen
//! workload-worker`). A worker is a real process using the client library; it
//! appends every operation to its own JSONL history and runs until the harness
//! writes `final` on its stdin. Then it runs the liveness phase (one acquire that
//! must succeed within a bound) and exits.
//!
//! Workloads are an enum: adding one means a variant, its keys, a `step` in the
//! worker and its checks in `checker`. The election workload's first worker is an
//! observer: it records every state of every election name instead of campaigning.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::watch;

use crate::fenced_store::remote_request;
use crate::history::{
    lock_delay_value, monotonic_ns, Function, HistoryWriter, Kind, Phase, Record, LOCK_DELAYED, NOT_ACQUIRED,
    NOT_ELECTED, NOT_HOLDER, SEMAPHORE_FULL,
};

/// What a worker does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum Workload {
    /// Acquire / hold / release locks with random waits and hold times, some longer
    /// than the TTL; each acquire asks for the run's lock-delay.
    Lock,
    /// Under a lock, a read-modify-write of a list in the fenced store: a fenced
    /// read with the token, a pause, a write of the list with one more unique id.
    FencedCounter,
    /// Acquire a permit of a semaphore with `SEMAPHORE_LIMIT` permits (short waits),
    /// hold it for a random time (some holds longer than the TTL), release it.
    Semaphore,
    /// Campaign for an election with the worker id as value, lead for a random time,
    /// sometimes proclaim a new value, resign; one worker observes every state.
    Election,
    /// One worker acting as a second tenant, "intruder", that keeps trying to get in
    /// without a credential, to act as the admin, to use other tenants' sessions, to
    /// read their state and to talk Raft on the peer port (see `attack`). Every try
    /// must be refused.
    Attack,
    /// One worker acting as a third tenant, "flood", held to a rate quota, that keeps
    /// many requests in flight (lock cycles of its own names, closes of a gone
    /// session); the other workloads' releases must stay fast beside it (see `flood`).
    /// Not in `all`: asked for by name.
    Flood,
}

impl Workload {
    pub fn name(self) -> &'static str {
        match self {
            Workload::Lock => "lock",
            Workload::FencedCounter => "fenced-counter",
            Workload::Semaphore => "semaphore",
            Workload::Election => "election",
            Workload::Attack => "attack",
            Workload::Flood => "flood",
        }
    }

    /// Whether the workload's keys are locks (described after a full restart for
    /// check (e), checked for linearizability).
    pub fn uses_locks(self) -> bool {
        matches!(self, Workload::Lock | Workload::FencedCounter)
    }

    /// The lock names (and for the counter, the store resources) the workload uses.
    pub fn keys(self) -> Vec<String> {
        match self {
            Workload::Lock => (0..LOCK_KEYS).map(|index| format!("lock/{index}")).collect(),
            Workload::FencedCounter => (0..COUNTER_KEYS).map(|index| format!("counter/{index}")).collect(),
            Workload::Semaphore => (0..SEMAPHORE_KEYS).map(|index| format!("semaphore/{index}")).collect(),
            Workload::Election => (0..ELECTION_KEYS).map(|index| format!("election/{index}")).collect(),
            // They use names of their own tenants only (see `attack` and `flood`).
            Workload::Attack | Workload::Flood => Vec::new(),
        }
    }

    /// Whether the workload's acquires ask for the run's lock-delay. The lock
    /// workload stands for side effects no token can fence, which is what a
    /// lock-delay is for; the fenced counter's writes are fenced and need none, so
    /// its keys keep checking the handover without one.
    pub fn asks_for_lock_delay(self) -> bool {
        matches!(self, Workload::Lock)
    }

    /// Worker processes the workload runs.
    pub fn workers(self) -> u64 {
        match self {
            Workload::Lock => LOCK_WORKERS,
            Workload::FencedCounter => COUNTER_WORKERS,
            Workload::Semaphore => SEMAPHORE_WORKERS,
            Workload::Election => ELECTION_WORKERS,
            Workload::Attack => ATTACK_WORKERS,
            Workload::Flood => 1,
        }
    }
}

pub const LOCK_KEYS: usize = 2;
pub const COUNTER_KEYS: usize = 2;
pub const LOCK_WORKERS: u64 = 5;
pub const COUNTER_WORKERS: u64 = 4;
pub const SEMAPHORE_KEYS: usize = 2;
/// K: permits per semaphore name. With `SEMAPHORE_WORKERS` > K on few names the
/// limit is contended.
pub const SEMAPHORE_LIMIT: u32 = 2;
pub const SEMAPHORE_WORKERS: u64 = 5;
pub const ELECTION_KEYS: usize = 2;
/// The intruder: one process tries every attack in turn.
pub const ATTACK_WORKERS: u64 = 1;
/// Campaigners plus the one observer.
pub const ELECTION_WORKERS: u64 = 4;
/// Longest wait of a semaphore acquire or a campaign ("a short wait").
pub const SHORT_WAIT_MS_MAX: u64 = 500;
/// One leadership in `PROCLAIM_ONE_IN` announces a new value halfway through.
pub const PROCLAIM_ONE_IN: u32 = 3;
/// Longest wait of a blocking acquire.
pub const ACQUIRE_WAIT_MS_MAX: u64 = 2_000;
/// Usual hold time range; one hold in `LONG_HOLD_ONE_IN` lasts 1.5 TTLs.
pub const HOLD_MS_MAX: u64 = 200;
pub const LONG_HOLD_ONE_IN: u32 = 25;
/// Pause between the fenced read and the write of an increment: the window in
/// which a paused holder is superseded.
pub const INCREMENT_THINK_MS_MAX: u64 = 400;
/// How long a request retries across leader changes before it is indeterminate.
pub const REQUEST_DEADLINE_MS: u64 = 5_000;
/// Pause after an operation that could not reach the cluster.
pub const BACKOFF_MS: u64 = 100;
/// The liveness phase's acquire waits at most this long.
pub const LIVENESS_BOUND_MS_DEFAULT: u64 = 30_000;
/// The lock-delay of the lock workload's acquires: longer than the timing noise of
/// a handover (so that a cluster that ignores it fails check (j) by a second, not by
/// a few milliseconds), and short next to the pauses that cause it (1.5–2 TTLs), so
/// that a key stays blocked a little longer after an expiry and the throughput
/// barely changes.
pub const LOCK_DELAY_MS_DEFAULT: u64 = 1_500;
/// The longest lock-delay the cluster accepts (the server's `LOCK_DELAY_MS_MAX`, as
/// `Session::acquire_with_delay` documents it).
pub const LOCK_DELAY_MS_MAX: u64 = 60_000;

#[derive(Debug, Clone, clap::Args)]
pub struct WorkloadWorkerArguments {
    /// Client addresses of the cluster, comma-separated.
    #[arg(long)]
    pub endpoints: String,
    /// This worker's process number in the history.
    #[arg(long)]
    pub process: u64,
    #[arg(long, value_enum)]
    pub workload: Workload,
    /// The seed of this worker's random choices (derived from the run's seed).
    #[arg(long)]
    pub seed: u64,
    #[arg(long, default_value_t = 3_000)]
    pub ttl_ms: u64,
    /// The fenced store (fenced-counter workload).
    #[arg(long)]
    pub store: Option<SocketAddr>,
    /// Where to append the history.
    #[arg(long)]
    pub history: PathBuf,
    #[arg(long, default_value_t = LIVENESS_BOUND_MS_DEFAULT)]
    pub liveness_bound_ms: u64,
    /// Election workload: observe every election name instead of campaigning.
    #[arg(long)]
    pub observer: bool,
    /// Attack workload: the nodes' peer addresses, `ID=ADDRESS` comma-separated (an
    /// attacker on the network finds them by scanning; a tenant's Status does not
    /// list them).
    #[arg(long)]
    pub peer_endpoints: Option<String>,
    /// Attack workload: the nodes' metrics and status page addresses (host:port),
    /// comma-separated.
    #[arg(long)]
    pub metrics_endpoints: Option<String>,
    #[arg(long)]
    pub status_endpoints: Option<String>,
    /// Attack workload: a file holding the current token of tenant `stolen`, as a
    /// leak would give it; the harness rotates that token every few seconds.
    #[arg(long)]
    pub stolen_token_file: Option<PathBuf>,
    /// Attack workload: a client certificate the cluster CA signed for the intruder
    /// tenant (not a node), presented on the peer port.
    #[arg(long)]
    pub tenant_certificate: Option<PathBuf>,
    #[arg(long)]
    pub tenant_key: Option<PathBuf>,
    /// Attack workload: a directory of node certificates the cluster CA signed
    /// (`node-<id>.pem` and `.key`): every member's and one for a node id that is never
    /// a member, as a stolen node key would give them.
    #[arg(long)]
    pub node_certificates: Option<PathBuf>,
    /// Attack workload: some nodes run an older release (a rolling upgrade), which
    /// predates the peer port's membership checks and `Admin.EndSession`: the attacks
    /// that need them (`Attack::needs_this_release`) are left out.
    #[arg(long)]
    pub older_release_nodes: bool,
    /// Attack workload: the directory of the other workers' histories, read for
    /// session ids and tokens (a leak of ids, which are no secret).
    #[arg(long)]
    pub leak_from: Option<PathBuf>,
    /// The lock-delay each acquire of a workload that asks for one
    /// (`Workload::asks_for_lock_delay`) asks for; 0 asks for none.
    #[arg(long, default_value_t = 0)]
    pub lock_delay_ms: u64,
    /// The control of check (j): the lock-delay is recorded in the history but not
    /// asked of the cluster, so a stopped holder's lock is handed on at once.
    #[arg(long)]
    pub unrequested_lock_delay: bool,
}

struct Worker {
    arguments: WorkloadWorkerArguments,
    client: leasehold::Client,
    history: HistoryWriter,
    random: StdRng,
    sequence: u64,
    session: Option<leasehold::Session>,
    phase: Phase,
}

/// The marker of the server's refusal of a retry whose command differs from the
/// first attempt's (see `Worker::acquire`).
pub const REUSED_REQUEST_ID: &str = "was already used for a different command";

fn is_reused_request_id(error: &leasehold::Error) -> bool {
    matches!(error, leasehold::Error::Refused(message) if message.contains(REUSED_REQUEST_ID))
}

/// How an error of the client library enters the history. A wait that ends with its
/// session lost may have been granted just before the session ended: info, not fail.
pub fn outcome_of(error: &leasehold::Error) -> Kind {
    if error.is_definite() && !matches!(error, leasehold::Error::SessionLost(_)) {
        Kind::Fail
    } else {
        Kind::Info
    }
}

/// How a failed release (or resign) enters the history: refused because the grant is
/// no longer the holder's (`NOT_HOLDER`), else as `outcome_of` says, with the error.
pub fn release_outcome(error: &leasehold::Error) -> (Kind, String) {
    let refused = matches!(
        error,
        leasehold::Error::Refused(_) | leasehold::Error::NotFound(_) | leasehold::Error::SessionLost(_)
    );
    if refused {
        (Kind::Fail, NOT_HOLDER.to_string())
    } else {
        (outcome_of(error), error.to_string())
    }
}

impl Worker {
    #[allow(clippy::too_many_arguments)]
    fn record(
        &mut self,
        sequence: u64,
        kind: Kind,
        function: Function,
        key: &str,
        token: Option<u64>,
        value: Option<String>,
        error: Option<String>,
    ) {
        let session = self.session.as_ref().map(|session| session.id()).unwrap_or(0);
        self.record_in(session, sequence, kind, function, key, token, value, error);
    }

    #[allow(clippy::too_many_arguments)]
    fn record_in(
        &mut self,
        session: u64,
        sequence: u64,
        kind: Kind,
        function: Function,
        key: &str,
        token: Option<u64>,
        value: Option<String>,
        error: Option<String>,
    ) {
        let record = Record {
            process: self.arguments.process,
            sequence,
            kind,
            function,
            key: key.to_string(),
            session,
            token,
            value,
            error,
            alive_ns: None,
            leader_session: None,
            evidence: None,
            phase: self.phase,
            time_ns: monotonic_ns(),
        };
        self.write(record);
    }

    /// Appends a record built by the caller (for the fields `record_in` leaves out).
    fn write(&mut self, record: Record) {
        if let Err(error) = self.history.append(&record) {
            // Without its history the run means nothing: stop loudly.
            panic!("cannot append to the history: {error}");
        }
    }

    fn invoke(&mut self, function: Function, key: &str, token: Option<u64>, value: Option<String>) -> u64 {
        self.sequence += 1;
        let sequence = self.sequence;
        self.record(sequence, Kind::Invoke, function, key, token, value, None);
        sequence
    }

    /// A session that is not lost, creating one if needed.
    async fn ensure_session(&mut self) -> bool {
        if let Some(session) = &self.session {
            if session.state() != leasehold::SessionState::Lost {
                return true;
            }
            self.session = None;
        }
        let sequence = self.invoke(Function::Session, "", None, None);
        match self.client.session(Duration::from_millis(self.arguments.ttl_ms)).await {
            Ok(session) => {
                self.session = Some(session);
                self.record(sequence, Kind::Ok, Function::Session, "", None, None, None);
                true
            }
            Err(error) => {
                self.record(sequence, outcome_of(&error), Function::Session, "", None, None, Some(error.to_string()));
                tokio::time::sleep(Duration::from_millis(BACKOFF_MS)).await;
                false
            }
        }
    }

    /// Drops the session after an indeterminate acquire: whether it holds the lock
    /// is unknown, so the worker continues under a new session (the old one is
    /// closed in the background, or expires).
    fn abandon_session(&mut self) {
        self.session = None;
    }

    /// The lock-delay this worker's acquires carry (None: the cluster's default, which
    /// the suite leaves at none).
    fn lock_delay(&self) -> Option<Duration> {
        let delay_ms = self.arguments.lock_delay_ms;
        (self.arguments.workload.asks_for_lock_delay() && delay_ms > 0).then(|| Duration::from_millis(delay_ms))
    }

    /// Acquires `key` with this worker's lock-delay; the guard when granted.
    async fn acquire(&mut self, key: &str, wait: Duration) -> Option<leasehold::LockGuard> {
        let session = self.session.clone().expect("a session");
        let lock_delay = self.lock_delay();
        // The invoke says what the grant carries; the control records it without
        // asking for it.
        let asked = lock_delay.filter(|_| !self.arguments.unrequested_lock_delay);
        let value = lock_delay.map(|delay| lock_delay_value(delay.as_millis() as u64));
        let sequence = self.invoke(Function::Acquire, key, None, value);
        match session.acquire_with_delay(key, wait, asked).await {
            Ok(leasehold::Acquired::Granted(guard)) => {
                let token = guard.token();
                self.record(sequence, Kind::Ok, Function::Acquire, key, Some(token), None, None);
                Some(guard)
            }
            Ok(leasehold::Acquired::NotAcquired(not_acquired)) => {
                // In a lock-delay the holder fields name the expired grant, which
                // holds nothing: a refusal of its own kind.
                let error = if not_acquired.delay_until_unix_ms.is_some() { LOCK_DELAYED } else { NOT_ACQUIRED };
                self.record(
                    sequence,
                    Kind::Fail,
                    Function::Acquire,
                    key,
                    None,
                    Some(format!("holder-token={}", not_acquired.holder_token)),
                    Some(error.into()),
                );
                None
            }
            Err(error) => {
                let mut outcome = outcome_of(&error);
                if is_reused_request_id(&error) {
                    // The client retried with the same request id but a changed
                    // command (a shorter wait); the server refused the retry, yet
                    // the first attempt may have been applied (queued, then
                    // granted). Not a definite failure, whatever the client says.
                    outcome = Kind::Info;
                }
                self.record(sequence, outcome, Function::Acquire, key, None, None, Some(error.to_string()));
                if outcome == Kind::Info {
                    self.abandon_session();
                } else {
                    tokio::time::sleep(Duration::from_millis(BACKOFF_MS)).await;
                }
                None
            }
        }
    }

    /// Releases a grant (compare-and-release on its token), recorded under the
    /// guard's session.
    async fn release(&mut self, guard: leasehold::LockGuard) {
        let key = guard.name().to_string();
        let key = key.as_str();
        let token = guard.token();
        let session = guard.session().id();
        // With the session's last answered keepalive: until when this worker believed
        // it held the lock (see `checker::believed_at_once`) and when its holder was
        // last alive (see `checker::dead_holders`).
        let sequence = self.invoke_ending(Function::Release, guard.session(), key, token);
        let result = guard.release().await;
        match result {
            Ok(()) => self.record_in(session, sequence, Kind::Ok, Function::Release, key, Some(token), None, None),
            Err(error) => {
                let (kind, reason) = release_outcome(&error);
                self.record_in(session, sequence, kind, Function::Release, key, Some(token), None, Some(reason));
            }
        }
    }

    /// The fenced read-modify-write: appends a unique id to the list under `key`.
    async fn increment(&mut self, key: &str, token: u64) {
        let store = self.arguments.store.expect("the fenced-counter workload needs --store");
        let id = format!("{}.{}", self.arguments.process, self.sequence + 1);
        let sequence = self.invoke(Function::Increment, key, Some(token), Some(id.clone()));
        let read = remote_request(store, &format!("FREAD {key} {token}")).await;
        let list = match read {
            Ok(answer) if answer == "EMPTY" => String::new(),
            Ok(answer) if answer.starts_with("VALUE ") => answer.splitn(3, ' ').nth(2).unwrap_or_default().to_string(),
            Ok(answer) => {
                // Refused before anything was written: certainly not applied.
                self.record(sequence, Kind::Fail, Function::Increment, key, Some(token), Some(id), Some(answer));
                return;
            }
            Err(error) => {
                self.record(
                    sequence,
                    Kind::Fail,
                    Function::Increment,
                    key,
                    Some(token),
                    Some(id),
                    Some(format!("read: {error}")),
                );
                return;
            }
        };
        let think = self.random.random_range(0..=INCREMENT_THINK_MS_MAX);
        tokio::time::sleep(Duration::from_millis(think)).await;
        let written = if list.is_empty() { id.clone() } else { format!("{list},{id}") };
        match remote_request(store, &format!("WRITE {key} {token} {written}")).await {
            Ok(answer) if answer == "ACCEPTED" => {
                self.record(sequence, Kind::Ok, Function::Increment, key, Some(token), Some(id), None)
            }
            Ok(answer) if answer.starts_with("REJECTED") => {
                self.record(sequence, Kind::Fail, Function::Increment, key, Some(token), Some(id), Some(answer))
            }
            Ok(answer) => {
                self.record(sequence, Kind::Info, Function::Increment, key, Some(token), Some(id), Some(answer))
            }
            Err(error) => self.record(
                sequence,
                Kind::Info,
                Function::Increment,
                key,
                Some(token),
                Some(id),
                Some(error.to_string()),
            ),
        }
    }

    /// Records the invoke of a release or resign, with the send time of the
    /// session's last answered keepalive (see `Record::alive_ns`).
    fn invoke_ending(&mut self, function: Function, session: &leasehold::Session, key: &str, token: u64) -> u64 {
        self.sequence += 1;
        let sequence = self.sequence;
        let record = Record {
            process: self.arguments.process,
            sequence,
            kind: Kind::Invoke,
            function,
            key: key.to_string(),
            session: session.id(),
            token: Some(token),
            value: None,
            error: None,
            alive_ns: Some(last_answered_keepalive_ns(session)),
            leader_session: None,
            evidence: None,
            phase: self.phase,
            time_ns: monotonic_ns(),
        };
        self.write(record);
        sequence
    }

    /// Records the outcome of a release or resign; a refusal means the grant was
    /// not (any more) this session's. After an indeterminate one the session is
    /// abandoned: whether it still holds the grant is unknown.
    fn record_ending(
        &mut self,
        session: u64,
        sequence: u64,
        function: Function,
        key: &str,
        token: u64,
        result: leasehold::Result<()>,
    ) {
        match result {
            Ok(()) => self.record_in(session, sequence, Kind::Ok, function, key, Some(token), None, None),
            Err(error) => {
                let (kind, reason) = release_outcome(&error);
                self.record_in(session, sequence, kind, function, key, Some(token), None, Some(reason));
                if kind == Kind::Info && self.session.as_ref().is_some_and(|current| current.id() == session) {
                    self.abandon_session();
                }
            }
        }
    }

    /// Records a failed or indeterminate acquire or campaign; after an
    /// indeterminate one the session is abandoned (it may hold the grant).
    async fn record_grant_error(&mut self, sequence: u64, function: Function, key: &str, error: leasehold::Error) {
        let mut outcome = outcome_of(&error);
        if is_reused_request_id(&error) {
            // As in `acquire`: the first attempt may have been applied.
            outcome = Kind::Info;
        }
        self.record(sequence, outcome, function, key, None, None, Some(error.to_string()));
        if outcome == Kind::Info {
            self.abandon_session();
        } else {
            tokio::time::sleep(Duration::from_millis(BACKOFF_MS)).await;
        }
    }

    /// One semaphore round: acquire a permit of `key` waiting at most `wait`, hold
    /// it `hold_ms`, release it. Whether a permit was granted.
    async fn semaphore_round(&mut self, key: &str, wait: Duration, hold_ms: u64) -> bool {
        let session = self.session.clone().expect("a session");
        let sequence = self.invoke(Function::SemAcquire, key, None, None);
        match session.semaphore(key, SEMAPHORE_LIMIT).acquire_within(wait).await {
            Ok(Ok(permit)) => {
                let token = permit.token();
                self.record(sequence, Kind::Ok, Function::SemAcquire, key, Some(token), None, None);
                tokio::time::sleep(Duration::from_millis(hold_ms)).await;
                let sequence = self.invoke_ending(Function::SemRelease, &session, key, token);
                let result = permit.release().await;
                self.record_ending(session.id(), sequence, Function::SemRelease, key, token, result);
                true
            }
            Ok(Err(full)) => {
                self.record(
                    sequence,
                    Kind::Fail,
                    Function::SemAcquire,
                    key,
                    None,
                    Some(format!("holders={} limit={}", full.holders, full.limit)),
                    Some(SEMAPHORE_FULL.into()),
                );
                false
            }
            Err(error) => {
                self.record_grant_error(sequence, Function::SemAcquire, key, error).await;
                false
            }
        }
    }

    /// One election round: campaign for `key` with this worker's id as value,
    /// waiting at most `wait`; lead `hold_ms` (proclaiming a new value halfway when
    /// `proclaim`), resign. Whether the campaign won.
    async fn election_round(&mut self, key: &str, wait: Duration, hold_ms: u64, proclaim: bool) -> bool {
        let session = self.session.clone().expect("a session");
        let value = self.arguments.process.to_string();
        let sequence = self.invoke(Function::Campaign, key, None, Some(value.clone()));
        match session.campaign_within(key, &value, wait).await {
            Ok(Ok(leadership)) => {
                let token = leadership.token();
                self.record(sequence, Kind::Ok, Function::Campaign, key, Some(token), Some(value.clone()), None);
                tokio::time::sleep(Duration::from_millis(hold_ms / 2)).await;
                if proclaim {
                    let announced = format!("{value}.{}", self.sequence + 1);
                    let sequence = self.invoke(Function::Proclaim, key, Some(token), Some(announced.clone()));
                    match leadership.proclaim(&announced).await {
                        Ok(()) => {
                            self.record(sequence, Kind::Ok, Function::Proclaim, key, Some(token), Some(announced), None)
                        }
                        Err(error) => self.record(
                            sequence,
                            outcome_of(&error),
                            Function::Proclaim,
                            key,
                            Some(token),
                            Some(announced),
                            Some(error.to_string()),
                        ),
                    }
                }
                tokio::time::sleep(Duration::from_millis(hold_ms - hold_ms / 2)).await;
                let sequence = self.invoke_ending(Function::Resign, &session, key, token);
                let result = leadership.resign().await;
                self.record_ending(session.id(), sequence, Function::Resign, key, token, result);
                true
            }
            Ok(Err(leader)) => {
                let holder = leader.map(|leader| format!("leader-token={}", leader.token));
                self.record(
                    sequence,
                    Kind::Fail,
                    Function::Campaign,
                    key,
                    None,
                    Some(holder.unwrap_or_else(|| "vacant".into())),
                    Some(NOT_ELECTED.into()),
                );
                false
            }
            Err(error) => {
                self.record_grant_error(sequence, Function::Campaign, key, error).await;
                false
            }
        }
    }

    /// The observer: records every state of every election name, in the order
    /// each stream delivers them, until the harness says `final`.
    async fn observe(&mut self, final_signal: &mut watch::Receiver<bool>) {
        let streams = Workload::Election.keys().into_iter().map(|key| {
            let stream = self.client.observe(&key);
            futures::StreamExt::map(stream, move |state| (key.clone(), state))
        });
        let mut states = futures::stream::select_all(streams);
        loop {
            tokio::select! {
                _ = final_signal.wait_for(|done| *done) => break,
                next = futures::StreamExt::next(&mut states) => {
                    let Some((key, state)) = next else { break };
                    // A stream error is no state: the stream reconnects by itself.
                    let Ok(state) = state else { continue };
                    self.sequence += 1;
                    let mut record = Record {
                        process: self.arguments.process,
                        sequence: self.sequence,
                        kind: Kind::Invoke,
                        function: Function::Observe,
                        key,
                        session: 0,
                        token: state.as_ref().map(|leader| leader.token),
                        value: state.as_ref().map(|leader| leader.value.clone()),
                        error: None,
                        alive_ns: None,
                        leader_session: state.as_ref().map(|leader| leader.session_id),
                        evidence: None,
                        phase: self.phase,
                        time_ns: monotonic_ns(),
                    };
                    self.write(record.clone());
                    record.kind = Kind::Ok;
                    self.write(record);
                }
            }
        }
    }

    /// A hold time: usually short, one in `LONG_HOLD_ONE_IN` 1.5 TTLs.
    fn hold_ms(&mut self) -> u64 {
        if self.random.random_ratio(1, LONG_HOLD_ONE_IN) {
            self.arguments.ttl_ms * 3 / 2
        } else {
            self.random.random_range(0..=HOLD_MS_MAX)
        }
    }

    /// One round of the workload: acquire a random key, hold (and for the counter,
    /// increment), release.
    async fn step(&mut self) {
        if !self.ensure_session().await {
            return;
        }
        let keys = self.arguments.workload.keys();
        let key = keys[self.random.random_range(0..keys.len())].clone();
        match self.arguments.workload {
            Workload::Semaphore => {
                let wait_ms = self.random.random_range(0..=SHORT_WAIT_MS_MAX);
                let hold_ms = self.hold_ms();
                self.semaphore_round(&key, Duration::from_millis(wait_ms), hold_ms).await;
                return;
            }
            Workload::Election => {
                let wait_ms = self.random.random_range(0..=SHORT_WAIT_MS_MAX);
                let hold_ms = self.hold_ms();
                let proclaim = self.random.random_ratio(1, PROCLAIM_ONE_IN);
                self.election_round(&key, Duration::from_millis(wait_ms), hold_ms, proclaim).await;
                return;
            }
            Workload::Lock | Workload::FencedCounter => {}
            Workload::Attack | Workload::Flood => unreachable!("the attack and flood workloads run on their own"),
        }
        let wait_ms = if self.random.random_bool(0.3) { 0 } else { self.random.random_range(0..=ACQUIRE_WAIT_MS_MAX) };
        let Some(guard) = self.acquire(&key, Duration::from_millis(wait_ms)).await else {
            return;
        };
        let token = guard.token();
        let hold_ms = self.hold_ms();
        match self.arguments.workload {
            Workload::FencedCounter => {
                self.increment(&key, token).await;
                tokio::time::sleep(Duration::from_millis(hold_ms / 4)).await;
            }
            _ => tokio::time::sleep(Duration::from_millis(hold_ms)).await,
        }
        self.release(guard).await;
    }

    /// The liveness phase: a fresh session, one acquire (permit, campaign) of this
    /// worker's key that waits up to the bound, a release (resign).
    async fn final_phase(&mut self) {
        self.phase = Phase::Final;
        if let Some(session) = self.session.take() {
            let _ = tokio::time::timeout(Duration::from_secs(5), session.close()).await;
        }
        let bound = Duration::from_millis(self.arguments.liveness_bound_ms);
        let give_up = tokio::time::Instant::now() + bound;
        let keys = self.arguments.workload.keys();
        let key = keys[self.arguments.process as usize % keys.len()].clone();
        while tokio::time::Instant::now() < give_up {
            if !self.ensure_session().await {
                continue;
            }
            let left = give_up.saturating_duration_since(tokio::time::Instant::now());
            let granted = match self.arguments.workload {
                Workload::Semaphore => self.semaphore_round(&key, left, 0).await,
                Workload::Election => self.election_round(&key, left, 0, false).await,
                Workload::Lock | Workload::FencedCounter => match self.acquire(&key, left).await {
                    Some(guard) => {
                        self.release(guard).await;
                        true
                    }
                    None => false,
                },
                Workload::Attack | Workload::Flood => unreachable!("the attack and flood workloads run on their own"),
            };
            if granted {
                break;
            }
        }
        if let Some(session) = self.session.take() {
            let _ = tokio::time::timeout(Duration::from_secs(5), session.close()).await;
        }
    }
}

/// The send time of the session's last answered keepalive on CLOCK_MONOTONIC
/// (std's `Instant` reads the same clock on Linux; the offset is measured now): the
/// session's deadline less the part of a TTL the client counts on.
fn last_answered_keepalive_ns(session: &leasehold::Session) -> u64 {
    let ttl_ms = session.ttl().as_millis() as u64;
    let counted_on = Duration::from_millis(leasehold::proto::lease::client_lease_ms(ttl_ms));
    let sent = session.deadline().checked_sub(counted_on).unwrap_or_else(std::time::Instant::now);
    let now_ns = monotonic_ns();
    now_ns.saturating_sub(std::time::Instant::now().saturating_duration_since(sent).as_nanos() as u64)
}

/// Becomes true when the harness writes `final` on this process's stdin (or closes
/// it).
pub fn final_signal() -> watch::Receiver<bool> {
    let (final_sender, final_signal) = watch::channel(false);
    // A plain thread: tokio's stdin is not among the workspace's features.
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::stdin().lock().lines() {
            match line {
                Ok(line) if line.trim() != "final" => continue,
                _ => break,
            }
        }
        let _ = final_sender.send(true);
    });
    final_signal
}

/// A worker process's client settings and client: the endpoints the harness gave, the
/// rest (the tenant's credential, TLS) from the environment, every request bounded by
/// `REQUEST_DEADLINE_MS`.
pub fn worker_client(
    arguments: &WorkloadWorkerArguments,
    client_name: String,
) -> anyhow::Result<(leasehold::Settings, leasehold::Client)> {
    let settings = leasehold::Settings {
        endpoints: leasehold::parse_endpoints(&arguments.endpoints),
        ..leasehold::Settings::from_env()
    };
    let client = settings
        .client()
        .context("client settings")?
        .with_request_deadline(Duration::from_millis(REQUEST_DEADLINE_MS))
        .with_client_name(client_name);
    Ok((settings, client))
}

/// Runs one worker until the harness says `final` (or closes stdin), then the
/// liveness phase. (The attack workload's worker is `attack::run`.)
pub async fn run(arguments: WorkloadWorkerArguments) -> anyhow::Result<()> {
    let (_, client) = worker_client(&arguments, format!("worker-{}", arguments.process))?;
    let history = HistoryWriter::create(&arguments.history).context("open the history")?;
    let mut final_signal = final_signal();
    let mut worker = Worker {
        random: StdRng::seed_from_u64(arguments.seed),
        arguments,
        client,
        history,
        sequence: 0,
        session: None,
        phase: Phase::Main,
    };
    // Steps are not cancelled (a dropped guard would release behind the history's
    // back); each is bounded by its waits and the request deadline.
    if worker.arguments.observer {
        worker.observe(&mut final_signal).await;
    } else {
        while !*final_signal.borrow_and_update() {
            worker.step().await;
        }
    }
    worker.final_phase().await;
    Ok(())
}
