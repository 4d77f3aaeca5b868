//! Assembles and runs one Leasehold node: listeners, data directory, RocksDB,
//! openraft, the gRPC services, the lease timers and the metrics endpoint.
//!
//! Start-up order matters for "a bad start changes nothing": the configuration is
//! already valid, then the listeners are bound (a port in use fails here), then the
//! data directory is inspected, and only then is anything written.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use leasehold_proto::admin_server::AdminServer;
use leasehold_proto::elections_server::ElectionsServer;
use leasehold_proto::leasehold_server::LeaseholdServer;
use leasehold_proto::peer_server::PeerServer;
use leasehold_proto::semaphores_server::SemaphoresServer;
use openraft::metrics::WaitError;
use openraft::{ServerState, Vote};
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::api::admin_service::AdminService;
use crate::api::auth::Auth;
use crate::api::elections_service::ElectionsService;
use crate::api::leasehold_service::LeaseholdService;
use crate::api::lock_delay::LockDelayPolicy;
use crate::api::semaphores_service::SemaphoresService;
use crate::machine::{ClusterRecord, Command};
use crate::node::config::{Config, Transport};
use crate::node::data_dir::{self, Claim};
use crate::node::environment::{Environment, Reloads};
use crate::node::metrics;
use crate::node::status::StatusPage;
use crate::raft::disk::Disk;
use crate::raft::incarnations::{
    too_old_message, Incarnations, COMMAND_LEVEL, COMMAND_LEVEL_CHECKPOINT, EXIT_BUILD_TOO_OLD,
};
use crate::raft::log_store::LogStore;
use crate::raft::network::{Dialing, Network, PEER_MESSAGE_BYTES_MAX};
use crate::raft::peer_probes;
use crate::raft::peer_service::{PeerService, Takeover};
use crate::raft::replica::Replica;
use crate::raft::state_machine_store::StateMachineStore;
use crate::raft::storage;
use crate::raft::types::{Node, NodeId, Raft};
use crate::shell::clock::LogLimiter;
use crate::shell::disk::{DiskSpace, SyncTimes, DISK_CHECK_INTERVAL_MS};
use crate::shell::entropy::Entropy;
use crate::shell::fail_stop::{Essential, Exit};
use crate::shell::lock_delays::LockDelays;
use crate::shell::peer_contacts::PeerContacts;
use crate::shell::session_deadlines::{SessionDeadlines, EXPIRY_SCAN_INTERVAL_MS};
use crate::shell::sockets::{self, Listener, Sockets};
use crate::shell::sources::SourceLimits;
use crate::shell::tls::{tls_incoming, ClientCertificates, NodeTls, PeerClientTls, ServerTls};
use crate::shell::watched::WatchedGrants;

/// Why a node did not start; each kind has its exit code (see `exit_code`).
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A port in use, a file that cannot be read, Raft that does not start.
    #[error("{0}")]
    Failed(String),
    /// The data directory is refused, and left as it was: another cluster's or node's,
    /// not Leasehold's, corrupt, in another format, or not empty with --new-incarnation.
    #[error("{0}")]
    DataDirectory(String),
    /// The data directory's log used commands this build cannot apply; it is left as
    /// it was for a newer build.
    #[error("{0}")]
    BuildTooOld(String),
}

/// The exit code of a node whose data directory was refused at start.
pub const EXIT_DATA_DIRECTORY_REFUSED: u8 = 3;

impl StartError {
    pub fn exit_code(&self) -> u8 {
        match self {
            StartError::Failed(_) => 1,
            StartError::DataDirectory(_) => EXIT_DATA_DIRECTORY_REFUSED,
            StartError::BuildTooOld(_) => EXIT_BUILD_TOO_OLD as u8,
        }
    }
}

/// A node that is running; dropping it does not stop it, `shutdown` does.
pub struct RunningNode {
    pub replica: Arc<Replica>,
    pub client_addr: SocketAddr,
    pub peer_addr: SocketAddr,
    pub metrics_addr: Option<SocketAddr>,
    pub status_addr: Option<SocketAddr>,
    stop: watch::Sender<bool>,
    retired: watch::Receiver<bool>,
    tasks: Vec<JoinHandle<()>>,
}

fn bind(what: &str, address: SocketAddr) -> Result<tokio::net::TcpListener, StartError> {
    let listener = std::net::TcpListener::bind(address)
        .map_err(|error| StartError::Failed(format!("cannot listen on the {what} address {address}: {error}")))?;
    listener.set_nonblocking(true).map_err(|error| StartError::Failed(format!("{what} listener: {error}")))?;
    tokio::net::TcpListener::from_std(listener).map_err(|error| StartError::Failed(format!("{what} listener: {error}")))
}

/// What one source address may hold on the client port: clients behind one NAT
/// share an address, so it allows many connections, and a burst of handshakes past
/// 128 is closed at once (the client library connects again); half of the port's
/// handshake slots stay for other addresses.
pub const CLIENT_PORT_SOURCE_LIMITS: SourceLimits = SourceLimits { handshakes: 128, connections: 4_096 };
/// What one source address may hold on the peer port: a peer keeps a few connections.
pub const PEER_PORT_SOURCE_LIMITS: SourceLimits = SourceLimits { handshakes: 16, connections: 256 };

