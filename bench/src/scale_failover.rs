//! Failover at scale: many sessions on many client connections, each session holding
//! a lock, and the leader killed. What a user needs from it: no session expires, every
//! connection's keepalives are answered again soon after the new leader's election,
//! and the keepalives that all arrive at once do not cost the new leader its term.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use leasehold::{Client, Session, SessionState};
use tokio::sync::Semaphore;

/// Sessions (with their locks) being created at once while filling.
pub const FILL_CONCURRENCY: usize = 256;
/// How often the survivors' status is read.
pub const POLL_MS: u64 = 10;
/// How often the sessions' deadlines are looked at.
pub const DEADLINE_POLL_MS: u64 = 5;
/// How long after the election the leader's term is watched for a second election.
pub const TERM_WATCH_TTLS: u32 = 2;

pub struct FailoverFigure {
    pub sessions: usize,
    pub connections: usize,
    pub fill_seconds: f64,
    /// From the kill to a node reporting itself leader in a later term.
    pub elected_ms: f64,
    /// Per connection, from the election to the first keepalive of any of its
    /// sessions answered after the kill (None: never within the watch).
    pub back_after_election_ms: Vec<Option<f64>>,
    /// Sessions the client library saw lost, and sessions the cluster no longer has.
    pub sessions_lost: usize,
    pub sessions_gone: usize,
    /// Elections after the first one while the term was watched.
    pub later_elections: u64,
}

/// One client connection with its sessions, each holding a lock.
struct Connection {
    client: Client,
    sessions: Vec<Session>,
}

/// Creates `connections` clients with `per_connection` sessions each, every session
/// holding the lock `failover/<connection>/<session>`; kills the leader (SIGKILL to its
/// pid, `pids` in `endpoints` order); measures until `TERM_WATCH_TTLS` TTLs after the
/// new leader's election.
pub async fn run(
    endpoints: &[String],
    pids: &[i32],
    connections: usize,
    per_connection: usize,
    ttl: Duration,
) -> anyhow::Result<FailoverFigure> {
    if pids.len() != endpoints.len() {
        bail!("give one pid per endpoint, in the same order");
    }
    let started = Instant::now();
    let gate = Arc::new(Semaphore::new(FILL_CONCURRENCY));
    let mut filled = Vec::with_capacity(connections);
    for connection in 0..connections {
        let client = crate::leasehold_target::client(endpoints)?;
        let mut tasks = Vec::with_capacity(per_connection);
        for index in 0..per_connection {
            let permit = gate.clone().acquire_owned().await?;
            let client = client.clone();
            tasks.push(tokio::spawn(async move {
                let session = client.session(ttl).await?;
                let name = format!("failover/{connection}/{index}");
                session.try_lock(&name).await?.context("the lock is free")?.detach();
                drop(permit);
                anyhow::Ok(session)
            }));
        }
        filled.push((client, tasks));
    }
    let mut all = Vec::with_capacity(connections);
    for (client, tasks) in filled {
        let mut sessions = Vec::with_capacity(tasks.len());
        for task in tasks {
            sessions.push(task.await??);
        }
        all.push(Connection { client, sessions });
    }
    let fill_seconds = started.elapsed().as_secs_f64();
    eprintln!(
        "scale-failover: {} sessions on {connections} connections in {fill_seconds:.1} s",
        connections * per_connection
    );
    // A full keepalive cycle on every connection before the kill.
    tokio::time::sleep(ttl / 2).await;

    let status = all[0].client.status_any().await?;
    let (old_term, old_leader) = (status.term, status.leader_id);
    let leader_index = endpoints
        .iter()
        .position(|endpoint| {
            status.leader_client_addr.ends_with(endpoint.as_str()) || endpoint.ends_with(&status.leader_client_addr)
        })
        .with_context(|| format!("the leader {} is not among the endpoints", status.leader_client_addr))?;
    // A session's deadline moves when a keepalive of it is answered; a connection is
    // back when any of its sessions' is.
    let deadlines_at_kill: Vec<Vec<Instant>> =
        all.iter().map(|connection| connection.sessions.iter().map(Session::deadline).collect()).collect();
    // SAFETY: signalling the server process the caller named.
    if unsafe { libc::kill(pids[leader_index], libc::SIGKILL) } != 0 {
        bail!("could not kill the leader's process {}", pids[leader_index]);
    }
    let killed = Instant::now();
    eprintln!("scale-failover: killed node {old_leader} (pid {})", pids[leader_index]);

    let survivors: Vec<String> =
        endpoints.iter().enumerate().filter(|(index, _)| *index != leader_index).map(|(_, e)| e.clone()).collect();
    let watcher = crate::leasehold_target::client(&survivors)?;
    // The survivors' status, in a task of its own so that a slow answer during the
    // election does not delay the look at the deadlines: (when a node first led in a
    // later term, that term, elections after it).
    let elections = Arc::new(std::sync::Mutex::new((None::<(Instant, u64)>, 0u64)));
    let watching = {
        let (watcher, survivors, elections) = (watcher.clone(), survivors.clone(), elections.clone());
        tokio::spawn(async move {
            loop {
                for endpoint in &survivors {
                    let Ok(status) = watcher.status_of(endpoint).await else { continue };
                    let mut elections = elections.lock().unwrap();
                    match elections.0 {
                        None if status.state == "leader" && status.term > old_term => {
                            elections.0 = Some((Instant::now(), status.term));
                            eprintln!("scale-failover: node {} leads in term {}", status.node_id, status.term);
                        }
                        Some((at, term)) if status.term > term => {
                            elections.1 += status.term - term;
                            elections.0 = Some((at, status.term));
                        }
                        _ => {}
                    }
                }
                tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
            }
        })
    };
    let mut back: Vec<Option<Instant>> = vec![None; all.len()];
    loop {
        let elected = elections.lock().unwrap().0;
        let watch_until = match elected {
            Some((at, _)) => at + ttl * TERM_WATCH_TTLS,
            None => killed + ttl * 3,
        };
        if Instant::now() >= watch_until {
            break;
        }
        let now = Instant::now();
        for (index, connection) in all.iter().enumerate() {
            if back[index].is_none()
                && connection
                    .sessions
                    .iter()
                    .zip(&deadlines_at_kill[index])
                    .any(|(session, at_kill)| session.deadline() > *at_kill)
            {
                back[index] = Some(now);
            }
        }
        tokio::time::sleep(Duration::from_millis(DEADLINE_POLL_MS)).await;
    }
    watching.abort();
    let (elected, later_elections) = *elections.lock().unwrap();
    let Some((elected_at, _)) = elected else { bail!("no new leader within {:?} of the kill", ttl * 3) };
    let sessions_lost = all
        .iter()
        .flat_map(|connection| &connection.sessions)
        .filter(|session| session.state() == SessionState::Lost)
        .count();
    let live: std::collections::BTreeSet<u64> =
        watcher.list_sessions().await?.iter().map(|session| session.session_id).collect();
    let sessions_gone =
        all.iter().flat_map(|connection| &connection.sessions).filter(|session| !live.contains(&session.id())).count();
    let back_after_election_ms =
        back.iter().map(|at| at.map(|at| at.saturating_duration_since(elected_at).as_secs_f64() * 1_000.0)).collect();
    Ok(FailoverFigure {
        sessions: connections * per_connection,
        connections,
        fill_seconds,
        elected_ms: elected_at.duration_since(killed).as_secs_f64() * 1_000.0,
        back_after_election_ms,
        sessions_lost,
        sessions_gone,
        later_elections,
    })
}
