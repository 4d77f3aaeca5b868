//! Read-only answers to queries, detached from the state so they can be sent anywhere.

use serde::{Deserialize, Serialize};

use super::caller::TenantId;
use super::{SessionId, Token};

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct LockView {
    pub name: String,
    /// A lock that is described is held, or held back for the lock-delay of a holder
    /// whose session expired (`HolderView::held_back_until_ms`): free locks have no
    /// entry.
    pub holder: HolderView,
    /// First in line first.
    pub waiters: Vec<WaiterView>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct HolderView {
    pub session: SessionId,
    pub client_name: String,
    pub token: Token,
    /// The leader's wall-clock stamp of the granting entry; informational only.
    pub since_ms: u64,
    /// The lock-delay the grant carries (see `machine::delay`); 0 for none.
    pub lock_delay_ms: u64,
    /// Set when the holder's session expired and the grant is held back for its
    /// delay: about when the delay ends, by the leader's wall-clock stamps. No one
    /// holds the lock then; the first waiter gets it when the delay ends.
    pub held_back_until_ms: Option<u64>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct WaiterView {
    pub session: SessionId,
    pub client_name: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct SessionView {
    pub id: SessionId,
    pub ttl_ms: u64,
    /// The tenant the session belongs to.
    pub tenant: TenantId,
    pub client_name: String,
    /// Equal to `id`: a session id is the index of the entry that created it.
    pub created_index: u64,
    /// In the order of the grants.
    pub held: Vec<HeldLock>,
    /// Names of the locks waited on, in the order the session queued.
    pub waiting: Vec<String>,
    /// Semaphore permits held, in the order of the grants.
    pub permits: Vec<HeldLock>,
    /// Names of the semaphores waited on, in the order the session queued.
    pub waiting_semaphores: Vec<String>,
    /// Elections this session leads, in the order it became leader.
    pub leading: Vec<HeldLock>,
    /// Names of the elections this session waits to lead, in the order it queued.
    pub campaigning: Vec<String>,
}

/// A lock, permit or leadership a session holds.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct HeldLock {
    pub name: String,
    pub token: Token,
    pub since_ms: u64,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct SemaphoreView {
    pub name: String,
    /// May be below `holders.len()` after a lowering: lowering revokes no permit.
    pub limit: u32,
    /// In the order of the grants. A described semaphore has a holder or a waiter.
    pub holders: Vec<HolderView>,
    /// First in line first.
    pub waiters: Vec<WaiterView>,
}

/// The leader of an election, as described and as sent to observers.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct LeaderView {
    pub session: SessionId,
    pub client_name: String,
    /// The index of the entry that made this session leader; a proclaim keeps it.
    pub token: Token,
    /// The leader's wall-clock stamp of that entry; informational only.
    pub since_ms: u64,
    pub value: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct ElectionView {
    pub name: String,
    /// A described election has a leader: a vacant one has no entry.
    pub leader: LeaderView,
    /// Campaigners waiting to lead, first in line first.
    pub waiters: Vec<WaiterView>,
}

/// The answer to `check_fence`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum FenceStatus {
    /// The token is the current grant of the lock: a write carrying it may proceed.
    Current,
    /// The token is not the current grant: a later grant replaced it, the lock is free
    /// now, or the token was never a grant of this name. A write carrying it must be
    /// refused.
    Superseded,
}
