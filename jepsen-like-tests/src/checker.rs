//! The checks of a run, each a pure function of the history (and of what the
//! harness observed: the fenced store's writes, the state after a full restart),
//! so each can be fed a hand-made broken history in a unit test.
//!
//! * (a) `tokens` — tokens of ok grants of a name are unique and increase in
//!   real-time order.
//! * (b) `fenced_store` — the store accepted no stale token and only issued ones;
//!   no acknowledged increment was lost or applied twice, no failed one applied.
//! * `store_read_back` — a real store behind the counter (`--fenced-store`) holds
//!   at the end what the record of its answers says.
//! * (c) `semaphore_holders` — at no instant more than K permits of a name
//!   certainly held (black-box, lease-aware: see the function).
//! * (d) `elections` — one session per election token, tokens increase in
//!   real-time order of wins, no observer sees the states go back.
//! * `replica_states` — (c) and (d) white-box: every node's own state (sampled
//!   after each fault) has at most K holders per semaphore and one session per
//!   election token.
//! * (e) `durability` — after every node was killed and restarted, each
//!   acknowledged, unreleased grant is still there and tokens did not go back.
//! * (f) `linearizability` — per key, with a time budget ("unknown", never "pass").
//! * (g) `liveness` — after the final heal every worker acquired within a bound.
//! * `refusals` — every node the nemesis started on a wiped or corrupted data
//!   directory stopped with the documented exit code instead of serving.
//! * `node_exits` — no node process ended on its own except where a fault stops it
//!   (a removal, a refused data directory, a full disk): a node that an attack or a
//!   fault's side effect stopped is named, with its exit code.
//! * `attacks` — no attack of the intruder tenant ever succeeded, and every attack
//!   was refused often enough that the check says something (see `attack`).
//! * (h) `believed_at_once` — no two workers believed they held a lock at once,
//!   each believing until its release or its session's conservative deadline
//!   (overlaps that begin in a clock fault are counted apart).
//! * (i) `dead_holders` — a lock whose holder was stopped is handed on to a waiter
//!   within the published bound (TTL + X after the holder's last keepalive, plus the
//!   grant's lock-delay), across leader changes.
//! * (j) `lock_delays` — a lock whose stopped holder's grant asked for a lock-delay
//!   goes to nobody else before the holder's last keepalive + TTL + the delay.
//! * `revocations` — a session kept alive with a tenant token that was then rotated
//!   or removed is renewed no more than one keepalive interval after the revocation
//!   took effect: an open stream does not keep a revoked credential working.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::attack::{Attack, AttackKind};
use crate::fenced_store::Write;
use crate::history::{Function, Kind, Operation, Phase, LOCK_DELAYED, NOT_HOLDER, UNEXPECTED_REFUSAL};
use crate::linearizability::{self, Linearizable};
use crate::nemesis::{FaultRecord, Outcome};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Pass,
    Fail,
    /// The check could not decide (a time budget ran out).
    Unknown,
    /// The check had nothing to look at (e.g. no full restart happened).
    Skipped,
}

impl Verdict {
    pub fn name(&self) -> &'static str {
        match self {
            Verdict::Pass => "pass",
            Verdict::Fail => "FAIL",
            Verdict::Unknown => "unknown",
            Verdict::Skipped => "skipped",
        }
    }
}

#[derive(Debug, Clone)]
pub struct Anomaly {
    pub what: String,
    /// The operations involved, described.
    pub operations: Vec<String>,
}

#[derive(Debug, Clone)]
pub struct CheckResult {
    pub name: &'static str,
    pub verdict: Verdict,
    /// A line of figures (how much was checked).
    pub detail: String,
    pub anomalies: Vec<Anomaly>,
}

impl CheckResult {
    fn from_anomalies(name: &'static str, detail: String, anomalies: Vec<Anomaly>) -> Self {
        let verdict = if anomalies.is_empty() { Verdict::Pass } else { Verdict::Fail };
        CheckResult { name, verdict, detail, anomalies }
    }
}

fn grants(operations: &[Operation]) -> BTreeMap<&str, Vec<&Operation>> {
    let mut grants: BTreeMap<&str, Vec<&Operation>> = BTreeMap::new();
    for operation in operations {
        if operation.function == Function::Acquire && operation.outcome == Kind::Ok && operation.token.is_some() {
            grants.entry(&operation.key).or_default().push(operation);
        }
    }
    grants
}

/// (a) Tokens of ok grants of one name: one session per token, and if grant A
/// completed before grant B was invoked, token(A) ≤ token(B), equal only for the
/// same grant (a session acquiring what it holds gets its grant back).
pub fn tokens(operations: &[Operation]) -> CheckResult {
    let mut anomalies = Vec::new();
    let grants = grants(operations);
    let mut checked = 0;
    for (name, list) in &grants {
        let mut owner: BTreeMap<u64, &Operation> = BTreeMap::new();
        for grant in list {
            checked += 1;
            let token = grant.token.unwrap();
            match owner.get(&token) {
                Some(first) if first.session != grant.session => anomalies.push(Anomaly {
                    what: format!("token {token} of {name} granted to two sessions"),
                    operations: vec![first.describe(), grant.describe()],
                }),
                Some(_) => {}
                None => {
                    owner.insert(token, grant);
                }
            }
        }
        let mut by_completion: Vec<&Operation> = list.clone();
        by_completion.sort_by_key(|grant| grant.complete_ns);
        let mut by_invoke: Vec<&Operation> = list.clone();
        by_invoke.sort_by_key(|grant| grant.invoke_ns);
        let mut highest: Option<&Operation> = None;
        let mut completed = 0;
        for grant in by_invoke {
            while completed < by_completion.len() && by_completion[completed].complete_ns.unwrap() < grant.invoke_ns {
                let done = by_completion[completed];
                if highest.is_none_or(|highest| done.token > highest.token) {
                    highest = Some(done);
                }
                completed += 1;
            }
            if let Some(earlier) = highest {
                if earlier.token > grant.token {
                    anomalies.push(Anomaly {
                        what: format!(
                            "token of {name} went back: {} granted after {} had completed",
                            grant.token.unwrap(),
                            earlier.token.unwrap()
                        ),
                        operations: vec![earlier.describe(), grant.describe()],
                    });
                }
            }
        }
    }
    CheckResult::from_anomalies(
        "tokens increase (a)",
        format!("{checked} ok grants on {} names", grants.len()),
        anomalies,
    )
}

/// (b) The fenced store: accepted tokens strictly increase per resource (no stale
/// token accepted) and were issued by an ok grant of the lock of the same name;
/// the final list of each counter holds every acknowledged increment exactly once,
/// no failed one, and nothing nobody invoked.
pub fn fenced_store(
    operations: &[Operation],
    writes: &[Write],
    final_values: &BTreeMap<String, String>,
) -> CheckResult {
    let mut anomalies = Vec::new();
    let grants = grants(operations);
    let issued: BTreeSet<(&str, u64)> =
        grants.iter().flat_map(|(name, list)| list.iter().map(move |grant| (*name, grant.token.unwrap()))).collect();
    let mut highest: BTreeMap<&str, u64> = BTreeMap::new();
    let mut accepted = 0;
    for write in writes.iter().filter(|write| write.accepted) {
        accepted += 1;
        let previous = highest.get(write.resource.as_str()).copied().unwrap_or(0);
        if write.token <= previous {
            anomalies.push(Anomaly {
                what: format!("stale write accepted on {}: token {} after {previous}", write.resource, write.token),
                operations: operations
                    .iter()
                    .filter(|operation| {
                        operation.function == Function::Increment
                            && operation.key == write.resource
                            && (operation.token == Some(write.token) || operation.token == Some(previous))
                    })
                    .map(Operation::describe)
                    .collect(),
            });
        }
        highest.insert(&write.resource, previous.max(write.token));
        if !issued.contains(&(write.resource.as_str(), write.token)) {
            anomalies.push(Anomaly {
                what: format!(
                    "write to {} accepted with token {} that no ok grant issued",
                    write.resource, write.token
                ),
                operations: Vec::new(),
            });
        }
    }
    let increments: Vec<&Operation> =
        operations.iter().filter(|operation| operation.function == Function::Increment).collect();
    let mut counts: BTreeMap<(&str, &str), usize> = BTreeMap::new();
    for (resource, list) in final_values {
        for id in list.split(',').filter(|id| !id.is_empty()) {
            *counts.entry((resource.as_str(), id)).or_default() += 1;
        }
    }
    let mut invoked: BTreeSet<(&str, &str)> = BTreeSet::new();
    let (mut acknowledged, mut lost, mut doubled) = (0, 0, 0);
    for increment in &increments {
        let Some(id) = increment.value.as_deref() else {
            continue;
        };
        invoked.insert((&increment.key, id));
        let count = counts.get(&(increment.key.as_str(), id)).copied().unwrap_or(0);
        let problem = match increment.outcome {
            Kind::Ok => {
                acknowledged += 1;
                if count == 0 {
                    lost += 1;
                    Some("acknowledged increment lost")
                } else if count > 1 {
                    doubled += 1;
                    Some("increment applied more than once")
                } else {
                    None
                }
            }
            Kind::Fail if count > 0 => Some("failed increment applied"),
            Kind::Info if count > 1 => {
                doubled += 1;
                Some("increment applied more than once")
            }
            _ => None,
        };
        if let Some(problem) = problem {
            anomalies.push(Anomaly {
                what: format!("{problem}: {id} on {} (in the final list {count} times)", increment.key),
                operations: vec![increment.describe()],
            });
        }
    }
    for ((resource, id), count) in &counts {
        if !invoked.contains(&(*resource, *id)) {
            anomalies.push(Anomaly {
                what: format!("{resource} holds {id} ({count} times), which nobody invoked"),
                operations: Vec::new(),
            });
        }
    }
    let mut result = CheckResult::from_anomalies(
        "fenced store (b)",
        format!(
            "{accepted} writes accepted of {}; {acknowledged} acknowledged increments, {lost} lost, {doubled} applied twice",
            writes.len()
        ),
        anomalies,
    );
    if writes.is_empty() && increments.is_empty() {
        result.verdict = Verdict::Skipped;
    }
    result
}

pub const STORE_READ_BACK_CHECK_NAME: &str = "fenced store read back";

/// The real store behind the fenced counter (`--fenced-store`) holds at the end what
/// the record of its answers says: per resource, the last accepted write's value, or
/// that of a later write whose answer was lost (`expected`, in that order). `found`
/// is what was read back: None for the in-memory store, which is the record itself
/// (skipped); an error when the store could not be read (unknown).
pub fn store_read_back(
    store: &str,
    expected: &BTreeMap<String, Vec<String>>,
    found: Option<&Result<BTreeMap<String, String>, String>>,
) -> CheckResult {
    let undecided =
        |verdict, detail| CheckResult { name: STORE_READ_BACK_CHECK_NAME, verdict, detail, anomalies: vec![] };
    let found = match found {
        None => return undecided(Verdict::Skipped, format!("the {store} store is its own record")),
        Some(Err(error)) => return undecided(Verdict::Unknown, format!("cannot read the {store} store back: {error}")),
        Some(Ok(found)) => found,
    };
    let describe = |list: &str| {
        let ids: Vec<&str> = list.split(',').filter(|id| !id.is_empty()).collect();
        format!("{} ids, ending {:?}", ids.len(), ids[ids.len().saturating_sub(3)..].join(","))
    };
    let mut anomalies = Vec::new();
    for (resource, values) in expected {
        let held = found.get(resource).map(String::as_str).unwrap_or_default();
        if !values.iter().any(|value| value == held) {
            anomalies.push(Anomaly {
                what: format!(
                    "{store} holds {} for {resource}; the record expects {}",
                    describe(held),
                    values.iter().map(|value| describe(value)).collect::<Vec<_>>().join(" or ")
                ),
                operations: Vec::new(),
            });
        }
    }
    let detail = format!("{} of {} resources as recorded ({store})", expected.len() - anomalies.len(), expected.len());
    CheckResult::from_anomalies(STORE_READ_BACK_CHECK_NAME, detail, anomalies)
}

/// What the harness saw right after every node was killed and restarted (workers
/// paused throughout): each lock's current grant and the sessions that exist.
#[derive(Debug, Clone, Default)]
pub struct RestartObservation {
    /// When the nodes were killed (CLOCK_MONOTONIC ns).
    pub killed_ns: u64,
    /// Each lock name's (session, token) after the restart; None when free.
    pub holders: BTreeMap<String, Option<(u64, u64)>>,
    pub sessions: BTreeSet<u64>,
}

/// (e) For each name, the highest ok grant acknowledged before the kill, unless its
/// release was invoked before the kill, must still be there after the restart —
/// or, if its session is gone (it may have expired before the kill), have been
/// followed by a higher token. A token lower than an acknowledged one is a loss.
pub fn durability(operations: &[Operation], restarts: &[RestartObservation]) -> CheckResult {
    let mut anomalies = Vec::new();
    let mut confirmed = 0;
    for restart in restarts {
        let before: Vec<&Operation> = operations
            .iter()
            .filter(|operation| operation.complete_ns.is_some_and(|time| time < restart.killed_ns))
            .collect();
        for (name, holder) in &restart.holders {
            let latest = before
                .iter()
                .filter(|operation| {
                    operation.function == Function::Acquire && operation.outcome == Kind::Ok && operation.key == *name
                })
                .max_by_key(|operation| operation.token);
            let Some(latest) = latest else {
                continue;
            };
            let token = latest.token.unwrap();
            let released = operations.iter().any(|operation| {
                operation.function == Function::Release
                    && operation.key == *name
                    && operation.token == Some(token)
                    && operation.invoke_ns < restart.killed_ns
            });
            let session_alive = restart.sessions.contains(&latest.session);
            let problem = match holder {
                Some((_, current)) if *current < token => Some(format!(
                    "{name}: token {current} after the restart, below the acknowledged {token}"
                )),
                _ if released => None,
                Some((session, current)) if *current == token && *session == latest.session => {
                    confirmed += 1;
                    None
                }
                Some(_) | None if session_alive => Some(format!(
                    "{name}: the acknowledged grant {token} of live session {} is gone after the restart (now {holder:?})",
                    latest.session
                )),
                _ => None,
            };
            if let Some(what) = problem {
                anomalies.push(Anomaly { what, operations: vec![latest.describe()] });
            }
        }
    }
    let mut result = CheckResult::from_anomalies(
        "durability after a full restart (e)",
        format!("{} full restarts, {confirmed} unreleased grants confirmed", restarts.len()),
        anomalies,
    );
    if restarts.is_empty() {
        result.verdict = Verdict::Skipped;
    }
    result
}

