//! The history of a run: every operation a worker performed, as invoke / ok / fail /
//! info records with CLOCK_MONOTONIC timestamps (one clock for every process on the
//! machine, so real-time order between processes is exact), one JSON object a line.
//!
//! `info` means the operation may or may not have taken effect (its answer was
//! lost); a checker must allow both.

use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};

/// Nanoseconds on CLOCK_MONOTONIC, shared by every process of the machine.
pub fn monotonic_ns() -> u64 {
    let mut time = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes into the timespec we own.
    let result = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut time) };
    assert_eq!(result, 0, "CLOCK_MONOTONIC is always available");
    time.tv_sec as u64 * 1_000_000_000 + time.tv_nsec as u64
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    Invoke,
    Ok,
    Fail,
    Info,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Function {
    /// Create a session; `session` of the ok record is its id.
    Session,
    /// Acquire lock `key` in `session`; ok carries the token, a fail with error
    /// `NOT_ACQUIRED` or `LOCK_DELAYED` the holder's token. The invoke's value names
    /// the lock-delay the acquire asked for (`lock_delay_value`); none when it asked
    /// for the cluster's default, which the suite leaves at none.
    Acquire,
    /// Release lock `key` held with `token` (compare-and-release).
    Release,
    /// Append `value` (a unique id) to the list in the fenced store under `key`, by a
    /// fenced read and a write with `token`.
    Increment,
    /// Acquire a permit of semaphore `key`; ok carries the permit's token, a fail
    /// with error `SEMAPHORE_FULL` says the K permits were held.
    SemAcquire,
    /// Release the permit `token` of semaphore `key`; the invoke carries `alive_ns`.
    SemRelease,
    /// Campaign for election `key` with `value` (the worker id); ok carries the
    /// leadership's token, a fail with error `NOT_ELECTED` another leader's token.
    Campaign,
    /// The leader with `token` announces a new `value`.
    Proclaim,
    /// Give up the leadership `token`; the invoke carries `alive_ns`.
    Resign,
    /// One state of election `key` seen by an observer (invoke and ok at once):
    /// `token`, `value` and `leader_session` of the leader, all None when vacant.
    Observe,
    /// One try of the attack named `key` (see `attack::Attack`) by the intruder
    /// tenant: `value` on the invoke says what was tried. Ok means the attack
    /// succeeded (`evidence` says what came back); fail that it was refused (`error`
    /// names the refusal, `UNEXPECTED_REFUSAL` first when it is not one the attack
    /// expects); info that no answer came (a fault), which proves nothing either way.
    Attack,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Phase {
    /// While the nemesis runs.
    Main,
    /// After the final heal: the liveness check's operations.
    Final,
}

/// The error of a fail record whose acquire was answered "not acquired" (the lock
/// was held by another session): the only acquire failure that says something
/// about the lock's state.
pub const NOT_ACQUIRED: &str = "not-acquired";
/// The error of a fail record whose acquire was answered "not acquired" while the
/// lock was in the lock-delay of a holder whose session expired (the value names that
/// holder's token): nobody holds the lock and nobody may have it yet. Kept apart from
/// `NOT_ACQUIRED` because the lease-lock model of check (f) has no such state.
pub const LOCK_DELAYED: &str = "lock-delayed";
/// The error of a fail record whose release was refused because the token is not
/// the current grant (or the session is gone).
pub const NOT_HOLDER: &str = "not-holder";
/// The error of a fail record whose semaphore acquire found every permit held.
pub const SEMAPHORE_FULL: &str = "semaphore-full";
/// The error of a fail record whose campaign did not lead within its wait.
pub const NOT_ELECTED: &str = "not-elected";
/// How the value of an acquire's invoke names the lock-delay it asked for.
pub const LOCK_DELAY_PREFIX: &str = "lock-delay-ms=";

/// The value of an acquire's invoke that asked for a lock-delay of `delay_ms`.
pub fn lock_delay_value(delay_ms: u64) -> String {
    format!("{LOCK_DELAY_PREFIX}{delay_ms}")
}

/// The lock-delay an acquire's invoke value names, if it names one.
pub fn parse_lock_delay(value: &str) -> Option<u64> {
    value.strip_prefix(LOCK_DELAY_PREFIX)?.parse().ok()
}

/// How the error of a refused attack begins when the refusal is not one of those the
/// attack expects (a wrong reason, say): still refused, but worth a look.
pub const UNEXPECTED_REFUSAL: &str = "unexpected";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// The worker (one process).
    pub process: u64,
    /// The operation's number within its worker; invoke and completion share it.
    pub sequence: u64,
    #[serde(rename = "type")]
    pub kind: Kind,
    #[serde(rename = "f")]
    pub function: Function,
    /// Lock or counter name.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub key: String,
    /// The session the operation used (0 before a session exists).
    #[serde(default)]
    pub session: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// On the invoke of a release or resign: the send time (CLOCK_MONOTONIC ns) of
    /// the session's last answered keepalive. The session certainly lived until
    /// then (the leader confirms its leadership before answering), so a grant of
    /// that session was held at least that long even if the release fails.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alive_ns: Option<u64>,
    /// On an observation: the observed leader's session (None: vacant).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader_session: Option<u64>,
    /// On the ok of an attack: what the answer showed (the attack succeeded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evidence: Option<String>,
    pub phase: Phase,
    pub time_ns: u64,
}

