//! What `apply` answers to the client that proposed the command.

use serde::{Deserialize, Serialize};

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
    Acquire(AcquireOutcome),
    WaitCancelled(CancelOutcome),
    Released {
        token: Token,
    },
    Rejected(CommandError),
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum AcquireOutcome {
    /// The session holds the lock; `token` fences its writes.
    Granted { token: Token },
    /// The session waits; `position` is 0-based among the waiters. The grant arrives as
    /// an `Event::Granted` when the holders before it are gone.
    Queued { position: u32 },
    /// A try-lock found the lock held by another session.
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
