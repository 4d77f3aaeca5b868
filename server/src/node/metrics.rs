//! A Prometheus text endpoint (`GET /metrics`) on its own address.
//!
//! The figures are read from openraft's metrics and the applied state when scraped,
//! so the hot paths do no bookkeeping for them.

use std::convert::Infallible;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use openraft::ServerState;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};

use crate::machine::{TenantId, Usage};
use crate::raft::replica::{Replica, COMMIT_WAIT_BUCKETS_SECONDS};
use crate::shell::sources::{Counted, SourceLimits, Sources, WriteDeadline};
use crate::shell::wait_histograms::escape_label;

/// The largest scrape request head read; a larger one ends the connection.
pub const SCRAPE_REQUEST_BYTES_MAX: usize = 8 * 1024;

pub fn render(replica: &Replica) -> String {
    let metrics = replica.raft.metrics().borrow().clone();
    let (sessions, locks, elections, semaphores, tenants) = {
        let applied = replica.shared.applied.read().unwrap();
        let machine = &applied.machine;
        let semaphores: Vec<(String, String, u32, usize, usize)> = machine
            .semaphore_stats()
            .map(|(tenant, name, limit, holders, waiters)| {
                (tenant.to_string(), name.to_string(), limit, holders, waiters)
            })
            .collect();
        let tenants: Vec<(TenantId, String, Usage)> =
            machine.tenants().map(|(id, tenant)| (id, tenant.name.to_string(), tenant.usage)).collect();
        (machine.session_count(), machine.lock_count(), machine.election_count(), semaphores, tenants)
    };
    let mut text = String::new();
    let mut gauge = |name: &str, help: &str, value: u64| {
        let _ = writeln!(text, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}");
    };
    let index = |log_id: Option<crate::raft::types::LogId>| log_id.map(|log_id| log_id.index).unwrap_or(0);
    gauge("leasehold_raft_term", "Current Raft term.", metrics.current_term);
    gauge("leasehold_raft_is_leader", "1 when this node is the leader.", (metrics.state == ServerState::Leader) as u64);
    gauge("leasehold_raft_last_log_index", "Index of the last log entry.", metrics.last_log_index.unwrap_or(0));
    gauge("leasehold_raft_applied_index", "Index of the last applied entry.", index(metrics.last_applied));
    gauge("leasehold_raft_snapshot_index", "Last index in the latest snapshot.", index(metrics.snapshot));
    gauge(
        "leasehold_raft_members",
        "Members (voters and learners).",
        metrics.membership_config.membership().nodes().count() as u64,
    );
    gauge("leasehold_sessions", "Live sessions in the applied state.", sessions as u64);
    gauge(
        "leasehold_commands_queued",
        "Commands waiting for a log entry on this node (the leader), all tenants.",
        replica.queued_commands() as u64,
    );
    gauge("leasehold_locks", "Locks held in the applied state.", locks as u64);
    gauge("leasehold_elections", "Elections with a leader in the applied state.", elections as u64);
    gauge("leasehold_semaphores", "Semaphores with holders or waiters in the applied state.", semaphores.len() as u64);
    gauge("leasehold_lease_deadlines", "Session deadlines this node tracks.", replica.shared.deadlines.len() as u64);
    gauge(
        "leasehold_lock_delays",
        "Locks and permits held back in their lock-delay after their holder's session expired (timers this node runs).",
        replica.shared.lock_delays.len() as u64,
    );
    let state_bytes: u64 = tenants.iter().map(|(_, _, usage)| usage.bytes).sum();
    gauge("leasehold_state_bytes", "The replicated state's estimated size.", state_bytes);
    gauge(
        "leasehold_state_budget_bytes",
        "The size past which the leader refuses new state (--state-budget-bytes).",
        replica.state_budget_bytes(),
    );
    gauge(
        "leasehold_disk_free_bytes",
        "Free space of the data directory's file system, as last read (every second).",
        replica.disk.free_bytes().unwrap_or(0),
    );
    gauge(
        "leasehold_disk_reserve_bytes",
        "The free space below which the leader refuses new state (--disk-reserve-bytes).",
        replica.disk.reserve_bytes(),
    );
    gauge(
        "leasehold_disk_low",
        "1 while the data directory's free space is below the reserve.",
        u64::from(replica.disk.is_low()),
    );
    gauge("leasehold_observers", "Open Observe streams on this node.", replica.shared.observers.open() as u64);
    gauge(
        "leasehold_heap_free_bytes",
        "Free heap in malloc's arenas, resident or already given back by a trim.",
        crate::shell::memory::free_heap_bytes() as u64,
    );
    let counters = &replica.counters;
    for (name, help, value) in [
        (
            "leasehold_entries_proposed_total",
            "Log entries with commands this node proposed as leader.",
            &counters.entries_proposed,
        ),
        (
            "leasehold_commands_proposed_total",
            "Commands in those entries (commands per entry = batching).",
            &counters.commands_proposed,
        ),
        ("leasehold_leadership_rounds_total", "Leadership confirmations with a quorum.", &counters.leadership_rounds),
        (
            "leasehold_budget_refusals_total",
            "Requests this node refused because the state was at its budget.",
            &counters.budget_refusals,
        ),
        (
            "leasehold_commands_refused_early_total",
            "Commands this node refused as leader before proposing them, because no entry could make them succeed.",
            &counters.refused_early,
        ),
        (
            "leasehold_commands_refused_overloaded_total",
            "Commands this node refused as leader with OVERLOADED: their tenant's queue for the log was full.",
            &counters.refused_overloaded,
        ),
        (
            "leasehold_commands_refused_rate_limited_total",
            "Commands this node refused as leader with RATE_LIMITED: their tenant was past its rate quota.",
            &counters.refused_rate_limited,
        ),
        (
            "leasehold_early_refusals_paced_total",
            "Early refusals this node answered after a pause: their tenant was past 1,000 of them that second.",
            &counters.refusals_paced,
        ),
        (
            "leasehold_leadership_checks_total",
            "Keepalives and linearizable reads those rounds answered.",
            &counters.leadership_checks,
        ),
    ] {
        let value = value.load(std::sync::atomic::Ordering::Relaxed);
        let _ = writeln!(text, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}");
    }
    let name = "leasehold_heap_trims_total";
    let _ = writeln!(
        text,
        "# HELP {name} Times the heap trimmer gave freed heap back to the system.\n# TYPE {name} counter\n{name} {}",
        crate::shell::memory::trims()
    );
    for (metric, help, pick) in [
        ("leasehold_semaphore_holders", "Permits held, per semaphore.", 0usize),
        ("leasehold_semaphore_waiters", "Sessions waiting, per semaphore.", 1),
        ("leasehold_semaphore_limit", "The limit K, per semaphore.", 2),
    ] {
        let _ = writeln!(text, "# HELP {metric} {help}\n# TYPE {metric} gauge");
        for (tenant, name, limit, holders, waiters) in &semaphores {
            let value = [*holders as u64, *waiters as u64, *limit as u64][pick];
            let (tenant, name) = (escape_label(tenant), escape_label(name));
            let _ = writeln!(text, "{metric}{{tenant=\"{tenant}\",semaphore=\"{name}\"}} {value}");
        }
    }
    for (metric, help, pick) in [
        ("leasehold_tenant_sessions", "Sessions, per tenant.", 0usize),
        ("leasehold_tenant_holds", "Locks, permits and leaderships held, per tenant.", 1),
        ("leasehold_tenant_waiters", "Waits in queues, per tenant.", 2),
        ("leasehold_tenant_state_bytes", "The replicated state a tenant takes, estimated.", 3),
    ] {
        let _ = writeln!(text, "# HELP {metric} {help}\n# TYPE {metric} gauge");
        for (_, tenant, usage) in &tenants {
            let value =
                [u64::from(usage.sessions), u64::from(usage.holds), u64::from(usage.waiters), usage.bytes][pick];
            let _ = writeln!(text, "{metric}{{tenant=\"{}\"}} {value}", escape_label(tenant));
        }
    }
    render_tenant_admission(&mut text, replica, &tenants);
    replica.shared.semaphore_waits.render(&mut text);
    if let Some(watched) = replica.shared.watched.get().filter(|watched| !watched.is_empty()) {
        render_watched(&mut text, &watched.snapshot());
    }
    text
}

