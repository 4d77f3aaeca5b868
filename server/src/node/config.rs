//! Node configuration: read from flags and an optional TOML file, validated once at
//! start into a `Config` that cannot be invalid. Each error names the rule it broke.

use std::collections::BTreeMap;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;

use serde::Deserialize;

use crate::machine::limits::{LOCK_DELAY_MS_MAX, LOCK_NAME_BYTES_MAX};
use crate::machine::COMMAND_LEVEL;
use crate::raft::replica::{PROPOSALS_QUEUED_MAX, TENANT_QUEUED_MAX_DEFAULT};
use crate::raft::types::{Node, NodeId, MEMBERS_MAX};
use crate::shell::credentials::{read_admin_token, read_token_file};
use crate::shell::tls::{ClientCertificates, PeerClientTls, ServerTls, TlsFiles};

/// Default timings. openraft 0.9 makes a follower wait its leader lease (the
/// maximum election timeout) plus its election timeout after the last heartbeat,
/// so a follower campaigns 450–600 ms after a leader's kill -9. A follower misses
/// 9 heartbeats before that; on the 2-core machine, with the benchmarks saturating
/// it, no spurious election was seen. Every client was back about 1 s after a
/// leader's kill with 250–500 ms, and 0.65–0.77 s with 150–300 ms (and the
/// takeover of `peer_service::Takeover`).
pub const HEARTBEAT_MS_DEFAULT: u64 = 50;
pub const ELECTION_TIMEOUT_MIN_MS_DEFAULT: u64 = 150;
pub const ELECTION_TIMEOUT_MAX_MS_DEFAULT: u64 = 300;
pub const HEARTBEAT_MS_MIN: u64 = 10;
pub const ELECTION_TIMEOUT_MS_MAX: u64 = 60_000;
pub const SNAPSHOT_EVERY_ENTRIES_DEFAULT: u64 = 10_000;
pub const SNAPSHOT_EVERY_ENTRIES_MIN: u64 = 10;
pub const CLUSTER_NAME_BYTES_MAX: usize = 64;
pub const WORKER_THREADS_MAX: usize = 1_024;
pub const CLUSTER_NAME_DEFAULT: &str = "leasehold";
/// The replicated state's budget unless configured: room for `SESSIONS_MAX` sessions
/// holding a lock each, as the state estimates them (about 470 MB), with room to spare.
pub const STATE_BUDGET_BYTES_DEFAULT: u64 = 1 << 30;
pub const STATE_BUDGET_BYTES_MIN: u64 = 1 << 20;
/// Free space kept on the data directory's file system unless configured.
pub const DISK_RESERVE_BYTES_DEFAULT: u64 = 64 << 20;

const _: () = assert!(HEARTBEAT_MS_DEFAULT < ELECTION_TIMEOUT_MIN_MS_DEFAULT);
const _: () = assert!(ELECTION_TIMEOUT_MIN_MS_DEFAULT < ELECTION_TIMEOUT_MAX_MS_DEFAULT);

