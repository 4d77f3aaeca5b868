//! The client-facing gRPC services, each in a file named after the proto service it
//! implements, and the boundary where protobuf becomes domain types.
//!
//! # Layout
//!
//! * `auth` — who sent a request (the admin or a tenant, by bearer token or client
//!   certificate), and the namespace a read looks in.
//! * `convert` — protobuf requests to machine commands, validating every limit on the
//!   way in; machine errors to gRPC statuses with a machine-readable reason.
//! * `leasehold_service` — `Leasehold`: sessions, keepalives, locks, fences.
//! * `lock_delay` — the lock-delay an acquire carries (asked for, or the name's
//!   default) and whether every member's build knows lock-delay yet.
//! * `semaphores_service` — `Semaphores`.
//! * `elections_service` — `Elections`, with `Observe` streams.
//! * `admin_service` — `Admin`: status, membership, the clock knob.
//! * `queued_wait` — the server side of a request that waits in a FIFO queue: wait
//!   for the granting entry, or take the session out of the queue with a committed
//!   cancel when the wait runs out or the client goes away.

pub mod admin_service;
pub mod auth;
pub mod convert;
pub mod elections_service;
pub mod leasehold_service;
pub mod lock_delay;
pub mod queued_wait;
pub mod semaphores_service;
