//! A fenced store: keeps, per resource, the highest fencing token it accepted and
//! rejects writes that carry a lower one — the `UPDATE … WHERE fence_token < $t`
//! rule, in memory. Served over a line protocol on loopback so that worker
//! processes write to it:
//!
//! ```text
//! WRITE <resource> <token> <value>\n   ->  ACCEPTED\n | REJECTED <highest token>\n | ERROR <why>\n
//! READ <resource>\n                    ->  VALUE <token> <value>\n | EMPTY\n | ERROR <why>\n
//! FREAD <resource> <token>\n           ->  VALUE <token> <value>\n | EMPTY\n | REJECTED <fence>\n | ERROR <why>\n
//! ```
//!
//! `FREAD` is the fenced read of a read-modify-write: it refuses a token below the
//! resource's fence and raises the fence to its token, so a holder that was
//! superseded after it read cannot write back what it read over the newer holder's
//! write (a fence on writes alone loses that update). A write needs a token above
//! every accepted write's and at least the fence.
//!
//! With fencing switched off (the control) every write is accepted, which is what a
//! store without the check does.
//!
//! Through a real store (`--fenced-store`, [`FencedStore::through`]) the same
//! protocol is answered by a `leasehold::fence` adapter in many-per-grant mode:
//! `FREAD` is `advance` then `read`, `WRITE` is `write`. The fenced counter does one
//! `FREAD` and one `WRITE` per grant, so "at least the fence" admits exactly the
//! grant that advanced it, and "above every accepted write" only differs for a
//! grant that writes twice, which it never does (the front end's own retry of a
//! write whose answer was lost writes the same value under the same token). The
//! in-memory state is then only the record of what the store answered, for the
//! checks: every write with its outcome, and the value the store must hold at the
//! end.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use leasehold::fence::etcd::EtcdFence;
use leasehold::fence::mysql::MysqlFence;
use leasehold::fence::postgres::PostgresFence;
use leasehold::fence::redis::RedisFence;
use leasehold::fence::s3::S3Fence;
use leasehold::fence::sqlite::SqliteFence;
use leasehold::fence::{FenceError, FencedStore as _, Mode, Outcome, Record};
use leasehold::FencingToken;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, UnixListener, UnixStream};

/// How long one call to a real store may take before it counts as unanswered.
pub const STORE_ATTEMPT_MS_MAX: u64 = 5_000;
/// How long an unanswered call is retried (same token, same value) before the
/// front end answers `ERROR`.
pub const STORE_DEADLINE_MS: u64 = 15_000;
pub const STORE_RETRY_MS: u64 = 100;
/// How long the harness may take to connect to a real store and create its table.
pub const STORE_OPEN_MS_MAX: u64 = 30_000;
/// The fenced counter's writes go through a store in this mode: the grant that
/// advanced the fence with its fenced read writes once after it.
pub const MODE: Mode = Mode::ManyPerGrant;

/// Where the fenced-counter workload's writes are decided (`--fenced-store`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum StoreKind {
    /// The harness's own map (and the only one with an unfenced control).
    Memory,
    Postgres,
    Sqlite,
    /// MariaDB (or MySQL), through the MySQL adapter.
    Mariadb,
    Redis,
    Etcd,
    /// An S3 bucket with conditional writes (the tests' server is moto's).
    S3,
}

impl StoreKind {
    pub fn name(self) -> &'static str {
        match self {
            StoreKind::Memory => "memory",
            StoreKind::Postgres => "postgres",
            StoreKind::Sqlite => "sqlite",
            StoreKind::Mariadb => "mariadb",
            StoreKind::Redis => "redis",
            StoreKind::Etcd => "etcd",
            StoreKind::S3 => "s3",
        }
    }

    /// Whether the store is a server the harness reaches over TCP (`scripts/stores.sh`
    /// knows it by this name).
    pub fn is_server(self) -> bool {
        matches!(self, StoreKind::Postgres | StoreKind::Mariadb | StoreKind::Redis | StoreKind::Etcd | StoreKind::S3)
    }
}

/// One of `leasehold::fence`'s adapters (its trait is not dyn-compatible).
pub enum Adapter {
    Postgres(PostgresFence),
    Sqlite(SqliteFence),
    Mysql(MysqlFence),
    Redis(RedisFence),
    Etcd(EtcdFence),
    S3(S3Fence),
}

