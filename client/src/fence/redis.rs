//! Fenced writes to Redis (feature `fence-redis`).
//!
//! A resource is a hash, `leasehold:fence:<resource>` by default, with fields `token`
//! (20 zero-padded digits) and `value`. A Lua script compares and writes in one step:
//! Redis runs a script atomically. Tokens are compared as padded strings because
//! Lua's numbers are doubles, exact only up to 2^53.
//!
//! Why not `SET key value IFEQ old` (Redis 8.4): it compares for equality only, so the
//! client has to read first and compare-and-set after, retrying when another writer
//! came between; it cannot say "older than". Redis 7, which Debian ships, lacks it.
//!
//! Durability is the server's: with `appendonly yes` and `appendfsync always` an
//! accepted write survives a restart; a failover to an asynchronous replica can lose
//! the fence.

use std::sync::{Mutex, PoisonError};

use redis::aio::MultiplexedConnection;
use redis::Script;

use super::{
    check_resource, check_write, padded, parse_stored, FenceError, FencedStore, FencingToken, Mode, Outcome, Record,
};

const STORE: &str = "redis";

/// The default key prefix.
pub const DEFAULT_PREFIX: &str = "leasehold:fence:";

/// KEYS[1]: the hash. ARGV: padded token, mode (`once`/`many`), and the value when
/// there is one. Returns `{1}` when written, `{0, stored}` when refused.
const FENCE_SCRIPT: &str = r"
local stored = redis.call('HGET', KEYS[1], 'token')
if stored and (stored > ARGV[1] or (stored == ARGV[1] and ARGV[2] == 'once')) then
  return {0, stored}
end
if #ARGV >= 3 then
  redis.call('HSET', KEYS[1], 'token', ARGV[1], 'value', ARGV[3])
else
  redis.call('HSET', KEYS[1], 'token', ARGV[1])
end
return {1}
";

fn store_error(error: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> FenceError {
    FenceError::store(STORE, error)
}

/// Fenced hashes in one Redis. A fence made with [`RedisFence::connect`] opens a new
/// connection after its connection dropped (a restarted server, a broken link); the
/// call that met the broken one fails, and its retry, with the same token, goes over
/// the new one.
pub struct RedisFence {
    connection: Mutex<MultiplexedConnection>,
    client: Option<redis::Client>,
    prefix: String,
    script: Script,
}

impl RedisFence {
    /// The caller's connection and the default prefix.
    pub fn new(connection: MultiplexedConnection) -> Self {
        RedisFence::with_prefix(connection, DEFAULT_PREFIX)
    }

    pub fn with_prefix(connection: MultiplexedConnection, prefix: &str) -> Self {
        RedisFence {
            connection: Mutex::new(connection),
            client: None,
            prefix: prefix.to_string(),
            script: Script::new(FENCE_SCRIPT),
        }
    }

    /// Connects to `redis://host:port/`, and again when the connection drops.
    pub async fn connect(url: &str) -> Result<Self, FenceError> {
        let client = redis::Client::open(url).map_err(store_error)?;
        let connection = client.get_multiplexed_async_connection().await.map_err(store_error)?;
        Ok(RedisFence { client: Some(client), ..RedisFence::new(connection) })
    }

    fn connection(&self) -> MultiplexedConnection {
        self.connection.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// The error of a call; when it dropped the connection, a new one replaces it for
    /// the next call (if it cannot be opened now, the next call fails the same way).
    async fn failed(&self, error: redis::RedisError) -> FenceError {
        if let (Some(client), true) = (&self.client, error.is_connection_dropped() || error.is_io_error()) {
            if let Ok(fresh) = client.get_multiplexed_async_connection().await {
                *self.connection.lock().unwrap_or_else(PoisonError::into_inner) = fresh;
            }
        }
        store_error(error)
    }

    fn key(&self, resource: &str) -> String {
        format!("{}{resource}", self.prefix)
    }

    async fn run(
        &self,
        resource: &str,
        token: FencingToken,
        mode: Mode,
        value: Option<&[u8]>,
    ) -> Result<Outcome, FenceError> {
        check_write(resource, token)?;
        let mut invocation = self.script.key(self.key(resource));
        invocation.arg(padded(token.get())).arg(mode.as_str());
        if let Some(value) = value {
            invocation.arg(value);
        }
        let mut connection = self.connection();
        let answer: Vec<redis::Value> = match invocation.invoke_async(&mut connection).await {
            Ok(answer) => answer,
            Err(error) => return Err(self.failed(error).await),
        };
        match answer.as_slice() {
            [redis::Value::Int(1)] => Ok(Outcome::Accepted),
            [redis::Value::Int(0), redis::Value::BulkString(stored)] => {
                Ok(Outcome::Superseded { seen: parse_stored(STORE, stored)?, ours: token })
            }
            other => Err(store_error(format!("the fence script answered {other:?}"))),
        }
    }
}

impl FencedStore for RedisFence {
    async fn write(
        &self,
        resource: &str,
        token: FencingToken,
        mode: Mode,
        value: &[u8],
    ) -> Result<Outcome, FenceError> {
        self.run(resource, token, mode, Some(value)).await
    }

    async fn advance(&self, resource: &str, token: FencingToken, mode: Mode) -> Result<Outcome, FenceError> {
        self.run(resource, token, mode, None).await
    }

    async fn read(&self, resource: &str) -> Result<Option<Record>, FenceError> {
        check_resource(resource)?;
        let mut connection = self.connection();
        let answer =
            redis::cmd("HMGET").arg(self.key(resource)).arg("token").arg("value").query_async(&mut connection).await;
        let (token, value): (Option<Vec<u8>>, Option<Vec<u8>>) = match answer {
            Ok(answer) => answer,
            Err(error) => return Err(self.failed(error).await),
        };
        match token {
            None => Ok(None),
            Some(token) => Ok(Some(Record { token: parse_stored(STORE, &token)?, value })),
        }
    }
}