/// A bound client or peer listener: the operating system's, or a simulator's.
enum Bound {
    Os(tokio::net::TcpListener),
    Simulated(Box<dyn Listener>),
}

impl Bound {
    async fn bind(what: &str, address: SocketAddr, sockets: &Option<Arc<dyn Sockets>>) -> Result<Bound, StartError> {
        match sockets {
            None => bind(what, address).map(Bound::Os),
            Some(sockets) => {
                sockets.bind(address).await.map(Bound::Simulated).map_err(|error| {
                    StartError::Failed(format!("cannot listen on the {what} address {address}: {error}"))
                })
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        match self {
            Bound::Os(listener) => listener.local_addr(),
            Bound::Simulated(listener) => listener.local_addr(),
        }
    }

    /// Serves `server` on this listener until `shutdown`, through TLS when `tls`, each
    /// source address held to `limits`.
    async fn serve(
        self,
        server: tonic::transport::server::Router,
        tls: Option<Arc<ServerTls>>,
        limits: SourceLimits,
        shutdown: impl std::future::Future<Output = ()>,
    ) -> Result<(), tonic::transport::Error> {
        match (self, tls) {
            (Bound::Os(listener), Some(tls)) => {
                server.serve_with_incoming_shutdown(tls_incoming(listener, tls, limits), shutdown).await
            }
            (Bound::Os(listener), None) => server.serve_with_incoming_shutdown(accepting(listener), shutdown).await,
            (Bound::Simulated(listener), _) => {
                server.serve_with_incoming_shutdown(sockets::incoming(listener), shutdown).await
            }
        }
    }
}

/// Starts a node on `config`, in `environment` (`Environment::os` for a node that
/// serves clients).
pub async fn start(config: Config, environment: Environment) -> Result<RunningNode, StartError> {
    let Environment { clock, entropy, blocking, disk, sockets, exit, reloads } = environment;
    if sockets.is_some()
        && (!config.transport.is_plaintext() || config.metrics_bind.is_some() || config.status_bind.is_some())
    {
        return Err(StartError::Failed(
            "a simulated network serves the client and peer ports in plaintext, and no metrics or status page".into(),
        ));
    }
    let client_listener = Bound::bind("client", config.client_bind, &sockets).await?;
    let peer_listener = Bound::bind("peer", config.peer_bind, &sockets).await?;
    let metrics_listener = match config.metrics_bind {
        Some(address) => Some(bind("metrics", address)?),
        None => None,
    };
    let status_listener = match config.status_bind {
        Some(address) => Some(bind("status page", address)?),
        None => None,
    };
    let client_addr = client_listener.local_addr().map_err(|error| StartError::Failed(error.to_string()))?;
    let peer_addr = peer_listener.local_addr().map_err(|error| StartError::Failed(error.to_string()))?;

    let refused = |error: String| StartError::DataDirectory(error);
    let claim = data_dir::inspect(&config.data_dir, &config.cluster_name, config.node_id)
        .map_err(|error| refused(error.to_string()))?;
    let fresh = claim == Claim::Fresh;
    let identity = match claim {
        Claim::Fresh => data_dir::claim(&config.data_dir, &config.cluster_name, config.node_id, &entropy),
        Claim::Existing(_) if config.new_incarnation => {
            return Err(refused(format!(
                "--new-incarnation starts a node on an empty data directory, and {} holds node {}'s data; \
                 drop the flag to restart the node with its data",
                config.data_dir.display(),
                config.node_id,
            )))
        }
        Claim::Existing(identity) => data_dir::with_incarnation(&config.data_dir, identity, &entropy),
    }
    .map_err(|error| refused(error.to_string()))?;
    if let Some(mode) = data_dir::make_private(&config.data_dir).map_err(|error| refused(error.to_string()))? {
        tracing::warn!(
            data_dir = %config.data_dir.display(),
            was = format!("{mode:o}"),
            now = format!("{:o}", data_dir::DATA_DIR_MODE),
            "the data directory was open to others and is now its owner's only: it holds token and secret hashes \
             and every tenant's names"
        );
    }
    let disk: Arc<dyn Disk> = match disk {
        Some(disk) => {
            // The simulator's disk holds the database; the directory is made as RocksDB
            // would make it, so that the data directory reads as a node's at a restart.
            std::fs::create_dir_all(config.data_dir.join(data_dir::DATABASE_DIR))
                .map_err(|error| refused(format!("data directory {}: {error}", config.data_dir.display())))?;
            disk
        }
        None => storage::open(&config.data_dir.join(data_dir::DATABASE_DIR), fresh)
            .map_err(|error| refused(format!("data directory {}: {error}", config.data_dir.display())))?,
    };

    let deadlines = SessionDeadlines::new(clock.clone());
    let state_machine = StateMachineStore::open(disk.clone(), deadlines, LockDelays::new(clock.clone()), blocking)
        .map_err(|error| refused(format!("data directory {}: {error}", config.data_dir.display())))?;
    let shared = state_machine.shared();
    let loaded_cluster_id = shared.cluster_record.borrow().cluster_id;
    if let (Some(mine), Some(loaded)) = (identity.cluster_id(), loaded_cluster_id) {
        if mine != loaded {
            return Err(refused(format!(
                "data directory {}: its identity names the cluster with id {}, but its log the cluster with id {}",
                config.data_dir.display(),
                data_dir::cluster_id_text(mine),
                data_dir::cluster_id_text(loaded)
            )));
        }
    }
    let log_level = *shared.log_command_level.borrow();
    if log_level > config.command_level {
        return Err(StartError::BuildTooOld(format!(
            "data directory {}: {}",
            config.data_dir.display(),
            too_old_message(log_level, config.command_level, "its log")
        )));
    }
    let _ = shared.watched.set(WatchedGrants::new(&config.watches));
    if let Some(name) = &config.test_panic_on_lock {
        tracing::warn!(name, "--test-panic-on-lock: applying an acquire of this lock panics");
        let _ = shared.test_panic_on_lock.set(name.clone());
    }
    let incarnations = Incarnations::new(
        config.node_id,
        identity.incarnation(),
        shared.cluster_record.subscribe(),
        shared.applied_index.subscribe(),
        shared.log_command_level.subscribe(),
        exit.clone(),
    );
    let incarnations = if config.command_level < COMMAND_LEVEL {
        tracing::warn!(level = config.command_level, "--test-command-level: speaking for an older build");
        incarnations.at_level(config.command_level)
    } else {
        incarnations
    };
    let incarnations = if config.test_accept_any_incarnation {
        tracing::warn!(
            "--test-accept-any-incarnation: a node whose data directory was wiped counts as the member it was"
        );
        incarnations.unchecked()
    } else {
        incarnations
    };
    let incarnations = if config.new_incarnation { incarnations.joining() } else { incarnations };
    let incarnations = if config.test_believe_latest_incarnation {
        tracing::warn!("--test-believe-latest-incarnation: a member wiped before it is recorded is taken back");
        incarnations.believing_latest()
    } else {
        incarnations
    };
    if config.test_keep_learner_on_add {
        tracing::warn!("--test-keep-learner-on-add: a learner added again keeps its recorded incarnation");
    }
    let disk_knob = config.test_disk_knob.then(|| disk.clone());
    let log_syncs = Arc::new(SyncTimes::default());
    let log_store = LogStore::new(disk, blocking, log_syncs.clone());
    let raft_config =
        config.raft_config().validate().map_err(|error| StartError::Failed(format!("raft configuration: {error}")))?;
    let peer_client = match &config.transport {
        Transport::Plaintext => None,
        Transport::Tls { peer_port, .. } => Some(PeerClientTls::load(peer_port.clone()).map_err(StartError::Failed)?),
    };
    let contacts = Arc::new(PeerContacts::default());
    let dialing = match (&sockets, &peer_client) {
        (Some(sockets), _) => Dialing::Simulated(sockets.clone()),
        (None, Some(tls)) => Dialing::Tls(tls.clone()),
        (None, None) => Dialing::Plaintext,
    };
    let network = Network::new(
        Some(config.peer_bind.ip()),
        &config.cluster_name,
        dialing,
        incarnations.clone(),
        contacts.clone(),
    );
    let raft = Raft::new(config.node_id, Arc::new(raft_config), network.clone(), log_store, state_machine)
        .await
        .map_err(|error| StartError::Failed(format!("cannot start raft: {error}")))?;

    incarnations.set_raft(raft.clone());

    let initialized = raft.is_initialized().await.map_err(|error| StartError::Failed(error.to_string()))?;
    let first_member = config.initial_members.keys().next().copied();
    // A new incarnation joins like a node added later: it waits to be added.
    let bootstraps = !config.new_incarnation && !config.initial_members.is_empty();
    let bootstraps_now = bootstraps && !initialized && first_member == Some(config.node_id);
    if bootstraps_now {
        bootstrap(&raft, &config.initial_members).await;
    }

    let disk = Arc::new(DiskSpace::new(config.disk_reserve_bytes, log_syncs));
    if let Err(error) = disk.refresh(&config.data_dir) {
        return Err(StartError::Failed(format!(
            "cannot read the free space of {}: {error}",
            config.data_dir.display()
        )));
    }
    let mut auth = Auth::new(config.admin_token_file.clone(), shared.clone()).map_err(StartError::Failed)?;
    if let Some(file) = &config.metrics_token_file {
        auth = auth.with_scrape_token_file(file.clone()).map_err(StartError::Failed)?;
    }
    let auth = if config.test_stream_outlives_rotation {
        tracing::warn!("--test-stream-outlives-rotation: open streams keep a revoked credential working");
        Arc::new(auth.streams_outliving_revocation())
    } else {
        Arc::new(auth)
    };
    let replica = Replica::new(
        raft.clone(),
        shared,
        config.node_id,
        config.cluster_name.clone(),
        clock.clone(),
        config.state_budget_bytes,
        disk.clone(),
        config.tenant_queue_max,
        entropy,
    );
    // A node that does not lead sends a credential it does not know to the leader:
    // it may not have applied the tenant yet.
    let leading = Arc::downgrade(&replica);
    auth.redirect_unknown_credentials(move || {
        let replica = leading.upgrade()?;
        (!replica.is_leader()).then(|| replica.leader_hint())
    });
    let lock_delay = Arc::new(LockDelayPolicy::new(config.lock_delay_defaults.clone(), incarnations.clone()));
    let (stop, stopped) = watch::channel(false);
    let essential = Essential::new(stopped.clone(), exit.clone());
    let (retired_sender, retired) = watch::channel(false);
    let mut tasks = Vec::new();

    let node_tls = match &config.transport {
        Transport::Plaintext => {
            tracing::warn!(
                "--insecure-plaintext: both ports serve without TLS; anyone who can reach them can read and \
                 forge their traffic"
            );
            None
        }
        Transport::Tls { client_port, peer_port } => Some(Arc::new(NodeTls {
            client_port: ServerTls::load("client", client_port.clone(), ClientCertificates::Optional)
                .map_err(StartError::Failed)?,
            peer_port: ServerTls::load("peer", peer_port.clone(), ClientCertificates::Required)
                .map_err(StartError::Failed)?,
            peer_client: peer_client.clone().expect("loaded with the transport"),
            status_port: if status_listener.is_some() {
                Some(ServerTls::load_https("status", client_port).map_err(StartError::Failed)?)
            } else {
                None
            },
            metrics_port: if metrics_listener.is_some() {
                Some(ServerTls::load_https("metrics", client_port).map_err(StartError::Failed)?)
            } else {
                None
            },
        })),
    };
    // Registered before anything could send it: SIGHUP's default action ends the process.
    let requests = match reloads {
        Reloads::Hangup => ReloadRequests::Hangup(
            signal(SignalKind::hangup()).map_err(|error| StartError::Failed(format!("SIGHUP handler: {error}")))?,
        ),
        Reloads::Notified(notify) => ReloadRequests::Notified(notify),
    };
    let hangup_reload = reload_on_hangup(requests, node_tls.clone(), auth.clone(), stopped.clone());
    tasks.push(essential.spawn("SIGHUP reload", hangup_reload));

    let client_server = tonic::transport::Server::builder()
        .tcp_nodelay(true)
        .http2_keepalive_interval(Some(Duration::from_secs(5)))
        .max_concurrent_streams(Some(CLIENT_STREAMS_PER_CONNECTION_MAX))
        .add_service(
            LeaseholdServer::new(LeaseholdService {
                replica: replica.clone(),
                auth: auth.clone(),
                lock_delay: lock_delay.clone(),
            })
            .max_decoding_message_size(CLIENT_MESSAGE_BYTES_MAX),
        )
        .add_service(
            SemaphoresServer::new(SemaphoresService {
                replica: replica.clone(),
                auth: auth.clone(),
                lock_delay: lock_delay.clone(),
            })
            .max_decoding_message_size(CLIENT_MESSAGE_BYTES_MAX),
        )
        .add_service(
            ElectionsServer::new(ElectionsService { replica: replica.clone(), auth: auth.clone() })
                .max_decoding_message_size(CLIENT_MESSAGE_BYTES_MAX),
        )
        .add_service(
            AdminServer::new(AdminService {
                replica: replica.clone(),
                auth: auth.clone(),
                network: network.clone(),
                clock_knob: config.test_clock_knob,
                disk_knob,
                insecure_plaintext: config.transport.is_plaintext(),
                incarnations: incarnations.clone(),
                keep_learner_on_add: config.test_keep_learner_on_add,
            })
            .max_decoding_message_size(CLIENT_MESSAGE_BYTES_MAX),
        );
    let mut stop_client = stopped.clone();
    let client_tls = node_tls.as_ref().map(|tls| tls.client_port.clone());
    tasks.push(essential.spawn("client server", async move {
        let shutdown = async move {
            let _ = stop_client.wait_for(|stop| *stop).await;
        };
        if let Err(error) = client_listener.serve(client_server, client_tls, CLIENT_PORT_SOURCE_LIMITS, shutdown).await
        {
            tracing::error!(%error, "client server stopped");
        }
    }));

    let peer_service = PeerService {
        raft: raft.clone(),
        cluster_name: config.cluster_name.clone(),
        retired: retired_sender.clone(),
        takeover: Takeover::new(config.election_timeout_min_ms, config.election_timeout_max_ms),
        identities_checked: node_tls.is_some(),
        refusals: LogLimiter::new(Duration::from_secs(1)),
        incarnations: incarnations.clone(),
        contacts: contacts.clone(),
        shared: replica.shared.clone(),
        // A node started with --new-incarnation waits to be added by whichever member
        // leads by then, which need not be one of the initial members.
        initial_members: if config.new_incarnation {
            BTreeSet::new()
        } else {
            config.initial_members.keys().copied().collect()
        },
    };
    let peer_server = tonic::transport::Server::builder()
        .tcp_nodelay(true)
        .max_concurrent_streams(Some(PEER_STREAMS_PER_CONNECTION_MAX))
        .add_service(
            PeerServer::new(peer_service)
                .max_decoding_message_size(PEER_MESSAGE_BYTES_MAX)
                .max_encoding_message_size(PEER_MESSAGE_BYTES_MAX),
        );
    let mut stop_peer = stopped.clone();
    let peer_tls = node_tls.as_ref().map(|tls| tls.peer_port.clone());
    tasks.push(essential.spawn("peer server", async move {
        let shutdown = async move {
            let _ = stop_peer.wait_for(|stop| *stop).await;
        };
        if let Err(error) = peer_listener.serve(peer_server, peer_tls, PEER_PORT_SOURCE_LIMITS, shutdown).await {
            tracing::error!(%error, "peer server stopped");
        }
    }));

    let metrics_addr = match metrics_listener {
        Some(listener) => {
            let address = listener.local_addr().ok();
            let tls = node_tls.as_ref().and_then(|tls| tls.metrics_port.clone());
            let (per_tenant, probes_open) = (config.metrics_per_tenant, config.probes_without_token);
            let serve = metrics::serve(
                listener,
                replica.clone(),
                network.round_trips().clone(),
                auth.clone(),
                tls,
                per_tenant,
                probes_open,
                stopped.clone(),
            );
            tasks.push(essential.spawn("metrics server", serve));
            address
        }
        None => None,
    };
    let status_addr = match status_listener {
        Some(listener) => {
            let address = listener.local_addr().ok();
            let page = Arc::new(StatusPage {
                replica: replica.clone(),
                auth: auth.clone(),
                contacts,
                network: network.clone(),
                tls: node_tls.as_ref().and_then(|tls| tls.status_port.clone()),
                refusals: LogLimiter::new(Duration::from_secs(1)),
            });
            tasks.push(essential.spawn("status page", page.serve(listener, stopped.clone())));
            address
        }
        None => None,
    };
    if bootstraps && !initialized && !bootstraps_now {
        let grace = Duration::from_millis(BOOTSTRAP_GRACE_ELECTION_TIMEOUTS * config.election_timeout_max_ms);
        tasks.push(tokio::spawn(bootstrap_unless_reached(raft.clone(), config.initial_members.clone(), grace)));
    }
    if config.test_full_ttl_restart {
        tracing::warn!("--test-full-ttl-restart: no session is checkpointed; a new leader restarts every lease");
    }
    if config.test_short_lease_restart {
        tracing::warn!("--test-short-lease-restart: a new leader restarts every live session at half its TTL");
        replica.shared.deadlines.shorten_restarts_for_tests();
    }
    let checkpoints = !config.test_full_ttl_restart;
    let expiry = run_expiry(replica.clone(), incarnations.clone(), checkpoints, stopped.clone());
    tasks.push(essential.spawn("expiry", expiry));
    tasks.push(essential.spawn("Raft watch", stop_on_fatal(raft.clone(), stopped.clone(), exit.clone())));
    tasks.push(essential.spawn("disk watch", watch_disk(disk, config.data_dir.clone(), stopped.clone())));
    // Not essential: the round trips are shown and judged, never needed.
    tasks.push(tokio::spawn(peer_probes::run(raft.clone(), network.clone(), stopped.clone())));
    let recorder = record_members(
        replica.clone(),
        incarnations.clone(),
        config.data_dir.clone(),
        identity.clone(),
        stopped.clone(),
    );
    tasks.push(essential.spawn("member recorder", recorder));
    // Not essential: it ends when this node is removed from the cluster, which stops
    // the node through `retired`.
    tasks.push(tokio::spawn(watch_membership(
        raft.clone(),
        config.node_id,
        incarnations.incarnation(),
        replica.shared.cluster_record.subscribe(),
        retired_sender,
        stopped,
    )));

    tracing::info!(
        node_id = config.node_id,
        %client_addr,
        %peer_addr,
        status_addr = ?status_addr,
        tls = !config.transport.is_plaintext(),
        data_dir = %config.data_dir.display(),
        incarnation = incarnations.incarnation(),
        cluster = %config.cluster_name,
        worker_threads = config.worker_threads,
        "node started"
    );
    Ok(RunningNode { replica, client_addr, peer_addr, metrics_addr, status_addr, stop, retired, tasks })
}

impl RunningNode {
    /// Resolves when the leader removed this node from the cluster.
    pub async fn retired(&mut self) {
        let _ = self.retired.wait_for(|retired| *retired).await;
    }

    pub async fn shutdown(self) {
        self.stop.send_replace(true);
        if let Err(error) = self.replica.raft.shutdown().await {
            tracing::warn!(?error, "raft shutdown");
        }
        // The servers wait for their open streams (keepalives, observers) to end, which
        // they do not on their own: every task gets the same 2 s, at once, rather than
        // 2 s each in turn.
        let _ = tokio::time::timeout(SHUTDOWN_WAIT, futures::future::join_all(self.tasks)).await;
    }
}

/// How long a stopping node waits for its tasks (servers draining their streams).
const SHUTDOWN_WAIT: Duration = Duration::from_secs(2);

/// HTTP/2 streams (concurrent RPCs) one client connection may have open.
pub const CLIENT_STREAMS_PER_CONNECTION_MAX: u32 = 1_024;
/// A client request decoded at most: the largest is far below (names of 256 bytes,
/// election values of 1 KiB), so a bigger one is refused before it is read whole.
pub const CLIENT_MESSAGE_BYTES_MAX: usize = 64 * 1024;
/// HTTP/2 streams one peer connection may have open (replication, votes, snapshots).
pub const PEER_STREAMS_PER_CONNECTION_MAX: u32 = 64;

/// Re-reads the certificates, keys and CAs, and the admin token, on SIGHUP. New
/// handshakes use them; open connections keep theirs, so no session is dropped. A set
/// of files that does not load changes nothing.
/// The reload requests a running node waits for.
enum ReloadRequests {
    Hangup(Signal),
    Notified(Arc<tokio::sync::Notify>),
}

impl ReloadRequests {
    /// The next request; false once no more can come.
    async fn next(&mut self) -> bool {
        match self {
            ReloadRequests::Hangup(hangups) => hangups.recv().await.is_some(),
            ReloadRequests::Notified(notify) => {
                notify.notified().await;
                true
            }
        }
    }
}

async fn reload_on_hangup(
    mut requests: ReloadRequests,
    tls: Option<Arc<NodeTls>>,
    auth: Arc<Auth>,
    mut stopped: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            requested = requests.next() => if !requested { return },
            _ = stopped.wait_for(|stop| *stop) => return,
        }
        match auth.reload_token_files() {
            Ok(()) => tracing::info!(target: "audit", "SIGHUP: the admin (and scrape) token files were read again"),
            Err(error) => tracing::error!(
                target: "audit",
                %error,
                "SIGHUP: a token file did not load; its old token stays"
            ),
        }
        match &tls {
            None => tracing::info!("SIGHUP: plaintext, no certificates to reload"),
            Some(tls) => match tls.reload() {
                Ok(()) => tracing::info!(target: "audit", "SIGHUP: certificates, keys and CAs reloaded"),
                Err(error) => tracing::error!(
                    target: "audit",
                    %error,
                    "SIGHUP: the TLS files did not load; the node keeps the ones it had"
                ),
            },
        }
    }
}