/// One operation: an invoke and its completion (None while pending, or when the
/// worker never completed it, which counts as info).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operation {
    pub process: u64,
    pub sequence: u64,
    pub function: Function,
    pub key: String,
    pub session: u64,
    pub phase: Phase,
    /// Ok, Fail or Info.
    pub outcome: Kind,
    /// From the completion (acquire ok: the grant; release: the released grant).
    pub token: Option<u64>,
    pub value: Option<String>,
    pub error: Option<String>,
    /// From the invoke of a release or resign (see `Record::alive_ns`).
    pub alive_ns: Option<u64>,
    /// From an observation (see `Record::leader_session`).
    pub leader_session: Option<u64>,
    /// From the ok of an attack (see `Record::evidence`).
    pub evidence: Option<String>,
    /// From the invoke of an acquire: the lock-delay it asked for (see
    /// `Function::Acquire`), so that checks (i) and (j) know how long a stopped
    /// holder's lock stays with nobody. None: the cluster's default, none in the suite.
    pub lock_delay_ms: Option<u64>,
    pub invoke_ns: u64,
    /// None for info: it may take effect at any time after the invoke.
    pub complete_ns: Option<u64>,
}

impl Operation {
    /// A short description for anomaly reports.
    pub fn describe(&self) -> String {
        let mut text = format!(
            "p{}#{} {:?} {:?} key={} session={}",
            self.process, self.sequence, self.function, self.outcome, self.key, self.session
        );
        if let Some(token) = self.token {
            text.push_str(&format!(" token={token}"));
        }
        if let Some(value) = &self.value {
            text.push_str(&format!(" value={value}"));
        }
        if let Some(error) = &self.error {
            text.push_str(&format!(" error={error}"));
        }
        if let Some(leader_session) = self.leader_session {
            text.push_str(&format!(" leader-session={leader_session}"));
        }
        if let Some(evidence) = &self.evidence {
            text.push_str(&format!(" evidence={evidence}"));
        }
        if let Some(alive) = self.alive_ns {
            text.push_str(&format!(" session-alive-until={}ms", alive / 1_000_000));
        }
        if let Some(delay_ms) = self.lock_delay_ms {
            text.push_str(&format!(" lock-delay={delay_ms}ms"));
        }
        text.push_str(&format!(" invoke={}ms", self.invoke_ns / 1_000_000));
        if let Some(complete) = self.complete_ns {
            text.push_str(&format!(" complete={}ms", complete / 1_000_000));
        }
        text
    }
}

/// Appends records to a JSONL file, one write and flush per record.
pub struct HistoryWriter {
    file: std::fs::File,
}

impl HistoryWriter {
    pub fn create(path: &Path) -> std::io::Result<Self> {
        let file = std::fs::File::options().create(true).append(true).open(path)?;
        Ok(Self { file })
    }

    pub fn append(&mut self, record: &Record) -> std::io::Result<()> {
        let mut line = serde_json::to_string(record).expect("records serialize");
        line.push('\n');
        self.file.write_all(line.as_bytes())?;
        self.file.flush()
    }
}

/// Reads a JSONL history; a torn last line (a worker killed mid-write) is skipped.
pub fn read_records(path: &Path) -> std::io::Result<Vec<Record>> {
    let file = std::fs::File::open(path)?;
    let mut records = Vec::new();
    for line in std::io::BufReader::new(file).lines() {
        let line = line?;
        if let Ok(record) = serde_json::from_str::<Record>(&line) {
            records.push(record);
        }
    }
    Ok(records)
}