macro_rules! dispatch {
    ($adapter:expr, $store:ident => $call:expr) => {
        match $adapter {
            Adapter::Postgres($store) => $call,
            Adapter::Sqlite($store) => $call,
            Adapter::Mysql($store) => $call,
            Adapter::Redis($store) => $call,
            Adapter::Etcd($store) => $call,
            Adapter::S3($store) => $call,
        }
    };
}

impl Adapter {
    /// Connects to the store at `url` (for SQLite, the database file) and creates
    /// the fence table where the store has one.
    pub async fn open(kind: StoreKind, url: &str) -> Result<Adapter, FenceError> {
        Ok(match kind {
            StoreKind::Memory => return Err(FenceError::Invalid("the in-memory store has no adapter".into())),
            StoreKind::Postgres => {
                let store = PostgresFence::connect(url).await?;
                store.create_table().await?;
                Adapter::Postgres(store)
            }
            StoreKind::Sqlite => Adapter::Sqlite(SqliteFence::open(url)?),
            StoreKind::Mariadb => {
                let store = MysqlFence::connect(url)?;
                store.create_table().await?;
                Adapter::Mysql(store)
            }
            StoreKind::Redis => Adapter::Redis(RedisFence::connect(url).await?),
            StoreKind::Etcd => Adapter::Etcd(EtcdFence::connect(url).await?),
            StoreKind::S3 => Adapter::S3(S3Fence::connect(url)?),
        })
    }

    pub async fn write(&self, resource: &str, token: u64, value: &str) -> Result<Outcome, FenceError> {
        let token = FencingToken::new(token);
        dispatch!(self, store => store.write(resource, token, MODE, value.as_bytes()).await)
    }

    pub async fn advance(&self, resource: &str, token: u64) -> Result<Outcome, FenceError> {
        dispatch!(self, store => store.advance(resource, FencingToken::new(token), MODE).await)
    }

    pub async fn read(&self, resource: &str) -> Result<Option<Record>, FenceError> {
        dispatch!(self, store => store.read(resource).await)
    }
}

/// Runs `attempt` until the store answers. A store error or an attempt without an
/// answer within `STORE_ATTEMPT_MS_MAX` may or may not have landed, so it is retried
/// with the same arguments, as the fence contract says, until `STORE_DEADLINE_MS`.
/// Returns the last result and whether an earlier attempt went unanswered.
async fn with_retries<T, F, Attempt>(mut attempt: F) -> (Result<T, FenceError>, bool)
where
    F: FnMut() -> Attempt,
    Attempt: Future<Output = Result<T, FenceError>>,
{
    let give_up = Instant::now() + Duration::from_millis(STORE_DEADLINE_MS);
    let mut unanswered = false;
    loop {
        let result = match tokio::time::timeout(Duration::from_millis(STORE_ATTEMPT_MS_MAX), attempt()).await {
            Ok(result) => result,
            Err(_) => Err(FenceError::store("harness", format!("no answer within {STORE_ATTEMPT_MS_MAX} ms"))),
        };
        match result {
            Err(FenceError::Store { .. }) if Instant::now() < give_up => {
                unanswered = true;
                tokio::time::sleep(Duration::from_millis(STORE_RETRY_MS)).await;
            }
            Err(error @ FenceError::Store { .. }) => return (Err(error), true),
            other => return (other, unanswered),
        }
    }
}

/// An error as one line of the protocol.
fn error_line(error: &FenceError) -> String {
    format!("ERROR {}\n", error.to_string().replace(['\n', '\r'], " "))
}

/// A real store behind the line protocol.
struct Backend {
    kind: StoreKind,
    adapter: Adapter,
    /// Prepended to every resource: the stores outlive runs and are shared by them.
    prefix: String,
    /// Where the store is, for the summary.
    location: String,
    /// One write per resource at a time through the front end (held across the
    /// store's answer and its record), so that the record lists a resource's writes
    /// in the order the store applied them. Fenced reads are not held back.
    write_turns: Mutex<BTreeMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl Backend {
    fn resource(&self, resource: &str) -> String {
        format!("{}{resource}", self.prefix)
    }

    fn write_turn(&self, resource: &str) -> Arc<tokio::sync::Mutex<()>> {
        self.write_turns.lock().unwrap().entry(resource.to_string()).or_default().clone()
    }
}

/// One write the store received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Write {
    pub resource: String,
    pub token: u64,
    pub value: String,
    pub accepted: bool,
}