/// One series per `--watch`: its grants on this node since it started, and the
/// proposal time of the latest (0 while none).
fn render_watched(text: &mut String, watches: &[(String, crate::shell::watched::Seen)]) {
    let metric = "leasehold_watched_grants_total";
    let help = "Grants of the names a --watch matches that this node applied since it started.";
    let _ = writeln!(text, "# HELP {metric} {help}\n# TYPE {metric} counter");
    for (watch, seen) in watches {
        let _ = writeln!(text, "{metric}{{watch=\"{}\"}} {}", escape_label(watch), seen.grants);
    }
    let metric = "leasehold_watched_last_grant_timestamp_seconds";
    let help = "When the latest grant a --watch matches was proposed (Unix time; 0: none since this node started).";
    let _ = writeln!(text, "# HELP {metric} {help}\n# TYPE {metric} gauge");
    for (watch, seen) in watches {
        let seconds = seen.last_grant_unix_ms as f64 / 1000.0;
        let _ = writeln!(text, "{metric}{{watch=\"{}\"}} {seconds:.3}", escape_label(watch));
    }
}

/// Scrapes served at once; more connections wait to be accepted.
pub const SCRAPE_CONNECTIONS_MAX: usize = 64;
/// What one source address may hold: a Prometheus server keeps one connection.
pub const SCRAPE_SOURCE_LIMITS: SourceLimits = SourceLimits { handshakes: 8, connections: 8 };
/// A request whose head is not complete by then is dropped, and so is a connection
/// that sends nothing for that long.
pub const SCRAPE_HEADER_TIMEOUT_MS: u64 = 5_000;
/// A connection whose client reads nothing of an answer for this long is closed.
pub const SCRAPE_WRITE_TIMEOUT_MS: u64 = 10_000;
/// A connection is closed after this long whatever it does: a scraper connects again.
pub const SCRAPE_CONNECTION_MS_MAX: u64 = 60_000;

