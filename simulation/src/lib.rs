//! Leasehold's cluster in one process under a seeded simulator: the real server code
//! (machine, shell, openraft glue, gRPC services over tonic) and the real client
//! library, on turmoil's simulated network and clock, with the in-memory disk. One
//! seed fixes the faults, the network's delays and losses, openraft's election
//! timeouts and the clients' random choices, so a failing seed can be run again.
//!
//! # Layout
//!
//! * `network` — turmoil's TCP as the node's `Sockets` and the client's `Dialer`.
//! * `host` — the hosts' addresses on turmoil's network, and one node as turmoil host
//!   software: its configuration, disk, clock and environment, started again after a
//!   crash.
//! * `workload` — simulated workers: sessions, locks and fenced writes, semaphore
//!   permits, campaigns and an observer through the real client, recorded as the
//!   fault suite's history.
//! * `operator` — the README's admin commands (`member remove`, `member add`) from a
//!   host of their own, when a replacement asks for them, and a node that never
//!   answers, which the operator adds and takes out again.
//! * `upgrade` — a rolling upgrade from the previous build's command level, one node
//!   at a time, stopped as SIGTERM stops it.
//! * `revocation` — a tenant's token rotated (or the tenant removed) while a holder
//!   that knows only the old token keeps its session on an open stream.
//! * `replicas` — the white-box checks between steps: invariants on every node, and
//!   the same state wherever the same index was applied.
//! * `run` — one seed: the cluster, the workers, the faults the seed draws, the
//!   checks.

pub mod host;
pub mod network;
pub mod operator;
pub mod replicas;
pub mod revocation;
pub mod run;
pub mod upgrade;
pub mod workload;