#[derive(Default)]
struct State {
    highest: BTreeMap<String, (u64, String)>,
    /// The highest token seen by a fenced read or an accepted write, per resource.
    fence: BTreeMap<String, u64>,
    writes: Vec<Write>,
    /// Through a real store: values of writes after the last accepted one whose
    /// answer was lost (they may have landed), per resource.
    uncertain: BTreeMap<String, Vec<String>>,
}

#[derive(Clone)]
pub struct FencedStore {
    state: Arc<Mutex<State>>,
    fencing: bool,
    /// The real store that decides, if any; else the in-memory map does.
    backend: Option<Arc<Backend>>,
}

impl FencedStore {
    pub fn new(fencing: bool) -> Self {
        Self { state: Arc::default(), fencing, backend: None }
    }

    /// A front end whose writes `adapter` decides, on resources under `prefix`;
    /// `location` says where the store is.
    pub fn through(kind: StoreKind, adapter: Adapter, prefix: String, location: String) -> Self {
        let backend = Backend { kind, adapter, prefix, location, write_turns: Mutex::default() };
        Self { state: Arc::default(), fencing: true, backend: Some(Arc::new(backend)) }
    }

    pub fn kind(&self) -> StoreKind {
        self.backend.as_ref().map_or(StoreKind::Memory, |backend| backend.kind)
    }

    /// Which store decides, for the summary: `memory`, or the store, where it is and
    /// the prefix of this run's resources.
    pub fn describe(&self) -> String {
        match &self.backend {
            None => StoreKind::Memory.name().to_string(),
            Some(backend) => {
                format!("{} at {}, resources under {}", backend.kind.name(), backend.location, backend.prefix)
            }
        }
    }

    /// Applies one write in memory: accepted when its token is above every token
    /// accepted for the resource (or always, with fencing off). A store `through` an
    /// adapter takes its writes over the line protocol.
    pub fn write(&self, resource: &str, token: u64, value: &str) -> Result<(), u64> {
        let mut state = self.state.lock().unwrap();
        let highest = state.highest.get(resource).map(|(token, _)| *token).unwrap_or(0);
        let fence = state.fence.get(resource).copied().unwrap_or(0);
        let accepted = !self.fencing || (token > highest && token >= fence);
        state.writes.push(Write { resource: resource.into(), token, value: value.into(), accepted });
        if accepted {
            state.highest.insert(resource.to_string(), (token.max(highest), value.to_string()));
            state.fence.insert(resource.to_string(), token.max(fence));
            Ok(())
        } else {
            Err(highest.max(fence))
        }
    }

    /// A fenced read: refused (with the fence) when `token` is below the
    /// resource's fence, else raises the fence to `token` and returns the value.
    pub fn fenced_read(&self, resource: &str, token: u64) -> Result<Option<(u64, String)>, u64> {
        let mut state = self.state.lock().unwrap();
        let fence = state.fence.get(resource).copied().unwrap_or(0);
        if self.fencing && token < fence {
            return Err(fence);
        }
        state.fence.insert(resource.to_string(), token.max(fence));
        Ok(state.highest.get(resource).cloned())
    }

    /// The last accepted write's token and value, as recorded.
    pub fn read(&self, resource: &str) -> Option<(u64, String)> {
        self.state.lock().unwrap().highest.get(resource).cloned()
    }

    pub fn writes(&self) -> Vec<Write> {
        self.state.lock().unwrap().writes.clone()
    }

    pub fn accepted_writes(&self, resource: &str) -> Vec<Write> {
        self.writes().into_iter().filter(|write| write.resource == resource && write.accepted).collect()
    }

    /// What each of `resources` may hold at the end, by the record: the last
    /// accepted write's value ("" when none), then the values of later writes whose
    /// answer was lost.
    pub fn expected_values(&self, resources: &[String]) -> BTreeMap<String, Vec<String>> {
        let state = self.state.lock().unwrap();
        resources
            .iter()
            .map(|resource| {
                let mut values = vec![state.highest.get(resource).map(|(_, value)| value.clone()).unwrap_or_default()];
                values.extend(state.uncertain.get(resource).into_iter().flatten().cloned());
                (resource.clone(), values)
            })
            .collect()
    }