/// (f) Per-key linearizability of lock operations; each key gets `budget`.
pub fn linearizability(operations: &[Operation], budget: Duration) -> CheckResult {
    let mut by_key: BTreeMap<&str, Vec<&Operation>> = BTreeMap::new();
    for operation in operations {
        if matches!(operation.function, Function::Acquire | Function::Release) {
            by_key.entry(&operation.key).or_default().push(operation);
        }
    }
    let mut anomalies = Vec::new();
    let mut unknown = Vec::new();
    let mut checked = 0;
    for (key, list) in &by_key {
        let steps = linearizability::lock_steps(list);
        checked += steps.len();
        match linearizability::check(&steps, budget) {
            Linearizable::Yes => {}
            Linearizable::Unknown => unknown.push(key.to_string()),
            Linearizable::No => {
                // The operations just before and at the end of the longest
                // linearizable prefix: where the history goes wrong.
                let kept: Vec<&&Operation> =
                    list.iter().filter(|operation| !linearizability::lock_steps(&[**operation]).is_empty()).collect();
                let prefix = linearizability::longest_linearizable_prefix(&steps, budget);
                let around =
                    kept.iter().skip(prefix.saturating_sub(7)).take(8).map(|operation| operation.describe()).collect();
                anomalies.push(Anomaly {
                    what: format!("lock operations on {key} are not linearizable"),
                    operations: around,
                });
            }
        }
    }
    let mut result = CheckResult::from_anomalies(
        "linearizability per key (f)",
        format!(
            "{checked} operations on {} keys{}",
            by_key.len(),
            if unknown.is_empty() { String::new() } else { format!("; budget ran out on {}", unknown.join(", ")) }
        ),
        anomalies,
    );
    if result.verdict == Verdict::Pass && !unknown.is_empty() {
        result.verdict = Verdict::Unknown;
    }
    result
}

/// (g) After the final heal (`final_ns`), every worker got an ok grant (a lock, a
/// permit or a leadership) within `bound`.
pub fn liveness(operations: &[Operation], processes: &[u64], final_ns: u64, bound: Duration) -> CheckResult {
    let mut anomalies = Vec::new();
    let mut slowest = 0u64;
    for process in processes {
        let grant = operations
            .iter()
            .filter(|operation| {
                operation.process == *process
                    && operation.phase == Phase::Final
                    && is_grant(operation.function)
                    && operation.outcome == Kind::Ok
            })
            .filter_map(|operation| operation.complete_ns)
            .min();
        match grant {
            Some(time) if time.saturating_sub(final_ns) <= bound.as_nanos() as u64 => {
                slowest = slowest.max(time.saturating_sub(final_ns));
            }
            Some(time) => anomalies.push(Anomaly {
                what: format!(
                    "worker {process} acquired {} ms after the final heal (bound {} ms)",
                    time.saturating_sub(final_ns) / 1_000_000,
                    bound.as_millis()
                ),
                operations: Vec::new(),
            }),
            None => anomalies.push(Anomaly {
                what: format!("worker {process} never acquired after the final heal"),
                operations: operations
                    .iter()
                    .filter(|operation| operation.process == *process && operation.phase == Phase::Final)
                    .map(Operation::describe)
                    .collect(),
            }),
        }
    }
    CheckResult::from_anomalies(
        "liveness after the final heal (g)",
        format!("{} workers, slowest first grant {} ms after the heal", processes.len(), slowest / 1_000_000),
        anomalies,
    )
}

/// Functions whose ok answer is a grant, for the liveness check.
fn is_grant(function: Function) -> bool {
    matches!(function, Function::Acquire | Function::SemAcquire | Function::Campaign)
}

/// (c) Semaphore holders ≤ K, black-box. A permit is certainly held from its
/// acquire's ok until the invoke of its release when that release succeeded (the
/// token was still current when it applied). When the release failed or is
/// unknown, the permit may have been lost with its session at any time after the
/// session last provably lived: the send time of its last answered keepalive
/// before the release (`alive_ns`) — not that time plus the TTL, which a paused
/// worker or a leader's jumping clock can cut short. At no instant may more than
/// `limit` permits of one name be certainly held. Permits granted in one log entry
/// share its index as their token, so a permit is named by its token and session;
/// tokens of a name never go back: a new grant asked for after another grant was
/// answered has a token at least as large.
pub fn semaphore_holders(operations: &[Operation], limit: usize) -> CheckResult {
    let mut anomalies = Vec::new();
    // Release operations by (process, key, token), in invoke order.
    let mut releases: BTreeMap<(u64, &str, u64), Vec<&Operation>> = BTreeMap::new();
    for operation in operations {
        if operation.function == Function::SemRelease {
            if let Some(token) = operation.token {
                releases.entry((operation.process, &operation.key, token)).or_default().push(operation);
            }
        }
    }
    // Per name, per (token, session): the certain interval (start, end) and the grant.
    type Permit = (u64, u64);
    let mut held: BTreeMap<&str, BTreeMap<Permit, (u64, u64, &Operation)>> = BTreeMap::new();
    let mut grants = 0;
    let mut certain = 0;
    let granted: Vec<&Operation> = operations
        .iter()
        .filter(|operation| operation.function == Function::SemAcquire && operation.outcome == Kind::Ok)
        .filter(|operation| operation.token.is_some() && operation.complete_ns.is_some())
        .collect();
    anomalies.extend(permit_tokens_going_back(&granted));
    for grant in granted {
        let (Some(token), Some(start)) = (grant.token, grant.complete_ns) else {
            continue;
        };
        grants += 1;
        let release = releases
            .get(&(grant.process, grant.key.as_str(), token))
            .and_then(|list| list.iter().find(|release| release.invoke_ns >= start));
        let end = match release {
            Some(release) if release.outcome == Kind::Ok => release.invoke_ns,
            Some(release) => release.invoke_ns.min(release.alive_ns.unwrap_or(start)),
            None => start,
        };
        if end <= start {
            continue;
        }
        certain += 1;
        // The same session asking again gets its grant back: one permit.
        let entry = held.entry(&grant.key).or_default().entry((token, grant.session)).or_insert((start, end, grant));
        entry.0 = entry.0.min(start);
        entry.1 = entry.1.max(end);
    }
    for (name, permits) in &held {
        // Sweep: ends before starts at the same instant (half-open intervals).
        let mut events: Vec<(u64, bool, Permit)> = Vec::new();
        for (permit, (start, end, _)) in permits {
            events.push((*start, true, *permit));
            events.push((*end, false, *permit));
        }
        events.sort();
        let mut holding: BTreeSet<Permit> = BTreeSet::new();
        let mut reported_until = 0;
        for (time, starts, permit) in events {
            if !starts {
                holding.remove(&permit);
                continue;
            }
            holding.insert(permit);
            if holding.len() > limit && time >= reported_until {
                reported_until = holding.iter().map(|permit| permits[permit].1).min().unwrap_or(time);
                anomalies.push(Anomaly {
                    what: format!(
                        "{} permits of {name} certainly held at once at {} ms (limit {limit})",
                        holding.len(),
                        time / 1_000_000
                    ),
                    operations: holding.iter().map(|permit| permits[permit].2.describe()).collect(),
                });
            }
        }
    }
    let mut result = CheckResult::from_anomalies(
        "semaphore holders <= K (c)",
        format!("{grants} ok permits on {} names, {certain} with a certain holding interval", held.len()),
        anomalies,
    );
    if grants == 0 {
        result.verdict = Verdict::Skipped;
    }
    result
}

/// Permit grants of one name whose token is smaller than that of a grant to another
/// permit answered before the grant was asked for. A session asking again for the
/// permit it holds gets its old token back, so only first grants of a (token, session)
/// count.
fn permit_tokens_going_back(granted: &[&Operation]) -> Vec<Anomaly> {
    let mut anomalies = Vec::new();
    let mut by_name: BTreeMap<&str, Vec<&Operation>> = BTreeMap::new();
    let mut seen: BTreeSet<(&str, u64, u64)> = BTreeSet::new();
    for grant in granted {
        let token = grant.token.expect("grants with a token");
        if seen.insert((&grant.key, token, grant.session)) {
            by_name.entry(&grant.key).or_default().push(grant);
        }
    }
    for (name, grants) in by_name {
        let mut by_complete = grants.clone();
        by_complete.sort_by_key(|grant| grant.complete_ns);
        let mut by_invoke = grants;
        by_invoke.sort_by_key(|grant| grant.invoke_ns);
        let mut answered = by_complete.iter().peekable();
        let mut highest: Option<&Operation> = None;
        for grant in by_invoke {
            while let Some(earlier) = answered.next_if(|earlier| earlier.complete_ns < Some(grant.invoke_ns)) {
                if highest.is_none_or(|highest| earlier.token > highest.token) {
                    highest = Some(earlier);
                }
            }
            if let Some(highest) = highest.filter(|highest| highest.token > grant.token) {
                anomalies.push(Anomaly {
                    what: format!(
                        "permit token of {name} went back: {} granted after {} was answered",
                        grant.token.unwrap_or(0),
                        highest.token.unwrap_or(0)
                    ),
                    operations: vec![highest.describe(), grant.describe()],
                });
            }
        }
    }
    anomalies
}

/// The session that led with an operation's token: the campaigner's own for a
/// campaign, the observed one for an observation.
fn leader_session(operation: &Operation) -> u64 {
    match operation.function {
        Function::Observe => operation.leader_session.unwrap_or(0),
        _ => operation.session,
    }
}

/// (d) One leader per election token: every token of a name belongs to one
/// session, in grants and in observations alike; if a campaign won before
/// another was invoked, the later one's token is higher (equal only for the same
/// session getting its leadership back); and each observer's states of a name
/// never go back (tokens non-decreasing, vacancies aside).
pub fn elections(operations: &[Operation]) -> CheckResult {
    let mut anomalies = Vec::new();
    // Grants by name.
    let mut grants: BTreeMap<&str, Vec<&Operation>> = BTreeMap::new();
    for operation in operations {
        if operation.function == Function::Campaign && operation.outcome == Kind::Ok && operation.token.is_some() {
            grants.entry(&operation.key).or_default().push(operation);
        }
    }
    let observations: Vec<&Operation> =
        operations.iter().filter(|operation| operation.function == Function::Observe).collect();
    let mut owners: BTreeMap<(String, u64), &Operation> = BTreeMap::new();
    let sources = grants.values().flatten().copied().chain(observations.iter().copied().filter(|o| o.token.is_some()));
    for operation in sources {
        let token = operation.token.unwrap();
        let session = leader_session(operation);
        match owners.get(&(operation.key.clone(), token)) {
            Some(first) if leader_session(first) != session => anomalies.push(Anomaly {
                what: format!("election token {token} of {} belongs to two sessions", operation.key),
                operations: vec![first.describe(), operation.describe()],
            }),
            Some(_) => {}
            None => {
                owners.insert((operation.key.clone(), token), operation);
            }
        }
    }
    for (name, list) in &grants {
        let mut by_completion: Vec<&Operation> = list.clone();
        by_completion.sort_by_key(|grant| grant.complete_ns);
        let mut by_invoke: Vec<&Operation> = list.clone();
        by_invoke.sort_by_key(|grant| grant.invoke_ns);
        let mut highest: Option<&Operation> = None;
        let mut completed = 0;
        for grant in by_invoke {
            while completed < by_completion.len() && by_completion[completed].complete_ns.unwrap() < grant.invoke_ns {
                let done = by_completion[completed];
                if highest.is_none_or(|highest| done.token > highest.token) {
                    highest = Some(done);
                }
                completed += 1;
            }
            if let Some(earlier) = highest {
                let same_grant = earlier.token == grant.token && earlier.session == grant.session;
                if earlier.token >= grant.token && !same_grant {
                    anomalies.push(Anomaly {
                        what: format!(
                            "leadership token of {name} did not increase: {} won after {} had won",
                            grant.token.unwrap(),
                            earlier.token.unwrap()
                        ),
                        operations: vec![earlier.describe(), grant.describe()],
                    });
                }
            }
        }
    }
    let mut streams: BTreeMap<(u64, &str), Vec<&Operation>> = BTreeMap::new();
    for observation in &observations {
        streams.entry((observation.process, &observation.key)).or_default().push(observation);
    }
    for ((process, name), list) in &mut streams {
        list.sort_by_key(|observation| observation.sequence);
        let mut highest: Option<&Operation> = None;
        for observation in list.iter() {
            let Some(token) = observation.token else {
                continue;
            };
            if let Some(earlier) = highest {
                if earlier.token.unwrap() > token {
                    anomalies.push(Anomaly {
                        what: format!(
                            "observer {process} of {name} went back from token {} to {token}",
                            earlier.token.unwrap()
                        ),
                        operations: vec![earlier.describe(), observation.describe()],
                    });
                    continue;
                }
            }
            highest = Some(observation);
        }
    }
    let mut result = CheckResult::from_anomalies(
        "one leader per election token (d)",
        format!(
            "{} ok campaigns on {} names, {} observed states",
            grants.values().map(Vec::len).sum::<usize>(),
            grants.len(),
            observations.len()
        ),
        anomalies,
    );
    if grants.is_empty() && observations.is_empty() {
        result.verdict = Verdict::Skipped;
    }
    result
}

/// One node's own state of a semaphore or election name, read from that node
/// alone (a stale read: what it applied so far).
#[derive(Debug, Clone)]
pub struct ReplicaState {
    pub node: u64,
    /// When the read was sent (CLOCK_MONOTONIC ns).
    pub at_ns: u64,
    pub name: String,
    /// A semaphore's limit (0: nobody holds or waits); None for an election.
    pub limit: Option<u32>,
    /// A semaphore's holders as (session, token).
    pub holders: Vec<(u64, u64)>,
    /// An election's leader as (session, token); None when vacant.
    pub leader: Option<(u64, u64)>,
}