/// Configuration as given: every field optional, merged from the TOML file and the
/// flags (flags win). Nothing in it has been checked yet.
#[derive(Debug, Default, Clone, Deserialize, clap::Args)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    /// This node's id (a positive integer, unique in the cluster).
    #[arg(long)]
    pub node_id: Option<u64>,
    /// Address for clients (the `Leasehold` and `Admin` gRPC services), host:port.
    /// Defaults to this node's entry in the initial members.
    #[arg(long)]
    pub client_addr: Option<String>,
    /// Address for peers (Raft RPCs), host:port. Never expose it to clients.
    /// Defaults to this node's entry in the initial members.
    #[arg(long)]
    pub peer_addr: Option<String>,
    /// Directory for the Raft log, vote and snapshots. Created if missing.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Name of the cluster; a data directory of another cluster is refused.
    #[arg(long)]
    pub cluster_name: Option<String>,
    /// Initial members, `ID=CLIENT_ADDR,PEER_ADDR`, repeated. Every initial member
    /// is started with the same list; a node added later is started without it. The
    /// lowest id bootstraps a new cluster; the others wait four maximal election
    /// timeouts for it, then bootstrap it themselves.
    #[arg(long = "initial-member", value_name = "ID=CLIENT_ADDR,PEER_ADDR")]
    #[serde(default)]
    pub initial_members: Vec<String>,
    /// Leader heartbeat interval.
    #[arg(long)]
    pub heartbeat_ms: Option<u64>,
    /// A follower that hears no leader for a random time in [min, max] starts an election.
    #[arg(long)]
    pub election_timeout_min_ms: Option<u64>,
    #[arg(long)]
    pub election_timeout_max_ms: Option<u64>,
    /// Build a snapshot (and purge the log behind it) every this many applied entries.
    #[arg(long)]
    pub snapshot_every_entries: Option<u64>,
    /// Address of the Prometheus text endpoint (`/metrics`), host:port. Off if unset.
    /// HTTPS with the client port's certificate, behind the scrape token
    /// (--metrics-token-file); plain HTTP with --insecure-plaintext.
    #[arg(long)]
    pub metrics_addr: Option<String>,
    /// A file holding the scrape token (its first line, 16 to 4096 bytes) that a
    /// scraper sends as `Authorization: Bearer <token>` (the admin token also works).
    /// Required with --metrics-addr unless --insecure-plaintext; re-read on SIGHUP.
    #[arg(long)]
    pub metrics_token_file: Option<PathBuf>,
    /// Add the series that name tenants, semaphores and their usage (one per tenant
    /// or per name) to the metrics. Off by default: whoever can scrape then learns
    /// every tenant's name and activity. See "Security" in the README.
    #[arg(long)]
    #[serde(default)]
    pub metrics_per_tenant: bool,
    /// Answer the health probes on the metrics port (`/livez`, `/readyz`) without a
    /// credential, with `ok` or `not ok` and nothing else (for Kubernetes probes and
    /// load balancers, which send no token). With the scrape token they also say why.
    #[arg(long)]
    #[serde(default)]
    pub probes_without_token: bool,
    /// Address of the live status page, host:port: HTTPS with the client port's
    /// certificate (HTTP with --insecure-plaintext), read-only, behind the admin
    /// credential. Off if unset.
    #[arg(long)]
    pub status_addr: Option<String>,
    /// Threads that serve clients and peers (the async runtime's workers); one per
    /// CPU core by default. When several nodes share a machine, give each a share of
    /// its cores (`cluster.sh` does): more threads than the cores can run add
    /// thread wake-ups to every request.
    #[arg(long)]
    pub worker_threads: Option<usize>,
    /// Accept the `SkewClock` admin RPC, which speeds up, slows down or jumps this
    /// node's monotonic clock. For the fault-injection suite only.
    #[arg(long)]
    #[serde(default)]
    pub test_clock_knob: bool,
    /// The client port's certificate (PEM, the chain from the leaf). Clients check it
    /// against the CA they trust and the host they dial. Re-read on SIGHUP.
    #[arg(long)]
    pub tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM). Re-read on SIGHUP.
    #[arg(long)]
    pub tls_key: Option<PathBuf>,
    /// A CA whose client certificates the client port accepts as credentials: a
    /// verified certificate naming `<tenant>.<tag>.tenant.leasehold` acts as that
    /// tenant while the tag matches its token (`leasehold cert tenant --token-file`).
    /// Without it, clients authenticate with bearer tokens only.
    #[arg(long)]
    pub client_ca: Option<PathBuf>,
    /// This node's certificate on the peer port, presented to peers both as server and
    /// as client; it must name `node-<ID>.leasehold`. Re-read on SIGHUP.
    #[arg(long)]
    pub peer_cert: Option<PathBuf>,
    /// The private key of --peer-cert (PEM).
    #[arg(long)]
    pub peer_key: Option<PathBuf>,
    /// The cluster CA: peers must present a certificate it signed, naming their node id.
    #[arg(long)]
    pub peer_ca: Option<PathBuf>,
    /// Serve both ports without TLS. Anyone who can reach a port can then read and
    /// forge its traffic; for a machine-local test only. Logged as a warning at start
    /// and shown in `leasehold status`.
    #[arg(long)]
    #[serde(default)]
    pub insecure_plaintext: bool,
    /// A file holding the admin credential (a bearer token of at least 16 bytes; the
    /// file's first line). Membership, tenants and the clock knob need it. Provision
    /// it like any other secret: the same file on every node, readable by the node's
    /// user only.
    #[arg(long)]
    pub admin_token_file: Option<PathBuf>,
    /// The replicated state's budget, in bytes as the state estimates them (default
    /// 1 GiB): past it the leader refuses new sessions, locks, waits and tenants, and
    /// names the tenant using most, while releases, closes and expiries go on. Give
    /// every node the same value.
    #[arg(long)]
    pub state_budget_bytes: Option<u64>,
    /// Free space to keep on the data directory's file system (default 64 MiB): below
    /// it the leader refuses new sessions, locks, waits and tenants (DISK_LOW), so that
    /// the log has room for releases, closes and expiries, and no write fails for want
    /// of space (a failed write stops the node, exit code 5). Shown in `leasehold
    /// status` and the metrics.
    #[arg(long)]
    pub disk_reserve_bytes: Option<u64>,
    /// Commands one tenant may have waiting for a log entry on the leader (default
    /// 4096): past it the tenant's requests are refused with OVERLOADED and a
    /// retry-after, before any work is done, while other tenants' go on.
    #[arg(long)]
    pub tenant_queue_max: Option<usize>,
    /// This node's data directory was lost and the node comes back on an empty one
    /// to join as a new member, under the same id: the node never bootstraps and
    /// waits to be added (`leasehold member add`). Without it, an empty directory under
    /// the id of a member the cluster knows is refused at the first message from a
    /// peer. See "Replacing a node" in the README.
    #[arg(long)]
    #[serde(default)]
    pub new_incarnation: bool,
    /// Turns off the incarnation checks, so that a wiped node counts as the member it
    /// was. For the control runs of the tests that show the checks matter; never in
    /// production.
    #[arg(long, hide = true)]
    #[serde(default)]
    pub test_accept_any_incarnation: bool,
    /// Writes no checkpoints of quiet sessions, so that a new leader restarts every
    /// session at a full TTL (the behaviour before checkpoints). For the control runs
    /// that show the bound on a dead holder depends on them; never in production.
    #[arg(long, hide = true)]
    #[serde(default)]
    pub test_full_ttl_restart: bool,
    /// Plants a bug: a new leader restarts every live session at half its TTL, which
    /// can end a lease its holder still counts on. For the control runs of the lease
    /// checks (the simulator's `--bug lease-shortened`); never in production.
    #[arg(long, hide = true)]
    #[serde(default)]
    pub test_short_lease_restart: bool,
    /// Plants a bug: before the log records a member's incarnation, the latest one
    /// heard is believed (and peers are not told the first), so a follower wiped in
    /// the first moments of a cluster is taken back as the member it was. For the
    /// simulator's `--bug unrecorded-incarnation`; never in production.
    #[arg(long, hide = true)]
    #[serde(default)]
    pub test_believe_latest_incarnation: bool,
    /// Plants a bug: `member add` of a node that is still a learner adds it again as
    /// it is, keeping the incarnation recorded for the learner, so that a node
    /// started again on an emptied directory after a refused add is stopped by that
    /// stale record. For the simulator's `--bug stale-incarnation`; never in
    /// production.
    #[arg(long, hide = true)]
    #[serde(default)]
    pub test_keep_learner_on_add: bool,
    /// Plants a bug: a keepalive or observe stream keeps the credential it opened
    /// with, so a tenant token rotated or removed keeps its open sessions alive. For
    /// the simulator's `--bug stream-outlives-rotation`; never in production.
    #[arg(long, hide = true)]
    #[serde(default)]
    pub test_stream_outlives_rotation: bool,
    /// Speaks for a build that knows command levels up to N only (below this build's
    /// `COMMAND_LEVEL`): what an older build does when the cluster's log is newer. For
    /// the tests of that refusal; never in production.
    #[arg(long, hide = true, value_name = "N")]
    #[serde(default)]
    pub test_command_level: Option<u32>,
    /// Panics while applying an acquire of the lock NAME: a deterministic bug in
    /// apply, for the tests of what a node does then; never in production.
    #[arg(long, hide = true, value_name = "NAME")]
    #[serde(default)]
    pub test_panic_on_lock: Option<String>,
    /// Accept the `SlowDisk` admin RPC, which makes this node's fsyncs take longer.
    /// For the fault-injection suite only.
    #[arg(long, hide = true)]
    #[serde(default)]
    pub test_disk_knob: bool,
    /// Listen for peers on this address while members dial --peer-addr: the fault
    /// suite puts a delaying proxy there (its slow links). For the fault-injection
    /// suite only.
    #[arg(long, hide = true, value_name = "HOST:PORT")]
    #[serde(default)]
    pub test_peer_listen_addr: Option<String>,
    /// The lock-delay of locks and semaphore permits whose name starts with PREFIX,
    /// for acquires that do not ask for one (`PREFIX=MS`, repeated; the longest
    /// matching prefix wins; 0 is none; at most LOCK_DELAY_MS_MAX = 60000). After a
    /// holder's session expires, such a lock goes to no one for that long. Give every
    /// node the same list: the node that takes the request applies it.
    #[arg(long = "lock-delay-default", value_name = "PREFIX=MS")]
    #[serde(default)]
    pub lock_delay_defaults: Vec<String>,
    /// A tenant's lock, semaphore or election name (or `PREFIX*`), as TENANT:NAME
    /// (admin:NAME for the admin's namespace), whose grants the metrics count, with
    /// the time of the latest (`leasehold_watched_*`), for an alert when a job that
    /// must run did not. Repeated, at most 100; `watch = [...]` in TOML.
    #[arg(long = "watch", value_name = "TENANT:NAME|TENANT:PREFIX*")]
    #[serde(default, rename = "watch")]
    pub watches: Vec<String>,
}

