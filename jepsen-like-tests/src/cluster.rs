//! Real `leasehold-server` processes on loopback, for tests and the fault suite.
//!
//! Every node is its own process in its own process group, killed with SIGKILL,
//! paused with SIGSTOP and restarted on the same data directory by process id.
//! When a test panics, the last lines of every node's log are printed.

use std::collections::BTreeMap;
use std::fs::File;
use std::net::TcpListener;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use leasehold::proto::StatusResponse;
use leasehold::{certs, Client, Settings};

use crate::wait;

/// Lines of each node's log printed when a test fails.
pub const LOG_TAIL_LINES: usize = 40;

/// How long a node started with a cluster may take to listen on its addresses.
const START_WAIT_MS: u64 = 30_000;

/// Where the workspace's binaries are: next to the running test or tool (tests run
/// from `target/<profile>/deps/`), or `LEASEHOLD_BIN_DIR`.
pub fn binary(name: &str) -> PathBuf {
    if let Ok(directory) = std::env::var("LEASEHOLD_BIN_DIR") {
        return Path::new(&directory).join(name);
    }
    let executable = std::env::current_exe().expect("current executable");
    let mut directory = executable.parent().expect("executable directory").to_path_buf();
    if directory.ends_with("deps") {
        directory.pop();
    }
    directory.join(name)
}

/// The commit of the previous release (`scripts/previous-release`, its one line that
/// is not a comment).
pub fn previous_release() -> &'static str {
    include_str!("../../scripts/previous-release")
        .lines()
        .map(str::trim)
        .find(|line| !line.is_empty() && !line.starts_with('#'))
        .expect("scripts/previous-release names a commit")
}

/// The previous release's `leasehold-server`, for the rolling-upgrade tests:
/// `LEASEHOLD_PREVIOUS_SERVER`, or where `scripts/previous-release.sh` builds it
/// (`previous-release/COMMIT/` in the target directory). An error that says how to
/// build it when it is missing.
pub fn previous_server() -> Result<PathBuf, String> {
    let path = match std::env::var_os("LEASEHOLD_PREVIOUS_SERVER") {
        Some(path) => PathBuf::from(path),
        None => {
            let release = binary("leasehold-server");
            let target = release.parent().and_then(Path::parent).expect("binaries live in TARGET/PROFILE/");
            target.join("previous-release").join(previous_release()).join("leasehold-server")
        }
    };
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!(
            "the previous release's leasehold-server ({}) is not built: run scripts/previous-release.sh \
             (scripts/test.sh does) or set LEASEHOLD_PREVIOUS_SERVER",
            path.display()
        ))
    }
}

/// Where test servers' ports are picked from when the kernel's ephemeral range cannot
/// be read: just below Linux's default (32768–60999).
const TEST_PORTS_FALLBACK: std::ops::Range<u16> = 20_000..32_768;

/// The ports test servers listen on: below the kernel's ephemeral range, so that no
/// outgoing connection (of another test's client, or of a node to its peers) can be
/// given one between the moment it is picked and the moment the server binds it.
fn test_port_range() -> std::ops::Range<u16> {
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|text| text.split_whitespace().next()?.parse::<u16>().ok());
    match ephemeral_low {
        Some(low) if low >= 12_000 => (low - 12_000).max(10_000)..low,
        _ => TEST_PORTS_FALLBACK,
    }
}

/// Ports this process reserved (see `reserve_port`); their lock files stay open, and
/// so locked, until the process exits.
static RESERVED_PORTS: Mutex<Vec<File>> = Mutex::new(Vec::new());

/// Reserves `port` against every process that picks ports with `free_ports`: an
/// exclusive `flock` on a file named after the port, held until this process exits
/// (under nextest a test is one process). Without it two tests starting clusters at
/// the same moment could pick the same port between its bind check and the server's
/// bind. The kernel drops the locks of a process that dies.
fn reserve_port(port: u16) -> bool {
    let directory = std::env::temp_dir().join("leasehold-test-ports");
    std::fs::create_dir_all(&directory).expect("create the port reservation directory");
    let file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(directory.join(port.to_string()))
        .expect("open a port reservation file");
    // SAFETY: flock on a descriptor this function owns.
    let locked = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0;
    if locked {
        RESERVED_PORTS.lock().expect("port reservations").push(file);
    }
    locked
}

