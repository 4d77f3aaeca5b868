//! The `leasehold` command line, split the way it runs: parse the arguments, run one
//! command family, map the outcome to an exit code. Only the binary uses these
//! modules; the library crate (`src/lib.rs`) does not include them.
//!
//! # Layout
//!
//! * `arguments` — the clap types: global flags, commands, the shared hold flags.
//! * `connect` — the client a command runs with, as the tenant or the admin.
//! * `cert` — certificates and tokens for a local or test cluster.
//! * `exit` — the exit codes, the `Error` → code mapping and the table in `--help`.
//! * `hold` — `lock`, `sem` and `elect`: acquire, then supervise, then give back.
//! * `supervise` — running the command; jeopardy stops it (SIGTERM, then SIGKILL).
//! * `render` — what the read commands print: text tables and JSON.
//! * `tenant` — tenants, their quotas and tokens (admin credential).
//! * `snapshot` — `snapshot save`: a backup file of the whole state (admin credential).
//! * `status`, `member`, `describe`, `fence`, `session`, `leader` — one file per
//!   remaining command family.

pub mod arguments;
pub mod cert;
pub mod connect;
pub mod describe;
pub mod exit;
pub mod fence;
pub mod hold;
pub mod leader;
pub mod member;
pub mod render;
pub mod session;
pub mod snapshot;
pub mod status;
pub mod supervise;
pub mod tenant;
