//! Leasehold's fault-injection suite and the test support it shares with the
//! cluster tests: real `leasehold-server` processes, a fenced store, waits with
//! deadlines.
//!
//! # Layout
//!
//! * `cluster` — start, kill, pause, restart real server processes on loopback.
//! * `fenced_store` — a store that keeps the highest fencing token per resource and
//!   rejects lower ones, served over TCP to worker processes.
//! * `wait` — waiting on a condition with a deadline and a reason.
//! * `worker` — the worker process used by tests (`leasehold-jepsen worker …`).

pub mod cluster;
pub mod fenced_store;
pub mod wait;
pub mod worker;
