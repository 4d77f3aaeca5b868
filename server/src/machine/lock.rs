//! One entry of the lock table.

use serde::{Deserialize, Serialize};
use thin_vec::ThinVec;

use super::{SessionId, Token};

/// A lock that is held. A free lock has no entry at all: when the holder leaves and no
/// one waits the entry is removed, so the table is bounded by the held locks, and a lock
/// with waiters always has a holder because the first waiter is granted at once.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub(super) struct Lock {
    pub(super) holder: Holder,
    /// Sessions waiting, first in line first. A `ThinVec` (one pointer, no heap while
    /// empty) rather than a `Vec` or `VecDeque`, because most held locks have no
    /// waiters and every byte here is paid in every slot of the lock table; queues are
    /// short (`WAITERS_PER_LOCK_MAX`), so taking the first one out is cheap.
    pub(super) waiters: ThinVec<SessionId>,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Holder {
    pub(super) session: SessionId,
    /// The index of the entry that granted the lock: the fencing token.
    pub(super) token: Token,
    /// The leader's stamp of that entry, shown by describe queries only.
    pub(super) since_ms: u64,
}
