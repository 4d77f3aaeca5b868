//! etcd through its own gRPC API, the way its lock users run it: one lease per
//! client, kept alive in the background, and v3lock `Lock`/`Unlock` with that lease.
//! A client talks to one member (members forward to the leader) and moves to the
//! next member when a request fails, as etcd's clients do.

use std::time::Duration;

use anyhow::{bail, Context};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::etcd_wire::*;

/// How long one keepalive may wait for its answer.
pub const KEEPALIVE_ANSWER_TIMEOUT_MS: u64 = 2_000;
/// Pause before the background keepalive tries again after a failure.
pub const KEEPALIVE_RETRY_PAUSE_MS: u64 = 50;

pub struct EtcdWorker {
    members: EtcdMembers,
    /// Index in `members.endpoints` of the member this client talks to.
    current: usize,
    connection: Option<EtcdConnection>,
    lease_id: i64,
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
        let ttl_seconds = ttl.as_secs().max(1) as i64;
        let granted: LeaseGrantResponse =
            connection.unary(LEASE_GRANT, LeaseGrantRequest { ttl_seconds, id: 0 }).await?;
        if !granted.error.is_empty() {
            bail!("lease grant refused: {}", granted.error);
        }
        let background_keepalive = tokio::spawn(keep_lease_alive(
            members.clone(),
            current,
            granted.id,
            Duration::from_secs(ttl_seconds as u64),
        ));
        Ok(EtcdWorker {
            members: members.clone(),
            current,
            connection: Some(connection),
            lease_id: granted.id,
            background_keepalive,
            keepalive: None,
        })
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
        let lease = self.lease_id;
        let request = LockRequest { name: name.as_bytes().to_vec(), lease };
        let connection = match self.connection().await {
            Ok(connection) => connection,
            Err(error) => {
                self.move_on();
                return Err(error);
            }
        };
        let locked = tokio::time::timeout(wait, connection.unary::<_, LockResponse>(LOCK, request)).await;
        match locked {
            Ok(result) => Ok(Some(self.failed(result)?.key)),
            Err(_) => Ok(None),
        }
    }

    pub async fn unlock(&mut self, key: Vec<u8>) -> anyhow::Result<()> {
        let connection = match self.connection().await {
            Ok(connection) => connection,
            Err(error) => {
                self.move_on();
                return Err(error);
            }
        };
        let result = connection.unary::<_, UnlockResponse>(UNLOCK, UnlockRequest { key }).await;
        self.failed(result)?;
        Ok(())
    }

    /// One keepalive of this client's lease, answered.
    pub async fn keepalive(&mut self) -> anyhow::Result<()> {
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
            Ok(Ok(_)) => bail!("lease {id} is gone"),
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

/// Keeps lease `id` alive: one keepalive per TTL/3 on a stream of its own, moving to
/// the next member when the stream fails. Runs until aborted.
async fn keep_lease_alive(members: EtcdMembers, mut current: usize, id: i64, ttl: Duration) {
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
            if !matches!(answer, Ok(Ok(Some(_)))) {
                break;
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
