//! One node as turmoil host software: the real `node::start`, in an environment the
//! simulator makes (its clock, a seeded entropy, blocking work inline, the in-memory
//! disk, turmoil's network). turmoil runs the software again after a crash; the disk
//! and the data directory (the node's identity) outlive it, as they would a process.
//! When the node stops itself (a stale incarnation, a build too old, a fatal Raft
//! error, its removal), the code is kept for the simulator, which takes the host down.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use leasehold_server::node::config::{Config, RawConfig};
use leasehold_server::node::environment::Reloads;
use leasehold_server::node::{self, Environment};
use leasehold_server::raft::blocking::Blocking;
use leasehold_server::raft::memory_disk::MemoryDisk;
use leasehold_server::raft::replica::Replica;
use leasehold_server::shell::clock::{Clock, TimeSource};
use leasehold_server::shell::entropy::Entropy;
use leasehold_server::shell::fail_stop::Exit;

use tokio::sync::Notify;

use crate::network::SimulatedSockets;

/// The port of every node's client service; peers are on `PEER_PORT`.
pub const CLIENT_PORT: u16 = 7001;
pub const PEER_PORT: u16 = 7002;
/// Milliseconds since the Unix epoch at which every simulation starts (2026-12-01).
pub const EPOCH_UNIX_MS: u64 = 1_796_083_200_000;

/// Node `id`'s address on turmoil's network (never an address of this machine).
pub fn node_ip(id: u64) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(192, 168, 70, id as u8))
}

/// Worker `process`'s address on turmoil's network.
pub fn worker_ip(process: u64) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(192, 168, 71, process as u8))
}

/// The operator's address on turmoil's network (`operator`).
pub fn operator_ip() -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(192, 168, 72, 1))
}

/// The address of the host whose tenant token leaks (`revocation`).
pub fn tenant_ip() -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(192, 168, 73, 1))
}

/// Node `id`'s client endpoint, `ip:port`.
pub fn client_endpoint(id: u64) -> String {
    format!("{}:{CLIENT_PORT}", node_ip(id))
}

/// Time as the simulator drives it: one boot per node for the whole run, the wall
/// clock starting at `EPOCH_UNIX_MS`.
struct SimulatedTime;

fn elapsed_ms() -> u64 {
    turmoil::sim_elapsed().unwrap_or_default().as_millis() as u64
}

impl TimeSource for SimulatedTime {
    fn monotonic_ms(&self) -> u64 {
        elapsed_ms()
    }

    fn unix_ms(&self) -> u64 {
        EPOCH_UNIX_MS + elapsed_ms()
    }

    fn boot_id(&self) -> Option<String> {
        Some("simulated".to_string())
    }

    fn boot_ms(&self) -> u64 {
        elapsed_ms()
    }
}

/// What a node keeps across its crashes: its disk, data directory and configuration.
pub struct SimulatedNode {
    pub id: u64,
    pub disk: Arc<MemoryDisk>,
    /// The node's clock for its whole run: the clock fault skews it.
    pub clock: Clock,
    /// The running node's replica, for the white-box checks between steps; None
    /// while the node is down.
    pub replica: Mutex<Option<Arc<Replica>>>,
    /// The code and message of the node's last stop of itself, until the simulator
    /// takes it (0: removed from the cluster).
    pub exited: Mutex<Option<(i32, String)>>,
    /// Tells the running node to read its admin token and certificates again (the
    /// simulator's SIGHUP).
    pub reloads: Arc<Notify>,
    /// Tells the running node to stop as SIGTERM stops it: it shuts down and
    /// reports code 0.
    terminate: Notify,
    config: Mutex<Config>,
    seed: u64,
    /// Starts so far, so that each start draws other random choices.
    starts: AtomicU64,
}

/// The admin credential every node of a simulation accepts.
pub const ADMIN_TOKEN: &str = "simulated-admin-token-0123456789";