/// (c) and (d) white-box: in every state a node reported, a semaphore has at most
/// `limit` holders with distinct tokens and the limit the workers asked for, and
/// each election token belongs to one session across all nodes, reads and the
/// history's campaigns.
pub fn replica_states(operations: &[Operation], states: &[ReplicaState], limit: u32) -> CheckResult {
    let mut anomalies = Vec::new();
    let describe = |state: &ReplicaState| {
        format!(
            "node {} at {} ms: {} limit={:?} holders={:?} leader={:?}",
            state.node,
            state.at_ns / 1_000_000,
            state.name,
            state.limit,
            state.holders,
            state.leader
        )
    };
    let mut owners: BTreeMap<(&str, u64), (u64, String)> = BTreeMap::new();
    for operation in operations {
        if operation.function == Function::Campaign && operation.outcome == Kind::Ok {
            if let Some(token) = operation.token {
                owners.entry((&operation.key, token)).or_insert((operation.session, operation.describe()));
            }
        }
    }
    for state in states {
        if let Some(reported) = state.limit {
            // Permits granted in one entry share its token; a session holds at most one.
            let sessions: BTreeSet<u64> = state.holders.iter().map(|(session, _)| *session).collect();
            if state.holders.len() > limit as usize || (reported != 0 && reported != limit) {
                anomalies.push(Anomaly {
                    what: format!(
                        "{} holders of {} on node {} (limit {limit})",
                        state.holders.len(),
                        state.name,
                        state.node
                    ),
                    operations: vec![describe(state)],
                });
            } else if sessions.len() != state.holders.len() {
                anomalies.push(Anomaly {
                    what: format!("a session holds two permits of {} on node {}", state.name, state.node),
                    operations: vec![describe(state)],
                });
            }
        }
        if let Some((session, token)) = state.leader {
            match owners.get(&(state.name.as_str(), token)) {
                Some((owner, seen)) if *owner != session => anomalies.push(Anomaly {
                    what: format!(
                        "election token {token} of {} led by session {session} on node {}, by {owner} elsewhere",
                        state.name, state.node
                    ),
                    operations: vec![seen.clone(), describe(state)],
                }),
                Some(_) => {}
                None => {
                    owners.insert((&state.name, token), (session, describe(state)));
                }
            }
        }
    }
    let nodes: BTreeSet<u64> = states.iter().map(|state| state.node).collect();
    let mut result = CheckResult::from_anomalies(
        "replica states (c, d white-box)",
        format!("{} states read from {} nodes", states.len(), nodes.len()),
        anomalies,
    );
    if states.is_empty() {
        result.verdict = Verdict::Skipped;
    }
    result
}

/// Refusals each attack needs at least, and each kind of attack, for the attacks
/// check to pass: without them it could pass on a worker that did nothing, or whose
/// tries all went unanswered.
pub const ATTACK_REFUSALS_MIN: usize = 1;
pub const ATTACK_KIND_REFUSALS_MIN: usize = 10;
/// The attacks check's name in the summary.
pub const ATTACKS_CHECK_NAME: &str = "attacks all refused (trust)";

/// What became of the tries of one attack.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct AttackCount {
    pub tries: usize,
    pub refused: usize,
    /// Refusals whose reason is not one the attack expects (still refusals).
    pub unexpected: usize,
    pub unknown: usize,
    pub succeeded: usize,
    /// Refusals by reason (the error up to its first ':').
    pub reasons: BTreeMap<String, usize>,
}

/// The tries of each attack in the history, by attack name (names this build does
/// not know included).
pub fn attack_counts(operations: &[Operation]) -> BTreeMap<String, AttackCount> {
    let mut counts: BTreeMap<String, AttackCount> = BTreeMap::new();
    for operation in operations.iter().filter(|operation| operation.function == Function::Attack) {
        let count = counts.entry(operation.key.clone()).or_default();
        count.tries += 1;
        match operation.outcome {
            Kind::Ok => count.succeeded += 1,
            Kind::Fail => {
                count.refused += 1;
                let error = operation.error.as_deref().unwrap_or("");
                if error.starts_with(UNEXPECTED_REFUSAL) {
                    count.unexpected += 1;
                }
                let reason = error.split(':').next().unwrap_or("").trim().to_string();
                *count.reasons.entry(reason).or_default() += 1;
            }
            Kind::Info | Kind::Invoke => count.unknown += 1,
        }
    }
    counts
}

/// Invariant 7 under faults: no attack of the intruder tenant (`attack`) ever
/// succeeded — each success is an anomaly naming the attack, its time, what was
/// tried and what came back. And the check is not vacuous: every attack was refused
/// at least `ATTACK_REFUSALS_MIN` times and every kind `ATTACK_KIND_REFUSALS_MIN`
/// times. Unknown tries (no answer during a fault) prove nothing either way;
/// refusals with an unexpected reason are counted in the detail, not failed.
/// The attacks a run is expected to have tried: all of them, but those that need
/// this release (`Attack::needs_this_release`) when the run had nodes of an older
/// release (as the history shows: none of those tried).
pub fn expected_attacks(operations: &[Operation]) -> Vec<Attack> {
    let tried = |attack: Attack| {
        operations.iter().any(|operation| operation.function == Function::Attack && operation.key == attack.name())
    };
    let older_release = !Attack::ALL.into_iter().any(|attack| attack.needs_this_release() && tried(attack));
    Attack::ALL.into_iter().filter(|attack| !(older_release && attack.needs_this_release())).collect()
}

pub fn attacks(operations: &[Operation], expected: &[Attack]) -> CheckResult {
    let mut anomalies = Vec::new();
    for operation in operations.iter().filter(|operation| operation.function == Function::Attack) {
        if operation.outcome == Kind::Ok {
            anomalies.push(Anomaly {
                what: format!(
                    "attack {} succeeded at {} ms: {} -> {}",
                    operation.key,
                    operation.complete_ns.unwrap_or(operation.invoke_ns) / 1_000_000,
                    operation.value.as_deref().unwrap_or("?"),
                    operation.evidence.as_deref().unwrap_or("an OK answer")
                ),
                operations: vec![operation.describe()],
            });
        }
    }
    let counts = attack_counts(operations);
    let mut by_kind: BTreeMap<AttackKind, usize> = BTreeMap::new();
    for attack in expected.iter().copied() {
        let refused = counts.get(attack.name()).map(|count| count.refused).unwrap_or(0);
        *by_kind.entry(attack.kind()).or_default() += refused;
        if refused < ATTACK_REFUSALS_MIN {
            anomalies.push(Anomaly {
                what: format!(
                    "vacuous: attack {} was refused {refused} times (at least {ATTACK_REFUSALS_MIN} needed; {} tries)",
                    attack.name(),
                    counts.get(attack.name()).map(|count| count.tries).unwrap_or(0)
                ),
                operations: Vec::new(),
            });
        }
    }
    for kind in AttackKind::ALL {
        let refused = by_kind.get(&kind).copied().unwrap_or(0);
        if refused < ATTACK_KIND_REFUSALS_MIN {
            anomalies.push(Anomaly {
                what: format!(
                    "vacuous: {} attacks were refused {refused} times (at least {ATTACK_KIND_REFUSALS_MIN} needed)",
                    kind.name()
                ),
                operations: Vec::new(),
            });
        }
    }
    let total = |field: fn(&AttackCount) -> usize| counts.values().map(field).sum::<usize>();
    let unknown_names: Vec<&String> = counts.keys().filter(|name| Attack::from_name(name).is_none()).collect();
    let detail = format!(
        "{} tries of {} attacks: {} refused ({} with an unexpected reason), {} unknown, {} succeeded; refused by kind {}{}",
        total(|count| count.tries),
        counts.len(),
        total(|count| count.refused),
        total(|count| count.unexpected),
        total(|count| count.unknown),
        total(|count| count.succeeded),
        AttackKind::ALL
            .iter()
            .map(|kind| format!("{} {}", &kind.name()[..3], by_kind.get(kind).copied().unwrap_or(0)))
            .collect::<Vec<_>>()
            .join(", "),
        if unknown_names.is_empty() { String::new() } else { format!("; unknown attack names {unknown_names:?}") }
    );
    CheckResult::from_anomalies(ATTACKS_CHECK_NAME, detail, anomalies)
}

/// Faults that change how a leader measures time: while one is on (and for two TTLs
/// after), a lease may end early by design of the fault, so overlaps of beliefs that
/// begin then are counted apart, not as anomalies.
pub const CLOCK_FAULTS: [&str; 3] = ["clock-fast", "clock-slow", "clock-jump"];

/// The windows `[start, end + 2 TTL]` of installed (or maybe installed) clock faults.
pub fn clock_fault_windows(faults: &[FaultRecord], ttl: Duration) -> Vec<(u64, u64)> {
    faults
        .iter()
        .filter(|fault| CLOCK_FAULTS.contains(&fault.fault) && fault.outcome != Outcome::Skipped)
        .map(|fault| (fault.start_ns, fault.end_ns + 2 * ttl.as_nanos() as u64))
        .collect()
}

/// (h) No two workers ever believed they held the same lock at once. A worker
/// believes from its grant's ok until the invoke of its release, or until its
/// session's conservative deadline passed if that came first: the release's invoke
/// carries the send time of the session's last answered keepalive (`alive_ns`), and
/// the client library counts on `client_lease_ms(TTL)` from then. A grant never
/// released is believed until the end of the history. An overlap whose later grant
/// completed inside a clock fault's window (`excused`) is counted but is not an
/// anomaly: a leader whose clock runs fast ends leases early, which is what the fault
/// is for and what fencing is for.
pub fn believed_at_once(operations: &[Operation], ttl: Duration, excused: &[(u64, u64)]) -> CheckResult {
    let end = operations
        .iter()
        .filter_map(|operation| operation.complete_ns.or(Some(operation.invoke_ns)))
        .max()
        .unwrap_or(0);
    let counted_on_ns = leasehold::proto::lease::client_lease_ms(ttl.as_millis() as u64) * 1_000_000;
    // Release invokes by (process, key, token), in time order: (invoke, belief end).
    let mut releases: BTreeMap<(u64, &str, Option<u64>), Vec<(u64, u64)>> = BTreeMap::new();
    for operation in operations {
        if operation.function == Function::Release {
            let believed_until = match operation.alive_ns {
                Some(alive) => operation.invoke_ns.min(alive + counted_on_ns),
                None => operation.invoke_ns,
            };
            releases
                .entry((operation.process, &operation.key, operation.token))
                .or_default()
                .push((operation.invoke_ns, believed_until));
        }
    }
    let mut intervals: BTreeMap<&str, Vec<(u64, u64, &Operation)>> = BTreeMap::new();
    for grant in
        operations.iter().filter(|operation| operation.function == Function::Acquire && operation.outcome == Kind::Ok)
    {
        let start = grant.complete_ns.unwrap();
        let believed_until = releases
            .get(&(grant.process, grant.key.as_str(), grant.token))
            .and_then(|times| times.iter().find(|(invoke, _)| *invoke >= start))
            .map(|(_, believed_until)| *believed_until)
            .unwrap_or(end);
        intervals.entry(&grant.key).or_default().push((start, believed_until, grant));
    }
    let mut anomalies = Vec::new();
    let mut pairs = 0;
    let mut excused_pairs = 0;
    for list in intervals.values_mut() {
        list.sort_by_key(|(start, _, _)| *start);
        for (index, (_, first_end, first)) in list.iter().enumerate() {
            for (start, _, second) in &list[index + 1..] {
                if *start >= *first_end {
                    continue;
                }
                if first.session == second.session {
                    continue;
                }
                pairs += 1;
                if excused.iter().any(|(from, to)| (*from..=*to).contains(start)) {
                    excused_pairs += 1;
                    continue;
                }
                anomalies.push(Anomaly {
                    what: format!(
                        "two workers believed they held {} at once for {} ms",
                        first.key,
                        (first_end - start) / 1_000_000
                    ),
                    operations: vec![first.describe(), second.describe()],
                });
            }
        }
    }
    let detail = format!(
        "{} grants; {pairs} overlapping beliefs, {excused_pairs} of them begun in a clock fault",
        intervals.values().map(Vec::len).sum::<usize>()
    );
    CheckResult::from_anomalies(BELIEVED_CHECK_NAME, detail, anomalies)
}

pub const BELIEVED_CHECK_NAME: &str = "believed at once (h)";
pub const DEAD_HOLDER_CHECK_NAME: &str = "dead holder handed on in bound (i)";
pub const LOCK_DELAY_CHECK_NAME: &str = "no grant during lock-delay (j)";

/// The faults that stop a worker while it may hold a lock: its lock must be handed
/// on within the published bound.
pub const WORKER_STOPS: [&str; 2] = ["pause-worker", "pause-worker-kill-leader"];

/// Faults during which no lease bound can hold, because the cluster may have no
/// quorum, or no leader that can act, or the leader may be a node that was down when
/// a checkpoint was committed (it starts that session from when it applied it, once
/// back): an overlapping one adds its duration and an election to what a handover
/// may take.
const UNAVAILABLE_FAULTS: [&str; 13] = [
    "kill-leader",
    "kill-random",
    "kill-all",
    "pause-node",
    "pause-leader",
    "partition-halves",
    "partition-leader",
    "partition-bridge",
    "partition-one-way",
    "member-replace",
    "wipe-rejoin",
    "corrupt-replace",
    "disk-full",
];

/// What the lease bound of a run is made of.
#[derive(Debug, Clone, Copy)]
pub struct LeaseBound {
    pub ttl: Duration,
    /// One election, from the old leader's loss to the new one's first applied entry.
    pub election: Duration,
    /// The expiry's commit and the waiter's grant reaching its worker.
    pub handover: Duration,
}

impl LeaseBound {
    /// X of the README's bound, for this TTL and election time.
    pub fn extension_ms(&self) -> u64 {
        leasehold::proto::lease::extension_bound_ms(self.ttl.as_millis() as u64, self.election.as_millis() as u64)
    }
}

/// A worker stopped (`WORKER_STOPS`) while it held a lock, as checks (i) and (j) see
/// it: only holders whose release after the stop says when their session last lived.
struct StoppedHolder<'a> {
    /// The grant it held when it was stopped.
    held: &'a Operation,
    /// Its first release of that grant, invoked after the stop began.
    release: &'a Operation,
    /// The send time of its session's last answered keepalive, at or before the stop.
    alive_ns: u64,
    /// The first grant of the name to another session after `held` (None: there was
    /// no later grant).
    next: Option<&'a Operation>,
}

impl StoppedHolder<'_> {
    /// The lock-delay its grant asked for, in nanoseconds (0: none).
    fn lock_delay_ns(&self) -> u64 {
        self.held.lock_delay_ms.unwrap_or(0) * 1_000_000
    }
}

