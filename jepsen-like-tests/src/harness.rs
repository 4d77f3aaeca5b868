//! `leasehold-jepsen run`: a cluster of real server processes, worker processes
//! running the workloads, the nemesis, then the checks and a summary.
//!
//! The run first re-executes itself under `unshare --net --pid --fork --kill-child
//! --mount-proc`: a private network namespace (for nftables partitions, with nodes
//! on 127.0.0.11…) and a private pid namespace in which the harness is process 1.
//! When it exits or crashes, the kernel kills every process it started and the
//! namespace with its firewall rules disappears; the host keeps nothing.
//!
//! With a store server behind the fenced counter (`--fenced-store postgres|mariadb|
//! redis|etcd`) the first process stays outside instead of exec'ing: the store listens
//! on the host's loopback, which the namespace cannot reach, so that process relays
//! connections from a Unix socket (a file, which both sides reach) to the store, and
//! the harness inside relays its loopback port to that socket. The nemesis never
//! touches either (its rules match node addresses only).

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use rand::rngs::StdRng;
use rand::seq::{IndexedRandom, SliceRandom};
use rand::{Rng, SeedableRng};

use crate::attack::{node_certificate_files, Attack, INTRUDER_TENANT, NON_MEMBER_NODE_ID};
use crate::checker::{self, CheckResult, NodeExit, Refusal, ReplicaState, RestartObservation, Upgrade, Verdict};
use crate::cluster::{binary, Addressing, ClusterOptions, TestCluster};
use crate::fenced_store::{self, FencedStore, StoreKind, STORE_SOCKET_ENV, STORE_URL_ENV};
use crate::flood::FLOOD_TENANT;
use crate::grey::GreyObservation;
use crate::history::{self, monotonic_ns, Kind, Record};
use crate::nemesis::{self, Fault, FaultRecord, NemesisKind, Outcome};
use crate::workload::{Workload, LOCK_DELAY_MS_DEFAULT, LOCK_DELAY_MS_MAX, SEMAPHORE_LIMIT};
use crate::{slow_cpu, slow_link};

/// Set in the environment of the harness once it runs inside its namespace.
pub const NAMESPACE_ENV: &str = "LEASEHOLD_JEPSEN_IN_NAMESPACE";
/// The cluster sizes a run starts: 3 or `NODES_MAX` nodes, ids 1 to `--nodes`.
pub const NODES_MIN: u64 = 3;
pub const NODES_MAX: u64 = 5;
// The intruder's never-member certificate is of an id no run gives a node.
const _: () = assert!(NON_MEMBER_NODE_ID > NODES_MAX);
/// Fixed ports of every node (each node has its own address).
pub const CLIENT_PORT: u16 = 7100;
pub const PEER_PORT: u16 = 7200;
pub const HEARTBEAT_MS: u64 = 100;
pub const ELECTION_TIMEOUT_MIN_MS: u64 = 500;
pub const ELECTION_TIMEOUT_MAX_MS: u64 = 1_000;
/// Quiet time between faults.
pub const FAULT_GAP_MS_MIN: u64 = 1_000;
pub const FAULT_GAP_MS_MAX: u64 = 3_000;
/// How long a partition, a killed node or a skewed clock lasts.
pub const FAULT_HOLD_MS_MIN: u64 = 2_000;
pub const FAULT_HOLD_MS_MAX: u64 = 5_000;
/// How long a grey fault lasts: longer than a clean one, to see whether the cluster
/// stays slow while it lasts or moves away from the slow node.
pub const GREY_HOLD_MS_MIN: u64 = 5_000;
pub const GREY_HOLD_MS_MAX: u64 = 10_000;
/// How long one node may take to answer a white-box state read.
pub const REPLICA_READ_MS_MAX: u64 = 1_000;
/// How long the cluster may take to elect a leader after a fault is healed.
pub const RECOVERY_MS_MAX: u64 = 30_000;
/// How long a removed node may take to exit.
pub const REMOVED_EXIT_MS_MAX: u64 = 15_000;
/// How long a node started on a wiped or corrupted data directory may take to stop
/// (it learns of its record at the first message from the leader).
pub const REFUSED_EXIT_MS_MAX: u64 = 10_000;
/// `wipe-early` kills its follower within this long of seeing the first leader.
pub const WIPE_EARLY_MS_MAX: u64 = 1_000;
/// How many of its last log lines a node that exited on its own is reported with.
pub const EXIT_LOG_LINES_MAX: usize = 8;
/// The exit codes of `leasehold-server` that the disk faults expect (README,
/// "Exit codes").
pub const EXIT_DATA_DIRECTORY_REFUSED: i32 = 3;
pub const EXIT_STALE_INCARNATION: i32 = 4;
pub const EXIT_RAFT_FATAL: i32 = 5;
/// How long a node may take to exit after SIGTERM (a rolling upgrade's stop).
pub const STOP_MS_MAX: u64 = 15_000;
/// The disk of the `disk-full` fault, and how long the workload has to fill it.
pub const SMALL_DISK_BYTES: u64 = 512 << 10;
pub const DISK_FILL_MS_MAX: u64 = 30_000;
/// Workers get this long beyond the liveness bound to finish and exit.
pub const WORKER_EXIT_SLACK_MS: u64 = 30_000;
pub const STATUS_POLL_MS: u64 = 100;
/// The suite's election: from the leader's loss to a new leader's first applied entry,
/// at most four maximal election timeouts. A follower of openraft 0.9 starts an
/// election once the leader's lease (one maximal timeout) and its own timeout have
/// passed since the leader's last message, and two maximal timeouts later if it has
/// seen a node with a longer log since its own last election; the flag stays set
/// until then, so a follower that lost a vote long before is slow to stand.
pub const ELECTION_MS_MAX: u64 = 4 * ELECTION_TIMEOUT_MAX_MS;
/// From a lease's end to the waiter's worker recording its grant: the expiry's
/// commit, the grant's, and the answer, on a machine that also runs every node and
/// worker.
pub const HANDOVER_MS_MAX: u64 = 500;

/// The bound check (i) holds the suite to.
pub fn lease_bound(ttl: Duration) -> checker::LeaseBound {
    checker::LeaseBound {
        ttl,
        election: Duration::from_millis(ELECTION_MS_MAX),
        handover: Duration::from_millis(HANDOVER_MS_MAX),
    }
}

/// How much of a worker's history is read to find its last record.
pub const TAIL_BYTES: u64 = 4_096;
/// The intruder tenant's quotas: enough for its own session and lock, too few to
/// crowd the cluster.
pub const INTRUDER_QUOTAS: leasehold::proto::Quotas =
    leasehold::proto::Quotas { max_sessions: 16, max_holds: 16, max_waiters: 16, weight: 0, max_ops_per_second: None };
/// The tenant whose token the intruder has "leaked" (`Attack::StreamAfterRotation`),
/// its quotas, and how often the harness, as an operator, rotates its token.
pub const STOLEN_TENANT: &str = "stolen";
pub const STOLEN_QUOTAS: leasehold::proto::Quotas =
    leasehold::proto::Quotas { max_sessions: 16, max_holds: 16, max_waiters: 16, weight: 0, max_ops_per_second: None };
pub const STOLEN_ROTATION_MS: u64 = 4_000;
/// The flood tenant's quotas: room for its sessions and names, and its rate quota.
pub const FLOOD_QUOTAS: leasehold::proto::Quotas = leasehold::proto::Quotas {
    max_sessions: 256,
    max_holds: 256,
    max_waiters: 256,
    weight: 0,
    max_ops_per_second: Some(crate::flood::FLOOD_OPS_PER_S),
};

#[derive(Debug, Clone, clap::Args)]
pub struct RunArguments {
    /// Number of nodes (3 or 5).
    #[arg(long, default_value_t = 3)]
    pub nodes: u64,
    /// How long the workload and the nemesis run ("60s", "10m").
    #[arg(long, default_value = "60s", value_parser = leasehold::duration::parse)]
    pub time: Duration,
    /// The seed of every random choice; random (and printed) when absent.
    #[arg(long, env = "LEASEHOLD_JEPSEN_SEED")]
    pub seed: Option<u64>,
    /// lock, fenced-counter, semaphore, election, attack or all (comma-separated).
    #[arg(long, default_value = "all")]
    pub workload: String,
    /// Comma-separated: kill, pause, partition, clock, member, disk, wipe-early,
    /// upgrade, all, none; worker-pause for the GC pause of workers alone, holder-kill
    /// for a holder's stop across a leader kill alone.
    #[arg(long, default_value = "all")]
    pub nemesis: String,
    /// Where the history, the summary and (on failure) node logs and data go.
    #[arg(long)]
    pub out: PathBuf,
    /// The control: the fenced store accepts every write (the in-memory store only).
    #[arg(long)]
    pub no_fencing: bool,
    /// Where the fenced counter's writes are decided: the harness's own map, or a
    /// real store through `leasehold::fence`'s adapter (many per grant).
    #[arg(long, value_enum, default_value_t = StoreKind::Memory)]
    pub fenced_store: StoreKind,
    /// The store's URL (for sqlite, the database file). By default the shared
    /// instance 0 of `scripts/stores.sh` (started if it is not running), and for
    /// sqlite a file in --out.
    #[arg(long)]
    pub fenced_store_url: Option<String>,
    /// Session TTL of the workers.
    #[arg(long, default_value_t = 3_000)]
    pub ttl_ms: u64,
    /// After the final heal every worker must acquire within this bound.
    #[arg(long, default_value_t = 30_000)]
    pub liveness_bound_ms: u64,
    /// Time budget of the linearizability search per key.
    #[arg(long, default_value_t = 30)]
    pub linearizability_budget_s: u64,
    /// Keep node data and logs even when the run is valid.
    #[arg(long)]
    pub keep: bool,
    /// Worker threads of each node; by default this machine's cores divided among
    /// the nodes (at least one each), as `cluster.sh` does.
    #[arg(long)]
    pub node_threads: Option<usize>,
    /// The control of the disk faults: nodes start with their incarnation checks off,
    /// so a wiped node counts as the member it was (and `refused-nodes` fails).
    #[arg(long)]
    pub no_incarnation_checks: bool,
    /// The control of the dead-holder bound: nodes write no checkpoints of quiet
    /// sessions, so a new leader restarts every lease at a full TTL (and check (i)
    /// fails once a leader dies while a stopped holder's lease runs out).
    #[arg(long)]
    pub full_ttl_restart: bool,
    /// The control of the `stream-after-rotation` attack: nodes keep a stream's
    /// credential as it opened (`--test-stream-outlives-rotation`), so a stream opened
    /// with a token rotated away goes on (and the attacks check fails).
    #[arg(long)]
    pub streams_outlive_rotation: bool,
    /// The lock-delay the lock workload's acquires ask for (0: none; at most
    /// 60000): a stopped holder's lock goes to nobody for this long after its
    /// session expires (check (j)).
    #[arg(long, default_value_t = LOCK_DELAY_MS_DEFAULT)]
    pub lock_delay_ms: u64,
    /// The control of check (j): the workers record the lock-delay in the history but
    /// do not ask the cluster for it, so a stopped holder's lock is handed on as soon
    /// as its session expires (and (j) fails).
    #[arg(long)]
    pub unrequested_lock_delay: bool,
    /// An older release's `leasehold-server`: the nodes start on it, and the
    /// `upgrade` nemesis moves them, one at a time spread over the run, to this
    /// workspace's build (the final heal moves any node still on it). Needs
    /// `--nemesis` to include `upgrade`, and the other way round.
    #[arg(long)]
    pub previous_server: Option<PathBuf>,
}

