//! Lock guards and the fencing token.

use std::time::Instant;

use leasehold_proto as pb;

use crate::client::Client;
use crate::error::Result;
use crate::session::{Session, SessionKey};

/// The answer to an acquire.
pub enum Acquired {
    Granted(LockGuard),
    NotAcquired(NotAcquired),
}

impl Acquired {
    pub fn granted(self) -> Option<LockGuard> {
        match self {
            Acquired::Granted(guard) => Some(guard),
            Acquired::NotAcquired(_) => None,
        }
    }
}

/// Who held the lock when the acquire gave up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotAcquired {
    /// 0 when the lock was free by the time the answer was made.
    pub holder_session_id: u64,
    pub holder_client_name: String,
    pub holder_token: u64,
    /// True when the request waited and the wait ran out; false for a busy try-lock.
    pub timed_out: bool,
    /// Set when the lock is in the lock-delay of a holder whose session expired (the
    /// holder fields name that grant): about when the delay ends, by the leader's
    /// wall clock, in milliseconds since the Unix epoch.
    pub delay_until_unix_ms: Option<u64>,
}

/// A held lock. Its `token` is the fencing token: pass it to the storage you write
/// to, which must reject writes with a token lower than one it has seen
/// (`UPDATE … WHERE fence_token < $token`). Holding the guard does NOT prove the
/// lock is still yours: a paused process can outlive its lease.
///
/// Released by `release().await`; on drop, a release is sent in the background
/// (best effort: if it is lost, the lock is freed when the session ends).
pub struct LockGuard {
    session: Session,
    name: String,
    token: u64,
    released: bool,
}

impl std::fmt::Debug for LockGuard {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("LockGuard")
            .field("name", &self.name)
            .field("token", &self.token)
            .field("session", &self.session.id())
            .finish()
    }
}

impl LockGuard {
    pub(crate) fn new(session: Session, name: String, token: u64) -> Self {
        Self { session, name, token, released: false }
    }

    /// The fencing token: the Raft log index of the entry that granted this lock.
    pub fn token(&self) -> u64 {
        self.token
    }

    /// The fencing token as a type that converts to an SQL BIGINT and a header
    /// value; see the `fence` module for how the storage must check it.
    pub fn fencing_token(&self) -> crate::fence::FencingToken {
        crate::fence::FencingToken::new(self.token)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn session(&self) -> &Session {
        &self.session
    }

    /// The session's conservative deadline; past it, assume the lock is someone else's.
    pub fn deadline(&self) -> Instant {
        self.session.deadline()
    }

    /// Gives up the guard but keeps the lock: it stays held until released by token
    /// or until the session ends. Returns the token.
    pub fn detach(mut self) -> u64 {
        self.released = true;
        self.token
    }

    /// Releases the lock (compare-and-release on the token). An error says the lock
    /// was no longer this grant's (the session expired and it passed on).
    pub async fn release(mut self) -> Result<()> {
        self.released = true;
        release(self.session.client(), &self.session.key(), &self.name, self.token).await
    }
}

pub(crate) async fn release(client: &Client, key: &SessionKey, name: &str, token: u64) -> Result<()> {
    let request = pb::ReleaseRequest {
        request_id: Some(client.next_request_id()),
        session_id: key.id,
        name: name.to_string(),
        token,
        session_secret: key.secret.clone(),
    };
    client
        .with_leader("release", client.inner.request_deadline, |channel| {
            let request = request.clone();
            async move { Client::leasehold(channel).release(request).await.map(|_| ()) }
        })
        .await
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        let name = std::mem::take(&mut self.name);
        crate::session::give_back_later(&self.session, name, self.token, |client, key, name, token| async move {
            release(&client, &key, &name, token).await
        });
    }
}
