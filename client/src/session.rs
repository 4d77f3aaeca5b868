//! A session: the client's lease, kept alive in the background.
//!
//! A lease is not mutual exclusion. A process can pause (GC, swap, SIGSTOP) past its
//! lease and wake up still believing it holds a lock. The session's `deadline` is
//! conservative — counted from when the last answered keepalive was *sent* — and the
//! `jeopardy` signal fires while there is still time to stop work, but only the
//! fencing token checked by the storage makes a late write harmless.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use leasehold_proto as pb;
use tokio::sync::watch;

use crate::client::{Client, ATTEMPT_TIMEOUT_MS, RETRY_PAUSE_MS};
use crate::error::{Error, Result};
use crate::keepalive;
use crate::lock::{Acquired, LockGuard, NotAcquired};

/// Gives a grant back in the background when its guard is dropped without an
/// explicit release. Best effort: if this is lost, the grant ends with the session.
pub(crate) fn give_back_later<F, Fut>(session: &Session, name: String, token: u64, give_back: F)
where
    F: FnOnce(Client, SessionKey, String, u64) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<()>> + Send + 'static,
{
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        let (client, key) = (session.client().clone(), session.key());
        runtime.spawn(async move {
            let _ = give_back(client, key, name, token).await;
        });
    }
}

/// What a request on a session presents: the session's id and its secret.
#[derive(Clone)]
pub(crate) struct SessionKey {
    pub(crate) id: u64,
    pub(crate) secret: Vec<u8>,
}

/// One answer of a request that may wait: granted with a token, or not (yet).
pub(crate) enum WaitAnswer<Detail> {
    Granted(u64),
    NotYet { timed_out: bool, detail: Detail },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionState {
    /// Keepalives are answered; the deadline is comfortably ahead.
    Alive,
    /// No answer lately and the deadline is near: stop work that needs the locks.
    Jeopardy,
    /// The deadline passed or the server said the session is gone: every lock is lost.
    Lost,
}

/// A session. Cheap to clone; the keepalive task stops when `close` is called or the
/// last clone is dropped.
#[derive(Clone)]
pub struct Session {
    pub(crate) inner: Arc<SessionInner>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Session")
            .field("id", &self.inner.id)
            .field("ttl", &self.inner.ttl)
            .field("state", &self.state())
            .finish()
    }
}

pub(crate) struct SessionInner {
    pub(crate) client: Client,
    pub(crate) id: u64,
    /// The secret CreateSession returned: every request on the session carries it.
    pub(crate) secret: Vec<u8>,
    ttl: Duration,
    /// Published by the client's keepalive task.
    state: watch::Receiver<(SessionState, Instant)>,
}

impl Drop for SessionInner {
    fn drop(&mut self) {
        keepalive::deregister(&self.client, self.id);
        // Best effort: close the session so its locks are released now rather than
        // after the TTL.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let client = self.client.clone();
            let key = SessionKey { id: self.id, secret: self.secret.clone() };
            if self.state.borrow().0 != SessionState::Lost {
                runtime.spawn(async move {
                    let _ = close_session(&client, &key).await;
                });
            }
        }
    }
}

async fn close_session(client: &Client, key: &SessionKey) -> Result<()> {
    let request = pb::CloseSessionRequest {
        request_id: Some(client.next_request_id()),
        session_id: key.id,
        session_secret: key.secret.clone(),
    };
    let closed = client
        .with_leader("close session", client.inner.request_deadline, |channel| {
            let request = request.clone();
            async move { Client::leasehold(channel).close_session(request).await.map(|_| ()) }
        })
        .await;
    match closed {
        // A retried close whose first attempt took effect finds the session gone.
        Err(Error::NotFound(_)) => Ok(()),
        other => other,
    }
}