fn parse_workloads(text: &str) -> anyhow::Result<Vec<Workload>> {
    let mut workloads = BTreeSet::new();
    for word in text.split(',').map(str::trim).filter(|word| !word.is_empty()) {
        match word {
            "all" => {
                workloads.insert(Workload::Lock);
                workloads.insert(Workload::FencedCounter);
                workloads.insert(Workload::Semaphore);
                workloads.insert(Workload::Election);
                workloads.insert(Workload::Attack);
            }
            "lock" => {
                workloads.insert(Workload::Lock);
            }
            "fenced-counter" => {
                workloads.insert(Workload::FencedCounter);
            }
            "semaphore" => {
                workloads.insert(Workload::Semaphore);
            }
            "election" => {
                workloads.insert(Workload::Election);
            }
            "attack" => {
                workloads.insert(Workload::Attack);
            }
            "flood" => {
                workloads.insert(Workload::Flood);
            }
            other => {
                bail!("unknown workload {other:?}: use lock, fenced-counter, semaphore, election, attack, flood or all")
            }
        }
    }
    if workloads.is_empty() {
        bail!("no workload given");
    }
    Ok(workloads.into_iter().collect())
}

/// Entry point of `run`: enters the namespace, then runs.
pub async fn run(mut arguments: RunArguments) -> anyhow::Result<i32> {
    if arguments.nodes != NODES_MIN && arguments.nodes != NODES_MAX {
        bail!("--nodes must be 3 or 5, got {}", arguments.nodes);
    }
    parse_workloads(&arguments.workload)?;
    if arguments.lock_delay_ms > LOCK_DELAY_MS_MAX {
        bail!(
            "--lock-delay-ms must be at most {LOCK_DELAY_MS_MAX} (the cluster's limit), got {}",
            arguments.lock_delay_ms
        );
    }
    if arguments.unrequested_lock_delay && arguments.lock_delay_ms == 0 {
        bail!("--unrequested-lock-delay needs a lock-delay to leave out (--lock-delay-ms above 0)");
    }
    let kinds = NemesisKind::parse_list(&arguments.nemesis).map_err(anyhow::Error::msg)?;
    match (&arguments.previous_server, kinds.contains(&NemesisKind::Upgrade)) {
        (Some(server), true) if !server.is_file() => {
            bail!("--previous-server {} is not a file (scripts/previous-release.sh builds one)", server.display())
        }
        (None, true) => bail!("--nemesis upgrade needs --previous-server (scripts/previous-release.sh builds one)"),
        (Some(_), false) => bail!("--previous-server needs --nemesis to include upgrade"),
        _ => {}
    }
    if arguments.previous_server.is_some() && parse_workloads(&arguments.workload)?.contains(&Workload::Flood) {
        bail!("the flood workload's rate quota needs every node at this build: leave it out with --previous-server");
    }
    match arguments.fenced_store {
        StoreKind::Memory if arguments.fenced_store_url.is_some() => {
            bail!("--fenced-store-url needs --fenced-store (postgres, sqlite, mariadb, redis or etcd)")
        }
        StoreKind::Memory => {}
        store if arguments.no_fencing => bail!(
            "--no-fencing is the control of the in-memory store: the {} adapter has no unfenced write \
             (leave out --fenced-store)",
            store.name()
        ),
        _ if !parse_workloads(&arguments.workload)?.contains(&Workload::FencedCounter) => {
            bail!("--fenced-store needs the fenced-counter workload (--workload fenced-counter or all)")
        }
        _ => {}
    }
    let seed = *arguments.seed.get_or_insert_with(rand::random);
    if std::env::var(NAMESPACE_ENV).as_deref() != Ok("1") {
        println!("leasehold-jepsen: seed {seed}");
        std::fs::create_dir_all(&arguments.out).context("create --out")?;
        let executable = std::env::current_exe().context("current executable")?;
        let mut unshare = Command::new("unshare");
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            // Without root, a user namespace grants what nftables and ip need,
            // inside the namespace only.
            unshare.args(["--user", "--map-root-user"]);
        }
        unshare
            .args(["--net", "--pid", "--fork", "--kill-child", "--mount-proc"])
            .arg(executable)
            .args(std::env::args_os().skip(1))
            .env(NAMESPACE_ENV, "1")
            .env("LEASEHOLD_JEPSEN_SEED", seed.to_string());
        if arguments.fenced_store.is_server() {
            return run_beside_store_relay(unshare, &arguments).await;
        }
        let error = unshare.exec();
        bail!("cannot run unshare (util-linux) to enter a private namespace: {error}");
    }
    let status = Command::new("ip").args(["link", "set", "lo", "up"]).status().context("run ip (iproute2)")?;
    if !status.success() {
        bail!("ip link set lo up failed in the private network namespace");
    }
    let mut harness = Harness::start(arguments).await?;
    let result = harness.run().await;
    harness.cleanup();
    result
}

/// Runs the harness (`unshare`, built by `run`) as a child and relays its connections
/// to the store server of `--fenced-store` from a Unix socket: the store listens in
/// this, the host's, network namespace. Returns the harness's exit code.
async fn run_beside_store_relay(mut unshare: Command, arguments: &RunArguments) -> anyhow::Result<i32> {
    let kind = arguments.fenced_store;
    let url = match &arguments.fenced_store_url {
        Some(url) => url.clone(),
        None => fenced_store::shared_instance_url(kind)?,
    };
    let (_, address, _) = fenced_store::split_url(&url)?;
    // The relay would hide why: the harness inside would only see it close.
    let give_up = Instant::now() + Duration::from_millis(fenced_store::STORE_OPEN_MS_MAX);
    loop {
        let reach = tokio::net::TcpStream::connect(address);
        let error = match tokio::time::timeout(Duration::from_millis(fenced_store::STORE_ATTEMPT_MS_MAX), reach).await {
            Ok(Ok(_)) => break,
            Ok(Err(error)) => error.to_string(),
            Err(_) => "no answer".to_string(),
        };
        if Instant::now() >= give_up {
            bail!("cannot reach the {} store at {address}: {error}", kind.name());
        }
        tokio::time::sleep(Duration::from_millis(fenced_store::STORE_RETRY_MS)).await;
    }
    let socket = std::env::temp_dir().join(format!("leasehold-jepsen-store-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&socket);
    let listener = tokio::net::UnixListener::bind(&socket)
        .with_context(|| format!("listen on {} for the store relay", socket.display()))?;
    fenced_store::relay_to_store(listener, address.to_string());
    println!("leasehold-jepsen: the fenced store is {} at {address}", kind.name());
    unshare.env(STORE_URL_ENV, &url).env(STORE_SOCKET_ENV, &socket);
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: prctl and getppid only, which are async-signal-safe, between fork and
    // exec. Should this process die, unshare is killed, and with it (--kill-child)
    // the harness and everything it started, as when this process was unshare.
    unsafe {
        unshare.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::getppid() != parent {
                return Err(std::io::Error::other("leasehold-jepsen exited while starting unshare"));
            }
            Ok(())
        });
    }
    let mut child = unshare.spawn().context("cannot run unshare (util-linux) to enter a private namespace")?;
    let status = tokio::task::spawn_blocking(move || child.wait()).await?.context("wait for the harness")?;
    let _ = std::fs::remove_file(&socket);
    Ok(status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0)))
}

/// The fenced counter's store for a run: the in-memory map, or a real store on
/// resources of the run's own (`leasehold-jepsen/<seed>-<random>/`).
async fn open_fenced_store(arguments: &RunArguments, seed: u64) -> anyhow::Result<FencedStore> {
    let kind = arguments.fenced_store;
    if kind == StoreKind::Memory {
        return Ok(FencedStore::new(!arguments.no_fencing));
    }
    let prefix = format!("leasehold-jepsen/{seed}-{:016x}/", rand::random::<u64>());
    if kind.is_server() {
        let url = std::env::var(STORE_URL_ENV).with_context(|| format!("{STORE_URL_ENV} is not set"))?;
        let socket = std::env::var_os(STORE_SOCKET_ENV).with_context(|| format!("{STORE_SOCKET_ENV} is not set"))?;
        return fenced_store::open(kind, &url, Some(Path::new(&socket)), prefix).await;
    }
    let path = match &arguments.fenced_store_url {
        Some(path) => path.clone(),
        None => arguments.out.join("fenced-store.sqlite").to_str().context("--out is not UTF-8")?.to_string(),
    };
    fenced_store::open(kind, &path, None, prefix).await
}

/// As an operator who learnt that tenant `stolen`'s token leaked: rotates it every
/// `STOLEN_ROTATION_MS` until `stopped`, writing each new token where the intruder
/// reads it (the leak goes on: each try gets a fresh token, with a stream to open
/// before the next rotation). Returns how many rotations took; one that fails (a
/// fault) is tried again at the next turn.
async fn rotate_stolen_token(
    admin: leasehold::Client,
    file: PathBuf,
    mut stopped: tokio::sync::watch::Receiver<bool>,
) -> u64 {
    let mut rotated = 0;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(STOLEN_ROTATION_MS)) => {}
            _ = stopped.wait_for(|stop| *stop) => return rotated,
        }
        let rotation =
            tokio::time::timeout(Duration::from_millis(RECOVERY_MS_MAX), admin.rotate_tenant_token(STOLEN_TENANT));
        if let Ok(Ok(token)) = rotation.await {
            if leasehold::certs::write_file(&file, &token, true).is_ok() {
                rotated += 1;
            }
        }
    }
}

/// What the attack worker is given: the intruder tenant's token and its client
/// certificate from the cluster CA, and node certificates from the cluster CA (every
/// member's and a never-member's, as stolen node keys), all files in
/// `--out`/intruder/. Not the admin token, not the test tenant's.
struct IntruderCredentials {
    token_file: PathBuf,
    /// Tenant `stolen`'s current token, rewritten at each rotation.
    stolen_token_file: PathBuf,
    certificate_file: PathBuf,
    key_file: PathBuf,
    /// `node-<id>.pem` and `.key` for ids 1 to `--nodes` and `NON_MEMBER_NODE_ID`.
    node_certificates: PathBuf,
}

struct WorkerProcess {
    process: u64,
    workload: Workload,
    child: Child,
    stdin: Option<ChildStdin>,
    history: PathBuf,
}

struct Harness {
    arguments: RunArguments,
    seed: u64,
    random: StdRng,
    cluster: TestCluster,
    store: FencedStore,
    workloads: Vec<Workload>,
    faults_enabled: Vec<Fault>,
    workers: Vec<WorkerProcess>,
    faults: Vec<FaultRecord>,
    restarts: Vec<RestartObservation>,
    /// Each node's own (stale-read) semaphore and election states, sampled after
    /// every fault and after the final heal, for the white-box check.
    replica_states: Vec<ReplicaState>,
    /// Nodes started on a wiped or corrupted data directory, and how they ended.
    refusals: Vec<Refusal>,
    /// Nodes whose clock was skewed (reset at the final heal).
    skewed: BTreeSet<u64>,
    /// When the fault being injected stopped its worker: a worker stop first waits
    /// up to 3 s for a holder (`choose_holder`), and checks (i) and (j) take the
    /// fault's start for the stop.
    worker_stopped_ns: Option<u64>,
    /// Nodes still on `--previous-server`, and the upgrades done so far.
    previous: BTreeSet<u64>,
    upgrades: Vec<Upgrade>,
    /// Node processes that ended on their own where no fault stops them.
    node_exits: Vec<NodeExit>,
    /// Nodes seen down whose exit is accounted for (noted, the harness's kill, or
    /// the fault's own), until they are seen running again.
    exits_accounted: BTreeSet<u64>,
    started: Instant,
    /// The peer ports' delaying proxies (with the slow-link nemesis).
    links: Option<std::sync::Arc<slow_link::Links>>,
    /// The grey faults, for their figures.
    grey: Vec<GreyObservation>,
}

