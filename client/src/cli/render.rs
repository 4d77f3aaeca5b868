//! What the read commands print on stdout: text tables and JSON. Each function
//! returns the whole text, newlines included, so the formats can be tested without a
//! cluster. JSON objects print their keys sorted (serde_json's map is ordered).

use std::fmt::Write;

use leasehold::proto as pb;
use leasehold::{Error, Leader};
use serde_json::{json, Value};

/// What is printed in a table cell that lists nothing.
const CELL_EMPTY: &str = "-";

fn member_json(member: &pb::Member) -> Value {
    json!({"node_id": member.node_id, "client_addr": member.client_addr, "peer_addr": member.peer_addr, "role": member.role, "incarnation": member.incarnation})
}

/// `member list`, and the members under `status`.
pub fn members(members: &[pb::Member], as_json: bool) -> String {
    if as_json {
        return format!("{}\n", Value::Array(members.iter().map(member_json).collect()));
    }
    let mut text =
        format!("{:<6} {:<8} {:<22} {:<22} {}\n", "NODE", "ROLE", "CLIENT ADDRESS", "PEER ADDRESS", "INCARNATION");
    for member in members {
        // 0: the leader has not heard from the member yet, or a tenant asked (only the
        // admin is told incarnations and peer addresses).
        let incarnation = if member.incarnation == 0 { "-".to_string() } else { member.incarnation.to_string() };
        let peer_addr = if member.peer_addr.is_empty() { CELL_EMPTY } else { member.peer_addr.as_str() };
        let _ = writeln!(
            text,
            "{:<6} {:<8} {:<22} {:<22} {}",
            member.node_id, member.role, member.client_addr, peer_addr, incarnation
        );
    }
    text
}

