//! What a fenced write costs against the plain write of the same layout, per store, in
//! one run: `leasehold-bench fence-cost`. One client, one resource, sequential writes
//! of a small value; the fenced write goes through `leasehold::fence` with a new token
//! each time (every write moves the fence), the plain write sets the same columns or
//! keys with no check. Rounds alternate which goes first.

use std::time::{Duration, Instant};

use anyhow::Context;
use leasehold::fence::{self, FencedStore, Mode};
use leasehold::FencingToken;
use tonic::codegen::http::uri::PathAndQuery;

/// The stores `fence-cost` knows.
pub const STORES: &[&str] = &["postgres", "sqlite", "mariadb", "redis", "etcd", "s3"];

/// One store's figures over one round.
#[derive(Debug, Clone)]
pub struct Round {
    pub writes_per_second: f64,
    pub p50: Duration,
    pub p99: Duration,
}

fn summarize(mut latencies: Vec<Duration>, elapsed: Duration) -> Round {
    latencies.sort();
    let at = |quantile: f64| latencies[((latencies.len() as f64 * quantile) as usize).min(latencies.len() - 1)];
    Round { writes_per_second: latencies.len() as f64 / elapsed.as_secs_f64(), p50: at(0.50), p99: at(0.99) }
}

async fn time_writes<F, Fut>(writes: usize, mut write: F) -> anyhow::Result<Round>
where
    F: FnMut(u64) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    let mut latencies = Vec::with_capacity(writes);
    let started = Instant::now();
    for index in 0..writes as u64 {
        let began = Instant::now();
        write(index).await?;
        latencies.push(began.elapsed());
    }
    Ok(summarize(latencies, started.elapsed()))
}

/// A store opened twice: through its fence adapter and through a plain client.
pub struct Pair {
    fenced: Fenced,
    plain: Plain,
}

enum Fenced {
    Postgres(fence::postgres::PostgresFence),
    Sqlite(fence::sqlite::SqliteFence),
    Mariadb(fence::mysql::MysqlFence),
    Redis(fence::redis::RedisFence),
    Etcd(fence::etcd::EtcdFence),
    S3(fence::s3::S3Fence),
}

enum Plain {
    Postgres(fence::postgres::PostgresFence),
    Sqlite(std::sync::Arc<std::sync::Mutex<rusqlite::Connection>>),
    Mariadb(mysql_async::Pool),
    Redis(redis::aio::MultiplexedConnection),
    Etcd(tonic::transport::Channel),
    S3(fence::s3::S3Fence),
}

impl Pair {
    /// `url` is the store's URL (a file path for SQLite).
    pub async fn open(store: &str, url: &str) -> anyhow::Result<Pair> {
        Ok(match store {
            "postgres" => {
                let fenced = fence::postgres::PostgresFence::connect(url).await?;
                fenced.create_table().await?;
                Pair {
                    fenced: Fenced::Postgres(fenced),
                    plain: Plain::Postgres(fence::postgres::PostgresFence::connect(url).await?),
                }
            }
            "sqlite" => {
                let fenced = fence::sqlite::SqliteFence::open(url)?;
                let connection = rusqlite::Connection::open(url)?;
                connection.busy_timeout(Duration::from_secs(5))?;
                Pair {
                    fenced: Fenced::Sqlite(fenced),
                    plain: Plain::Sqlite(std::sync::Arc::new(std::sync::Mutex::new(connection))),
                }
            }
            "mariadb" => {
                let fenced = fence::mysql::MysqlFence::connect(url)?;
                fenced.create_table().await?;
                Pair { fenced: Fenced::Mariadb(fenced), plain: Plain::Mariadb(mysql_async::Pool::from_url(url)?) }
            }
            "redis" => {
                let client = redis::Client::open(url)?;
                Pair {
                    fenced: Fenced::Redis(fence::redis::RedisFence::connect(url).await?),
                    plain: Plain::Redis(client.get_multiplexed_async_connection().await?),
                }
            }
            "etcd" => {
                let channel = tonic::transport::Endpoint::from_shared(url.to_string())?.connect().await?;
                Pair { fenced: Fenced::Etcd(fence::etcd::EtcdFence::connect(url).await?), plain: Plain::Etcd(channel) }
            }
            "s3" => Pair {
                fenced: Fenced::S3(fence::s3::S3Fence::connect(url)?),
                plain: Plain::S3(fence::s3::S3Fence::connect(url)?),
            },
            other => anyhow::bail!("unknown store {other:?}: use {}", STORES.join(", ")),
        })
    }

