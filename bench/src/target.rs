//! The systems under test behind one interface: a worker is one client (its own
//! connection and its own session or lease) that can take and release locks and
//! permits and send keepalives.

use std::time::Duration;

use crate::etcd_target::{self, EtcdWorker};
use crate::leasehold_target::{self, LeaseholdHeld, LeaseholdWorker};
use crate::redis_target::{RedisHeld, RedisWorker};
use crate::transport::Transport;
use crate::workload::{Settings, Workload};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TargetKind {
    Leasehold,
    Etcd,
    Redis,
}

/// One column of the results: a system and how its clients reached it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct System {
    pub target: TargetKind,
    pub transport: Transport,
}

impl System {
    /// E.g. `leasehold (TLS)`.
    pub fn name(self) -> String {
        format!("{} ({})", self.target.name(), self.transport.name())
    }
}

impl TargetKind {
    pub fn name(self) -> &'static str {
        match self {
            TargetKind::Leasehold => "leasehold",
            TargetKind::Etcd => "etcd",
            TargetKind::Redis => "redis",
        }
    }

    /// Whether `workload` means something on this system: etcd has no semaphore
    /// primitive, a single Redis has no leader to kill, and the refused workload is
    /// Leasehold's sessions.
    pub fn supports(self, workload: Workload) -> bool {
        !matches!(
            (self, workload),
            (TargetKind::Etcd, Workload::Semaphore | Workload::Refused)
                | (TargetKind::Redis, Workload::Semaphore | Workload::Refused)
                | (TargetKind::Redis, Workload::Failover)
        )
    }

    /// How the clients of a run with `settings` reach this system: Leasehold's from
    /// the LEASEHOLD_* variables its library reads, etcd's from --etcd-ca-file;
    /// Redis is measured in plaintext.
    pub fn transport(self, settings: &Settings) -> Transport {
        match self {
            TargetKind::Leasehold => leasehold_target::transport(),
            TargetKind::Etcd => settings.etcd_members().transport(),
            TargetKind::Redis => Transport::Plaintext,
        }
    }

    /// Client number `index` of a run with `settings`, connected, with its own session
    /// (lease) of `settings.ttl`.
    pub async fn open_worker(self, settings: &Settings, index: usize) -> anyhow::Result<Worker> {
        let (endpoints, ttl) = (&settings.endpoints, settings.ttl);
        Ok(match self {
            TargetKind::Leasehold => {
                Worker::Leasehold(LeaseholdWorker::open(endpoints, ttl, settings.lock_delay).await?)
            }
            TargetKind::Etcd => Worker::Etcd(EtcdWorker::open(&settings.etcd_members(), index, ttl).await?),
            TargetKind::Redis => Worker::Redis(RedisWorker::open(endpoints, index, ttl).await?),
        })
    }

    /// The index in `settings.endpoints` of the current leader, for the failover
    /// workload.
    pub async fn leader_index(self, settings: &Settings) -> anyhow::Result<Option<usize>> {
        match self {
            TargetKind::Leasehold => leasehold_target::leader_index(&settings.endpoints).await,
            TargetKind::Etcd => etcd_target::leader_index(&settings.etcd_members()).await,
            TargetKind::Redis => Ok(None),
        }
    }
}

/// One per client, made once before the measured window: the variants' sizes do not
/// matter.
#[allow(clippy::large_enum_variant)]
pub enum Worker {
    Leasehold(LeaseholdWorker),
    Etcd(EtcdWorker),
    Redis(RedisWorker),
}

/// A lock or permit a worker holds.
pub enum Held {
    Leasehold(LeaseholdHeld),
    /// etcd: the key that holds the lock.
    Etcd(Vec<u8>),
    Redis(RedisHeld),
}

impl Worker {
    /// Takes lock `name`, waiting at most `wait`; None when not granted in time.
    pub async fn lock(&mut self, name: &str, wait: Duration) -> anyhow::Result<Option<Held>> {
        Ok(match self {
            Worker::Leasehold(worker) => worker.lock(name, wait).await?.map(Held::Leasehold),
            Worker::Etcd(worker) => worker.lock(name, wait).await?.map(Held::Etcd),
            Worker::Redis(worker) => worker.lock(name, wait).await?.map(Held::Redis),
        })
    }

    pub async fn semaphore_acquire(&mut self, name: &str, limit: u32, wait: Duration) -> anyhow::Result<Option<Held>> {
        match self {
            Worker::Leasehold(worker) => Ok(worker.semaphore_acquire(name, limit, wait).await?.map(Held::Leasehold)),
            _ => anyhow::bail!("semaphores are measured on Leasehold only"),
        }
    }

    pub async fn release(&mut self, held: Held) -> anyhow::Result<()> {
        match (self, held) {
            (Worker::Leasehold(worker), Held::Leasehold(held)) => worker.release(held).await,
            (Worker::Etcd(worker), Held::Etcd(key)) => worker.unlock(key).await,
            (Worker::Redis(worker), Held::Redis(held)) => worker.unlock(held).await,
            _ => unreachable!("a worker releases only what it took"),
        }
    }

    /// One keepalive of the worker's session (lease), sent and answered.
    pub async fn keepalive(&mut self) -> anyhow::Result<()> {
        match self {
            Worker::Leasehold(worker) => worker.keepalive().await,
            Worker::Etcd(worker) => worker.keepalive().await,
            Worker::Redis(worker) => worker.keepalive().await,
        }
    }

    /// Closes a session that is gone, which the cluster refuses (the refused workload).
    pub async fn close_a_gone_session(&mut self) -> anyhow::Result<()> {
        match self {
            Worker::Leasehold(worker) => worker.close_a_gone_session().await,
            _ => anyhow::bail!("the refused workload is measured on Leasehold only"),
        }
    }

    pub async fn close(self) {
        match self {
            Worker::Leasehold(worker) => worker.close().await,
            Worker::Etcd(worker) => worker.close().await,
            Worker::Redis(worker) => worker.close().await,
        }
    }
}
