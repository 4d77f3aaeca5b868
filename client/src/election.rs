//! Leader elections: one leader per name, with a value (its address, say) and a
//! fencing token; observers see every change in commit order, vacancies included.

use std::pin::Pin;
use std::time::Duration;

use futures::Stream;
use leasehold_proto as pb;
use tokio::sync::{mpsc, watch};

use crate::client::{Client, RetryPause};
use crate::error::{Error, Result};
use crate::session::{Session, SessionKey, SessionState, WaitAnswer};

/// The leader of an election as observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leader {
    pub session_id: u64,
    pub client_name: String,
    pub token: u64,
    pub value: String,
}

impl Leader {
    fn from_pb(info: pb::LeaderInfo) -> Leader {
        Leader { session_id: info.session_id, client_name: info.client_name, token: info.token, value: info.value }
    }
}

/// Leadership won by a campaign. `lost()` resolves when the leadership ends: the
/// session was lost, or an observer saw another leader or a vacancy.
pub struct Leadership {
    session: Session,
    name: String,
    token: u64,
    lost: watch::Receiver<bool>,
    watcher: tokio::task::JoinHandle<()>,
    resigned: bool,
}

impl Session {
    /// Campaigns for `name` with `value` and waits at most `wait` to lead.
    /// `Ok(Err(leader))` names the leader when the wait ran out (None: vacant).
    pub async fn campaign_within(
        &self,
        name: &str,
        value: &str,
        wait: Duration,
    ) -> Result<std::result::Result<Leadership, Option<Leader>>> {
        let session_id = self.id();
        let answer = self
            .wait_request("campaign", wait, |channel, request_id, wait_ms| {
                let request = pb::CampaignRequest {
                    request_id: Some(request_id),
                    session_id,
                    name: name.to_string(),
                    value: value.to_string(),
                    wait_ms,
                    session_secret: self.secret(),
                };
                async move {
                    let response = Client::elections(channel).campaign(request).await?.into_inner();
                    Ok(match response.outcome {
                        Some(pb::campaign_response::Outcome::Elected(granted)) => WaitAnswer::Granted(granted.token),
                        Some(pb::campaign_response::Outcome::NotElected(leader)) => WaitAnswer::NotYet {
                            timed_out: wait_ms > 0,
                            detail: (leader.session_id != 0).then(|| Leader::from_pb(leader)),
                        },
                        None => return Err(tonic::Status::internal("campaign answered with no outcome")),
                    })
                }
            })
            .await?;
        match answer {
            Ok(token) => Ok(Ok(Leadership::watch(self.clone(), name.to_string(), token))),
            Err(leader) => Ok(Err(leader)),
        }
    }

    /// Campaigns until this session leads `name`.
    pub async fn campaign(&self, name: &str, value: &str) -> Result<Leadership> {
        loop {
            if let Ok(leadership) = self.campaign_within(name, value, Duration::from_secs(60)).await? {
                return Ok(leadership);
            }
            if self.state() == SessionState::Lost {
                return Err(Error::SessionLost(self.id()));
            }
        }
    }
}

impl Leadership {
    fn watch(session: Session, name: String, token: u64) -> Leadership {
        let (lost_sender, lost) = watch::channel(false);
        let client = session.client().clone();
        let watched_session = session.clone();
        let watched_name = name.clone();
        let watcher = tokio::spawn(async move {
            let mut changes = client.observe(&watched_name);
            loop {
                tokio::select! {
                    _ = watched_session.lost() => break,
                    change = futures::StreamExt::next(&mut changes) => match change {
                        Some(Ok(Some(leader))) if leader.token == token => continue,
                        Some(Ok(_)) => break,
                        Some(Err(_)) => continue,
                        None => break,
                    },
                }
            }
            lost_sender.send_replace(true);
        });
        Leadership { session, name, token, lost, watcher, resigned: false }
    }

