//! The grey faults' figures: what a slow link, a starved CPU or a slow disk did to
//! the cluster while it lasted, set beside the calm stretches of the same run.
//!
//! For every grey fault the harness records whom it slowed (the leader or a
//! follower), how many terms began while it lasted (each a needless election: no
//! node stopped) and whether leadership moved off a slowed leader. The summary adds,
//! per fault and role, the lock acquires that completed inside the faults' windows
//! (count per second, p50 and p99 of invoke to ok), against those of the calm
//! stretches: no fault, and at least `SETTLE_NS` after the last one ended.

use std::collections::BTreeMap;

use crate::history::{Function, Kind, Operation};
use crate::nemesis::FaultRecord;

/// After a fault ends, how long the cluster is not yet counted as calm (a new
/// leader's first heartbeats, clients finding it).
pub const SETTLE_NS: u64 = 2_000_000_000;

/// One grey fault, as it went.
#[derive(Debug, Clone)]
pub struct GreyObservation {
    pub fault: &'static str,
    /// "leader" or "follower": what the slowed node was when the fault began.
    pub role: &'static str,
    pub start_ns: u64,
    pub end_ns: u64,
    /// Terms that began while it lasted.
    pub elections: u64,
    /// For a slowed leader: whether another node led when the fault ended.
    pub leadership_moved: bool,
}

/// Lock acquires that completed ok: (invoke, latency) in nanoseconds.
fn acquires(operations: &[Operation]) -> Vec<(u64, u64)> {
    operations
        .iter()
        .filter(|operation| operation.function == Function::Acquire && operation.outcome == Kind::Ok)
        .filter_map(|operation| {
            operation.complete_ns.map(|complete| (operation.invoke_ns, complete.saturating_sub(operation.invoke_ns)))
        })
        .collect()
}

