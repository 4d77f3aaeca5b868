//! Results: one JSON line per run, a table per run, and the summary over rounds
//! (medians per system and transport, the ratios Leasehold/etcd and Leasehold/Redis,
//! and each system's TLS/plaintext ratio when it was measured both ways).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::target::{System, TargetKind};
use crate::transport::Transport;
use crate::workload::Workload;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    /// Free text from the caller, e.g. the round number.
    pub label: String,
    pub target: TargetKind,
    /// How the clients reached the system; runs of one system over TLS and in
    /// plaintext are summarized apart.
    #[serde(default)]
    pub transport: Transport,
    pub workload: Workload,
    pub clients: usize,
    pub duration_s: f64,
    /// Operations completed in the measured window: cycles, handoffs, keepalives.
    pub operations: u64,
    pub operations_per_s: f64,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub p999_ms: Option<f64>,
    pub errors: u64,
    /// CPU seconds (user + system) of the server processes during the window.
    pub server_cpu_s: Option<f64>,
    pub server_cpu_ms_per_op: Option<f64>,
    /// False when a server process was gone at the end (the failover's victim).
    pub server_cpu_complete: bool,
    pub failover: Option<Failover>,
    pub error_samples: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Failover {
    pub killed_endpoint: String,
    /// From the kill to the first client's first success (an operation started after
    /// the kill).
    pub first_success_ms: Option<f64>,
    pub median_client_back_ms: Option<f64>,
    /// From the kill until every client had succeeded again; None if one never did.
    pub all_clients_back_ms: Option<f64>,
    pub clients_not_back: usize,
    pub errors_after_kill: u64,
}

/// The value at quantile `quantile` of sorted microseconds, in milliseconds.
pub fn percentile_ms(sorted_us: &[u64], quantile: f64) -> Option<f64> {
    if sorted_us.is_empty() {
        return None;
    }
    let rank = ((sorted_us.len() as f64) * quantile).ceil() as usize;
    let index = rank.clamp(1, sorted_us.len()) - 1;
    Some(sorted_us[index] as f64 / 1e3)
}

fn cell(value: Option<f64>, decimals: usize) -> String {
    value.map_or_else(|| "-".to_string(), |value| format!("{value:.decimals$}"))
}

impl Report {
    pub fn system(&self) -> System {
        System { target: self.target, transport: self.transport }
    }

    pub fn table(&self) -> String {
        let mut text = String::new();
        let _ = writeln!(
            text,
            "{:<21} {:<11} {:>7} {:>12} {:>9} {:>9} {:>9} {:>7} {:>12}",
            "target", "workload", "clients", "ops/s", "p50 ms", "p99 ms", "p999 ms", "errors", "cpu ms/op"
        );
        let _ = writeln!(
            text,
            "{:<21} {:<11} {:>7} {:>12.1} {:>9} {:>9} {:>9} {:>7} {:>12}",
            self.system().name(),
            self.workload.name(),
            self.clients,
            self.operations_per_s,
            cell(self.p50_ms, 2),
            cell(self.p99_ms, 2),
            cell(self.p999_ms, 2),
            self.errors,
            cell(self.server_cpu_ms_per_op, 3),
        );
        if let Some(failover) = &self.failover {
            let _ = writeln!(
                text,
                "failover: killed {}; first success after {} ms, median client back after {} ms, all back after {} ms \
                 ({} never), {} errors after the kill",
                failover.killed_endpoint,
                cell(failover.first_success_ms, 0),
                cell(failover.median_client_back_ms, 0),
                cell(failover.all_clients_back_ms, 0),
                failover.clients_not_back,
                failover.errors_after_kill,
            );
        }
        for sample in &self.error_samples {
            let _ = writeln!(text, "error: {sample}");
        }
        text
    }
}