impl SimulatedNode {
    /// Node `id` of `members` nodes, its data directory under `root`; `plant` sets the
    /// test-only flags of a planted bug (`run::Bug`).
    pub fn new(
        id: u64,
        members: u64,
        root: &Path,
        seed: u64,
        plant: &dyn Fn(&mut RawConfig),
    ) -> anyhow::Result<SimulatedNode> {
        let admin_token_file = root.join("admin-token");
        if !admin_token_file.exists() {
            std::fs::write(&admin_token_file, format!("{ADMIN_TOKEN}\n"))?;
        }
        let data_dir: PathBuf = root.join(format!("node{id}"));
        let mut raw = RawConfig {
            node_id: Some(id),
            data_dir: Some(data_dir),
            cluster_name: Some("simulated".into()),
            initial_members: (1..=members)
                .map(|member| format!("{member}={}:{CLIENT_PORT},{}:{PEER_PORT}", node_ip(member), node_ip(member)))
                .collect(),
            insecure_plaintext: true,
            admin_token_file: Some(admin_token_file),
            ..Default::default()
        };
        plant(&mut raw);
        let mut config = Config::validate(raw).map_err(|error| anyhow::anyhow!("node {id}: {}", error.0))?;
        // turmoil's listeners bind the unspecified address.
        config.client_bind = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), CLIENT_PORT);
        config.peer_bind = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), PEER_PORT);
        Ok(SimulatedNode {
            id,
            disk: Arc::new(MemoryDisk::new()),
            clock: Clock::driven(Arc::new(SimulatedTime)),
            replica: Mutex::new(None),
            exited: Mutex::new(None),
            reloads: Arc::new(Notify::new()),
            terminate: Notify::new(),
            config: Mutex::new(config),
            seed,
            starts: AtomicU64::new(0),
        })
    }

    /// How the node's next start runs: as a new incarnation waiting to be added (or
    /// not), speaking for a build at command `level`.
    pub fn next_start(&self, new_incarnation: bool, level: u32) {
        let mut config = self.config.lock().unwrap();
        config.new_incarnation = new_incarnation;
        config.command_level = level;
    }

    /// The command level of the build the node's next start speaks for.
    pub fn level(&self) -> u32 {
        self.config.lock().unwrap().command_level
    }

    /// The node's data directory and disk emptied (the host is down): a replaced disk.
    pub fn wipe(&self) -> std::io::Result<()> {
        self.disk.wipe();
        let data_dir = self.config.lock().unwrap().data_dir.clone();
        std::fs::remove_dir_all(&data_dir)?;
        std::fs::create_dir_all(&data_dir)
    }

    /// The node's software: starts it and serves until turmoil crashes the host, or
    /// until the node is removed from the cluster.
    pub async fn serve(self: Arc<Self>) -> turmoil::Result {
        let start = self.starts.fetch_add(1, Ordering::SeqCst);
        let reporter = self.clone();
        let environment = Environment {
            clock: self.clock.clone(),
            entropy: Arc::new(Entropy::seeded(self.seed ^ (self.id << 48) ^ (start << 32))),
            blocking: Blocking::Inline,
            disk: Some(self.disk.clone()),
            sockets: Some(Arc::new(SimulatedSockets)),
            exit: Exit::Report(Arc::new(move |code, message: &str| reporter.stopped(code, message))),
            reloads: Reloads::Notified(self.reloads.clone()),
        };
        let config = self.config.lock().unwrap().clone();
        let mut running = node::start(config, environment)
            .await
            .map_err(|error| format!("node {} did not start: {error}", self.id))?;
        *self.replica.lock().unwrap() = Some(running.replica.clone());
        let why = tokio::select! {
            _ = running.retired() => "removed from the cluster",
            _ = self.terminate.notified() => "stopped as SIGTERM stops it",
        };
        *self.replica.lock().unwrap() = None;
        running.shutdown().await;
        self.stopped(0, why);
        Ok(())
    }

    /// Stops the running node as SIGTERM does (a rolling upgrade's stop).
    pub fn terminate(&self) {
        self.terminate.notify_one();
    }

    /// Keeps the first stop the node reports until the simulator takes it.
    fn stopped(&self, code: i32, message: &str) {
        let mut exited = self.exited.lock().unwrap();
        if exited.is_none() {
            *exited = Some((code, message.to_string()));
        }
    }
}
