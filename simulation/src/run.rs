//! One seed: a cluster of 3 or 5 nodes and its workers under turmoil, the faults the
//! seed draws (a node isolated, its messages to or from its peers lost, its
//! messages held and delivered late, a crash that loses the unsynced writes and a
//! restart, a clock at another rate or jumped forward, a disk replaced by an empty
//! one, also in the first second, a full disk, a slow disk), then a healed final
//! phase; the operator's
//! replacement of a wiped node as the README gives it; the white-box checks between
//! steps and the fault suite's checks on the history and on the nodes' exits.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use leasehold_jepsen::checker::{self, Anomaly, CheckResult, LeaseBound, NodeExit, Refusal, Verdict};
use leasehold_jepsen::history;
use leasehold_jepsen::nemesis::{FaultRecord, Outcome as Installed};
use leasehold_jepsen::workload::SEMAPHORE_LIMIT;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use leasehold_server::node::config::{RawConfig, ELECTION_TIMEOUT_MAX_MS_DEFAULT};
use leasehold_server::node::running_node::EXIT_RAFT_FATAL;
use leasehold_server::raft::incarnations::{COMMAND_LEVEL, EXIT_STALE_INCARNATION};
use leasehold_server::shell::clock::RATE_PER_MILLE_NORMAL;

use crate::host::{node_ip, operator_ip, tenant_ip, worker_ip, SimulatedNode};
use crate::operator::{self, Operator, SilentAdd, Step, SILENT_NODE};
use crate::replicas::ReplicaChecks;
use crate::revocation;
use crate::upgrade::{Action, RollingUpgrade};
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
    /// At most this many faults (None: as many as the faulty phase holds).
    pub steps: Option<u64>,
    /// Every crash also loses the node's last synced write, as a disk that
    /// acknowledges a flush it did not make. Off by default: Leasehold does not
    /// survive it yet (simulation/README.md, "What it found").
    pub lying_disks: bool,
}

/// The known bugs `--bug` plants, each of which a check must find.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Bug {
    /// The store ignores tokens: a stalled holder's late write lands.
    NoFencing,
    /// A new leader restarts every live session at half its TTL, ending leases their
    /// holders still count on (`--test-short-lease-restart`).
    LeaseShortened,
    /// Before the log records a member's incarnation, the latest one heard is
    /// believed and peers are not told the first: a follower wiped in the first moments
    /// is taken back as the member it was (`--test-believe-latest-incarnation`).
    UnrecordedIncarnation,
    /// `member add` of a node still a learner keeps its recorded incarnation: after a
    /// refused add, the node started again on an emptied directory is stopped by that
    /// stale record, and never joins (`--test-keep-learner-on-add`).
    StaleIncarnation,
    /// A keepalive stream keeps the credential it opened with: a holder whose
    /// tenant token was rotated away keeps its session and its lock
    /// (`--test-stream-outlives-rotation`).
    StreamOutlivesRotation,
}

impl Bug {
    /// Sets the node's test-only flags that plant this bug.
    fn plant(bug: Option<Bug>, raw: &mut RawConfig) {
        match bug {
            Some(Bug::LeaseShortened) => raw.test_short_lease_restart = true,
            Some(Bug::UnrecordedIncarnation) => raw.test_believe_latest_incarnation = true,
            Some(Bug::StaleIncarnation) => raw.test_keep_learner_on_add = true,
            Some(Bug::StreamOutlivesRotation) => raw.test_stream_outlives_rotation = true,
            Some(Bug::NoFencing) | None => {}
        }
    }
}

impl Default for Options {
    fn default() -> Options {
        Options {
            nodes: 3,
            workers: 4,
            faulty: Duration::from_secs(10),
            healed: Duration::from_secs(5),
            bug: None,
            steps: None,
            lying_disks: false,
        }
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
    /// The node's clock runs at another rate, after a jump forward; `name` is the
    /// fault suite's name for it (`checker::CLOCK_FAULTS`).
    Skewed { node: u64, name: &'static str },
    /// The node's messages to its peers are lost (`outgoing`), or theirs to it.
    OneWay { node: u64, outgoing: bool },
    /// Every message to and from the node is held, and delivered when healed: a
    /// burst of late messages, as after a long stall of the network or the process.
    Held(u64),
    /// The node's disk refuses every write, as a full disk does: at its first
    /// refused write the node must stop with code 5, and is started again once there
    /// is room. `refused_before`: the disk's refusals before; `exited`: the code the
    /// node stopped with meanwhile.
    DiskFull { node: u64, since_ns: u64, refused_before: usize, exited: Option<i32> },
    /// Each sync of the node's log takes tens of milliseconds, as on a failing or
    /// overloaded disk: the node stays a member and must not hold the others back.
    SlowDisk(u64),
}

/// When a seed replaces a disk in the first moments of the cluster.
enum EarlyWipe {
    At(Duration),
    /// The first moment a follower the leader heard from is not recorded yet (the
    /// window before the record), if one comes before `EARLY_WIPE_UNTIL`.
    Unrecorded,
}

const EARLY_WIPE_UNTIL: Duration = Duration::from_secs(3);

/// Where a wiped node is in the README's "Replacing a node".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Replacement {
    /// Its disk was replaced by an empty one and it was started again as it was (a
    /// supervisor restarts it): it must stop with code 4 at the first word from a peer
    /// that knew it.
    Wiped,
    /// `member remove` sent.
    Removing,
    /// Started on an emptied directory as a new incarnation, `member add` sent. When
    /// `cut_off`, the node is cut off from its peers a moment after it starts (a node
    /// that does not catch up): the add is given up, and the node is started again on
    /// an emptied directory and added again.
    Adding { cut_off: bool },
    /// Waiting for `at` (simulated ms) to send `step` again.
    Retrying { step: Step, at: u64, cut_off: bool },
}

/// What the run knows of each node.
struct Nodes {
    nodes: Vec<Arc<SimulatedNode>>,
    /// The node's host is down and nothing will restart it but the replacement.
    stopped: Vec<bool>,
    replacing: Vec<Option<Replacement>>,
    /// When the node's disk was replaced, until it is a member again (ns).
    wiped_ns: Vec<Option<u64>>,
}

impl Nodes {
    fn node(&self, id: u64) -> &Arc<SimulatedNode> {
        &self.nodes[id as usize - 1]
    }