/// `status`: one row per endpoint, as that node sees the cluster (or why it did not
/// answer), then the members as the first node that answered knows them.
pub fn status(rows: &[(String, Result<pb::StatusResponse, Error>)], as_json: bool) -> String {
    let known_members = rows.iter().find_map(|(_, row)| row.as_ref().ok().map(|status| status.members.clone()));
    if as_json {
        let nodes: Vec<Value> = rows
            .iter()
            .map(|(endpoint, row)| match row {
                Ok(status) => json!({
                    "endpoint": endpoint, "reachable": true, "node_id": status.node_id, "state": status.state,
                    "term": status.term, "leader_id": status.leader_id, "leader_client_addr": status.leader_client_addr,
                    "last_log_index": status.last_log_index, "commit_index": status.commit_index,
                    "applied_index": status.applied_index, "snapshot_index": status.snapshot_index,
                    "cluster_name": status.cluster_name, "sessions": status.sessions, "locks": status.locks,
                    "semaphores": status.semaphores, "elections": status.elections,
                    "state_bytes": status.state_bytes, "state_budget_bytes": status.state_budget_bytes,
                    "insecure_plaintext": status.insecure_plaintext,
                    "cluster_id": status.cluster_id, "incarnation": status.incarnation,
                    "disk_free_bytes": status.disk_free_bytes, "disk_reserve_bytes": status.disk_reserve_bytes,
                    "round_trips": round_trips_json(status),
                }),
                Err(error) => json!({"endpoint": endpoint, "reachable": false, "error": error.to_string()}),
            })
            .collect();
        let members: Vec<Value> = known_members.iter().flatten().map(member_json).collect();
        return format!("{}\n", json!({"nodes": nodes, "members": members}));
    }
    let mut text = format!(
        "{:<22} {:>4} {:<10} {:>5} {:>6} {:>9} {:>9} {:>9} {:>9} {:>8}\n",
        "ENDPOINT", "NODE", "STATE", "TERM", "LEADER", "LAST LOG", "COMMIT", "APPLIED", "SNAPSHOT", "SESSIONS"
    );
    for (endpoint, row) in rows {
        let _ = match row {
            Ok(status) => writeln!(
                text,
                "{:<22} {:>4} {:<10} {:>5} {:>6} {:>9} {:>9} {:>9} {:>9} {:>8}",
                endpoint,
                status.node_id,
                status.state,
                status.term,
                status.leader_id,
                status.last_log_index,
                status.commit_index,
                status.applied_index,
                status.snapshot_index,
                status.sessions
            ),
            Err(error) => writeln!(text, "{endpoint:<22} unreachable: {error}"),
        };
    }
    for (endpoint, row) in rows {
        if let Ok(status) = row {
            if status.disk_reserve_bytes > 0 && status.disk_free_bytes < status.disk_reserve_bytes {
                let _ = writeln!(
                    text,
                    "WARNING: node {} ({endpoint}) has {} free on its data directory's disk, below its reserve of {}: \
                     as leader it refuses new state (DISK_LOW)",
                    status.node_id,
                    bytes_text(status.disk_free_bytes),
                    bytes_text(status.disk_reserve_bytes)
                );
            }
            if status.insecure_plaintext {
                let _ = writeln!(
                    text,
                    "WARNING: node {} ({endpoint}) serves without TLS (--insecure-plaintext): anyone who reaches \
                     its ports can read and forge its traffic",
                    status.node_id
                );
            }
        }
    }
    // The state's size as the leader (or else any node that answered) counts it.
    let sizes = rows.iter().filter_map(|(_, row)| row.as_ref().ok());
    let sized = sizes.clone().find(|status| status.leader_id == status.node_id).or(sizes.clone().next());
    if let Some(status) = sized.filter(|status| status.state_budget_bytes > 0) {
        let _ = writeln!(
            text,
            "state: {} of the {} budget ({:.1}%); {} sessions, {} locks, {} semaphores, {} elections",
            bytes_text(status.state_bytes),
            bytes_text(status.state_budget_bytes),
            100.0 * status.state_bytes as f64 / status.state_budget_bytes as f64,
            status.sessions,
            status.locks,
            status.semaphores,
            status.elections
        );
    }
    if let Some(cluster_id) = rows
        .iter()
        .filter_map(|(_, row)| row.as_ref().ok())
        .find_map(|status| (!status.cluster_id.is_empty()).then_some(&status.cluster_id))
    {
        let _ = writeln!(text, "cluster id: {cluster_id}");
    }
    text.push_str(&round_trips(rows));
    if let Some(known_members) = &known_members {
        text.push('\n');
        text.push_str(&members(known_members, false));
    }
    text
}

/// The round trips a node measured to each other member (absent: not measured).
fn round_trips_json(status: &pb::StatusResponse) -> Value {
    let measured = status.members.iter().filter_map(|member| {
        let trip = member.round_trip.as_ref()?;
        Some(json!({"peer": member.node_id, "median_us": trip.median_us, "last_us": trip.last_us,
            "samples": trip.samples, "measured_ms_ago": trip.measured_ms_ago}))
    });
    Value::Array(measured.collect())
}

/// Under `status`: per node that answered, the round trip it measures to each other
/// member. Nothing when no node reported one (a tenant asked, or builds before it).
fn round_trips(rows: &[(String, Result<pb::StatusResponse, Error>)]) -> String {
    let answered: Vec<&pb::StatusResponse> = rows.iter().filter_map(|(_, row)| row.as_ref().ok()).collect();
    if !answered.iter().any(|status| status.members.iter().any(|member| member.round_trip.is_some())) {
        return String::new();
    }
    let mut text = "round trips (median of the recent ones, as each node measures them):\n".to_string();
    for status in answered {
        let peers: Vec<String> = (status.members.iter())
            .filter(|member| member.node_id != status.node_id)
            .map(|member| match &member.round_trip {
                Some(trip) => format!(
                    "to node {} {} ({:.1} s ago)",
                    member.node_id,
                    round_trip_text(trip.median_us),
                    trip.measured_ms_ago as f64 / 1000.0
                ),
                None => format!("to node {} not measured", member.node_id),
            })
            .collect();
        let _ = writeln!(text, "  node {}: {}", status.node_id, peers.join(", "));
    }
    text
}