    /// The values of `resources` at the end ("" when none), read back from the real
    /// store; None for the in-memory store, which is its own record.
    pub async fn read_back(&self, resources: &[String]) -> Option<Result<BTreeMap<String, String>, String>> {
        let backend = self.backend.as_ref()?;
        let mut values = BTreeMap::new();
        for resource in resources {
            let stored = backend.resource(resource);
            match with_retries(|| backend.adapter.read(&stored)).await.0 {
                Ok(record) => {
                    let value = record.and_then(|record| record.value).unwrap_or_default();
                    values.insert(resource.clone(), String::from_utf8_lossy(&value).into_owned());
                }
                Err(error) => return Some(Err(format!("{resource}: {error}"))),
            }
        }
        Some(Ok(values))
    }

    /// Records one write through the real store and what came of it.
    fn record(&self, resource: &str, token: u64, value: &str, accepted: bool, uncertain: bool) {
        let mut state = self.state.lock().unwrap();
        state.writes.push(Write { resource: resource.into(), token, value: value.into(), accepted });
        if accepted {
            let highest = state.highest.get(resource).map(|(token, _)| *token).unwrap_or(0);
            state.highest.insert(resource.to_string(), (token.max(highest), value.to_string()));
            state.uncertain.remove(resource);
        } else if uncertain {
            state.uncertain.entry(resource.to_string()).or_default().push(value.to_string());
        }
    }

