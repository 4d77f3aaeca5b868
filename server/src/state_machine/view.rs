//! Read-only answers to queries, detached from the state so they can be sent anywhere.

use serde::{Deserialize, Serialize};

use super::{SessionId, Token};

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct LockView {
    pub name: String,
    /// A lock that is described is held: free locks have no entry.
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
    pub client_name: String,
    /// Equal to `id`: a session id is the index of the entry that created it.
    pub created_index: u64,
    /// In the order of the grants.
    pub held: Vec<HeldLock>,
    /// Names of the locks waited on, in the order the session queued.
    pub waiting: Vec<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct HeldLock {
    pub name: String,
    pub token: Token,
    pub since_ms: u64,
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
