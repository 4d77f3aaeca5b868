//! Semaphores: at most K holders of a name at once, cluster-wide — "at most K jobs of
//! this tenant at once". The limit is enforced by the replicated state machine, and
//! a dead worker's permit comes back when its session expires.

use std::time::Duration;

use leasehold_proto as pb;

use crate::client::Client;
use crate::error::Result;
use crate::session::{Session, SessionKey, WaitAnswer};

/// A semaphore as seen from one session.
#[derive(Clone, Debug)]
pub struct Semaphore {
    session: Session,
    name: String,
    limit: u32,
    /// `None`: the cluster's default for the name (see `with_lock_delay`).
    lock_delay: Option<Duration>,
}

/// Why a permit was not granted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SemaphoreFull {
    pub holders: u32,
    pub limit: u32,
    pub timed_out: bool,
}

/// A held permit; its token fences writes like a lock's. Released by `release()`, or
/// in the background on drop (best effort; at the latest when the session ends).
#[derive(Debug)]
pub struct PermitGuard {
    session: Session,
    name: String,
    token: u64,
    released: bool,
}

impl Session {
    /// The semaphore `name` with at most `limit` holders. The first acquirer sets the
    /// limit; acquiring with a different limit is refused.
    pub fn semaphore(&self, name: &str, limit: u32) -> Semaphore {
        Semaphore { session: self.clone(), name: name.to_string(), limit, lock_delay: None }
    }
}

impl Semaphore {
    /// Permits acquired from here on carry `lock_delay` (as
    /// `Session::acquire_with_delay`): a permit whose holder's session expired is
    /// given to nobody for that long, and counts against the limit meanwhile.
    pub fn with_lock_delay(mut self, lock_delay: Duration) -> Semaphore {
        self.lock_delay = Some(lock_delay);
        self
    }

    /// Waits at most `wait` for a permit (zero: answer at once).
    pub async fn acquire_within(&self, wait: Duration) -> Result<std::result::Result<PermitGuard, SemaphoreFull>> {
        let (session_id, name, limit) = (self.session.id(), self.name.clone(), self.limit);
        let lock_delay_ms = self.lock_delay.map(|delay| delay.as_millis() as u64);
        let answer = self
            .session
            .wait_request("semaphore acquire", wait, |channel, request_id, wait_ms| {
                let request = pb::SemAcquireRequest {
                    lock_delay_ms,
                    request_id: Some(request_id),
                    session_id,
                    name: name.clone(),
                    limit,
                    wait_ms,
                    session_secret: self.session.secret(),
                };
                async move {
                    let response = Client::semaphores(channel).acquire(request).await?.into_inner();
                    Ok(match response.outcome {
                        Some(pb::sem_acquire_response::Outcome::Granted(granted)) => WaitAnswer::Granted(granted.token),
                        Some(pb::sem_acquire_response::Outcome::NotAcquired(full)) => WaitAnswer::NotYet {
                            timed_out: full.timed_out,
                            detail: SemaphoreFull {
                                holders: full.holders,
                                limit: full.limit,
                                timed_out: full.timed_out,
                            },
                        },
                        None => return Err(tonic::Status::internal("semaphore acquire answered with no outcome")),
                    })
                }
            })
            .await?;
        Ok(answer.map(|token| PermitGuard {
            session: self.session.clone(),
            name: self.name.clone(),
            token,
            released: false,
        }))
    }

    /// A permit if one is free now.
    pub async fn try_acquire(&self) -> Result<Option<PermitGuard>> {
        Ok(self.acquire_within(Duration::ZERO).await?.ok())
    }

    /// Waits in the FIFO queue until a permit is granted.
    pub async fn acquire(&self) -> Result<PermitGuard> {
        loop {
            if let Ok(permit) = self.acquire_within(Duration::from_secs(60)).await? {
                return Ok(permit);
            }
        }
    }

    /// Changes the limit. Lowering it revokes nobody; it only holds back new grants.
    pub async fn set_limit(&self, limit: u32) -> Result<u32> {
        set_limit(&self.session, &self.name, "", limit).await
    }
}

impl Session {
    /// The admin only (a session made with the admin credential): changes the limit
    /// of `tenant`'s semaphore `name`, and returns the one it had.
    pub async fn set_tenant_semaphore_limit(&self, tenant: &str, name: &str, limit: u32) -> Result<u32> {
        set_limit(self, name, tenant, limit).await
    }
}

async fn set_limit(session: &Session, name: &str, tenant: &str, limit: u32) -> Result<u32> {
    let client = session.client();
    let request = pb::SemSetLimitRequest {
        request_id: Some(client.next_request_id()),
        session_id: session.id(),
        name: name.to_string(),
        limit,
        session_secret: session.secret(),
        tenant: tenant.to_string(),
    };
    let response = client
        .with_leader("semaphore set limit", client.inner.request_deadline, |channel| {
            let request = request.clone();
            async move { Client::semaphores(channel).set_limit(request).await.map(|response| response.into_inner()) }
        })
        .await?;
    Ok(response.previous_limit)
}

impl PermitGuard {
    /// The permit's fencing token: the log index of the entry that granted it.
    pub fn token(&self) -> u64 {
        self.token
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub async fn release(mut self) -> Result<()> {
        self.released = true;
        release(self.session.client(), &self.session.key(), &self.name, self.token).await
    }
}

async fn release(client: &Client, key: &SessionKey, name: &str, token: u64) -> Result<()> {
    let request = pb::SemReleaseRequest {
        request_id: Some(client.next_request_id()),
        session_id: key.id,
        name: name.to_string(),
        token,
        session_secret: key.secret.clone(),
    };
    client
        .with_leader("semaphore release", client.inner.request_deadline, |channel| {
            let request = request.clone();
            async move { Client::semaphores(channel).release(request).await.map(|_| ()) }
        })
        .await
}

impl Drop for PermitGuard {
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

impl Client {
    pub async fn describe_semaphore(&self, name: &str) -> Result<pb::DescribeSemaphoreResponse> {
        let request = pb::DescribeSemaphoreRequest { name: name.to_string(), stale: false, ..Default::default() };
        self.with_leader("describe semaphore", self.inner.request_deadline, |channel| {
            let request = request.clone();
            async move { Client::semaphores(channel).describe(request).await.map(|response| response.into_inner()) }
        })
        .await
    }
}