impl Session {
    pub(crate) async fn create(client: Client, ttl: Duration) -> Result<Session> {
        let request = pb::CreateSessionRequest {
            request_id: Some(client.next_request_id()),
            ttl_ms: ttl.as_millis() as u64,
            client_name: client.inner.client_name.clone(),
        };
        let sent_at = Instant::now();
        let created =
            client
                .with_leader("create session", client.inner.request_deadline, |channel| {
                    let request = request.clone();
                    async move {
                        Client::leasehold(channel).create_session(request).await.map(|response| response.into_inner())
                    }
                })
                .await?;
        let ttl = Duration::from_millis(created.ttl_ms);
        let deadline = sent_at + keepalive::counted_on(created.ttl_ms, ttl);
        let (state_sender, state) = watch::channel((SessionState::Alive, deadline));
        let secret = created.session_secret;
        keepalive::register(&client, created.session_id, secret.clone(), ttl, deadline, state_sender);
        Ok(Session { inner: Arc::new(SessionInner { client, id: created.session_id, secret, ttl, state }) })
    }

    pub fn id(&self) -> u64 {
        self.inner.id
    }

    /// The session's secret, which every request on it presents (the library does so
    /// itself; this is for calling the generated gRPC clients directly). Keep it to
    /// this process: with the id, it acts for the session.
    pub fn secret(&self) -> Vec<u8> {
        self.inner.secret.clone()
    }

    pub(crate) fn key(&self) -> SessionKey {
        SessionKey { id: self.inner.id, secret: self.inner.secret.clone() }
    }

    pub fn ttl(&self) -> Duration {
        self.inner.ttl
    }

    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    /// The conservative deadline: the send time of the last answered keepalive plus
    /// the TTL, less the allowance for clock drift between this process and the
    /// leader (`leasehold_proto::lease::client_lease_ms`). Past it, assume the locks
    /// are held by someone else.
    pub fn deadline(&self) -> std::time::Instant {
        self.inner.state.borrow().1.into_std()
    }

    pub fn state(&self) -> SessionState {
        self.inner.state.borrow().0
    }

    /// Resolves when the session is in jeopardy or lost.
    pub async fn jeopardy(&self) -> SessionState {
        let mut state = self.inner.state.clone();
        let reached = state.wait_for(|(state, _)| *state != SessionState::Alive).await.map(|value| value.0);
        reached.unwrap_or(SessionState::Lost)
    }

    /// Resolves when the session is lost.
    pub async fn lost(&self) {
        let mut state = self.inner.state.clone();
        let _ = state.wait_for(|(state, _)| *state == SessionState::Lost).await;
    }

    /// Closes the session: every lock it holds is released in one committed entry.
    pub async fn close(self) -> Result<()> {
        keepalive::deregister(&self.inner.client, self.inner.id);
        close_session(&self.inner.client, &self.key()).await
    }

    /// Acquires `name`, waiting in the FIFO queue for at most `wait` (zero: answer
    /// at once). A retried request after a lost answer returns the same grant. The
    /// lock-delay is the cluster's default for the name (see `acquire_with_delay`).
    pub async fn acquire(&self, name: &str, wait: Duration) -> Result<Acquired> {
        self.acquire_with_delay(name, wait, None).await
    }

