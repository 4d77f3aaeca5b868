//! etcd through its own gRPC API, the way its lock users run it: one lease per
//! client, kept alive in the background, and v3lock `Lock`/`Unlock` with that lease.
//! A client talks to one member (members forward to the leader) and moves to the
//! next member when a request fails, as etcd's clients do. A lease found gone (its
//! keepalive answered with no TTL, or a request refused for it) is replaced by a new
//! one before the next lock, as a user of `concurrency.Session` makes a new session
//! once the old one's `Done()` closes.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::etcd_wire::*;

/// How long one keepalive may wait for its answer.
pub const KEEPALIVE_ANSWER_TIMEOUT_MS: u64 = 2_000;
/// How long one Lock or Unlock attempt may hang before it is tried on the next member.
pub const ATTEMPT_TIMEOUT_MS: u64 = 2_000;
/// Unlock attempts at most.
pub const UNLOCK_ATTEMPTS: usize = 3;
/// Pause before the background keepalive tries again after a failure.
pub const KEEPALIVE_RETRY_PAUSE_MS: u64 = 50;

pub struct EtcdWorker {
    members: EtcdMembers,
    /// Index in `members.endpoints` of the member this client talks to.
    current: usize,
    connection: Option<EtcdConnection>,
    lease_id: i64,
    ttl: Duration,
    /// Set when the lease is found gone; the next lock grants a new one.
    lease_lost: Arc<AtomicBool>,
    /// The lease's keepalive, once per TTL/3, as etcd's clients do.
    background_keepalive: JoinHandle<()>,
    /// The back-to-back keepalive stream of the keepalive workload.
    keepalive: Option<KeepAliveStream>,
}

struct KeepAliveStream {
    requests: mpsc::Sender<LeaseKeepAliveRequest>,
    answers: tonic::codec::Streaming<LeaseKeepAliveResponse>,
    /// True right after opening: the first keepalive went out with the stream.
    first_sent: bool,
}

impl Drop for EtcdWorker {
    fn drop(&mut self) {
        self.background_keepalive.abort();
    }
}

impl EtcdWorker {
    /// A client on member `index % members.endpoints.len()` with a fresh lease of `ttl`.
    pub async fn open(members: &EtcdMembers, index: usize, ttl: Duration) -> anyhow::Result<EtcdWorker> {
        let current = index % members.endpoints.len();
        let mut connection = members.connect(current).await.context("connect to etcd")?;
        let lease_lost = Arc::new(AtomicBool::new(false));
        let (lease_id, background_keepalive) =
            grant_lease(&mut connection, members, current, ttl, lease_lost.clone()).await?;
        Ok(EtcdWorker {
            members: members.clone(),
            current,
            connection: Some(connection),
            lease_id,
            ttl,
            lease_lost,
            background_keepalive,
            keepalive: None,
        })
    }

    /// A new lease in place of one found gone, with its own background keepalive.
    async fn replace_lost_lease(&mut self) -> anyhow::Result<()> {
        if !self.lease_lost.load(Ordering::Relaxed) {
            return Ok(());
        }
        self.background_keepalive.abort();
        self.keepalive = None;
        let (members, current, ttl) = (self.members.clone(), self.current, self.ttl);
        let lost = Arc::new(AtomicBool::new(false));
        let connection = match self.connection().await {
            Ok(connection) => connection,
            Err(error) => {
                self.move_on();
                return Err(error);
            }
        };
        let granted = grant_lease(connection, &members, current, ttl, lost.clone()).await;
        let (lease_id, background_keepalive) = match granted {
            Ok(granted) => granted,
            Err(error) => {
                self.move_on();
                return Err(error);
            }
        };
        self.lease_id = lease_id;
        self.background_keepalive = background_keepalive;
        self.lease_lost = lost;
        Ok(())
    }

    /// Notes a refusal that says the lease is gone.
    fn note_lease_refusal(&self, error: &anyhow::Error) {
        if error.to_string().contains("lease not found") {
            self.lease_lost.store(true, Ordering::Relaxed);
        }
    }

    async fn connection(&mut self) -> anyhow::Result<&mut EtcdConnection> {
        if self.connection.is_none() {
            self.connection = Some(self.members.connect(self.current).await?);
        }
        Ok(self.connection.as_mut().expect("connected above"))
    }

