//! The Leasehold client: sessions kept alive in the background, FIFO locks whose
//! grants carry a fencing token, and retries that are safe because every mutating
//! request carries a request id.
//!
//! ```no_run
//! # async fn example() -> Result<(), leasehold::Error> {
//! use std::time::Duration;
//! let client = leasehold::Client::connect(["127.0.0.1:7101", "127.0.0.1:7102", "127.0.0.1:7103"]).await?;
//! let session = client.session(Duration::from_secs(10)).await?;
//! if let Some(guard) = session.try_lock("orders/42").await? {
//!     // Pass the token to the storage; it must reject writes with older tokens:
//!     // UPDATE payments SET … , fence_token = $token WHERE order_id = 42 AND fence_token < $token
//!     let token = guard.token();
//!     # let _ = token;
//!     guard.release().await?;
//! }
//! session.close().await?;
//! # Ok(())
//! # }
//! ```
//!
//! A lease is not mutual exclusion: a process paused past its TTL wakes up still
//! holding a guard. The fencing token, checked by the storage, is what makes the
//! late write harmless. `Session::jeopardy` fires while there is still time to stop.
//!
//! # Layout
//!
//! * `client` — endpoints, TLS and credentials, leader following, retries with the
//!   same request id.
//! * `certs` — a CA, node and tenant certificates and tokens for local clusters and
//!   tests (`leasehold cert`).
//! * `session` — the lease and its keepalive task, conservative deadline, jeopardy.
//! * `keepalive` — one keepalive stream per client for all of its sessions.
//! * `lock` — lock guards and the fencing token.
//! * `fence` — `FencingToken` for SQL and HTTP, and how storage checks it.
//! * `semaphore` — at most K holders per name; permit guards.
//! * `election` — campaigns, leadership handles, observing changes.
//! * `random` — the client's random choices, from a generator a simulator can seed.
//! * `error` — errors; `Indeterminate` for requests that may have taken effect.
//! * `settings` — the `LEASEHOLD_*` variables (endpoints, CA, token, client
//!   certificate) turned into a `Client`.
//! * `duration` — human durations for the CLI ("10s", "500ms").

pub mod calendar;
pub mod certs;
pub mod client;
pub mod duration;
pub mod election;
pub mod error;
pub mod fence;
pub mod keepalive;
pub mod lock;
pub mod random;
pub mod semaphore;
pub mod session;
pub mod settings;

pub use client::{parse_endpoints, Client, Snapshot, DEFAULT_ENDPOINTS};
pub use election::{Leader, Leadership, Observation};
pub use error::{Error, Result};
pub use fence::FencingToken;
pub use leasehold_proto as proto;
pub use lock::{Acquired, LockGuard, NotAcquired};
pub use semaphore::{PermitGuard, Semaphore, SemaphoreFull};
pub use session::{Session, SessionState};
pub use settings::Settings;