/// Picks `N` distinct free loopback ports for servers to bind: at random below the
/// kernel's ephemeral range (see `test_port_range`), reserved against other test
/// processes (see `reserve_port`), and bound once to check that nothing else listens.
pub fn free_ports<const N: usize>() -> [u16; N] {
    let range = test_port_range();
    let mut ports = Vec::with_capacity(N);
    for _ in 0..10_000 {
        if ports.len() == N {
            break;
        }
        let port = rand::random_range(range.clone());
        if reserve_port(port) && TcpListener::bind(("127.0.0.1", port)).is_ok() {
            ports.push(port);
        }
    }
    assert_eq!(ports.len(), N, "no {N} free ports in {range:?} on 127.0.0.1");
    std::array::from_fn(|index| ports[index])
}

/// Where nodes listen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Addressing {
    /// 127.0.0.1 with ephemeral ports: for tests in the host network namespace.
    Ephemeral,
    /// Node `id` on its own address 127.0.0.(`FIRST_NODE_OCTET` + id - 1) with fixed
    /// ports: for the fault suite's private network namespace, where nftables rules
    /// between node addresses partition them (nodes bind their outgoing peer
    /// connections to their own address).
    PerNodeIp { client_port: u16, peer_port: u16 },
}

/// Node 1's last address octet with `Addressing::PerNodeIp`: 127.0.0.11.
pub const FIRST_NODE_OCTET: u64 = 11;

#[derive(Debug, Clone)]
pub struct ClusterOptions {
    pub nodes: u64,
    pub addressing: Addressing,
    /// Where data directories and logs go; a temporary directory (removed on drop)
    /// when None.
    pub directory: Option<PathBuf>,
    pub snapshot_every_entries: Option<u64>,
    pub heartbeat_ms: Option<u64>,
    pub election_timeout_min_ms: Option<u64>,
    pub election_timeout_max_ms: Option<u64>,
    /// Worker threads per node; None gives each node a share of this machine's
    /// cores, as `cluster.sh` does (see `worker_threads_per_node`).
    pub worker_threads: Option<usize>,
    pub extra_arguments: Vec<String>,
    /// The `leasehold-server` the nodes start on; this workspace's when None. An
    /// older release's, for a rolling upgrade (`TestCluster::set_server`).
    pub server: Option<PathBuf>,
    /// Every node's peer port behind a delaying proxy (the slow-link nemesis): nodes
    /// listen beside their peer address (`slow_link::LISTEN_PORT_OFFSET`), or on a
    /// port of their own with ephemeral ports.
    pub peer_proxy: Option<std::sync::Arc<crate::slow_link::Links>>,
}

impl ClusterOptions {
    /// The worker threads each node is started with: `worker_threads`, or this
    /// machine's cores divided among the nodes, at least one each.
    pub fn worker_threads_per_node(&self) -> usize {
        self.worker_threads.unwrap_or_else(|| {
            let cores = std::thread::available_parallelism().map(|cores| cores.get()).unwrap_or(1);
            (cores / self.nodes.max(1) as usize).max(1)
        })
    }
}

impl Default for ClusterOptions {
    fn default() -> Self {
        Self {
            nodes: 3,
            addressing: Addressing::Ephemeral,
            directory: None,
            snapshot_every_entries: None,
            heartbeat_ms: None,
            election_timeout_min_ms: None,
            election_timeout_max_ms: None,
            worker_threads: None,
            extra_arguments: Vec::new(),
            server: None,
            peer_proxy: None,
        }
    }
}

/// Whether `server` takes `flag` (its `--help` names it): an older release's build
/// lacks the newer flags. Each binary is asked once.
pub fn server_accepts(server: &Path, flag: &str) -> bool {
    static HELP: std::sync::Mutex<BTreeMap<PathBuf, String>> = std::sync::Mutex::new(BTreeMap::new());
    let mut help = HELP.lock().unwrap();
    let text = help.entry(server.to_path_buf()).or_insert_with(|| {
        let output = Command::new(server).arg("--help").output();
        output.map(|output| String::from_utf8_lossy(&output.stdout).into_owned()).unwrap_or_default()
    });
    text.split(|c: char| c.is_whitespace() || c == ',').any(|word| word == flag)
}

pub struct NodeProcess {
    pub id: u64,
    pub client_addr: String,
    pub peer_addr: String,
    pub data_dir: PathBuf,
    pub log: PathBuf,
    /// False for a node started to join an existing cluster.
    pub initial: bool,
    /// Where the node serves Prometheus metrics.
    pub metrics_addr: Option<String>,
    /// Where the node serves its status page (with per-node addresses only: the
    /// fault suite's intruder tries it).
    pub status_addr: Option<String>,
    /// The `leasehold-server` it starts on.
    pub server: PathBuf,
    child: Option<Child>,
    /// How its last process ended on its own, once seen.
    exited: Option<ExitStatus>,
}

