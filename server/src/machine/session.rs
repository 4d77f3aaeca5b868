//! One client's lease and everything that hangs off it.

use std::borrow::Borrow;
use std::ops::Deref;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use thin_vec::ThinVec;

use super::{AcquireOutcome, CancelOutcome, Command, RequestId, ResourceKind, Response, SessionId, Token};

/// A live session. Closing or expiring it releases what it holds and ends its waits in
/// one entry.
///
/// Kept small because there can be `SESSIONS_MAX` of them: the lists are `ThinVec`s
/// (one pointer inline, nothing on the heap while empty) that start with room for one
/// entry, since most sessions hold one or two locks. Semaphores and elections share
/// one list, `claims`, so that a session that uses neither pays for one empty pointer.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Session {
    /// The index of the entry that created the session: unique and the same everywhere.
    pub(super) id: SessionId,
    pub(super) ttl_ms: u64,
    /// Shared by every session with the same client name (see
    /// `StateMachine::client_names`): a client process usually opens many.
    pub(super) client_name: ClientName,
    /// Names of the locks this session holds, in the order of their grants. Mirrors the
    /// lock table so that ending a session does not scan every lock.
    pub(super) held: ThinVec<String>,
    /// Names of the locks this session waits on, in the order it queued.
    pub(super) waiting: ThinVec<String>,
    /// The semaphore permits and elections this session holds or waits for. A claim is
    /// appended when it starts and moved to the end when a wait turns into a grant, so
    /// the claims of one kind and role are in the order of their grants or queueing.
    /// Mirrors the semaphore and election tables like `held` mirrors the lock table.
    pub(super) claims: ThinVec<Claim>,
    /// Answers to this session's last requests, oldest first, for retries.
    pub(super) remembered: ThinVec<Remembered>,
}

/// A client name that sessions share: a thin pointer, so that a `Session` takes 56
/// bytes (a 64-byte heap block) rather than 64 (an 80-byte one). Encoded as the string.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[serde(transparent)]
pub struct ClientName(Arc<String>);

impl ClientName {
    pub(super) fn new(name: &str) -> ClientName {
        ClientName(Arc::new(name.to_owned()))
    }

    /// Whether both are the same shared copy.
    pub(super) fn same_copy(&self, other: &ClientName) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Deref for ClientName {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

/// Lets the table of shared names be searched by `&str`; ordered as the strings are.
impl Borrow<str> for ClientName {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl Session {
    pub fn id(&self) -> SessionId {
        self.id
    }

    /// The lease the leader arms for this session, from scratch after a leader change.
    pub fn ttl_ms(&self) -> u64 {
        self.ttl_ms
    }

    pub fn client_name(&self) -> &str {
        &self.client_name
    }

    /// The session id is the index of its creating entry; this says so by name.
    pub fn created_index(&self) -> u64 {
        self.id
    }

    pub fn held_names(&self) -> impl Iterator<Item = &str> + '_ {
        self.held.iter().map(String::as_str)
    }

    pub fn waiting_names(&self) -> impl Iterator<Item = &str> + '_ {
        self.waiting.iter().map(String::as_str)
    }

    /// Everything the session holds or waits for: what `LOCKS_PER_SESSION_MAX` bounds.
    pub(super) fn resource_count(&self) -> usize {
        self.held.len() + self.waiting.len() + self.claims.len()
    }

    /// Names of the semaphores or elections this session holds (or waits for), in the
    /// order of the grants (or of queueing).
    pub(super) fn claimed(&self, kind: ResourceKind, role: Role) -> impl Iterator<Item = &str> {
        self.claims
            .iter()
            .filter(move |claim| claim.kind == kind && claim.role == role)
            .map(|claim| claim.name.as_str())
    }

    pub(super) fn add_claim(&mut self, kind: ResourceKind, role: Role, name: &str) {
        push_compact(&mut self.claims, Claim { kind, role, name: name.to_owned() });
    }

    /// # Panics
    ///
    /// If the session does not list the claim: the tables and the sessions disagree.
    pub(super) fn remove_claim(&mut self, kind: ResourceKind, role: Role, name: &str) {
        let position = self
            .claims
            .iter()
            .position(|claim| claim.kind == kind && claim.role == role && claim.name == name)
            .unwrap_or_else(|| panic!("session {} does not list {role:?} {kind:?} {name:?}", self.id));
        self.claims.remove(position);
    }
}

/// One semaphore or election a session holds or waits for.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub(super) struct Claim {
    /// `Semaphore` or `Election`; locks have their own lists.
    pub(super) kind: ResourceKind,
    pub(super) role: Role,
    pub(super) name: String,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Role {
    /// Holds a permit of the semaphore, or leads the election.
    Holds,
    /// Waits in the semaphore's or election's queue.
    Waits,
}

/// The stored answer to one request, for a retry to find.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Remembered {
    pub(super) request: RequestId,
    /// `Command::fingerprint` of the command, to tell a retry from a reuse of the id.
    pub(super) fingerprint: u64,
    pub(super) answer: Answer,
}

