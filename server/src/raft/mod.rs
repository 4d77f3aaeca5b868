//! The openraft glue: the log and the state machine on RocksDB, Raft messages between
//! nodes over tonic, and `Replica`, through which the gRPC services propose commands
//! and read the replicated state.
//!
//! # Layout
//!
//! * `types` — openraft's type configuration and the log entry payload (`Proposal`).
//! * `runtime` — openraft's async runtime: tokio, with election timeouts drawn from a
//!   generator a simulator can seed.
//! * `codec` — postcard behind a format version, for every stored blob and peer message.
//! * `disk` — what the stores need of a disk (`Disk`): families, batches, written
//!   apart from synced.
//! * `storage` — the RocksDB database and its column families (`RocksDisk`).
//! * `memory_disk` — a disk in memory that loses unsynced writes on a crash, for
//!   tests and the simulator.
//! * `log_store` — openraft's log storage on the disk, with group-committed fsyncs.
//! * `state_machine_store` — openraft's state machine: the pure machine in memory,
//!   snapshots on the disk, the machine's effects handed to the `shell`.
//! * `blocking` — where blocking work runs: threads in a node, inline under a
//!   simulator.
//! * `applier` — the thread on which entries are applied and snapshots decoded, so
//!   that the state is packed in a heap arena of its own.
//! * `replica` — `Replica`: propose (batched into entries), confirm leadership
//!   (batched into rounds), linearizable reads.
//! * `rates` — each tenant's rate quota on the leader, and the pace of its early
//!   refusals.
//! * `tenant_queues` — the leader's per-tenant queues of commands waiting for an
//!   entry, and how an entry is filled from them (deficit round-robin).
//! * `network` — Raft RPCs to peers over tonic.
//! * `peer_service` — the `Peer` gRPC service: Raft RPCs from peers.
//! * `round_trips` — the round trip to each peer (heartbeats, probes), and whether
//!   the heartbeat and election timeouts leave room for it.
//! * `peer_probes` — the task that probes peers without a fresh round trip and warns
//!   when the timings are too short for it.
//! * `backup` — the backup file: the state at one index, with a checksum.
//! * `incarnations` — each member's incarnation on every peer message and answer,
//!   and the checks that keep a wiped node from counting as the member it was.
//! * `quiet_deadlines` — this node's record of the deadlines the checkpoints of quiet
//!   sessions gave, so that a restart does not lengthen them by its downtime.

pub mod applier;
pub mod backup;
pub mod blocking;
pub mod codec;
pub mod disk;
pub mod incarnations;
pub mod log_store;
pub mod memory_disk;
pub mod network;
pub mod peer_probes;
pub mod peer_service;
pub mod quiet_deadlines;
pub mod rates;
pub mod replica;
pub mod round_trips;
pub mod runtime;
pub mod state_machine_store;
pub mod storage;
pub mod tenant_queues;
pub mod types;