/// Every worker stopped by an installed `WORKER_STOPS` fault while it held a lock.
fn stopped_holders<'a>(operations: &'a [Operation], faults: &[FaultRecord]) -> Vec<StoppedHolder<'a>> {
    let grants: Vec<&Operation> = operations
        .iter()
        .filter(|operation| operation.function == Function::Acquire && operation.outcome == Kind::Ok)
        .collect();
    let mut stopped = Vec::new();
    for stop in faults.iter().filter(|fault| WORKER_STOPS.contains(&fault.fault) && fault.outcome == Outcome::Installed)
    {
        let Some(process) = stop.targets.first().copied() else { continue };
        // Granted at or before the stop: under the simulator a grant and the stall
        // that follows it can share an instant.
        for held in grants.iter().filter(|grant| grant.process == process && grant.complete_ns <= Some(stop.start_ns)) {
            let Some(held_from) = held.complete_ns else { continue };
            if held.token.is_none() {
                continue;
            }
            let release = operations
                .iter()
                .filter(|operation| {
                    operation.function == Function::Release
                        && operation.process == process
                        && operation.key == held.key
                        && operation.token == held.token
                        && operation.invoke_ns >= held_from
                })
                .min_by_key(|operation| operation.invoke_ns);
            // Released before the stop: not held. Never released: the end is unknown.
            let Some(release) = release.filter(|release| release.invoke_ns > stop.start_ns) else { continue };
            let Some(alive_ns) = release.alive_ns.filter(|alive| *alive <= stop.start_ns) else { continue };
            let next = grants
                .iter()
                .filter(|grant| {
                    grant.key == held.key && grant.session != held.session && grant.complete_ns > Some(held_from)
                })
                .min_by_key(|grant| grant.complete_ns)
                .copied();
            stopped.push(StoppedHolder { held, release, alive_ns, next });
        }
    }
    stopped
}

/// Whether a clock fault overlaps `[from, to]`: a lease or a lock-delay measured then
/// may end early by design of the fault.
fn in_clock_fault(faults: &[FaultRecord], from: u64, to: u64) -> bool {
    faults.iter().any(|fault| CLOCK_FAULTS.contains(&fault.fault) && fault.start_ns <= to && fault.end_ns >= from)
}

/// (i) A stopped holder's lock is handed on within the published bound. For every
/// worker stopped (`WORKER_STOPS`) while it held a lock: its lease could end at
/// `alive + TTL` at the earliest, where `alive` is the send time of its last answered
/// keepalive (from its release's invoke), and must end by `alive + TTL + X` (the
/// published extension, `LeaseBound::extension_ms`, across leader changes) plus the
/// handover, plus the grant's lock-delay if it asked for one (the lock then goes to
/// nobody for that long after the expiry, and refusals name the expired grant). Two
/// kinds of evidence: an acquire by another worker refused because the stopped
/// holder's grant still held the lock (the refusal names its token), invoked after
/// that, proves the lease lived too long; and the first grant to another worker that
/// was already waiting when the lease could end must complete in time. A grant before
/// `alive + TTL` is an anomaly too (the lease ended early; a grant inside the
/// lock-delay is check (j)'s). Faults that leave the cluster unable to act, or
/// restart a node from its disk, add their duration and an election; a handover that
/// overlaps a clock fault is not measured.
pub fn dead_holders(operations: &[Operation], faults: &[FaultRecord], bound: &LeaseBound) -> CheckResult {
    let ttl_ns = bound.ttl.as_nanos() as u64;
    let election_ns = bound.election.as_nanos() as u64;
    let allowed_ns = bound.extension_ms() * 1_000_000 + bound.handover.as_nanos() as u64;
    let mut anomalies = Vec::new();
    let (mut measured, mut unmeasured, mut excused) = (0usize, 0usize, 0usize);
    // The longest a stopped holder certainly kept its lock past its TTL and
    // lock-delay, and the longest a waiter waited past them.
    let (mut worst_blocked_ns, mut worst_waited_ns) = (0u64, 0u64);
    for holder in stopped_holders(operations, faults) {
        let StoppedHolder { held, release, alive_ns: alive, next } = holder;
        let (Some(held_from), Some(token)) = (held.complete_ns, held.token) else { continue };
        let lease_end = alive + ttl_ns;
        let delay_ns = holder.lock_delay_ns();
        let holder_named = format!("holder-token={token}");
        let blocked = operations
            .iter()
            .filter(|operation| {
                operation.function == Function::Acquire
                    && operation.outcome == Kind::Fail
                    && operation.key == held.key
                    && operation.session != held.session
                    && operation.invoke_ns > held_from
                    && operation.value.as_deref() == Some(holder_named.as_str())
            })
            .max_by_key(|operation| operation.invoke_ns);
        let end = next.and_then(|grant| grant.complete_ns).unwrap_or(release.invoke_ns);
        if in_clock_fault(faults, alive, end) {
            excused += 1;
            continue;
        }
        let overlapping = |fault: &&FaultRecord| fault.start_ns <= end && fault.end_ns >= alive;
        let others_ns: u64 = faults
            .iter()
            .filter(overlapping)
            .filter(|fault| UNAVAILABLE_FAULTS.contains(&fault.fault))
            .map(|fault| fault.end_ns - fault.start_ns + election_ns)
            .sum();
        let limit_ns = allowed_ns + others_ns + delay_ns;
        let mut allowances = Vec::new();
        if others_ns > 0 {
            allowances.push("other faults' time".to_string());
        }
        if delay_ns > 0 {
            allowances.push(format!("its {} ms lock-delay", delay_ns / 1_000_000));
        }
        let with = if allowances.is_empty() { String::new() } else { format!(" (with {})", allowances.join(" and ")) };
        let mut evidence = false;
        if let Some(blocked) = blocked.filter(|blocked| blocked.invoke_ns > lease_end) {
            evidence = true;
            worst_blocked_ns = worst_blocked_ns.max((blocked.invoke_ns - lease_end).saturating_sub(delay_ns));
            if blocked.invoke_ns - lease_end > limit_ns {
                // A refusal in a lock-delay names a grant that expired: the expiry or
                // the delay's end came too late.
                let state =
                    if blocked.error.as_deref() == Some(LOCK_DELAYED) { "in the lock-delay of" } else { "held by" };
                anomalies.push(Anomaly {
                    what: format!(
                        "{} was still {state} its stopped holder {} ms after its TTL ran out; the bound is {} ms{with}",
                        held.key,
                        (blocked.invoke_ns - lease_end) / 1_000_000,
                        limit_ns / 1_000_000,
                    ),
                    operations: vec![held.describe(), release.describe(), blocked.describe()],
                });
            }
        }
        if let Some(next) = next {
            let granted = next.complete_ns.unwrap();
            if granted < lease_end {
                evidence = true;
                anomalies.push(Anomaly {
                    what: format!(
                        "{} was granted {} ms before its stopped holder's lease could end",
                        held.key,
                        (lease_end - granted) / 1_000_000
                    ),
                    operations: vec![held.describe(), release.describe(), next.describe()],
                });
            } else if next.invoke_ns <= lease_end {
                evidence = true;
                worst_waited_ns = worst_waited_ns.max((granted - lease_end).saturating_sub(delay_ns));
                if granted - lease_end > limit_ns {
                    anomalies.push(Anomaly {
                        what: format!(
                            "{} was handed on {} ms after its stopped holder's TTL ran out; the bound is {} ms{with}",
                            held.key,
                            (granted - lease_end) / 1_000_000,
                            limit_ns / 1_000_000,
                        ),
                        operations: vec![held.describe(), release.describe(), next.describe()],
                    });
                }
            }
        }
        if evidence {
            measured += 1;
        } else {
            unmeasured += 1;
        }
    }
    let detail = format!(
        "{measured} stopped holders: held at most {} ms past the TTL and lock-delay as refusals show, a waiter waited at \
         most {} ms past them; published X = {} ms + {} ms handover (TTL {} ms); {unmeasured} with no acquire waiting \
         at or refused after the TTL, {excused} in clock faults",
        worst_blocked_ns / 1_000_000,
        worst_waited_ns / 1_000_000,
        bound.extension_ms(),
        bound.handover.as_millis(),
        bound.ttl.as_millis()
    );
    CheckResult::from_anomalies(DEAD_HOLDER_CHECK_NAME, detail, anomalies)
}

/// (j) No grant during a lock-delay. A stopped holder (as in (i)) whose grant asked
/// for a lock-delay D lost its lock by its session's expiry, unless its release after
/// the stop succeeded (the session outlived the stop). The expiry commits no earlier
/// than `alive + TTL`, and then the cluster gives the lock to nobody for D, across
/// leader changes (a new leader keeps or restarts the timer, never shortens it). So
/// the first grant of the name to another session must complete no earlier than
/// `alive + TTL + D`; the detail gives the smallest margin over that. A refused
/// release proves the expiry; an indeterminate one only when that grant completed
/// before the release was invoked (else the release may have freed the lock without
/// a delay). A handover that overlaps a clock fault is not measured, as in (i): a
/// leader whose clock runs fast ends leases and delays early by design of the fault.
/// Skipped when no stopped holder of a delayed grant was followed by a grant.
pub fn lock_delays(operations: &[Operation], faults: &[FaultRecord], ttl: Duration) -> CheckResult {
    let ttl_ns = ttl.as_nanos() as u64;
    let mut anomalies = Vec::new();
    let (mut measured, mut released, mut unknown, mut never, mut excused) = (0usize, 0usize, 0usize, 0usize, 0usize);
    // The smallest (next grant − delay end) seen, negative inside a delay.
    let mut worst_margin_ns: Option<i128> = None;
    // The delays the history's grants asked for, so that the detail tells a run
    // without delays from one whose delayed holders were never stopped.
    let delays_ms: BTreeSet<u64> = operations
        .iter()
        .filter(|operation| operation.function == Function::Acquire && operation.outcome == Kind::Ok)
        .filter_map(|grant| grant.lock_delay_ms.filter(|delay_ms| *delay_ms > 0))
        .collect();
    for holder in stopped_holders(operations, faults) {
        let delay_ns = holder.lock_delay_ns();
        if delay_ns == 0 {
            continue;
        }
        let Some(next) = holder.next else {
            never += 1;
            continue;
        };
        let Some(granted) = next.complete_ns else { continue };
        let release = holder.release;
        let expired = match release.outcome {
            Kind::Fail => release.error.as_deref() == Some(NOT_HOLDER),
            Kind::Ok => {
                released += 1;
                continue;
            }
            // The release cannot have freed a lock granted to another before it was
            // sent.
            Kind::Info | Kind::Invoke => granted < release.invoke_ns,
        };
        if !expired {
            unknown += 1;
            continue;
        }
        if in_clock_fault(faults, holder.alive_ns, granted) {
            excused += 1;
            continue;
        }
        measured += 1;
        let delay_end = holder.alive_ns + ttl_ns + delay_ns;
        let margin_ns = granted as i128 - delay_end as i128;
        worst_margin_ns = Some(worst_margin_ns.map_or(margin_ns, |worst| worst.min(margin_ns)));
        if granted < delay_end {
            anomalies.push(Anomaly {
                what: format!(
                    "{} was granted {} ms before the {} ms lock-delay of its stopped holder's grant {} could end \
                     (its last keepalive + TTL + lock-delay)",
                    holder.held.key,
                    (delay_end - granted) / 1_000_000,
                    delay_ns / 1_000_000,
                    holder.held.token.unwrap_or(0)
                ),
                operations: vec![holder.held.describe(), release.describe(), next.describe()],
            });
        }
    }
    let detail = format!(
        "{measured} stopped holders of delayed grants (grants' lock-delay {}): {} (last keepalive + TTL {} ms + \
         lock-delay); {released} released after the stop (no expiry), {unknown} with a release of unknown effect, \
         {never} never granted again, {excused} in clock faults",
        if delays_ms.is_empty() {
            "none".to_string()
        } else {
            format!("{} ms", delays_ms.iter().map(u64::to_string).collect::<Vec<_>>().join(", "))
        },
        match worst_margin_ns {
            Some(margin) if margin >= 0 => {
                format!("the next grant came at least {} ms after the delay's end", margin / 1_000_000)
            }
            Some(margin) => format!("a grant came as much as {} ms before the delay's end", -margin / 1_000_000),
            None => "no grant to measure against the delay's end".to_string(),
        },
        ttl.as_millis()
    );
    let mut result = CheckResult::from_anomalies(LOCK_DELAY_CHECK_NAME, detail, anomalies);
    if measured == 0 {
        result.verdict = Verdict::Skipped;
    }
    result
}

/// A node the nemesis brought back on a wiped or corrupted data directory (or a small
/// disk it filled), and how
/// its process ended: it must stop with `expected_exit` instead of serving.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Refusal {
    pub fault: &'static str,
    pub node: u64,
    pub expected_exit: i32,
    /// None: still running at the deadline (it was accepted).
    pub exit: Option<i32>,
    pub at_ns: u64,
}

/// (i) Every node started on a wiped or corrupted data directory stopped with the
/// documented exit code: none served, voted or acknowledged with a log it lost; and
/// every node whose disk filled stopped with the fatal-error code instead of serving on.
pub fn refusals(refusals: &[Refusal]) -> CheckResult {
    let mut anomalies = Vec::new();
    for refusal in refusals {
        if refusal.exit != Some(refusal.expected_exit) {
            anomalies.push(Anomaly {
                what: format!(
                    "{}: node {} at {} ms {} (expected exit code {})",
                    refusal.fault,
                    refusal.node,
                    refusal.at_ns / 1_000_000,
                    match refusal.exit {
                        None => "kept running".to_string(),
                        Some(code) => format!("exited with code {code}"),
                    },
                    refusal.expected_exit
                ),
                operations: Vec::new(),
            });
        }
    }
    CheckResult::from_anomalies(
        "refused-nodes",
        format!("{} node(s) started on a wiped, corrupted or full data directory", refusals.len()),
        anomalies,
    )
}

/// The node-exits check's name in the summary.
pub const NODE_EXITS_CHECK_NAME: &str = "nodes stayed up";

/// A node process that ended on its own where no fault stops nodes (the harness
/// looks between faults, after each fault but for that fault's own targets, and
/// before the final heal restarts what is down).
#[derive(Debug, Clone, serde::Serialize)]
pub struct NodeExit {
    pub node: u64,
    /// The exit code (128 + the signal for a signal).
    pub exit: i32,
    /// When the harness saw it gone.
    pub seen_ns: u64,
    /// The last lines of the node's log, which say why.
    pub log_tail: String,
}

