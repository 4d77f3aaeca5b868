//! Scale figures: resident memory per idle session holding one lock, and the time a
//! node holding many locks needs to restart and serve again.
//!
//! Both run against a cluster whose server processes the caller started (their
//! process ids are given): memory is read from `/proc/<pid>/status` (VmRSS) before
//! and after, and the restart is done by the caller's `--restart-command`, so this
//! tool never starts or kills a server it does not know.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use leasehold::Client;
use tokio::sync::Semaphore;

use crate::server_process::resident_bytes;

/// Requests in flight while filling the cluster.
pub const FILL_CONCURRENCY: usize = 256;
/// The server's LOCKS_PER_SESSION_MAX (the bench talks to the server only through
/// its public API, so it does not link the server crate to read it).
pub const SERVER_LOCKS_PER_SESSION_MAX: usize = 1_024;
/// The TTL of the filling sessions: long enough that none expires during a run.
pub const FILL_TTL: Duration = Duration::from_secs(3_600);

pub struct SessionsFigure {
    pub sessions: usize,
    /// Bytes of resident memory added per session, per node (in --pids order).
    pub bytes_per_session: Vec<f64>,
    pub fill_seconds: f64,
}

/// Creates `count` sessions, each holding one lock, and measures the nodes' memory.
/// The sessions are returned so that they stay alive while the caller looks.
pub async fn sessions_with_a_lock(
    client: &Client,
    pids: &[i32],
    count: usize,
) -> anyhow::Result<(SessionsFigure, Vec<leasehold::Session>)> {
    let before: Vec<u64> = pids.iter().map(|pid| resident_bytes(*pid).unwrap_or(0)).collect();
    let started = Instant::now();
    let gate = Arc::new(Semaphore::new(FILL_CONCURRENCY));
    let mut tasks = Vec::with_capacity(count);
    for index in 0..count {
        let permit = gate.clone().acquire_owned().await?;
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let session = client.session(FILL_TTL).await?;
            let guard = session.try_lock(&format!("scale/{index}")).await?.context("the lock is free")?;
            guard.detach();
            drop(permit);
            anyhow::Ok(session)
        }));
        if index % 10_000 == 9_999 {
            eprintln!("scale: {} sessions started ({:.0} s)", index + 1, started.elapsed().as_secs_f64());
        }
    }
    let mut sessions = Vec::with_capacity(count);
    for task in tasks {
        sessions.push(task.await??);
    }
    let fill_seconds = started.elapsed().as_secs_f64();
    // Let followers apply the last entries before reading their memory.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after: Vec<u64> = pids.iter().map(|pid| resident_bytes(*pid).unwrap_or(0)).collect();
    let bytes_per_session =
        before.iter().zip(&after).map(|(before, after)| after.saturating_sub(*before) as f64 / count as f64).collect();
    Ok((SessionsFigure { sessions: count, bytes_per_session, fill_seconds }, sessions))
}

/// Takes `locks` locks spread over sessions of `locks_per_session` each.
pub async fn fill_locks(
    client: &Client,
    locks: usize,
    locks_per_session: usize,
) -> anyhow::Result<Vec<leasehold::Session>> {
    if locks_per_session == 0 || locks_per_session > SERVER_LOCKS_PER_SESSION_MAX {
        bail!("locks per session must be 1 to {SERVER_LOCKS_PER_SESSION_MAX}");
    }
    let started = Instant::now();
    let session_count = locks.div_ceil(locks_per_session);
    let mut sessions = Vec::with_capacity(session_count);
    for _ in 0..session_count {
        sessions.push(client.session(FILL_TTL).await?);
    }
    let gate = Arc::new(Semaphore::new(FILL_CONCURRENCY));
    let mut tasks = Vec::with_capacity(locks);
    for index in 0..locks {
        let permit = gate.clone().acquire_owned().await?;
        let session = sessions[index / locks_per_session].clone();
        tasks.push(tokio::spawn(async move {
            let guard = session.try_lock(&format!("many/{index}")).await?.context("the lock is free")?;
            guard.detach();
            drop(permit);
            anyhow::Ok(())
        }));
        if index % 100_000 == 99_999 {
            eprintln!("scale: {} locks taken ({:.0} s)", index + 1, started.elapsed().as_secs_f64());
        }
    }
    for task in tasks {
        task.await??;
    }
    Ok(sessions)
}

/// Waits until the node at `endpoint` answers and has applied at least `index`.
pub async fn wait_serving(client: &Client, endpoint: &str, index: u64, deadline: Duration) -> anyhow::Result<Duration> {
    let started = Instant::now();
    loop {
        if let Ok(status) = client.status_of(endpoint).await {
            if status.applied_index >= index && (status.state == "follower" || status.state == "leader") {
                return Ok(started.elapsed());
            }
        }
        if started.elapsed() > deadline {
            bail!("{endpoint} did not serve again within {deadline:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