    /// The leadership's fencing token.
    pub fn token(&self) -> u64 {
        self.token
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn session(&self) -> &Session {
        &self.session
    }

    /// Resolves when the leadership ended (session lost, resigned elsewhere, or a
    /// new leader or vacancy observed). Also fires on session jeopardy, which is the
    /// time to stop acting as leader.
    pub async fn lost(&self) {
        let mut lost = self.lost.clone();
        tokio::select! {
            _ = lost.wait_for(|lost| *lost) => {}
            _ = self.session.jeopardy() => {}
        }
    }

    /// Announces a new value; only the current leader (this token) may.
    pub async fn proclaim(&self, value: &str) -> Result<()> {
        let client = self.session.client();
        let request = pb::ProclaimRequest {
            request_id: Some(client.next_request_id()),
            session_id: self.session.id(),
            name: self.name.clone(),
            token: self.token,
            value: value.to_string(),
            session_secret: self.session.secret(),
        };
        client
            .with_leader("proclaim", client.inner.request_deadline, |channel| {
                let request = request.clone();
                async move { Client::elections(channel).proclaim(request).await.map(|_| ()) }
            })
            .await
    }

    /// Gives up the leadership; the next campaigner (FIFO) leads.
    pub async fn resign(mut self) -> Result<()> {
        self.resigned = true;
        resign(self.session.client(), &self.session.key(), &self.name, self.token).await
    }
}

async fn resign(client: &Client, key: &SessionKey, name: &str, token: u64) -> Result<()> {
    let request = pb::ResignRequest {
        request_id: Some(client.next_request_id()),
        session_id: key.id,
        name: name.to_string(),
        token,
        session_secret: key.secret.clone(),
    };
    client
        .with_leader("resign", client.inner.request_deadline, |channel| {
            let request = request.clone();
            async move { Client::elections(channel).resign(request).await.map(|_| ()) }
        })
        .await
}

impl Drop for Leadership {
    fn drop(&mut self) {
        self.watcher.abort();
        if self.resigned {
            return;
        }
        let name = std::mem::take(&mut self.name);
        crate::session::give_back_later(&self.session, name, self.token, |client, key, name, token| async move {
            resign(&client, &key, &name, token).await
        });
    }
}

/// A stream of an election's states: `Some(leader)` or `None` (vacant).
pub type Observation = Pin<Box<dyn Stream<Item = Result<Option<Leader>>> + Send>>;

/// Observed states buffered before the observer must catch up.
pub const OBSERVATIONS_QUEUED_MAX: usize = 256;

impl Client {
    /// The current leader of `name`, or None when vacant (linearizable).
    pub async fn leader(&self, name: &str) -> Result<Option<Leader>> {
        let request = pb::LeaderRequest { name: name.to_string(), stale: false, ..Default::default() };
        let response = self
            .with_leader("leader", self.inner.request_deadline, |channel| {
                let request = request.clone();
                async move { Client::elections(channel).leader(request).await.map(|response| response.into_inner()) }
            })
            .await?;
        Ok(response.leader.map(Leader::from_pb))
    }

    /// Every change of `name`'s leadership in commit order, starting with the current
    /// state. The stream reconnects by itself (to the leader or another node) and
    /// then starts again from the current state, skipping a repeat of the last one
    /// it delivered, so the latest state is never missed.
    pub fn observe(&self, name: &str) -> Observation {
        let (sender, receiver) = mpsc::channel(OBSERVATIONS_QUEUED_MAX);
        let client = self.clone();
        let name = name.to_string();
        tokio::spawn(async move {
            let mut last: Option<Option<Leader>> = None;
            loop {
                let endpoint = client.preferred_endpoint();
                let Ok(channel) = client.channel(&endpoint) else { return };
                match Client::elections(channel)
                    .observe(pb::ObserveRequest { name: name.clone(), ..Default::default() })
                    .await
                {
                    Ok(response) => {
                        let mut stream = response.into_inner();
                        loop {
                            match stream.message().await {
                                Ok(Some(change)) => {
                                    let state = change.leader.map(Leader::from_pb);
                                    if last.as_ref() != Some(&state) {
                                        last = Some(state.clone());
                                        if sender.send(Ok(state)).await.is_err() {
                                            return;
                                        }
                                    }
                                }
                                Ok(None) => break,
                                Err(status) => {
                                    client.follow_hint(&endpoint, &status);
                                    break;
                                }
                            }
                        }
                    }
                    Err(status) => client.follow_hint(&endpoint, &status),
                }
                if sender.is_closed() {
                    return;
                }
                tokio::time::sleep(RetryPause::first()).await;
            }
        });
        Box::pin(tokio_stream::wrappers::ReceiverStream::new(receiver))
    }
}