    /// Whether a fault may pick `id`: it serves, and no replacement is under way.
    fn serving(&self, id: u64) -> bool {
        !self.stopped[id as usize - 1] && self.replacing[id as usize - 1].is_none()
    }

    fn replacing(&self) -> bool {
        self.replacing.iter().any(Option::is_some)
    }

    /// Node `id`, wiped, is a member again (re-added, or taken back as it was): the
    /// wipe is recorded as the fault suite's `wipe-rejoin`, a node out of service.
    fn rejoined(&mut self, id: u64, now: Duration, records: &mut Vec<FaultRecord>) {
        if let Some(since_ns) = self.wiped_ns[id as usize - 1].take() {
            records.push(fault_record("wipe-rejoin", id, since_ns, now.as_nanos() as u64));
        }
    }
}

/// One fault as the fault suite's checks read it.
fn fault_record(fault: &'static str, target: u64, start_ns: u64, end_ns: u64) -> FaultRecord {
    FaultRecord { fault, outcome: Installed::Installed, targets: vec![target], detail: String::new(), start_ns, end_ns }
}

impl Fault {
    /// The node the fault is on.
    fn node(&self) -> u64 {
        match *self {
            Fault::Isolated(node)
            | Fault::Crashed(node)
            | Fault::Skewed { node, .. }
            | Fault::OneWay { node, .. }
            | Fault::Held(node)
            | Fault::DiskFull { node, .. }
            | Fault::SlowDisk(node) => node,
        }
    }