/// Pairs invokes with completions. An invoke without a completion is info.
/// Panics on a completion without an invoke: the history is malformed.
pub fn operations(records: &[Record]) -> Vec<Operation> {
    let mut pending: BTreeMap<(u64, u64), Operation> = BTreeMap::new();
    let mut done = Vec::new();
    for record in records {
        let key = (record.process, record.sequence);
        match record.kind {
            Kind::Invoke => {
                // An acquire's value says what it asked for: moved to its own field.
                let lock_delay_ms = match (record.function, record.value.as_deref()) {
                    (Function::Acquire, Some(value)) => parse_lock_delay(value),
                    _ => None,
                };
                let operation = Operation {
                    process: record.process,
                    sequence: record.sequence,
                    function: record.function,
                    key: record.key.clone(),
                    session: record.session,
                    phase: record.phase,
                    outcome: Kind::Info,
                    token: record.token,
                    value: if lock_delay_ms.is_some() { None } else { record.value.clone() },
                    error: None,
                    alive_ns: record.alive_ns,
                    leader_session: record.leader_session,
                    evidence: record.evidence.clone(),
                    lock_delay_ms,
                    invoke_ns: record.time_ns,
                    complete_ns: None,
                };
                if let Some(previous) = pending.insert(key, operation) {
                    done.push(previous);
                }
            }
            outcome => {
                let mut operation =
                    pending.remove(&key).unwrap_or_else(|| panic!("completion without invoke: {record:?}"));
                operation.outcome = outcome;
                if record.token.is_some() {
                    operation.token = record.token;
                }
                if record.value.is_some() {
                    operation.value = record.value.clone();
                }
                if record.session != 0 {
                    operation.session = record.session;
                }
                operation.error = record.error.clone();
                if record.leader_session.is_some() {
                    operation.leader_session = record.leader_session;
                }
                if record.evidence.is_some() {
                    operation.evidence = record.evidence.clone();
                }
                if outcome != Kind::Info {
                    operation.complete_ns = Some(record.time_ns);
                }
                done.push(operation);
            }
        }
    }
    done.extend(pending.into_values());
    done.sort_by_key(|operation| (operation.invoke_ns, operation.process, operation.sequence));
    done
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invokes_pair_with_completions_and_lost_ones_are_info() {
        let record = |sequence, kind, time_ns, token| Record {
            process: 1,
            sequence,
            kind,
            function: Function::Acquire,
            key: "lock/0".into(),
            session: 7,
            token,
            value: None,
            error: None,
            alive_ns: None,
            leader_session: None,
            evidence: None,
            phase: Phase::Main,
            time_ns,
        };
        let operations = operations(&[
            record(1, Kind::Invoke, 10, None),
            record(1, Kind::Ok, 20, Some(5)),
            record(2, Kind::Invoke, 30, None),
        ]);
        assert_eq!(operations.len(), 2);
        assert_eq!(operations[0].outcome, Kind::Ok);
        assert_eq!(operations[0].token, Some(5));
        assert_eq!(operations[0].complete_ns, Some(20));
        assert_eq!(operations[1].outcome, Kind::Info);
        assert_eq!(operations[1].complete_ns, None);
        assert_eq!(operations[0].lock_delay_ms, None);
    }

    #[test]
    fn an_acquires_lock_delay_comes_from_its_invoke() {
        let record = |sequence, kind, time_ns, value: Option<String>| Record {
            process: 1,
            sequence,
            kind,
            function: Function::Acquire,
            key: "lock/0".into(),
            session: 7,
            token: (kind == Kind::Ok).then_some(5),
            value,
            error: (kind == Kind::Fail).then(|| LOCK_DELAYED.to_string()),
            alive_ns: None,
            leader_session: None,
            evidence: None,
            phase: Phase::Main,
            time_ns,
        };
        let operations = operations(&[
            record(1, Kind::Invoke, 10, Some(lock_delay_value(1_500))),
            record(1, Kind::Ok, 20, None),
            record(2, Kind::Invoke, 30, Some(lock_delay_value(1_500))),
            record(2, Kind::Fail, 40, Some("holder-token=5".into())),
        ]);
        assert_eq!(operations[0].lock_delay_ms, Some(1_500));
        assert_eq!(operations[0].value, None, "the delay is not the grant's value");
        assert_eq!(operations[1].lock_delay_ms, Some(1_500));
        assert_eq!(operations[1].value.as_deref(), Some("holder-token=5"));
        assert!(operations[0].describe().contains("lock-delay=1500ms"), "{}", operations[0].describe());
        assert_eq!(parse_lock_delay("lock-delay-ms=x"), None);
    }
}

/// An operation for the checkers' unit tests: `times` is (invoke, completion) and the
/// sequence number is the invoke's time.
#[cfg(test)]
pub(crate) fn test_operation(
    process: u64,
    function: Function,
    outcome: Kind,
    key: &str,
    session: u64,
    token: Option<u64>,
    times: (u64, Option<u64>),
) -> Operation {
    Operation {
        process,
        sequence: times.0,
        function,
        key: key.into(),
        session,
        phase: Phase::Main,
        outcome,
        token,
        value: None,
        error: None,
        alive_ns: None,
        leader_session: None,
        evidence: None,
        lock_delay_ms: None,
        invoke_ns: times.0,
        complete_ns: times.1,
    }
}
