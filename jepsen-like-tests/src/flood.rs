//! The flood workload (`leasehold-jepsen workload-worker --workload flood`): one
//! worker process acting as a third tenant, "flood", that keeps `FLOOD_TASKS`
//! requests in flight all run long, whatever the nemesis does: half lock and release
//! names of its own (accepted commands), half close a session that is gone (refused
//! by the leader before the log). The harness gives the tenant a rate quota of
//! `FLOOD_OPS_PER_S`, which the client library waits out (`RATE_LIMITED`).
//!
//! What it proves is about the other workloads: `checker::latency_beside_flood`
//! bounds how long their releases take outside fault windows while the flood runs,
//! and the flood itself must have had commands accepted and refused (the counts it
//! writes at the end, `flood.json` beside its history). It writes no history records:
//! its names are its own tenant's, which no other worker can see.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use leasehold::proto as pb;
use leasehold::proto::errors::{error_metadata, error_reason, METADATA_LEADER};
use leasehold::proto::ErrorReason;
use serde::{Deserialize, Serialize};

use crate::workload::{WorkloadWorkerArguments, REQUEST_DEADLINE_MS};

/// The tenant the flood worker acts as (made by the harness).
pub const FLOOD_TENANT: &str = "flood";
/// The flood tenant's rate quota, in commands a second.
pub const FLOOD_OPS_PER_S: u32 = 400;
/// Requests the flood keeps in flight: half accepted, half refused.
pub const FLOOD_TASKS: u64 = 32;
/// The flood's session's TTL.
const FLOOD_TTL: Duration = Duration::from_secs(10);
/// Pause after an error before the task tries again (a fault, a lost session).
const ERROR_PAUSE_MS: u64 = 100;

/// What the flood did, written to `flood.json` when the harness says `final`.
#[derive(Debug, Default, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct FloodCounts {
    /// Lock cycles (acquire and release) that went through.
    pub accepted: u64,
    /// Closes of a gone session the cluster refused, as it must.
    pub refused: u64,
    /// Requests that failed otherwise: faults, the rate quota past the request's
    /// deadline, a lost session.
    pub failed: u64,
}

/// Where the worker writing `history` puts its counts.
pub fn counts_file(history: &Path) -> PathBuf {
    history.with_extension("flood.json")
}

#[derive(Default)]
struct Counters {
    accepted: AtomicU64,
    refused: AtomicU64,
    failed: AtomicU64,
}

pub async fn run(arguments: WorkloadWorkerArguments) -> anyhow::Result<()> {
    if std::env::var_os(leasehold::settings::ENV_ADMIN_TOKEN_FILE).is_some() {
        anyhow::bail!("the flood worker must not hold the admin credential");
    }
    let (settings, client) =
        crate::workload::worker_client(&arguments, format!("{FLOOD_TENANT}-{}", arguments.process))?;
    // Its history stays empty; the harness reads it with the others.
    std::fs::File::create(&arguments.history).context("create the history")?;
    let counters = Arc::new(Counters::default());
    let final_signal = crate::workload::final_signal();
    let mut tasks = Vec::new();
    for task in 0..FLOOD_TASKS {
        let (client, counters, mut final_signal) = (client.clone(), counters.clone(), final_signal.clone());
        let endpoints = settings.endpoints.clone();
        tasks.push(tokio::spawn(async move {
            if task % 2 == 0 {
                accepted_loop(&client, task, &counters, &mut final_signal).await
            } else {
                refused_loop(&client, &endpoints, task, &counters, &mut final_signal).await
            }
        }));
    }
    for task in tasks {
        task.await.context("a flood task")?;
    }
    let counts = FloodCounts {
        accepted: counters.accepted.load(Ordering::Relaxed),
        refused: counters.refused.load(Ordering::Relaxed),
        failed: counters.failed.load(Ordering::Relaxed),
    };
    std::fs::write(counts_file(&arguments.history), serde_json::to_string(&counts)?).context("write the counts")?;
    Ok(())
}

fn stopped(final_signal: &mut tokio::sync::watch::Receiver<bool>) -> bool {
    *final_signal.borrow_and_update()
}