    /// Serves the line protocol on an ephemeral loopback port.
    pub async fn serve(&self) -> std::io::Result<SocketAddr> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        let store = self.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let store = store.clone();
                tokio::spawn(async move {
                    let (reader, mut writer) = stream.into_split();
                    let mut lines = BufReader::new(reader).lines();
                    while let Ok(Some(line)) = lines.next_line().await {
                        let reply = store.answer(&line).await;
                        if writer.write_all(reply.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        Ok(address)
    }

    async fn answer(&self, line: &str) -> String {
        let Some(backend) = &self.backend else {
            return self.answer_from_memory(line);
        };
        let parts: Vec<&str> = line.splitn(4, ' ').collect();
        match parts.as_slice() {
            ["WRITE", resource, token, value] => match token.parse::<u64>() {
                Ok(token) => self.write_through(backend, resource, token, value).await,
                Err(_) => "ERROR token is not a number\n".into(),
            },
            ["FREAD", resource, token] => match token.parse::<u64>() {
                Ok(token) => fenced_read_through(backend, resource, token).await,
                Err(_) => "ERROR token is not a number\n".into(),
            },
            ["READ", resource] => {
                let stored = backend.resource(resource);
                value_line(with_retries(|| backend.adapter.read(&stored)).await.0)
            }
            _ => "ERROR unknown request\n".into(),
        }
    }

    fn answer_from_memory(&self, line: &str) -> String {
        let parts: Vec<&str> = line.splitn(4, ' ').collect();
        match parts.as_slice() {
            ["WRITE", resource, token, value] => match token.parse::<u64>() {
                Ok(token) => match self.write(resource, token, value) {
                    Ok(()) => "ACCEPTED\n".into(),
                    Err(highest) => format!("REJECTED {highest}\n"),
                },
                Err(_) => "ERROR token is not a number\n".into(),
            },
            ["FREAD", resource, token] => match token.parse::<u64>() {
                Ok(token) => match self.fenced_read(resource, token) {
                    Ok(Some((token, value))) => format!("VALUE {token} {value}\n"),
                    Ok(None) => "EMPTY\n".into(),
                    Err(fence) => format!("REJECTED {fence}\n"),
                },
                Err(_) => "ERROR token is not a number\n".into(),
            },
            ["READ", resource] => match self.read(resource) {
                Some((token, value)) => format!("VALUE {token} {value}\n"),
                None => "EMPTY\n".into(),
            },
            _ => "ERROR unknown request\n".into(),
        }
    }

    /// `WRITE` through the real store. A refusal after an unanswered attempt is not
    /// a refusal of the write: that attempt may have landed before a newer grant
    /// advanced the fence, so the answer is `ERROR` (the worker's increment is
    /// indeterminate) and the value one the store may hold.
    async fn write_through(&self, backend: &Backend, resource: &str, token: u64, value: &str) -> String {
        let turn = backend.write_turn(resource);
        let _turn = turn.lock().await;
        let stored = backend.resource(resource);
        let (result, unanswered) = with_retries(|| backend.adapter.write(&stored, token, value)).await;
        let (reply, accepted, uncertain) = match result {
            Ok(Outcome::Accepted) => ("ACCEPTED\n".to_string(), true, false),
            Ok(Outcome::Superseded { seen, .. }) if !unanswered => (format!("REJECTED {seen}\n"), false, false),
            Ok(Outcome::Superseded { seen, .. }) => (
                format!("ERROR an attempt went unanswered and the retry was refused (the store holds {seen})\n"),
                false,
                true,
            ),
            Err(error @ FenceError::Invalid(_)) => (error_line(&error), false, false),
            Err(error) => (error_line(&error), false, true),
        };
        self.record(resource, token, value, accepted, uncertain);
        reply
    }
}

/// `FREAD` through the real store: advance the fence to `token`, then read. A
/// refusal or an error writes no value, so the increment is certainly not applied.
async fn fenced_read_through(backend: &Backend, resource: &str, token: u64) -> String {
    let stored = backend.resource(resource);
    match with_retries(|| backend.adapter.advance(&stored, token)).await.0 {
        Ok(Outcome::Accepted) => value_line(with_retries(|| backend.adapter.read(&stored)).await.0),
        Ok(Outcome::Superseded { seen, .. }) => format!("REJECTED {seen}\n"),
        Err(error) => error_line(&error),
    }
}

fn value_line(read: Result<Option<Record>, FenceError>) -> String {
    match read {
        Ok(Some(Record { token, value: Some(value) })) => {
            format!("VALUE {token} {}\n", String::from_utf8_lossy(&value))
        }
        Ok(_) => "EMPTY\n".into(),
        Err(error) => error_line(&error),
    }
}

/// Set by the harness outside its network namespace for the harness inside: the
/// store's URL as given, and the Unix socket that relays to it.
pub const STORE_URL_ENV: &str = "LEASEHOLD_JEPSEN_STORE_URL";
pub const STORE_SOCKET_ENV: &str = "LEASEHOLD_JEPSEN_STORE_SOCKET";

/// `scripts/stores.sh` of the checkout this binary was built from, else of the
/// current directory.
fn stores_script() -> anyhow::Result<PathBuf> {
    let built_from = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/stores.sh");
    let here = std::env::current_dir()?.join("scripts/stores.sh");
    [built_from, here]
        .into_iter()
        .find(|path| path.is_file())
        .context("scripts/stores.sh not found: run from the repository or give --fenced-store-url")
}

/// Starts `scripts/stores.sh`'s shared instance 0 of `kind` if it is not running
/// (the script waits until it answers) and returns its URL. The script takes no
/// lock: when another process starts the same instance at the same moment, one
/// start fails, and the instance runs once the other's is done.
pub fn shared_instance_url(kind: StoreKind) -> anyhow::Result<String> {
    let script = stores_script()?;
    let stores = |command: &str| -> anyhow::Result<String> {
        let output = std::process::Command::new("bash")
            .arg(&script)
            .args([command, kind.name(), "0"])
            .output()
            .with_context(|| format!("run {}", script.display()))?;
        let text = String::from_utf8_lossy(&output.stdout).trim().to_string();
        if !output.status.success() {
            bail!(
                "scripts/stores.sh {command} {} 0 failed:\n{text}\n{}",
                kind.name(),
                String::from_utf8_lossy(&output.stderr)
            );
        }
        Ok(text)
    };
    match stores("start") {
        Ok(text) => println!("leasehold-jepsen: {text}"),
        Err(error) => {
            let give_up = Instant::now() + Duration::from_millis(STORE_OPEN_MS_MAX);
            while stores("status").is_err() {
                if Instant::now() >= give_up {
                    return Err(error);
                }
                std::thread::sleep(Duration::from_millis(STORE_RETRY_MS));
            }
        }
    }
    let url = stores("url")?;
    url.lines().last().map(str::to_string).filter(|url| !url.is_empty()).context("scripts/stores.sh printed no URL")
}

/// A URL's `host:port` and its parts around them: (`scheme://user@`, `host:port`,
/// `/path?query`).
pub fn split_url(url: &str) -> anyhow::Result<(&str, &str, &str)> {
    let Some(scheme_end) = url.find("://").map(|at| at + 3) else {
        bail!("{url:?} is not a URL (scheme://host:port/…)");
    };
    let authority_end = url[scheme_end..].find(['/', '?']).map_or(url.len(), |at| scheme_end + at);
    let host_start = url[scheme_end..authority_end].rfind('@').map_or(scheme_end, |at| scheme_end + at + 1);
    let address = &url[host_start..authority_end];
    let port = address.rsplit_once(':').and_then(|(host, port)| (!host.is_empty()).then_some(port));
    if port.and_then(|port| port.parse::<u16>().ok()).is_none() {
        bail!("the URL {url:?} names no host and port");
    }
    Ok((&url[..host_start], address, &url[authority_end..]))
}

/// Relays every connection accepted on `listener` to a new connection to the
/// store at `address` (host:port), bytes both ways, until this process exits.
pub fn relay_to_store(listener: UnixListener, address: String) {
    tokio::spawn(async move {
        while let Ok((mut inside, _)) = listener.accept().await {
            let address = address.clone();
            tokio::spawn(async move {
                if let Ok(mut store) = tokio::net::TcpStream::connect(&address).await {
                    let _ = tokio::io::copy_bidirectional(&mut inside, &mut store).await;
                }
            });
        }
    });
}

/// Listens on an ephemeral loopback port and relays every connection to the Unix
/// socket `socket`; returns the port's address.
pub async fn relay_from_loopback(socket: PathBuf) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            let socket = socket.clone();
            tokio::spawn(async move {
                if let Ok(mut outside) = UnixStream::connect(&socket).await {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut outside).await;
                }
            });
        }
    });
    Ok(address)
}