/// The files a test cluster's nodes and clients authenticate with, under the
/// cluster's directory: a CA, a certificate per node, the admin token and the test
/// tenant's token.
#[derive(Debug, Clone)]
pub struct Credentials {
    pub directory: PathBuf,
    pub ca_file: PathBuf,
    pub admin_token_file: PathBuf,
    /// The token of the tenant tests act as (`TEST_TENANT`).
    pub token_file: PathBuf,
    /// The metrics port's scrape token (`--metrics-token-file`).
    pub scrape_token_file: PathBuf,
}

/// The tenant test clients act as, created when the cluster first has a leader.
pub const TEST_TENANT: &str = "test";

impl Credentials {
    /// A new CA and tokens in `directory`.
    fn create(directory: PathBuf) -> Credentials {
        std::fs::create_dir_all(&directory).expect("create the certificate directory");
        let ca = certs::new_ca().expect("a CA");
        let (ca_file, _) = certs::write_pair(&directory, "ca", &ca).expect("write the CA");
        let admin_token_file = directory.join("admin.token");
        certs::write_file(&admin_token_file, &certs::new_token("admin"), true).expect("write the admin token");
        // Written when the tenant is made (`TestCluster::wait_for_leader`).
        let token_file = directory.join(format!("{TEST_TENANT}.token"));
        let scrape_token_file = directory.join("scrape.token");
        certs::write_file(&scrape_token_file, &certs::new_token("scrape"), true).expect("write the scrape token");
        Credentials { directory, ca_file, admin_token_file, token_file, scrape_token_file }
    }

    /// Node `id`'s certificate and key, made on first use, for the addresses `hosts`.
    fn node_files(&self, id: u64, hosts: &[String]) -> (PathBuf, PathBuf) {
        let (cert, key) =
            (self.directory.join(format!("node-{id}.pem")), self.directory.join(format!("node-{id}.key")));
        if !cert.exists() {
            let ca_key = std::fs::read_to_string(self.directory.join("ca.key")).expect("read the CA key");
            let pem = certs::node_certificate(&ca_key, id, hosts).expect("a node certificate");
            certs::write_pair(&self.directory, &format!("node-{id}"), &pem).expect("write a node certificate");
        }
        (cert, key)
    }

    /// Node `id`'s certificate and key as PEM text, made by the cluster CA on first use:
    /// a member's, or one for an id that never was a member (no host names).
    pub fn node_identity(&self, id: u64) -> (String, String) {
        let (cert, key) = self.node_files(id, &[]);
        let read = |path: &PathBuf| std::fs::read_to_string(path).expect("read a node certificate file");
        (read(&cert), read(&key))
    }

    /// What a client process needs, as LEASEHOLD_* variables (see `leasehold::settings`).
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("LEASEHOLD_CA_FILE", self.ca_file.display().to_string()),
            ("LEASEHOLD_TOKEN_FILE", self.token_file.display().to_string()),
            ("LEASEHOLD_ADMIN_TOKEN_FILE", self.admin_token_file.display().to_string()),
        ]
    }

    /// Client settings for `endpoints`, as the test tenant or as the admin.
    pub fn settings(&self, endpoints: Vec<String>, admin: bool) -> Settings {
        Settings {
            endpoints,
            ca_file: Some(self.ca_file.clone()),
            token_file: Some(if admin { self.admin_token_file.clone() } else { self.token_file.clone() }),
            ..Settings::default()
        }
    }
}

pub struct TestCluster {
    pub options: ClusterOptions,
    pub credentials: Credentials,
    pub nodes: BTreeMap<u64, NodeProcess>,
    pub cluster_name: String,
    /// Nodes removed from the cluster (their logs stay readable).
    pub retired: Vec<NodeProcess>,
    /// Holds the temporary directory when `options.directory` is None.
    _temporary: Option<tempfile::TempDir>,
    root: PathBuf,
}

impl TestCluster {
    /// Starts `options.nodes` nodes as the initial members. Call `wait_for_leader`.
    pub fn start(options: ClusterOptions) -> TestCluster {
        let every_member: Vec<u64> = (1..=options.nodes).collect();
        Self::start_only(options, &every_member)
    }