/// No node exited on its own outside the faults that stop nodes: an intruder's
/// forged message (a retire notice, a header that says the node is another
/// incarnation or too old) or a crash must not stop a node, and would otherwise be
/// hidden by the final heal, which restarts every node that is down.
pub fn node_exits(exits: &[NodeExit]) -> CheckResult {
    let anomalies = exits
        .iter()
        .map(|exit| Anomaly {
            what: format!(
                "node {} exited with code {} (seen at {} ms) where no fault stops it",
                exit.node,
                exit.exit,
                exit.seen_ns / 1_000_000
            ),
            operations: exit.log_tail.lines().map(|line| format!("log: {line}")).collect(),
        })
        .collect();
    CheckResult::from_anomalies(
        NODE_EXITS_CHECK_NAME,
        format!("{} unexpected node exit(s) outside the faults that stop nodes", exits.len()),
        anomalies,
    )
}

/// A session kept alive on a stream opened with a tenant credential that was then
/// revoked (the token rotated, or the tenant removed), as its holder saw it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Revocation {
    /// "rotate-token", "remove-tenant" or "end-session" (the admin ended the session).
    pub how: &'static str,
    pub session: u64,
    /// When the revoking command was acknowledged: it took effect by then.
    pub revoked_ns: u64,
    /// The session's keepalive interval.
    pub interval_ns: u64,
    /// When the last keepalive answered alive was sent (0: none).
    pub last_renewal_sent_ns: u64,
}

/// No session was renewed on a revoked credential: each keepalive answered alive was
/// sent before its revocation took effect, or within one keepalive interval after
/// (a keepalive in flight as the revocation commits). A stream that outlives the
/// revocation keeps answering, and its holder keeps the lock it should lose.
pub fn revocations(revocations: &[Revocation]) -> CheckResult {
    let anomalies = revocations
        .iter()
        .filter(|revoked| revoked.last_renewal_sent_ns > revoked.revoked_ns + revoked.interval_ns)
        .map(|revoked| Anomaly {
            what: format!(
                "session {}: a keepalive sent at {} ms was answered alive, {} ms after {} at {} ms (allowed: one \
                 keepalive interval, {} ms)",
                revoked.session,
                revoked.last_renewal_sent_ns / 1_000_000,
                (revoked.last_renewal_sent_ns - revoked.revoked_ns) / 1_000_000,
                revoked.how,
                revoked.revoked_ns / 1_000_000,
                revoked.interval_ns / 1_000_000
            ),
            operations: Vec::new(),
        })
        .collect();
    CheckResult::from_anomalies(
        REVOCATIONS_CHECK_NAME,
        format!("{} session(s) whose tenant credential was revoked while they were kept alive", revocations.len()),
        anomalies,
    )
}

/// The revocations check's name in the summary.
pub const REVOCATIONS_CHECK_NAME: &str = "revoked credentials";

pub const UPGRADE_CHECK_NAME: &str = "rolling upgrade";

/// One node's upgrade from the older release's build to this workspace's.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Upgrade {
    pub node: u64,
    /// How the older build's process ended after SIGTERM; None: it still ran at the
    /// deadline (and was killed).
    pub exit: Option<i32>,
    /// Whether the node, on the new build, applied the leader's commit index within
    /// the recovery deadline.
    pub caught_up: bool,
    pub at_ns: u64,
}

/// Every node started on the older release was upgraded: each stopped cleanly on
/// SIGTERM (exit 0) and caught up with the leader on the new build. The history's
/// own checks say that nothing acknowledged was lost across it.
pub fn upgrades(upgrades: &[Upgrade], nodes: &[u64]) -> CheckResult {
    let mut anomalies = Vec::new();
    for upgrade in upgrades {
        let what = match (upgrade.exit, upgrade.caught_up) {
            (Some(0), true) => continue,
            (Some(0), false) => "did not catch up with the leader on the new build".to_string(),
            (Some(code), _) => format!("exited with code {code} on SIGTERM (expected 0)"),
            (None, _) => "still ran after SIGTERM (killed)".to_string(),
        };
        anomalies.push(Anomaly {
            what: format!("node {} at {} ms {what}", upgrade.node, upgrade.at_ns / 1_000_000),
            operations: Vec::new(),
        });
    }
    for node in nodes {
        if !upgrades.iter().any(|upgrade| upgrade.node == *node) {
            anomalies.push(Anomaly { what: format!("node {node} was never upgraded"), operations: Vec::new() });
        }
    }
    CheckResult::from_anomalies(
        UPGRADE_CHECK_NAME,
        format!("{} of {} node(s) upgraded one at a time", upgrades.len(), nodes.len()),
        anomalies,
    )
}

/// The 99th percentile the other workloads' releases may take beside the flood,
/// outside fault windows (see `latency_beside_flood`). A release is one log entry,
/// a few milliseconds on a quiet cluster; this bound leaves room for a 2-core machine
/// shared by every node and worker, and none for a tenant's flood taking the cluster.
pub const FLOOD_RELEASE_P99_MS_MAX: u64 = 1_000;
/// How long after a fault ends the cluster may still be settling (a new leader, a
/// node catching up): releases then are not held to the bound. With every nemesis,
/// faults follow each other closely: on the 2-core machine a 45 s run with 3 s left
/// no release outside the windows, 1 s left 176 (seed 20261204).
pub const FLOOD_SETTLE_MS: u64 = 1_000;
/// The flood check's name in the summary.
pub const FLOOD_CHECK_NAME: &str = "flood: others' releases stay fast";
/// Releases outside fault windows the check needs to say anything.
pub const FLOOD_RELEASES_MIN: usize = 20;

/// The flood check: while another tenant floods the cluster (the flood workload), the
/// other workloads' releases (lock, permit, leadership) that completed outside every
/// fault's window (from its start to `settle` after its end) took at most `bound` at
/// the 99th percentile; and the flood ran, with commands accepted and refused.
pub fn latency_beside_flood(
    operations: &[Operation],
    faults: &[FaultRecord],
    flood: Option<crate::flood::FloodCounts>,
    settle: Duration,
    bound: Duration,
) -> CheckResult {
    let name = FLOOD_CHECK_NAME;
    let latencies = releases_outside_faults(operations, faults, settle);
    let Some(counts) = flood else {
        let anomaly =
            Anomaly { what: "the flood worker wrote no counts: it did not run to the end".into(), operations: vec![] };
        return CheckResult::from_anomalies(name, String::new(), vec![anomaly]);
    };
    let ran = format!("flood accepted {}, refused {}, failed {}", counts.accepted, counts.refused, counts.failed);
    let mut anomalies = Vec::new();
    if counts.accepted == 0 || counts.refused == 0 {
        anomalies.push(Anomaly { what: format!("the flood did not flood: {ran}"), operations: vec![] });
    }
    judge_release_p99(name, &latencies, bound, &ran, anomalies)
}

/// The intruder check's name in the summary.
pub const INTRUDER_LATENCY_CHECK_NAME: &str = "intruder: others' releases stay fast";

/// The attacks that hold connections open (idle ones, slow readers): beside them the
/// workers' clients must be served as usual.
pub const CONNECTION_ATTACKS: [Attack; 3] = [Attack::IdleHandshakes, Attack::MetricsIdle, Attack::SlowReaderStatus];

/// The intruder's latency check: while it holds idle and slow connections on every
/// port (`CONNECTION_ATTACKS`), the other workloads' releases outside fault windows
/// took at most `bound` at the 99th percentile, as beside the flood; and the
/// connection attacks were tried.
pub fn latency_beside_intruder(
    operations: &[Operation],
    faults: &[FaultRecord],
    settle: Duration,
    bound: Duration,
) -> CheckResult {
    let latencies = releases_outside_faults(operations, faults, settle);
    let counts = attack_counts(operations);
    let tries: Vec<String> = CONNECTION_ATTACKS
        .iter()
        .map(|attack| format!("{} {}", attack.name(), counts.get(attack.name()).map_or(0, |count| count.tries)))
        .collect();
    let ran = format!("beside connection attacks ({})", tries.join(", "));
    let mut anomalies = Vec::new();
    if CONNECTION_ATTACKS.iter().all(|attack| counts.get(attack.name()).is_none_or(|count| count.tries == 0)) {
        anomalies.push(Anomaly { what: format!("no connection attack was tried: {ran}"), operations: vec![] });
    }
    judge_release_p99(INTRUDER_LATENCY_CHECK_NAME, &latencies, bound, &ran, anomalies)
}

/// The other workloads' releases (lock, permit, leadership) that completed outside
/// every fault's window (from its start to `settle` after its end), with the time
/// each took, fastest first.
fn releases_outside_faults<'a>(
    operations: &'a [Operation],
    faults: &[FaultRecord],
    settle: Duration,
) -> Vec<(u64, &'a Operation)> {
    let windows: Vec<(u64, u64)> = faults
        .iter()
        .filter(|fault| fault.outcome != Outcome::Skipped)
        .map(|fault| (fault.start_ns, fault.end_ns + settle.as_nanos() as u64))
        .collect();
    let mut latencies: Vec<(u64, &Operation)> = operations
        .iter()
        .filter(|operation| {
            matches!(operation.function, Function::Release | Function::SemRelease | Function::Resign)
                && operation.outcome == Kind::Ok
        })
        .filter_map(|operation| {
            let complete = operation.complete_ns?;
            let faulted = windows.iter().any(|(start, end)| operation.invoke_ns < *end && complete > *start);
            (!faulted).then(|| (complete.saturating_sub(operation.invoke_ns), operation))
        })
        .collect();
    latencies.sort_by_key(|(latency, _)| *latency);
    latencies
}

