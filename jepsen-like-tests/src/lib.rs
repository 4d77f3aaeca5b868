//! Leasehold's fault-injection suite and the test support it shares with the
//! cluster tests: real `leasehold-server` processes, a fenced store, waits with
//! deadlines, and the `leasehold-jepsen run` harness (workloads, nemesis, history,
//! checkers).
//!
//! # Layout
//!
//! * `cluster` — start, kill, pause, restart real server processes on loopback
//!   (ephemeral ports, or one address per node for the private namespace).
//! * `fenced_store` — a store that keeps the highest fencing token per resource and
//!   rejects lower ones, served over TCP to worker processes.
//! * `wait` — waiting on a condition with a deadline and a reason.
//! * `https` — one HTTPS (or HTTP) GET, as a scraper or a browser sends it, to the
//!   metrics and status ports.
//! * `grants` — locks the cluster tests take and check survived.
//! * `lock_holder` — a `leasehold lock` process as a holder the tests kill.
//! * `worker` — the worker process used by tests (`leasehold-jepsen worker …`).
//! * `history` — invoke/ok/fail/info records with CLOCK_MONOTONIC timestamps.
//! * `workload` — the workloads and their worker process
//!   (`leasehold-jepsen workload-worker …`).
//! * `attack` — the attack workload: a second tenant that keeps trying to get past
//!   the trust rules (no credential, admin RPCs, other sessions, other tenants'
//!   state, the peer port).
//! * `flood` — the flood workload: a third tenant that keeps many requests in flight
//!   (accepted and refused) under a rate quota, beside which the others must stay
//!   fast.
//! * `peer_messages` — well-formed Raft messages made by hand (a forged append of an
//!   admin command, a high-term heartbeat, a vote) with chosen certificates and
//!   headers, for the peer port's tests and attacks.
//! * `nemesis` — the faults, partitions with nftables, outcomes.
//! * `slow_link`, `slow_cpu` — the grey faults' tools: a delaying proxy in front of
//!   every peer port, a CPU cgroup that starves one node.
//! * `linearizability` — a memoized Wing–Gong–Lowe search for lease locks.
//! * `grey` — the grey faults' figures (needless elections, acquire latency inside
//!   the faults against the calm).
//! * `checker` — the checks (a)–(j), the attacks check and the refused nodes.
//! * `harness` — `leasehold-jepsen run`: namespace, cluster, workers, nemesis,
//!   checks, summary.

pub mod attack;
pub mod checker;
pub mod cluster;
pub mod fenced_store;
pub mod flood;
pub mod grants;
pub mod grey;
pub mod harness;
pub mod history;
pub mod https;
pub mod linearizability;
pub mod lock_holder;
pub mod nemesis;
pub mod peer_messages;
pub mod slow_cpu;
pub mod slow_link;
pub mod wait;
pub mod worker;
pub mod workload;