/// The value at `quantile` of `sorted` (nearest rank), in milliseconds.
fn rank_ms(sorted: &[u64], quantile: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((quantile * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    Some(sorted[rank - 1] as f64 / 1e6)
}

/// Acquires per second, p50 and p99 of the acquires invoked inside `windows`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Latency {
    pub count: usize,
    pub per_second: f64,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
}

fn latency(acquires: &[(u64, u64)], windows: &[(u64, u64)]) -> Latency {
    let mut inside: Vec<u64> = acquires
        .iter()
        .filter(|(invoke, _)| windows.iter().any(|(start, end)| invoke >= start && invoke < end))
        .map(|(_, latency)| *latency)
        .collect();
    inside.sort_unstable();
    let seconds: f64 = windows.iter().map(|(start, end)| end.saturating_sub(*start) as f64 / 1e9).sum();
    Latency {
        count: inside.len(),
        per_second: if seconds > 0.0 { inside.len() as f64 / seconds } else { 0.0 },
        p50_ms: rank_ms(&inside, 0.5),
        p99_ms: rank_ms(&inside, 0.99),
    }
}

/// The calm stretches of [`begin`, `end`): outside every fault and its settling time.
fn calm_windows(faults: &[FaultRecord], begin: u64, end: u64) -> Vec<(u64, u64)> {
    let mut busy: Vec<(u64, u64)> =
        faults.iter().map(|fault| (fault.start_ns, fault.end_ns.max(fault.start_ns) + SETTLE_NS)).collect();
    busy.sort_unstable();
    let mut calm = Vec::new();
    let mut from = begin;
    for (start, stop) in busy {
        if start > from {
            calm.push((from, start.min(end)));
        }
        from = from.max(stop);
    }
    if from < end {
        calm.push((from, end));
    }
    calm.retain(|(start, stop)| stop > start);
    calm
}

fn show(value: Option<f64>) -> String {
    value.map_or("-".to_string(), |ms| format!("{ms:.1}"))
}

/// The summary's lines for the grey faults of a run whose workers ran from `begin`
/// to `end` (monotonic nanoseconds); none when the run had no grey fault.
pub fn figures(
    observations: &[GreyObservation],
    faults: &[FaultRecord],
    operations: &[Operation],
    begin: u64,
    end: u64,
) -> Vec<String> {
    if observations.is_empty() {
        return Vec::new();
    }
    let acquires = acquires(operations);
    let calm = latency(&acquires, &calm_windows(faults, begin, end));
    let mut lines = vec![
        "grey faults (acquires ok invoked inside the faults' windows; calm: no fault for 2 s):".to_string(),
        format!(
            "  {:<24} {:>3}   acquires/s {:>6.1}   p50 {:>7} ms   p99 {:>7} ms",
            "calm",
            "",
            calm.per_second,
            show(calm.p50_ms),
            show(calm.p99_ms)
        ),
    ];
    let mut groups: BTreeMap<(&str, &str), Vec<&GreyObservation>> = BTreeMap::new();
    for observation in observations {
        groups.entry((observation.fault, observation.role)).or_default().push(observation);
    }
    for ((fault, role), group) in groups {
        let windows: Vec<(u64, u64)> =
            group.iter().map(|observation| (observation.start_ns, observation.end_ns)).collect();
        let inside = latency(&acquires, &windows);
        let elections: u64 = group.iter().map(|observation| observation.elections).sum();
        let moved = group.iter().filter(|observation| observation.leadership_moved).count();
        let moved = if role == "leader" { format!("   leadership moved {moved}") } else { String::new() };
        lines.push(format!(
            "  {:<24} {:>3}   acquires/s {:>6.1}   p50 {:>7} ms   p99 {:>7} ms   elections {elections}{moved}",
            format!("{fault} ({role})"),
            group.len(),
            inside.per_second,
            show(inside.p50_ms),
            show(inside.p99_ms),
        ));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::test_operation;
    use crate::nemesis::Outcome;

    fn acquire(invoke_ms: u64, latency_ms: u64) -> Operation {
        let times = (invoke_ms * 1_000_000, Some((invoke_ms + latency_ms) * 1_000_000));
        test_operation(1, Function::Acquire, Kind::Ok, "k", 1, Some(invoke_ms), times)
    }

    fn fault(start_ms: u64, end_ms: u64) -> FaultRecord {
        FaultRecord {
            fault: "slow-disk",
            outcome: Outcome::Installed,
            targets: vec![1],
            detail: String::new(),
            start_ns: start_ms * 1_000_000,
            end_ns: end_ms * 1_000_000,
        }
    }

    #[test]
    fn calm_excludes_faults_and_their_settling() {
        let calm = calm_windows(&[fault(1_000, 2_000), fault(3_000, 3_500)], 0, 10_000_000_000);
        assert_eq!(calm, vec![(0, 1_000_000_000), (5_500_000_000, 10_000_000_000)]);
        assert!(calm_windows(&[fault(0, 9_000)], 0, 10_000_000_000).is_empty());
    }

    #[test]
    fn the_figures_set_a_slow_window_beside_the_calm() {
        // Calm acquires take 2 ms; those inside the fault take 40 ms.
        let mut operations: Vec<Operation> = (0..100).map(|at| acquire(at * 10, 2)).collect();
        operations.extend((0..10).map(|at| acquire(20_000 + at * 100, 40)));
        let faults = [fault(20_000, 21_000)];
        let observations = [GreyObservation {
            fault: "slow-disk",
            role: "leader",
            start_ns: 20_000_000_000,
            end_ns: 21_000_000_000,
            elections: 1,
            leadership_moved: true,
        }];
        let lines = figures(&observations, &faults, &operations, 0, 30_000_000_000);
        assert_eq!(lines.len(), 3, "{lines:?}");
        assert!(lines[1].contains("p50     2.0 ms") && lines[1].contains("p99     2.0 ms"), "{}", lines[1]);
        let slow = &lines[2];
        assert!(slow.starts_with("  slow-disk (leader)"), "{slow}");
        assert!(slow.contains("acquires/s   10.0") && slow.contains("p99    40.0 ms"), "{slow}");
        assert!(slow.contains("elections 1") && slow.contains("leadership moved 1"), "{slow}");
        assert!(figures(&[], &faults, &operations, 0, 1).is_empty(), "no grey fault, no lines");
    }
}