    /// Defines `options.nodes` initial members (every one named in the others' flags)
    /// and starts only those in `started`; `restart` starts another one later.
    pub fn start_only(options: ClusterOptions, started: &[u64]) -> TestCluster {
        let (temporary, root) = match &options.directory {
            Some(directory) => {
                std::fs::create_dir_all(directory).expect("create the cluster directory");
                (None, directory.clone())
            }
            None => {
                let temporary =
                    tempfile::Builder::new().prefix("leasehold-cluster-").tempdir().expect("temporary directory");
                let root = temporary.path().to_path_buf();
                (Some(temporary), root)
            }
        };
        let credentials = Credentials::create(root.join("certs"));
        let mut cluster = TestCluster {
            options,
            credentials,
            nodes: BTreeMap::new(),
            // Unique, so that a node reaching another test's cluster is refused.
            cluster_name: format!("test-{:08x}", rand::random::<u32>()),
            retired: Vec::new(),
            _temporary: temporary,
            root,
        };
        for id in 1..=cluster.options.nodes {
            let (client_addr, peer_addr) = cluster.addresses_for(id);
            cluster.define_node(id, true, client_addr, peer_addr);
        }
        for id in started {
            cluster.spawn(*id);
        }
        if cluster.options.addressing == Addressing::Ephemeral {
            for id in started {
                cluster.wait_listening(*id, Duration::from_millis(START_WAIT_MS));
            }
        }
        cluster
    }

    /// Waits until node `id` accepts connections on every address it serves;
    /// panics with the end of its log if it exits first or the deadline passes (a
    /// cluster with a node missing could still elect a leader, and the test would
    /// fail later for a reason it does not name).
    fn wait_listening(&mut self, id: u64, deadline: Duration) {
        let give_up = Instant::now() + deadline;
        loop {
            let node = self.nodes.get_mut(&id).expect("node defined");
            let listens = |address: &str| {
                let address = address.parse().expect("a socket address");
                std::net::TcpStream::connect_timeout(&address, Duration::from_millis(wait::POLL_INTERVAL_MS)).is_ok()
            };
            let status_addr = node.status_addr.as_deref().filter(|_| server_accepts(&node.server, "--status-addr"));
            if listens(&node.client_addr)
                && listens(&node.peer_addr)
                && node.metrics_addr.as_deref().is_none_or(listens)
                && status_addr.is_none_or(listens)
            {
                return;
            }
            let child = node.child.as_mut().unwrap_or_else(|| panic!("node {id} is not running"));
            if let Some(status) = child.try_wait().expect("poll the node's process") {
                node.child = None;
                panic!("node {id} exited at start ({status}):\n{}", self.log_tail(id));
            }
            if Instant::now() >= give_up {
                panic!("timed out after {deadline:?} waiting for node {id} to listen:\n{}", self.log_tail(id));
            }
            std::thread::sleep(Duration::from_millis(wait::POLL_INTERVAL_MS));
        }
    }

    /// The client and peer address a new node `id` gets.
    fn addresses_for(&self, id: u64) -> (String, String) {
        match self.options.addressing {
            // free_ports never hands out a port this process reserved before, so the
            // addresses are clear of every node's, including removed ones.
            Addressing::Ephemeral => {
                let [client_port, peer_port] = free_ports();
                (format!("127.0.0.1:{client_port}"), format!("127.0.0.1:{peer_port}"))
            }
            Addressing::PerNodeIp { client_port, peer_port } => {
                let octet = FIRST_NODE_OCTET + id - 1;
                assert!(octet < 255, "node id {id} has no address");
                (format!("127.0.0.{octet}:{client_port}"), format!("127.0.0.{octet}:{peer_port}"))
            }
        }
    }

    /// Node `id`'s metrics and status page addresses: an ephemeral metrics port on
    /// 127.0.0.1 and no status page, or with per-node addresses the node's address
    /// with the client port + 200 and + 300 (7300 and 7400 beside 7100).
    fn http_addresses(&self, id: u64) -> (Option<String>, Option<String>) {
        match self.options.addressing {
            Addressing::Ephemeral => {
                let [port] = free_ports();
                (Some(format!("127.0.0.1:{port}")), None)
            }
            Addressing::PerNodeIp { client_port, .. } => {
                let octet = FIRST_NODE_OCTET + id - 1;
                let at = |offset: u16| Some(format!("127.0.0.{octet}:{}", client_port + offset));
                (at(200), at(300))
            }
        }
    }

