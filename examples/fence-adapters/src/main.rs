//! `leasehold-fence-demo`: the paused-worker story through each fenced-write adapter
//! (`leasehold::fence::{postgres, sqlite, mysql, redis, etcd, s3, http}`).
//!
//! ```text
//! leasehold-fence-demo worker --store postgres|sqlite|mariadb|redis|etcd|s3|http --url URL_OR_PATH
//!                             --lock NAME --resource R --value V [--ttl 2s] [--wait 30s] [--no-fencing]
//! leasehold-fence-demo serve  --sqlite PATH       the fenced key-value service for `--store http`
//! leasehold-fence-demo forget --store S --url URL_OR_PATH --resource R
//! ```
//!
//! The worker takes the lock and prints one line per step on stdout, so a script can
//! follow it (and pause it between the first two):
//!
//! ```text
//! acquired <token>
//!                                  (waits for one line on stdin: the go-ahead)
//! write accepted | write refused <seen>
//! value <token> <value> | value none
//! ```
//!
//! It writes through the adapter ([`FencedStore::write`], once per grant): the store
//! refuses a token older than the one it holds. With `--no-fencing` it writes the same
//! rows or keys itself, without the check (the control: a worker that trusts its
//! lock). It reads back through the adapter in both cases.
//!
//! The cluster and the credentials come from the `LEASEHOLD_*` variables
//! (`eval "$(./cluster.sh env)"`), as for the `leasehold` command.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use leasehold::fence::etcd::EtcdFence;
use leasehold::fence::http::{serve_fenced_kv, HttpFence};
use leasehold::fence::mysql::MysqlFence;
use leasehold::fence::postgres::PostgresFence;
use leasehold::fence::redis::RedisFence;
use leasehold::fence::s3::S3Fence;
use leasehold::fence::sqlite::SqliteFence;
use leasehold::fence::{check_resource, check_write, FenceError, FencedStore, Mode, Outcome, Record};
use leasehold::FencingToken;

