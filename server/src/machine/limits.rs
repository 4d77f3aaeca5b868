//! Named limits of the replicated state, and the index of every other limit.
//!
//! The state machine rejects a command that would cross one of these, and the gRPC
//! conversion layer checks the same constants on the way in, so that a client gets a
//! clear error early and no client can make a replica's memory, or the work of one log
//! entry, grow without bound. Every replica must agree on these values: changing one
//! changes which commands are rejected, so it must be rolled out like a change of the
//! state machine itself.
//!
//! Limits of one node (they may differ between nodes) live beside what they bound:
//!
//! | where | limits |
//! |---|---|
//! | `api::convert` | `ACQUIRE_WAIT_MS_MAX` (one request's wait) |
//! | `api::leasehold_service` | `KEEPALIVES_PER_ROUND_MAX`, `LIST_SESSIONS_PAGE_MAX`, `SESSION_SECRET_BYTES` |
//! | `api::elections_service` | `OBSERVE_REPLIES_QUEUED_MAX` |
//! | `api::auth` | `REFUSAL_LOG_INTERVAL_MS` |
//! | `shell::observers` | `OBSERVE_CHANGES_QUEUED_MAX`, `OBSERVERS_MAX` |
//! | `shell::session_deadlines` | `EXPIRY_SCAN_INTERVAL_MS` |
//! | `shell::tls` | `HANDSHAKE_TIMEOUT_MS` |
//! | `shell::sources` | `FIRST_BYTES_TIMEOUT_MS`, `HANDSHAKES_IN_PROGRESS_MAX`, `HANDSHAKEN_QUEUED_MAX`, `REFUSAL_LOG_INTERVAL_MS` (per port) |
//! | `shell::http` | the status page's and the metrics' `HttpLimits` |
//! | `shell::credentials` | `ADMIN_TOKEN_BYTES_MIN`, `ADMIN_TOKEN_BYTES_MAX` |
//! | `shell::wait_histograms` | `WAIT_HISTOGRAM_NAMES_MAX` |
//! | `shell::memory` | `TRIM_AFTER_FREED_BYTES`, `MMAP_THRESHOLD_BYTES` |
//! | `shell::clock` | `RATE_PER_MILLE_MAX` (the clock knob) |
//! | `raft::replica` | `PROPOSALS_QUEUED_MAX`, `COMMANDS_PER_ENTRY_MAX`, `ENTRIES_IN_FLIGHT_MAX`, `LEADER_CHECKS_QUEUED_MAX`, `READ_APPLY_WAIT_MS_MAX` |
//! | `raft::log_store` | `FLUSH_QUEUE_APPENDS_MAX`, `RECENT_ENTRIES_MAX`, `RECENT_COMMANDS_MAX` |
//! | `raft::network` | `PEER_MESSAGE_BYTES_MAX` (an AppendEntries batch over it is cut), `PEER_CONNECT_TIMEOUT_MS` |
//! | `raft::types` | `MEMBERS_MAX` |
//! | `raft::storage` | `WRITE_BUFFER_BYTES`, `BLOCK_CACHE_BYTES` |
//! | `node::config` | timings, `CLUSTER_NAME_BYTES_MAX`, `WORKER_THREADS_MAX`, `STATE_BUDGET_BYTES_MIN` (the budget itself is `--state-budget-bytes`) |
//! | `node::running_node` | `CLIENT_MESSAGE_BYTES_MAX`, `CLIENT_STREAMS_PER_CONNECTION_MAX`, `PEER_STREAMS_PER_CONNECTION_MAX` |
//! | `node::metrics` | `SCRAPE_LIMITS` |
//! | `node::status` | `STATUS_LIMITS` |

use serde::{Deserialize, Serialize};

/// A lock name is kept twice per grant (in the lock table and in the holder's list) and
/// is echoed in every event and error about it; 256 bytes fits a path-like resource name.
/// Names of semaphores and elections follow the same limit.
pub const LOCK_NAME_BYTES_MAX: usize = 256;

/// The client name is informational only (it is shown by describe queries), so it stays
/// short.
pub const CLIENT_NAME_BYTES_MAX: usize = 128;

/// Below a second, the keepalive round trip through the leader and a leader change would
/// expire healthy sessions.
pub const SESSION_TTL_MS_MIN: u64 = 1_000;

