//! A Prometheus text endpoint (`GET /metrics`) on its own address.
//!
//! The figures are read from openraft's metrics and the applied state when scraped,
//! so the hot paths do no bookkeeping for them.

use std::fmt::Write as _;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE, WWW_AUTHENTICATE};
use hyper::{Method, Request, Response, StatusCode};
use openraft::ServerState;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::api::auth::Auth;
use crate::machine::{TenantId, Usage};
use crate::raft::replica::{Replica, COMMIT_WAIT_BUCKETS_SECONDS};
use crate::raft::round_trips::{self, RoundTrips, Timings};
use crate::shell::clock::LogLimiter;
use crate::shell::disk::{SyncTimes, SYNC_BUCKETS_SECONDS};
use crate::shell::http::{self, HttpLimits};
use crate::shell::sources::{SourceLimits, REFUSAL_LOG_INTERVAL_MS};
use crate::shell::tls::ServerTls;
use crate::shell::wait_histograms::escape_label;

/// The page: cluster-wide figures, the round trips to each member, and with
/// `per_tenant` the series that name tenants and semaphores (`--metrics-per-tenant`).
pub fn render(replica: &Replica, round_trips: &RoundTrips, per_tenant: bool) -> String {
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
    log_syncs(&mut text, &replica.disk.log_syncs);
    render_round_trips(&mut text, replica, &metrics, round_trips);
    if per_tenant {
        render_per_tenant(&mut text, replica, &semaphores, &tenants);
    }
    if let Some(watched) = replica.shared.watched.get().filter(|watched| !watched.is_empty()) {
        render_watched(&mut text, &watched.snapshot());
    }
    text
}

/// Per member this node measured a round trip to (`raft::round_trips`): the median of
/// the recent ones, how old the last is, and whether this node's timings are too
/// short for it.
fn render_round_trips(
    text: &mut String,
    replica: &Replica,
    metrics: &crate::raft::types::RaftMetrics,
    round_trips: &RoundTrips,
) {
    let me = metrics.id;
    let measured: Vec<(u64, round_trips::RoundTrip)> = (metrics.membership_config.membership().nodes())
        .filter(|(id, _)| **id != me)
        .filter_map(|(id, _)| round_trips.of(*id).map(|round_trip| (*id, round_trip)))
        .collect();
    let timings = Timings::of(&replica.raft);
    let mut series = |metric: &str, help: &str, value: &dyn Fn(&round_trips::RoundTrip) -> String| {
        let _ = writeln!(text, "# HELP {metric} {help}\n# TYPE {metric} gauge");
        for (peer, round_trip) in &measured {
            let _ = writeln!(text, "{metric}{{peer=\"{peer}\"}} {}", value(round_trip));
        }
    };
    series(
        "leasehold_peer_rtt_seconds",
        "The median of the recent round trips to each member, as this node measures them (empty AppendEntries as \
         leader, Ping probes otherwise).",
        &|round_trip| format!("{:.6}", round_trip.median_us as f64 / 1e6),
    );
    series("leasehold_peer_rtt_age_seconds", "Since the last round trip to each member was measured.", &|round_trip| {
        format!("{:.3}", round_trip.since_ms as f64 / 1e3)
    });
    series(
        "leasehold_peer_timings_too_short",
        &format!(
            "1 when this node's heartbeat_ms is under {} round trips to the member, or its election_timeout_min_ms \
             under {}.",
            round_trips::HEARTBEAT_ROUND_TRIPS_MIN,
            round_trips::ELECTION_TIMEOUT_ROUND_TRIPS_MIN
        ),
        &|round_trip| u8::from(round_trips::too_short(timings, round_trip.median_us).is_some()).to_string(),
    );
}