#[derive(Parser)]
#[command(name = "leasehold-fence-demo", about = "The paused-worker story through each fenced-write adapter.")]
struct Arguments {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Take the lock, wait for a line on stdin, write the value for the resource with
    /// the grant's token, read it back.
    Worker {
        #[arg(long, value_enum)]
        store: StoreKind,
        /// The store's URL (postgres://…, mysql://…, redis://…, http://… for etcd and
        /// for the fenced key-value service, http://KEY:SECRET@…/bucket for S3), or the
        /// SQLite file.
        #[arg(long)]
        url: String,
        /// The lock to take.
        #[arg(long)]
        lock: String,
        /// The resource the lock protects, in the store.
        #[arg(long)]
        resource: String,
        /// The value to write.
        #[arg(long)]
        value: String,
        /// Session TTL: how long the lock outlives a worker that stopped answering.
        #[arg(long, default_value = "2s")]
        ttl: String,
        /// How long to wait for the lock.
        #[arg(long, default_value = "30s")]
        wait: String,
        /// Write without the token check (the control): a plain upsert, HSET or put
        /// in the adapter's layout; for `http`, point --url at the service's
        /// unfenced twin (`serve` prints both).
        #[arg(long)]
        no_fencing: bool,
    },
    /// Serve the fenced key-value service (`leasehold::fence::http::serve_fenced_kv`)
    /// over a SQLite file, and its unfenced twin over the same file, on 127.0.0.1;
    /// prints `fenced http://…` and `unfenced http://…`, stops on SIGTERM or SIGINT.
    Serve {
        #[arg(long)]
        sqlite: PathBuf,
    },
    /// Delete what the demo wrote for a resource (not for `http`: its data is the
    /// service's SQLite file).
    Forget {
        #[arg(long, value_enum)]
        store: StoreKind,
        #[arg(long)]
        url: String,
        #[arg(long)]
        resource: String,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum StoreKind {
    Postgres,
    Sqlite,
    Mariadb,
    Redis,
    Etcd,
    S3,
    Http,
}

fn main() -> ExitCode {
    let arguments = Arguments::parse();
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("tokio runtime");
    match runtime.block_on(run(arguments)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("leasehold-fence-demo: {error:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(arguments: Arguments) -> anyhow::Result<()> {
    match arguments.command {
        Command::Worker { store, url, lock, resource, value, ttl, wait, no_fencing } => {
            let job = Job {
                lock,
                resource,
                value,
                ttl: leasehold::duration::parse(&ttl).map_err(anyhow::Error::msg).context("--ttl")?,
                wait: leasehold::duration::parse(&wait).map_err(anyhow::Error::msg).context("--wait")?,
            };
            check_resource(&job.resource)?;
            // Connect to the store before taking the lock, so that the lock is held
            // for the write only.
            let plain = if no_fencing { Some(Plain::connect(store, &url).await?) } else { None };
            match store {
                StoreKind::Postgres => {
                    let fence = PostgresFence::connect(&url).await?;
                    fence.create_table().await?;
                    worker(&fence, plain, &job).await
                }
                StoreKind::Sqlite => worker(&SqliteFence::open(&url)?, plain, &job).await,
                StoreKind::Mariadb => {
                    let fence = MysqlFence::connect(&url)?;
                    fence.create_table().await?;
                    worker(&fence, plain, &job).await
                }
                StoreKind::Redis => worker(&RedisFence::connect(&url).await?, plain, &job).await,
                StoreKind::Etcd => worker(&EtcdFence::connect(&url).await?, plain, &job).await,
                StoreKind::S3 => worker(&S3Fence::connect(&url)?, plain, &job).await,
                StoreKind::Http => worker(&HttpFence::new(&url)?, plain, &job).await,
            }
        }
        Command::Serve { sqlite } => serve(&sqlite).await,
        Command::Forget { store, url, resource } => {
            check_resource(&resource)?;
            Plain::connect(store, &url).await?.forget(&resource).await
        }
    }
}

fn say(line: &str) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{line}")?;
    stdout.flush()?;
    Ok(())
}

/// Waits for a line, or end of input, on stdin — on a blocking thread, so the
/// session's keepalives go on meanwhile.
async fn wait_for_line() -> anyhow::Result<()> {
    tokio::task::spawn_blocking(|| {
        let mut line = String::new();
        std::io::stdin().read_line(&mut line).map(|_| ())
    })
    .await
    .context("the stdin reader")?
    .context("read stdin")
}

struct Job {
    lock: String,
    resource: String,
    value: String,
    ttl: Duration,
    wait: Duration,
}

async fn worker(fence: &impl FencedStore, plain: Option<Plain>, job: &Job) -> anyhow::Result<()> {
    // TLS and the tenant's credential come from the LEASEHOLD_* variables.
    let client = leasehold::Settings::from_env()
        .client()
        .context("Leasehold client settings")?
        .with_client_name(format!("fence-demo-{}", std::process::id()));
    client.status_any().await.context("connect to the Leasehold cluster")?;
    let session = client.session(job.ttl).await.context("create a session")?;
    let guard = session
        .lock_with_timeout(&job.lock, job.wait)
        .await
        .with_context(|| format!("acquire {}", job.lock))?
        .with_context(|| format!("{} not acquired within {:?}", job.lock, job.wait))?;
    let token = guard.fencing_token();
    say(&format!("acquired {token}"))?;

    // The go-ahead. A worker paused here past its TTL still believes it holds the lock.
    wait_for_line().await?;

    let outcome = match &plain {
        None => fence.write(&job.resource, token, Mode::OncePerGrant, job.value.as_bytes()).await?,
        Some(plain) => {
            plain.write(&job.resource, token, job.value.as_bytes()).await?;
            Outcome::Accepted
        }
    };
    match outcome {
        Outcome::Accepted => say("write accepted")?,
        Outcome::Superseded { seen, .. } => say(&format!("write refused {seen}"))?,
    }
    match fence.read(&job.resource).await? {
        Some(Record { token, value: Some(value) }) => {
            say(&format!("value {token} {}", String::from_utf8_lossy(&value)))?
        }
        Some(Record { token, value: None }) => say(&format!("value {token} (none)"))?,
        None => say("value none")?,
    }

    if let Err(error) = guard.release().await {
        // Expected for a worker that was paused past its lease.
        eprintln!("leasehold-fence-demo: release {}: {error}", job.lock);
    }
    let _ = session.close().await;
    Ok(())
}

// ===== the control: the same layout, written without the check

/// A store's own driver, for writes that skip the fence (`--no-fencing`) and for
/// `forget`. Every write here goes to the rows or keys the adapter reads; the worker
/// opens the adapter too, which creates the table where there is one.
enum Plain {
    Postgres(tokio_postgres::Client),
    Sqlite(rusqlite::Connection),
    Mariadb(mysql_async::Pool),
    Redis(redis::aio::MultiplexedConnection),
    Etcd(tonic::transport::Channel),
    S3(S3Fence),
    Http(HttpFence),
}

impl Plain {
    async fn connect(store: StoreKind, url: &str) -> anyhow::Result<Plain> {
        Ok(match store {
            StoreKind::Postgres => {
                let (client, connection) =
                    tokio_postgres::connect(url, tokio_postgres::NoTls).await.context("PostgreSQL")?;
                tokio::spawn(connection);
                Plain::Postgres(client)
            }
            StoreKind::Sqlite => Plain::Sqlite(plain_sqlite(Path::new(url))?),
            StoreKind::Mariadb => Plain::Mariadb(mysql_async::Pool::from_url(url).context("MariaDB")?),
            StoreKind::Redis => {
                Plain::Redis(redis::Client::open(url)?.get_multiplexed_async_connection().await.context("Redis")?)
            }
            StoreKind::Etcd => Plain::Etcd(
                tonic::transport::Endpoint::from_shared(url.to_string())?
                    .connect_timeout(Duration::from_secs(5))
                    .timeout(Duration::from_secs(10))
                    .connect()
                    .await
                    .context("etcd")?,
            ),
            StoreKind::S3 => Plain::S3(S3Fence::connect(url)?),
            StoreKind::Http => Plain::Http(HttpFence::new(url)?),
        })
    }

    /// Writes `value` and `token` for `resource` whatever the store holds.
    async fn write(&self, resource: &str, token: FencingToken, value: &[u8]) -> anyhow::Result<()> {
        let bigint = check_write(resource, token)?;
        match self {
            Plain::Postgres(client) => {
                client
                    .execute(
                        "INSERT INTO leasehold_fence (resource, token, value) VALUES ($1, $2, $3) \
                         ON CONFLICT (resource) DO UPDATE SET token = EXCLUDED.token, value = EXCLUDED.value",
                        &[&resource, &bigint, &value],
                    )
                    .await?;
            }
            Plain::Sqlite(connection) => sqlite_plain_write(connection, resource, bigint, Some(value))?,
            Plain::Mariadb(pool) => {
                use mysql_async::prelude::Queryable;
                let mut connection = pool.get_conn().await?;
                connection
                    .exec_drop(
                        "INSERT INTO leasehold_fence (resource, token, value, writes) VALUES (?, ?, ?, 1) \
                         ON DUPLICATE KEY UPDATE token = VALUES(token), value = VALUES(value), writes = writes + 1",
                        (resource, bigint, value),
                    )
                    .await?;
            }
            Plain::Redis(connection) => {
                let mut connection = connection.clone();
                redis::cmd("HSET")
                    .arg(redis_key(resource))
                    .arg("token")
                    .arg(leasehold::fence::padded(token.get()))
                    .arg("value")
                    .arg(value)
                    .query_async::<()>(&mut connection)
                    .await?;
            }
            Plain::Etcd(channel) => {
                let (token_key, value_key) = etcd::keys(resource);
                let puts = vec![
                    etcd::put(token_key, leasehold::fence::padded(token.get()).into_bytes()),
                    etcd::put(value_key, value.to_vec()),
                ];
                etcd::txn(channel, puts).await?;
            }
            Plain::S3(fence) => fence.write_unfenced(resource, token, value).await?,
            // The service's unfenced twin takes any token.
            Plain::Http(fence) => match fence.write(resource, token, Mode::ManyPerGrant, value).await? {
                Outcome::Accepted => {}
                Outcome::Superseded { seen, .. } => {
                    anyhow::bail!(
                        "{resource:?} refused by token {seen}: --url is a fenced service, not the unfenced twin"
                    )
                }
            },
        }
        Ok(())
    }

    /// Deletes the resource's row or keys.
    async fn forget(&self, resource: &str) -> anyhow::Result<()> {
        match self {
            Plain::Postgres(client) => {
                client.execute("DELETE FROM leasehold_fence WHERE resource = $1", &[&resource]).await?;
            }
            Plain::Sqlite(connection) => {
                connection.execute("DELETE FROM leasehold_fence WHERE resource = ?1", [resource])?;
            }
            Plain::Mariadb(pool) => {
                use mysql_async::prelude::Queryable;
                let mut connection = pool.get_conn().await?;
                connection.exec_drop("DELETE FROM leasehold_fence WHERE resource = ?", (resource,)).await?;
            }
            Plain::Redis(connection) => {
                let mut connection = connection.clone();
                redis::cmd("DEL").arg(redis_key(resource)).query_async::<()>(&mut connection).await?;
            }
            Plain::Etcd(channel) => etcd::txn(channel, vec![etcd::delete_prefix(etcd::prefix(resource))]).await?,
            Plain::S3(fence) => fence.forget(resource).await?,
            Plain::Http(_) => anyhow::bail!("the http store's data is the service's SQLite file: forget it there"),
        }
        Ok(())
    }
}

fn redis_key(resource: &str) -> String {
    format!("{}{resource}", leasehold::fence::redis::DEFAULT_PREFIX)
}

/// A second connection to the adapter's SQLite file (the table exists: the adapter
/// was opened first, or is opened by the other worker).
fn plain_sqlite(path: &Path) -> anyhow::Result<rusqlite::Connection> {
    // Creates the table if it is missing, as the adapter does.
    drop(SqliteFence::open(path)?);
    let connection = rusqlite::Connection::open(path).with_context(|| format!("open {}", path.display()))?;
    connection.busy_timeout(Duration::from_secs(5))?;
    Ok(connection)
}

/// An upsert into the adapter's table with no token check; `value: None` sets the
/// token alone (as `advance` does).
fn sqlite_plain_write(
    connection: &rusqlite::Connection,
    resource: &str,
    token: i64,
    value: Option<&[u8]>,
) -> rusqlite::Result<()> {
    match value {
        Some(value) => connection.execute(
            "INSERT INTO leasehold_fence (resource, token, value) VALUES (?1, ?2, ?3) \
             ON CONFLICT (resource) DO UPDATE SET token = excluded.token, value = excluded.value",
            rusqlite::params![resource, token, value],
        ),
        None => connection.execute(
            "INSERT INTO leasehold_fence (resource, token) VALUES (?1, ?2) \
             ON CONFLICT (resource) DO UPDATE SET token = excluded.token",
            rusqlite::params![resource, token],
        ),
    }
    .map(|_| ())
}

/// etcd's v3 `KV/Txn` with puts and deletes only: the few messages of etcd's stable
/// API that a plain write needs (field numbers as etcd publishes them).
mod etcd {
    use anyhow::Context;
    use tonic::codegen::http::uri::PathAndQuery;
    use tonic::transport::Channel;

    #[derive(Clone, PartialEq, prost::Message)]
    struct PutRequest {
        #[prost(bytes = "vec", tag = "1")]
        key: Vec<u8>,
        #[prost(bytes = "vec", tag = "2")]
        value: Vec<u8>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    struct DeleteRangeRequest {
        #[prost(bytes = "vec", tag = "1")]
        key: Vec<u8>,
        #[prost(bytes = "vec", tag = "2")]
        range_end: Vec<u8>,
    }

    #[derive(Clone, PartialEq, prost::Oneof)]
    enum Request {
        #[prost(message, tag = "2")]
        Put(PutRequest),
        #[prost(message, tag = "3")]
        DeleteRange(DeleteRangeRequest),
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RequestOp {
        #[prost(oneof = "Request", tags = "2, 3")]
        request: Option<Request>,
    }

    /// No comparisons: the `success` operations always run, in one revision.
    #[derive(Clone, PartialEq, prost::Message)]
    struct TxnRequest {
        #[prost(message, repeated, tag = "2")]
        success: Vec<RequestOp>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    struct TxnResponse {
        #[prost(bool, tag = "2")]
        succeeded: bool,
    }

    /// The adapter's prefix for `resource`: `leasehold/fence/<resource>/`.
    pub fn prefix(resource: &str) -> Vec<u8> {
        format!("{}{resource}/", leasehold::fence::etcd::DEFAULT_PREFIX).into_bytes()
    }

    /// The adapter's token key and value key.
    pub fn keys(resource: &str) -> (Vec<u8>, Vec<u8>) {
        let prefix = prefix(resource);
        ([prefix.as_slice(), b"token"].concat(), [prefix.as_slice(), b"value"].concat())
    }

    pub fn put(key: Vec<u8>, value: Vec<u8>) -> RequestOp {
        RequestOp { request: Some(Request::Put(PutRequest { key, value })) }
    }

    /// Every key that starts with `prefix` (which ends in `/`, so the range ends at
    /// the same prefix with `0`, the byte after `/`).
    pub fn delete_prefix(prefix: Vec<u8>) -> RequestOp {
        let mut range_end = prefix.clone();
        if let Some(last) = range_end.last_mut() {
            *last += 1;
        }
        RequestOp { request: Some(Request::DeleteRange(DeleteRangeRequest { key: prefix, range_end })) }
    }

    pub async fn txn(channel: &Channel, operations: Vec<RequestOp>) -> anyhow::Result<()> {
        let mut grpc = tonic::client::Grpc::new(channel.clone());
        grpc.ready().await.context("etcd")?;
        let codec = tonic_prost::ProstCodec::<TxnRequest, TxnResponse>::default();
        let answer = grpc
            .unary(
                tonic::Request::new(TxnRequest { success: operations }),
                PathAndQuery::from_static("/etcdserverpb.KV/Txn"),
                codec,
            )
            .await
            .context("etcd Txn")?
            .into_inner();
        anyhow::ensure!(answer.succeeded, "etcd ran the failure branch of a transaction without comparisons");
        Ok(())
    }
}

// ===== the HTTP store: the fenced key-value service over SQLite, and its unfenced twin

/// The adapter's SQLite table without the check: what a service that trusts its
/// callers' tokens does. Every write and advance lands; reads are the adapter's.
struct TrustingSqlite {
    fence: SqliteFence,
    connection: Arc<Mutex<rusqlite::Connection>>,
}

impl TrustingSqlite {
    async fn plain(&self, resource: &str, token: FencingToken, value: Option<&[u8]>) -> Result<Outcome, FenceError> {
        let bigint = check_write(resource, token)?;
        let (connection, resource, value) = (self.connection.clone(), resource.to_string(), value.map(<[u8]>::to_vec));
        tokio::task::spawn_blocking(move || {
            let connection = connection.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            sqlite_plain_write(&connection, &resource, bigint, value.as_deref())
        })
        .await
        .map_err(|error| FenceError::store("sqlite", error))?
        .map_err(|error| FenceError::store("sqlite", error))?;
        Ok(Outcome::Accepted)
    }
}

impl FencedStore for TrustingSqlite {
    async fn write(
        &self,
        resource: &str,
        token: FencingToken,
        _mode: Mode,
        value: &[u8],
    ) -> Result<Outcome, FenceError> {
        self.plain(resource, token, Some(value)).await
    }

    async fn advance(&self, resource: &str, token: FencingToken, _mode: Mode) -> Result<Outcome, FenceError> {
        self.plain(resource, token, None).await
    }

    async fn read(&self, resource: &str) -> Result<Option<Record>, FenceError> {
        self.fence.read(resource).await
    }
}

async fn serve(path: &Path) -> anyhow::Result<()> {
    let fenced = Arc::new(SqliteFence::open(path)?);
    let trusting = Arc::new(TrustingSqlite {
        fence: SqliteFence::open(path)?,
        connection: Arc::new(Mutex::new(plain_sqlite(path)?)),
    });
    let fenced_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let trusting_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    say(&format!("fenced http://{}", fenced_listener.local_addr()?))?;
    say(&format!("unfenced http://{}", trusting_listener.local_addr()?))?;

    let (stop, stopped) = tokio::sync::watch::channel(false);
    let until_stopped = |mut stopped: tokio::sync::watch::Receiver<bool>| async move {
        let _ = stopped.wait_for(|stop| *stop).await;
    };
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let signals = async move {
        tokio::select! {
            _ = terminate.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        let _ = stop.send(true);
    };
    tokio::join!(
        serve_fenced_kv(fenced_listener, fenced, until_stopped(stopped.clone())),
        serve_fenced_kv(trusting_listener, trusting, until_stopped(stopped)),
        signals,
    );
    Ok(())
}
