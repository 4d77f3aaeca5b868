//! What `apply` answers to the client that proposed the command.

use serde::{Deserialize, Serialize};

use super::caller::TenantId;
use super::{CommandError, SessionId, Token};

/// The answer to one applied command. The leader hands it to the RPC that proposed the
/// command; a retry with the same request id gets the same answer back.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub enum Response {
    SessionCreated {
        session: SessionId,
        ttl_ms: u64,
    },
    SessionClosed,
    /// The listed sessions that existed and are now gone, in the order of the command,
    /// each once.
    SessionsExpired {
        expired: Vec<SessionId>,
    },
    /// The listed sessions of a `CheckpointSessions` that exist, in its order.
    SessionsCheckpointed {
        quiet: Vec<(SessionId, u64)>,
        resumed: Vec<SessionId>,
    },
    Acquire(AcquireOutcome),
    WaitCancelled(CancelOutcome),
    Released {
        token: Token,
    },
    /// `Busy` names the semaphore's first holder (in grant order) and its token.
    SemAcquire(AcquireOutcome),
    /// The permit granted with `token` is returned.
    SemReleased {
        token: Token,
    },
    /// The semaphore's limit is now `limit`; it was `previous`.
    SemLimitSet {
        limit: u32,
        previous: u32,
    },
    /// `Granted` means the session leads with that token; `Busy` names the leader.
    Campaign(AcquireOutcome),
    /// The leader's value is the proclaimed one now; the token stays.
    Proclaimed {
        token: Token,
    },
    /// The leadership granted with `token` ended.
    Resigned {
        token: Token,
    },
    TenantAdded {
        tenant: TenantId,
    },
    TenantTokenRotated {
        tenant: TenantId,
    },
    TenantQuotasSet {
        tenant: TenantId,
    },
    /// The tenant is gone, with the sessions it had.
    TenantRemoved {
        tenant: TenantId,
        sessions_ended: u64,
    },
    /// The member's incarnation as recorded (the first one proposed stands) and the
    /// cluster's id.
    MemberRecorded {
        cluster_id: u128,
        incarnation: u64,
    },
    /// How many of the listed delays were still running and ended in this entry.
    LockDelaysEnded {
        ended: u64,
    },
    Rejected(CommandError),
}

/// The outcome of `Acquire`, `SemAcquire` and `Campaign`; "the lock" below stands for
/// the lock, a permit of the semaphore or the leadership of the election.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum AcquireOutcome {
    /// The session holds the lock; `token` fences its writes.
    Granted { token: Token },
    /// The session waits; `position` is 0-based among the waiters. The grant arrives as
    /// an `Event::Granted` when the holders before it are gone.
    Queued { position: u32 },
    /// A try-lock found the lock held by another session (for a semaphore: no permit
    /// free, or others waiting first).
    Busy { holder: SessionId, token: Token },
    /// Only for a retry of an acquire that was queued: the wait ended (cancelled or
    /// granted and released since) and the session neither holds nor waits.
    TimedOut,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum CancelOutcome {
    Cancelled,
    /// The grant won the race with the cancellation: the session holds the lock.
    AlreadyGranted {
        token: Token,
    },
    NotWaiting,
}
