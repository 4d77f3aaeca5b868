//! The workloads: C clients, each its own connection and session, run one operation
//! after another for a warm-up and then for the measured duration. Only operations
//! that complete inside the measured window count.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::StreamExt;
use tokio::sync::watch;

use crate::etcd_wire::EtcdMembers;
use crate::report::{percentile_ms, Failover, Report};
use crate::server_process;
use crate::target::{TargetKind, Worker};

/// How many clients open their connection and session at the same time.
pub const OPENING_CONCURRENCY_MAX: usize = 16;
/// Error messages kept per run, to print.
pub const ERROR_SAMPLES_MAX: usize = 5;
/// How long closing the clients after the run may take.
pub const CLOSE_TIMEOUT_MS: u64 = 5_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Workload {
    /// Each client acquires and releases its own lock.
    LockCycle,
    /// All clients on one lock: handoffs per second and the wait for a grant.
    Contended,
    /// Keepalives of every client's session, back to back.
    Keepalive,
    /// Acquire and release on one shared semaphore.
    Semaphore,
    /// lock-cycle while the leader is killed with SIGKILL.
    Failover,
    /// Each client closes a session that is already gone, over and over: a buggy
    /// client whose every command is refused (Leasehold only). Run beside another
    /// tenant's lock-cycle, it measures what refused work costs the others.
    Refused,
}

impl Workload {
    pub fn name(self) -> &'static str {
        match self {
            Workload::LockCycle => "lock-cycle",
            Workload::Contended => "contended",
            Workload::Keepalive => "keepalive",
            Workload::Semaphore => "semaphore",
            Workload::Failover => "failover",
            Workload::Refused => "refused",
        }
    }
}

#[derive(Debug, Clone)]
pub struct Settings {
    pub target: TargetKind,
    pub workload: Workload,
    pub endpoints: Vec<String>,
    /// Server process ids, in the order of `endpoints`: CPU is read from them and
    /// the failover workload kills the leader's.
    pub pids: Vec<i32>,
    pub clients: usize,
    pub warmup: Duration,
    pub duration: Duration,
    pub ttl: Duration,
    /// Longest wait for a contended lock or a permit.
    pub wait: Duration,
    /// Longest time one operation may take before it counts as an error.
    pub operation_timeout: Duration,
    pub semaphore_limit: u32,
    /// Leasehold only: the lock-delay every lock and permit is acquired with (None:
    /// the cluster's default for the name, none unless configured), to measure what
    /// lock-delay costs a lock cycle.
    pub lock_delay: Option<Duration>,
    /// When, after the warm-up, the failover workload kills the leader.
    pub kill_after: Duration,
    pub label: String,
    /// The first part of every lock and semaphore name: two runs against one system
    /// with different prefixes never touch each other's names (Leasehold's tenants
    /// keep theirs apart anyway; etcd and Redis have only the prefix).
    pub name_prefix: String,
    /// etcd: the CA that signed the members' client-port certificates; with it the
    /// clients speak TLS (https), without it plaintext. Leasehold's clients take
    /// theirs from the LEASEHOLD_* variables instead (see `leasehold::settings`).
    pub etcd_ca: Option<tonic::transport::Certificate>,
}

impl Settings {
    /// The etcd members at `endpoints`, reached as `etcd_ca` says.
    pub fn etcd_members(&self) -> EtcdMembers {
        EtcdMembers { endpoints: self.endpoints.clone(), ca: self.etcd_ca.clone() }
    }
}

/// What one client saw.
#[derive(Default)]
struct ClientOutcome {
    latencies_us: Vec<u64>,
    operations: u64,
    errors: u64,
    errors_after_kill: u64,
    /// Completion of the first successful operation that started after the kill.
    recovered_at: Option<Instant>,
    error_samples: Vec<String>,
}