    /// After a failed request: the next member, connected lazily.
    fn move_on(&mut self) {
        self.connection = None;
        self.keepalive = None;
        self.current = (self.current + 1) % self.members.endpoints.len();
    }

    fn failed<T>(&mut self, result: Result<T, tonic::Status>) -> anyhow::Result<T> {
        result.map_err(|status| {
            self.move_on();
            anyhow::anyhow!("etcd: {status}")
        })
    }

    /// v3lock `Lock`: waits on the server until granted. `wait` bounds the wait on
    /// the client side (etcd has no wait parameter).
    pub async fn lock(&mut self, name: &str, wait: Duration) -> anyhow::Result<Option<Vec<u8>>> {
        self.replace_lost_lease().await?;
        let lease = self.lease_id;
        let give_up = tokio::time::Instant::now() + wait;
        loop {
            let left = give_up.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            // Like Leasehold's library, an attempt that hangs (its member lost the
            // leader) is given up after ATTEMPT_TIMEOUT_MS and tried on the next
            // member: Lock with the same lease finds its own key, so a retry is safe.
            let attempt = left.min(Duration::from_millis(ATTEMPT_TIMEOUT_MS));
            let request = LockRequest { name: name.as_bytes().to_vec(), lease };
            let connection = match self.connection().await {
                Ok(connection) => connection,
                Err(error) => {
                    self.move_on();
                    return Err(error);
                }
            };
            let locked = tokio::time::timeout(attempt, connection.unary::<_, LockResponse>(LOCK, request)).await;
            match locked {
                Ok(result) => {
                    return match self.failed(result) {
                        Ok(response) => Ok(Some(response.key)),
                        Err(error) => {
                            self.note_lease_refusal(&error);
                            Err(error)
                        }
                    }
                }
                Err(_) if attempt < left => self.move_on(),
                Err(_) => return Ok(None),
            }
        }
    }

    /// Unlock, each attempt given up after ATTEMPT_TIMEOUT_MS and tried on the next
    /// member (deleting the key again is harmless), at most `UNLOCK_ATTEMPTS` times.
    pub async fn unlock(&mut self, key: Vec<u8>) -> anyhow::Result<()> {
        for _ in 1..UNLOCK_ATTEMPTS {
            let connection = match self.connection().await {
                Ok(connection) => connection,
                Err(error) => {
                    self.move_on();
                    return Err(error);
                }
            };
            let request = UnlockRequest { key: key.clone() };
            let attempt = Duration::from_millis(ATTEMPT_TIMEOUT_MS);
            match tokio::time::timeout(attempt, connection.unary::<_, UnlockResponse>(UNLOCK, request)).await {
                Ok(result) => {
                    self.failed(result)?;
                    return Ok(());
                }
                Err(_) => self.move_on(),
            }
        }
        let connection = self.connection().await?;
        let result = connection.unary::<_, UnlockResponse>(UNLOCK, UnlockRequest { key }).await;
        self.failed(result)?;
        Ok(())
    }

    /// One keepalive of this client's lease, answered.
    pub async fn keepalive(&mut self) -> anyhow::Result<()> {
        self.replace_lost_lease().await?;
        let id = self.lease_id;
        if self.keepalive.is_none() {
            let connection = match self.connection().await {
                Ok(connection) => connection,
                Err(error) => {
                    self.move_on();
                    return Err(error);
                }
            };
            let opened = connection.keep_alive_stream(LeaseKeepAliveRequest { id }).await;
            let (requests, answers) = self.failed(opened)?;
            self.keepalive = Some(KeepAliveStream { requests, answers, first_sent: true });
        }
        let stream = self.keepalive.as_mut().expect("opened above");
        let answer = async {
            if !std::mem::take(&mut stream.first_sent) {
                stream.requests.send(LeaseKeepAliveRequest { id }).await.context("keepalive stream closed")?;
            }
            stream.answers.message().await?.context("keepalive stream ended")
        };
        match tokio::time::timeout(Duration::from_millis(KEEPALIVE_ANSWER_TIMEOUT_MS), answer).await {
            Ok(Ok(answer)) if answer.ttl_seconds > 0 => Ok(()),
            Ok(Ok(_)) => {
                self.lease_lost.store(true, Ordering::Relaxed);
                bail!("lease {id} is gone")
            }
            Ok(Err(error)) => {
                self.move_on();
                Err(error)
            }
            Err(_) => {
                self.move_on();
                bail!("keepalive not answered in {KEEPALIVE_ANSWER_TIMEOUT_MS} ms")
            }
        }
    }

