//! A Leasehold node: sessions, fenced locks and the rest of the lock service's state,
//! replicated through one openraft log persisted in RocksDB, served over tonic.
//!
//! # Layout
//!
//! * `state_machine` — the pure, deterministic lock state machine: commands in,
//!   responses and effects out; no IO, no clock.
//! * `limits` — every bound on names, TTLs, sessions, locks and waiters.
//! * `raft_types` — openraft's type configuration and the log entry payload.
//! * `codec` — postcard behind a format version, for every stored blob and peer message.
//! * `storage` — the RocksDB database and its column families.
//! * `log_store` — openraft's log storage on RocksDB, with group-committed fsyncs.
//! * `state_machine_store` — openraft's state machine: the pure machine in memory,
//!   snapshots in RocksDB, effects dispatched to waiters and leases.
//! * `applier` — the thread on which entries are applied and snapshots decoded, so
//!   that the state is packed in a heap arena of its own.
//! * `waiters` — RPCs waiting in a FIFO queue, woken by the granting entry.
//! * `waiting` — the server side of a queued request: wait, or cancel by commit.
//! * `observers` — election changes pushed to `Observe` streams in apply order.
//! * `leases` — session deadlines; the leader proposes expiry.
//! * `clock` — the only place that reads a clock, with the test-only skew knob.
//! * `replica` — propose, confirm leadership (batched), linearizable reads.
//! * `convert` — protobuf to domain types at the gRPC boundary, validating limits.
//! * `client_service`, `semaphore_service`, `election_service`, `admin_service`,
//!   `peer_service` — the gRPC services.
//! * `network` — Raft RPCs to peers over tonic.
//! * `metrics` — the Prometheus text endpoint.
//! * `config` — flags and TOML, validated once into a `Config`.
//! * `data_dir` — the data directory's identity; foreign directories are refused.
//! * `node` — assembles and runs a node.

pub mod admin_service;
pub mod applier;
pub mod client_service;
pub mod clock;
pub mod codec;
pub mod config;
pub mod convert;
pub mod data_dir;
pub mod election_service;
pub mod leases;
pub mod limits;
pub mod log_store;
pub mod memory;
pub mod metrics;
pub mod network;
pub mod node;
pub mod observers;
pub mod peer_service;
pub mod raft_types;
pub mod replica;
pub mod semaphore_service;
pub mod state_machine;
pub mod state_machine_store;
pub mod storage;
pub mod waiters;
pub mod waiting;