/// Connects the front end to the store of `kind` for a run: for a server, through
/// the relay at `socket` to `url` (the harness is inside its network namespace, the
/// store outside); for SQLite, to the file `url`. Resources are prefixed with
/// `prefix`. Retried until `STORE_OPEN_MS_MAX`: a store that just started, or
/// another run creating the same table at the same moment.
pub async fn open(kind: StoreKind, url: &str, socket: Option<&Path>, prefix: String) -> anyhow::Result<FencedStore> {
    let (connect_to, location) = match socket {
        Some(socket) => {
            let (before, address, after) = split_url(url)?;
            let relay = relay_from_loopback(socket.to_path_buf()).await.context("relay to the store")?;
            (format!("{before}{relay}{after}"), address.to_string())
        }
        None => (url.to_string(), url.to_string()),
    };
    let give_up = Instant::now() + Duration::from_millis(STORE_OPEN_MS_MAX);
    loop {
        let attempt =
            tokio::time::timeout(Duration::from_millis(STORE_ATTEMPT_MS_MAX), Adapter::open(kind, &connect_to));
        let error = match attempt.await {
            Ok(Ok(adapter)) => return Ok(FencedStore::through(kind, adapter, prefix, location)),
            Ok(Err(error)) => error.to_string(),
            Err(_) => format!("no answer within {STORE_ATTEMPT_MS_MAX} ms"),
        };
        if Instant::now() >= give_up {
            bail!("cannot open the {} store at {location} within {STORE_OPEN_MS_MAX} ms: {error}", kind.name());
        }
        tokio::time::sleep(Duration::from_millis(STORE_RETRY_MS)).await;
    }
}

/// Sends one request line and returns the answer line.
pub async fn remote_request(store: SocketAddr, line: &str) -> std::io::Result<String> {
    let stream = tokio::net::TcpStream::connect(store).await?;
    let (reader, mut writer) = stream.into_split();
    writer.write_all(format!("{line}\n").as_bytes()).await?;
    let mut lines = BufReader::new(reader).lines();
    match lines.next_line().await? {
        Some(answer) => Ok(answer),
        None => Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "the store closed the connection without answering",
        )),
    }
}