/// An hour: a longer lease keeps the locks of a dead client for longer than anyone would
/// wait for them.
pub const SESSION_TTL_MS_MAX: u64 = 3_600_000;

/// Bounds the memory of the replicated state and of the leader's deadline timers, which
/// keep one entry per session.
pub const SESSIONS_MAX: usize = 1_000_000;

/// Everything a session holds or waits for, counted together: locks, semaphore permits
/// and elections (led or campaigned for). Bounds the work of closing or expiring one
/// session, which releases and leaves all of them in one log entry.
pub const LOCKS_PER_SESSION_MAX: usize = 1_024;

/// Bounds one FIFO queue of a lock, a semaphore or an election, which is scanned when a
/// waiter leaves it.
pub const WAITERS_PER_LOCK_MAX: usize = 4_096;

/// The largest number of holders a semaphore may allow at once. Its holders are kept in
/// one list, which a release scans, so the limit bounds that scan; ten thousand is far
/// above any "K jobs of one tenant" that a lock service should arbitrate.
pub const SEMAPHORE_LIMIT_MAX: u32 = 10_000;

/// An election's value (an address, a small descriptor) is kept for the leader and for
/// every waiting campaigner, and sent to every observer on every change, so it stays
/// small: a kibibyte.
pub const ELECTION_VALUE_BYTES_MAX: usize = 1_024;

/// Stored answers kept per session for retries, oldest evicted first. A client retries
/// only its last few requests, so a small window makes retries safe without letting the
/// table grow with the age of the session.
pub const REQUESTS_REMEMBERED_PER_SESSION_MAX: usize = 16;

/// Sessions one `ExpireSessions` entry may end, so that one entry's work (releasing and
/// handing over all their locks) stays bounded; the leader splits larger batches.
pub const EXPIRE_SESSIONS_PER_COMMAND_MAX: usize = 1_024;

/// Sessions one `CheckpointSessions` entry may list (quiet and resumed together); the
/// leader splits larger batches.
pub const CHECKPOINT_SESSIONS_PER_COMMAND_MAX: usize = 4_096;

/// The longest lock-delay a grant may carry (see `delay`): a minute, as Chubby allows.
/// A delay holds a dead holder's lock or permit back from everyone, so a longer one
/// would let one careless acquire stall its waiters for as long as a lease.
pub const LOCK_DELAY_MS_MAX: u64 = 60_000;

/// Delays one `EndLockDelays` entry may end, so that one entry's work (handing the
/// locks and permits on) stays bounded; the leader splits larger batches.
pub const LOCK_DELAYS_ENDED_PER_COMMAND_MAX: usize = 1_024;

/// Tenants at most, the admin namespace included. Every session-scoped request looks
/// its tenant up, and `ListTenants` answers them all at once.
pub const TENANTS_MAX: usize = 10_000;

/// A tenant's name is shown in every refusal about it and in its certificate's DNS name
/// (`<tenant>.<tag>.tenant.leasehold`), so it follows DNS label rules: 1 to 63 bytes.
pub const TENANT_NAME_BYTES_MAX: usize = 63;

/// A new tenant's quotas unless its creator says otherwise: generous for one team's
/// workers, far below what the whole cluster holds, so that one tenant cannot take
/// the cluster's sessions or queues from the others.
pub const SESSIONS_PER_TENANT_DEFAULT: u32 = 10_000;
pub const HOLDS_PER_TENANT_DEFAULT: u32 = 100_000;
pub const WAITERS_PER_TENANT_DEFAULT: u32 = 100_000;

/// The replicated state is budgeted in estimated bytes: a session counts
/// `SESSION_STATE_BYTES` plus its client name, each hold or wait `CLAIM_STATE_BYTES`
/// plus its name. Together about what the scale benchmark measures per idle session
/// with one lock on every replica (450–490 bytes, bench/README.md).
pub const SESSION_STATE_BYTES: u32 = 320;
pub const CLAIM_STATE_BYTES: u32 = 128;