impl RawConfig {
    /// Fills every unset field of `self` from `file`.
    pub fn merged_over(self, file: RawConfig) -> RawConfig {
        RawConfig {
            node_id: self.node_id.or(file.node_id),
            client_addr: self.client_addr.or(file.client_addr),
            peer_addr: self.peer_addr.or(file.peer_addr),
            data_dir: self.data_dir.or(file.data_dir),
            cluster_name: self.cluster_name.or(file.cluster_name),
            initial_members: if self.initial_members.is_empty() { file.initial_members } else { self.initial_members },
            heartbeat_ms: self.heartbeat_ms.or(file.heartbeat_ms),
            election_timeout_min_ms: self.election_timeout_min_ms.or(file.election_timeout_min_ms),
            election_timeout_max_ms: self.election_timeout_max_ms.or(file.election_timeout_max_ms),
            snapshot_every_entries: self.snapshot_every_entries.or(file.snapshot_every_entries),
            metrics_addr: self.metrics_addr.or(file.metrics_addr),
            metrics_token_file: self.metrics_token_file.or(file.metrics_token_file),
            metrics_per_tenant: self.metrics_per_tenant || file.metrics_per_tenant,
            probes_without_token: self.probes_without_token || file.probes_without_token,
            status_addr: self.status_addr.or(file.status_addr),
            worker_threads: self.worker_threads.or(file.worker_threads),
            test_clock_knob: self.test_clock_knob || file.test_clock_knob,
            tls_cert: self.tls_cert.or(file.tls_cert),
            tls_key: self.tls_key.or(file.tls_key),
            client_ca: self.client_ca.or(file.client_ca),
            peer_cert: self.peer_cert.or(file.peer_cert),
            peer_key: self.peer_key.or(file.peer_key),
            peer_ca: self.peer_ca.or(file.peer_ca),
            insecure_plaintext: self.insecure_plaintext || file.insecure_plaintext,
            admin_token_file: self.admin_token_file.or(file.admin_token_file),
            state_budget_bytes: self.state_budget_bytes.or(file.state_budget_bytes),
            disk_reserve_bytes: self.disk_reserve_bytes.or(file.disk_reserve_bytes),
            tenant_queue_max: self.tenant_queue_max.or(file.tenant_queue_max),
            new_incarnation: self.new_incarnation || file.new_incarnation,
            test_accept_any_incarnation: self.test_accept_any_incarnation || file.test_accept_any_incarnation,
            test_full_ttl_restart: self.test_full_ttl_restart || file.test_full_ttl_restart,
            test_short_lease_restart: self.test_short_lease_restart || file.test_short_lease_restart,
            test_believe_latest_incarnation: self.test_believe_latest_incarnation
                || file.test_believe_latest_incarnation,
            test_keep_learner_on_add: self.test_keep_learner_on_add || file.test_keep_learner_on_add,
            test_stream_outlives_rotation: self.test_stream_outlives_rotation || file.test_stream_outlives_rotation,
            test_command_level: self.test_command_level.or(file.test_command_level),
            test_panic_on_lock: self.test_panic_on_lock.or(file.test_panic_on_lock),
            test_disk_knob: self.test_disk_knob || file.test_disk_knob,
            test_peer_listen_addr: self.test_peer_listen_addr.or(file.test_peer_listen_addr),
            lock_delay_defaults: if self.lock_delay_defaults.is_empty() {
                file.lock_delay_defaults
            } else {
                self.lock_delay_defaults
            },
            watches: if self.watches.is_empty() { file.watches } else { self.watches },
        }
    }