    /// The directory holding data directories and logs.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn define_node(&mut self, id: u64, initial: bool, client_addr: String, peer_addr: String) {
        assert!(!self.nodes.contains_key(&id), "node {id} is already defined");
        if let Some(links) = &self.options.peer_proxy {
            let node_addr = match self.options.addressing {
                Addressing::Ephemeral => format!("127.0.0.1:{}", free_ports::<1>()[0]),
                Addressing::PerNodeIp { .. } => crate::slow_link::Links::beside(&peer_addr),
            };
            links.serve(id, &peer_addr, node_addr);
        }
        let (metrics_addr, status_addr) = self.http_addresses(id);
        let node = NodeProcess {
            id,
            client_addr,
            peer_addr,
            data_dir: self.root.join(format!("node{id}")),
            log: self.root.join(format!("node{id}.log")),
            initial,
            metrics_addr,
            status_addr,
            server: self.options.server.clone().unwrap_or_else(|| binary("leasehold-server")),
            child: None,
            exited: None,
        };
        self.nodes.insert(id, node);
    }

    /// The arguments node `id` is started with.
    pub fn arguments(&self, id: u64) -> Vec<String> {
        let node = &self.nodes[&id];
        let mut arguments = vec![
            "--node-id".into(),
            id.to_string(),
            "--cluster-name".into(),
            self.cluster_name.clone(),
            "--data-dir".into(),
            node.data_dir.display().to_string(),
            "--client-addr".into(),
            node.client_addr.clone(),
            "--peer-addr".into(),
            node.peer_addr.clone(),
        ];
        if let Some(node_addr) = self.options.peer_proxy.as_ref().and_then(|links| links.listen_addr_of(id)) {
            arguments.push("--test-peer-listen-addr".into());
            arguments.push(node_addr);
        }
        if let Some(metrics_addr) = &node.metrics_addr {
            arguments.push("--metrics-addr".into());
            arguments.push(metrics_addr.clone());
            // An older release's node (a rolling upgrade) serves them without a token.
            if server_accepts(&node.server, "--metrics-token-file") {
                arguments.push("--metrics-token-file".into());
                arguments.push(self.credentials.scrape_token_file.display().to_string());
            }
        }
        if let Some(status_addr) = node.status_addr.as_ref().filter(|_| server_accepts(&node.server, "--status-addr")) {
            arguments.push("--status-addr".into());
            arguments.push(status_addr.clone());
        }
        let host = |address: &str| address.rsplit_once(':').map(|(host, _)| host.to_string()).unwrap_or_default();
        let hosts = vec![host(&node.client_addr), host(&node.peer_addr), "localhost".to_string()];
        let (cert, key) = self.credentials.node_files(id, &hosts);
        let credentials = &self.credentials;
        for (flag, path) in [
            ("--tls-cert", &cert),
            ("--tls-key", &key),
            ("--client-ca", &credentials.ca_file),
            ("--peer-cert", &cert),
            ("--peer-key", &key),
            ("--peer-ca", &credentials.ca_file),
            ("--admin-token-file", &credentials.admin_token_file),
        ] {
            arguments.push(flag.into());
            arguments.push(path.display().to_string());
        }
        if node.initial {
            for member in self.nodes.values().filter(|member| member.initial) {
                arguments.push("--initial-member".into());
                arguments.push(format!("{}={},{}", member.id, member.client_addr, member.peer_addr));
            }
        }
        let options = &self.options;
        for (flag, value) in [
            ("--snapshot-every-entries", options.snapshot_every_entries),
            ("--heartbeat-ms", options.heartbeat_ms),
            ("--election-timeout-min-ms", options.election_timeout_min_ms),
            ("--election-timeout-max-ms", options.election_timeout_max_ms),
        ] {
            if let Some(value) = value {
                arguments.push(flag.into());
                arguments.push(value.to_string());
            }
        }
        arguments.push("--worker-threads".into());
        arguments.push(options.worker_threads_per_node().to_string());
        arguments.extend(options.extra_arguments.iter().cloned());
        arguments
    }

    fn spawn(&mut self, id: u64) {
        self.spawn_with(id, &[]);
    }

    fn spawn_with(&mut self, id: u64, extra: &[&str]) {
        self.spawn_wrapped(id, &[], extra);
    }

    /// Starts node `id` as the last arguments of `wrapper` (a command that sets
    /// something up and then execs the node, so that the node keeps its process id).
    fn spawn_wrapped(&mut self, id: u64, wrapper: &[String], extra: &[&str]) {
        let mut arguments = self.arguments(id);
        arguments.extend(extra.iter().map(|argument| argument.to_string()));
        let server = self.nodes[&id].server.clone();
        let server_text = server.display().to_string();
        let (program, arguments) = match wrapper.split_first() {
            None => (server.into_os_string(), arguments),
            Some((program, rest)) => {
                let mut all: Vec<String> = rest.to_vec();
                all.push(server.display().to_string());
                all.extend(arguments);
                (program.into(), all)
            }
        };
        let node = self.nodes.get_mut(&id).expect("node defined");
        assert!(node.child.is_none(), "node {id} is already running");
        node.exited = None;
        let log = File::options().create(true).append(true).open(&node.log).expect("open node log");
        let child = Command::new(program)
            .args(&arguments)
            .env("RUST_LOG", std::env::var("LEASEHOLD_TEST_LOG").unwrap_or_else(|_| "info,openraft=warn".into()))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone log handle"))
            .stderr(log)
            .process_group(0)
            .spawn()
            .unwrap_or_else(|error| panic!("cannot start {server_text}: {error}"));
        node.child = Some(child);
    }

    /// Starts a node that is not an initial member; add it with `Client::add_member`.
    pub fn start_joining_node(&mut self, id: u64) -> &NodeProcess {
        let (client_addr, peer_addr) = self.addresses_for(id);
        self.define_node(id, false, client_addr, peer_addr);
        self.spawn(id);
        &self.nodes[&id]
    }

    /// Starts a node that is not an initial member on given addresses (those of a
    /// removed node, so clients' endpoint lists stay valid), with an empty data
    /// directory; add it with `Client::add_member`.
    pub fn start_joining_node_at(&mut self, id: u64, client_addr: String, peer_addr: String) -> &NodeProcess {
        self.define_node(id, false, client_addr, peer_addr);
        self.spawn(id);
        &self.nodes[&id]
    }

    /// Forgets a node that was removed from the cluster, killing it if it still
    /// runs. Its log stays in `retired`.
    pub fn retire(&mut self, id: u64) {
        self.kill(id);
        if let Some(node) = self.nodes.remove(&id) {
            self.retired.push(node);
        }
    }

    /// Process ids of every running node, for a last-resort cleanup.
    pub fn running_pids(&self) -> Vec<i32> {
        self.nodes.values().filter_map(|node| node.child.as_ref().map(|child| child.id() as i32)).collect()
    }

    pub fn pid(&self, id: u64) -> Option<i32> {
        self.nodes[&id].child.as_ref().map(|child| child.id() as i32)
    }

    fn signal(&self, id: u64, signal: i32) {
        let pid = self.pid(id).unwrap_or_else(|| panic!("node {id} is not running"));
        // SAFETY: signalling a child process we started, by its id.
        unsafe {
            libc::kill(pid, signal);
        }
    }

    /// kill -9.
    pub fn kill(&mut self, id: u64) {
        let node = self.nodes.get_mut(&id).expect("node defined");
        if let Some(mut child) = node.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts a killed (or stopped) node again on the same data directory with the
    /// same flags.
    pub fn restart(&mut self, id: u64) {
        self.kill(id);
        self.spawn(id);
    }

    /// Starts a killed (or stopped) node again with `extra` flags after its usual ones.
    pub fn restart_with(&mut self, id: u64, extra: &[&str]) {
        self.kill(id);
        self.spawn_with(id, extra);
    }

    /// Starts node `id` again with its data directory on a tmpfs of `bytes` that only
    /// the node sees (a mount namespace of its own, gone with the process): a small
    /// disk to fill. Needs root, as CI runs. `extra` flags follow the usual ones.
    pub fn restart_on_small_disk(&mut self, id: u64, bytes: u64, extra: &[&str]) {
        self.kill(id);
        let data_dir = self.nodes[&id].data_dir.clone();
        std::fs::create_dir_all(&data_dir).expect("create the mount point");
        let wrapper: Vec<String> = vec![
            "unshare".into(),
            "--mount".into(),
            "--propagation".into(),
            "private".into(),
            "sh".into(),
            "-c".into(),
            format!("mount -t tmpfs -o size={bytes} leasehold-small-disk \"$0\" && exec \"$@\""),
            data_dir.display().to_string(),
        ];
        self.spawn_wrapped(id, &wrapper, extra);
    }

    /// Kills node `id` and deletes its data directory: a lost disk.
    pub fn wipe(&mut self, id: u64) {
        self.kill(id);
        let data_dir = self.nodes[&id].data_dir.clone();
        match std::fs::remove_dir_all(&data_dir) {
            Ok(()) => {}
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => panic!("cannot wipe {}: {error}", data_dir.display()),
        }
    }

    /// Waits for node `id`'s process to exit on its own; panics after `deadline`.
    pub async fn exit_status(&mut self, id: u64, deadline: Duration) -> ExitStatus {
        match self.try_exit_status(id, deadline).await {
            Some(status) => status,
            None => panic!("node {id} still runs {deadline:?} later; expected it to exit\n{}", self.log_tail(id)),
        }
    }

    /// How node `id`'s process exited on its own, or None if it still runs after
    /// `deadline` (it is left running).
    pub async fn try_exit_status(&mut self, id: u64, deadline: Duration) -> Option<ExitStatus> {
        let give_up = Instant::now() + deadline;
        loop {
            let node = self.nodes.get_mut(&id).expect("node defined");
            let Some(child) = node.child.as_mut() else {
                return node.exited;
            };
            if let Some(status) = child.try_wait().expect("wait for the node") {
                node.child = None;
                node.exited = Some(status);
                return Some(status);
            }
            if Instant::now() >= give_up {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(wait::POLL_INTERVAL_MS)).await;
        }
    }

    /// The whole log of node `id` (every run of it).
    pub fn log_text(&self, id: u64) -> String {
        std::fs::read_to_string(&self.nodes[&id].log).unwrap_or_default()
    }

    /// Stops node `id` the way an operator does (SIGTERM) and returns how it exited;
    /// panics if it is still running after `deadline` (then it is killed).
    pub async fn stop(&mut self, id: u64, deadline: Duration) -> ExitStatus {
        match self.try_stop(id, deadline).await {
            Some(status) => status,
            None => panic!("node {id} still ran {deadline:?} after SIGTERM"),
        }
    }

    /// `stop`, returning None (the node killed) if it still runs after `deadline`.
    pub async fn try_stop(&mut self, id: u64, deadline: Duration) -> Option<ExitStatus> {
        self.signal(id, libc::SIGTERM);
        let node = self.nodes.get_mut(&id).expect("node defined");
        let child = node.child.as_mut().expect("node is running");
        let give_up = Instant::now() + deadline;
        loop {
            if let Some(status) = child.try_wait().expect("wait for the node") {
                node.child = None;
                return Some(status);
            }
            if Instant::now() >= give_up {
                let _ = child.kill();
                let _ = child.wait();
                node.child = None;
                return None;
            }
            tokio::time::sleep(Duration::from_millis(wait::POLL_INTERVAL_MS)).await;
        }
    }

    /// Makes node `id` start on `server` from its next start on (a rolling upgrade).
    pub fn set_server(&mut self, id: u64, server: PathBuf) {
        self.nodes.get_mut(&id).expect("node defined").server = server;
    }

    pub fn pause(&self, id: u64) {
        self.signal(id, libc::SIGSTOP);
    }

    pub fn resume(&self, id: u64) {
        self.signal(id, libc::SIGCONT);
    }

    /// Whether node `id`'s process is still running (it exits when removed).
    pub fn is_running(&mut self, id: u64) -> bool {
        let node = self.nodes.get_mut(&id).expect("node defined");
        match node.child.as_mut() {
            None => false,
            Some(child) => match child.try_wait() {
                Ok(None) => true,
                Ok(Some(status)) => {
                    node.child = None;
                    node.exited = Some(status);
                    false
                }
                Err(_) => {
                    node.child = None;
                    false
                }
            },
        }
    }

    pub fn endpoints(&self) -> Vec<String> {
        self.nodes.values().map(|node| node.client_addr.clone()).collect()
    }

    /// A client of every node, as the test tenant.
    pub fn client(&self) -> Client {
        self.credentials.settings(self.endpoints(), false).client().expect("valid client settings")
    }

    /// A client of node `id` only, as the test tenant.
    pub fn client_of(&self, id: u64) -> Client {
        let endpoints = vec![self.nodes[&id].client_addr.clone()];
        self.credentials.settings(endpoints, false).client().expect("valid client settings")
    }

    /// A client of node `id` only, with the admin credential.
    pub fn admin_client_of(&self, id: u64) -> Client {
        let endpoints = vec![self.nodes[&id].client_addr.clone()];
        self.credentials.settings(endpoints, true).client().expect("valid client settings")
    }

    /// A client of every node with the admin credential.
    pub fn admin_client(&self) -> Client {
        self.credentials.settings(self.endpoints(), true).client().expect("valid client settings")
    }

    /// What a client process of this cluster needs in its environment: the endpoints
    /// and the credentials (see `Credentials::env`).
    pub fn client_env(&self) -> Vec<(&'static str, String)> {
        let mut env = self.credentials.env();
        env.push(("LEASEHOLD_ENDPOINTS", self.endpoints().join(",")));
        env
    }

    /// `GET /metrics` of node `id`, as a Prometheus server with the scrape token
    /// sends it (over HTTPS trusting the cluster CA).
    pub async fn scrape(&self, id: u64) -> anyhow::Result<crate::https::Answer> {
        let address = self.nodes[&id].metrics_addr.as_deref().ok_or_else(|| anyhow::anyhow!("no metrics address"))?;
        let token = leasehold::settings::read_token_file(&self.credentials.scrape_token_file)?;
        crate::https::get(address, Some(&self.credentials.ca_file), Some(&token), "/metrics").await
    }

    /// `GET path` from node `id`'s metrics port (a health probe), with the scrape
    /// token or with no credential.
    pub async fn probe(&self, id: u64, path: &str, with_token: bool) -> anyhow::Result<crate::https::Answer> {
        let address = self.nodes[&id].metrics_addr.as_deref().ok_or_else(|| anyhow::anyhow!("no metrics address"))?;
        let token = match with_token {
            true => Some(leasehold::settings::read_token_file(&self.credentials.scrape_token_file)?),
            false => None,
        };
        crate::https::get(address, Some(&self.credentials.ca_file), token.as_deref(), path).await
    }

    pub async fn status(&self, id: u64) -> Option<StatusResponse> {
        let endpoints = vec![self.nodes[&id].client_addr.clone()];
        let client = self.credentials.settings(endpoints, true).client().expect("valid client settings");
        client.status_of(&self.nodes[&id].client_addr).await.ok()
    }

    /// The node that says it leads, among the running ones, if exactly one does
    /// in the highest term.
    pub async fn leader(&self) -> Option<u64> {
        let mut best: Option<(u64, u64)> = None;
        for (id, node) in &self.nodes {
            if node.child.is_none() {
                continue;
            }
            if let Some(status) = self.status(*id).await {
                if status.state == "leader" && best.is_none_or(|(term, _)| status.term > term) {
                    best = Some((status.term, *id));
                }
            }
        }
        best.map(|(_, id)| id)
    }

    /// Waits until a leader is elected; the first time, also makes the test tenant (as
    /// an operator would before handing out its token) and writes its token file.
    pub async fn wait_for_leader(&self, deadline: Duration) -> u64 {
        let leader = wait::until(deadline, "a leader to be elected", || self.leader()).await;
        if !self.credentials.token_file.exists() {
            self.make_test_tenant(deadline).await;
            // Every running node checks the token against its own applied state: the
            // tests may send it to any of them at once.
            if let Some(status) = self.status(leader).await {
                let running: Vec<u64> =
                    self.nodes.iter().filter(|(_, node)| node.child.is_some()).map(|(id, _)| *id).collect();
                for id in running {
                    self.wait_applied(id, status.commit_index, deadline).await;
                }
            }
        }
        leader
    }

    /// Adds `TEST_TENANT` with quotas no test reaches, and writes its token.
    async fn make_test_tenant(&self, deadline: Duration) {
        let admin = self.admin_client();
        let quotas = leasehold::proto::Quotas {
            max_sessions: 1_000_000,
            max_holds: 10_000_000,
            max_waiters: 10_000_000,
            ..Default::default()
        };
        let token = wait::until(deadline, "the test tenant to be added", || {
            let (admin, quotas) = (&admin, quotas);
            async move {
                match admin.add_tenant(TEST_TENANT, quotas).await {
                    Ok(added) => Some(added.token),
                    // An earlier attempt made it, and its answer was lost.
                    Err(leasehold::Error::Refused(_)) => admin.rotate_tenant_token(TEST_TENANT).await.ok(),
                    Err(_) => None,
                }
            }
        })
        .await;
        certs::write_file(&self.credentials.token_file, &token, true).expect("write the tenant token");
    }

    /// Waits until node `id` applied at least `index`.
    pub async fn wait_applied(&self, id: u64, index: u64, deadline: Duration) -> StatusResponse {
        wait::until(deadline, &format!("node {id} to apply index {index}"), || async move {
            self.status(id).await.filter(|status| status.applied_index >= index)
        })
        .await
    }

    pub fn log_tail(&self, id: u64) -> String {
        let text = std::fs::read_to_string(&self.nodes[&id].log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n")
    }

    pub fn data_dir(&self, id: u64) -> &Path {
        &self.nodes[&id].data_dir
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for id in self.nodes.keys() {
                eprintln!("---- node {id} log (last {LOG_TAIL_LINES} lines) ----\n{}", self.log_tail(*id));
            }
        }
        for node in self.nodes.values_mut() {
            if let Some(mut child) = node.child.take() {
                // SAFETY: resuming a child we may have paused, so it can die.
                unsafe {
                    libc::kill(child.id() as i32, libc::SIGCONT);
                }
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}