impl Harness {
    async fn start(arguments: RunArguments) -> anyhow::Result<Harness> {
        let seed = arguments.seed.expect("seed chosen");
        println!("leasehold-jepsen: seed {seed} (inside the private namespace)");
        let out = arguments.out.clone();
        std::fs::create_dir_all(out.join("workers"))?;
        let workloads = parse_workloads(&arguments.workload)?;
        let store = open_fenced_store(&arguments, seed).await?;
        println!("leasehold-jepsen: fenced store: {}", store.describe());
        let kinds = NemesisKind::parse_list(&arguments.nemesis).map_err(anyhow::Error::msg)?;
        let mut faults_enabled: Vec<Fault> = Vec::new();
        // The upgrades and the early wipe run on a schedule of their own (see
        // `upgrade_due`, `wipe_early`), not drawn.
        for fault in kinds.iter().flat_map(|kind| kind.faults().iter().copied()) {
            if !fault.scheduled() && !faults_enabled.contains(&fault) {
                faults_enabled.push(fault);
            }
        }
        let links = kinds.contains(&NemesisKind::SlowLink).then(|| slow_link::Links::new(seed));
        let cluster = TestCluster::start(ClusterOptions {
            nodes: arguments.nodes,
            addressing: Addressing::PerNodeIp { client_port: CLIENT_PORT, peer_port: PEER_PORT },
            directory: Some(out.join("nodes")),
            heartbeat_ms: Some(HEARTBEAT_MS),
            election_timeout_min_ms: Some(ELECTION_TIMEOUT_MIN_MS),
            election_timeout_max_ms: Some(ELECTION_TIMEOUT_MAX_MS),
            worker_threads: arguments.node_threads,
            extra_arguments: std::iter::once("--test-clock-knob")
                .chain(arguments.no_incarnation_checks.then_some("--test-accept-any-incarnation"))
                .chain(arguments.full_ttl_restart.then_some("--test-full-ttl-restart"))
                .chain(arguments.streams_outlive_rotation.then_some("--test-stream-outlives-rotation"))
                .chain(kinds.contains(&NemesisKind::SlowDisk).then_some("--test-disk-knob"))
                .map(String::from)
                .collect(),
            server: arguments.previous_server.clone(),
            peer_proxy: links.clone(),
            ..Default::default()
        });
        let previous: BTreeSet<u64> =
            if arguments.previous_server.is_some() { cluster.nodes.keys().copied().collect() } else { BTreeSet::new() };
        let mut harness = Harness {
            random: StdRng::seed_from_u64(seed),
            seed,
            refusals: Vec::new(),
            arguments,
            cluster,
            store,
            workloads,
            faults_enabled,
            workers: Vec::new(),
            faults: Vec::new(),
            restarts: Vec::new(),
            replica_states: Vec::new(),
            skewed: BTreeSet::new(),
            worker_stopped_ns: None,
            previous,
            upgrades: Vec::new(),
            node_exits: Vec::new(),
            exits_accounted: BTreeSet::new(),
            started: Instant::now(),
            links,
            grey: Vec::new(),
        };
        let Some(first_leader) = harness.wait_for_leader(Duration::from_millis(RECOVERY_MS_MAX)).await else {
            bail!("the cluster elected no leader within {RECOVERY_MS_MAX} ms of starting");
        };
        if kinds.contains(&NemesisKind::WipeEarly) {
            harness.wipe_early(first_leader, Instant::now()).await;
        }
        // The tenant the workers act as, and its token file.
        harness.cluster.wait_for_leader(Duration::from_millis(RECOVERY_MS_MAX)).await;
        Ok(harness)
    }

    fn log(&self, message: &str) {
        println!("[{:>7.1}s] {message}", self.started.elapsed().as_secs_f64());
    }

    async fn wait_for_leader(&self, deadline: Duration) -> Option<u64> {
        let give_up = Instant::now() + deadline;
        loop {
            if let Some(leader) = self.cluster.leader().await {
                return Some(leader);
            }
            if Instant::now() >= give_up {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(STATUS_POLL_MS)).await;
        }
    }

    /// Adds the intruder tenant (as an operator would) and writes what the attack
    /// worker gets: its token and a client certificate the cluster CA signed for it.
    async fn make_intruder(&self) -> anyhow::Result<IntruderCredentials> {
        let directory = self.arguments.out.join("intruder");
        std::fs::create_dir_all(&directory)?;
        let token = self.add_tenant(INTRUDER_TENANT, INTRUDER_QUOTAS).await?;
        let token_file = directory.join("intruder.token");
        leasehold::certs::write_file(&token_file, &token, true)?;
        let stolen = self.add_tenant(STOLEN_TENANT, STOLEN_QUOTAS).await?;
        let stolen_token_file = directory.join("stolen.token");
        leasehold::certs::write_file(&stolen_token_file, &stolen, true)?;
        let ca_key = std::fs::read_to_string(self.cluster.credentials.directory.join("ca.key"))
            .context("read the cluster CA's key")?;
        let pem = leasehold::certs::tenant_certificate(&ca_key, INTRUDER_TENANT, &token)?;
        let (certificate_file, key_file) =
            leasehold::certs::write_pair(&directory, &format!("tenant-{INTRUDER_TENANT}"), &pem)?;
        let node_certificates = directory.join("nodes");
        std::fs::create_dir_all(&node_certificates)?;
        for id in (1..=self.arguments.nodes).chain([NON_MEMBER_NODE_ID]) {
            let (cert, key) = self.cluster.credentials.node_identity(id);
            let (cert_file, key_file) = node_certificate_files(&node_certificates, id);
            leasehold::certs::write_file(&cert_file, &cert, false)?;
            leasehold::certs::write_file(&key_file, &key, true)?;
        }
        Ok(IntruderCredentials { token_file, stolen_token_file, certificate_file, key_file, node_certificates })
    }

    /// Adds tenant `name` with `quotas` (as an operator would) and returns its token:
    /// when an earlier attempt made it and its answer was lost, its token is rotated
    /// instead. Retried until `RECOVERY_MS_MAX`.
    async fn add_tenant(&self, name: &str, quotas: leasehold::proto::Quotas) -> anyhow::Result<String> {
        let admin = self.cluster.admin_client();
        let give_up = Instant::now() + Duration::from_millis(RECOVERY_MS_MAX);
        loop {
            match admin.add_tenant(name, quotas).await {
                Ok(added) => return Ok(added.token),
                Err(leasehold::Error::Refused(_)) => {
                    if let Ok(token) = admin.rotate_tenant_token(name).await {
                        return Ok(token);
                    }
                }
                Err(error) if Instant::now() >= give_up => bail!("cannot add the {name} tenant: {error}"),
                Err(_) => {}
            }
            if Instant::now() >= give_up {
                bail!("cannot add the {name} tenant within {RECOVERY_MS_MAX} ms");
            }
            tokio::time::sleep(Duration::from_millis(STATUS_POLL_MS)).await;
        }
    }

    /// Adds the flood tenant with its rate quota and writes its token to
    /// `--out`/flood.token.
    async fn make_flood_tenant(&self) -> anyhow::Result<PathBuf> {
        let token = self.add_tenant(FLOOD_TENANT, FLOOD_QUOTAS).await?;
        let token_file = self.arguments.out.join("flood.token");
        leasehold::certs::write_file(&token_file, &token, true)?;
        Ok(token_file)
    }

    fn spawn_workers(
        &mut self,
        store: std::net::SocketAddr,
        intruder: Option<&IntruderCredentials>,
        flood_token: Option<&PathBuf>,
    ) -> anyhow::Result<()> {
        let executable = std::env::current_exe()?;
        let endpoints = self.cluster.endpoints().join(",");
        let peer_endpoints = self
            .cluster
            .nodes
            .iter()
            .map(|(id, node)| format!("{id}={}", node.peer_addr))
            .collect::<Vec<_>>()
            .join(",");
        let nodes: Vec<&crate::cluster::NodeProcess> = self.cluster.nodes.values().collect();
        let http_endpoints = |address: fn(&crate::cluster::NodeProcess) -> Option<String>| {
            nodes.iter().filter_map(|node| address(node)).collect::<Vec<_>>().join(",")
        };
        let mut process: u64 = 0;
        for workload in self.workloads.clone() {
            for index in 0..workload.workers() {
                process += 1;
                let history = self.arguments.out.join("workers").join(format!("worker-{process}.jsonl"));
                let log =
                    std::fs::File::create(self.arguments.out.join("workers").join(format!("worker-{process}.log")))?;
                let seed = self.seed ^ process.wrapping_mul(0x9E37_79B9_7F4A_7C15);
                let mut command = Command::new(&executable);
                command.args(["workload-worker", "--endpoints", &endpoints]).envs(self.cluster.client_env());
                if workload == Workload::Attack {
                    let intruder = intruder.context("the attack workload needs the intruder tenant")?;
                    // The intruder's credential only: not the admin's, not the test tenant's.
                    command
                        .env_remove(leasehold::settings::ENV_ADMIN_TOKEN_FILE)
                        .env_remove(leasehold::settings::ENV_TOKEN)
                        .env_remove(leasehold::settings::ENV_CERT_FILE)
                        .env_remove(leasehold::settings::ENV_KEY_FILE)
                        .env(leasehold::settings::ENV_TOKEN_FILE, &intruder.token_file)
                        .args(["--peer-endpoints", &peer_endpoints])
                        .args(["--metrics-endpoints", &http_endpoints(|node| node.metrics_addr.clone())])
                        .args(["--status-endpoints", &http_endpoints(|node| node.status_addr.clone())])
                        .arg("--stolen-token-file")
                        .arg(&intruder.stolen_token_file)
                        .arg("--tenant-certificate")
                        .arg(&intruder.certificate_file)
                        .arg("--tenant-key")
                        .arg(&intruder.key_file)
                        .arg("--node-certificates")
                        .arg(&intruder.node_certificates)
                        .args(self.arguments.previous_server.is_some().then_some("--older-release-nodes"))
                        .arg("--leak-from")
                        .arg(self.arguments.out.join("workers"));
                }
                if workload == Workload::Flood {
                    let token_file = flood_token.context("the flood workload needs the flood tenant")?;
                    // The flood tenant's credential only.
                    command
                        .env_remove(leasehold::settings::ENV_ADMIN_TOKEN_FILE)
                        .env_remove(leasehold::settings::ENV_TOKEN)
                        .env_remove(leasehold::settings::ENV_CERT_FILE)
                        .env_remove(leasehold::settings::ENV_KEY_FILE)
                        .env(leasehold::settings::ENV_TOKEN_FILE, token_file);
                }
                let mut child = command
                    .args(["--process", &process.to_string()])
                    .args(["--workload", workload.name()])
                    .args(["--seed", &seed.to_string()])
                    .args(["--ttl-ms", &self.arguments.ttl_ms.to_string()])
                    .args(["--store", &store.to_string()])
                    .arg("--history")
                    .arg(&history)
                    .args(["--liveness-bound-ms", &self.arguments.liveness_bound_ms.to_string()])
                    .args(["--lock-delay-ms", &self.arguments.lock_delay_ms.to_string()])
                    .args(self.arguments.unrequested_lock_delay.then_some("--unrequested-lock-delay"))
                    .args((workload == Workload::Election && index == 0).then_some("--observer"))
                    .env("RUST_LOG", "warn")
                    .stdin(Stdio::piped())
                    .stdout(log.try_clone()?)
                    .stderr(log)
                    .process_group(0)
                    .spawn()
                    .context("start a worker")?;
                let stdin = child.stdin.take();
                self.workers.push(WorkerProcess { process, workload, child, stdin, history });
            }
        }
        Ok(())
    }