/// The metrics compared per workload: name, how to read it, and whether more is
/// better (the ratio is printed as Leasehold/other either way).
type Metric = (&'static str, fn(&Report) -> Option<f64>);

fn metrics(workload: Workload) -> Vec<Metric> {
    let mut metrics: Vec<Metric> = match workload {
        Workload::Failover => vec![
            ("first success ms", |report| report.failover.as_ref()?.first_success_ms),
            ("all clients back ms", |report| report.failover.as_ref()?.all_clients_back_ms),
            ("errors after kill", |report| Some(report.failover.as_ref()?.errors_after_kill as f64)),
        ],
        _ => vec![
            ("ops/s", |report| Some(report.operations_per_s)),
            ("p50 ms", |report| report.p50_ms),
            ("p99 ms", |report| report.p99_ms),
            ("p999 ms", |report| report.p999_ms),
            ("server cpu ms/op", |report| report.server_cpu_ms_per_op),
        ],
    };
    if workload == Workload::Contended {
        metrics[0].0 = "handoffs/s";
        metrics[1].0 = "wait p50 ms";
        metrics[2].0 = "wait p99 ms";
        metrics[3].0 = "wait p999 ms";
    }
    if workload == Workload::Keepalive {
        metrics[0].0 = "keepalives/s";
    }
    metrics
}

fn median(mut values: Vec<f64>) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let middle = values.len() / 2;
    Some(if values.len() % 2 == 1 { values[middle] } else { (values[middle - 1] + values[middle]) / 2.0 })
}

fn ratio(numerator: Option<f64>, denominator: Option<f64>) -> Option<f64> {
    match (numerator, denominator) {
        (Some(numerator), Some(denominator)) if denominator > 0.0 => Some(numerator / denominator),
        _ => None,
    }
}

/// A ratio column of the summary: `numerator`'s median over `denominator`'s.
struct RatioColumn {
    header: String,
    numerator: System,
    denominator: System,
}

/// The ratio columns for the systems measured: Leasehold over etcd and over Redis
/// (Leasehold over TLS when it was measured so, against etcd over the same transport
/// when there is one), then each system's TLS over its plaintext.
fn ratio_columns(systems: &[System]) -> Vec<RatioColumn> {
    let of = |target: TargetKind| systems.iter().copied().filter(move |system| system.target == target);
    let mut columns = Vec::new();
    // `systems` is sorted, TLS before plaintext: the first of a kind is its TLS run if any.
    if let Some(leasehold) = of(TargetKind::Leasehold).next() {
        for other in [TargetKind::Etcd, TargetKind::Redis] {
            let same_transport = of(other).find(|system| system.transport == leasehold.transport);
            if let Some(denominator) = same_transport.or_else(|| of(other).next()) {
                let header = if same_transport.is_some() {
                    format!("leasehold/{} ({})", other.name(), leasehold.transport.name())
                } else {
                    format!("{}/{}", leasehold.name(), denominator.name())
                };
                columns.push(RatioColumn { header, numerator: leasehold, denominator });
            }
        }
    }
    for target in [TargetKind::Leasehold, TargetKind::Etcd, TargetKind::Redis] {
        let tls = System { target, transport: Transport::Tls };
        let plaintext = System { target, transport: Transport::Plaintext };
        if systems.contains(&tls) && systems.contains(&plaintext) {
            columns.push(RatioColumn {
                header: format!("{} TLS/plaintext", target.name()),
                numerator: tls,
                denominator: plaintext,
            });
        }
    }
    columns
}