/// How many maximal election timeouts an initial member other than the first waits
/// for the first one to reach it before it bootstraps the cluster itself.
const BOOTSTRAP_GRACE_ELECTION_TIMEOUTS: u64 = 4;

/// Writes the initial membership and campaigns (openraft's `initialize`).
async fn bootstrap(raft: &Raft, members: &BTreeMap<NodeId, Node>) {
    tracing::info!(members = ?members.keys().collect::<Vec<_>>(), "bootstrapping the cluster");
    if let Err(error) = raft.initialize(members.clone()).await {
        // Another initial member bootstrapped first; that is the goal.
        tracing::info!(%error, "initialize declined");
    }
}

/// An initial member other than the lowest id bootstraps only if the lowest one has
/// not reached it (asked for its vote or sent it the log) within `grace`, say because
/// it is down when the cluster is first started. When every member bootstrapped as
/// it started, each campaigned in term 1, and with the members started one after
/// another (as `cluster.sh` does) the first leader was replaced by a term-2 election
/// about 0.7 s later in every start measured.
async fn bootstrap_unless_reached(raft: Raft, members: BTreeMap<NodeId, Node>, grace: Duration) {
    let reached = raft
        .wait(Some(grace))
        .metrics(|metrics| metrics.last_log_index.is_some() || metrics.vote != Vote::default(), "reached by a member")
        .await;
    match reached {
        Ok(_) => {}
        Err(WaitError::Timeout(..)) => {
            tracing::info!(grace_ms = grace.as_millis() as u64, "the first initial member has not reached this node");
            bootstrap(&raft, &members).await;
        }
        Err(WaitError::ShuttingDown) => {}
    }
}