    fn signal_worker(&self, index: usize, signal: i32) {
        // SAFETY: signalling a worker process this harness started, by its id.
        unsafe {
            libc::kill(self.workers[index].child.id() as i32, signal);
        }
    }

    async fn run(&mut self) -> anyhow::Result<i32> {
        let store_address = self.store.serve().await?;
        let intruder =
            if self.workloads.contains(&Workload::Attack) { Some(self.make_intruder().await?) } else { None };
        let flood_token =
            if self.workloads.contains(&Workload::Flood) { Some(self.make_flood_tenant().await?) } else { None };
        self.spawn_workers(store_address, intruder.as_ref(), flood_token.as_ref())?;
        let (stop_rotations, rotations_stopped) = tokio::sync::watch::channel(false);
        let rotations = intruder.as_ref().map(|intruder| {
            let (admin, file) = (self.cluster.admin_client(), intruder.stolen_token_file.clone());
            tokio::spawn(rotate_stolen_token(admin, file, rotations_stopped))
        });
        self.log(&format!(
            "seed {}: {} nodes ({} worker thread(s) per node), workloads {:?}, faults {:?}, {} workers, {:?}, \
             fenced store {}",
            self.seed,
            self.arguments.nodes,
            self.cluster.options.worker_threads_per_node(),
            self.workloads,
            self.faults_enabled.iter().map(|fault| fault.name()).collect::<Vec<_>>(),
            self.workers.len(),
            self.arguments.time,
            self.store.kind().name()
        ));
        let begin = Instant::now();
        let end = begin + self.arguments.time;
        let upgrade_due = upgrade_schedule(begin, self.arguments.time, self.previous.len());
        while Instant::now() < end {
            let gap = self.random.random_range(FAULT_GAP_MS_MIN..=FAULT_GAP_MS_MAX);
            let left = end.saturating_duration_since(Instant::now());
            self.watched_sleep(Duration::from_millis(gap).min(left)).await;
            let upgrade = upgrade_due.get(self.upgrades.len()).is_some_and(|due| Instant::now() >= *due);
            if Instant::now() >= end || (self.faults_enabled.is_empty() && !upgrade) {
                continue;
            }
            let fault =
                if upgrade { Fault::RollingUpgrade } else { *self.faults_enabled.choose(&mut self.random).unwrap() };
            let start_ns = monotonic_ns();
            let (outcome, targets, detail) = self.inject(fault).await;
            let start_ns = self.worker_stopped_ns.take().unwrap_or(start_ns);
            // A node fault's targets may be down by the fault's design; any other node
            // that is down ended on its own.
            let excused = if fault.stops_its_targets() { targets.clone() } else { Vec::new() };
            self.watch_nodes(&excused).await;
            let mut record = FaultRecord { fault: fault.name(), outcome, targets, detail, start_ns, end_ns: 0 };
            if self.wait_for_leader(Duration::from_millis(RECOVERY_MS_MAX)).await.is_none() {
                record.detail.push_str("; no leader within the recovery deadline after healing");
            }
            record.end_ns = monotonic_ns();
            self.sample_replicas().await;
            self.log(&format!("{} {:?} {:?} {}", record.fault, record.outcome, record.targets, record.detail));
            self.faults.push(record);
        }
        let _ = stop_rotations.send(true);
        if let Some(rotations) = rotations {
            let rotated = rotations.await.unwrap_or(0);
            self.log(&format!("tenant {STOLEN_TENANT}'s token rotated {rotated} times"));
        }
        self.final_heal().await;
        self.sample_replicas().await;
        let final_ns = monotonic_ns();
        self.log("final heal done; workers run the liveness phase");
        for worker in &mut self.workers {
            if let Some(mut stdin) = worker.stdin.take() {
                let _ = stdin.write_all(b"final\n");
            }
        }
        let give_up = Instant::now() + Duration::from_millis(self.arguments.liveness_bound_ms + WORKER_EXIT_SLACK_MS);
        let mut stuck = Vec::new();
        for worker in &mut self.workers {
            loop {
                match worker.child.try_wait() {
                    Ok(Some(_)) => break,
                    Ok(None) if Instant::now() < give_up => {
                        tokio::time::sleep(Duration::from_millis(STATUS_POLL_MS)).await
                    }
                    _ => {
                        let _ = worker.child.kill();
                        let _ = worker.child.wait();
                        stuck.push(worker.process);
                        break;
                    }
                }
            }
        }
        if !stuck.is_empty() {
            self.log(&format!("workers {stuck:?} did not exit in time and were killed"));
        }
        self.watch_nodes(&[]).await;
        self.check_and_report(final_ns).await
    }

    /// Notes every node process that ended on its own since the last look, for the
    /// `nodes stayed up` check; `excused` nodes are down by the design of the fault
    /// just installed. A node the harness killed or stopped is no exit of its own
    /// (`try_exit_status` knows only how a process ended by itself).
    async fn watch_nodes(&mut self, excused: &[u64]) {
        let ids: Vec<u64> = self.cluster.nodes.keys().copied().collect();
        for id in ids {
            if self.cluster.is_running(id) {
                self.exits_accounted.remove(&id);
                continue;
            }
            if !self.exits_accounted.insert(id) || excused.contains(&id) {
                continue;
            }
            let Some(status) = self.cluster.try_exit_status(id, Duration::ZERO).await else {
                continue;
            };
            let exit = status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
            let tail = self.cluster.log_tail(id);
            let lines: Vec<&str> = tail.lines().collect();
            let log_tail = lines[lines.len().saturating_sub(EXIT_LOG_LINES_MAX)..].join("\n");
            self.log(&format!("node {id} exited on its own with code {exit}; its log ends:\n{log_tail}"));
            self.node_exits.push(NodeExit { node: id, exit, seen_ns: monotonic_ns(), log_tail });
        }
    }

    /// Waits `duration`, looking for nodes that exit on their own meanwhile.
    async fn watched_sleep(&mut self, duration: Duration) {
        let until = Instant::now() + duration;
        loop {
            self.watch_nodes(&[]).await;
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            tokio::time::sleep(left.min(Duration::from_millis(STATUS_POLL_MS))).await;
        }
    }

    /// `wipe-early`: in the fresh cluster, within `WIPE_EARLY_MS_MAX` of seeing the
    /// first leader (`leader`, seen at `leader_seen`), a follower is killed, its data
    /// directory emptied and the node restarted at once with its usual flags. The
    /// leader may not have recorded every member yet; the node must stop all the same
    /// (exit code 4, for the `refused-nodes` check) and the leader must live (the
    /// `nodes stayed up` check). Then the node is replaced as the README says. Recorded
    /// like every fault.
    async fn wipe_early(&mut self, leader: u64, leader_seen: Instant) {
        let start_ns = monotonic_ns();
        let (outcome, targets, detail) = match self.random_follower(Some(leader)) {
            Err(skipped) => skipped,
            Ok(target) => {
                self.cluster.wipe(target);
                self.cluster.restart(target);
                let after_ms = leader_seen.elapsed().as_millis() as u64;
                let late = if after_ms > WIPE_EARLY_MS_MAX { " (late: the machine is slow)" } else { "" };
                let mut detail = format!(
                    "node {target} killed, wiped and restarted {after_ms} ms after leader {leader} was seen{late}; "
                );
                detail.push_str(&self.expect_refusal(Fault::WipeEarly, target, EXIT_STALE_INCARNATION).await);
                let leader_lives = self.cluster.is_running(leader);
                detail.push_str(&format!("leader {leader} {}; ", if leader_lives { "lives" } else { "is down" }));
                let outcome = self.replace_in_place(target, &mut detail).await;
                (outcome, vec![target], detail)
            }
        };
        let fault = Fault::WipeEarly.name();
        let mut record = FaultRecord { fault, outcome, targets, detail, start_ns, end_ns: 0 };
        self.watch_nodes(&record.targets).await;
        if self.wait_for_leader(Duration::from_millis(RECOVERY_MS_MAX)).await.is_none() {
            record.detail.push_str("; no leader within the recovery deadline after healing");
        }
        record.end_ns = monotonic_ns();
        self.log(&format!("{} {:?} {:?} {}", record.fault, record.outcome, record.targets, record.detail));
        self.faults.push(record);
    }

    fn running_nodes(&mut self) -> Vec<u64> {
        let ids: Vec<u64> = self.cluster.nodes.keys().copied().collect();
        ids.into_iter().filter(|id| self.cluster.is_running(*id)).collect()
    }

    fn hold(&mut self) -> Duration {
        Duration::from_millis(self.random.random_range(FAULT_HOLD_MS_MIN..=FAULT_HOLD_MS_MAX))
    }