/// Fails when the 99th percentile of `latencies` is above `bound` (or `anomalies`
/// already say why); skipped with fewer than `FLOOD_RELEASES_MIN` releases.
fn judge_release_p99(
    name: &'static str,
    latencies: &[(u64, &Operation)],
    bound: Duration,
    ran: &str,
    mut anomalies: Vec<Anomaly>,
) -> CheckResult {
    if latencies.len() < FLOOD_RELEASES_MIN {
        let detail = format!("{} releases outside fault windows, too few to judge; {ran}", latencies.len());
        if anomalies.is_empty() {
            return CheckResult { name, verdict: Verdict::Skipped, detail, anomalies };
        }
        return CheckResult::from_anomalies(name, detail, anomalies);
    }
    let percentile = |share: usize| latencies[(latencies.len() * share / 100).min(latencies.len() - 1)].0;
    let (p50, p99) = (percentile(50), percentile(99));
    let ms = |ns: u64| ns as f64 / 1e6;
    let detail = format!(
        "{} releases outside fault windows: p50 {:.1} ms, p99 {:.1} ms (bound {} ms); {ran}",
        latencies.len(),
        ms(p50),
        ms(p99),
        bound.as_millis()
    );
    if p99 > bound.as_nanos() as u64 {
        let slowest: Vec<String> = latencies
            .iter()
            .rev()
            .take(5)
            .map(|(latency, operation)| format!("{:.1} ms: {}", ms(*latency), operation.describe()))
            .collect();
        anomalies.push(Anomaly {
            what: format!("the p99 of the others' releases was {:.1} ms, above {} ms", ms(p99), bound.as_millis()),
            operations: slowest,
        });
    }
    CheckResult::from_anomalies(name, detail, anomalies)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{NOT_ACQUIRED, NOT_HOLDER};

    use crate::history::test_operation as operation;

    fn grant(process: u64, session: u64, token: u64, invoke: u64, complete: u64) -> Operation {
        operation(process, Function::Acquire, Kind::Ok, "lock/0", session, Some(token), (invoke, Some(complete)))
    }

    fn release(process: u64, session: u64, token: u64, invoke: u64, complete: u64) -> Operation {
        operation(process, Function::Release, Kind::Ok, "lock/0", session, Some(token), (invoke, Some(complete)))
    }

    fn increment(process: u64, key: &str, token: u64, id: &str, outcome: Kind, at: u64) -> Operation {
        let mut increment = operation(
            process,
            Function::Increment,
            outcome,
            key,
            process,
            Some(token),
            (at, if outcome == Kind::Info { None } else { Some(at + 1) }),
        );
        increment.value = Some(id.into());
        increment
    }

    #[test]
    fn increasing_tokens_pass() {
        let history = vec![
            grant(1, 1, 5, 0, 10),
            release(1, 1, 5, 11, 12),
            grant(2, 2, 8, 13, 20),
            // Concurrent with the one above: may be lower.
            grant(3, 3, 7, 14, 30),
        ];
        assert_eq!(tokens(&history).verdict, Verdict::Pass);
    }

    #[test]
    fn a_duplicate_token_is_caught() {
        let history = vec![grant(1, 1, 5, 0, 10), grant(2, 2, 5, 20, 30)];
        let result = tokens(&history);
        assert_eq!(result.verdict, Verdict::Fail);
        assert!(result.anomalies[0].what.contains("two sessions"));
    }

    #[test]
    fn a_decreasing_token_is_caught() {
        let history = vec![grant(1, 1, 9, 0, 10), grant(2, 2, 7, 20, 30)];
        let result = tokens(&history);
        assert_eq!(result.verdict, Verdict::Fail);
        assert!(result.anomalies[0].what.contains("went back"));
    }

    fn counter_history() -> Vec<Operation> {
        vec![
            operation(1, Function::Acquire, Kind::Ok, "counter/0", 1, Some(5), (0, Some(1))),
            increment(1, "counter/0", 5, "1.2", Kind::Ok, 2),
            operation(2, Function::Acquire, Kind::Ok, "counter/0", 2, Some(9), (10, Some(11))),
            increment(2, "counter/0", 9, "2.2", Kind::Ok, 12),
            operation(3, Function::Acquire, Kind::Ok, "counter/0", 3, Some(12), (20, Some(21))),
            increment(3, "counter/0", 12, "3.2", Kind::Fail, 22),
            increment(3, "counter/0", 12, "3.3", Kind::Info, 24),
        ]
    }

    fn accepted(token: u64) -> Write {
        Write { resource: "counter/0".into(), token, value: String::new(), accepted: true }
    }

    #[test]
    fn a_correct_counter_passes() {
        let finals = BTreeMap::from([("counter/0".to_string(), "1.2,2.2".to_string())]);
        let result = fenced_store(&counter_history(), &[accepted(5), accepted(9)], &finals);
        assert_eq!(result.verdict, Verdict::Pass, "{:?}", result.anomalies);
        // The info increment may have applied.
        let finals = BTreeMap::from([("counter/0".to_string(), "1.2,2.2,3.3".to_string())]);
        let result = fenced_store(&counter_history(), &[accepted(5), accepted(9), accepted(12)], &finals);
        assert_eq!(result.verdict, Verdict::Pass, "{:?}", result.anomalies);
    }

    #[test]
    fn a_lost_acknowledged_increment_is_caught() {
        let finals = BTreeMap::from([("counter/0".to_string(), "2.2".to_string())]);
        let result = fenced_store(&counter_history(), &[accepted(5), accepted(9)], &finals);
        assert_eq!(result.verdict, Verdict::Fail);
        assert!(result.anomalies.iter().any(|anomaly| anomaly.what.contains("lost")));
    }

    #[test]
    fn a_double_applied_or_failed_increment_is_caught() {
        let finals = BTreeMap::from([("counter/0".to_string(), "1.2,2.2,2.2".to_string())]);
        let result = fenced_store(&counter_history(), &[accepted(5), accepted(9)], &finals);
        assert!(result.anomalies.iter().any(|anomaly| anomaly.what.contains("more than once")));
        let finals = BTreeMap::from([("counter/0".to_string(), "1.2,2.2,3.2".to_string())]);
        let result = fenced_store(&counter_history(), &[accepted(5), accepted(9)], &finals);
        assert!(result.anomalies.iter().any(|anomaly| anomaly.what.contains("failed increment applied")));
    }

    #[test]
    fn a_stale_or_unissued_accepted_token_is_caught() {
        let finals = BTreeMap::from([("counter/0".to_string(), "1.2,2.2".to_string())]);
        let result = fenced_store(&counter_history(), &[accepted(9), accepted(5)], &finals);
        assert!(result.anomalies.iter().any(|anomaly| anomaly.what.contains("stale")));
        let result = fenced_store(&counter_history(), &[accepted(5), accepted(77)], &finals);
        assert!(result.anomalies.iter().any(|anomaly| anomaly.what.contains("no ok grant issued")));
    }

    #[test]
    fn a_real_store_that_differs_from_the_record_is_caught() {
        let expected = BTreeMap::from([
            ("counter/0".to_string(), vec!["1.2,2.2".to_string()]),
            ("counter/1".to_string(), vec!["3.1".to_string(), "3.1,4.1".to_string()]),
        ]);
        let read = |zero: &str, one: &str| -> Result<BTreeMap<String, String>, String> {
            Ok(BTreeMap::from([
                ("counter/0".to_string(), zero.to_string()),
                ("counter/1".to_string(), one.to_string()),
            ]))
        };
        // The write whose answer was lost may or may not have landed.
        for one in ["3.1", "3.1,4.1"] {
            let result = store_read_back("postgres", &expected, Some(&read("1.2,2.2", one)));
            assert_eq!(result.verdict, Verdict::Pass, "{:?}", result.anomalies);
        }
        let result = store_read_back("postgres", &expected, Some(&read("1.2", "3.1")));
        assert_eq!(result.verdict, Verdict::Fail);
        assert!(result.anomalies[0].what.contains("postgres holds 1 ids"), "{}", result.anomalies[0].what);
        let result = store_read_back("postgres", &expected, Some(&read("1.2,2.2", "")));
        assert_eq!(result.verdict, Verdict::Fail);
        let unreadable = Err("counter/0: connection refused".to_string());
        assert_eq!(store_read_back("redis", &expected, Some(&unreadable)).verdict, Verdict::Unknown);
        assert_eq!(store_read_back("memory", &expected, None).verdict, Verdict::Skipped);
    }

    #[test]
    fn a_grant_lost_in_a_full_restart_is_caught() {
        let history = vec![grant(1, 1, 5, 0, 10), release(1, 1, 5, 11, 12), grant(2, 2, 8, 13, 20)];
        let kept = RestartObservation {
            killed_ns: 100,
            holders: BTreeMap::from([("lock/0".to_string(), Some((2, 8)))]),
            sessions: BTreeSet::from([2]),
        };
        assert_eq!(durability(&history, &[kept]).verdict, Verdict::Pass);
        let lost = RestartObservation {
            killed_ns: 100,
            holders: BTreeMap::from([("lock/0".to_string(), None)]),
            sessions: BTreeSet::from([2]),
        };
        assert_eq!(durability(&history, &[lost]).verdict, Verdict::Fail);
        let went_back = RestartObservation {
            killed_ns: 100,
            holders: BTreeMap::from([("lock/0".to_string(), Some((1, 5)))]),
            sessions: BTreeSet::from([1]),
        };
        assert_eq!(durability(&history, &[went_back]).verdict, Verdict::Fail);
        // The holder's session expired before the kill: free is fine.
        let expired = RestartObservation {
            killed_ns: 100,
            holders: BTreeMap::from([("lock/0".to_string(), None)]),
            sessions: BTreeSet::new(),
        };
        assert_eq!(durability(&history, &[expired]).verdict, Verdict::Pass);
    }

    #[test]
    fn a_non_linearizable_lock_history_is_caught() {
        // Session 2 is granted while 1 holds, and 1 then releases successfully.
        let history = vec![grant(1, 1, 5, 0, 10), grant(2, 2, 9, 20, 30), release(1, 1, 5, 40, 50)];
        let result = linearizability(&history, Duration::from_secs(10));
        assert_eq!(result.verdict, Verdict::Fail);
        // A busy answer when the lock was free.
        let mut busy = operation(3, Function::Acquire, Kind::Fail, "lock/0", 3, None, (60, Some(70)));
        busy.error = Some(NOT_ACQUIRED.into());
        let history = vec![grant(1, 1, 5, 0, 10), release(1, 1, 5, 11, 12), busy];
        assert_eq!(linearizability(&history, Duration::from_secs(10)).verdict, Verdict::Fail);
        // Expiry explains a refused release after a takeover.
        let mut refused = release(1, 1, 5, 40, 50);
        refused.outcome = Kind::Fail;
        refused.error = Some(NOT_HOLDER.into());
        let history = vec![grant(1, 1, 5, 0, 10), grant(2, 2, 9, 20, 30), refused];
        assert_eq!(linearizability(&history, Duration::from_secs(10)).verdict, Verdict::Pass);
    }

    #[test]
    fn liveness_needs_every_worker_to_acquire_in_time() {
        let mut fast = grant(1, 1, 5, 100, 200);
        fast.phase = Phase::Final;
        let mut slow = grant(2, 2, 9, 100, 5_000_000_000);
        slow.phase = Phase::Final;
        let bound = Duration::from_secs(1);
        assert_eq!(liveness(&[fast.clone()], &[1], 0, bound).verdict, Verdict::Pass);
        assert_eq!(liveness(&[fast.clone(), slow], &[1, 2], 0, bound).verdict, Verdict::Fail);
        assert_eq!(liveness(&[fast], &[1, 3], 0, bound).verdict, Verdict::Fail);
    }

    const MS: u64 = 1_000_000;
    const TTL: Duration = Duration::from_secs(3);

    /// A release invoked at `invoke` ms by a session whose last answered keepalive
    /// was sent at `alive` ms.
    fn late_release(process: u64, session: u64, token: u64, invoke: u64, alive: u64) -> Operation {
        let mut release = release(process, session, token, invoke * MS, invoke * MS + MS);
        release.alive_ns = Some(alive * MS);
        release
    }

    fn grant_ms(process: u64, session: u64, token: u64, invoke: u64, complete: u64) -> Operation {
        grant(process, session, token, invoke * MS, complete * MS)
    }

    fn fault(name: &'static str, targets: Vec<u64>, start: u64, end: u64) -> FaultRecord {
        FaultRecord {
            fault: name,
            outcome: Outcome::Installed,
            targets,
            detail: String::new(),
            start_ns: start * MS,
            end_ns: end * MS,
        }
    }

    #[test]
    fn overlapping_beliefs_fail_the_check() {
        let history =
            vec![grant(1, 1, 5, 0, 10), grant(2, 2, 9, 20, 30), release(2, 2, 9, 40, 50), release(1, 1, 5, 60, 70)];
        let result = believed_at_once(&history, TTL, &[]);
        assert_eq!(result.verdict, Verdict::Fail);
        assert_eq!(result.anomalies.len(), 1);
    }

    #[test]
    fn a_stopped_holder_believes_only_until_its_conservative_deadline() {
        // Worker 1 was stopped after a keepalive sent at 100 ms and released at 9 s:
        // it could count on its lock until 100 ms + client_lease_ms(3 s) = 3077 ms.
        let after = vec![grant_ms(1, 1, 5, 0, 10), grant_ms(2, 2, 9, 2_000, 3_100), late_release(1, 1, 5, 9_000, 100)];
        assert_eq!(believed_at_once(&after, TTL, &[]).verdict, Verdict::Pass);
        // A grant to another at 3 s, while worker 1 could still count on it: broken.
        let during = vec![grant_ms(1, 1, 5, 0, 10), grant_ms(2, 2, 9, 2_000, 3_000), late_release(1, 1, 5, 9_000, 100)];
        assert_eq!(believed_at_once(&during, TTL, &[]).verdict, Verdict::Fail);
        // The same inside a clock fault's window is counted, not an anomaly.
        let result = believed_at_once(&during, TTL, &[(2_500 * MS, 8_000 * MS)]);
        assert_eq!(result.verdict, Verdict::Pass);
        assert!(result.detail.contains("1 overlapping beliefs, 1 of them begun in a clock fault"), "{}", result.detail);
    }

    fn stopped_holder(waiter_granted: u64) -> Vec<Operation> {
        vec![
            grant_ms(1, 1, 5, 0, 10),
            grant_ms(2, 2, 9, 500, waiter_granted),
            late_release(1, 1, 5, 7_100, 900),
            release(2, 2, 9, (waiter_granted + 10) * MS, (waiter_granted + 11) * MS),
        ]
    }

    /// A try-lock by worker 3 at `at` ms refused because worker 1's grant (token 5)
    /// still held the lock.
    fn refused(at: u64) -> Operation {
        let mut refused = operation(3, Function::Acquire, Kind::Fail, "lock/0", 3, None, (at * MS, Some(at * MS + MS)));
        refused.value = Some("holder-token=5".into());
        refused
    }

    #[test]
    fn a_stopped_holders_lock_must_reach_the_waiter_within_the_bound() {
        let bound = LeaseBound { ttl: TTL, election: Duration::from_millis(600), handover: Duration::from_millis(200) };
        assert_eq!(bound.extension_ms(), 600 + 100 + 50 + 3 + 600);
        let stop = vec![fault("pause-worker", vec![1], 1_000, 7_000)];
        // The lease could end at 900 + 3000 = 3900 ms; the bound is 1353 + 200 ms after.
        let in_time = dead_holders(&stopped_holder(4_200), &stop, &bound);
        assert_eq!(in_time.verdict, Verdict::Pass, "{in_time:?}");
        assert!(
            in_time.detail.starts_with(
                "1 stopped holders: held at most 0 ms past the TTL and lock-delay as refusals show, a waiter waited at most \
                 300 ms"
            ),
            "{}",
            in_time.detail
        );
        let late = dead_holders(&stopped_holder(5_600), &stop, &bound);
        assert_eq!(late.verdict, Verdict::Fail);
        assert!(late.anomalies[0].what.contains("1700 ms after"), "{:?}", late.anomalies);
        let early = dead_holders(&stopped_holder(3_800), &stop, &bound);
        assert_eq!(early.verdict, Verdict::Fail);
        assert!(early.anomalies[0].what.contains("before its stopped holder's lease could end"));

        // Nobody waited when the lease could end, but a try-lock 2 s past it was still
        // refused in the stopped holder's name: the lease lived too long.
        let mut history = stopped_holder(9_000);
        history[1].invoke_ns = 8_000 * MS;
        let quiet = dead_holders(&history, &stop, &bound);
        assert_eq!(quiet.verdict, Verdict::Pass);
        assert!(quiet.detail.contains("1 with no acquire waiting at or refused after the TTL"), "{}", quiet.detail);
        history.push(refused(4_500));
        let blocked_in_time = dead_holders(&history, &stop, &bound);
        assert_eq!(blocked_in_time.verdict, Verdict::Pass, "{blocked_in_time:?}");
        assert!(blocked_in_time.detail.contains("held at most 600 ms past the TTL"), "{}", blocked_in_time.detail);
        history.push(refused(5_900));
        let blocked = dead_holders(&history, &stop, &bound);
        assert_eq!(blocked.verdict, Verdict::Fail);
        assert!(
            blocked.anomalies[0].what.contains("still held by its stopped holder 2000 ms"),
            "{:?}",
            blocked.anomalies
        );

        // A partition while the lease ran out adds its time and an election.
        let mut partitioned = stop.clone();
        partitioned.push(fault("partition-halves", vec![1, 2], 3_000, 4_000));
        assert_eq!(dead_holders(&stopped_holder(5_600), &partitioned, &bound).verdict, Verdict::Pass);
        // A leader killed and restarted adds its downtime and an election.
        let mut killed = stop.clone();
        killed.push(fault("kill-leader", vec![3], 3_000, 3_000));
        assert_eq!(dead_holders(&stopped_holder(5_600), &killed, &bound).verdict, Verdict::Pass);
        // A clock fault: not measured.
        let mut skewed = stop.clone();
        skewed.push(fault("clock-fast", vec![3], 2_000, 2_500));
        let result = dead_holders(&stopped_holder(3_800), &skewed, &bound);
        assert_eq!(result.verdict, Verdict::Pass);
        assert!(result.detail.contains("1 in clock faults"), "{}", result.detail);
    }

    /// The lock-delay of the lock workload's grants in these tests.
    const DELAY_MS: u64 = 1_500;

    /// `stopped_holder` with a grant that asked for a lock-delay of `DELAY_MS` and a
    /// release after the pause that ended `outcome` (refused: the session expired).
    fn delayed_stopped_holder(waiter_granted: u64, outcome: Kind) -> Vec<Operation> {
        let mut history = stopped_holder(waiter_granted);
        history[0].lock_delay_ms = Some(DELAY_MS);
        history[1].lock_delay_ms = Some(DELAY_MS);
        history[2].outcome = outcome;
        match outcome {
            Kind::Fail => history[2].error = Some(NOT_HOLDER.into()),
            Kind::Info => history[2].complete_ns = None,
            _ => {}
        }
        history
    }

    /// A try-lock by worker 3 at `at` ms refused during the lock-delay of worker 1's
    /// expired grant (token 5).
    fn refused_in_delay(at: u64) -> Operation {
        let mut refused = refused(at);
        refused.error = Some(LOCK_DELAYED.into());
        refused
    }

    #[test]
    fn a_grant_after_the_lock_delay_passes() {
        let stop = vec![fault("pause-worker", vec![1], 1_000, 7_000)];
        // Last keepalive at 900 ms, TTL 3 s, delay 1.5 s: nobody else before 5400 ms.
        let result = lock_delays(&delayed_stopped_holder(5_600, Kind::Fail), &stop, TTL);
        assert_eq!(result.verdict, Verdict::Pass, "{result:?}");
        assert!(
            result.detail.starts_with(
                "1 stopped holders of delayed grants (grants' lock-delay 1500 ms): the next grant came at least 200 ms \
                 after"
            ),
            "{}",
            result.detail
        );
        // A try-lock refused during the delay is what a correct cluster answers.
        let mut history = delayed_stopped_holder(5_600, Kind::Fail);
        history.push(refused_in_delay(4_500));
        assert_eq!(lock_delays(&history, &stop, TTL).verdict, Verdict::Pass);
        // A grant without a delay may be handed on as soon as the lease ends: not
        // this check's business.
        let result = lock_delays(&stopped_holder(4_200), &stop, TTL);
        assert_eq!(result.verdict, Verdict::Skipped, "{result:?}");
        assert!(result.detail.contains("(grants' lock-delay none)"), "{}", result.detail);
    }

    #[test]
    fn a_grant_during_the_lock_delay_is_caught() {
        let stop = vec![fault("pause-worker", vec![1], 1_000, 7_000)];
        let bound = LeaseBound { ttl: TTL, election: Duration::from_millis(600), handover: Duration::from_millis(200) };
        // Granted at 4200 ms: after the lease could end (3900 ms), so (i) is content,
        // but 1200 ms before the delay could end (5400 ms).
        let history = delayed_stopped_holder(4_200, Kind::Fail);
        assert_eq!(dead_holders(&history, &stop, &bound).verdict, Verdict::Pass);
        let result = lock_delays(&history, &stop, TTL);
        assert_eq!(result.verdict, Verdict::Fail);
        assert_eq!(result.anomalies.len(), 1, "{:?}", result.anomalies);
        let what = &result.anomalies[0].what;
        assert!(what.contains("lock/0 was granted 1200 ms before the 1500 ms lock-delay"), "{what}");
        assert_eq!(result.anomalies[0].operations.len(), 3);
        assert!(result.detail.contains("as much as 1200 ms before the delay's end"), "{}", result.detail);
        // An indeterminate release sent after that grant cannot have freed the lock.
        assert_eq!(lock_delays(&delayed_stopped_holder(4_200, Kind::Info), &stop, TTL).verdict, Verdict::Fail);
        // The same grant inside a clock fault is not measured.
        let mut skewed = stop.clone();
        skewed.push(fault("clock-fast", vec![3], 2_000, 2_500));
        let result = lock_delays(&history, &skewed, TTL);
        assert_eq!(result.verdict, Verdict::Skipped, "{result:?}");
        assert!(result.detail.contains("1 in clock faults"), "{}", result.detail);
    }

    #[test]
    fn a_lock_delay_ends_only_by_expiry() {
        let stop = vec![fault("pause-worker", vec![1], 1_000, 7_000)];
        // The holder's release after the pause succeeded: its session outlived the
        // stop, the lock was released, and no delay applies.
        let mut history = delayed_stopped_holder(7_200, Kind::Ok);
        history[1].invoke_ns = 7_150 * MS;
        let result = lock_delays(&history, &stop, TTL);
        assert_eq!(result.verdict, Verdict::Skipped, "{result:?}");
        assert!(result.detail.contains("1 released after the stop (no expiry)"), "{}", result.detail);
        // An indeterminate release sent before the next grant may have freed the lock.
        let mut history = delayed_stopped_holder(7_200, Kind::Info);
        history[1].invoke_ns = 7_150 * MS;
        let result = lock_delays(&history, &stop, TTL);
        assert_eq!(result.verdict, Verdict::Skipped, "{result:?}");
        assert!(result.detail.contains("1 with a release of unknown effect"), "{}", result.detail);
        // Nobody took the lock after the stopped holder.
        let history: Vec<Operation> =
            delayed_stopped_holder(5_600, Kind::Fail).into_iter().filter(|operation| operation.process == 1).collect();
        let result = lock_delays(&history, &stop, TTL);
        assert!(result.detail.contains("1 never granted again"), "{}", result.detail);
    }

    #[test]
    fn a_stopped_holders_bound_allows_its_lock_delay() {
        let bound = LeaseBound { ttl: TTL, election: Duration::from_millis(600), handover: Duration::from_millis(200) };
        let stop = vec![fault("pause-worker", vec![1], 1_000, 7_000)];
        // Handed on 1700 ms after the lease could end: past the bound of 1553 ms
        // without a delay, within it with the 1500 ms delay.
        assert_eq!(dead_holders(&stopped_holder(5_600), &stop, &bound).verdict, Verdict::Fail);
        let delayed = dead_holders(&delayed_stopped_holder(5_600, Kind::Fail), &stop, &bound);
        assert_eq!(delayed.verdict, Verdict::Pass, "{delayed:?}");
        // Measured past the lease and the delay, as X is.
        assert!(delayed.detail.contains("a waiter waited at most 200 ms past them"), "{}", delayed.detail);
        // The delay is allowed once, not without end.
        let late = dead_holders(&delayed_stopped_holder(7_100, Kind::Fail), &stop, &bound);
        assert_eq!(late.verdict, Verdict::Fail);
        assert!(
            late.anomalies[0].what.contains("handed on 3200 ms after its stopped holder's TTL ran out; the bound is 3053 ms (with its 1500 ms lock-delay)"),
            "{:?}",
            late.anomalies
        );
        // Refusals that name the expired grant during its delay are no sign of a
        // lease that lived too long; one past the delay and the bound is.
        let mut history = delayed_stopped_holder(9_000, Kind::Fail);
        history[1].invoke_ns = 8_000 * MS;
        history.push(refused_in_delay(5_300));
        let result = dead_holders(&history, &stop, &bound);
        assert_eq!(result.verdict, Verdict::Pass, "{result:?}");
        assert!(result.detail.contains("held at most 0 ms past the TTL and lock-delay"), "{}", result.detail);
        history.push(refused_in_delay(7_100));
        let result = dead_holders(&history, &stop, &bound);
        assert_eq!(result.verdict, Verdict::Fail);
        assert!(
            result.anomalies[0].what.contains("still in the lock-delay of its stopped holder 3200 ms"),
            "{:?}",
            result.anomalies
        );
    }

    fn permit(process: u64, session: u64, token: u64, invoke: u64, complete: u64) -> Operation {
        operation(
            process,
            Function::SemAcquire,
            Kind::Ok,
            "semaphore/0",
            session,
            Some(token),
            (invoke, Some(complete)),
        )
    }

    /// A release of permit `token`: `outcome` with its session last alive at `alive`.
    fn permit_release(process: u64, session: u64, token: u64, at: u64, outcome: Kind, alive: u64) -> Operation {
        let complete = if outcome == Kind::Info { None } else { Some(at + 1) };
        let mut release =
            operation(process, Function::SemRelease, outcome, "semaphore/0", session, Some(token), (at, complete));
        release.alive_ns = Some(alive);
        if outcome == Kind::Fail {
            release.error = Some(NOT_HOLDER.into());
        }
        release
    }

    #[test]
    fn k_holders_of_a_semaphore_pass() {
        let history = vec![
            permit(1, 1, 5, 0, 10),
            permit(2, 2, 6, 0, 12),
            // A third permit only after the first release was invoked.
            permit_release(1, 1, 5, 20, Kind::Ok, 15),
            permit(3, 3, 9, 15, 21),
            permit_release(2, 2, 6, 30, Kind::Ok, 25),
            permit_release(3, 3, 9, 40, Kind::Ok, 35),
        ];
        let result = semaphore_holders(&history, 2);
        assert_eq!(result.verdict, Verdict::Pass, "{:?}", result.anomalies);
    }

    #[test]
    fn k_plus_one_holders_of_a_semaphore_are_caught() {
        let history = vec![
            permit(1, 1, 5, 0, 10),
            permit(2, 2, 6, 0, 12),
            permit(3, 3, 9, 13, 14),
            permit_release(1, 1, 5, 20, Kind::Ok, 15),
            permit_release(2, 2, 6, 30, Kind::Ok, 25),
            permit_release(3, 3, 9, 40, Kind::Ok, 35),
        ];
        let result = semaphore_holders(&history, 2);
        assert_eq!(result.verdict, Verdict::Fail);
        assert!(result.anomalies[0].what.contains("3 permits of semaphore/0"), "{:?}", result.anomalies);
        assert_eq!(result.anomalies[0].operations.len(), 3);
        // A refused release still proves the holding up to the session's last
        // answered keepalive: here that keepalive came after the third grant.
        let history = vec![
            permit(1, 1, 5, 0, 10),
            permit(2, 2, 6, 0, 12),
            permit(3, 3, 9, 13, 14),
            permit_release(1, 1, 5, 20, Kind::Fail, 16),
            permit_release(2, 2, 6, 30, Kind::Info, 25),
            permit_release(3, 3, 9, 40, Kind::Ok, 35),
        ];
        assert_eq!(semaphore_holders(&history, 2).verdict, Verdict::Fail);
        // A token smaller than one answered before the grant was asked for.
        let history = vec![permit(1, 1, 7, 0, 10), permit(2, 2, 5, 20, 30)];
        let result = semaphore_holders(&history, 2);
        assert!(result.anomalies.iter().any(|anomaly| anomaly.what.contains("went back")), "{:?}", result.anomalies);
        // The same, with the later grant still pending when the first was answered.
        let history = vec![permit(1, 1, 7, 0, 10), permit(2, 2, 5, 5, 30)];
        assert_eq!(semaphore_holders(&history, 2).verdict, Verdict::Pass);
    }

    #[test]
    fn permits_granted_in_one_entry_share_its_token() {
        // Two sessions granted by one entry: one token, two permits, within the limit.
        let history = vec![
            permit(1, 1, 5, 0, 10),
            permit(2, 2, 5, 0, 10),
            permit_release(1, 1, 5, 20, Kind::Ok, 15),
            permit_release(2, 2, 5, 20, Kind::Ok, 15),
        ];
        let result = semaphore_holders(&history, 2);
        assert_eq!(result.verdict, Verdict::Pass, "{:?}", result.anomalies);
        // The same two and a third at once are over a limit of 2, shared token or not.
        let mut history = history;
        history.push(permit(3, 3, 5, 0, 10));
        history.push(permit_release(3, 3, 5, 20, Kind::Ok, 15));
        let result = semaphore_holders(&history, 2);
        assert!(result.anomalies.iter().any(|anomaly| anomaly.what.contains("3 permits")), "{:?}", result.anomalies);
    }

    #[test]
    fn a_permit_whose_holder_paused_past_its_ttl_may_be_granted_again() {
        // Worker 1 stops after its last keepalive at 11; its session expires and
        // two permits are granted; its release after the pause is refused.
        let history = vec![
            permit(1, 1, 5, 0, 10),
            permit(2, 2, 6, 0, 12),
            permit(3, 3, 9, 13, 3_000),
            permit_release(1, 1, 5, 5_000, Kind::Fail, 11),
            permit_release(2, 2, 6, 5_100, Kind::Ok, 5_000),
            permit_release(3, 3, 9, 5_200, Kind::Ok, 5_000),
        ];
        let result = semaphore_holders(&history, 2);
        assert_eq!(result.verdict, Verdict::Pass, "{:?}", result.anomalies);
        // An indeterminate release proves no more than a refused one.
        let mut history = history;
        history[3] = permit_release(1, 1, 5, 5_000, Kind::Info, 11);
        assert_eq!(semaphore_holders(&history, 2).verdict, Verdict::Pass);
    }

    fn campaign(process: u64, key: &str, session: u64, token: u64, invoke: u64, complete: u64) -> Operation {
        operation(process, Function::Campaign, Kind::Ok, key, session, Some(token), (invoke, Some(complete)))
    }

    /// An observed state: the leader's session and token, or vacant.
    fn observed(process: u64, sequence: u64, key: &str, leader: Option<(u64, u64)>) -> Operation {
        let mut observation = operation(
            process,
            Function::Observe,
            Kind::Ok,
            key,
            0,
            leader.map(|(_, token)| token),
            (sequence, Some(sequence)),
        );
        observation.leader_session = leader.map(|(session, _)| session);
        observation
    }

    #[test]
    fn one_leader_per_token_passes() {
        let history = vec![
            campaign(1, "election/0", 1, 5, 0, 10),
            observed(9, 1, "election/0", Some((1, 5))),
            observed(9, 2, "election/0", None),
            campaign(2, "election/0", 2, 8, 20, 30),
            // Concurrent with the one above: may be lower.
            campaign(3, "election/1", 3, 7, 25, 40),
            campaign(4, "election/1", 4, 6, 26, 50),
            observed(9, 3, "election/0", Some((2, 8))),
            observed(9, 4, "election/0", Some((2, 8))),
        ];
        let result = elections(&history);
        assert_eq!(result.verdict, Verdict::Pass, "{:?}", result.anomalies);
    }

    #[test]
    fn two_leaders_with_one_token_are_caught() {
        let history = vec![campaign(1, "election/0", 1, 5, 0, 10), campaign(2, "election/0", 2, 5, 5, 15)];
        let result = elections(&history);
        assert_eq!(result.verdict, Verdict::Fail);
        assert!(result.anomalies[0].what.contains("two sessions"));
        // An observer sees the token with another session than the one that won.
        let history = vec![campaign(1, "election/0", 1, 5, 0, 10), observed(9, 1, "election/0", Some((2, 5)))];
        assert_eq!(elections(&history).verdict, Verdict::Fail);
    }

    #[test]
    fn a_leadership_token_that_does_not_increase_is_caught() {
        let history = vec![campaign(1, "election/0", 1, 9, 0, 10), campaign(2, "election/0", 2, 7, 20, 30)];
        let result = elections(&history);
        assert_eq!(result.verdict, Verdict::Fail);
        assert!(result.anomalies[0].what.contains("did not increase"));
    }

    #[test]
    fn an_observer_going_back_is_caught() {
        let history = vec![
            observed(9, 1, "election/0", Some((1, 5))),
            observed(9, 2, "election/0", Some((2, 8))),
            observed(9, 3, "election/0", None),
            observed(9, 4, "election/0", Some((1, 5))),
        ];
        let result = elections(&history);
        assert_eq!(result.verdict, Verdict::Fail);
        assert!(result.anomalies[0].what.contains("went back"), "{:?}", result.anomalies);
    }

    fn replica(node: u64, name: &str, holders: Vec<(u64, u64)>, leader: Option<(u64, u64)>) -> ReplicaState {
        let limit = if name.starts_with("semaphore") { Some(2) } else { None };
        ReplicaState { node, at_ns: 0, name: name.into(), limit, holders, leader }
    }

    #[test]
    fn replica_states_within_the_limits_pass_and_beyond_them_fail() {
        let history = vec![campaign(1, "election/0", 1, 5, 0, 10)];
        let good = vec![
            replica(1, "semaphore/0", vec![(1, 5), (2, 6)], None),
            replica(2, "semaphore/0", vec![(1, 5)], None),
            replica(1, "election/0", Vec::new(), Some((1, 5))),
            replica(2, "election/0", Vec::new(), Some((3, 9))),
            replica(3, "election/0", Vec::new(), Some((3, 9))),
        ];
        let result = replica_states(&history, &good, 2);
        assert_eq!(result.verdict, Verdict::Pass, "{:?}", result.anomalies);
        let too_many = vec![replica(1, "semaphore/0", vec![(1, 5), (2, 6), (3, 7)], None)];
        assert_eq!(replica_states(&history, &too_many, 2).verdict, Verdict::Fail);
        // Two permits granted by one entry share its token.
        let one_entry = vec![replica(1, "semaphore/0", vec![(1, 7), (2, 7)], None)];
        assert_eq!(replica_states(&history, &one_entry, 2).verdict, Verdict::Pass);
        let one_session_twice = vec![replica(1, "semaphore/0", vec![(1, 5), (1, 7)], None)];
        assert_eq!(replica_states(&history, &one_session_twice, 2).verdict, Verdict::Fail);
        let two_leaders = vec![replica(2, "election/0", Vec::new(), Some((4, 5)))];
        assert_eq!(replica_states(&history, &two_leaders, 2).verdict, Verdict::Fail);
        let across_nodes = vec![
            replica(1, "election/0", Vec::new(), Some((3, 9))),
            replica(2, "election/0", Vec::new(), Some((4, 9))),
        ];
        assert_eq!(replica_states(&[], &across_nodes, 2).verdict, Verdict::Fail);
    }

    /// One try of `attack` at `at`: refused, unknown or (ok) succeeded.
    fn attack_try(attack: Attack, outcome: Kind, at: u64) -> Operation {
        let complete = if outcome == Kind::Info { None } else { Some(at + 1) };
        let mut try_ = operation(19, Function::Attack, outcome, attack.name(), 42, None, (at, complete));
        try_.value = Some(format!("{} tried", attack.name()));
        match outcome {
            Kind::Ok => try_.evidence = Some("the lock was released".into()),
            Kind::Fail => try_.error = Some("PERMISSION_DENIED".into()),
            _ => try_.error = Some("no answer within 3000 ms".into()),
        }
        try_
    }

    /// Every attack refused `times` times, with an unknown try of each in between.
    fn attacks_refused(times: u64) -> Vec<Operation> {
        let mut history = Vec::new();
        for (index, attack) in Attack::ALL.into_iter().enumerate() {
            for round in 0..times {
                history.push(attack_try(attack, Kind::Fail, 1_000 * (round * 100 + index as u64)));
            }
            history.push(attack_try(attack, Kind::Info, 999_000 + index as u64));
        }
        history
    }

    #[test]
    fn attacks_that_were_all_refused_pass() {
        let mut history = attacks_refused(4);
        let mut unexpected = attack_try(Attack::AddTenant, Kind::Fail, 5);
        unexpected.error = Some(format!("{UNEXPECTED_REFUSAL} TENANT_EXISTS: tenant \"x\" exists"));
        history.push(unexpected);
        let result = attacks(&history, &Attack::ALL);
        assert_eq!(result.verdict, Verdict::Pass, "{:?}", result.anomalies);
        assert!(result.detail.contains("1 with an unexpected reason"), "{}", result.detail);
        let counts = attack_counts(&history);
        assert_eq!(counts[Attack::AddTenant.name()].refused, 5);
        assert_eq!(counts[Attack::AddTenant.name()].reasons["PERMISSION_DENIED"], 4);
        assert_eq!(counts[Attack::AddTenant.name()].unknown, 1);
    }

    #[test]
    fn one_successful_attack_fails_the_run() {
        let mut history = attacks_refused(4);
        history.push(attack_try(Attack::HijackRelease, Kind::Ok, 7_000_000));
        let result = attacks(&history, &Attack::ALL);
        assert_eq!(result.verdict, Verdict::Fail);
        assert_eq!(result.anomalies.len(), 1, "{:?}", result.anomalies);
        let what = &result.anomalies[0].what;
        assert!(what.contains("hijack-release succeeded at 7 ms"), "{what}");
        assert!(what.contains("the lock was released"), "{what}");
    }

    #[test]
    fn attacks_that_were_never_refused_are_vacuous() {
        let result = attacks(&[], &Attack::ALL);
        assert_eq!(result.verdict, Verdict::Fail);
        assert!(result.anomalies.iter().all(|anomaly| anomaly.what.starts_with("vacuous")));
        assert_eq!(result.anomalies.len(), Attack::ALL.len() + AttackKind::ALL.len());
        // Tries that all went unanswered prove nothing either.
        let unanswered: Vec<Operation> =
            Attack::ALL.into_iter().map(|attack| attack_try(attack, Kind::Info, 10)).collect();
        assert_eq!(attacks(&unanswered, &Attack::ALL).verdict, Verdict::Fail);
        // One attack never refused: named.
        let history: Vec<Operation> =
            attacks_refused(4).into_iter().filter(|try_| try_.key != Attack::PeerRogueCa.name()).collect();
        let result = attacks(&history, &Attack::ALL);
        assert_eq!(result.verdict, Verdict::Fail);
        assert!(result.anomalies.iter().any(|anomaly| anomaly.what.contains("attack peer-rogue-ca was refused 0")));
        // A kind refused too rarely, although each of its attacks was refused.
        let result = attacks(&attacks_refused(1), &Attack::ALL);
        assert_eq!(result.verdict, Verdict::Fail);
        assert!(result.anomalies.iter().any(|anomaly| anomaly.what.contains("(a) unauthenticated attacks")));
    }

    fn refusal(exit: Option<i32>) -> Refusal {
        Refusal { fault: "wipe-rejoin", node: 2, expected_exit: 4, exit, at_ns: 7_000_000 }
    }

    #[test]
    fn a_wiped_node_that_stopped_passes_and_one_that_served_fails() {
        assert_eq!(refusals(&[refusal(Some(4))]).verdict, Verdict::Pass);
        assert_eq!(refusals(&[]).verdict, Verdict::Pass);
        let accepted = refusals(&[refusal(Some(4)), refusal(None)]);
        assert_eq!(accepted.verdict, Verdict::Fail);
        assert_eq!(accepted.anomalies.len(), 1);
        assert!(accepted.anomalies[0].what.contains("node 2 at 7 ms kept running"), "{:?}", accepted.anomalies);
        let crashed = refusals(&[refusal(Some(134))]);
        assert_eq!(crashed.verdict, Verdict::Fail, "a crash is not the documented refusal");
        assert!(crashed.anomalies[0].what.contains("exited with code 134"));
    }

    #[test]
    fn a_session_renewed_past_its_credentials_revocation_fails() {
        let revoked = |last_renewal_sent_ns| Revocation {
            how: "rotate-token",
            session: 17,
            revoked_ns: 4_000_000_000,
            interval_ns: 600_000_000,
            last_renewal_sent_ns,
        };
        assert_eq!(revocations(&[]).verdict, Verdict::Pass);
        // Renewed before the revocation, and a keepalive in flight as it committed.
        assert_eq!(revocations(&[revoked(3_900_000_000), revoked(4_500_000_000)]).verdict, Verdict::Pass);
        assert_eq!(revocations(&[revoked(0)]).verdict, Verdict::Pass, "never renewed");
        // Renewed on after the stream should have ended.
        let outlived = revocations(&[revoked(3_900_000_000), revoked(9_000_000_000)]);
        assert_eq!(outlived.verdict, Verdict::Fail);
        assert_eq!(outlived.anomalies.len(), 1);
        assert!(
            outlived.anomalies[0].what.contains("sent at 9000 ms was answered alive, 5000 ms after rotate-token"),
            "{:?}",
            outlived.anomalies
        );
    }

    #[test]
    fn a_node_that_exited_outside_the_faults_fails_the_run() {
        assert_eq!(node_exits(&[]).verdict, Verdict::Pass);
        let stopped = NodeExit {
            node: 3,
            exit: 4,
            seen_ns: 12_000_000,
            log_tail: "the cluster knows node 3 as incarnation 12345\nexit code 4".into(),
        };
        let result = node_exits(&[stopped]);
        assert_eq!(result.verdict, Verdict::Fail);
        assert_eq!(result.anomalies.len(), 1);
        let anomaly = &result.anomalies[0];
        assert!(anomaly.what.contains("node 3 exited with code 4 (seen at 12 ms)"), "{}", anomaly.what);
        assert_eq!(anomaly.operations, vec!["log: the cluster knows node 3 as incarnation 12345", "log: exit code 4"]);
    }

    fn upgrade(node: u64, exit: Option<i32>, caught_up: bool) -> Upgrade {
        Upgrade { node, exit, caught_up, at_ns: 9_000_000 }
    }

    #[test]
    fn an_upgrade_passes_only_if_every_node_stopped_cleanly_and_caught_up() {
        let clean = [upgrade(1, Some(0), true), upgrade(2, Some(0), true), upgrade(3, Some(0), true)];
        assert_eq!(upgrades(&clean, &[1, 2, 3]).verdict, Verdict::Pass);
        let missing = upgrades(&clean[..2], &[1, 2, 3]);
        assert_eq!(missing.verdict, Verdict::Fail);
        assert!(missing.anomalies[0].what.contains("node 3 was never upgraded"), "{:?}", missing.anomalies);
        let crashed =
            upgrades(&[upgrade(1, Some(134), true), upgrade(2, None, true), upgrade(3, Some(0), false)], &[1, 2, 3]);
        assert_eq!(crashed.verdict, Verdict::Fail);
        let found: Vec<&str> = crashed.anomalies.iter().map(|anomaly| anomaly.what.as_str()).collect();
        assert!(found[0].contains("node 1 at 9 ms exited with code 134"), "{found:?}");
        assert!(found[1].contains("still ran after SIGTERM"), "{found:?}");
        assert!(found[2].contains("did not catch up"), "{found:?}");
    }

    fn release_taking(process: u64, start_ms: u64, took_ms: u64) -> Operation {
        operation(
            process,
            Function::Release,
            Kind::Ok,
            "lock/0",
            7,
            Some(3),
            (start_ms * MS, Some((start_ms + took_ms) * MS)),
        )
    }

    fn flooded() -> Option<crate::flood::FloodCounts> {
        Some(crate::flood::FloodCounts { accepted: 500, refused: 700, failed: 3 })
    }

    #[test]
    fn slow_releases_beside_the_flood_fail_the_check_and_those_in_fault_windows_do_not_count() {
        let (settle, bound) = (Duration::from_millis(FLOOD_SETTLE_MS), Duration::from_millis(FLOOD_RELEASE_P99_MS_MAX));
        let fast: Vec<Operation> = (0..100).map(|n| release_taking(1, n * 100, 5)).collect();
        assert_eq!(latency_beside_flood(&fast, &[], flooded(), settle, bound).verdict, Verdict::Pass);

        // A fifth of the releases take 2 s, outside any fault: the others were starved.
        let mut slow = fast.clone();
        slow.extend((0..25).map(|n| release_taking(2, 20_000 + n * 3_000, 2_000)));
        let result = latency_beside_flood(&slow, &[], flooded(), settle, bound);
        assert_eq!(result.verdict, Verdict::Fail, "{}", result.detail);

        // The same slow releases inside a fault's window (a leader kill and its
        // election) are the fault's, not the flood's.
        let kill = fault("kill", vec![1], 19_000, 20_000 + 25 * 3_000);
        assert_eq!(latency_beside_flood(&slow, &[kill], flooded(), settle, bound).verdict, Verdict::Pass);
    }

    #[test]
    fn slow_releases_beside_the_intruders_connections_fail_its_check() {
        let (settle, bound) = (Duration::from_millis(FLOOD_SETTLE_MS), Duration::from_millis(FLOOD_RELEASE_P99_MS_MAX));
        let mut fast: Vec<Operation> = (0..100).map(|n| release_taking(1, n * 100, 5)).collect();
        // Without a connection attack tried, the check proves nothing.
        assert_eq!(latency_beside_intruder(&fast, &[], settle, bound).verdict, Verdict::Fail);
        fast.push(attack_try(Attack::SlowReaderStatus, Kind::Fail, 50));
        assert_eq!(latency_beside_intruder(&fast, &[], settle, bound).verdict, Verdict::Pass);
        let mut slow = fast.clone();
        slow.extend((0..25).map(|n| release_taking(2, 20_000 + n * 3_000, 2_000)));
        let result = latency_beside_intruder(&slow, &[], settle, bound);
        assert_eq!(result.verdict, Verdict::Fail, "{}", result.detail);
    }

    #[test]
    fn a_flood_that_did_not_flood_or_wrote_nothing_fails_the_check() {
        let (settle, bound) = (Duration::from_millis(FLOOD_SETTLE_MS), Duration::from_millis(FLOOD_RELEASE_P99_MS_MAX));
        let fast: Vec<Operation> = (0..100).map(|n| release_taking(1, n * 100, 5)).collect();
        assert_eq!(latency_beside_flood(&fast, &[], None, settle, bound).verdict, Verdict::Fail);
        let idle = Some(crate::flood::FloodCounts { accepted: 0, refused: 40, failed: 0 });
        assert_eq!(latency_beside_flood(&fast, &[], idle, settle, bound).verdict, Verdict::Fail);
        let few = &fast[..5];
        assert_eq!(latency_beside_flood(few, &[], flooded(), settle, bound).verdict, Verdict::Skipped);
    }
}
