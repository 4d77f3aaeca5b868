//! White-box checks between steps: every running node's state keeps the machine's
//! invariants, and two nodes that applied up to the same index hold the same state
//! (the same log gives byte-identical state, so a difference means one applied an
//! entry differently, or applied another entry at that index).

use std::collections::hash_map::DefaultHasher;
use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use leasehold_jepsen::checker::{Anomaly, CheckResult, Verdict};
use leasehold_server::raft::replica::Replica;
use leasehold_server::shell::fail_stop;

use crate::host::SimulatedNode;

/// Anomalies kept at most; one is enough to fail the seed.
const ANOMALIES_MAX: usize = 8;

#[derive(Default)]
pub struct ReplicaChecks {
    /// Per applied index, the first node seen there and its state's digest.
    seen: BTreeMap<u64, (u64, u64)>,
    /// Per node, the replica and the index it was last looked at: the machine
    /// changes only by applying, so a node still there is not looked at again.
    looked_at: BTreeMap<u64, (Arc<Replica>, u64)>,
    samples: u64,
    compared: u64,
    anomalies: Vec<Anomaly>,
}

impl ReplicaChecks {
    /// Looks at every running node that applied an entry (or started again) since it
    /// was last looked at, at simulated time `now_ms`.
    pub fn sample(&mut self, nodes: &[Arc<SimulatedNode>], now_ms: u128) {
        for node in nodes {
            let Some(replica) = node.replica.lock().unwrap().clone() else { continue };
            let applied = replica.shared.applied.read().unwrap();
            let index = applied.last_applied.map(|log_id| log_id.index).unwrap_or(0);
            let unchanged =
                self.looked_at.get(&node.id).is_some_and(|(before, at)| Arc::ptr_eq(before, &replica) && *at == index);
            if unchanged {
                continue;
            }
            self.looked_at.insert(node.id, (replica.clone(), index));
            let invariants = fail_stop::catching(|| applied.machine.check_invariants());
            let mut hasher = DefaultHasher::new();
            applied.machine.snapshot_into(Vec::new()).hash(&mut hasher);
            self.observe(now_ms, node.id, index, hasher.finish(), invariants);
        }
    }

    /// One node's state: applied up to `index`, with this digest and this outcome of
    /// the invariant check.
    fn observe(&mut self, now_ms: u128, node: u64, index: u64, digest: u64, invariants: Result<(), String>) {
        self.samples += 1;
        if let Err(reason) = invariants {
            self.note(format!("{now_ms} ms: node {node} at index {index} breaks an invariant: {reason}"));
        }
        match self.seen.get(&index) {
            None => {
                self.seen.insert(index, (node, digest));
            }
            Some(&(first, theirs)) => {
                self.compared += 1;
                if theirs != digest {
                    self.note(format!(
                        "{now_ms} ms: nodes {first} and {node} hold different states at applied index {index}"
                    ));
                }
            }
        }
    }

    fn note(&mut self, what: String) {
        if self.anomalies.len() < ANOMALIES_MAX {
            self.anomalies.push(Anomaly { what, operations: Vec::new() });
        }
    }

    pub fn result(self) -> CheckResult {
        CheckResult {
            name: "replicas (white-box)",
            verdict: if self.anomalies.is_empty() { Verdict::Pass } else { Verdict::Fail },
            detail: format!(
                "{} samples of a node's state, {} compared with another node's at the same index",
                self.samples, self.compared
            ),
            anomalies: self.anomalies,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agreeing_replicas_pass_and_a_divergence_or_a_broken_invariant_fails() {
        let mut checks = ReplicaChecks::default();
        checks.observe(10, 1, 5, 0xaa, Ok(()));
        checks.observe(10, 2, 5, 0xaa, Ok(()));
        checks.observe(20, 3, 7, 0xbb, Ok(()));
        let result = checks.result();
        assert_eq!(result.verdict, Verdict::Pass, "{:?}", result.anomalies.first().map(|a| &a.what));
        assert!(result.detail.starts_with("3 samples"), "{}", result.detail);

        let mut checks = ReplicaChecks::default();
        checks.observe(10, 1, 5, 0xaa, Ok(()));
        checks.observe(30, 2, 5, 0xab, Ok(()));
        let result = checks.result();
        assert_eq!(result.verdict, Verdict::Fail);
        assert_eq!(result.anomalies[0].what, "30 ms: nodes 1 and 2 hold different states at applied index 5");

        let mut checks = ReplicaChecks::default();
        checks.observe(40, 2, 9, 0xcc, Err("a lock held by a session that does not exist".into()));
        assert_eq!(checks.result().verdict, Verdict::Fail);
    }
}
