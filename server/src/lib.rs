//! A Leasehold node: sessions, fenced locks and the rest of the lock service's state,
//! replicated through one openraft log persisted in RocksDB, served over tonic.
//!
//! # Layout
//!
//! Each folder is a layer; a layer imports only from the layers below it, and `node`
//! assembles them all.
//!
//! * `machine` — the pure, deterministic lock state machine: commands in, responses
//!   and effects out; no IO, no clock. Its `limits` name every bound of the replicated
//!   state.
//! * `shell` — the node-local state that applied entries drive: session deadlines,
//!   RPCs waiting for a grant, election observers, semaphore wait times, the clock.
//! * `raft` — the openraft glue: log and state-machine stores on RocksDB, snapshots,
//!   the peer network and `Peer` service, and `Replica` (propose, confirm leadership,
//!   linearizable reads).
//! * `api` — the client-facing gRPC services and the protobuf boundary.
//! * `node` — configuration, the data directory, metrics, and the assembly of a node.
//!
//! ```text
//! node ──▶ api ──▶ raft ──▶ shell ──▶ machine
//!   └────────┴───────┴────────┴──────────▲   (every layer may use the machine's types)
//! ```
//!
//! # One request's path: `Acquire`, from the gRPC handler to the state machine and back
//!
//! 1. `api::leasehold_service::LeaseholdService::acquire` receives the request, and
//!    `api::convert::acquire` turns it into `machine::Command::Acquire`, checking
//!    every limit; no prost type goes further.
//! 2. `raft::replica::Replica::propose` queues the command. Its proposer task
//!    (`run_proposals`) gathers the commands waiting into one `raft::types::Proposal`
//!    and hands it to openraft's `client_write`: one log entry for many commands.
//! 3. openraft appends the entry through `raft::log_store::LogStore`, which returns
//!    only once RocksDB has fsynced it, and replicates it with `raft::network` to each
//!    follower's `raft::peer_service::PeerService::append_entries`, which appends and
//!    fsyncs it too before it answers.
//! 4. Once a majority has it on disk the entry is committed, and openraft calls
//!    `raft::state_machine_store::StateMachineStore::apply`.
//! 5. On the applier thread (`raft::applier`), `machine::StateMachine::apply_batch`
//!    applies the entry's commands in order with the entry's log index, which is the
//!    fencing token of every grant it makes. It returns one `machine::Response` per
//!    command and the effects as `machine::Event`s; it reads no clock and does no IO.
//! 6. The store hands the events to the shell: `shell::wait_registry` wakes the RPCs
//!    whose wait the entry decided, `shell::observers` publishes leader changes,
//!    `shell::session_deadlines` starts and ends session deadlines. Then it publishes
//!    the applied index for linearizable reads.
//! 7. openraft returns the responses to `client_write`, and the proposer task sends
//!    each command its own response.
//! 8. Back in the handler: `Granted` becomes the gRPC answer with the token.
//!    `Queued` waits in `api::queued_wait::wait_for_grant` for the wake-up of step 6,
//!    or proposes a `CancelWait` when the wait runs out. `Rejected` becomes a status
//!    with a machine-readable reason (`api::convert::command_error`).
//!
//! Keepalives and reads take a shorter path: `Replica::confirm_leadership` batches
//! them into one quorum round, then the handler reads `shell::session_deadlines` or
//! the applied state; neither writes the log.

pub mod api;
pub mod machine;
pub mod node;
pub mod raft;
pub mod shell;
