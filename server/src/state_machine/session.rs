//! One client's lease and everything that hangs off it.

use serde::{Deserialize, Serialize};

use super::{AcquireOutcome, CancelOutcome, RequestId, Response, SessionId, Token};

/// A live session. Closing or expiring it releases what it holds and ends its waits in
/// one entry.
///
/// Kept small because there can be `SESSIONS_MAX` of them: the lists are `Vec`s that
/// start with room for one entry, since most sessions hold one or two locks.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Session {
    /// The index of the entry that created the session: unique and the same everywhere.
    pub(super) id: SessionId,
    pub(super) ttl_ms: u64,
    pub(super) client_name: String,
    /// Names of the locks this session holds, in the order of their grants. Mirrors the
    /// lock table so that ending a session does not scan every lock.
    pub(super) held: Vec<String>,
    /// Names of the locks this session waits on, in the order it queued.
    pub(super) waiting: Vec<String>,
    /// Answers to this session's last requests, oldest first, for retries.
    pub(super) remembered: Vec<Remembered>,
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

    pub(super) fn lock_count(&self) -> usize {
        self.held.len() + self.waiting.len()
    }
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
/// session lives on. Smaller than `Response` because it has no strings or lists.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Answer {
    SessionCreated { session: SessionId, ttl_ms: u64 },
    Acquire(AcquireOutcome),
    WaitCancelled(CancelOutcome),
    Released { token: Token },
}

impl Answer {
    /// `None` for answers that are not kept: rejections (they changed nothing, so doing
    /// the command again is as good as answering it again) and the ends of sessions
    /// (whose remembered answers go with them).
    pub(super) fn from_response(response: &Response) -> Option<Answer> {
        match response {
            Response::SessionCreated { session, ttl_ms } => Some(Answer::SessionCreated {
                session: *session,
                ttl_ms: *ttl_ms,
            }),
            Response::Acquire(outcome) => Some(Answer::Acquire(*outcome)),
            Response::WaitCancelled(outcome) => Some(Answer::WaitCancelled(*outcome)),
            Response::Released { token } => Some(Answer::Released { token: *token }),
            Response::SessionClosed | Response::SessionsExpired { .. } | Response::Rejected(_) => {
                None
            }
        }
    }

    pub(super) fn to_response(self) -> Response {
        match self {
            Answer::SessionCreated { session, ttl_ms } => {
                Response::SessionCreated { session, ttl_ms }
            }
            Answer::Acquire(outcome) => Response::Acquire(outcome),
            Answer::WaitCancelled(outcome) => Response::WaitCancelled(outcome),
            Answer::Released { token } => Response::Released { token },
        }
    }
}

/// Grows a small list one slot at a time. The default growth jumps from none to four
/// slots, which would triple the memory of the common session that holds one lock and
/// remembers one or two answers; past four entries the usual doubling applies.
pub(super) fn push_compact<T>(list: &mut Vec<T>, item: T) {
    if list.len() == list.capacity() && list.len() < 4 {
        list.reserve_exact(1);
    }
    list.push(item);
}