    /// Installs one fault, holds it, heals it. Returns the outcome, the targets and
    /// a detail line.
    async fn inject(&mut self, fault: Fault) -> (Outcome, Vec<u64>, String) {
        let leader = self.cluster.leader().await;
        let nodes = self.running_nodes();
        match fault {
            Fault::KillLeader | Fault::KillRandom => {
                let target = match fault {
                    Fault::KillLeader => leader,
                    _ => nodes.choose(&mut self.random).copied(),
                };
                let Some(target) = target else {
                    return (Outcome::Skipped, vec![], "no leader to kill".into());
                };
                self.cluster.kill(target);
                let hold = self.hold();
                tokio::time::sleep(hold).await;
                self.cluster.restart(target);
                (Outcome::Installed, vec![target], format!("down for {} ms", hold.as_millis()))
            }
            Fault::KillAll => self.kill_all().await,
            Fault::PauseNode | Fault::PauseLeader => {
                let target = match fault {
                    Fault::PauseLeader => leader,
                    _ => nodes.choose(&mut self.random).copied(),
                };
                let Some(target) = target else {
                    return (Outcome::Skipped, vec![], "no leader to pause".into());
                };
                let hold_ms = self.random.random_range(2 * ELECTION_TIMEOUT_MAX_MS..=3 * ELECTION_TIMEOUT_MAX_MS);
                self.cluster.pause(target);
                tokio::time::sleep(Duration::from_millis(hold_ms)).await;
                self.cluster.resume(target);
                (Outcome::Installed, vec![target], format!("stopped for {hold_ms} ms"))
            }
            Fault::PauseWorker => self.pause_worker().await,
            Fault::PauseWorkerKillLeader => self.pause_worker_kill_leader().await,
            Fault::PartitionHalves | Fault::PartitionLeader | Fault::PartitionBridge | Fault::PartitionOneWay => {
                let members: Vec<u64> = self.cluster.nodes.keys().copied().collect();
                let grudge = nemesis::grudge(fault, &members, leader, &mut self.random);
                let reject = self.random.random_bool(0.5);
                let addresses: BTreeMap<u64, String> = self
                    .cluster
                    .nodes
                    .iter()
                    .map(|(id, node)| {
                        (*id, node.peer_addr.rsplit_once(':').map(|(ip, _)| ip.to_string()).unwrap_or_default())
                    })
                    .collect();
                let installed = nemesis::install_partition(&grudge, |id| addresses[&id].clone(), reject);
                let hold = self.hold();
                let outcome = match installed {
                    Ok(()) => {
                        tokio::time::sleep(hold).await;
                        Outcome::Installed
                    }
                    Err(_) => Outcome::Skipped,
                };
                nemesis::heal_partition();
                let targets: BTreeSet<u64> = grudge.iter().flat_map(|(a, b)| [*a, *b]).collect();
                (
                    outcome,
                    targets.into_iter().collect(),
                    match installed {
                        Ok(()) => format!(
                            "{} links cut ({}) for {} ms: {:?}",
                            grudge.len(),
                            if reject { "tcp reset" } else { "drop" },
                            hold.as_millis(),
                            grudge
                        ),
                        Err(error) => error,
                    },
                )
            }
            Fault::ClockFast | Fault::ClockSlow | Fault::ClockJump => {
                let Some(target) = leader.or_else(|| nodes.first().copied()) else {
                    return (Outcome::Skipped, vec![], "no node to skew".into());
                };
                let (rate, jump) = match fault {
                    Fault::ClockFast => (self.random.random_range(2_000..=5_000), 0),
                    Fault::ClockSlow => (self.random.random_range(300..=700), 0),
                    _ => (1_000, self.random.random_range(self.arguments.ttl_ms..=2 * self.arguments.ttl_ms)),
                };
                let endpoint = self.cluster.nodes[&target].client_addr.clone();
                let client = self.cluster.admin_client_of(target);
                let skewed =
                    tokio::time::timeout(Duration::from_secs(5), client.skew_clock(&endpoint, rate, jump)).await;
                let (outcome, detail) = match skewed {
                    Ok(Ok(())) => (Outcome::Installed, format!("rate {rate}/1000, jump {jump} ms")),
                    Ok(Err(error)) if error.is_definite() || error.to_string().contains("Unimplemented") => {
                        (Outcome::Skipped, format!("knob refused: {error}"))
                    }
                    Ok(Err(error)) => (Outcome::Indeterminate, error.to_string()),
                    Err(_) => (Outcome::Indeterminate, "knob request timed out".into()),
                };
                if outcome != Outcome::Skipped {
                    self.skewed.insert(target);
                }
                if outcome == Outcome::Installed && fault != Fault::ClockJump {
                    let hold = self.hold();
                    tokio::time::sleep(hold).await;
                    let _ = tokio::time::timeout(Duration::from_secs(5), client.skew_clock(&endpoint, 1_000, 0)).await;
                }
                (outcome, vec![target], detail)
            }
            Fault::MemberReplace => self.replace_member(leader).await,
            Fault::WipeRejoin => self.wipe_rejoin(leader).await,
            Fault::CorruptReplace => self.corrupt_replace(leader).await,
            Fault::DiskFull => self.disk_full(leader).await,
            Fault::RollingUpgrade => self.rolling_upgrade(leader).await,
            Fault::WipeEarly => (Outcome::Skipped, vec![], "runs once, at the start (see `wipe_early`)".into()),
            Fault::SlowLink | Fault::SlowCpu | Fault::SlowDisk => self.grey_fault(fault, leader, &nodes).await,
        }
    }

    /// Holds a grey fault for `hold`, stopping a worker (a lock holder when one is
    /// found) for 1.5–2 TTLs inside it, so that check (i) measures the bound on a dead
    /// holder with a node slow. The stop is recorded as a `pause-worker` of its own.
    ///
    /// Returns what an operator sees of `target` near the fault's end, while it lasts:
    /// the round trip another node measures to it (its status page, `leasehold
    /// status`, `leasehold_peer_rtt_seconds`), and its log's mean sync time since
    /// `syncs_before` (`leasehold_log_sync_seconds`).
    async fn grey_hold(&mut self, hold: Duration, target: u64, syncs_before: Option<(f64, f64)>) -> String {
        let began = Instant::now();
        let (outcome, targets, detail) = self.pause_worker().await;
        if let Some(start_ns) = self.worker_stopped_ns.take() {
            let record = FaultRecord {
                fault: Fault::PauseWorker.name(),
                outcome,
                targets,
                detail: format!("{detail}, inside a grey fault"),
                start_ns,
                end_ns: monotonic_ns(),
            };
            self.log(&format!("{} {:?} {:?} {}", record.fault, record.outcome, record.targets, record.detail));
            self.faults.push(record);
        }
        tokio::time::sleep(hold.saturating_sub(began.elapsed())).await;
        let leader = self.cluster.leader().await;
        let observer = leader
            .filter(|leader| *leader != target)
            .or_else(|| self.running_nodes().into_iter().find(|id| *id != target && Some(*id) != leader));
        let mut seen = Vec::new();
        if let Some(observer) = observer {
            let status = tokio::time::timeout(Duration::from_secs(2), self.cluster.status(observer)).await;
            let round_trip = status.ok().flatten().and_then(|status| {
                status.members.into_iter().find(|member| member.node_id == target).and_then(|member| member.round_trip)
            });
            if let Some(round_trip) = round_trip {
                seen.push(format!(
                    "node {observer} measures a round trip of {:.1} ms to it",
                    round_trip.median_us as f64 / 1e3
                ));
            }
        }
        if let (Some((sum_before, count_before)), Some((sum, count))) = (syncs_before, self.log_syncs(target).await) {
            if count > count_before {
                seen.push(format!(
                    "its log's syncs took {:.1} ms on average ({} syncs)",
                    (sum - sum_before) / (count - count_before) * 1e3,
                    count - count_before
                ));
            }
        }
        if seen.is_empty() {
            "seen: nothing (the node did not answer in time)".to_string()
        } else {
            format!("seen: {}", seen.join(", "))
        }
    }

