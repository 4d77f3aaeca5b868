//! `leasehold-bench`: the same lock workloads against Leasehold, etcd and Redis,
//! through each system's own client API, with C concurrent clients for a fixed
//! duration after a warm-up. Each run prints a table and one JSON line; `summarize`
//! turns the JSON lines of several rounds into medians and ratios.
//!
//! # Layout
//!
//! * `workload` — the workloads and the client loop: warm-up, measured window,
//!   latencies, errors, the leader kill of `failover`.
//! * `target` — the systems behind one worker interface.
//! * `transport` — whether a run's clients spoke TLS to the system (`Transport`).
//! * `leasehold_target` — Leasehold through the `leasehold` library (and the
//!   `KeepAlive` stream for back-to-back keepalives), as a tenant, over TLS unless
//!   LEASEHOLD_INSECURE_PLAINTEXT=1; `add_tenant` makes that tenant.
//! * `etcd_target` — etcd: a lease per client, v3lock `Lock`/`Unlock`.
//! * `etcd_wire` — the few etcd v3 messages used, declared by hand, and the
//!   connections to the members (TLS with --etcd-ca-file, else plaintext).
//! * `redis_target` — Redis: `SET NX PX`, compare-and-delete, compare-and-pexpire.
//! * `server_process` — CPU and resident memory of server processes from `/proc`.
//! * `scale` — memory per idle session with a lock; restart time with many locks.
//! * `report` — one run's result, its table and JSON, the summary over rounds.

pub mod etcd_target;
pub mod etcd_wire;
pub mod fence_cost;
pub mod leasehold_target;
pub mod redis_target;
pub mod report;
pub mod scale;
pub mod scale_failover;
pub mod server_process;
pub mod target;
pub mod transport;
pub mod workload;