/// The leader's side of session deadlines: when one passes, propose the expiry; when
/// a session goes quiet, checkpoint it (see `shell::session_deadlines`), once every
/// member's build knows the command and unless `checkpoints` is off (a test control).
async fn run_expiry(
    replica: Arc<Replica>,
    incarnations: Arc<Incarnations>,
    checkpoints: bool,
    mut stopped: watch::Receiver<bool>,
) {
    let deadlines = &replica.shared.deadlines;
    let mut leading_term = None;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(EXPIRY_SCAN_INTERVAL_MS)) => {}
            _ = stopped.wait_for(|stop| *stop) => return,
        }
        let (state, term, applied_term, members) = {
            let metrics = replica.raft.metrics();
            let metrics = metrics.borrow();
            let members: Vec<NodeId> = metrics.membership_config.membership().nodes().map(|(id, _)| *id).collect();
            (metrics.state, metrics.current_term, metrics.last_applied.map(|log_id| log_id.leader_id.term), members)
        };
        if state != ServerState::Leader {
            leading_term = None;
            continue;
        }
        if leading_term != Some(term) {
            // A new leader starts the deadlines only once it applied everything
            // committed before (the read index is at least the first entry of its
            // term, and at least what was committed when it was restarted as the
            // leader of the same term), and so every checkpoint, resume and expiry.
            if applied_term != Some(term) || replica.confirm_and_apply().await.is_err() {
                continue;
            }
            deadlines.restart_deadlines();
            leading_term = Some(term);
            tracing::info!(term, sessions = deadlines.len(), "leading: session deadlines restarted");
            continue;
        }
        // Once the log used checkpoints, every member's build knew them; before, the
        // leader must have heard every member at that level.
        let used = replica.shared.applied.read().unwrap().machine.command_level() >= COMMAND_LEVEL_CHECKPOINT;
        let checkpointing = checkpoints && (used || incarnations.every_member_at(COMMAND_LEVEL_CHECKPOINT, &members));
        // Lock-delays run out on the same scan; a held-back grant exists only once the
        // log used lock-delay, so every member's build knows the command.
        let ended = replica.shared.lock_delays.take_due();
        if !ended.is_empty() {
            tracing::info!(delays = ended.len(), "lock-delays ran out; handing the locks on");
            if let Err(error) = replica.propose_quietly(Command::EndLockDelays { ended: ended.clone() }).await {
                tracing::warn!(%error, "could not propose the end of lock-delays");
                replica.shared.lock_delays.not_proposed(&ended);
            }
        }
        let due = deadlines.take_due(checkpointing);
        if !due.quiet.is_empty() {
            tracing::debug!(sessions = due.quiet.len(), "sessions went quiet; checkpointing them");
            let command = Command::CheckpointSessions { quiet: due.quiet.clone(), resumed: Vec::new() };
            if let Err(error) = replica.propose_quietly(command).await {
                tracing::warn!(%error, "could not propose a checkpoint of quiet sessions");
                deadlines.checkpoint_not_proposed(&due.quiet);
            }
        }
        if due.expired.is_empty() {
            continue;
        }
        tracing::info!(sessions = ?due.expired, "session deadlines passed; proposing expiry");
        if let Err(error) = replica.propose_quietly(Command::ExpireSessions { sessions: due.expired.clone() }).await {
            tracing::warn!(%error, "could not propose the expiry");
            deadlines.expiry_not_proposed(&due.expired);
        }
    }
}