/// "0.31 ms", "42 ms": a round trip for people.
fn round_trip_text(us: u64) -> String {
    if us < 10_000 {
        format!("{:.2} ms", us as f64 / 1000.0)
    } else {
        format!("{} ms", (us + 500) / 1000)
    }
}

/// "1.5 MiB": a byte count for people.
fn bytes_text(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// A leader's wall-clock stamp (milliseconds since the Unix epoch) as UTC,
/// `2026-12-02T14:03:05.120Z`.
pub fn unix_ms_text(unix_ms: u64) -> String {
    let (days, ms_of_day) = ((unix_ms / 86_400_000) as i64, unix_ms % 86_400_000);
    let (year, month, day) = leasehold::calendar::date_of_unix_day(days);
    let (hours, minutes) = (ms_of_day / 3_600_000, ms_of_day / 60_000 % 60);
    let (seconds, millis) = (ms_of_day / 1_000 % 60, ms_of_day % 1_000);
    format!("{year:04}-{month:02}-{day:02}T{hours:02}:{minutes:02}:{seconds:02}.{millis:03}Z")
}

fn holder_json(
    session_id: u64,
    client_name: &str,
    token: u64,
    since_unix_ms: u64,
    lock_delay_ms: u64,
    delay_until_unix_ms: u64,
) -> Value {
    let mut holder =
        json!({"session_id": session_id, "client_name": client_name, "token": token, "since_unix_ms": since_unix_ms});
    if lock_delay_ms > 0 {
        holder["lock_delay_ms"] = json!(lock_delay_ms);
    }
    if delay_until_unix_ms > 0 {
        holder["in_delay_until_unix_ms"] = json!(delay_until_unix_ms);
    }
    holder
}

/// `describe lock`: the holder with its token, then the waiters in order.
pub fn lock(name: &str, lock: &pb::DescribeLockResponse, as_json: bool) -> String {
    if as_json {
        let holder = lock.holder.as_ref().map(|holder| {
            holder_json(
                holder.session_id,
                &holder.client_name,
                holder.token,
                holder.since_unix_ms,
                holder.lock_delay_ms,
                holder.delay_until_unix_ms,
            )
        });
        let waiters: Vec<Value> = lock
            .waiters
            .iter()
            .map(|waiter| json!({"session_id": waiter.session_id, "client_name": waiter.client_name}))
            .collect();
        return format!("{}\n", json!({"name": name, "holder": holder, "waiters": waiters}));
    }
    let mut text = match &lock.holder {
        None => format!("{name}: free\n"),
        Some(holder) if holder.delay_until_unix_ms > 0 => format!(
            "{name}: in lock-delay until about {}: session {} ({}) expired holding it with fencing token {}; \
             nobody holds it, the first waiter gets it when the {} delay ends\n",
            unix_ms_text(holder.delay_until_unix_ms),
            holder.session_id,
            holder.client_name,
            holder.token,
            duration_text(holder.lock_delay_ms)
        ),
        Some(holder) if holder.lock_delay_ms > 0 => format!(
            "{name}: held by session {} ({}) with fencing token {}, lock-delay {}\n",
            holder.session_id,
            holder.client_name,
            holder.token,
            duration_text(holder.lock_delay_ms)
        ),
        Some(holder) => format!(
            "{name}: held by session {} ({}) with fencing token {}\n",
            holder.session_id, holder.client_name, holder.token
        ),
    };
    for (position, waiter) in lock.waiters.iter().enumerate() {
        let _ = writeln!(text, "  waiter {}: session {} ({})", position + 1, waiter.session_id, waiter.client_name);
    }
    text
}

/// `describe sem`: the limit, the holders with their tokens, the waiters in order.
pub fn semaphore(name: &str, semaphore: &pb::DescribeSemaphoreResponse, as_json: bool) -> String {
    if as_json {
        let holders: Vec<Value> = semaphore
            .holders
            .iter()
            .map(|holder| {
                holder_json(
                    holder.session_id,
                    &holder.client_name,
                    holder.token,
                    holder.since_unix_ms,
                    holder.lock_delay_ms,
                    holder.delay_until_unix_ms,
                )
            })
            .collect();
        let waiters: Vec<Value> = semaphore
            .waiters
            .iter()
            .map(|waiter| json!({"session_id": waiter.session_id, "client_name": waiter.client_name}))
            .collect();
        return format!(
            "{}\n",
            json!({"name": name, "limit": semaphore.limit, "holders": holders, "waiters": waiters})
        );
    }
    if semaphore.limit == 0 {
        return format!("{name}: no holders, no waiters\n");
    }
    let mut text = format!("{name}: {} of {} permits held\n", semaphore.holders.len(), semaphore.limit);
    for holder in &semaphore.holders {
        if holder.delay_until_unix_ms > 0 {
            let _ = writeln!(
                text,
                "  in lock-delay until about {}: session {} ({}) token {} expired",
                unix_ms_text(holder.delay_until_unix_ms),
                holder.session_id,
                holder.client_name,
                holder.token
            );
        } else {
            let _ = writeln!(
                text,
                "  holder: session {} ({}) token {}",
                holder.session_id, holder.client_name, holder.token
            );
        }
    }
    for (position, waiter) in semaphore.waiters.iter().enumerate() {
        let _ = writeln!(text, "  waiter {}: session {} ({})", position + 1, waiter.session_id, waiter.client_name);
    }
    text
}

/// `leader`, and each line of `observe`.
pub fn leader(name: &str, leader: Option<&Leader>, as_json: bool) -> String {
    match (leader, as_json) {
        (Some(leader), true) => format!(
            "{}\n",
            json!({"name": name, "leader": {"session_id": leader.session_id, "client_name": leader.client_name, "token": leader.token, "value": leader.value}})
        ),
        (None, true) => format!("{}\n", json!({"name": name, "leader": null})),
        (Some(leader), false) => format!(
            "{name}: leader {:?} (session {}, {}), token {}\n",
            leader.value, leader.session_id, leader.client_name, leader.token
        ),
        (None, false) => format!("{name}: vacant\n"),
    }
}

/// `fence check`'s answer; the exit code says the same.
pub fn fence_check(name: &str, token: u64, answer: &pb::CheckFenceResponse) -> String {
    if answer.current {
        format!("current: token {token} is the current grant of {name:?}\n")
    } else if answer.current_token == 0 {
        format!("superseded: {name:?} is free now; token {token} is no longer valid\n")
    } else {
        format!("superseded: the current grant of {name:?} is token {}\n", answer.current_token)
    }
}

/// The quota the server gives the admin namespace: none.
const QUOTA_NONE: u32 = u32::MAX;

/// A quota for JSON: null for none.
fn quota_json(quota: u32) -> Value {
    if quota == QUOTA_NONE {
        Value::Null
    } else {
        json!(quota)
    }
}

/// "3/10000": a usage against its quota; "3" when there is none.
fn usage_text(usage: u64, quota: u32) -> String {
    if quota == QUOTA_NONE {
        usage.to_string()
    } else {
        format!("{usage}/{quota}")
    }
}

/// `tenant list` and `tenant set-quotas`: per tenant, its usage against its quotas and
/// the replicated state it takes (as the server estimates it).
pub fn tenants(tenants: &[pb::TenantInfo], as_json: bool) -> String {
    if as_json {
        let rows: Vec<Value> = tenants
            .iter()
            .map(|tenant| {
                let quotas = tenant.quotas.unwrap_or_default();
                json!({"name": tenant.name, "sessions": tenant.sessions, "holds": tenant.holds, "waiters": tenant.waiters,
                       "state_bytes": tenant.state_bytes,
                       "quotas": {"max_sessions": quota_json(quotas.max_sessions), "max_holds": quota_json(quotas.max_holds),
                                  "max_waiters": quota_json(quotas.max_waiters), "weight": quotas.weight.max(1),
                                  "max_ops_per_second": quotas.max_ops_per_second.filter(|rate| *rate > 0)}})
            })
            .collect();
        return format!("{}\n", Value::Array(rows));
    }
    let header = ["TENANT", "SESSIONS", "HOLDS", "WAITERS", "STATE BYTES", "WEIGHT", "RATE QUOTA"];
    let rows: Vec<Vec<String>> = tenants
        .iter()
        .map(|tenant| {
            let quotas = tenant.quotas.unwrap_or_default();
            vec![
                tenant.name.clone(),
                usage_text(tenant.sessions, quotas.max_sessions),
                usage_text(tenant.holds, quotas.max_holds),
                usage_text(tenant.waiters, quotas.max_waiters),
                tenant.state_bytes.to_string(),
                quotas.weight.max(1).to_string(),
                match quotas.max_ops_per_second.unwrap_or(0) {
                    0 => "-".to_string(),
                    rate => format!("{rate}/s"),
                },
            ]
        })
        .collect();
    table(&header, &[1, 2, 3, 4, 5, 6], &rows)
}

fn held_json(held: &[pb::HeldLock]) -> Vec<Value> {
    held.iter().map(|held| json!({"name": held.name, "token": held.token})).collect()
}

/// `session list` and `describe session`: per session, what it holds with the tokens
/// (locks, semaphore permits, leaderships) and what it waits for.
pub fn sessions(sessions: &[pb::SessionInfo], as_json: bool) -> String {
    if as_json {
        let rows: Vec<Value> = sessions
            .iter()
            .map(|session| {
                json!({"session_id": session.session_id, "ttl_ms": session.ttl_ms, "client_name": session.client_name, "held": held_json(&session.held), "waiting": session.waiting,
                       "permits": held_json(&session.permits), "waiting_semaphores": session.waiting_semaphores, "leading": held_json(&session.leading), "campaigning": session.campaigning})
            })
            .collect();
        return format!("{}\n", Value::Array(rows));
    }
    let header = ["SESSION", "TTL", "CLIENT", "LOCKS (token)", "PERMITS (token)", "LEADS (token)", "WAITS FOR"];
    let rows: Vec<Vec<String>> = sessions
        .iter()
        .map(|session| {
            let waits: Vec<String> = (session.waiting.iter().map(|name| format!("lock {name}")))
                .chain(session.waiting_semaphores.iter().map(|name| format!("sem {name}")))
                .chain(session.campaigning.iter().map(|name| format!("election {name}")))
                .collect();
            vec![
                session.session_id.to_string(),
                ttl_text(session.ttl_ms),
                session.client_name.clone(),
                held_text(&session.held),
                held_text(&session.permits),
                held_text(&session.leading),
                list_text(&waits),
            ]
        })
        .collect();
    table(&header, &[1], &rows)
}

/// "10s", or "1500ms" when not whole seconds.
/// Milliseconds as the CLI's duration flags write them: `10s`, `1.5s`, `250ms`.
fn duration_text(ms: u64) -> String {
    match ms {
        ms if ms % 1_000 == 0 => format!("{}s", ms / 1_000),
        ms if ms > 1_000 => format!("{:.1}s", ms as f64 / 1_000.0),
        ms => format!("{ms}ms"),
    }
}

fn ttl_text(ttl_ms: u64) -> String {
    match (ttl_ms / 1_000, ttl_ms % 1_000) {
        (seconds, 0) => format!("{seconds}s"),
        _ => format!("{ttl_ms}ms"),
    }
}

/// "orders/42 (7), orders/43 (9)", or "-".
fn held_text(held: &[pb::HeldLock]) -> String {
    let held: Vec<String> = held.iter().map(|held| format!("{} ({})", held.name, held.token)).collect();
    list_text(&held)
}

fn list_text(items: &[String]) -> String {
    if items.is_empty() {
        CELL_EMPTY.to_string()
    } else {
        items.join(", ")
    }
}

/// A text table whose columns are as wide as their widest cell, two spaces apart;
/// the columns in `right_aligned` (by index) are aligned right, and the last column
/// is not padded.
fn table(header: &[&str], right_aligned: &[usize], rows: &[Vec<String>]) -> String {
    let header: Vec<String> = header.iter().map(|cell| cell.to_string()).collect();
    let mut widths: Vec<usize> = header.iter().map(|cell| cell.chars().count()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut text = String::new();
    for row in std::iter::once(&header).chain(rows) {
        let mut line = String::new();
        for (column, (cell, width)) in row.iter().zip(&widths).enumerate() {
            if column > 0 {
                line.push_str("  ");
            }
            let last = column + 1 == row.len();
            let _ = match (right_aligned.contains(&column), last) {
                (true, _) => write!(line, "{cell:>width$}"),
                (false, true) => write!(line, "{cell}"),
                (false, false) => write!(line, "{cell:<width$}"),
            };
        }
        text.push_str(line.trim_end());
        text.push('\n');
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leader_stamps_read_as_utc_times() {
        assert_eq!(unix_ms_text(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(unix_ms_text(951_782_400_000), "2000-02-29T00:00:00.000Z", "a leap day");
        assert_eq!(unix_ms_text(1_796_220_185_120), "2026-12-02T14:03:05.120Z");
    }

    #[test]
    fn describe_lock_says_when_a_lock_is_in_its_delay_and_shows_the_delay_of_a_grant() {
        let holder = pb::LockHolder {
            session_id: 12,
            client_name: "worker-1".to_string(),
            token: 40,
            since_unix_ms: 1_796_220_000_000,
            lock_delay_ms: 10_000,
            delay_until_unix_ms: 0,
        };
        let held = pb::DescribeLockResponse { holder: Some(holder.clone()), waiters: vec![] };
        assert_eq!(
            lock("mail", &held, false),
            "mail: held by session 12 (worker-1) with fencing token 40, lock-delay 10s\n"
        );
        let in_delay = pb::DescribeLockResponse {
            holder: Some(pb::LockHolder { delay_until_unix_ms: 1_796_220_185_120, ..holder }),
            waiters: vec![pb::LockWaiter { session_id: 13, client_name: "worker-2".to_string() }],
        };
        let text = lock("mail", &in_delay, false);
        assert!(
            text.starts_with("mail: in lock-delay until about 2026-12-02T14:03:05.120Z: session 12 (worker-1)"),
            "{text}"
        );
        assert!(text.contains("waiter 1: session 13 (worker-2)"), "{text}");
        let json: Value = serde_json::from_str(&lock("mail", &in_delay, true)).unwrap();
        assert_eq!(json["holder"]["in_delay_until_unix_ms"], 1_796_220_185_120u64);
        assert_eq!(json["holder"]["lock_delay_ms"], 10_000);
    }

    fn held(name: &str, token: u64) -> pb::HeldLock {
        pb::HeldLock { name: name.to_string(), token }
    }

    fn busy_session() -> pb::SessionInfo {
        pb::SessionInfo {
            session_id: 7,
            ttl_ms: 10_000,
            client_name: "host:1".to_string(),
            held: vec![held("orders/42", 5), held("orders/43", 6)],
            waiting: vec!["orders/44".to_string()],
            permits: vec![held("tenant-42", 9)],
            waiting_semaphores: vec!["tenant-43".to_string()],
            leading: vec![held("scheduler", 3)],
            campaigning: vec!["reporter".to_string()],
            tenant: "payments".to_string(),
        }
    }

    fn idle_session() -> pb::SessionInfo {
        pb::SessionInfo { session_id: 12, ttl_ms: 1_500, client_name: "h:2".to_string(), ..Default::default() }
    }

    #[test]
    fn the_session_table_shows_permits_leaderships_and_campaigns() {
        let text = sessions(&[busy_session(), idle_session()], false);
        let expected = "\
SESSION     TTL  CLIENT  LOCKS (token)                 PERMITS (token)  LEADS (token)  WAITS FOR
7           10s  host:1  orders/42 (5), orders/43 (6)  tenant-42 (9)    scheduler (3)  lock orders/44, sem tenant-43, election reporter
12       1500ms  h:2     -                             -                -              -
";
        assert_eq!(text, expected);
    }

    #[test]
    fn the_session_json_is_unchanged() {
        let text = sessions(&[busy_session()], true);
        let expected = concat!(
            r#"[{"campaigning":["reporter"],"client_name":"host:1","held":[{"name":"orders/42","token":5},{"name":"orders/43","token":6}],"#,
            r#""leading":[{"name":"scheduler","token":3}],"permits":[{"name":"tenant-42","token":9}],"session_id":7,"ttl_ms":10000,"#,
            r#""waiting":["orders/44"],"waiting_semaphores":["tenant-43"]}]"#,
            "\n"
        );
        assert_eq!(text, expected);
    }

    fn tenant(name: &str, quota: u32, sessions: u64, state_bytes: u64) -> pb::TenantInfo {
        pb::TenantInfo {
            name: name.to_string(),
            quotas: Some(pb::Quotas {
                max_sessions: quota,
                max_holds: quota,
                max_waiters: quota,
                ..pb::Quotas::default()
            }),
            sessions,
            holds: 2 * sessions,
            waiters: 0,
            state_bytes,
        }
    }

    #[test]
    fn the_tenant_table_shows_usage_against_quotas_and_none_for_the_admin() {
        let mut tenants = [tenant("admin", QUOTA_NONE, 0, 0), tenant("payments", 10_000, 12, 4_096)];
        let payments = tenants[1].quotas.as_mut().unwrap();
        (payments.weight, payments.max_ops_per_second) = (2, Some(500));
        let expected = "\
TENANT    SESSIONS     HOLDS  WAITERS  STATE BYTES  WEIGHT  RATE QUOTA
admin            0         0        0            0       1           -
payments  12/10000  24/10000  0/10000         4096       2       500/s
";
        assert_eq!(super::tenants(&tenants, false), expected);
        let json: Value = serde_json::from_str(&super::tenants(&tenants, true)).unwrap();
        assert_eq!(json[0]["quotas"]["weight"], 1, "the default weight");
        assert_eq!(json[0]["quotas"]["max_ops_per_second"], Value::Null, "no rate quota is null");
        assert_eq!(
            (json[1]["quotas"]["weight"].clone(), json[1]["quotas"]["max_ops_per_second"].clone()),
            (2.into(), 500.into())
        );
        assert_eq!(json[0]["quotas"]["max_sessions"], Value::Null, "no quota is null");
        assert_eq!(json[1]["quotas"]["max_holds"], 10_000);
        assert_eq!(json[1]["sessions"], 12);
        assert_eq!(json[1]["state_bytes"], 4_096);
    }

    #[test]
    fn status_warns_of_plaintext_and_shows_the_state_against_its_budget() {
        let node = |node_id: u64, state_bytes: u64| pb::StatusResponse {
            node_id,
            leader_id: 2,
            state_bytes,
            state_budget_bytes: 1 << 30,
            sessions: 3,
            locks: 2,
            insecure_plaintext: node_id == 1,
            ..Default::default()
        };
        let rows = vec![("a:1".to_string(), Ok(node(1, 100))), ("b:2".to_string(), Ok(node(2, 3 << 20)))];
        let text = status(&rows, false);
        assert!(text.contains("WARNING: node 1 (a:1) serves without TLS"), "{text}");
        assert!(!text.contains("WARNING: node 2"), "{text}");
        assert!(
            text.contains(
                "state: 3.0 MiB of the 1.0 GiB budget (0.3%); 3 sessions, 2 locks, 0 semaphores, 0 elections"
            ),
            "the leader's count: {text}"
        );
        let json: Value = serde_json::from_str(&status(&rows, true)).unwrap();
        assert_eq!(json["nodes"][0]["insecure_plaintext"], true);
        assert_eq!(json["nodes"][1]["state_bytes"], 3 << 20);
        assert_eq!(bytes_text(512), "512 B");
        assert_eq!(bytes_text(1536), "1.5 KiB");
    }

    #[test]
    fn status_shows_the_round_trip_each_node_measures_to_each_other_member() {
        let member = |node_id: u64, round_trip: Option<pb::RoundTrip>| pb::Member {
            node_id,
            role: "voter".to_string(),
            round_trip,
            ..Default::default()
        };
        let trip = |median_us: u64| pb::RoundTrip { median_us, last_us: median_us, samples: 16, measured_ms_ago: 40 };
        let node =
            |node_id: u64, members: Vec<pb::Member>| pb::StatusResponse { node_id, members, ..Default::default() };
        let rows = vec![
            (
                "a:1".to_string(),
                Ok(node(1, vec![member(1, None), member(2, Some(trip(310))), member(3, Some(trip(42_400)))])),
            ),
            ("b:2".to_string(), Ok(node(2, vec![member(1, Some(trip(290))), member(2, None), member(3, None)]))),
        ];
        let text = status(&rows, false);
        assert!(text.contains("  node 1: to node 2 0.31 ms (0.0 s ago), to node 3 42 ms (0.0 s ago)\n"), "{text}");
        assert!(text.contains("  node 2: to node 1 0.29 ms (0.0 s ago), to node 3 not measured\n"), "{text}");
        let json: Value = serde_json::from_str(&status(&rows, true)).unwrap();
        assert_eq!(json["nodes"][0]["round_trips"][1]["peer"], 3);
        assert_eq!(json["nodes"][0]["round_trips"][1]["median_us"], 42_400);
        assert_eq!(json["nodes"][1]["round_trips"].as_array().map(Vec::len), Some(1));
        let unmeasured = vec![("a:1".to_string(), Ok(node(1, vec![member(1, None), member(2, None)])))];
        assert!(!status(&unmeasured, false).contains("round trips"), "a tenant's answer, or an older build's");
    }

    #[test]
    fn an_unreachable_node_is_a_row_and_members_come_from_one_that_answered() {
        let answered = pb::StatusResponse {
            node_id: 1,
            state: "Leader".to_string(),
            term: 2,
            leader_id: 1,
            members: vec![pb::Member {
                node_id: 1,
                client_addr: "127.0.0.1:7101".to_string(),
                peer_addr: "127.0.0.1:7201".to_string(),
                role: "voter".to_string(),
                incarnation: 42,
                round_trip: None,
            }],
            cluster_id: "00ab".to_string(),
            ..Default::default()
        };
        let rows = vec![
            ("127.0.0.1:7101".to_string(), Ok(answered)),
            ("127.0.0.1:7102".to_string(), Err(Error::Unavailable("127.0.0.1:7102: no answer".to_string()))),
        ];
        let text = status(&rows, false);
        assert!(
            text.contains("127.0.0.1:7102         unreachable: unavailable: 127.0.0.1:7102: no answer\n"),
            "{text}"
        );
        assert!(text.ends_with("1      voter    127.0.0.1:7101         127.0.0.1:7201         42\n"), "{text}");
        assert!(text.contains("cluster id: 00ab\n"), "{text}");
        assert!(!text.contains("WARNING"), "{text}");
        let json: Value = serde_json::from_str(&status(&rows, true)).unwrap();
        assert_eq!(json["nodes"][1]["reachable"], false);
        assert_eq!(json["members"][0]["client_addr"], "127.0.0.1:7101");
        assert_eq!(json["members"][0]["incarnation"], 42);
        assert_eq!(json["nodes"][0]["cluster_id"], "00ab");
    }
}