    /// Node `id`'s `leasehold_log_sync_seconds` sum and count; None when it does not
    /// answer within 2 s.
    async fn log_syncs(&self, id: u64) -> Option<(f64, f64)> {
        let answer = tokio::time::timeout(Duration::from_secs(2), self.cluster.scrape(id)).await.ok()?.ok()?;
        let value = |name: &str| {
            answer.body.lines().find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse::<f64>().ok())
        };
        Some((value("leasehold_log_sync_seconds_sum")?, value("leasehold_log_sync_seconds_count")?))
    }

    /// The highest term any running node reports.
    async fn highest_term(&mut self) -> Option<u64> {
        let mut highest = None;
        for id in self.running_nodes() {
            if let Some(status) = self.cluster.status(id).await {
                highest = highest.max(Some(status.term));
            }
        }
        highest
    }

    /// A grey fault on the leader or a follower (even odds): installs it, holds it
    /// for `GREY_HOLD_MS_MIN`..`GREY_HOLD_MS_MAX` (a worker stopped inside it, see
    /// `grey_hold`), heals it, and records for the figures how many terms began
    /// meanwhile and whether leadership moved.
    async fn grey_fault(&mut self, fault: Fault, leader: Option<u64>, nodes: &[u64]) -> (Outcome, Vec<u64>, String) {
        let on_leader = leader.is_some() && self.random.random_bool(0.5);
        let target = if on_leader {
            leader
        } else {
            let followers: Vec<u64> = nodes.iter().copied().filter(|id| Some(*id) != leader).collect();
            followers.choose(&mut self.random).copied()
        };
        let Some(target) = target else {
            return (Outcome::Skipped, vec![], "no node to slow".into());
        };
        let role = if Some(target) == leader { "leader" } else { "follower" };
        let terms_before = self.highest_term().await;
        let syncs_before = self.log_syncs(target).await;
        let start_ns = monotonic_ns();
        let hold = Duration::from_millis(self.random.random_range(GREY_HOLD_MS_MIN..=GREY_HOLD_MS_MAX));
        let (outcome, what) = match fault {
            Fault::SlowLink => {
                let Some(links) = self.links.clone() else {
                    return (Outcome::Skipped, vec![target], "no proxies (slow-link was not asked for)".into());
                };
                let delay = Duration::from_millis(self.random.random_range(20..=60));
                let jitter = Duration::from_millis(self.random.random_range(0..=20));
                links.set(target, Some(slow_link::Slowness { delay, jitter }));
                let seen = self.grey_hold(hold, target, syncs_before).await;
                links.heal();
                (
                    Outcome::Installed,
                    format!("every peer link +{} ms (jitter {} ms); {seen}", delay.as_millis(), jitter.as_millis()),
                )
            }
            Fault::SlowCpu => {
                let Some(pid) = self.cluster.pid(target) else {
                    return (Outcome::Skipped, vec![target], "the node is not running".into());
                };
                let per_mille = self.random.random_range(30..=100);
                let name = format!("leasehold-jepsen-{}-node{target}", std::process::id());
                match slow_cpu::limit(pid, per_mille, &name) {
                    Err(error) => (Outcome::Skipped, error),
                    Ok(limit) => {
                        let seen = self.grey_hold(hold, target, syncs_before).await;
                        limit.lift();
                        (Outcome::Installed, format!("held to {:.1} % of a core; {seen}", per_mille as f64 / 10.0))
                    }
                }
            }
            _ => {
                let delay_ms = self.random.random_range(20..=80);
                let endpoint = self.cluster.nodes[&target].client_addr.clone();
                let client = self.cluster.admin_client_of(target);
                let slowed = tokio::time::timeout(Duration::from_secs(5), client.slow_disk(&endpoint, delay_ms)).await;
                let outcome = match slowed {
                    Ok(Ok(())) => Outcome::Installed,
                    Ok(Err(error)) if error.is_definite() => {
                        return (Outcome::Skipped, vec![target], format!("knob refused: {error}"));
                    }
                    _ => Outcome::Indeterminate,
                };
                let seen = self.grey_hold(hold, target, syncs_before).await;
                let mut healed = false;
                for _ in 0..3 {
                    let answer = tokio::time::timeout(Duration::from_secs(5), client.slow_disk(&endpoint, 0)).await;
                    if matches!(answer, Ok(Ok(()))) {
                        healed = true;
                        break;
                    }
                }
                let healed = if healed { "" } else { " (the heal went unanswered)" };
                (outcome, format!("every fsync +{delay_ms} ms{healed}; {seen}"))
            }
        };
        let end_ns = monotonic_ns();
        let terms_after = self.highest_term().await;
        let elections = match (terms_before, terms_after) {
            (Some(before), Some(after)) => after.saturating_sub(before),
            _ => 0,
        };
        let leader_after = self.cluster.leader().await;
        let leadership_moved = role == "leader" && leader_after.is_some_and(|now| now != target);
        if outcome != Outcome::Skipped {
            self.grey.push(GreyObservation {
                fault: fault.name(),
                role,
                start_ns,
                end_ns,
                elections,
                leadership_moved,
            });
        }
        let moved = match (role, leader_after) {
            ("leader", Some(now)) if now != target => format!("; leadership moved to node {now}"),
            ("leader", _) => "; it still leads".to_string(),
            _ => String::new(),
        };
        (
            outcome,
            vec![target],
            format!(
                "node {target} ({role}): {what}; {} ms; {elections} term(s) began{moved}",
                (end_ns - start_ns) / 1_000_000
            ),
        )
    }

    /// Upgrades one node still on the older build: a follower first, the leader
    /// last. A node that is down (another fault) waits for the next turn.
    async fn rolling_upgrade(&mut self, leader: Option<u64>) -> (Outcome, Vec<u64>, String) {
        let mut waiting: Vec<u64> = self.previous.iter().copied().collect();
        if waiting.is_empty() {
            return (Outcome::Skipped, vec![], "every node runs this build".into());
        }
        waiting.shuffle(&mut self.random);
        waiting.sort_by_key(|id| Some(*id) == leader);
        let Some(target) = waiting.into_iter().find(|id| self.cluster.is_running(*id)) else {
            return (Outcome::Skipped, vec![], "no node on the older build is running".into());
        };
        let detail = self.upgrade_node(target).await;
        (Outcome::Installed, vec![target], detail)
    }

    /// Stops `target` with SIGTERM, starts it on this workspace's build on the same
    /// data directory with the same flags, and waits until it applied the leader's
    /// commit index; records how that went for the upgrade check.
    async fn upgrade_node(&mut self, target: u64) -> String {
        let at_ns = monotonic_ns();
        let status = self.cluster.try_stop(target, Duration::from_millis(STOP_MS_MAX)).await;
        let exit = status.map(|status| status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0)));
        self.cluster.set_server(target, binary("leasehold-server"));
        self.cluster.restart(target);
        self.previous.remove(&target);
        let caught_up = self.caught_up(target).await;
        self.upgrades.push(Upgrade { node: target, exit, caught_up, at_ns });
        format!(
            "node {target}: the older build {} on SIGTERM; on this build it {}; {} of {} node(s) upgraded",
            match exit {
                Some(code) => format!("exited with code {code}"),
                None => "still ran (killed)".to_string(),
            },
            if caught_up { "caught up with the leader" } else { "did not catch up in time" },
            self.upgrades.len(),
            self.cluster.nodes.len()
        )
    }

    /// Whether `target` applies the leader's commit index within the recovery deadline.
    async fn caught_up(&mut self, target: u64) -> bool {
        let give_up = Instant::now() + Duration::from_millis(RECOVERY_MS_MAX);
        while Instant::now() < give_up {
            if let Some(leader) = self.cluster.leader().await {
                let commit = self.cluster.status(leader).await.map(|status| status.commit_index);
                let applied = self.cluster.status(target).await.map(|status| status.applied_index);
                if let (Some(commit), Some(applied)) = (commit, applied) {
                    if applied >= commit {
                        return true;
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(STATUS_POLL_MS)).await;
        }
        false
    }

    /// Pauses every worker, kills every node, restarts them, reads each lock's
    /// holder and the live sessions (for check (e)), resumes the workers.
    async fn kill_all(&mut self) -> (Outcome, Vec<u64>, String) {
        for index in 0..self.workers.len() {
            self.signal_worker(index, libc::SIGSTOP);
        }
        let killed_ns = monotonic_ns();
        let ids: Vec<u64> = self.cluster.nodes.keys().copied().collect();
        for id in &ids {
            self.cluster.kill(*id);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        for id in &ids {
            self.cluster.restart(*id);
        }
        let leader = self.wait_for_leader(Duration::from_millis(RECOVERY_MS_MAX)).await;
        let mut detail = String::new();
        if leader.is_some() {
            // Within a TTL of the new leader's election no session can expire (a new
            // leader restarts every deadline), so what we read is what survived.
            let observed_at = Instant::now();
            let client = self.cluster.client();
            let mut observation = RestartObservation { killed_ns, ..Default::default() };
            let mut complete = true;
            let keys: Vec<String> = self
                .workloads
                .iter()
                .filter(|workload| workload.uses_locks())
                .flat_map(|workload| workload.keys())
                .collect();
            for key in keys {
                match client.describe_lock(&key, false).await {
                    Ok(response) => {
                        observation
                            .holders
                            .insert(key, response.holder.map(|holder| (holder.session_id, holder.token)));
                    }
                    Err(_) => complete = false,
                }
            }
            match client.list_sessions().await {
                Ok(sessions) => {
                    observation.sessions = sessions.iter().map(|session| session.session_id).collect();
                }
                Err(_) => complete = false,
            }
            let late = observed_at.elapsed() > Duration::from_millis(self.arguments.ttl_ms / 2);
            if complete && !late {
                detail =
                    format!("holders after restart {:?}, {} sessions", observation.holders, observation.sessions.len());
                self.restarts.push(observation);
            } else {
                detail = "could not read the state after the restart in time".into();
            }
        } else {
            detail.push_str("no leader after the restart");
        }
        for index in 0..self.workers.len() {
            self.signal_worker(index, libc::SIGCONT);
        }
        (Outcome::Installed, ids, detail)
    }

    /// SIGSTOPs a worker for 1.5–2 TTLs, preferring one that holds a lock or is in
    /// the middle of an increment (its last record says so).
    async fn pause_worker(&mut self) -> (Outcome, Vec<u64>, String) {
        if self.workers.is_empty() {
            return (Outcome::Skipped, vec![], "no workers".into());
        }
        let (index, holding_lock) = self.choose_holder(false).await;
        let ttl = self.arguments.ttl_ms;
        let hold_ms = self.random.random_range(ttl * 3 / 2..=ttl * 2);
        self.worker_stopped_ns = Some(monotonic_ns());
        self.signal_worker(index, libc::SIGSTOP);
        tokio::time::sleep(Duration::from_millis(hold_ms)).await;
        self.signal_worker(index, libc::SIGCONT);
        (
            Outcome::Installed,
            vec![self.workers[index].process],
            format!(
                "{} worker stopped for {hold_ms} ms{}",
                self.workers[index].workload.name(),
                if holding_lock { " while holding a lock" } else { "" }
            ),
        )
    }

    /// SIGSTOPs a worker that holds a lock for two TTLs and kills the leader (-9)
    /// three quarters of a TTL in: by then the holder's session went quiet and was
    /// checkpointed, so the new leader must not start it afresh. The killed node is
    /// restarted when the worker resumes (a node restarted from its disk starts a
    /// checkpointed lease from its restart; the README's bound says so).
    async fn pause_worker_kill_leader(&mut self) -> (Outcome, Vec<u64>, String) {
        if self.workers.is_empty() {
            return (Outcome::Skipped, vec![], "no workers".into());
        }
        let (index, holding_lock) = self.choose_holder(true).await;
        if !holding_lock {
            return (Outcome::Skipped, vec![], "no worker held a lock".into());
        }
        let ttl = self.arguments.ttl_ms;
        self.worker_stopped_ns = Some(monotonic_ns());
        self.signal_worker(index, libc::SIGSTOP);
        tokio::time::sleep(Duration::from_millis(ttl * 3 / 4)).await;
        let killed = self.cluster.leader().await;
        if let Some(leader) = killed {
            self.cluster.kill(leader);
        }
        tokio::time::sleep(Duration::from_millis(2 * ttl - ttl * 3 / 4)).await;
        if let Some(leader) = killed {
            self.cluster.restart(leader);
        }
        self.signal_worker(index, libc::SIGCONT);
        (
            Outcome::Installed,
            vec![self.workers[index].process],
            format!(
                "{} worker stopped for {} ms while holding a lock; {}",
                self.workers[index].workload.name(),
                2 * ttl,
                match killed {
                    Some(leader) => format!("leader {leader} killed {} ms in, restarted at the end", ttl * 3 / 4),
                    None => "no leader to kill".to_string(),
                }
            ),
        )
    }

    /// A worker to stop: one that holds a lock, a permit or a leadership, or is in the
    /// middle of an increment (its last record says so), if one does within 3 s, else
    /// any; and whether it holds one. With `locks_only`, only workers of the lock
    /// workloads count.
    async fn choose_holder(&mut self, locks_only: bool) -> (usize, bool) {
        let look_until = Instant::now() + Duration::from_secs(3);
        let mut chosen = None;
        let mut order: Vec<usize> = (0..self.workers.len()).collect();
        rand::seq::SliceRandom::shuffle(order.as_mut_slice(), &mut self.random);
        while chosen.is_none() && Instant::now() < look_until {
            for index in &order {
                let worker = &self.workers[*index];
                if (!locks_only || worker.workload.uses_locks()) && holding(&worker.history) {
                    chosen = Some(*index);
                    break;
                }
            }
            if chosen.is_none() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        (chosen.unwrap_or(order[0]), chosen.is_some())
    }

    /// A follower chosen at random, if there is a leader and a follower.
    fn random_follower(&mut self, leader: Option<u64>) -> Result<u64, (Outcome, Vec<u64>, String)> {
        let Some(leader) = leader else {
            return Err((Outcome::Skipped, vec![], "no leader".into()));
        };
        let followers: Vec<u64> = self.cluster.nodes.keys().copied().filter(|id| *id != leader).collect();
        followers.choose(&mut self.random).copied().ok_or_else(|| (Outcome::Skipped, vec![], "no follower".into()))
    }

    /// Replaces a follower as the README says: remove it, empty its data directory,
    /// start it under its id with --new-incarnation, add it back.
    async fn replace_member(&mut self, leader: Option<u64>) -> (Outcome, Vec<u64>, String) {
        let target = match self.random_follower(leader) {
            Ok(target) => target,
            Err(skipped) => return skipped,
        };
        let mut detail = String::new();
        let outcome = self.replace_in_place(target, &mut detail).await;
        (outcome, vec![target], detail)
    }

    /// Wipes a follower's data directory and starts it again with its usual flags (a
    /// replaced disk under a supervisor): it must stop with the stale-incarnation exit
    /// code, recorded for the `refused-nodes` check. Then it is replaced as documented.
    async fn wipe_rejoin(&mut self, leader: Option<u64>) -> (Outcome, Vec<u64>, String) {
        let target = match self.random_follower(leader) {
            Ok(target) => target,
            Err(skipped) => return skipped,
        };
        self.cluster.wipe(target);
        self.cluster.restart(target);
        let mut detail = self.expect_refusal(Fault::WipeRejoin, target, EXIT_STALE_INCARNATION).await;
        let outcome = self.replace_in_place(target, &mut detail).await;
        (outcome, vec![target], detail)
    }

    /// Flips bytes in the middle of a stopped follower's write-ahead log and starts it
    /// again: it must refuse to start with the data-directory exit code. Then it is
    /// replaced as documented.
    async fn corrupt_replace(&mut self, leader: Option<u64>) -> (Outcome, Vec<u64>, String) {
        let target = match self.random_follower(leader) {
            Ok(target) => target,
            Err(skipped) => return skipped,
        };
        self.cluster.kill(target);
        let corrupted = corrupt_write_ahead_log(self.cluster.data_dir(target), &mut self.random);
        self.cluster.restart(target);
        let file = match corrupted {
            Ok(file) => file,
            Err(reason) => return (Outcome::Skipped, vec![target], format!("restarted as it was: {reason}")),
        };
        let mut detail = format!("corrupted {file}; ");
        detail.push_str(&self.expect_refusal(Fault::CorruptReplace, target, EXIT_DATA_DIRECTORY_REFUSED).await);
        let outcome = self.replace_in_place(target, &mut detail).await;
        (outcome, vec![target], detail)
    }

    /// Moves a follower to a small disk (removed, started on a 2 MiB tmpfs as a new
    /// incarnation, added back) and waits for the workload to fill it: the node must
    /// stop with the fatal-error exit code. A node whose disk did not fill in time is
    /// killed and not counted. Then it is replaced on its usual disk.
    async fn disk_full(&mut self, leader: Option<u64>) -> (Outcome, Vec<u64>, String) {
        let target = match self.random_follower(leader) {
            Ok(target) => target,
            Err(skipped) => return skipped,
        };
        let client = self.cluster.admin_client();
        if let Err(error) = client.remove_member(target).await {
            let outcome = if error.is_definite() { Outcome::Skipped } else { Outcome::Indeterminate };
            return (outcome, vec![target], format!("remove: {error}"));
        }
        let give_up = Instant::now() + Duration::from_millis(REMOVED_EXIT_MS_MAX);
        while self.cluster.is_running(target) && Instant::now() < give_up {
            tokio::time::sleep(Duration::from_millis(STATUS_POLL_MS)).await;
        }
        self.cluster.wipe(target);
        self.cluster.restart_on_small_disk(target, SMALL_DISK_BYTES, &["--new-incarnation"]);
        let (client_addr, peer_addr) = {
            let node = &self.cluster.nodes[&target];
            (node.client_addr.clone(), node.peer_addr.clone())
        };
        let added =
            tokio::time::timeout(Duration::from_secs(30), client.add_member(target, &client_addr, &peer_addr, false))
                .await;
        let mut detail = match added {
            Ok(Ok(_)) => format!("node {target} on a {SMALL_DISK_BYTES}-byte disk; "),
            Ok(Err(error)) => format!("node {target} on a small disk, not promoted ({error}); "),
            Err(_) => format!("node {target} on a small disk, add timed out; "),
        };
        let at_ns = monotonic_ns();
        match self.cluster.try_exit_status(target, Duration::from_millis(DISK_FILL_MS_MAX)).await {
            Some(status) => {
                let code = status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
                detail.push_str(&format!("it exited with code {code}; "));
                let refusal = Refusal {
                    fault: Fault::DiskFull.name(),
                    node: target,
                    expected_exit: EXIT_RAFT_FATAL,
                    exit: Some(code),
                    at_ns,
                };
                self.refusals.push(refusal);
            }
            None => {
                detail.push_str("its disk did not fill in time (killed, not counted); ");
                self.cluster.kill(target);
            }
        }
        let outcome = self.replace_in_place(target, &mut detail).await;
        (outcome, vec![target], detail)
    }

    /// Waits for `target` to exit and records how, for the `refused-nodes` check; a
    /// node still running at the deadline was accepted, and is killed.
    async fn expect_refusal(&mut self, fault: Fault, target: u64, expected_exit: i32) -> String {
        let at_ns = monotonic_ns();
        let status = self.cluster.try_exit_status(target, Duration::from_millis(REFUSED_EXIT_MS_MAX)).await;
        let exit = status.map(|status| status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0)));
        if exit.is_none() {
            self.cluster.kill(target);
        }
        self.refusals.push(Refusal { fault: fault.name(), node: target, expected_exit, exit, at_ns });
        match exit {
            Some(code) => format!("node {target} exited with code {code}; "),
            None => format!("node {target} kept running (killed); "),
        }
    }

    /// Removes `target`, empties its data directory, starts it under its id with
    /// --new-incarnation and adds it back (README, "Replacing a node"). The removal is
    /// retried while the cluster elects a leader.
    async fn replace_in_place(&mut self, target: u64, detail: &mut String) -> Outcome {
        let client = self.cluster.admin_client();
        let give_up = Instant::now() + Duration::from_millis(RECOVERY_MS_MAX);
        loop {
            match client.remove_member(target).await {
                Ok(_) => break,
                Err(error) if Instant::now() >= give_up => {
                    detail.push_str(&format!("remove: {error}"));
                    return if error.is_definite() { Outcome::Skipped } else { Outcome::Indeterminate };
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(STATUS_POLL_MS * 5)).await,
            }
        }
        let give_up = Instant::now() + Duration::from_millis(REMOVED_EXIT_MS_MAX);
        while self.cluster.is_running(target) {
            if Instant::now() >= give_up {
                detail.push_str("the removed node did not exit; killed; ");
                break;
            }
            tokio::time::sleep(Duration::from_millis(STATUS_POLL_MS)).await;
        }
        self.cluster.wipe(target);
        self.cluster.restart_with(target, &["--new-incarnation"]);
        let (client_addr, peer_addr) = {
            let node = &self.cluster.nodes[&target];
            (node.client_addr.clone(), node.peer_addr.clone())
        };
        let added =
            tokio::time::timeout(Duration::from_secs(90), client.add_member(target, &client_addr, &peer_addr, false))
                .await;
        match added {
            Ok(Ok(members)) => {
                detail.push_str(&format!(
                    "node {target} removed and added back as a new incarnation; members {:?}",
                    members.iter().map(|member| member.node_id).collect::<Vec<_>>()
                ));
                Outcome::Installed
            }
            Ok(Err(error)) => {
                detail.push_str(&format!("node {target} removed; adding it back: {error}"));
                Outcome::Indeterminate
            }
            Err(_) => {
                detail.push_str(&format!("node {target} removed; adding it back timed out"));
                Outcome::Indeterminate
            }
        }
    }

    /// Reads every running node's own state of each semaphore and election name
    /// (stale reads answered by that node alone, so a lagging or deposed node shows
    /// what it applied). A node that does not answer in time is left out.
    async fn sample_replicas(&mut self) {
        use leasehold_proto as pb;
        let semaphores =
            if self.workloads.contains(&Workload::Semaphore) { Workload::Semaphore.keys() } else { Vec::new() };
        let elections =
            if self.workloads.contains(&Workload::Election) { Workload::Election.keys() } else { Vec::new() };
        if semaphores.is_empty() && elections.is_empty() {
            return;
        }
        let ids: Vec<u64> = self.cluster.nodes.keys().copied().collect();
        for id in ids {
            if !self.cluster.is_running(id) {
                continue;
            }
            let deadline = Duration::from_millis(REPLICA_READ_MS_MAX);
            let Ok(channel) = self.cluster.client_of(id).raw_channel(&self.cluster.nodes[&id].client_addr) else {
                continue;
            };
            for name in &semaphores {
                let request = pb::DescribeSemaphoreRequest { name: name.clone(), stale: true, ..Default::default() };
                let mut client = pb::semaphores_client::SemaphoresClient::new(channel.clone());
                let at_ns = monotonic_ns();
                if let Ok(Ok(response)) = tokio::time::timeout(deadline, client.describe(request)).await {
                    let response = response.into_inner();
                    self.replica_states.push(ReplicaState {
                        node: id,
                        at_ns,
                        name: name.clone(),
                        limit: Some(response.limit),
                        holders: response.holders.iter().map(|holder| (holder.session_id, holder.token)).collect(),
                        leader: None,
                    });
                }
            }
            for name in &elections {
                let request = pb::LeaderRequest { name: name.clone(), stale: true, ..Default::default() };
                let mut client = pb::elections_client::ElectionsClient::new(channel.clone());
                let at_ns = monotonic_ns();
                if let Ok(Ok(response)) = tokio::time::timeout(deadline, client.leader(request)).await {
                    let leader = response.into_inner().leader.map(|leader| (leader.session_id, leader.token));
                    self.replica_states.push(ReplicaState {
                        node: id,
                        at_ns,
                        name: name.clone(),
                        limit: None,
                        holders: Vec::new(),
                        leader,
                    });
                }
            }
        }
    }

    /// Heals everything: partitions, pauses, clocks, dead nodes; waits until every
    /// node applied the leader's commit index.
    async fn final_heal(&mut self) {
        // Before anything down is restarted: a node that ended on its own is noted.
        self.watch_nodes(&[]).await;
        nemesis::heal_partition();
        let ids: Vec<u64> = self.cluster.nodes.keys().copied().collect();
        for id in &ids {
            if self.cluster.is_running(*id) {
                self.cluster.resume(*id);
            } else {
                self.cluster.restart(*id);
            }
        }
        for index in 0..self.workers.len() {
            self.signal_worker(index, libc::SIGCONT);
        }
        for id in std::mem::take(&mut self.skewed) {
            if let Some(node) = self.cluster.nodes.get(&id) {
                let endpoint = node.client_addr.clone();
                let _ = tokio::time::timeout(
                    Duration::from_secs(5),
                    self.cluster.admin_client_of(id).skew_clock(&endpoint, 1_000, 0),
                )
                .await;
            }
        }
        // The rest of a rolling upgrade, one node at a time: the liveness phase runs
        // on this build alone.
        while !self.previous.is_empty() {
            let leader = self.wait_for_leader(Duration::from_millis(RECOVERY_MS_MAX)).await;
            let start_ns = monotonic_ns();
            let (outcome, targets, detail) = self.rolling_upgrade(leader).await;
            self.log(&format!("final heal: {} {outcome:?} {targets:?} {detail}", Fault::RollingUpgrade.name()));
            let end_ns = monotonic_ns();
            let fault = Fault::RollingUpgrade.name();
            self.faults.push(FaultRecord { fault, outcome, targets, detail, start_ns, end_ns });
            if outcome == Outcome::Skipped {
                break;
            }
        }
        let Some(leader) = self.wait_for_leader(Duration::from_millis(RECOVERY_MS_MAX)).await else {
            self.log("no leader after the final heal");
            return;
        };
        let commit = self.cluster.status(leader).await.map(|status| status.commit_index).unwrap_or(0);
        let give_up = Instant::now() + Duration::from_millis(RECOVERY_MS_MAX);
        for id in ids {
            while Instant::now() < give_up {
                if self.cluster.status(id).await.is_some_and(|status| status.applied_index >= commit) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(STATUS_POLL_MS)).await;
            }
        }
    }

    async fn check_and_report(&mut self, final_ns: u64) -> anyhow::Result<i32> {
        let out = self.arguments.out.clone();
        let mut records: Vec<Record> = Vec::new();
        for worker in &self.workers {
            records.extend(history::read_records(&worker.history).unwrap_or_default());
        }
        records.sort_by_key(|record| (record.time_ns, record.process, record.sequence));
        {
            let mut file = std::io::BufWriter::new(std::fs::File::create(out.join("history.jsonl"))?);
            for record in &records {
                serde_json::to_writer(&mut file, record)?;
                file.write_all(b"\n")?;
            }
        }
        {
            let mut file = std::io::BufWriter::new(std::fs::File::create(out.join("store.jsonl"))?);
            for write in self.store.writes() {
                serde_json::to_writer(
                    &mut file,
                    &serde_json::json!({
                        "resource": write.resource,
                        "token": write.token,
                        "accepted": write.accepted,
                        "value": write.value,
                    }),
                )?;
                file.write_all(b"\n")?;
            }
        }
        {
            let mut file = std::io::BufWriter::new(std::fs::File::create(out.join("faults.jsonl"))?);
            for fault in &self.faults {
                serde_json::to_writer(&mut file, fault)?;
                file.write_all(b"\n")?;
            }
        }
        let operations = history::operations(&records);
        let counter_keys: Vec<String> =
            if self.workloads.contains(&Workload::FencedCounter) { Workload::FencedCounter.keys() } else { Vec::new() };
        // A real store's counters are read back from it (and must be what the record
        // of its answers says); the in-memory store's are the record's.
        let expected_values = self.store.expected_values(&counter_keys);
        let read_back = self.store.read_back(&counter_keys).await;
        let final_values: BTreeMap<String, String> = match &read_back {
            Some(Ok(values)) => values.clone(),
            _ => counter_keys
                .iter()
                .map(|key| (key.clone(), self.store.read(key).map(|(_, value)| value).unwrap_or_default()))
                .collect(),
        };
        // The intruder takes no grant after the final heal: the liveness check is the
        // workloads' business.
        let processes: Vec<u64> = self
            .workers
            .iter()
            .filter(|worker| !matches!(worker.workload, Workload::Attack | Workload::Flood))
            .map(|worker| worker.process)
            .collect();
        let budget = Duration::from_secs(self.arguments.linearizability_budget_s);
        let mut checks: Vec<CheckResult> = vec![
            checker::tokens(&operations),
            checker::fenced_store(&operations, &self.store.writes(), &final_values),
            checker::store_read_back(self.store.kind().name(), &expected_values, read_back.as_ref()),
            checker::durability(&operations, &self.restarts),
            checker::linearizability(&operations, budget),
            checker::semaphore_holders(&operations, SEMAPHORE_LIMIT as usize),
            checker::elections(&operations),
            checker::replica_states(&operations, &self.replica_states, SEMAPHORE_LIMIT),
            checker::refusals(&self.refusals),
            checker::node_exits(&self.node_exits),
            checker::liveness(
                &operations,
                &processes,
                final_ns,
                Duration::from_millis(self.arguments.liveness_bound_ms),
            ),
        ];
        if self.workloads.contains(&Workload::Attack) {
            let older_release = self.arguments.previous_server.is_some();
            let expected: Vec<Attack> =
                Attack::ALL.into_iter().filter(|attack| !(older_release && attack.needs_this_release())).collect();
            checks.push(checker::attacks(&operations, &expected));
            let counts = checker::attack_counts(&operations);
            std::fs::write(out.join("attacks.json"), serde_json::to_string_pretty(&counts)?)?;
            if !older_release {
                checks.push(checker::latency_beside_intruder(
                    &operations,
                    &self.faults,
                    Duration::from_millis(checker::FLOOD_SETTLE_MS),
                    Duration::from_millis(checker::FLOOD_RELEASE_P99_MS_MAX),
                ));
            }
        }
        if self.workloads.contains(&Workload::Flood) {
            let flood = self
                .workers
                .iter()
                .find(|worker| worker.workload == Workload::Flood)
                .and_then(|worker| crate::flood::read_counts(&worker.history));
            checks.push(checker::latency_beside_flood(
                &operations,
                &self.faults,
                flood,
                Duration::from_millis(checker::FLOOD_SETTLE_MS),
                Duration::from_millis(checker::FLOOD_RELEASE_P99_MS_MAX),
            ));
        }
        let ttl = Duration::from_millis(self.arguments.ttl_ms);
        checks.push(checker::believed_at_once(&operations, ttl, &checker::clock_fault_windows(&self.faults, ttl)));
        checks.push(checker::dead_holders(&operations, &self.faults, &lease_bound(ttl)));
        checks.push(checker::lock_delays(&operations, &self.faults, ttl));
        if self.arguments.previous_server.is_some() {
            let nodes: Vec<u64> = self.cluster.nodes.keys().copied().collect();
            checks.push(checker::upgrades(&self.upgrades, &nodes));
        }
        let valid = if checks.iter().any(|check| check.verdict == Verdict::Fail) {
            "false"
        } else if checks.iter().any(|check| check.verdict == Verdict::Unknown) {
            "unknown"
        } else {
            "true"
        };
        let summary = self.summary(&operations, &checks, valid);
        std::fs::write(out.join("summary.txt"), &summary)?;
        println!("{summary}");
        if valid == "true" && !self.arguments.keep {
            // Valid: the node data directories are not needed; the history, the
            // faults and the summary stay.
            self.cluster.nodes.keys().copied().collect::<Vec<_>>().iter().for_each(|id| {
                self.cluster.kill(*id);
            });
            let _ = std::fs::remove_dir_all(out.join("nodes"));
        } else {
            println!(
                "seed {}: node logs, data, worker logs and the history are kept under {}",
                self.seed,
                out.display()
            );
        }
        Ok(match valid {
            "true" => 0,
            "false" => 1,
            _ => 2,
        })
    }

    fn summary(&self, operations: &[history::Operation], checks: &[CheckResult], valid: &str) -> String {
        let mut text = String::new();
        let line = |text: &mut String, value: String| {
            text.push_str(&value);
            text.push('\n');
        };
        line(&mut text, "==== leasehold-jepsen summary ====".into());
        line(
            &mut text,
            format!(
                "seed: {}   nodes: {}   time: {:?}   workloads: {}   nemesis: {}   fencing: {}   lock-delay: {} ms{}",
                self.seed,
                self.arguments.nodes,
                self.arguments.time,
                self.workloads.iter().map(|workload| workload.name()).collect::<Vec<_>>().join(","),
                self.arguments.nemesis,
                !self.arguments.no_fencing,
                self.arguments.lock_delay_ms,
                if self.arguments.unrequested_lock_delay { " (recorded, not asked for)" } else { "" }
            ),
        );
        line(&mut text, format!("fenced store: {}", self.store.describe()));
        if let Some(server) = &self.arguments.previous_server {
            line(
                &mut text,
                format!("nodes started on the previous release {}, then upgraded to this build", server.display()),
            );
        }
        let mut by_outcome: BTreeMap<(String, Kind), usize> = BTreeMap::new();
        for operation in operations {
            // The history's name of the function (kebab-case, as in the JSONL).
            let function = serde_json::to_value(operation.function)
                .ok()
                .and_then(|value| value.as_str().map(str::to_string))
                .unwrap_or_default();
            *by_outcome.entry((function, operation.outcome)).or_default() += 1;
        }
        line(&mut text, format!("operations: {}", operations.len()));
        let mut functions: BTreeMap<String, (usize, usize, usize)> = BTreeMap::new();
        for ((function, outcome), count) in by_outcome {
            let entry = functions.entry(function).or_default();
            match outcome {
                Kind::Ok => entry.0 += count,
                Kind::Fail => entry.1 += count,
                _ => entry.2 += count,
            }
        }
        for (function, (ok, fail, info)) in functions {
            line(&mut text, format!("  {function:<11} ok {ok:>6}   fail {fail:>6}   info {info:>6}"));
        }
        let mut by_fault: BTreeMap<&str, (usize, usize, usize)> = BTreeMap::new();
        for fault in &self.faults {
            let entry = by_fault.entry(fault.fault).or_default();
            match fault.outcome {
                Outcome::Installed => entry.0 += 1,
                Outcome::Skipped => entry.1 += 1,
                Outcome::Indeterminate => entry.2 += 1,
            }
        }
        line(&mut text, format!("faults: {}", self.faults.len()));
        for (fault, (installed, skipped, indeterminate)) in by_fault {
            line(
                &mut text,
                format!(
                    "  {fault:<18} installed {installed:>3}   skipped {skipped:>3}   indeterminate {indeterminate:>3}"
                ),
            );
        }
        if self.workloads.contains(&Workload::Attack) {
            let counts = checker::attack_counts(operations);
            line(&mut text, "attacks (intruder tenant; refused = fail, unknown = info):".into());
            for (name, count) in &counts {
                let reasons: Vec<String> =
                    count.reasons.iter().map(|(reason, times)| format!("{reason} {times}")).collect();
                line(
                    &mut text,
                    format!(
                        "  {name:<26} tries {:>4}   refused {:>4}   unknown {:>3}   succeeded {:>2}   [{}]",
                        count.tries,
                        count.refused,
                        count.unknown,
                        count.succeeded,
                        reasons.join(", ")
                    ),
                );
            }
        }
        let main: Vec<&history::Operation> =
            operations.iter().filter(|operation| operation.phase == history::Phase::Main).collect();
        let begin = main.iter().map(|operation| operation.invoke_ns).min().unwrap_or(0);
        let end = main.iter().filter_map(|operation| operation.complete_ns).max().unwrap_or(begin);
        for figure in crate::grey::figures(&self.grey, &self.faults, operations, begin, end) {
            line(&mut text, figure);
        }
        line(&mut text, "checks:".into());
        for check in checks {
            line(&mut text, format!("  {:<38} {:<8} {}", check.name, check.verdict.name(), check.detail));
        }
        let anomalies: Vec<_> =
            checks.iter().flat_map(|check| check.anomalies.iter().map(move |anomaly| (check.name, anomaly))).collect();
        if !anomalies.is_empty() {
            line(&mut text, format!("anomalies: {}", anomalies.len()));
            for (check, anomaly) in anomalies.iter().take(50) {
                line(&mut text, format!("  [{check}] {}", anomaly.what));
                for operation in &anomaly.operations {
                    line(&mut text, format!("      {operation}"));
                }
            }
            if anomalies.len() > 50 {
                line(&mut text, format!("  … and {} more", anomalies.len() - 50));
            }
        }
        line(&mut text, format!("valid: {valid}"));
        if valid != "true" {
            line(&mut text, format!("seed: {} (rerun with --seed {})", self.seed, self.seed));
        }
        text
    }

    /// Stops every process this harness started (they would die with the pid
    /// namespace anyway) and removes the partition table.
    fn cleanup(&mut self) {
        nemesis::heal_partition();
        for worker in &mut self.workers {
            // SAFETY: resuming a worker we may have paused, so that it can die.
            unsafe {
                libc::kill(worker.child.id() as i32, libc::SIGCONT);
            }
            let _ = worker.child.kill();
            let _ = worker.child.wait();
        }
        let ids: Vec<u64> = self.cluster.nodes.keys().copied().collect();
        for id in ids {
            if self.cluster.is_running(id) {
                self.cluster.resume(id);
            }
            self.cluster.kill(id);
        }
    }
}