/// The series that name tenants and semaphores (`--metrics-per-tenant`): usage per
/// tenant, holders, waiters and limits per semaphore, what the leader did with each
/// tenant's commands, and the semaphore wait histograms.
fn render_per_tenant(
    text: &mut String,
    replica: &Replica,
    semaphores: &[(String, String, u32, usize, usize)],
    tenants: &[(TenantId, String, Usage)],
) {
    for (metric, help, pick) in [
        ("leasehold_semaphore_holders", "Permits held, per semaphore.", 0usize),
        ("leasehold_semaphore_waiters", "Sessions waiting, per semaphore.", 1),
        ("leasehold_semaphore_limit", "The limit K, per semaphore.", 2),
    ] {
        let _ = writeln!(text, "# HELP {metric} {help}\n# TYPE {metric} gauge");
        for (tenant, name, limit, holders, waiters) in semaphores {
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
        for (_, tenant, usage) in tenants {
            let value =
                [u64::from(usage.sessions), u64::from(usage.holds), u64::from(usage.waiters), usage.bytes][pick];
            let _ = writeln!(text, "{metric}{{tenant=\"{}\"}} {value}", escape_label(tenant));
        }
    }
    render_tenant_admission(text, replica, tenants);
    replica.shared.semaphore_waits.render(text);
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

/// What the metrics port allows: a Prometheus server keeps one connection per
/// target, so 8 per source address; a request head within 5 s, a client that reads
/// nothing of an answer for 10 s closed, and no connection kept past a minute (a
/// scraper connects again).
pub const SCRAPE_LIMITS: HttpLimits = HttpLimits {
    connections: 64,
    sources: SourceLimits { handshakes: 8, connections: 8 },
    header_timeout_ms: 5_000,
    write_timeout_ms: 10_000,
    request_bytes_max: 8 * 1024,
    lifetime_ms: Some(60_000),
};

/// Serves `GET /metrics` and the health probes (`/livez`, `/readyz`) until
/// `stopped`, within `SCRAPE_LIMITS`: over HTTPS when `tls`, to a scraper that `auth`
/// lets scrape (`Auth::may_scrape`); series per tenant and per name only when
/// `per_tenant`; the probes' bare answer to anyone when `probes_open`.
pub async fn serve(
    listener: TcpListener,
    replica: Arc<Replica>,
    round_trips: Arc<RoundTrips>,
    auth: Arc<Auth>,
    tls: Option<Arc<ServerTls>>,
    per_tenant: bool,
    probes_open: bool,
    stopped: watch::Receiver<bool>,
) {
    let refusals = Arc::new(LogLimiter::new(Duration::from_millis(REFUSAL_LOG_INTERVAL_MS)));
    let stopping = stopped.clone();
    let verdicts = Arc::new(Readiness::default());
    http::serve("metrics", listener, tls, SCRAPE_LIMITS, stopped, move |request: Request<Incoming>| {
        let (replica, auth, refusals, stopping) = (replica.clone(), auth.clone(), refusals.clone(), stopping.clone());
        let (verdicts, round_trips) = (verdicts.clone(), round_trips.clone());
        async move {
            let probes = Probes { open: probes_open, stopping: &stopping, verdicts: &verdicts };
            answer(&replica, &round_trips, &auth, &refusals, per_tenant, probes, &request).await
        }
    })
    .await
}

/// How long a `/readyz` verdict is reused: the probes may be open to anyone, and
/// each fresh verdict asks Raft's core (the loop every tenant's writes go through)
/// for its committed index, so a flood of probes asks it at most 4 times a second.
const READINESS_REUSE: Duration = Duration::from_millis(250);

/// The last `/readyz` verdict and when it was reached; the lock is held while one is
/// reached, so probes that come meanwhile wait for it rather than ask Raft too.
#[derive(Default)]
struct Readiness(tokio::sync::Mutex<Option<(std::time::Instant, Result<String, String>)>>);

impl Readiness {
    async fn verdict(&self, replica: &Replica) -> Result<String, String> {
        let mut last = self.0.lock().await;
        if let Some((at, verdict)) = last.as_ref() {
            if at.elapsed() < READINESS_REUSE {
                return verdict.clone();
            }
        }
        let verdict = readiness(replica).await;
        *last = Some((std::time::Instant::now(), verdict.clone()));
        verdict
    }
}

/// How the probes answer: to anyone (`open`), not ready once `stopping`.
struct Probes<'a> {
    open: bool,
    stopping: &'a watch::Receiver<bool>,
    verdicts: &'a Readiness,
}

async fn answer(
    replica: &Replica,
    round_trips: &RoundTrips,
    auth: &Auth,
    refusals: &LogLimiter,
    per_tenant: bool,
    probes: Probes<'_>,
    request: &Request<Incoming>,
) -> Response<Full<Bytes>> {
    let token = http::bearer_token(request);
    let may_scrape = auth.may_scrape(token);
    let is_stopping = *probes.stopping.borrow();
    let probe = match (request.method(), request.uri().path()) {
        (&Method::GET, "/livez") => Some(Ok("the process serves".to_string())),
        (&Method::GET, "/readyz") if is_stopping => Some(Err("the node is stopping".to_string())),
        (&Method::GET, "/readyz") => Some(probes.verdicts.verdict(replica).await),
        _ => None,
    };
    let (status, body) = match probe {
        Some(verdict) if may_scrape || probes.open => {
            let status = if verdict.is_ok() { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
            let body = match (may_scrape, verdict) {
                (true, Ok(why)) => format!("ok: {why}\n"),
                (true, Err(why)) => format!("not ok: {why}\n"),
                (false, Ok(_)) => "ok\n".to_string(),
                (false, Err(_)) => "not ok\n".to_string(),
            };
            (status, body)
        }
        _ if !may_scrape => {
            if refusals.allow() {
                let what = if token.is_empty() { "no credential" } else { "a token that is not the scrape token" };
                tracing::warn!(target: "audit", port = "metrics", what, "refused a scrape (logged at most once a second)");
            }
            (
                StatusCode::UNAUTHORIZED,
                "the metrics need the scrape token as `Authorization: Bearer <token>`\n".to_string(),
            )
        }
        _ => match (request.method(), request.uri().path()) {
            (&Method::GET, "/metrics") => (StatusCode::OK, render(replica, round_trips, per_tenant)),
            _ => (StatusCode::NOT_FOUND, "only GET /metrics, /livez and /readyz are served here\n".to_string()),
        },
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4"));
    if status == StatusCode::UNAUTHORIZED {
        headers.insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer realm=\"leasehold metrics\""));
    }
    response
}

/// Whether this node is ready to serve (`/readyz`): Raft runs, the node is a member,
/// knows a leader (and, leading, heard a quorum within two maximal election
/// timeouts), and has applied every entry it knows committed. Ok says what it is,
/// Err what it lacks.
pub async fn readiness(replica: &Replica) -> Result<String, String> {
    let committed = replica
        .raft
        .with_raft_state(|state| state.committed.map(|log_id| log_id.index).unwrap_or(0))
        .await
        .map_err(|_| "Raft is not running on this node (it stopped on a fatal error, or the node is stopping)")?;
    let metrics = replica.raft.metrics().borrow().clone();
    let me = metrics.id;
    if !metrics.membership_config.membership().nodes().any(|(id, _)| *id == me) {
        return Err(format!("node {me} is not a member of the cluster (not added yet, or removed)"));
    }
    let Some(leader) = metrics.current_leader else {
        return Err(format!("node {me} knows no leader (term {})", metrics.current_term));
    };
    if metrics.state == ServerState::Leader {
        let bound_ms = 2 * replica.raft.config().election_timeout_max;
        match metrics.millis_since_quorum_ack {
            Some(ms) if ms <= bound_ms => {}
            heard => {
                return Err(format!(
                    "node {me} leads but has not heard a quorum within {bound_ms} ms (last: {})",
                    heard.map_or("never".to_string(), |ms| format!("{ms} ms ago"))
                ))
            }
        }
    }
    let applied = metrics.last_applied.map_or(0, |log_id| log_id.index);
    if applied < committed {
        return Err(format!("node {me} applied {applied} of the {committed} entries it knows committed"));
    }
    let role = if leader == me { "leader".to_string() } else { format!("follower of node {leader}") };
    Ok(format!("node {me}, {role}, term {}, applied {applied}", metrics.current_term))
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

/// The log's syncs on this node: each one fsync covering every append that queued
/// meanwhile (a slow disk shows here, on a follower as on the leader).
fn log_syncs(text: &mut String, syncs: &SyncTimes) {
    let metric = "leasehold_log_sync_seconds";
    let _ = writeln!(
        text,
        "# HELP {metric} Time each fsync of this node's Raft log took (one covers every append queued \
         meanwhile).\n# TYPE {metric} histogram"
    );
    for (count, bound) in syncs.buckets.iter().zip(SYNC_BUCKETS_SECONDS) {
        let _ = writeln!(text, "{metric}_bucket{{le=\"{bound}\"}} {}", count.load(Ordering::Relaxed));
    }
    let count = syncs.count.load(Ordering::Relaxed);
    let _ = writeln!(text, "{metric}_bucket{{le=\"+Inf\"}} {count}");
    let _ = writeln!(text, "{metric}_sum {}", syncs.sum_us.load(Ordering::Relaxed) as f64 / 1e6);
    let _ = writeln!(text, "{metric}_count {count}");
}