/// Serves `GET /metrics` over HTTP/1.1 (hyper) until `stopped`: at most
/// `SCRAPE_CONNECTIONS_MAX` connections, each source address held to
/// `SCRAPE_SOURCE_LIMITS` (a connection past them is closed at once), each request
/// head read within `SCRAPE_HEADER_TIMEOUT_MS`, each answer's writes making progress
/// within `SCRAPE_WRITE_TIMEOUT_MS`, and no connection kept past
/// `SCRAPE_CONNECTION_MS_MAX`.
pub async fn serve(listener: TcpListener, replica: Arc<Replica>, mut stopped: watch::Receiver<bool>) {
    let connections = Arc::new(Semaphore::new(SCRAPE_CONNECTIONS_MAX));
    let sources = Sources::new(SCRAPE_SOURCE_LIMITS);
    loop {
        let Ok(permit) = connections.clone().acquire_owned().await else { return };
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stopped.wait_for(|stop| *stop) => return,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::warn!(port = "metrics", %error, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(mut slot) = sources.admit(peer.ip()) else { continue };
        slot.handshaken();
        let replica = replica.clone();
        tokio::spawn(async move {
            // A connection that sends nothing is closed after the header timeout (a
            // peek, not `readable()`, which may be ready before any byte came).
            let mut first = [0u8; 1];
            let first_bytes =
                tokio::time::timeout(Duration::from_millis(SCRAPE_HEADER_TIMEOUT_MS), stream.peek(&mut first));
            if !matches!(first_bytes.await, Ok(Ok(read)) if read > 0) {
                return;
            }
            let stream = WriteDeadline::new(Counted::new(stream, slot), Duration::from_millis(SCRAPE_WRITE_TIMEOUT_MS));
            let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                let replica = replica.clone();
                async move { Ok::<_, Infallible>(answer(&replica, &request)) }
            });
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(Duration::from_millis(SCRAPE_HEADER_TIMEOUT_MS))
                .max_buf_size(SCRAPE_REQUEST_BYTES_MAX)
                .serve_connection(TokioIo::new(stream), service);
            let _ = tokio::time::timeout(Duration::from_millis(SCRAPE_CONNECTION_MS_MAX), connection).await;
            drop(permit);
        });
    }
}