/// The answers that are worth remembering: those of commands that took effect while the
/// session lives on. Smaller than `Response` because it has no strings or lists, and
/// because answers of the same shape share a variant: the command, which a retry repeats
/// unchanged, tells which response to rebuild. That keeps one `AcquireOutcome` variant,
/// so the enum stays as small as the outcome itself.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Answer {
    SessionCreated {
        session: SessionId,
        ttl_ms: u64,
    },
    /// For `Acquire`, `SemAcquire` and `Campaign`.
    Acquire(AcquireOutcome),
    /// For `CancelWait`, `SemCancelWait` and `CampaignCancelWait`.
    WaitCancelled(CancelOutcome),
    /// For `Release`, `SemRelease`, `Proclaim` and `Resign`.
    Released {
        token: Token,
    },
    SemLimitSet {
        limit: u32,
        previous: u32,
    },
}

impl Answer {
    /// `None` for answers that are not kept: rejections (they changed nothing, so doing
    /// the command again is as good as answering it again) and the ends of sessions
    /// (whose remembered answers go with them).
    pub(super) fn from_response(response: &Response) -> Option<Answer> {
        match response {
            Response::SessionCreated { session, ttl_ms } => {
                Some(Answer::SessionCreated { session: *session, ttl_ms: *ttl_ms })
            }
            Response::Acquire(outcome) | Response::SemAcquire(outcome) | Response::Campaign(outcome) => {
                Some(Answer::Acquire(*outcome))
            }
            Response::WaitCancelled(outcome) => Some(Answer::WaitCancelled(*outcome)),
            Response::Released { token }
            | Response::SemReleased { token }
            | Response::Proclaimed { token }
            | Response::Resigned { token } => Some(Answer::Released { token: *token }),
            Response::SemLimitSet { limit, previous } => {
                Some(Answer::SemLimitSet { limit: *limit, previous: *previous })
            }
            Response::SessionClosed | Response::SessionsExpired { .. } | Response::Rejected(_) => None,
        }
    }

    /// The response this answer was made from; `command` is the command that got it.
    pub(super) fn to_response(self, command: &Command) -> Response {
        match self {
            Answer::SessionCreated { session, ttl_ms } => Response::SessionCreated { session, ttl_ms },
            Answer::Acquire(outcome) => match command {
                Command::SemAcquire { .. } => Response::SemAcquire(outcome),
                Command::Campaign { .. } => Response::Campaign(outcome),
                _ => Response::Acquire(outcome),
            },
            Answer::WaitCancelled(outcome) => Response::WaitCancelled(outcome),
            Answer::Released { token } => match command {
                Command::SemRelease { .. } => Response::SemReleased { token },
                Command::Proclaim { .. } => Response::Proclaimed { token },
                Command::Resign { .. } => Response::Resigned { token },
                _ => Response::Released { token },
            },
            Answer::SemLimitSet { limit, previous } => Response::SemLimitSet { limit, previous },
        }
    }
}

/// Grows a small list one slot at a time. The default growth jumps from none to four
/// slots, which would triple the memory of the common session that holds one lock and
/// remembers one or two answers; past four entries the usual doubling applies.
pub(super) fn push_compact<T>(list: &mut ThinVec<T>, item: T) {
    if list.len() == list.capacity() && list.len() < 4 {
        list.reserve_exact(1);
    }
    list.push(item);
}
