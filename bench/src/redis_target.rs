//! A single Redis, the way a Redis lock is usually taken: `SET key value NX PX ttl`,
//! released by a script that deletes the key only while it still holds this
//! client's value, extended by a script that does the same with `PEXPIRE`. No
//! queue: a waiting client polls.

use std::time::{Duration, Instant};

use anyhow::Context;
use redis::aio::MultiplexedConnection;

/// How long a waiting client sleeps between two `SET NX` attempts.
pub const POLL_PAUSE_MS: u64 = 2;

const RELEASE_SCRIPT: &str = r#"
if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('del', KEYS[1])
end
return 0
"#;

const EXTEND_SCRIPT: &str = r#"
if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('pexpire', KEYS[1], ARGV[2])
end
return 0
"#;

pub struct RedisWorker {
    connection: MultiplexedConnection,
    /// Makes every value unique: this client's index and a counter.
    index: usize,
    acquisitions: u64,
    ttl_ms: u64,
    release: redis::Script,
    extend: redis::Script,
    /// The key the keepalive workload extends, and its value.
    kept: Option<(String, String)>,
}

pub struct RedisHeld {
    key: String,
    value: String,
}

impl RedisWorker {
    pub async fn open(endpoints: &[String], index: usize, ttl: Duration) -> anyhow::Result<RedisWorker> {
        let endpoint = endpoints.first().context("no Redis endpoint")?;
        let client = redis::Client::open(format!("redis://{endpoint}/"))?;
        let connection = client.get_multiplexed_async_connection().await.context("connect to Redis")?;
        Ok(RedisWorker {
            connection,
            index,
            acquisitions: 0,
            ttl_ms: ttl.as_millis() as u64,
            release: redis::Script::new(RELEASE_SCRIPT),
            extend: redis::Script::new(EXTEND_SCRIPT),
            kept: None,
        })
    }

    async fn try_set(&mut self, key: &str) -> anyhow::Result<Option<RedisHeld>> {
        self.acquisitions += 1;
        let value = format!("{}-{}", self.index, self.acquisitions);
        let set: Option<String> = redis::cmd("SET")
            .arg(key)
            .arg(&value)
            .arg("NX")
            .arg("PX")
            .arg(self.ttl_ms)
            .query_async(&mut self.connection)
            .await?;
        Ok(set.map(|_| RedisHeld { key: key.to_string(), value }))
    }

    /// `SET NX PX`, polled every `POLL_PAUSE_MS` for at most `wait`.
    pub async fn lock(&mut self, name: &str, wait: Duration) -> anyhow::Result<Option<RedisHeld>> {
        let give_up = Instant::now() + wait;
        loop {
            if let Some(held) = self.try_set(name).await? {
                return Ok(Some(held));
            }
            if Instant::now() >= give_up {
                return Ok(None);
            }
            tokio::time::sleep(Duration::from_millis(POLL_PAUSE_MS)).await;
        }
    }

    pub async fn unlock(&mut self, held: RedisHeld) -> anyhow::Result<()> {
        let _deleted: i64 = self.release.key(&held.key).arg(&held.value).invoke_async(&mut self.connection).await?;
        Ok(())
    }

    /// Extends this client's own key (taken on first use), compare-and-pexpire.
    pub async fn keepalive(&mut self) -> anyhow::Result<()> {
        if self.kept.is_none() {
            let key = format!("bench/keepalive/{}", self.index);
            let held = self.lock(&key, Duration::from_secs(1)).await?.context("keepalive key is taken")?;
            self.kept = Some((held.key, held.value));
        }
        let (key, value) = self.kept.clone().expect("taken above");
        let extended: i64 =
            self.extend.key(&key).arg(&value).arg(self.ttl_ms).invoke_async(&mut self.connection).await?;
        if extended == 0 {
            self.kept = None;
            anyhow::bail!("key {key} expired");
        }
        Ok(())
    }

    pub async fn close(mut self) {
        if let Some((key, value)) = self.kept.take() {
            let _ = self.unlock(RedisHeld { key, value }).await;
        }
    }
}