fn answer(replica: &Replica, request: &Request<Incoming>) -> Response<Full<Bytes>> {
    let (status, body) = match (request.method(), request.uri().path()) {
        (&Method::GET, "/metrics") => (StatusCode::OK, render(replica)),
        _ => (StatusCode::NOT_FOUND, "only GET /metrics is served here\n".to_string()),
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4"));
    response
}

/// What this node did as leader with each tenant's commands: queued now, admitted to
/// the log, and refused before it, by reason.
fn render_tenant_admission(text: &mut String, replica: &Replica, tenants: &[(TenantId, String, Usage)]) {
    let names: std::collections::HashMap<TenantId, &str> =
        tenants.iter().map(|(id, name, _)| (*id, name.as_str())).collect();
    let rows = replica.tenant_counts(|tenant| names.contains_key(&tenant));
    let metric = "leasehold_tenant_commands_queued";
    let _ = writeln!(
        text,
        "# HELP {metric} Commands waiting for a log entry on this node (the leader), per tenant.\n# TYPE {metric} gauge"
    );
    for (tenant, _, queued) in &rows {
        let name = escape_label(names.get(tenant).copied().unwrap_or_default());
        let _ = writeln!(text, "{metric}{{tenant=\"{name}\"}} {queued}");
    }
    let metric = "leasehold_tenant_commands_admitted_total";
    let _ = writeln!(
        text,
        "# HELP {metric} Commands this node queued for the log as leader, per tenant.\n# TYPE {metric} counter"
    );
    for (tenant, counts, _) in &rows {
        let name = escape_label(names.get(tenant).copied().unwrap_or_default());
        let _ = writeln!(text, "{metric}{{tenant=\"{name}\"}} {}", counts.admitted);
    }
    let metric = "leasehold_tenant_commands_refused_total";
    let _ = writeln!(
        text,
        "# HELP {metric} Commands this node refused as leader before the log, per tenant and reason (early: \
         certain to be refused; overloaded: the tenant's queue was full; rate_limited: past its rate quota).\n\
         # TYPE {metric} counter"
    );
    for (tenant, counts, _) in &rows {
        let name = escape_label(names.get(tenant).copied().unwrap_or_default());
        for (reason, value) in
            [("early", counts.refused_early), ("overloaded", counts.overloaded), ("rate_limited", counts.rate_limited)]
        {
            let _ = writeln!(text, "{metric}{{tenant=\"{name}\",reason=\"{reason}\"}} {value}");
        }
    }
    let metric = "leasehold_tenant_commit_wait_seconds";
    let _ = writeln!(
        text,
        "# HELP {metric} Time a tenant's commands admitted by this node as leader waited until their entry was \
         applied (queue, append, replication, apply).\n# TYPE {metric} histogram"
    );
    for (tenant, counts, _) in &rows {
        let name = escape_label(names.get(tenant).copied().unwrap_or_default());
        let waits = &counts.commit_waits;
        for (count, bound) in waits.buckets.iter().zip(COMMIT_WAIT_BUCKETS_SECONDS) {
            let _ = writeln!(text, "{metric}_bucket{{tenant=\"{name}\",le=\"{bound}\"}} {count}");
        }
        let _ = writeln!(text, "{metric}_bucket{{tenant=\"{name}\",le=\"+Inf\"}} {}", waits.count);
        let _ = writeln!(text, "{metric}_sum{{tenant=\"{name}\"}} {}", waits.sum_micros as f64 / 1e6);
        let _ = writeln!(text, "{metric}_count{{tenant=\"{name}\"}} {}", waits.count);
    }
}