    pub fn from_toml_file(path: &std::path::Path) -> Result<RawConfig, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|error| ConfigError(format!("cannot read config file {}: {error}", path.display())))?;
        toml::from_str(&text).map_err(|error| ConfigError(format!("config file {}: {error}", path.display())))
    }
}

/// A configuration that passed every check.
#[derive(Debug, Clone)]
pub struct Config {
    pub node_id: NodeId,
    pub client_addr: String,
    pub peer_addr: String,
    pub client_bind: SocketAddr,
    pub peer_bind: SocketAddr,
    pub data_dir: PathBuf,
    pub cluster_name: String,
    /// Empty for a node that waits to be added by `leasehold member add`.
    pub initial_members: BTreeMap<NodeId, Node>,
    pub heartbeat_ms: u64,
    pub election_timeout_min_ms: u64,
    pub election_timeout_max_ms: u64,
    pub snapshot_every_entries: u64,
    pub metrics_bind: Option<SocketAddr>,
    /// The scrape token's file; `None` only with --insecure-plaintext, where the
    /// metrics are then open to whoever reaches the port.
    pub metrics_token_file: Option<PathBuf>,
    /// Series per tenant and per name (--metrics-per-tenant).
    pub metrics_per_tenant: bool,
    /// The health probes answer without a credential (--probes-without-token).
    pub probes_without_token: bool,
    pub status_bind: Option<SocketAddr>,
    pub worker_threads: usize,
    pub test_clock_knob: bool,
    /// TLS on both ports, or plaintext when the operator asked for it.
    pub transport: Transport,
    /// Where the admin credential is read from (at start and on SIGHUP).
    pub admin_token_file: PathBuf,
    pub state_budget_bytes: u64,
    pub disk_reserve_bytes: u64,
    pub tenant_queue_max: usize,
    /// Join as a new member on an empty directory (see `RawConfig::new_incarnation`).
    pub new_incarnation: bool,
    pub test_accept_any_incarnation: bool,
    pub test_full_ttl_restart: bool,
    pub test_short_lease_restart: bool,
    pub test_believe_latest_incarnation: bool,
    pub test_keep_learner_on_add: bool,
    pub test_stream_outlives_rotation: bool,
    /// The command level this node speaks for: `COMMAND_LEVEL` unless
    /// --test-command-level says lower.
    pub command_level: u32,
    pub test_panic_on_lock: Option<String>,
    /// --test-disk-knob: the `SlowDisk` admin RPC is accepted.
    pub test_disk_knob: bool,
    /// Lock-delays by name prefix, for acquires that ask for none (see
    /// `api::lock_delay`).
    pub lock_delay_defaults: Vec<(String, u64)>,
    /// Names and prefixes whose grants the metrics count (see `shell::watched`).
    pub watches: Vec<String>,
}