/// The table of medians over rounds, per workload and metric, one column per system
/// and transport measured, with the ratios of `ratio_columns`, as Markdown.
pub fn summarize(reports: &[Report]) -> String {
    let mut grouped: BTreeMap<(Workload, usize), BTreeMap<System, Vec<&Report>>> = BTreeMap::new();
    for report in reports {
        grouped.entry((report.workload, report.clients)).or_default().entry(report.system()).or_default().push(report);
    }
    let mut systems: Vec<System> = reports.iter().map(Report::system).collect();
    systems.sort();
    systems.dedup();
    let ratios = ratio_columns(&systems);
    let mut text = String::new();
    let mut header = String::from("| workload | clients | metric |");
    let mut rule = String::from("|---|---:|---|");
    for system in &systems {
        let _ = write!(header, " {} |", system.name());
        rule.push_str("---:|");
    }
    for column in &ratios {
        let _ = write!(header, " {} |", column.header);
        rule.push_str("---:|");
    }
    let _ = writeln!(text, "{header} rounds |");
    let _ = writeln!(text, "{rule}---:|");
    for ((workload, clients), by_system) in &grouped {
        let rounds = by_system.values().map(Vec::len).max().unwrap_or(0);
        for (metric, read) in metrics(*workload) {
            let median_of = |system: System| {
                by_system
                    .get(&system)
                    .and_then(|reports| median(reports.iter().filter_map(|report| read(report)).collect()))
            };
            let decimals = if metric.ends_with("/s") { 0 } else { 3 };
            let mut row = format!("| {} | {} | {} |", workload.name(), clients, metric);
            for system in &systems {
                let _ = write!(row, " {} |", cell(median_of(*system), decimals));
            }
            for column in &ratios {
                let _ =
                    write!(row, " {} |", cell(ratio(median_of(column.numerator), median_of(column.denominator)), 2));
            }
            let _ = writeln!(text, "{row} {rounds} |");
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_pick_the_rank() {
        let sorted: Vec<u64> = (1..=1000).map(|value| value * 1000).collect();
        assert_eq!(percentile_ms(&sorted, 0.5), Some(500.0));
        assert_eq!(percentile_ms(&sorted, 0.99), Some(990.0));
        assert_eq!(percentile_ms(&sorted, 0.999), Some(999.0));
        assert_eq!(percentile_ms(&[], 0.5), None);
    }

    fn report(target: TargetKind, transport: Transport, operations_per_s: f64) -> Report {
        Report {
            label: String::new(),
            target,
            transport,
            workload: Workload::LockCycle,
            clients: 64,
            duration_s: 1.0,
            operations: operations_per_s as u64,
            operations_per_s,
            p50_ms: None,
            p99_ms: None,
            p999_ms: None,
            errors: 0,
            server_cpu_s: None,
            server_cpu_ms_per_op: None,
            server_cpu_complete: true,
            failover: None,
            error_samples: Vec::new(),
        }
    }

    #[test]
    fn summary_separates_tls_from_plaintext_and_prints_their_ratio() {
        let reports = [
            report(TargetKind::Leasehold, Transport::Tls, 900.0),
            report(TargetKind::Leasehold, Transport::Plaintext, 1000.0),
            report(TargetKind::Etcd, Transport::Tls, 300.0),
            report(TargetKind::Redis, Transport::Plaintext, 4500.0),
        ];
        let summary = summarize(&reports);
        let mut lines = summary.lines();
        assert_eq!(
            lines.next().unwrap(),
            "| workload | clients | metric | leasehold (TLS) | leasehold (plaintext) | etcd (TLS) | redis (plaintext) \
             | leasehold/etcd (TLS) | leasehold (TLS)/redis (plaintext) | leasehold TLS/plaintext | rounds |"
        );
        lines.next();
        assert_eq!(
            lines.next().unwrap(),
            "| lock-cycle | 64 | ops/s | 900 | 1000 | 300 | 4500 | 3.00 | 0.20 | 0.90 | 1 |"
        );
    }

    #[test]
    fn a_line_without_a_transport_is_plaintext() {
        let mut line = serde_json::to_value(report(TargetKind::Etcd, Transport::Tls, 1.0)).unwrap();
        line.as_object_mut().unwrap().remove("transport");
        let read: Report = serde_json::from_value(line).unwrap();
        assert_eq!(read.transport, Transport::Plaintext);
    }

    #[test]
    fn medians_of_odd_and_even_counts() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(vec![]), None);
    }
}