/// How often the recorder looks again without being woken: a proposal that failed
/// (a leader change) is retried this much later.
const RECORD_RETRY_MS: u64 = 1_000;

/// Keeps the record of members' incarnations (see `raft::incarnations`): as leader,
/// records each member heard from (and itself) that the log does not hold yet, with a
/// new random cluster id if the log has none; on every node, writes the cluster's id
/// into the data directory's identity once the log has it.
async fn record_members(
    replica: Arc<Replica>,
    incarnations: Arc<Incarnations>,
    data_dir: std::path::PathBuf,
    mut identity: data_dir::Identity,
    mut stopped: watch::Receiver<bool>,
) {
    let mut record_changes = incarnations.record_changes();
    let mut leadership = replica.raft.metrics();
    loop {
        if leadership.has_changed().is_err() {
            // Raft stopped (a fatal error; `stop_on_fatal` ends the node): nothing is
            // left to record, and its metrics would wake this loop at once, forever.
            let _ = stopped.wait_for(|stop| *stop).await;
            return;
        }
        let record = incarnations.record();
        if let Some(cluster_id) = record.cluster_id.filter(|id| identity.cluster_id() != Some(*id)) {
            match data_dir::record_cluster_id(&data_dir, &identity, cluster_id) {
                Ok(written) => {
                    tracing::info!(cluster_id = %data_dir::cluster_id_text(cluster_id), "the cluster's id is recorded");
                    identity = written;
                }
                Err(error) => tracing::error!(%error, "cannot write the cluster's id into the data directory"),
            }
        }
        let (leading, members) = {
            let metrics = replica.raft.metrics();
            let metrics = metrics.borrow();
            let members: Vec<NodeId> = metrics.membership_config.membership().nodes().map(|(id, _)| *id).collect();
            (metrics.state == ServerState::Leader, members)
        };
        // A late answer from a node that was removed is not kept for when it is added.
        incarnations.prune(&members);
        // Kept on followers too, so that a node that becomes leader starts held back.
        replica.set_clients_may_commit(incarnations.clients_may_commit(&members));
        if leading {
            for (node, incarnation) in incarnations.to_record(&members) {
                let cluster_id = record.cluster_id.unwrap_or_else(|| new_cluster_id(&replica.entropy));
                let command = Command::RecordMember { cluster_id, node, incarnation };
                match replica.propose_quietly(command).await {
                    Ok(_) => tracing::info!(node, incarnation, "recorded a member's incarnation"),
                    Err(error) => tracing::warn!(node, %error, "could not record a member's incarnation"),
                }
            }
        }
        tokio::select! {
            _ = incarnations.heard_changed.notified() => {}
            changed = record_changes.changed() => if changed.is_err() { return },
            // A new leader records at once what it heard as a candidate.
            _ = leadership.wait_for(|metrics| (metrics.state == ServerState::Leader) != leading) => {}
            _ = tokio::time::sleep(Duration::from_millis(RECORD_RETRY_MS)) => {}
            _ = stopped.wait_for(|stop| *stop) => return,
        }
    }
}

