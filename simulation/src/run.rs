//! One seed: a cluster of 3 or 5 nodes and its workers under turmoil, the faults the
//! seed draws (a node isolated, a crash that loses the unsynced writes and a
//! restart, a clock at another rate or jumped forward), then a healed final phase;
//! the white-box checks between steps and the fault suite's checks on the history.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use leasehold_jepsen::checker::{self, CheckResult, Verdict};
use leasehold_jepsen::history;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use leasehold_server::shell::clock::RATE_PER_MILLE_NORMAL;

use crate::host::{node_ip, worker_ip, SimulatedNode};
use crate::replicas::ReplicaChecks;
use crate::workload::{self, Shared};

/// What one seed runs.
#[derive(Clone, Debug)]
pub struct Options {
    pub nodes: u64,
    pub workers: u64,
    /// Simulated time with faults.
    pub faulty: Duration,
    /// Simulated time after the last heal.
    pub healed: Duration,
    /// A known bug planted for the controls.
    pub bug: Option<Bug>,
}

/// The known bugs `--bug` plants, each of which a check must find.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Bug {
    /// The store ignores tokens: a stalled holder's late write lands.
    NoFencing,
    /// A new leader restarts every live session at half its TTL, ending leases their
    /// holders still count on (`--test-short-lease-restart`).
    LeaseShortened,
}

impl Default for Options {
    fn default() -> Options {
        Options { nodes: 3, workers: 4, faulty: Duration::from_secs(10), healed: Duration::from_secs(3), bug: None }
    }
}

/// What one seed showed.
pub struct Outcome {
    pub seed: u64,
    pub checks: Vec<CheckResult>,
    pub operations: usize,
    pub faults: Vec<String>,
    pub simulated: Duration,
    /// Set when the simulation itself failed (a node's software returned an error).
    pub error: Option<String>,
    /// The run's events in the order they happened: the faults and every record of
    /// the history, one JSON object a line (what `--trace` writes).
    pub trace: Vec<String>,
}

impl Outcome {
    pub fn valid(&self) -> bool {
        self.error.is_none() && self.checks.iter().all(|check| check.verdict != Verdict::Fail)
    }