/// When each of `nodes` upgrades is due: spread evenly over the run, the first
/// after a fifth of it, so that the cluster runs mixed builds for most of it.
fn upgrade_schedule(begin: Instant, time: Duration, nodes: usize) -> Vec<Instant> {
    (0..nodes).map(|index| begin + time.mul_f64((index as f64 + 1.0) / (nodes as f64 + 1.5)).max(time / 5)).collect()
}

/// Whether a worker's last record says it holds a lock, a permit or a leadership, or
/// is inside an increment.
fn holding(history: &Path) -> bool {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut file) = std::fs::File::open(history) else {
        return false;
    };
    let length = file.metadata().map(|metadata| metadata.len()).unwrap_or(0);
    let _ = file.seek(SeekFrom::Start(length.saturating_sub(TAIL_BYTES)));
    let mut text = String::new();
    if file.read_to_string(&mut text).is_err() {
        return false;
    }
    let Some(last) = text.lines().last() else {
        return false;
    };
    let Ok(record) = serde_json::from_str::<Record>(last) else {
        return false;
    };
    matches!(
        (record.function, record.kind),
        (history::Function::Acquire, Kind::Ok)
            | (history::Function::Increment, Kind::Invoke)
            | (history::Function::SemAcquire, Kind::Ok)
            | (history::Function::Campaign, Kind::Ok)
    )
}

