//! Effects as data: what the async shell must do after an entry was applied.

use serde::{Deserialize, Serialize};

use super::{SessionId, Token};

/// One effect of an applied entry. The shell wakes waiting RPCs and feeds watchers with
/// these; the state machine itself never calls out.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Event {
    /// Every new grant, immediate or handed to a waiter. Acquiring a lock the session
    /// already holds is not a new grant and emits nothing.
    Granted {
        name: String,
        session: SessionId,
        token: Token,
    },
    /// Explicit release, close or expiry.
    Released {
        name: String,
        session: SessionId,
        token: Token,
    },
    /// A queued acquire that will never be granted.
    WaitFailed {
        name: String,
        session: SessionId,
        reason: WaitFailure,
    },
    SessionEnded {
        session: SessionId,
        expired: bool,
    },
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum WaitFailure {
    /// The waiting session was closed or expired.
    SessionEnded,
    /// `CancelWait` removed the waiter, usually because its wait time ran out.
    Cancelled,
}
