//! Leasehold through its public API: the `leasehold` library for sessions, locks and
//! semaphores; the `KeepAlive` gRPC stream directly for the keepalive workload (the
//! library sends one keepalive per TTL/6, the workload sends them back to back).

use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context};
use leasehold::proto as pb;
use leasehold::{Acquired, Client, LockGuard, PermitGuard, Session};
use tokio::sync::mpsc;

use crate::transport::Transport;

/// How long one keepalive may wait for its answer.
pub const KEEPALIVE_ANSWER_TIMEOUT_MS: u64 = 2_000;
/// How long connecting to a node may take.
pub const CONNECT_TIMEOUT_MS: u64 = 1_000;

pub struct LeaseholdWorker {
    endpoints: Vec<String>,
    session: Session,
    /// The back-to-back keepalive stream of the keepalive workload, opened on first use.
    keepalive: Option<KeepAliveStream>,
    /// The lock-delay of every acquire (`--lock-delay`); None: the cluster's default.
    lock_delay: Option<Duration>,
    /// The refused workload's gRPC client on the leader and the session it closes
    /// again and again, closed once before; made on first use.
    refused: Option<Refused>,
}

struct Refused {
    leader: pb::leasehold_client::LeaseholdClient<leasehold::client::Transport>,
    gone_session: u64,
    gone_secret: Vec<u8>,
    sequence: u64,
}

struct KeepAliveStream {
    requests: mpsc::Sender<pb::KeepAliveRequest>,
    answers: tonic::codec::Streaming<pb::KeepAliveResponse>,
}

pub enum LeaseholdHeld {
    Lock(LockGuard),
    Permit(PermitGuard),
}

/// A client of the cluster at `endpoints`, with the TLS and credential of the
/// LEASEHOLD_* variables (see `leasehold::settings`); it connects on first use.
pub fn client(endpoints: &[String]) -> anyhow::Result<Client> {
    let settings = leasehold::Settings { endpoints: endpoints.to_vec(), ..leasehold::Settings::from_env() };
    settings.client().context("Leasehold client settings (LEASEHOLD_CA_FILE, LEASEHOLD_TOKEN_FILE)")
}

/// Whether the clients `client` builds speak TLS: plaintext only with
/// LEASEHOLD_INSECURE_PLAINTEXT=1 (the library refuses a client with neither that
/// nor a CA, so every other run is TLS).
pub fn transport() -> Transport {
    if leasehold::Settings::from_env().insecure_plaintext {
        Transport::Plaintext
    } else {
        Transport::Tls
    }
}

/// Adds tenant `name` with `quotas` through the admin credential in
/// `admin_token_file`, and returns its token. An earlier attempt whose answer was
/// lost (or a tenant of that name made before) is found as a refusal; the tenant then
/// gets a new token, since the old one is not shown again.
pub async fn add_tenant(
    endpoints: &[String],
    admin_token_file: &Path,
    name: &str,
    quotas: pb::Quotas,
) -> anyhow::Result<String> {
    let settings = leasehold::Settings {
        endpoints: endpoints.to_vec(),
        token_file: Some(admin_token_file.to_path_buf()),
        token: None,
        cert_file: None,
        key_file: None,
        ..leasehold::Settings::from_env()
    };
    let admin = settings.client().context("Leasehold admin client settings (LEASEHOLD_CA_FILE, --admin-token-file)")?;
    match admin.add_tenant(name, quotas).await {
        Ok(added) => Ok(added.token),
        Err(leasehold::Error::Refused(_)) => {
            admin.rotate_tenant_token(name).await.with_context(|| format!("give tenant {name} a new token"))
        }
        Err(error) => Err(error).with_context(|| format!("add tenant {name}")),
    }
}

impl LeaseholdWorker {
    pub async fn open(
        endpoints: &[String],
        ttl: Duration,
        lock_delay: Option<Duration>,
    ) -> anyhow::Result<LeaseholdWorker> {
        let client = client(endpoints)?;
        client.status_any().await.context("connect to Leasehold")?;
        let session = client.session(ttl).await.context("create a session")?;
        Ok(LeaseholdWorker { endpoints: endpoints.to_vec(), session, keepalive: None, lock_delay, refused: None })
    }

    pub async fn lock(&mut self, name: &str, wait: Duration) -> anyhow::Result<Option<LeaseholdHeld>> {
        Ok(match self.session.acquire_with_delay(name, wait, self.lock_delay).await? {
            Acquired::Granted(guard) => Some(LeaseholdHeld::Lock(guard)),
            Acquired::NotAcquired(_) => None,
        })
    }