const _: () = assert!(LOCK_NAME_BYTES_MAX > 0);
const _: () = assert!(TENANTS_MAX > 1);
const _: () = assert!(TENANTS_MAX < u32::MAX as usize);
const _: () = assert!(TENANT_NAME_BYTES_MAX > 0);
// What a session holds and waits for is counted in 16 bits (`session::Counted`).
const _: () = assert!(LOCKS_PER_SESSION_MAX <= u16::MAX as usize);
const _: () = assert!(CLIENT_NAME_BYTES_MAX > 0);
const _: () = assert!(SESSION_TTL_MS_MIN > 0);
const _: () = assert!(SESSION_TTL_MS_MIN <= SESSION_TTL_MS_MAX);
const _: () = assert!(SESSIONS_MAX > 0);
const _: () = assert!(LOCKS_PER_SESSION_MAX > 0);
// A waiter's queue position is reported as a `u32`.
const _: () = assert!(WAITERS_PER_LOCK_MAX as u64 <= u32::MAX as u64);
// Waiters of one lock are distinct live sessions other than the holder, so a larger
// limit could never be reached.
const _: () = assert!(WAITERS_PER_LOCK_MAX < SESSIONS_MAX);
const _: () = assert!(SEMAPHORE_LIMIT_MAX > 0);
// Holders of one semaphore are distinct live sessions, so a larger limit could never be
// reached.
const _: () = assert!(SEMAPHORE_LIMIT_MAX as u64 <= SESSIONS_MAX as u64);
// An empty value is allowed; the limit only has to leave room for a real one.
const _: () = assert!(ELECTION_VALUE_BYTES_MAX > 0);
// A new session remembers the answer to the command that created it.
const _: () = assert!(REQUESTS_REMEMBERED_PER_SESSION_MAX > 0);
const _: () = assert!(EXPIRE_SESSIONS_PER_COMMAND_MAX > 0);
const _: () = assert!(EXPIRE_SESSIONS_PER_COMMAND_MAX <= SESSIONS_MAX);
// A delay is kept in 32 bits (`delay::HeldBack`).
const _: () = assert!(LOCK_DELAY_MS_MAX > 0 && LOCK_DELAY_MS_MAX <= u32::MAX as u64);
const _: () = assert!(LOCK_DELAYS_ENDED_PER_COMMAND_MAX > 0);

/// The most a tenant may have at once.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub struct Quotas {
    pub sessions: u32,
    /// Locks, semaphore permits and leaderships held. A grant to a waiter is never
    /// refused (its wait was admitted), so raising a semaphore's limit can take the
    /// holds past this by at most the tenant's waiters.
    pub holds: u32,
    /// Waits in queues (locks, semaphores, elections).
    pub waiters: u32,
}

impl Default for Quotas {
    fn default() -> Quotas {
        Quotas {
            sessions: SESSIONS_PER_TENANT_DEFAULT,
            holds: HOLDS_PER_TENANT_DEFAULT,
            waiters: WAITERS_PER_TENANT_DEFAULT,
        }
    }
}

/// The highest weight a tenant may have (see `Shares`).
pub const TENANT_WEIGHT_MAX: u32 = 1_000;
/// The highest rate quota a tenant may have, in operations a second.
pub const TENANT_OPS_PER_S_MAX: u32 = 10_000_000;

/// A tenant's share of the leader, set by `SetTenantShares`; a tenant never given one
/// has the default (weight 1, no rate quota) and no entry in the state.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shares {
    /// How much of each log entry the tenant gets while others wait too, relative to
    /// the others' weights (see `raft::tenant_queues`).
    pub weight: u32,
    /// The commands a second the leader takes from the tenant; past it they are
    /// refused with `RATE_LIMITED` and a retry-after. 0: no rate quota.
    pub ops_per_s: u32,
}

impl Default for Shares {
    fn default() -> Shares {
        Shares { weight: 1, ops_per_s: 0 }
    }
}

/// The quotas a `SetTenantQuotas` changes; those it leaves as `None` keep their
/// values, so two admins changing different quotas at once do not undo each other.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QuotaChange {
    pub sessions: Option<u32>,
    pub holds: Option<u32>,
    pub waiters: Option<u32>,
}

impl QuotaChange {
    pub fn applied_to(self, quotas: Quotas) -> Quotas {
        Quotas {
            sessions: self.sessions.unwrap_or(quotas.sessions),
            holds: self.holds.unwrap_or(quotas.holds),
            waiters: self.waiters.unwrap_or(quotas.waiters),
        }
    }
}