/// The exit code of a node whose Raft stopped on a fatal error: a failed write or
/// fsync of its log or vote (a full or failing disk), or a broken storage invariant.
pub const EXIT_RAFT_FATAL: i32 = 5;

/// How often `stop_on_fatal` looks at Raft's running state.
const FATAL_CHECK_MS: u64 = 100;

/// Fail-stop for Raft: openraft stops its core on a storage error (after a failed
/// fsync the data on disk is unknown; retrying it is how databases lost data) and
/// on a broken invariant, and the node would then keep its ports open and answer
/// nothing useful. It exits instead, saying why, and a supervisor restarts it on the
/// directory it left as it was.
async fn stop_on_fatal(raft: Raft, mut stopped: watch::Receiver<bool>, exit: Exit) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(FATAL_CHECK_MS)) => {}
            _ = stopped.wait_for(|stop| *stop) => return,
        }
        let fatal = match &raft.metrics().borrow().running_state {
            Ok(()) => continue,
            Err(fatal) => fatal.to_string(),
        };
        if *stopped.borrow() {
            return;
        }
        tracing::error!(%fatal, "Raft stopped on a fatal error: stopping the node");
        exit.stop(
            EXIT_RAFT_FATAL,
            &format!("Raft stopped on a fatal error: {fatal}; stopping the node (exit code {EXIT_RAFT_FATAL})"),
        );
        // Reported to a simulator: the node is taken down; nothing more to watch.
        let _ = stopped.wait_for(|stop| *stop).await;
        return;
    }
}

