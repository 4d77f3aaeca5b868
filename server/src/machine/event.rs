//! Effects as data: what the async shell must do after an entry was applied.

use serde::{Deserialize, Serialize};

use super::caller::TenantId;
use super::delay::DelayKey;
use super::{LeaderView, ResourceKind, SessionId, Token};

/// One effect of an applied entry. The shell wakes waiting RPCs and feeds watchers with
/// these; the state machine itself never calls out.
///
/// `kind` tells which namespace `name` is in: lock "x", semaphore "x" and election "x"
/// are three different things. For an election, the holder is the leader.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Event {
    /// Every new grant, immediate or handed to a waiter. Acquiring what the session
    /// already holds is not a new grant and emits nothing.
    Granted {
        kind: ResourceKind,
        name: String,
        session: SessionId,
        token: Token,
    },
    /// Explicit release or resignation, close or expiry.
    Released {
        kind: ResourceKind,
        name: String,
        session: SessionId,
        token: Token,
    },
    /// A queued acquire or campaign that will never be granted.
    WaitFailed {
        kind: ResourceKind,
        name: String,
        session: SessionId,
        reason: WaitFailure,
    },
    SessionEnded {
        session: SessionId,
        expired: bool,
    },
    /// The leader of the election `name` or its value changed: the new leader, or `None`
    /// when the election fell vacant. Emitted for every such change, in apply order, and
    /// at most once per election and entry, so that observers see every state the
    /// election passed through.
    LeaderChanged {
        /// The namespace the election is in.
        tenant: TenantId,
        name: String,
        leader: Option<LeaderView>,
    },
    /// The grant's session expired and its lock-delay began (see `delay`): the leader
    /// ends it with `EndLockDelays` once `delay_ms` ran out on its clock.
    DelayStarted {
        key: DelayKey,
        delay_ms: u64,
    },
    /// The delay of a held-back grant ended (by `EndLockDelays`, or its tenant was
    /// removed); a `Granted` to the next waiter may follow.
    DelayEnded {
        key: DelayKey,
    },
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum WaitFailure {
    /// The waiting session was closed or expired.
    SessionEnded,
    /// A cancel command removed the waiter, usually because its wait time ran out.
    Cancelled,
}

impl Event {
    /// The session whose lists this event changed, if any: its tenant's usage is
    /// counted again (`StateMachine::account`).
    pub(super) fn session_touched(&self) -> Option<SessionId> {
        match self {
            Event::Granted { session, .. } | Event::Released { session, .. } | Event::WaitFailed { session, .. } => {
                Some(*session)
            }
            Event::SessionEnded { .. }
            | Event::LeaderChanged { .. }
            | Event::DelayStarted { .. }
            | Event::DelayEnded { .. } => None,
        }
    }
}
