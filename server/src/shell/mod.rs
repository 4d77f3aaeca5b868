//! The node-local state that applied entries drive, below the Raft glue: session
//! deadlines, RPCs waiting for a grant, election observers, semaphore wait times; and
//! what the node runs on: the clock, the heap, the TLS material. Nothing here proposes or reads through Raft; the
//! state-machine store feeds these from the machine's effects, and the gRPC services
//! read them.
//!
//! # Layout
//!
//! * `fail_stop` — a panic anywhere stops the process, unless it is `catching`.
//! * `clock` — the only place that reads a clock (through a `TimeSource` a simulator
//!   can drive), with the test-only skew knob.
//! * `entropy` — the only source of random choices (incarnations, cluster ids,
//!   session secrets, tenant tokens): the OS in production, a seed where runs replay.
//! * `credentials` — the tenants' token hashes and names as last applied, for
//!   authenticating requests without reading the replicated state.
//! * `session_deadlines` — `SessionDeadlines`: every session's deadline on this node's
//!   monotonic clock; the leader renews them on keepalives and proposes expiry.
//! * `lock_delays` — `LockDelays`: when each held-back grant's lock-delay ends on
//!   this node's clock; the leader proposes the end.
//! * `wait_registry` — `WaitRegistry`: RPCs waiting in a FIFO queue, woken by the
//!   applied entry that grants or ends their wait.
//! * `observers` — election changes pushed to `Observe` streams in apply order.
//! * `wait_histograms` — how long semaphore acquires waited, per semaphore.
//! * `memory` — how the node uses the C allocator, and the heap trimmer.
//! * `disk` — the data directory's free space against the reserve.
//! * `peer_contacts` — when each member was last heard from, for the status page.
//! * `watched` — grants of the names the operator watches, for "it did not run".
//! * `sockets` — a simulator's network under the client and peer servers and the
//!   peer dialer (a node that serves clients uses the operating system's).
//! * `tls` — TLS on both ports: certificates re-read on SIGHUP, peers' and clients'
//!   identities read from their certificates.

pub mod clock;
pub mod credentials;
pub mod disk;
pub mod entropy;
pub mod fail_stop;
pub mod http;
pub mod lock_delays;
pub mod memory;
pub mod observers;
pub mod peer_contacts;
pub mod session_deadlines;
pub mod sockets;
pub mod sources;
pub mod tls;
pub mod wait_histograms;
pub mod wait_registry;
pub mod watched;