pub async fn run(settings: &Settings) -> anyhow::Result<Report> {
    anyhow::ensure!(
        settings.target.supports(settings.workload),
        "{} is not measured on {}",
        settings.workload.name(),
        settings.target.name()
    );
    anyhow::ensure!(settings.clients > 0, "--clients must be at least 1");
    let workers: Vec<anyhow::Result<Worker>> = futures::stream::iter(0..settings.clients)
        .map(|index| settings.target.open_worker(settings, index))
        .buffered(OPENING_CONCURRENCY_MAX)
        .collect()
        .await;
    let workers: Vec<Worker> = workers.into_iter().collect::<anyhow::Result<_>>().context("open the clients")?;

    let start = Instant::now();
    let measure_from = start + settings.warmup;
    let measure_until = measure_from + settings.duration;
    let (kill_sender, killed_at) = watch::channel(None::<Instant>);
    let settings_shared = Arc::new(settings.clone());
    let mut tasks = Vec::new();
    for (index, worker) in workers.into_iter().enumerate() {
        let settings = settings_shared.clone();
        let killed_at = killed_at.clone();
        tasks.push(tokio::spawn(drive_client(worker, index, settings, measure_from, measure_until, killed_at)));
    }

    tokio::time::sleep_until(measure_from.into()).await;
    let cpu_before = server_process::cpu_sample(&settings.pids);
    let mut killed = None;
    if settings.workload == Workload::Failover {
        tokio::time::sleep_until((measure_from + settings.kill_after).into()).await;
        killed = Some(kill_leader(settings).await?);
        kill_sender.send_replace(Some(killed.expect("set above").1));
    }
    tokio::time::sleep_until(measure_until.into()).await;
    let cpu_after = server_process::cpu_sample(&settings.pids);

    let mut outcomes = Vec::new();
    for task in tasks {
        outcomes.push(task.await.context("a client task panicked")?);
    }
    let mut latencies_us: Vec<u64> = Vec::new();
    let (mut operations, mut errors) = (0, 0);
    let mut error_samples = Vec::new();
    for outcome in &mut outcomes {
        latencies_us.append(&mut outcome.latencies_us);
        operations += outcome.operations;
        errors += outcome.errors;
        for sample in outcome.error_samples.drain(..) {
            if error_samples.len() < ERROR_SAMPLES_MAX {
                error_samples.push(sample);
            }
        }
    }
    latencies_us.sort_unstable();
    let (cpu_seconds, cpu_complete) = server_process::cpu_spent(&cpu_before, &cpu_after);
    let measured_seconds = settings.duration.as_secs_f64();
    let failover = killed.map(|(killed_index, killed_at)| {
        let mut gaps_ms: Vec<f64> = outcomes
            .iter()
            .filter_map(|outcome| outcome.recovered_at.map(|at| at.duration_since(killed_at).as_secs_f64() * 1e3))
            .collect();
        gaps_ms.sort_by(f64::total_cmp);
        Failover {
            killed_endpoint: settings.endpoints[killed_index].clone(),
            first_success_ms: gaps_ms.first().copied(),
            median_client_back_ms: gaps_ms.get(gaps_ms.len() / 2).copied(),
            all_clients_back_ms: if gaps_ms.len() == outcomes.len() { gaps_ms.last().copied() } else { None },
            clients_not_back: outcomes.len() - gaps_ms.len(),
            errors_after_kill: outcomes.iter().map(|outcome| outcome.errors_after_kill).sum(),
        }
    });
    Ok(Report {
        label: settings.label.clone(),
        target: settings.target,
        transport: settings.target.transport(settings),
        workload: settings.workload,
        clients: settings.clients,
        duration_s: measured_seconds,
        operations,
        operations_per_s: operations as f64 / measured_seconds,
        p50_ms: percentile_ms(&latencies_us, 0.50),
        p99_ms: percentile_ms(&latencies_us, 0.99),
        p999_ms: percentile_ms(&latencies_us, 0.999),
        errors,
        server_cpu_s: if settings.pids.is_empty() { None } else { Some(cpu_seconds) },
        server_cpu_ms_per_op: if settings.pids.is_empty() || operations == 0 {
            None
        } else {
            Some(cpu_seconds * 1e3 / operations as f64)
        },
        server_cpu_complete: cpu_complete,
        failover,
        error_samples,
    })
}