/// Reads the data directory's free space every `DISK_CHECK_INTERVAL_MS`, and logs
/// when it goes below the reserve and back.
async fn watch_disk(disk: Arc<DiskSpace>, data_dir: std::path::PathBuf, mut stopped: watch::Receiver<bool>) {
    let mut was_low = disk.is_low();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(DISK_CHECK_INTERVAL_MS)) => {}
            _ = stopped.wait_for(|stop| *stop) => return,
        }
        match disk.refresh(&data_dir) {
            Ok(low) if low != was_low => {
                let free_bytes = disk.free_bytes().unwrap_or(0);
                let reserve_bytes = disk.reserve_bytes();
                if low {
                    tracing::warn!(
                        free_bytes,
                        reserve_bytes,
                        "the data directory's disk is below its reserve: new state is refused"
                    );
                } else {
                    tracing::info!(free_bytes, reserve_bytes, "the data directory's disk is above its reserve again");
                }
                was_low = low;
            }
            Ok(_) => {}
            Err(error) => tracing::warn!(%error, "cannot read the data directory's free space"),
        }
    }
}

/// A random cluster id, never 0.
fn new_cluster_id(entropy: &Entropy) -> u128 {
    loop {
        let id = entropy.u128();
        if id != 0 {
            return id;
        }
    }
}

