//! Results: one JSON line per run, a table per run, and the summary over rounds
//! (medians per system and the ratios Leasehold/etcd and Leasehold/Redis).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::target::TargetKind;
use crate::workload::Workload;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    /// Free text from the caller, e.g. the round number.
    pub label: String,
    pub target: TargetKind,
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
    pub fn table(&self) -> String {
        let mut text = String::new();
        let _ = writeln!(
            text,
            "{:<10} {:<11} {:>7} {:>12} {:>9} {:>9} {:>9} {:>7} {:>12}",
            "target", "workload", "clients", "ops/s", "p50 ms", "p99 ms", "p999 ms", "errors", "cpu ms/op"
        );
        let _ = writeln!(
            text,
            "{:<10} {:<11} {:>7} {:>12.1} {:>9} {:>9} {:>9} {:>7} {:>12}",
            self.target.name(),
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

/// The table of medians over rounds, per workload and metric, with the ratios
/// Leasehold/etcd and Leasehold/Redis, as Markdown.
pub fn summarize(reports: &[Report]) -> String {
    let mut grouped: BTreeMap<(Workload, usize), BTreeMap<TargetKind, Vec<&Report>>> = BTreeMap::new();
    for report in reports {
        grouped.entry((report.workload, report.clients)).or_default().entry(report.target).or_default().push(report);
    }
    let mut text = String::new();
    let _ = writeln!(
        text,
        "| workload | clients | metric | leasehold | etcd | redis | leasehold/etcd | leasehold/redis | rounds |"
    );
    let _ = writeln!(text, "|---|---:|---|---:|---:|---:|---:|---:|---:|");
    for ((workload, clients), by_target) in &grouped {
        let rounds = by_target.values().map(Vec::len).max().unwrap_or(0);
        for (metric, read) in metrics(*workload) {
            let median_of = |target: TargetKind| {
                by_target
                    .get(&target)
                    .and_then(|reports| median(reports.iter().filter_map(|report| read(report)).collect()))
            };
            let (leasehold, etcd, redis) =
                (median_of(TargetKind::Leasehold), median_of(TargetKind::Etcd), median_of(TargetKind::Redis));
            let decimals = if metric.ends_with("/s") { 0 } else { 3 };
            let _ = writeln!(
                text,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                workload.name(),
                clients,
                metric,
                cell(leasehold, decimals),
                cell(etcd, decimals),
                cell(redis, decimals),
                cell(ratio(leasehold, etcd), 2),
                cell(ratio(leasehold, redis), 2),
                rounds,
            );
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

    #[test]
    fn medians_of_odd_and_even_counts() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(vec![]), None);
    }
}
