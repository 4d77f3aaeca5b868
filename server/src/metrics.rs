//! A Prometheus text endpoint (`GET /metrics`) on its own address.
//!
//! The figures are read from openraft's metrics and the applied state when scraped,
//! so the hot paths do no bookkeeping for them.

use std::fmt::Write as _;
use std::sync::Arc;

use openraft::ServerState;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::replica::Replica;

/// A scrape request larger than this is answered 400 without reading further.
pub const SCRAPE_REQUEST_BYTES_MAX: usize = 8 * 1024;

pub fn render(replica: &Replica) -> String {
    let metrics = replica.raft.metrics().borrow().clone();
    let (sessions, locks) = {
        let applied = replica.shared.applied.read().unwrap();
        (
            applied.machine.session_count(),
            applied.machine.lock_count(),
        )
    };
    let mut text = String::new();
    let mut gauge = |name: &str, help: &str, value: u64| {
        let _ = writeln!(
            text,
            "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}"
        );
    };
    gauge(
        "leasehold_raft_term",
        "Current Raft term.",
        metrics.current_term,
    );
    gauge(
        "leasehold_raft_is_leader",
        "1 when this node is the leader.",
        (metrics.state == ServerState::Leader) as u64,
    );
    gauge(
        "leasehold_raft_last_log_index",
        "Index of the last log entry.",
        metrics.last_log_index.unwrap_or(0),
    );
    gauge(
        "leasehold_raft_applied_index",
        "Index of the last applied entry.",
        metrics.last_applied.map(|l| l.index).unwrap_or(0),
    );
    gauge(
        "leasehold_raft_snapshot_index",
        "Last index in the latest snapshot.",
        metrics.snapshot.map(|l| l.index).unwrap_or(0),
    );
    gauge(
        "leasehold_raft_members",
        "Members (voters and learners).",
        metrics.membership_config.membership().nodes().count() as u64,
    );
    gauge(
        "leasehold_sessions",
        "Live sessions in the applied state.",
        sessions as u64,
    );
    gauge(
        "leasehold_locks",
        "Locks held or waited for in the applied state.",
        locks as u64,
    );
    gauge(
        "leasehold_lease_deadlines",
        "Session deadlines this node tracks.",
        replica.shared.leases.len() as u64,
    );
    text
}

pub async fn serve(
    listener: TcpListener,
    replica: Arc<Replica>,
    mut stopped: watch::Receiver<bool>,
) {
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stopped.wait_for(|stop| *stop) => return,
        };
        let Ok((mut stream, _)) = accepted else {
            continue;
        };
        let replica = replica.clone();
        tokio::spawn(async move {
            let mut request = vec![0u8; SCRAPE_REQUEST_BYTES_MAX];
            let Ok(read) = stream.read(&mut request).await else {
                return;
            };
            let head = String::from_utf8_lossy(&request[..read]);
            let (status, body) = if head.starts_with("GET /metrics") {
                ("200 OK", render(&replica))
            } else {
                (
                    "404 Not Found",
                    "only GET /metrics is served here\n".to_string(),
                )
            };
            let response = format!(
                "HTTP/1.0 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(response.as_bytes()).await;
        });
    }
}