/// A node that was a member and is no longer in the membership stops serving.
///
/// It counts as having been a member only once the applied record holds this node's
/// own incarnation: a node added again under its old id (a new incarnation) catches
/// up through the configurations of its earlier life, one with the old incarnation
/// in it and then its removal, before the one that adds it again; those must not stop
/// it. Watches the server metrics, which change only with the vote, the role, the
/// leader or the membership (the full metrics are sent again after every event the
/// Raft core handles, and would wake this task thousands of times a second under
/// load), and the applied record.
async fn watch_membership(
    raft: Raft,
    node_id: u64,
    incarnation: u64,
    mut record: watch::Receiver<Arc<ClusterRecord>>,
    retired: watch::Sender<bool>,
    mut stopped: watch::Receiver<bool>,
) {
    let mut metrics = raft.server_metrics();
    let mut was_member = false;
    loop {
        let is_member = metrics.borrow().membership_config.membership().get_node(&node_id).is_some();
        let recorded_as_this = record.borrow().incarnation(node_id) == Some(incarnation);
        if is_member {
            was_member |= recorded_as_this;
        } else if was_member {
            tracing::warn!("this node is no longer in the cluster's membership; it stops serving");
            retired.send_replace(true);
            return;
        }
        tokio::select! {
            changed = metrics.changed() => if changed.is_err() { return },
            changed = record.changed() => if changed.is_err() { return },
            _ = stopped.wait_for(|stop| *stop) => return,
        }
    }
}

/// The connections a bound listener accepts, with Nagle's algorithm off. The servers
/// are handed listeners that were bound before (to report a port in use before
/// anything else starts), and tonic applies its own `tcp_nodelay` setting only to
/// listeners it binds itself: without this, a small response written while the
/// previous one is unacknowledged waits for the peer's delayed ACK, about 40 ms.
fn accepting(listener: tokio::net::TcpListener) -> tonic::transport::server::TcpIncoming {
    tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true))
}