    /// The fault as the fault suite names it (`checker`'s lists of faults that make
    /// the cluster unavailable, clock faults and worker stops), from `start_ns` to
    /// `end_ns`.
    fn record(&self, start_ns: u64, end_ns: u64) -> FaultRecord {
        let name = match *self {
            Fault::Isolated(_) => "partition-halves",
            Fault::Crashed(_) => "kill-random",
            Fault::Skewed { name, .. } => name,
            Fault::OneWay { .. } => "partition-one-way",
            Fault::Held(_) => "pause-node",
            Fault::DiskFull { .. } => "disk-full",
            Fault::SlowDisk(_) => "slow-disk",
        };
        fault_record(name, self.node(), start_ns, end_ns)
    }
}

/// The nodes' election, from the leader's loss to a new leader's first applied entry:
/// four of their longest election timeouts (the fault suite's reasoning,
/// `harness::ELECTION_MS_MAX`, for the nodes' default timeouts).
const ELECTION_MS_MAX: u64 = 4 * ELECTION_TIMEOUT_MAX_MS_DEFAULT;
/// From a lease's end to the waiter's worker recording its grant.
const HANDOVER_MS_MAX: u64 = 500;

/// The bound check (i) holds the simulated cluster to.
fn lease_bound(ttl: Duration) -> LeaseBound {
    LeaseBound {
        ttl,
        election: Duration::from_millis(ELECTION_MS_MAX),
        handover: Duration::from_millis(HANDOVER_MS_MAX),
    }
}

/// How often (simulated) the white-box checks look at the nodes.
const REPLICA_SAMPLE_MS: u64 = 25;
/// How long a wiped node that acknowledged entries before may serve before the
/// check counts it as taken back.
const REFUSAL_DEADLINE_MS: u64 = 3_000;
/// How long after the healed phase the run waits for a replacement to end.
const REPLACEMENT_GRACE: Duration = Duration::from_secs(20);
/// The pause before the operator runs a refused command again.
const RETRY_MS: u64 = 300;

/// Runs `seed`.
pub fn run(seed: u64, options: &Options) -> Outcome {
    leasehold_server::raft::runtime::seed_this_thread(seed);
    leasehold::random::seed_this_thread(seed.rotate_left(17));
    let root = tempfile::tempdir().expect("a temporary directory");
    let stop_at = options.faulty + options.healed;
    let mut sim = turmoil::Builder::new()
        .simulation_duration(stop_at + REPLACEMENT_GRACE + Duration::from_secs(10))
        .tick_duration(Duration::from_millis(1))
        .min_message_latency(Duration::from_micros(200))
        .max_message_latency(Duration::from_millis(3))
        .rng_seed(seed)
        .build();
    let mut outcome = Outcome {
        seed,
        checks: Vec::new(),
        operations: 0,
        faults: Vec::new(),
        simulated: Duration::ZERO,
        error: None,
        trace: Vec::new(),
    };
    let mut nodes = Nodes {
        nodes: Vec::new(),
        stopped: vec![false; options.nodes as usize],
        replacing: vec![None; options.nodes as usize],
        wiped_ns: vec![None; options.nodes as usize],
    };
    let bug = options.bug;
    for id in 1..=options.nodes {
        let node = match SimulatedNode::new(id, options.nodes, root.path(), seed, &|raw| Bug::plant(bug, raw)) {
            Ok(node) => Arc::new(node),
            Err(error) => {
                outcome.error = Some(error.to_string());
                return outcome;
            }
        };
        let software = node.clone();
        sim.host(node_ip(id), move || software.clone().serve());
        nodes.nodes.push(node);
    }
    let shared = Shared::new(options.bug != Some(Bug::NoFencing));
    for process in 1..=options.workers {
        let shared = shared.clone();
        let (count, faulty) = (options.nodes, options.faulty);
        let healed = options.healed;
        sim.client(worker_ip(process), workload::run_worker(process, count, seed, faulty, healed, shared));
    }
    let (mut operator, operator_host) = Operator::new(options.nodes);
    sim.client(operator_ip(), operator_host);
    sim.host(node_ip(SILENT_NODE), operator::silent_node);
    let revocation = revocation::Plan::draw(seed, options.faulty);
    let revoked = Arc::new(std::sync::Mutex::new(Vec::new()));
    sim.client(tenant_ip(), revocation::run(options.nodes, revocation, stop_at, revoked.clone()));
    outcome.faults.push(format!(
        "{:>6} ms {} of tenant {:?} planned, with a holder of its token",
        revocation.at.as_millis(),
        match revocation.how {
            revocation::How::RemoveTenant => "removal",
            revocation::How::RotateToken => "token rotation",
            revocation::How::EndSession => "the admin's end of the holder's session",
        },
        revocation::TENANT
    ));

    let mut random = StdRng::seed_from_u64(seed.rotate_left(29));
    let mut next_fault = Duration::from_millis(random.random_range(500..2_000));
    // One seed in four replaces a disk in the first moments of the cluster.
    // One seed in eight replaces a disk in the first 600 ms of the cluster, and one
    // in eight at the first moment it can matter: a follower the leader heard from
    // whose incarnation the log does not record yet.
    let mut early_wipe = match random.random_range(0..8) {
        0 => Some(EarlyWipe::At(Duration::from_millis(random.random_range(30..600)))),
        1 => Some(EarlyWipe::Unrecorded),
        _ => None,
    };
    // One seed in five, the operator adds a node that never answers, and takes the
    // learner out again once the add is refused or given up.
    let faulty_ms = options.faulty.as_millis() as u64;
    let mut silent = (random.random_range(0..5) == 0)
        .then(|| SilentAdd::Planned { at_ms: random.random_range(0..faulty_ms.max(1)) });
    let mut silent_added = false;
    // One seed in six is a rolling upgrade: every node starts on the previous build.
    let mut upgrade = (random.random_range(0..6) == 0)
        .then(|| RollingUpgrade::new(options.nodes, random.random_range(500..faulty_ms.max(501))));
    if upgrade.is_some() {
        for node in &nodes.nodes {
            node.next_start(false, COMMAND_LEVEL - 1);
        }
        outcome
            .faults
            .push(format!("     0 ms every node on the previous build (command level {})", COMMAND_LEVEL - 1));
    }
    // The fault in effect, when it is due to be healed, and when it began (ns).
    let mut in_effect: Option<(Fault, Duration, u64)> = None;
    // Every fault healed, as the fault suite records them, for checks (i) and (j).
    let mut fault_records: Vec<FaultRecord> = Vec::new();
    let mut steps = 0u64;
    let mut healed = false;
    let mut healed_ns = 0u64;
    let mut replicas = ReplicaChecks::default();
    let mut next_sample = Duration::ZERO;
    let mut exits: Vec<NodeExit> = Vec::new();
    let mut refusals: Vec<Refusal> = Vec::new();
    // Wiped nodes expected to stop with code 4: (node, index in `refusals`, deadline ms).
    let mut awaiting_refusal: Vec<(u64, usize, u64)> = Vec::new();
    // New incarnations cut off from their peers.
    let mut cut: Vec<u64> = Vec::new();
    loop {
        let now = sim.elapsed();
        let now_ms = now.as_millis() as u64;
        if now >= next_sample {
            replicas.sample(&nodes.nodes, now.as_millis());
            next_sample = now + Duration::from_millis(REPLICA_SAMPLE_MS);
        }
        // Nodes that stopped themselves: taken down; expected or not.
        for id in 1..=options.nodes {
            let Some((code, message)) = nodes.node(id).exited.lock().unwrap().take() else { continue };
            sim.crash(node_ip(id));
            *nodes.node(id).replica.lock().unwrap() = None;
            nodes.stopped[id as usize - 1] = true;
            outcome.faults.push(format!("{now_ms:>6} ms node {id} stopped itself with code {code}: {message}"));
            if let Some(rolling) = upgrade.as_mut().filter(|rolling| rolling.stopping() == Some(id)) {
                if let Some(Action::Start(node)) = rolling.exited(code, now_ms) {
                    start_upgraded(&mut sim, &mut nodes, node, &mut outcome);
                }
                continue;
            }
            let waiting = awaiting_refusal.iter().position(|(node, _, _)| *node == id);
            if let Some(position) = waiting {
                let (_, refusal, _) = awaiting_refusal.remove(position);
                refusals[refusal].exit = Some(code);
            }
            if let Some((Fault::DiskFull { node, exited, .. }, _, _)) = &mut in_effect {
                if *node == id {
                    *exited = Some(code);
                    continue;
                }
            }
            let expected = match nodes.replacing[id as usize - 1] {
                Some(Replacement::Wiped) if code == EXIT_STALE_INCARNATION => {
                    nodes.replacing[id as usize - 1] = Some(Replacement::Removing);
                    outcome.faults.push(format!("{now_ms:>6} ms operator: member remove {id}"));
                    operator.send(Step::Remove(id));
                    true
                }
                Some(Replacement::Removing) => code == 0,
                _ => false,
            };
            if !expected {
                exits.push(NodeExit { node: id, exit: code, seen_ns: now.as_nanos() as u64, log_tail: message });
            }
        }
        // A wiped node still serving at its deadline was taken back.
        awaiting_refusal.retain(|(id, _, deadline)| {
            if now_ms < *deadline {
                return true;
            }
            if nodes.replacing[*id as usize - 1] == Some(Replacement::Wiped) {
                nodes.replacing[*id as usize - 1] = None;
                nodes.rejoined(*id, now, &mut fault_records);
            }
            false
        });
        // The operator's answers, and the next step of each replacement.
        while let Some((step, answer)) = operator.answer() {
            let line = match &answer {
                Ok(()) => "done".to_string(),
                Err(error) => format!("refused: {error}"),
            };
            outcome.faults.push(format!("{now_ms:>6} ms operator: {step:?}: {line}"));
            if step_node(step) == SILENT_NODE {
                silent = Some(match (step, answer) {
                    (Step::Add(_), answer) => {
                        silent_added |= answer.is_ok();
                        operator.send(Step::Remove(SILENT_NODE));
                        SilentAdd::Removing
                    }
                    (Step::Remove(_), Ok(())) => SilentAdd::Done { added: silent_added },
                    (Step::Remove(_), Err(_)) => SilentAdd::RetryRemove { at_ms: now_ms + RETRY_MS },
                });
                continue;
            }
            let (id, cut_off) = match (step, nodes.replacing[step_node(step) as usize - 1]) {
                (_, Some(Replacement::Adding { cut_off })) => (step_node(step), cut_off),
                (_, _) => (step_node(step), false),
            };
            let index = id as usize - 1;
            match (step, answer) {
                (Step::Remove(_), Ok(())) => {
                    // Empty the directory, start as a new incarnation, add it.
                    let cut_off = random.random_bool(0.3);
                    restart(&mut sim, &nodes, id, true, &mut outcome);
                    if let Some(rolling) = &mut upgrade {
                        rolling.replacing(id);
                    }
                    nodes.stopped[index] = false;
                    // The operator adds it a moment later.
                    let at = now_ms + RETRY_MS;
                    nodes.replacing[index] = Some(Replacement::Retrying { step: Step::Add(id), at, cut_off });
                }
                (Step::Add(_), Ok(())) => {
                    if cut.contains(&id) {
                        rejoin(&mut sim, options.nodes, id, &mut cut, &mut outcome);
                    }
                    // Run without --new-incarnation from then on, on the same build.
                    let node = nodes.node(id);
                    node.next_start(false, node.level());
                    nodes.replacing[index] = None;
                    nodes.rejoined(id, now, &mut fault_records);
                }
                (Step::Add(_), Err(_)) if cut_off && cut.contains(&id) => {
                    // Given up: the node is started again on an emptied directory, with
                    // its peers in reach, and added again (README: a node that is still
                    // a learner is taken out first).
                    rejoin(&mut sim, options.nodes, id, &mut cut, &mut outcome);
                    restart(&mut sim, &nodes, id, true, &mut outcome);
                    nodes.stopped[index] = false;
                    nodes.replacing[index] = Some(Replacement::Adding { cut_off: false });
                    outcome.faults.push(format!("{now_ms:>6} ms operator: member add {id}"));
                    operator.send(Step::Add(id));
                }
                (step, Err(_)) => {
                    nodes.replacing[index] = Some(Replacement::Retrying { step, at: now_ms + RETRY_MS, cut_off })
                }
            }
        }
        // A new incarnation to be cut off is, once the log recorded it (it answered the
        // leader as a learner).
        for id in 1..=options.nodes {
            let cutting = match nodes.replacing[id as usize - 1] {
                Some(Replacement::Adding { cut_off }) | Some(Replacement::Retrying { cut_off, .. }) => cut_off,
                _ => false,
            };
            if cutting && !cut.contains(&id) && recorded_anywhere(&nodes, id) {
                cut_off(&mut sim, options.nodes, id, &mut cut, &mut outcome);
            }
        }
        for id in 1..=options.nodes {
            if let Some(Replacement::Retrying { step, at, cut_off }) = nodes.replacing[id as usize - 1] {
                if now_ms >= at {
                    nodes.replacing[id as usize - 1] = Some(match step {
                        Step::Remove(_) => Replacement::Removing,
                        Step::Add(_) => Replacement::Adding { cut_off },
                    });
                    outcome.faults.push(format!("{now_ms:>6} ms operator: {step:?}"));
                    operator.send(step);
                }
            }
        }
        if let Some(rolling) = &mut upgrade {
            let faulted = in_effect.as_ref().map(|(fault, _, _)| fault.node());
            // README "Upgrading": the next node is stopped only once every node serves
            // again; stopping one while another is down or being replaced takes the
            // quorum away until the stopped one is back.
            let whole = (1..=options.nodes).all(|other| nodes.serving(other));
            let ready = |id: u64| whole && faulted != Some(id);
            let goal = || leaders(&nodes).first().map(|leader| applied_index(leader));
            let applied = |id: u64| nodes.node(id).replica.lock().unwrap().as_ref().map(applied_index);
            let gap_ms = || random.random_range(200..1_500);
            match rolling.next(now_ms, now.as_nanos() as u64, gap_ms, ready, goal, applied) {
                Some(Action::Stop(id)) => {
                    outcome.faults.push(format!("{now_ms:>6} ms upgrade node {id}: stop it as SIGTERM does"));
                    nodes.node(id).terminate();
                }
                Some(Action::Start(id)) => {
                    outcome.faults.push(format!("{now_ms:>6} ms node {id} did not stop in time: killed"));
                    start_upgraded(&mut sim, &mut nodes, id, &mut outcome);
                }
                None => {}
            }
        }
        match silent {
            Some(SilentAdd::Planned { at_ms }) if now_ms >= at_ms => {
                outcome
                    .faults
                    .push(format!("{now_ms:>6} ms operator: member add {SILENT_NODE}, a node that never answers"));
                operator.send(Step::Add(SILENT_NODE));
                silent = Some(SilentAdd::Adding);
            }
            Some(SilentAdd::RetryRemove { at_ms }) if now_ms >= at_ms => {
                outcome.faults.push(format!("{now_ms:>6} ms operator: takes the learner {SILENT_NODE} out again"));
                operator.send(Step::Remove(SILENT_NODE));
                silent = Some(SilentAdd::Removing);
            }
            _ => {}
        }
        match early_wipe {
            Some(EarlyWipe::At(at)) if now >= at && in_effect.is_none() => {
                early_wipe = None;
                let upgrading = upgrade.as_ref().and_then(RollingUpgrade::busy);
                let candidates: Vec<u64> =
                    (1..=options.nodes).filter(|id| nodes.serving(*id) && upgrading != Some(*id)).collect();
                if !candidates.is_empty() && !nodes.replacing() {
                    let id = candidates[random.random_range(0..candidates.len())];
                    wipe(&mut sim, &mut nodes, id, now, &mut outcome, &mut refusals, &mut awaiting_refusal);
                }
            }
            Some(EarlyWipe::Unrecorded)
                if in_effect.is_none()
                    && !nodes.replacing()
                    && upgrade.as_ref().and_then(RollingUpgrade::busy).is_none() =>
            {
                if let Some(id) = heard_unrecorded(&nodes) {
                    early_wipe = None;
                    wipe(&mut sim, &mut nodes, id, now, &mut outcome, &mut refusals, &mut awaiting_refusal);
                } else if now >= EARLY_WIPE_UNTIL {
                    early_wipe = None;
                }
            }
            _ => {}
        }
        if !healed && now >= options.faulty {
            // A full disk the node wrote to is healed once it stopped (or could have).
            let waiting = in_effect
                .as_ref()
                .is_some_and(|(fault, until, _)| !due(fault, (*until).min(options.faulty), now, &nodes));
            if !waiting {
                if let Some((fault, _, began_ns)) = in_effect.take() {
                    fault_records.push(fault.record(began_ns, now.as_nanos() as u64));
                    heal(&mut sim, &mut nodes, &mut refusals, options, fault, &mut outcome.faults, now);
                }
                healed = true;
                healed_ns = now.as_nanos() as u64;
                shared.heal(healed_ns);
            }
        }
        let silent_ended = matches!(silent, None | Some(SilentAdd::Done { .. }));
        let upgraded = upgrade.as_ref().is_none_or(RollingUpgrade::ended);
        if healed && ((!nodes.replacing() && silent_ended && upgraded) || now >= stop_at + REPLACEMENT_GRACE) {
            operator.finish();
        }
        if !healed {
            if let Some((fault, until, _)) = &in_effect {
                if due(fault, *until, now, &nodes) {
                    let (fault, _, began_ns) = in_effect.take().expect("checked");
                    fault_records.push(fault.record(began_ns, now.as_nanos() as u64));
                    heal(&mut sim, &mut nodes, &mut refusals, options, fault, &mut outcome.faults, now);
                    next_fault = now + Duration::from_millis(random.random_range(200..1_500));
                }
            } else if now >= next_fault && now < options.faulty && options.steps.is_none_or(|most| steps < most) {
                steps += 1;
                let node = random.random_range(1..=options.nodes);
                let lasting = Duration::from_millis(random.random_range(300..3_000));
                let kind = random.random_range(0..15);
                let upgrading = upgrade.as_ref().and_then(RollingUpgrade::busy);
                if !nodes.serving(node) || upgrading == Some(node) {
                    next_fault = now + Duration::from_millis(random.random_range(200..1_500));
                } else if kind < 4 {
                    for other in others(options, node) {
                        sim.partition(node_ip(node), other);
                    }
                    outcome.faults.push(format!("{now_ms:>6} ms isolate node {node}"));
                    in_effect = Some((Fault::Isolated(node), now + lasting, now.as_nanos() as u64));
                } else if kind < 8 {
                    sim.crash(node_ip(node));
                    let crashed = nodes.node(node);
                    crashed.disk.crash();
                    if options.lying_disks && crashed.disk.lose_last_synced() {
                        outcome.faults.push(format!("{now_ms:>6} ms node {node}'s disk lost its last synced write"));
                    }
                    *crashed.replica.lock().unwrap() = None;
                    outcome.faults.push(format!("{now_ms:>6} ms crash node {node}"));
                    in_effect = Some((Fault::Crashed(node), now + lasting, now.as_nanos() as u64));
                } else if kind < 10 {
                    let rate_per_mille = random.random_range(500..=2_000);
                    let jump_ms = if random.random_bool(0.5) { random.random_range(0..=3_000) } else { 0 };
                    nodes.node(node).clock.skew(rate_per_mille, jump_ms);
                    outcome.faults.push(format!(
                        "{now_ms:>6} ms clock of node {node} at {rate_per_mille}/1000, jumped {jump_ms} ms"
                    ));
                    let name = match (jump_ms, rate_per_mille) {
                        (1.., _) => "clock-jump",
                        (0, ..RATE_PER_MILLE_NORMAL) => "clock-slow",
                        (0, _) => "clock-fast",
                    };
                    let skewed = Fault::Skewed { node, name };
                    in_effect = Some((skewed, now + lasting, now.as_nanos() as u64));
                } else if kind == 11 {
                    let outgoing = random.random_bool(0.5);
                    for other in (1..=options.nodes).filter(|other| *other != node) {
                        if outgoing {
                            sim.partition_oneway(node_ip(node), node_ip(other));
                        } else {
                            sim.partition_oneway(node_ip(other), node_ip(node));
                        }
                    }
                    let way = if outgoing { "to" } else { "from" };
                    outcome.faults.push(format!("{now_ms:>6} ms lose node {node}'s messages {way} its peers"));
                    in_effect = Some((Fault::OneWay { node, outgoing }, now + lasting, now.as_nanos() as u64));
                } else if kind == 12 {
                    for other in others(options, node) {
                        sim.hold(node_ip(node), other);
                    }
                    outcome.faults.push(format!("{now_ms:>6} ms hold every message to and from node {node}"));
                    in_effect = Some((Fault::Held(node), now + lasting, now.as_nanos() as u64));
                } else if kind == 13 {
                    let disk = &nodes.node(node).disk;
                    let refused_before = disk.refused_writes();
                    disk.fail_writes(Some("No space left on device (simulated)".into()));
                    outcome.faults.push(format!("{now_ms:>6} ms fill node {node}'s disk"));
                    let since_ns = now.as_nanos() as u64;
                    let full = Fault::DiskFull { node, since_ns, refused_before, exited: None };
                    in_effect = Some((full, now + lasting, now.as_nanos() as u64));
                } else if kind == 14 {
                    let latency_ms = random.random_range(10..=100);
                    nodes.node(node).disk.slow(Duration::from_millis(latency_ms));
                    outcome.faults.push(format!("{now_ms:>6} ms node {node}'s log syncs take {latency_ms} ms"));
                    in_effect = Some((Fault::SlowDisk(node), now + lasting, now.as_nanos() as u64));
                } else if nodes.replacing() {
                    next_fault = now + Duration::from_millis(random.random_range(200..1_500));
                } else {
                    wipe(&mut sim, &mut nodes, node, now, &mut outcome, &mut refusals, &mut awaiting_refusal);
                    next_fault = now + Duration::from_millis(random.random_range(200..1_500));
                }
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
    // Every replacement the operator began ended with the node a member again.
    let mut replacements = Vec::new();
    for id in 1..=options.nodes {
        if let Some(replacement) = nodes.replacing[id as usize - 1] {
            if replacement != Replacement::Wiped {
                replacements.push(Anomaly {
                    what: format!(
                        "node {id}: the README's replacement did not end {} s after the healed phase ({replacement:?})",
                        REPLACEMENT_GRACE.as_secs()
                    ),
                    operations: Vec::new(),
                });
            }
        }
    }
    let began = outcome.faults.iter().filter(|line| line.contains("operator: member remove")).count();
    let replacements = CheckResult {
        name: "replacements",
        verdict: if replacements.is_empty() { Verdict::Pass } else { Verdict::Fail },
        detail: format!("{began} replacement(s) begun, {} unfinished", replacements.len()),
        anomalies: replacements,
    };
    for revoked in revoked.lock().unwrap().iter() {
        outcome.faults.push(format!(
            "{:>6} ms {} acknowledged; session {} last renewed by a keepalive sent at {} ms",
            revoked.revoked_ns / 1_000_000,
            revoked.how,
            revoked.session,
            revoked.last_renewal_sent_ns / 1_000_000
        ));
    }
    outcome.simulated = sim.elapsed();
    let records = shared.records.lock().unwrap().clone();
    for (process, start_ns, end_ns) in shared.stalls.lock().unwrap().iter().copied() {
        fault_records.push(fault_record("pause-worker", process, start_ns, end_ns));
        let (from, to) = (start_ns / 1_000_000, end_ns / 1_000_000);
        outcome.faults.push(format!("{from:>6} ms worker {process} stalled holding a lock, until {to} ms"));
    }
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
    outcome.checks.push(checker::semaphore_holders(&operations, SEMAPHORE_LIMIT as usize));
    outcome.checks.push(checker::elections(&operations));
    // A leader whose clock runs fast ends leases early: that is what the fault is
    // for, so beliefs that overlap from a clock fault on (and two TTLs after) are
    // counted apart, as the fault suite counts them.
    let ttl = Duration::from_millis(workload::SESSION_TTL_MS);
    let excused = checker::clock_fault_windows(&fault_records, ttl);
    outcome.checks.push(checker::believed_at_once(&operations, ttl, &excused));
    // Nodes still out of service at the end, as the fault suite records them.
    for id in 1..=options.nodes {
        nodes.rejoined(id, outcome.simulated, &mut fault_records);
    }
    fault_records.sort_by_key(|record| record.start_ns);
    outcome.checks.push(checker::dead_holders(&operations, &fault_records, &lease_bound(ttl)));
    outcome.checks.push(checker::lock_delays(&operations, &fault_records, ttl));
    let processes: Vec<u64> = (1..=options.workers).collect();
    outcome.checks.push(checker::liveness(&operations, &processes, healed_ns, options.healed));
    outcome.checks.push(replicas.result());
    outcome.checks.push(checker::refusals(&refusals));
    outcome.checks.push(checker::node_exits(&exits));
    outcome.checks.push(replacements);
    outcome.checks.push(checker::revocations(&revoked.lock().unwrap()));
    outcome.checks.push(silent_add(silent, &nodes));
    if let Some(rolling) = &upgrade {
        outcome.checks.push(checker::upgrades(&rolling.upgrades, &rolling.upgraded_nodes(options.nodes)));
    }
    outcome
}

/// The add of a node that never answers (`SILENT_NODE`) was refused or given up, never
/// acknowledged, and the learner it left was taken out again: no leader's membership
/// names it at the end.
fn silent_add(silent: Option<SilentAdd>, nodes: &Nodes) -> CheckResult {
    let name = "an add of a node that never answers";
    let Some(silent) = silent else {
        return CheckResult {
            name,
            verdict: Verdict::Skipped,
            detail: "not drawn for this seed".into(),
            anomalies: Vec::new(),
        };
    };
    let mut anomalies = Vec::new();
    let mut anomaly = |what: String| anomalies.push(Anomaly { what, operations: Vec::new() });
    match silent {
        SilentAdd::Done { added: true } => anomaly(format!("`member add {SILENT_NODE}` was acknowledged")),
        SilentAdd::Done { added: false } => {}
        other => anomaly(format!("the operator's add and removal did not end ({other:?})")),
    }
    for leader in leaders(nodes) {
        let metrics = leader.raft.metrics().borrow().clone();
        if metrics.membership_config.membership().get_node(&SILENT_NODE).is_some() {
            anomaly(format!("leader {}'s membership still names node {SILENT_NODE}", metrics.id));
        }
    }
    CheckResult {
        name,
        verdict: if anomalies.is_empty() { Verdict::Pass } else { Verdict::Fail },
        detail: format!("refused or given up, then removed: {}", anomalies.is_empty()),
        anomalies,
    }
}

/// The leaders' replicas (a stale one may still think it leads).
fn leaders(nodes: &Nodes) -> Vec<Arc<leasehold_server::raft::replica::Replica>> {
    nodes
        .nodes
        .iter()
        .filter_map(|node| node.replica.lock().unwrap().clone())
        .filter(|replica| {
            let metrics = replica.raft.metrics().borrow().clone();
            metrics.current_leader == Some(metrics.id)
        })
        .collect()
}

/// Whether a leader has an acknowledgement from node `id`.
fn heard_by_leader(nodes: &Nodes, id: u64) -> bool {
    leaders(nodes).iter().any(|leader| {
        let metrics = leader.raft.metrics().borrow().clone();
        metrics.id != id
            && metrics.replication.as_ref().and_then(|progress| progress.get(&id)).is_some_and(Option::is_some)
    })
}

/// A follower, serving, that a leader heard acknowledge an entry and whose
/// incarnation that leader's log does not record yet.
fn heard_unrecorded(nodes: &Nodes) -> Option<u64> {
    leaders(nodes).iter().find_map(|leader| {
        let metrics = leader.raft.metrics().borrow().clone();
        let record = leader.shared.cluster_record.borrow().clone();
        let progress = metrics.replication?;
        progress
            .iter()
            .find(|(id, matched)| {
                **id != metrics.id && matched.is_some() && record.incarnation(**id).is_none() && nodes.serving(**id)
            })
            .map(|(id, _)| *id)
    })
}

/// Whether some running node's applied record holds an incarnation of node `id`.
fn recorded_anywhere(nodes: &Nodes, id: u64) -> bool {
    nodes.nodes.iter().any(|node| {
        node.replica
            .lock()
            .unwrap()
            .as_ref()
            .is_some_and(|replica| replica.shared.cluster_record.borrow().incarnation(id).is_some())
    })
}

fn step_node(step: Step) -> u64 {
    match step {
        Step::Remove(id) | Step::Add(id) => id,
    }
}

/// Replaces node `id`'s disk by an empty one and starts it again as it was. If it
/// had applied an entry (the cluster committed with it), or the leader heard it
/// acknowledge one, it must stop with code 4. (A node nobody heard loses nothing
/// and may be taken as the member it was.)
fn wipe(
    sim: &mut turmoil::Sim<'_>,
    nodes: &mut Nodes,
    id: u64,
    now: Duration,
    outcome: &mut Outcome,
    refusals: &mut Vec<Refusal>,
    awaiting: &mut Vec<(u64, usize, u64)>,
) {
    let node = nodes.node(id).clone();
    let applied = node.replica.lock().unwrap().as_ref().is_some_and(|replica| {
        replica.shared.applied.read().unwrap().last_applied.is_some_and(|log_id| log_id.index > 0)
    }) || heard_by_leader(nodes, id);
    sim.crash(node_ip(id));
    *node.replica.lock().unwrap() = None;
    if let Err(error) = node.wipe() {
        outcome.error = Some(format!("cannot empty node {id}'s data directory: {error}"));
    }
    sim.bounce(node_ip(id));
    nodes.replacing[id as usize - 1] = Some(Replacement::Wiped);
    nodes.wiped_ns[id as usize - 1].get_or_insert(now.as_nanos() as u64);
    let now_ms = now.as_millis() as u64;
    outcome.faults.push(format!("{now_ms:>6} ms wipe node {id} and start it again"));
    if applied {
        refusals.push(Refusal {
            fault: "wipe",
            node: id,
            expected_exit: EXIT_STALE_INCARNATION,
            exit: None,
            at_ns: now.as_nanos() as u64,
        });
        awaiting.push((id, refusals.len() - 1, now_ms + REFUSAL_DEADLINE_MS));
    }
}

/// Starts node `id` again (its host is down, or is taken down here): on the build it
/// ran, or on an emptied directory as a new incarnation on this build when `emptied`.
fn restart(sim: &mut turmoil::Sim<'_>, nodes: &Nodes, id: u64, emptied: bool, outcome: &mut Outcome) {
    let node = nodes.node(id);
    sim.crash(node_ip(id));
    node.disk.crash();
    *node.replica.lock().unwrap() = None;
    if emptied {
        if let Err(error) = node.wipe() {
            outcome.error = Some(format!("cannot empty node {id}'s data directory: {error}"));
        }
    }
    // A restarted host runs the build it has: one a rolling upgrade has not reached
    // yet comes back on the previous build. A replaced one is set up with this build,
    // as an operator would set up a new host during an upgrade (an older build could
    // not join once the log used a newer command level).
    node.next_start(emptied, if emptied { COMMAND_LEVEL } else { node.level() });
    sim.bounce(node_ip(id));
    let now_ms = sim.elapsed().as_millis();
    outcome.faults.push(format!(
        "{now_ms:>6} ms start node {id}{}",
        if emptied { " on an emptied directory as a new incarnation" } else { " on its directory" }
    ));
}

/// Starts node `id` on this build (a rolling upgrade's step): it stopped as SIGTERM
/// stops it, or is killed here if it did not.
fn start_upgraded(sim: &mut turmoil::Sim<'_>, nodes: &mut Nodes, id: u64, outcome: &mut Outcome) {
    let node = nodes.node(id).clone();
    if !nodes.stopped[id as usize - 1] {
        node.disk.crash();
    }
    sim.crash(node_ip(id));
    *node.replica.lock().unwrap() = None;
    node.next_start(false, COMMAND_LEVEL);
    sim.bounce(node_ip(id));
    nodes.stopped[id as usize - 1] = false;
    let now_ms = sim.elapsed().as_millis();
    outcome.faults.push(format!("{now_ms:>6} ms start node {id} on this build (command level {COMMAND_LEVEL})"));
}

/// The index `replica` applied up to.
fn applied_index(replica: &Arc<leasehold_server::raft::replica::Replica>) -> u64 {
    replica.shared.applied.read().unwrap().last_applied.map_or(0, |log_id| log_id.index)
}

/// Cuts node `id` off from its peers (a new incarnation that will not catch up).
fn cut_off(sim: &mut turmoil::Sim<'_>, nodes: u64, id: u64, cut: &mut Vec<u64>, outcome: &mut Outcome) {
    for other in (1..=nodes).filter(|other| *other != id) {
        sim.partition(node_ip(id), node_ip(other));
    }
    cut.push(id);
    let now_ms = sim.elapsed().as_millis();
    outcome.faults.push(format!("{now_ms:>6} ms cut node {id} off from its peers (it cannot catch up)"));
}

/// Puts node `id` back in reach of its peers.
fn rejoin(sim: &mut turmoil::Sim<'_>, nodes: u64, id: u64, cut: &mut Vec<u64>, outcome: &mut Outcome) {
    for other in (1..=nodes).filter(|other| *other != id) {
        sim.repair(node_ip(id), node_ip(other));
    }
    cut.retain(|node| *node != id);
    let now_ms = sim.elapsed().as_millis();
    outcome.faults.push(format!("{now_ms:>6} ms node {id} in reach of its peers again"));
}

/// Whether the fault in effect, drawn to last until `until`, is healed now: at
/// `until`, but a full disk the node wrote to only once the node stopped (it stays
/// down until `until`, as the disk stays full), or
/// `REFUSAL_DEADLINE_MS` after `until` (then it kept running, which the refusal
/// check fails).
fn due(fault: &Fault, until: Duration, now: Duration, nodes: &Nodes) -> bool {
    match fault {
        Fault::DiskFull { node, refused_before, exited, .. } => {
            let tried = nodes.node(*node).disk.refused_writes() > *refused_before;
            (now >= until && (exited.is_some() || !tried)) || now >= until + Duration::from_millis(REFUSAL_DEADLINE_MS)
        }
        _ => now >= until,
    }
}

/// Every other host of the run: the other nodes, the workers, the operator and the
/// tenant's host.
fn others(options: &Options, node: u64) -> Vec<std::net::IpAddr> {
    let peers = (1..=options.nodes).filter(|other| *other != node).map(node_ip);
    let workers = (1..=options.workers).map(worker_ip);
    peers.chain(workers).chain([operator_ip(), tenant_ip()]).collect()
}

fn heal(
    sim: &mut turmoil::Sim<'_>,
    all: &mut Nodes,
    refusals: &mut Vec<Refusal>,
    options: &Options,
    fault: Fault,
    log: &mut Vec<String>,
    now: Duration,
) {
    let nodes = &all.nodes;
    match fault {
        Fault::Isolated(node) => {
            for other in others(options, node) {
                sim.repair(node_ip(node), other);
            }
            log.push(format!("{:>6} ms heal node {node}", now.as_millis()));
        }
        Fault::OneWay { node, outgoing } => {
            for other in nodes.iter().filter(|other| other.id != node) {
                if outgoing {
                    sim.repair_oneway(node_ip(node), node_ip(other.id));
                } else {
                    sim.repair_oneway(node_ip(other.id), node_ip(node));
                }
            }
            log.push(format!("{:>6} ms node {node}'s messages flow both ways again", now.as_millis()));
        }
        Fault::Held(node) => {
            for other in others(options, node) {
                sim.release(node_ip(node), other);
            }
            log.push(format!("{:>6} ms release the messages held for node {node}", now.as_millis()));
        }
        Fault::Crashed(node) => {
            sim.bounce(node_ip(node));
            log.push(format!("{:>6} ms restart node {node}", now.as_millis()));
        }
        Fault::Skewed { node, .. } => {
            nodes[node as usize - 1].clock.skew(RATE_PER_MILLE_NORMAL, 0);
            log.push(format!("{:>6} ms clock of node {node} at the normal rate", now.as_millis()));
        }
        Fault::SlowDisk(node) => {
            nodes[node as usize - 1].disk.slow(Duration::ZERO);
            log.push(format!("{:>6} ms node {node}'s disk at its normal speed", now.as_millis()));
        }
        Fault::DiskFull { node, since_ns, refused_before, exited } => {
            let full = nodes[node as usize - 1].clone();
            full.disk.fail_writes(None);
            let tried = full.disk.refused_writes() > refused_before;
            if exited.is_some() || tried {
                let fault = "disk-full";
                refusals.push(Refusal { fault, node, expected_exit: EXIT_RAFT_FATAL, exit: exited, at_ns: since_ns });
            }
            if exited.is_some() {
                // It stopped: started again on the same directory, now with room.
                full.disk.crash();
                all.stopped[node as usize - 1] = false;
                sim.bounce(node_ip(node));
                log.push(format!("{:>6} ms room on node {node}'s disk; start it again", now.as_millis()));
            } else {
                // Without a write meanwhile, nothing told it the disk was full.
                let seen = if tried { "it kept running" } else { "it tried no write" };
                log.push(format!("{:>6} ms room on node {node}'s disk ({seen})", now.as_millis()));
            }
        }
    }
}
