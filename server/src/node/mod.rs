//! The node: configuration, the data directory's identity, the metrics endpoint, and
//! `running_node`, which assembles every layer into a running node.
//!
//! # Layout
//!
//! * `config` — flags and TOML, validated once into a `Config`.
//! * `data_dir` — the data directory's identity; foreign directories are refused.
//! * `environment` — what a node takes from the world: clock, randomness, threads.
//! * `metrics` — the Prometheus text endpoint.
//! * `restore` — `leasehold-server restore`: a new node's data directory from a backup.
//! * `status` — the live status page: HTML, CSS and JavaScript in the binary and
//!   the JSON it polls, behind the admin credential.
//! * `running_node` — `start` and `RunningNode`: listeners, storage, openraft, the
//!   services, the expiry and membership tasks.

pub mod config;
pub mod data_dir;
pub mod environment;
pub mod metrics;
pub mod restore;
pub mod running_node;
pub mod status;

pub use environment::Environment;
pub use running_node::{start, RunningNode, StartError};