/// How the node's ports are served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transport {
    /// --insecure-plaintext.
    Plaintext,
    Tls {
        /// The client port: its certificate, and the CA of client certificates if any.
        client_port: TlsFiles,
        /// The peer port and outgoing peer connections: mutual, under the cluster CA.
        peer_port: TlsFiles,
    },
}

impl Transport {
    pub fn is_plaintext(&self) -> bool {
        *self == Transport::Plaintext
    }
}

/// The transport the TLS flags describe; their files are read once here, so that a
/// missing or broken certificate is a configuration error that names the file.
fn transport(raw: &RawConfig) -> Result<Transport, ConfigError> {
    let tls_flags = [
        ("--tls-cert", raw.tls_cert.is_some()),
        ("--tls-key", raw.tls_key.is_some()),
        ("--client-ca", raw.client_ca.is_some()),
        ("--peer-cert", raw.peer_cert.is_some()),
        ("--peer-key", raw.peer_key.is_some()),
        ("--peer-ca", raw.peer_ca.is_some()),
    ];
    if raw.insecure_plaintext {
        if let Some((flag, _)) = tls_flags.iter().find(|(_, given)| *given) {
            return fail(format!("{flag} was given with --insecure-plaintext; choose TLS or plaintext"));
        }
        return Ok(Transport::Plaintext);
    }
    let missing: Vec<&str> =
        tls_flags.iter().filter(|(flag, given)| !given && *flag != "--client-ca").map(|(flag, _)| *flag).collect();
    if !missing.is_empty() {
        return fail(format!(
            "TLS needs {} (or run with --insecure-plaintext, which lets anyone who reaches a port read and \
             forge its traffic)",
            missing.join(", ")
        ));
    }
    let client_port = TlsFiles {
        cert: raw.tls_cert.clone().expect("checked"),
        key: raw.tls_key.clone().expect("checked"),
        ca: raw.client_ca.clone(),
    };
    let peer_port = TlsFiles {
        cert: raw.peer_cert.clone().expect("checked"),
        key: raw.peer_key.clone().expect("checked"),
        ca: raw.peer_ca.clone(),
    };
    ServerTls::load("client", client_port.clone(), ClientCertificates::Optional)
        .map_err(|error| ConfigError(format!("client port TLS: {error}")))?;
    ServerTls::load("peer", peer_port.clone(), ClientCertificates::Required)
        .map_err(|error| ConfigError(format!("peer port TLS: {error}")))?;
    PeerClientTls::load(peer_port.clone()).map_err(|error| ConfigError(format!("peer TLS: {error}")))?;
    Ok(Transport::Tls { client_port, peer_port })
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid configuration: {0}")]
pub struct ConfigError(pub String);

fn fail<T>(message: impl Into<String>) -> Result<T, ConfigError> {
    Err(ConfigError(message.into()))
}

fn resolve(what: &str, address: &str) -> Result<SocketAddr, ConfigError> {
    match address.to_socket_addrs() {
        Ok(mut addresses) => match addresses.next() {
            Some(resolved) => Ok(resolved),
            None => fail(format!("{what} {address:?} resolves to no address")),
        },
        Err(error) => fail(format!("{what} {address:?} is not a host:port address ({error})")),
    }
}

/// `--lock-delay-default PREFIX=MS` entries, checked: a prefix no longer than a name,
/// each once, a delay within `LOCK_DELAY_MS_MAX`.
fn lock_delay_defaults(entries: &[String]) -> Result<Vec<(String, u64)>, ConfigError> {
    let rule = "a lock-delay default is written PREFIX=MS, e.g. reports/=10000";
    let mut defaults: Vec<(String, u64)> = Vec::with_capacity(entries.len());
    for entry in entries {
        let Some((prefix, delay_text)) = entry.rsplit_once('=') else {
            return fail(format!("--lock-delay-default {entry:?}: {rule}"));
        };
        let Ok(delay_ms) = delay_text.trim().parse::<u64>() else {
            return fail(format!("--lock-delay-default {entry:?}: {delay_text:?} is not a number of milliseconds"));
        };
        if delay_ms > LOCK_DELAY_MS_MAX {
            return fail(format!(
                "--lock-delay-default {entry:?}: {delay_ms} ms is above the limit of {LOCK_DELAY_MS_MAX} ms \
                 (LOCK_DELAY_MS_MAX)"
            ));
        }
        if prefix.len() > LOCK_NAME_BYTES_MAX {
            return fail(format!(
                "--lock-delay-default: a prefix of {} bytes is longer than any name ({LOCK_NAME_BYTES_MAX} bytes, \
                 LOCK_NAME_BYTES_MAX)",
                prefix.len()
            ));
        }
        if defaults.iter().any(|(known, _)| known == prefix) {
            return fail(format!("--lock-delay-default: the prefix {prefix:?} is given twice"));
        }
        defaults.push((prefix.to_owned(), delay_ms));
    }
    Ok(defaults)
}

pub fn parse_member(text: &str) -> Result<(NodeId, Node), ConfigError> {
    let rule = "an initial member is written ID=CLIENT_ADDR,PEER_ADDR, e.g. 1=127.0.0.1:7101,127.0.0.1:7201";
    let Some((id_text, addresses)) = text.split_once('=') else {
        return fail(format!("initial member {text:?}: {rule}"));
    };
    let Some((client_addr, peer_addr)) = addresses.split_once(',') else {
        return fail(format!("initial member {text:?}: {rule}"));
    };
    let node_id: NodeId = match id_text.trim().parse() {
        Ok(id) if id > 0 => id,
        _ => return fail(format!("initial member {text:?}: the id must be a positive integer")),
    };
    let node = Node { client_addr: client_addr.trim().to_string(), peer_addr: peer_addr.trim().to_string() };
    resolve("initial member client address", &node.client_addr)?;
    resolve("initial member peer address", &node.peer_addr)?;
    Ok((node_id, node))
}

impl Config {
    pub fn validate(raw: RawConfig) -> Result<Config, ConfigError> {
        let node_id = match raw.node_id {
            None => return fail("--node-id is required"),
            Some(0) => return fail("--node-id must be a positive integer (0 is reserved)"),
            Some(id) => id,
        };
        let transport = transport(&raw)?;
        let Some(admin_token_file) = raw.admin_token_file.clone() else {
            return fail("--admin-token-file is required: the admin credential for membership and tenants");
        };
        read_admin_token(&admin_token_file).map_err(ConfigError)?;

        let mut initial_members = BTreeMap::new();
        for text in &raw.initial_members {
            let (id, node) = parse_member(text)?;
            if initial_members.insert(id, node).is_some() {
                return fail(format!("initial member id {id} is listed twice"));
            }
        }
        if initial_members.len() > MEMBERS_MAX {
            return fail(format!("{} initial members; at most {MEMBERS_MAX} are supported", initial_members.len()));
        }
        let own_entry = initial_members.get(&node_id).cloned();
        if !initial_members.is_empty() && own_entry.is_none() {
            let ids: Vec<String> = initial_members.keys().map(|id| id.to_string()).collect();
            return fail(format!(
                "unknown node id {node_id}: it is not among the initial members ({}); \
                 a node that joins later is started without --initial-member",
                ids.join(", ")
            ));
        }
        let client_addr = match (raw.client_addr, &own_entry) {
            (Some(address), Some(entry)) if address != entry.client_addr => {
                return fail(format!(
                    "--client-addr {address} differs from this node's initial member entry ({})",
                    entry.client_addr
                ))
            }
            (Some(address), _) => address,
            (None, Some(entry)) => entry.client_addr.clone(),
            (None, None) => return fail("--client-addr is required for a node that is not an initial member"),
        };
        let peer_addr = match (raw.peer_addr, &own_entry) {
            (Some(address), Some(entry)) if address != entry.peer_addr => {
                return fail(format!(
                    "--peer-addr {address} differs from this node's initial member entry ({})",
                    entry.peer_addr
                ))
            }
            (Some(address), _) => address,
            (None, Some(entry)) => entry.peer_addr.clone(),
            (None, None) => return fail("--peer-addr is required for a node that is not an initial member"),
        };
        let client_bind = resolve("--client-addr", &client_addr)?;
        let peer_bind = match &raw.test_peer_listen_addr {
            Some(listen) => resolve("--test-peer-listen-addr", listen)?,
            None => resolve("--peer-addr", &peer_addr)?,
        };
        if client_bind == peer_bind {
            return fail(format!("the client and peer addresses must differ (both are {client_addr})"));
        }
        let mut seen = BTreeMap::new();
        for (id, node) in &initial_members {
            for address in [&node.client_addr, &node.peer_addr] {
                if let Some(other) = seen.insert(address.clone(), *id) {
                    return fail(format!(
                        "address {address} is used twice in the initial members (nodes {other} and {id})"
                    ));
                }
            }
        }

        let Some(data_dir) = raw.data_dir else {
            return fail("--data-dir is required");
        };

        let cluster_name = raw.cluster_name.unwrap_or_else(|| CLUSTER_NAME_DEFAULT.to_string());
        if cluster_name.is_empty() || cluster_name.len() > CLUSTER_NAME_BYTES_MAX {
            return fail(format!("--cluster-name must be 1 to {CLUSTER_NAME_BYTES_MAX} bytes"));
        }
        if !cluster_name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.') {
            return fail(format!("--cluster-name {cluster_name:?} may contain only letters, digits, '-', '_' and '.'"));
        }

        let heartbeat_ms = raw.heartbeat_ms.unwrap_or(HEARTBEAT_MS_DEFAULT);
        let election_timeout_min_ms = raw.election_timeout_min_ms.unwrap_or(ELECTION_TIMEOUT_MIN_MS_DEFAULT);
        let election_timeout_max_ms = raw
            .election_timeout_max_ms
            .unwrap_or_else(|| election_timeout_min_ms.max(ELECTION_TIMEOUT_MAX_MS_DEFAULT / 2) * 2);
        if heartbeat_ms < HEARTBEAT_MS_MIN {
            return fail(format!("--heartbeat-ms {heartbeat_ms} is below the minimum of {HEARTBEAT_MS_MIN}"));
        }
        if election_timeout_min_ms <= heartbeat_ms {
            return fail(format!(
                "the election timeout ({election_timeout_min_ms} ms) must be above the heartbeat interval \
                 ({heartbeat_ms} ms), or followers start elections against a live leader"
            ));
        }
        if election_timeout_max_ms <= election_timeout_min_ms {
            return fail(format!(
                "--election-timeout-max-ms ({election_timeout_max_ms}) must be above \
                 --election-timeout-min-ms ({election_timeout_min_ms})"
            ));
        }
        if election_timeout_max_ms > ELECTION_TIMEOUT_MS_MAX {
            return fail(format!("--election-timeout-max-ms is above the maximum of {ELECTION_TIMEOUT_MS_MAX}"));
        }
        let snapshot_every_entries = raw.snapshot_every_entries.unwrap_or(SNAPSHOT_EVERY_ENTRIES_DEFAULT);
        if snapshot_every_entries < SNAPSHOT_EVERY_ENTRIES_MIN {
            return fail(format!(
                "--snapshot-every-entries {snapshot_every_entries} is below the minimum of {SNAPSHOT_EVERY_ENTRIES_MIN}"
            ));
        }
        let metrics_bind = match &raw.metrics_addr {
            Some(address) => Some(resolve("--metrics-addr", address)?),
            None => None,
        };
        if let Some(file) = &raw.metrics_token_file {
            if metrics_bind.is_none() {
                return fail("--metrics-token-file was given without --metrics-addr");
            }
            read_token_file("scrape", file).map_err(ConfigError)?;
        } else if metrics_bind.is_some() && !raw.insecure_plaintext {
            return fail(
                "--metrics-addr needs --metrics-token-file: the metrics are served over HTTPS to a scraper that \
                 sends that token (make one with `leasehold new-token --prefix scrape`)",
            );
        }
        let status_bind = match &raw.status_addr {
            Some(address) => Some(resolve("--status-addr", address)?),
            None => None,
        };
        let worker_threads = match raw.worker_threads {
            None => std::thread::available_parallelism().map(|cores| cores.get()).unwrap_or(1),
            Some(threads) if (1..=WORKER_THREADS_MAX).contains(&threads) => threads,
            Some(threads) => {
                return fail(format!("--worker-threads {threads} is not between 1 and {WORKER_THREADS_MAX}"))
            }
        };

        let state_budget_bytes = raw.state_budget_bytes.unwrap_or(STATE_BUDGET_BYTES_DEFAULT);
        if state_budget_bytes < STATE_BUDGET_BYTES_MIN {
            return fail(format!(
                "--state-budget-bytes {state_budget_bytes} is below the minimum of {STATE_BUDGET_BYTES_MIN}"
            ));
        }

        let tenant_queue_max = raw.tenant_queue_max.unwrap_or(TENANT_QUEUED_MAX_DEFAULT);
        if !(1..=PROPOSALS_QUEUED_MAX).contains(&tenant_queue_max) {
            return fail(format!("--tenant-queue-max {tenant_queue_max} is not between 1 and {PROPOSALS_QUEUED_MAX}"));
        }

        let command_level = match raw.test_command_level {
            None => COMMAND_LEVEL,
            Some(level) if level <= COMMAND_LEVEL => level,
            Some(level) => {
                return fail(format!(
                    "--test-command-level {level} is above this build's command level {COMMAND_LEVEL}"
                ))
            }
        };

        Ok(Config {
            node_id,
            client_addr,
            peer_addr,
            client_bind,
            peer_bind,
            data_dir,
            cluster_name,
            initial_members,
            heartbeat_ms,
            election_timeout_min_ms,
            election_timeout_max_ms,
            snapshot_every_entries,
            metrics_bind,
            metrics_token_file: raw.metrics_token_file.clone(),
            metrics_per_tenant: raw.metrics_per_tenant,
            probes_without_token: raw.probes_without_token,
            status_bind,
            worker_threads,
            test_clock_knob: raw.test_clock_knob,
            transport,
            admin_token_file,
            state_budget_bytes,
            disk_reserve_bytes: raw.disk_reserve_bytes.unwrap_or(DISK_RESERVE_BYTES_DEFAULT),
            tenant_queue_max,
            new_incarnation: raw.new_incarnation,
            test_accept_any_incarnation: raw.test_accept_any_incarnation,
            test_full_ttl_restart: raw.test_full_ttl_restart,
            test_short_lease_restart: raw.test_short_lease_restart,
            test_believe_latest_incarnation: raw.test_believe_latest_incarnation,
            test_keep_learner_on_add: raw.test_keep_learner_on_add,
            test_stream_outlives_rotation: raw.test_stream_outlives_rotation,
            command_level,
            test_panic_on_lock: raw.test_panic_on_lock,
            test_disk_knob: raw.test_disk_knob,
            lock_delay_defaults: lock_delay_defaults(&raw.lock_delay_defaults)?,
            watches: crate::shell::watched::parse(&raw.watches, LOCK_NAME_BYTES_MAX, crate::machine::is_tenant_label)
                .map_err(ConfigError)?,
        })
    }

    pub fn raft_config(&self) -> openraft::Config {
        openraft::Config {
            cluster_name: self.cluster_name.clone(),
            heartbeat_interval: self.heartbeat_ms,
            election_timeout_min: self.election_timeout_min_ms,
            election_timeout_max: self.election_timeout_max_ms,
            snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(self.snapshot_every_entries),
            // Keep enough log behind a snapshot that a follower installing it can
            // still catch up from the log instead of needing another snapshot.
            max_in_snapshot_log_to_keep: self.snapshot_every_entries,
            install_snapshot_timeout: 2_000,
            snapshot_max_chunk_size: 1024 * 1024,
            max_payload_entries: 1_000,
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn three_members() -> Vec<String> {
        (1..=3).map(|id| format!("{id}=127.0.0.1:71{id:02},127.0.0.1:72{id:02}")).collect()
    }

    /// A file holding `text`, kept for the rest of the test process.
    fn file_with(text: &str) -> PathBuf {
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), text).unwrap();
        file.into_temp_path().keep().unwrap()
    }

    fn raw(node_id: u64) -> RawConfig {
        RawConfig {
            node_id: Some(node_id),
            data_dir: Some("/tmp/unused".into()),
            initial_members: three_members(),
            insecure_plaintext: true,
            admin_token_file: Some(file_with("an-admin-token-of-enough-bytes\n")),
            ..Default::default()
        }
    }

    #[test]
    fn addresses_come_from_the_initial_member_entry() {
        let config = Config::validate(raw(2)).unwrap();
        assert_eq!(config.client_addr, "127.0.0.1:7102");
        assert_eq!(config.peer_addr, "127.0.0.1:7202");
        assert_eq!(config.initial_members.len(), 3);
    }

    #[test]
    fn worker_threads_default_to_the_cores_and_a_given_count_is_kept() {
        let cores = std::thread::available_parallelism().map(|cores| cores.get()).unwrap_or(1);
        assert_eq!(Config::validate(raw(1)).unwrap().worker_threads, cores);
        let given = RawConfig { worker_threads: Some(1), ..raw(1) };
        assert_eq!(Config::validate(given).unwrap().worker_threads, 1);
        let from_file = RawConfig::default().merged_over(RawConfig { worker_threads: Some(3), ..raw(1) });
        assert_eq!(from_file.worker_threads, Some(3));
    }

    #[test]
    fn each_broken_rule_is_named() {
        let cases: Vec<(RawConfig, &str)> = vec![
            (raw(7), "unknown node id 7"),
            (RawConfig { node_id: Some(0), ..raw(1) }, "positive integer"),
            (
                RawConfig { heartbeat_ms: Some(500), election_timeout_min_ms: Some(400), ..raw(1) },
                "above the heartbeat",
            ),
            (
                RawConfig { election_timeout_min_ms: Some(800), election_timeout_max_ms: Some(700), ..raw(1) },
                "must be above",
            ),
            (RawConfig { data_dir: None, ..raw(1) }, "--data-dir is required"),
            (RawConfig { initial_members: vec!["x=1".into()], ..raw(1) }, "ID=CLIENT_ADDR,PEER_ADDR"),
            (RawConfig { cluster_name: Some("a b".into()), ..raw(1) }, "may contain only"),
            (RawConfig { client_addr: Some("127.0.0.1:9999".into()), ..raw(1) }, "differs from"),
            (RawConfig { snapshot_every_entries: Some(1), ..raw(1) }, "below the minimum"),
            (RawConfig { worker_threads: Some(0), ..raw(1) }, "--worker-threads 0 is not between 1"),
            (RawConfig { worker_threads: Some(WORKER_THREADS_MAX + 1), ..raw(1) }, "--worker-threads"),
            (RawConfig { tenant_queue_max: Some(0), ..raw(1) }, "--tenant-queue-max 0 is not between 1"),
            (RawConfig { insecure_plaintext: false, ..raw(1) }, "TLS needs --tls-cert, --tls-key, --peer-cert"),
            (
                RawConfig { tls_cert: Some("/etc/hostname".into()), ..raw(1) },
                "--tls-cert was given with --insecure-plaintext",
            ),
            (
                RawConfig {
                    insecure_plaintext: false,
                    tls_cert: Some("/nonexistent/node.pem".into()),
                    tls_key: Some("/nonexistent/node.key".into()),
                    peer_cert: Some("/nonexistent/node.pem".into()),
                    peer_key: Some("/nonexistent/node.key".into()),
                    peer_ca: Some("/nonexistent/ca.pem".into()),
                    ..raw(1)
                },
                "client port TLS: /nonexistent/node.pem",
            ),
            (RawConfig { admin_token_file: None, ..raw(1) }, "--admin-token-file is required"),
            (RawConfig { admin_token_file: Some(file_with("short\n")), ..raw(1) }, "must be 16 to"),
            (RawConfig { admin_token_file: Some("/nonexistent/admin".into()), ..raw(1) }, "cannot read the admin"),
        ];
        for (config, expected) in cases {
            let error = Config::validate(config).unwrap_err();
            assert!(error.0.contains(expected), "{:?} does not mention {expected:?}", error.0);
        }
    }
}