    pub async fn semaphore_acquire(
        &mut self,
        name: &str,
        limit: u32,
        wait: Duration,
    ) -> anyhow::Result<Option<LeaseholdHeld>> {
        let mut semaphore = self.session.semaphore(name, limit);
        if let Some(lock_delay) = self.lock_delay {
            semaphore = semaphore.with_lock_delay(lock_delay);
        }
        Ok(semaphore.acquire_within(wait).await?.ok().map(LeaseholdHeld::Permit))
    }

    pub async fn release(&mut self, held: LeaseholdHeld) -> anyhow::Result<()> {
        match held {
            LeaseholdHeld::Lock(guard) => guard.release().await?,
            LeaseholdHeld::Permit(permit) => permit.release().await?,
        }
        Ok(())
    }

    /// One keepalive of this worker's session, sent to the leader and answered.
    pub async fn keepalive(&mut self) -> anyhow::Result<()> {
        if self.keepalive.is_none() {
            self.keepalive = Some(self.open_keepalive_stream().await?);
        }
        let stream = self.keepalive.as_mut().expect("opened above");
        let answer = async {
            stream
                .requests
                .send(pb::KeepAliveRequest { session_id: self.session.id(), session_secret: self.session.secret() })
                .await
                .context("keepalive stream closed")?;
            stream.answers.message().await?.context("keepalive stream ended")
        };
        let answered = tokio::time::timeout(Duration::from_millis(KEEPALIVE_ANSWER_TIMEOUT_MS), answer).await;
        match answered {
            Ok(Ok(answer)) if answer.alive => Ok(()),
            Ok(Ok(_)) => {
                self.keepalive = None;
                bail!("session {} is gone", self.session.id())
            }
            Ok(Err(error)) => {
                self.keepalive = None;
                Err(error)
            }
            Err(_) => {
                self.keepalive = None;
                bail!("keepalive not answered in {KEEPALIVE_ANSWER_TIMEOUT_MS} ms")
            }
        }
    }

    /// One `CloseSession` of a session that was closed before, sent to the leader:
    /// done when the cluster answers that the session does not exist.
    pub async fn close_a_gone_session(&mut self) -> anyhow::Result<()> {
        if self.refused.is_none() {
            let client = client(&self.endpoints)?;
            let gone = client.session(Duration::from_secs(60)).await.context("create the session to close")?;
            let (gone_session, gone_secret) = (gone.id(), gone.secret());
            gone.close().await.context("close the session")?;
            let leader = leader_index(&self.endpoints).await?.context("no node says it leads")?;
            let channel = client.raw_channel(&self.endpoints[leader])?;
            let leader = pb::leasehold_client::LeaseholdClient::new(channel);
            self.refused = Some(Refused { leader, gone_session, gone_secret, sequence: 0 });
        }
        let refused = self.refused.as_mut().expect("made above");
        refused.sequence += 1;
        let request = pb::CloseSessionRequest {
            // A request id of its own per worker and attempt: each close is a new mistake.
            request_id: Some(pb::RequestId { client_id: refused.gone_session, sequence: refused.sequence }),
            session_id: refused.gone_session,
            session_secret: refused.gone_secret.clone(),
        };
        match refused.leader.close_session(request).await {
            Ok(_) => bail!("session {} was closed twice", refused.gone_session),
            Err(status) if leasehold::proto::errors::error_reason(&status) == Some(pb::ErrorReason::UnknownSession) => {
                Ok(())
            }
            Err(status) => {
                // A leader change: find the leader again on the next operation.
                self.refused = None;
                Err(status.into())
            }
        }
    }

    async fn open_keepalive_stream(&self) -> anyhow::Result<KeepAliveStream> {
        let leader = leader_index(&self.endpoints).await?.context("no node says it leads")?;
        // A connection of its own, like the keepalive task of a client process.
        let channel = client(&self.endpoints)?.raw_channel(&self.endpoints[leader])?;
        let (requests, outgoing) = mpsc::channel(1);
        let answers = pb::leasehold_client::LeaseholdClient::new(channel)
            .keep_alive(tokio_stream::wrappers::ReceiverStream::new(outgoing))
            .await?
            .into_inner();
        Ok(KeepAliveStream { requests, answers })
    }

    pub async fn close(self) {
        let _ = self.session.close().await;
    }
}

/// The index in `endpoints` of the node that says it leads.
pub async fn leader_index(endpoints: &[String]) -> anyhow::Result<Option<usize>> {
    let client = client(endpoints)?;
    let mut best: Option<(u64, usize)> = None;
    for (index, endpoint) in endpoints.iter().enumerate() {
        let status = tokio::time::timeout(Duration::from_millis(CONNECT_TIMEOUT_MS), client.status_of(endpoint)).await;
        if let Ok(Ok(status)) = status {
            if status.state == "leader" && best.is_none_or(|(term, _)| status.term > term) {
                best = Some((status.term, index));
            }
        }
    }
    Ok(best.map(|(_, index)| index))
}