/// Flips eight bytes at a random place in the middle half of the largest write-ahead
/// log file of the database in `data_dir`; returns the file's name.
fn corrupt_write_ahead_log(data_dir: &std::path::Path, random: &mut StdRng) -> Result<String, String> {
    let database = data_dir.join("db");
    let entries = std::fs::read_dir(&database).map_err(|error| format!("{}: {error}", database.display()))?;
    let wal = entries
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .filter(|path| path.extension().is_some_and(|extension| extension == "log"))
        .max_by_key(|path| std::fs::metadata(path).map(|metadata| metadata.len()).unwrap_or(0))
        .ok_or("no write-ahead log file")?;
    let mut bytes = std::fs::read(&wal).map_err(|error| format!("{}: {error}", wal.display()))?;
    if bytes.len() < 1_024 {
        return Err(format!("{} holds only {} bytes", wal.display(), bytes.len()));
    }
    let at = random.random_range(bytes.len() / 4..bytes.len() * 3 / 4 - 8);
    for byte in &mut bytes[at..at + 8] {
        *byte ^= 0x5a;
    }
    std::fs::write(&wal, &bytes).map_err(|error| format!("{}: {error}", wal.display()))?;
    Ok(format!("{} at byte {at}", wal.file_name().unwrap_or_default().to_string_lossy()))
}