/// Kills the leader's process with SIGKILL; its index in `endpoints` and when.
async fn kill_leader(settings: &Settings) -> anyhow::Result<(usize, Instant)> {
    let leader = settings.target.leader_index(settings).await?.context("no leader to kill")?;
    let pid = *settings.pids.get(leader).context("--pids must name every endpoint's process, in order")?;
    // SAFETY: signalling a process id the caller handed us as a server it started.
    let killed = unsafe { libc::kill(pid, libc::SIGKILL) };
    anyhow::ensure!(killed == 0, "kill -9 {pid}: {}", std::io::Error::last_os_error());
    Ok((leader, Instant::now()))
}

/// One client's loop until `measure_until`; bounded by time, each operation by
/// `operation_timeout`.
async fn drive_client(
    mut worker: Worker,
    index: usize,
    settings: Arc<Settings>,
    measure_from: Instant,
    measure_until: Instant,
    killed_at: watch::Receiver<Option<Instant>>,
) -> ClientOutcome {
    let mut outcome = ClientOutcome::default();
    let own_lock = format!("{}/{}/{index}", settings.name_prefix, settings.workload.name());
    let shared_name = format!("{}/{}/shared", settings.name_prefix, settings.workload.name());
    while Instant::now() < measure_until {
        let started = Instant::now();
        let operation = async {
            match settings.workload {
                Workload::LockCycle | Workload::Failover => {
                    // The lock is this client's own, so it is free: the wait is only
                    // an upper bound (etcd's Lock has no try; it waits on the server).
                    let held = worker.lock(&own_lock, settings.wait).await?.context("own lock not granted")?;
                    worker.release(held).await?;
                    anyhow::Ok(started.elapsed())
                }
                Workload::Contended => {
                    let held = worker.lock(&shared_name, settings.wait).await?.context("lock wait timed out")?;
                    // The latency of a handoff is the wait for the grant.
                    let waited = started.elapsed();
                    worker.release(held).await?;
                    Ok(waited)
                }
                Workload::Semaphore => {
                    let held = worker
                        .semaphore_acquire(&shared_name, settings.semaphore_limit, settings.wait)
                        .await?
                        .context("permit wait timed out")?;
                    worker.release(held).await?;
                    Ok(started.elapsed())
                }
                Workload::Keepalive => {
                    worker.keepalive().await?;
                    Ok(started.elapsed())
                }
                Workload::Refused => {
                    worker.close_a_gone_session().await?;
                    Ok(started.elapsed())
                }
            }
        };
        let result = match tokio::time::timeout(settings.operation_timeout, operation).await {
            Ok(result) => result,
            Err(_) => Err(anyhow::anyhow!("operation took longer than {:?}", settings.operation_timeout)),
        };
        let finished = Instant::now();
        let in_window = finished >= measure_from && finished <= measure_until;
        let kill = *killed_at.borrow();
        match result {
            Ok(latency) => {
                if in_window {
                    outcome.operations += 1;
                    outcome.latencies_us.push(latency.as_micros() as u64);
                }
                if let Some(kill) = kill {
                    if started >= kill && outcome.recovered_at.is_none() {
                        outcome.recovered_at = Some(finished);
                    }
                }
            }
            Err(error) => {
                outcome.errors += 1;
                if kill.is_some() {
                    outcome.errors_after_kill += 1;
                }
                if outcome.error_samples.len() < ERROR_SAMPLES_MAX {
                    outcome.error_samples.push(format!("{error:#}"));
                }
                // A failing system is not hammered in a tight loop.
                tokio::time::sleep(Duration::from_millis(leasehold::client::RETRY_PAUSE_MS)).await;
            }
        }
    }
    let _ = tokio::time::timeout(Duration::from_millis(CLOSE_TIMEOUT_MS), worker.close()).await;
    outcome
}