/// A client of the line protocol, for worker processes.
pub async fn remote_write(store: SocketAddr, resource: &str, token: u64, value: &str) -> std::io::Result<String> {
    let stream = tokio::net::TcpStream::connect(store).await?;
    let (reader, mut writer) = stream.into_split();
    writer.write_all(format!("WRITE {resource} {token} {value}\n").as_bytes()).await?;
    let mut lines = BufReader::new(reader).lines();
    Ok(lines.next_line().await?.unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_tokens_are_rejected_only_with_fencing() {
        let fenced = FencedStore::new(true);
        assert_eq!(fenced.write("orders/42", 10, "charge-b"), Ok(()));
        assert_eq!(fenced.write("orders/42", 7, "charge-a"), Err(10));
        assert_eq!(fenced.accepted_writes("orders/42").len(), 1);

        let unfenced = FencedStore::new(false);
        assert_eq!(unfenced.write("orders/42", 10, "charge-b"), Ok(()));
        assert_eq!(unfenced.write("orders/42", 7, "charge-a"), Ok(()));
        assert_eq!(unfenced.accepted_writes("orders/42").len(), 2);
    }

    #[tokio::test]
    async fn a_fenced_read_stops_the_superseded_writer() {
        let store = FencedStore::new(true);
        assert_eq!(store.fenced_read("counter", 5), Ok(None));
        assert_eq!(store.fenced_read("counter", 9), Ok(None));
        // The holder of 5 read before 9 did; its write back must be refused.
        assert_eq!(store.write("counter", 5, "a"), Err(9));
        assert_eq!(store.write("counter", 9, "b"), Ok(()));
        assert_eq!(store.fenced_read("counter", 7), Err(9));
        assert_eq!(store.answer("FREAD counter 9").await, "VALUE 9 b\n");

        let unfenced = FencedStore::new(false);
        assert_eq!(unfenced.fenced_read("counter", 9), Ok(None));
        assert_eq!(unfenced.write("counter", 5, "a"), Ok(()));
    }

    /// The same story through a real store (SQLite, a file of the test's own): the
    /// store decides, the record keeps every write with its outcome, and the values
    /// read back are the record's.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn through_a_real_store_the_store_decides_and_the_record_follows() {
        let directory = tempfile::tempdir().unwrap();
        let path = directory.path().join("fence.sqlite");
        let store = open(StoreKind::Sqlite, path.to_str().unwrap(), None, "run-1/".into()).await.unwrap();
        assert_eq!(store.answer("FREAD counter 5").await, "EMPTY\n");
        assert_eq!(store.answer("FREAD counter 9").await, "EMPTY\n");
        assert_eq!(store.answer("WRITE counter 5 a").await, "REJECTED 9\n");
        assert_eq!(store.answer("WRITE counter 9 b").await, "ACCEPTED\n");
        assert_eq!(store.answer("FREAD counter 7").await, "REJECTED 9\n");
        assert_eq!(store.answer("FREAD counter 12").await, "VALUE 12 b\n");
        assert_eq!(store.answer("WRITE counter 12 b,c").await, "ACCEPTED\n");
        assert_eq!(store.answer("READ counter").await, "VALUE 12 b,c\n");
        assert!(store.answer("WRITE counter 0 x").await.starts_with("ERROR "), "token 0 is no grant's");
        let accepted: Vec<u64> = store.accepted_writes("counter").iter().map(|write| write.token).collect();
        assert_eq!(accepted, [9, 12]);
        assert_eq!(store.writes().len(), 4);
        let keys = ["counter".to_string(), "unused".to_string()];
        let expected = store.expected_values(&keys);
        assert_eq!(expected["counter"], ["b,c"]);
        assert_eq!(expected["unused"], [""]);
        let found = store.read_back(&keys).await.unwrap().unwrap();
        assert_eq!(found, BTreeMap::from([("counter".into(), "b,c".into()), ("unused".into(), String::new())]));
        // The run's prefix is the store's resource name.
        let direct = SqliteFence::open(&path).unwrap();
        let record = leasehold::fence::FencedStore::read(&direct, "run-1/counter").await.unwrap().unwrap();
        assert_eq!(record.value, Some(b"b,c".to_vec()));
        assert!(store.describe().starts_with("sqlite at "), "{}", store.describe());
    }

    #[test]
    fn a_urls_address_is_found_and_replaced() {
        assert_eq!(
            split_url("postgres://postgres@127.0.0.1:55432/postgres").unwrap(),
            ("postgres://postgres@", "127.0.0.1:55432", "/postgres")
        );
        assert_eq!(split_url("http://127.0.0.1:52379").unwrap(), ("http://", "127.0.0.1:52379", ""));
        assert_eq!(split_url("redis://127.0.0.1:56379/").unwrap(), ("redis://", "127.0.0.1:56379", "/"));
        assert_eq!(
            split_url("mysql://root:p@ss@[::1]:53306/leasehold?x=1").unwrap(),
            ("mysql://root:p@ss@", "[::1]:53306", "/leasehold?x=1")
        );
        for bad in ["127.0.0.1:5432", "redis://127.0.0.1/", "http://:80", "postgres://host:port/db"] {
            assert!(split_url(bad).is_err(), "{bad:?} must be refused");
        }
    }
}