    /// `acquire` with a lock-delay: if this session expires while it holds the lock
    /// (not when it releases or closes), the cluster gives the lock to nobody for
    /// `lock_delay` after the expiry. For side effects that no fencing token can
    /// guard; a fenced write needs none. `None` takes the cluster's default for the
    /// name, `Some(Duration::ZERO)` asks for none; at most 60 s.
    pub async fn acquire_with_delay(
        &self,
        name: &str,
        wait: Duration,
        lock_delay: Option<Duration>,
    ) -> Result<Acquired> {
        let session_id = self.inner.id;
        let lock_delay_ms = lock_delay.map(|delay| delay.as_millis() as u64);
        let answer = self
            .wait_request("acquire", wait, |channel, request_id, wait_ms| {
                let request = pb::AcquireRequest {
                    lock_delay_ms,
                    request_id: Some(request_id),
                    session_id,
                    name: name.to_string(),
                    wait_ms,
                    session_secret: self.secret(),
                };
                async move {
                    let response = Client::leasehold(channel).acquire(request).await?.into_inner();
                    Ok(match response.outcome {
                        Some(pb::acquire_response::Outcome::Granted(granted)) => WaitAnswer::Granted(granted.token),
                        Some(pb::acquire_response::Outcome::NotAcquired(not_acquired)) => WaitAnswer::NotYet {
                            timed_out: not_acquired.timed_out,
                            detail: NotAcquired {
                                holder_session_id: not_acquired.holder_session_id,
                                holder_client_name: not_acquired.holder_client_name,
                                holder_token: not_acquired.holder_token,
                                timed_out: not_acquired.timed_out,
                                delay_until_unix_ms: Some(not_acquired.delay_until_unix_ms)
                                    .filter(|until_ms| *until_ms > 0),
                            },
                        },
                        None => return Err(tonic::Status::internal("acquire answered with no outcome")),
                    })
                }
            })
            .await?;
        Ok(match answer {
            Ok(token) => Acquired::Granted(LockGuard::new(self.clone(), name.to_string(), token)),
            Err(not_acquired) => Acquired::NotAcquired(not_acquired),
        })
    }

    /// Sends a request that may wait on the server (acquire, semaphore acquire,
    /// campaign) until it is granted or `wait` runs out. Each attempt tells the server
    /// the time that is left; lost answers are retried with the same request id; a
    /// wait the server cut short (it lost the waiting RPC) is retried as a new request
    /// for the time that is left.
    pub(crate) async fn wait_request<Detail, F, Fut>(
        &self,
        what: &str,
        wait: Duration,
        mut attempt: F,
    ) -> Result<std::result::Result<u64, Detail>>
    where
        F: FnMut(crate::client::Transport, pb::RequestId, u64) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<WaitAnswer<Detail>, tonic::Status>>,
    {
        let client = &self.inner.client;
        let give_up = Instant::now() + wait;
        loop {
            let request_id = client.next_request_id();
            let answer = client
                .with_leader_patient(
                    what,
                    wait + client.inner.request_deadline,
                    wait + Duration::from_millis(ATTEMPT_TIMEOUT_MS),
                    // A wait that ends because the session is gone (it ended while the
                    // session waited, or the retry of a lost answer found it gone)
                    // reports the session lost: the wait may have been granted just
                    // before the session ended, and whatever it got went with it.
                    Some(self.inner.id),
                    |channel| {
                        // A retry carries the same request id, so it must be the same
                        // command: a waiting request stays a waiting one (at least 1 ms)
                        // even when its time has nearly run out.
                        let left_ms = give_up.saturating_duration_since(Instant::now()).as_millis() as u64;
                        let wait_ms = if wait.is_zero() { 0 } else { left_ms.max(1) };
                        attempt(channel, request_id, wait_ms)
                    },
                )
                .await?;
            match answer {
                WaitAnswer::Granted(token) => return Ok(Ok(token)),
                WaitAnswer::NotYet { timed_out, detail } => {
                    let left = give_up.saturating_duration_since(Instant::now());
                    if timed_out && left > Duration::from_millis(RETRY_PAUSE_MS) {
                        continue;
                    }
                    return Ok(Err(detail));
                }
            }
        }
    }

    /// Try-lock: the guard if `name` was free (or already held by this session).
    pub async fn try_lock(&self, name: &str) -> Result<Option<LockGuard>> {
        Ok(self.acquire(name, Duration::ZERO).await?.granted())
    }

    /// Waits at most `timeout` in the queue.
    pub async fn lock_with_timeout(&self, name: &str, timeout: Duration) -> Result<Option<LockGuard>> {
        Ok(self.acquire(name, timeout).await?.granted())
    }

    /// Waits in the queue until granted (or the session is lost).
    pub async fn lock(&self, name: &str) -> Result<LockGuard> {
        loop {
            if let Some(guard) = self.lock_with_timeout(name, Duration::from_secs(60)).await? {
                return Ok(guard);
            }
            if self.state() == SessionState::Lost {
                return Err(Error::SessionLost(self.inner.id));
            }
        }
    }
}