    /// One line naming what failed.
    pub fn failure(&self) -> String {
        if let Some(error) = &self.error {
            return error.clone();
        }
        self.checks
            .iter()
            .filter(|check| check.verdict == Verdict::Fail)
            .map(|check| {
                let first = check.anomalies.first().map(|anomaly| anomaly.what.clone()).unwrap_or_default();
                format!("{}: {first}", check.name)
            })
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// A fault in effect, to be healed.
enum Fault {
    /// The node is cut off from every other host.
    Isolated(u64),
    /// The node's process is down (its unsynced writes lost).
    Crashed(u64),
    /// The node's clock runs at another rate (per mille), after a jump forward.
    Skewed(u64),
}

/// How often (simulated) the white-box checks look at the nodes.
const REPLICA_SAMPLE_MS: u64 = 25;

/// Runs `seed`.
pub fn run(seed: u64, options: &Options) -> Outcome {
    leasehold_server::raft::runtime::seed_this_thread(seed);
    leasehold::random::seed_this_thread(seed.rotate_left(17));
    let root = tempfile::tempdir().expect("a temporary directory");
    let stop_at = options.faulty + options.healed;
    let mut sim = turmoil::Builder::new()
        .simulation_duration(stop_at + Duration::from_secs(30))
        .tick_duration(Duration::from_millis(1))
        .min_message_latency(Duration::from_micros(200))
        .max_message_latency(Duration::from_millis(3))
        .rng_seed(seed)
        .enable_tokio_io()
        .build();
    let mut nodes = Vec::new();
    let mut outcome = Outcome {
        seed,
        checks: Vec::new(),
        operations: 0,
        faults: Vec::new(),
        simulated: Duration::ZERO,
        error: None,
        trace: Vec::new(),
    };
    for id in 1..=options.nodes {
        let lease_shortened = options.bug == Some(Bug::LeaseShortened);
        let node = match SimulatedNode::new(id, options.nodes, root.path(), seed, lease_shortened) {
            Ok(node) => Arc::new(node),
            Err(error) => {
                outcome.error = Some(error.to_string());
                return outcome;
            }
        };
        let software = node.clone();
        sim.host(node_ip(id), move || software.clone().serve());
        nodes.push(node);
    }
    let shared = Shared::new(options.bug != Some(Bug::NoFencing));
    for process in 1..=options.workers {
        let shared = shared.clone();
        let (count, faulty) = (options.nodes, options.faulty);
        sim.client(worker_ip(process), workload::run_worker(process, count, seed, faulty, stop_at, shared));
    }

    let mut random = StdRng::seed_from_u64(seed.rotate_left(29));
    let mut next_fault = Duration::from_millis(random.random_range(500..2_000));
    let mut in_effect: Option<(Fault, Duration)> = None;
    // When each clock fault began and was healed (simulated ns).
    let mut clock_faults: Vec<(u64, u64)> = Vec::new();
    let mut clock_fault_since = 0u64;
    let mut healed = false;
    let mut replicas = ReplicaChecks::default();
    let mut next_sample = Duration::ZERO;
    loop {
        let now = sim.elapsed();
        if now >= next_sample {
            replicas.sample(&nodes, now.as_millis());
            next_sample = now + Duration::from_millis(REPLICA_SAMPLE_MS);
        }
        if !healed && now >= options.faulty {
            if let Some((fault, _)) = in_effect.take() {
                if matches!(fault, Fault::Skewed(_)) {
                    clock_faults.push((clock_fault_since, now.as_nanos() as u64));
                }
                heal(&mut sim, &nodes, options.workers, fault, &mut outcome.faults, now);
            }
            healed = true;
        }
        if !healed {
            if let Some((_, until)) = &in_effect {
                if now >= *until {
                    let (fault, _) = in_effect.take().expect("checked");
                    if matches!(fault, Fault::Skewed(_)) {
                        clock_faults.push((clock_fault_since, now.as_nanos() as u64));
                    }
                    heal(&mut sim, &nodes, options.workers, fault, &mut outcome.faults, now);
                    next_fault = now + Duration::from_millis(random.random_range(200..1_500));
                }
            } else if now >= next_fault {
                let node = random.random_range(1..=options.nodes);
                let lasting = Duration::from_millis(random.random_range(300..3_000));
                let kind = random.random_range(0..10);
                let fault = if kind < 4 {
                    for other in (1..=options.nodes).filter(|other| *other != node) {
                        sim.partition(node_ip(node), node_ip(other));
                    }
                    for process in 1..=options.workers {
                        sim.partition(node_ip(node), worker_ip(process));
                    }
                    outcome.faults.push(format!("{:>6} ms isolate node {node}", now.as_millis()));
                    Fault::Isolated(node)
                } else if kind < 8 {
                    sim.crash(node_ip(node));
                    let crashed = &nodes[node as usize - 1];
                    crashed.disk.crash();
                    *crashed.replica.lock().unwrap() = None;
                    outcome.faults.push(format!("{:>6} ms crash node {node}", now.as_millis()));
                    Fault::Crashed(node)
                } else {
                    let rate_per_mille = random.random_range(500..=2_000);
                    let jump_ms = if random.random_bool(0.5) { random.random_range(0..=3_000) } else { 0 };
                    nodes[node as usize - 1].clock.skew(rate_per_mille, jump_ms);
                    clock_fault_since = now.as_nanos() as u64;
                    outcome.faults.push(format!(
                        "{:>6} ms clock of node {node} at {rate_per_mille}/1000, jumped {jump_ms} ms",
                        now.as_millis()
                    ));
                    Fault::Skewed(node)
                };
                in_effect = Some((fault, now + lasting));
            }
        }
        match sim.step() {
            Ok(true) => break,
            Ok(false) => {}
            Err(error) => {
                outcome.error = Some(format!("the simulation stopped: {error}"));
                break;
            }
        }
    }
    outcome.simulated = sim.elapsed();
    let records = shared.records.lock().unwrap().clone();
    outcome.trace = outcome.faults.iter().map(|fault| format!("{{\"fault\":{fault:?}}}")).collect();
    outcome.trace.extend(records.iter().map(|record| serde_json::to_string(record).expect("a record encodes")));
    let operations = history::operations(&records);
    outcome.operations = operations.len();
    let final_values: BTreeMap<String, String> = workload::KEYS
        .iter()
        .filter_map(|key| shared.store.read(key).map(|(_, list)| (key.to_string(), list)))
        .collect();
    outcome.checks.push(checker::tokens(&operations));
    outcome.checks.push(checker::fenced_store(&operations, &shared.store.writes(), &final_values));
    outcome.checks.push(checker::linearizability(&operations, Duration::from_secs(10)));
    // A leader whose clock runs fast ends leases early: that is what the fault is
    // for, so beliefs that overlap from a clock fault on (and two TTLs after) are
    // counted apart, as the fault suite counts them.
    let ttl = Duration::from_millis(workload::SESSION_TTL_MS);
    let excused: Vec<(u64, u64)> =
        clock_faults.iter().map(|(from, to)| (*from, to + 2 * ttl.as_nanos() as u64)).collect();
    outcome.checks.push(checker::believed_at_once(&operations, ttl, &excused));
    outcome.checks.push(replicas.result());
    outcome
}

fn heal(
    sim: &mut turmoil::Sim<'_>,
    nodes: &[Arc<SimulatedNode>],
    workers: u64,
    fault: Fault,
    log: &mut Vec<String>,
    now: Duration,
) {
    match fault {
        Fault::Isolated(node) => {
            for other in nodes.iter().filter(|other| other.id != node) {
                sim.repair(node_ip(node), node_ip(other.id));
            }
            for process in 1..=workers {
                sim.repair(node_ip(node), worker_ip(process));
            }
            log.push(format!("{:>6} ms heal node {node}", now.as_millis()));
        }
        Fault::Crashed(node) => {
            sim.bounce(node_ip(node));
            log.push(format!("{:>6} ms restart node {node}", now.as_millis()));
        }
        Fault::Skewed(node) => {
            nodes[node as usize - 1].clock.skew(RATE_PER_MILLE_NORMAL, 0);
            log.push(format!("{:>6} ms clock of node {node} at the normal rate", now.as_millis()));
        }
    }
}