    /// `writes` fenced writes of `value` to `resource`, tokens from `first_token` up.
    pub async fn fenced(&self, resource: &str, first_token: u64, writes: usize, value: &[u8]) -> anyhow::Result<Round> {
        time_writes(writes, |index| async move {
            let token = FencingToken::new(first_token + index);
            let outcome = match &self.fenced {
                Fenced::Postgres(store) => store.write(resource, token, Mode::OncePerGrant, value).await,
                Fenced::Sqlite(store) => store.write(resource, token, Mode::OncePerGrant, value).await,
                Fenced::Mariadb(store) => store.write(resource, token, Mode::OncePerGrant, value).await,
                Fenced::Redis(store) => store.write(resource, token, Mode::OncePerGrant, value).await,
                Fenced::Etcd(store) => store.write(resource, token, Mode::OncePerGrant, value).await,
                Fenced::S3(store) => store.write(resource, token, Mode::OncePerGrant, value).await,
            }?;
            anyhow::ensure!(outcome.is_accepted(), "a fenced write with a new token was refused: {outcome:?}");
            Ok(())
        })
        .await
    }

    /// `writes` plain writes of the same columns or keys, with no check.
    pub async fn plain(&self, resource: &str, first_token: u64, writes: usize, value: &[u8]) -> anyhow::Result<Round> {
        time_writes(writes, |index| async move {
            let token = (first_token + index) as i64;
            match &self.plain {
                Plain::Postgres(store) => {
                    // One round trip, as the adapter's (an unnamed statement with its
                    // parameter types; `execute` would prepare first).
                    use tokio_postgres::types::Type;
                    store
                        .client()
                        .query_typed(
                            "INSERT INTO leasehold_fence (resource, token, value) VALUES ($1, $2, $3) \
                             ON CONFLICT (resource) DO UPDATE SET token = EXCLUDED.token, value = EXCLUDED.value",
                            &[(&resource, Type::TEXT), (&token, Type::INT8), (&value, Type::BYTEA)],
                        )
                        .await?;
                }
                Plain::Sqlite(connection) => {
                    let (connection, resource, value) = (connection.clone(), resource.to_string(), value.to_vec());
                    tokio::task::spawn_blocking(move || {
                        connection.lock().unwrap().execute(
                            "INSERT INTO leasehold_fence (resource, token, value) VALUES (?1, ?2, ?3) \
                             ON CONFLICT (resource) DO UPDATE SET token = excluded.token, value = excluded.value",
                            rusqlite::params![resource, token, value],
                        )
                    })
                    .await??;
                }
                Plain::Mariadb(pool) => {
                    use mysql_async::prelude::Queryable;
                    let mut connection = pool.get_conn().await?;
                    connection
                        .exec_drop(
                            "INSERT INTO leasehold_fence (resource, token, value) VALUES (?, ?, ?) \
                             ON DUPLICATE KEY UPDATE token = VALUES(token), value = VALUES(value)",
                            (resource, token, value),
                        )
                        .await?;
                }
                Plain::Redis(connection) => {
                    let mut connection = connection.clone();
                    let _: () = redis::cmd("HSET")
                        .arg(format!("{}{resource}", fence::redis::DEFAULT_PREFIX))
                        .arg("token")
                        .arg(fence::padded(token as u64))
                        .arg("value")
                        .arg(value)
                        .query_async(&mut connection)
                        .await?;
                }
                Plain::Etcd(channel) => etcd_put_both(channel, resource, token as u64, value).await?,
                // One unconditional PUT of the same body.
                Plain::S3(store) => store.write_unfenced(resource, FencingToken::new(token as u64), value).await?,
            }
            Ok(())
        })
        .await
    }
}

/// The two keys of the etcd layout put in one transaction with no comparison.
async fn etcd_put_both(
    channel: &tonic::transport::Channel,
    resource: &str,
    token: u64,
    value: &[u8],
) -> anyhow::Result<()> {
    #[derive(Clone, PartialEq, ::prost::Message)]
    struct PutRequest {
        #[prost(bytes = "vec", tag = "1")]
        key: Vec<u8>,
        #[prost(bytes = "vec", tag = "2")]
        value: Vec<u8>,
    }
    #[derive(Clone, PartialEq, ::prost::Message)]
    struct RequestOp {
        #[prost(message, optional, tag = "2")]
        put: Option<PutRequest>,
    }
    #[derive(Clone, PartialEq, ::prost::Message)]
    struct TxnRequest {
        #[prost(message, repeated, tag = "2")]
        success: Vec<RequestOp>,
    }
    #[derive(Clone, PartialEq, ::prost::Message)]
    struct TxnResponse {}
    let prefix = fence::etcd::DEFAULT_PREFIX;
    let put = |key: String, value: Vec<u8>| RequestOp { put: Some(PutRequest { key: key.into_bytes(), value }) };
    let request = TxnRequest {
        success: vec![
            put(format!("{prefix}{resource}/token"), fence::padded(token).into_bytes()),
            put(format!("{prefix}{resource}/value"), value.to_vec()),
        ],
    };
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    grpc.ready().await?;
    let codec = tonic_prost::ProstCodec::<TxnRequest, TxnResponse>::default();
    grpc.unary(tonic::Request::new(request), PathAndQuery::from_static("/etcdserverpb.KV/Txn"), codec)
        .await
        .context("etcd Txn")?;
    Ok(())
}

/// The wall clock's nanoseconds: a resource name of this run's own (the stores outlive
/// runs).
pub fn nanos() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|since| since.as_nanos()).unwrap_or_default()
}