async fn pause_after_error(counters: &Counters) {
    counters.failed.fetch_add(1, Ordering::Relaxed);
    tokio::time::sleep(Duration::from_millis(ERROR_PAUSE_MS)).await;
}

/// Locks and releases `flood/<task>` with a session of its own, again and again.
async fn accepted_loop(
    client: &leasehold::Client,
    task: u64,
    counters: &Counters,
    final_signal: &mut tokio::sync::watch::Receiver<bool>,
) {
    let name = format!("flood/{task}");
    let mut session = None;
    while !stopped(final_signal) {
        if session.is_none() {
            match client.session(FLOOD_TTL).await {
                Ok(created) => session = Some(created),
                Err(_) => {
                    pause_after_error(counters).await;
                    continue;
                }
            }
        }
        let current = session.as_ref().expect("made above");
        match current.try_lock(&name).await {
            Ok(Some(guard)) => match guard.release().await {
                Ok(()) => {
                    counters.accepted.fetch_add(1, Ordering::Relaxed);
                }
                Err(_) => pause_after_error(counters).await,
            },
            // Its own name, held by an earlier session of this task that is not gone yet.
            Ok(None) => pause_after_error(counters).await,
            Err(leasehold::Error::SessionLost(_)) => {
                session = None;
                pause_after_error(counters).await;
            }
            Err(_) => pause_after_error(counters).await,
        }
    }
    if let Some(session) = session {
        let _ = session.close().await;
    }
}

/// Closes a session that is gone, again and again, on the node it believes leads.
async fn refused_loop(
    client: &leasehold::Client,
    endpoints: &[String],
    task: u64,
    counters: &Counters,
    final_signal: &mut tokio::sync::watch::Receiver<bool>,
) {
    let mut gone: Option<(u64, Vec<u8>)> = None;
    let mut target = (task as usize) % endpoints.len().max(1);
    let mut sequence = 0u64;
    while !stopped(final_signal) {
        if gone.is_none() {
            match make_gone_session(client).await {
                Ok(made) => gone = Some(made),
                Err(_) => {
                    pause_after_error(counters).await;
                    continue;
                }
            }
        }
        let (session_id, secret) = gone.clone().expect("made above");
        sequence += 1;
        let request = pb::CloseSessionRequest {
            // Each close is a new mistake: a request id of its own.
            request_id: Some(pb::RequestId { client_id: session_id ^ (task << 48), sequence }),
            session_id,
            session_secret: secret,
        };
        let endpoint = &endpoints[target % endpoints.len()];
        let Ok(channel) = client.raw_channel(endpoint) else {
            pause_after_error(counters).await;
            continue;
        };
        let mut raw = pb::leasehold_client::LeaseholdClient::new(channel);
        let answer = tokio::time::timeout(Duration::from_millis(REQUEST_DEADLINE_MS), raw.close_session(request)).await;
        match answer {
            Ok(Err(status)) if error_reason(&status) == Some(ErrorReason::UnknownSession) => {
                counters.refused.fetch_add(1, Ordering::Relaxed);
            }
            Ok(Err(status)) if error_reason(&status) == Some(ErrorReason::NotLeader) => {
                let named = error_metadata(&status, METADATA_LEADER)
                    .and_then(|leader| endpoints.iter().position(|known| *known == leader));
                target = named.unwrap_or(target + 1);
            }
            Ok(Ok(_)) => {
                // A session closed twice would be a bug of the cluster; the session
                // ids of this tenant are not checked by the suite, so say it loudly.
                eprintln!("flood: session {session_id} was closed twice");
                pause_after_error(counters).await;
            }
            _ => {
                target += 1;
                pause_after_error(counters).await;
            }
        }
    }
}

/// A session of the flood tenant, made and closed: every later close of it is refused.
async fn make_gone_session(client: &leasehold::Client) -> leasehold::Result<(u64, Vec<u8>)> {
    let session = client.session(FLOOD_TTL).await?;
    let made = (session.id(), session.secret());
    session.close().await?;
    Ok(made)
}

/// Reads what the flood worker writing `history` counted; `None` if it wrote nothing
/// (it did not reach `final`).
pub fn read_counts(history: &Path) -> Option<FloodCounts> {
    let text = std::fs::read_to_string(counts_file(history)).ok()?;
    serde_json::from_str(&text).ok()
}