    pub async fn close(mut self) {
        self.background_keepalive.abort();
        let id = self.lease_id;
        if let Ok(connection) = self.connection().await {
            let _ = connection.unary::<_, LeaseRevokeResponse>(LEASE_REVOKE, LeaseRevokeRequest { id }).await;
        }
    }
}

/// Grants a lease of `ttl` on `connection` and starts its background keepalive, which
/// sets `lost` if the lease is found gone.
async fn grant_lease(
    connection: &mut EtcdConnection,
    members: &EtcdMembers,
    current: usize,
    ttl: Duration,
    lost: Arc<AtomicBool>,
) -> anyhow::Result<(i64, JoinHandle<()>)> {
    let ttl_seconds = ttl.as_secs().max(1) as i64;
    let granted: LeaseGrantResponse = connection.unary(LEASE_GRANT, LeaseGrantRequest { ttl_seconds, id: 0 }).await?;
    if !granted.error.is_empty() {
        bail!("lease grant refused: {}", granted.error);
    }
    let keepalive = tokio::spawn(keep_lease_alive(
        members.clone(),
        current,
        granted.id,
        Duration::from_secs(ttl_seconds as u64),
        lost,
    ));
    Ok((granted.id, keepalive))
}

/// Keeps lease `id` alive: one keepalive per TTL/3 on a stream of its own, moving to
/// the next member when the stream fails. Ends when an answer says the lease is gone
/// (setting `lost`), or when aborted.
async fn keep_lease_alive(members: EtcdMembers, mut current: usize, id: i64, ttl: Duration, lost: Arc<AtomicBool>) {
    let interval = ttl / 3;
    let endpoints = &members.endpoints;
    loop {
        let opened = async {
            let mut connection = members.connect(current).await?;
            anyhow::Ok(connection.keep_alive_stream(LeaseKeepAliveRequest { id }).await?)
        };
        let Ok((requests, mut answers)) = opened.await else {
            current = (current + 1) % endpoints.len();
            tokio::time::sleep(Duration::from_millis(KEEPALIVE_RETRY_PAUSE_MS)).await;
            continue;
        };
        loop {
            let answer =
                tokio::time::timeout(Duration::from_millis(KEEPALIVE_ANSWER_TIMEOUT_MS), answers.message()).await;
            match answer {
                Ok(Ok(Some(answer))) if answer.ttl_seconds <= 0 => {
                    lost.store(true, Ordering::Relaxed);
                    return;
                }
                Ok(Ok(Some(_))) => {}
                _ => break,
            }
            tokio::time::sleep(interval).await;
            if requests.send(LeaseKeepAliveRequest { id }).await.is_err() {
                break;
            }
        }
        current = (current + 1) % endpoints.len();
        tokio::time::sleep(Duration::from_millis(KEEPALIVE_RETRY_PAUSE_MS)).await;
    }
}

/// The index in `etcd.endpoints` of the member that leads, asking each member's status.
pub async fn leader_index(etcd: &EtcdMembers) -> anyhow::Result<Option<usize>> {
    let mut members = Vec::new();
    let mut leader = None;
    for index in 0..etcd.endpoints.len() {
        let status = async {
            let mut connection = etcd.connect(index).await?;
            anyhow::Ok(connection.unary::<_, StatusResponse>(MAINTENANCE_STATUS, StatusRequest {}).await?)
        };
        match tokio::time::timeout(Duration::from_millis(CONNECT_TIMEOUT_MS * 2), status).await {
            Ok(Ok(status)) => {
                members.push(status.header.as_ref().map(|header| header.member_id));
                if status.leader != 0 {
                    leader = Some(status.leader);
                }
            }
            _ => members.push(None),
        }
    }
    Ok(leader.and_then(|leader| members.iter().position(|member| *member == Some(leader))))
}
