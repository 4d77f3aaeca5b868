//! The `Elections` gRPC service: campaigns, proclamations, resignations, and a stream
//! of every change of an election in commit order, vacancies included.

use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use leasehold_proto as pb;
use leasehold_proto::elections_server::Elections;
use leasehold_proto::errors::error_status;
use leasehold_proto::ErrorReason;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use crate::api::auth::Auth;
use crate::api::convert;
use crate::api::queued_wait::{self, WaitEnd};
use crate::machine::{
    AcquireOutcome, LeaderView, ResourceKind, Response as MachineResponse, SessionId, StateMachine, TenantId, Token,
};
use crate::raft::replica::Replica;
use crate::shell::observers::{Full, OBSERVERS_MAX, OBSERVERS_PER_TENANT_MAX};

/// Changes buffered per `Observe` stream before the stream is dropped (its client
/// reconnects and reads the current state).
pub const OBSERVE_REPLIES_QUEUED_MAX: usize = 256;

pub struct ElectionsService {
    pub replica: Arc<Replica>,
    pub auth: Arc<Auth>,
}

fn leader_info(leader: LeaderView) -> pb::LeaderInfo {
    pb::LeaderInfo {
        session_id: leader.session,
        client_name: leader.client_name,
        token: leader.token,
        value: leader.value,
        since_unix_ms: leader.since_ms,
    }
}

fn current_leader(machine: &StateMachine, tenant: TenantId, name: &str) -> Option<LeaderView> {
    machine.leader_view(tenant, name)
}

fn elected(token: u64) -> Response<pb::CampaignResponse> {
    Response::new(pb::CampaignResponse {
        outcome: Some(pb::campaign_response::Outcome::Elected(pb::Granted { token })),
    })
}

/// A campaign that did not win. `busy` is the leader the machine found (its session and
/// token): the answer describes that leadership, never a later one, and leaves its
/// value and start empty if it has ended since. Without it (a wait that ran out) the
/// answer describes the leader as this node has applied it now.
fn not_elected(
    machine: &StateMachine,
    tenant: TenantId,
    name: &str,
    busy: Option<(SessionId, Token)>,
) -> Response<pb::CampaignResponse> {
    let current = current_leader(machine, tenant, name);
    let leader = match busy {
        None => current.map(leader_info).unwrap_or_default(),
        Some((session, token)) => match current.filter(|leader| leader.token == token) {
            Some(leader) => leader_info(leader),
            None => pb::LeaderInfo {
                session_id: session,
                client_name: machine.session_of(session).map(|held| held.client_name().to_owned()).unwrap_or_default(),
                token,
                ..Default::default()
            },
        },
    };
    Response::new(pb::CampaignResponse { outcome: Some(pb::campaign_response::Outcome::NotElected(leader)) })
}

fn unexpected(response: MachineResponse) -> Status {
    error_status(ErrorReason::Internal, format!("unexpected answer from the state machine: {response:?}"), &[])
}

type ObserveStream = Pin<Box<dyn Stream<Item = Result<pb::ObserveResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Elections for ElectionsService {
    async fn campaign(&self, request: Request<pb::CampaignRequest>) -> Result<Response<pb::CampaignResponse>, Status> {
        let who = self.auth.who("Elections.Campaign", &request)?;
        let started_ms = self.replica.clock.now_ms();
        let request = request.into_inner();
        let caller = who.caller(&request.session_secret);
        let (command, waiting) = convert::campaign(request)?;
        let tenant = who.tenant();
        let name = waiting.name.as_str();
        self.replica.check_budget(who.tenant())?;
        match self.replica.propose(caller, command).await? {
            MachineResponse::Campaign(AcquireOutcome::Granted { token }) => Ok(elected(token)),
            MachineResponse::Campaign(AcquireOutcome::Busy { holder, token }) => {
                self.replica.read(true, |machine| not_elected(machine, tenant, name, Some((holder, token)))).await
            }
            MachineResponse::Campaign(AcquireOutcome::TimedOut) => {
                self.replica.read(true, |machine| not_elected(machine, tenant, name, None)).await
            }
            MachineResponse::Campaign(AcquireOutcome::Queued { .. }) => {
                match queued_wait::wait_for_grant(&self.replica, caller, ResourceKind::Election, &waiting, started_ms)
                    .await?
                {
                    WaitEnd::Granted(token) => Ok(elected(token)),
                    WaitEnd::TimedOut => {
                        self.replica.read(true, |machine| not_elected(machine, tenant, name, None)).await
                    }
                }
            }
            MachineResponse::Rejected(error) => Err(convert::command_error(error)),
            other => Err(unexpected(other)),
        }
    }

    async fn proclaim(&self, request: Request<pb::ProclaimRequest>) -> Result<Response<pb::ProclaimResponse>, Status> {
        let who = self.auth.who("Elections.Proclaim", &request)?;
        let request = request.into_inner();
        let caller = who.caller(&request.session_secret);
        match self.replica.propose(caller, convert::proclaim(request)?).await? {
            MachineResponse::Proclaimed { .. } => Ok(Response::new(pb::ProclaimResponse {})),
            MachineResponse::Rejected(error) => Err(convert::command_error(error)),
            other => Err(unexpected(other)),
        }
    }

    async fn resign(&self, request: Request<pb::ResignRequest>) -> Result<Response<pb::ResignResponse>, Status> {
        let who = self.auth.who("Elections.Resign", &request)?;
        let request = request.into_inner();
        let caller = who.caller(&request.session_secret);
        match self.replica.propose(caller, convert::resign(request)?).await? {
            MachineResponse::Resigned { .. } => Ok(Response::new(pb::ResignResponse {})),
            MachineResponse::Rejected(error) => Err(convert::command_error(error)),
            other => Err(unexpected(other)),
        }
    }

    async fn leader(&self, request: Request<pb::LeaderRequest>) -> Result<Response<pb::LeaderResponse>, Status> {
        let who = self.auth.who("Elections.Leader", &request)?;
        let request = request.into_inner();
        let tenant = self.auth.namespace(&who, &request.tenant)?;
        let name = convert::resource_name(ResourceKind::Election, &request.name)?;
        let leader = self.replica.read(request.stale, |machine| current_leader(machine, tenant, &name)).await?;
        Ok(Response::new(pb::LeaderResponse { leader: leader.map(leader_info) }))
    }

    type ObserveStream = ObserveStream;

    async fn observe(&self, request: Request<pb::ObserveRequest>) -> Result<Response<Self::ObserveStream>, Status> {
        // Subscribed before the credential is read: a revocation in between wakes it.
        let mut credentials_changed = self.replica.shared.credentials.subscribe();
        let mut credential = self.auth.who_for_stream("Elections.Observe", &request)?;
        let request = request.into_inner();
        let tenant = self.auth.namespace(&credential.who, &request.tenant)?;
        let name = convert::resource_name(ResourceKind::Election, &request.name)?;
        // Subscribe first, then read: a change applied in between is in both, and
        // its index tells the stream to skip it.
        let mut subscription = match self.replica.shared.observers.subscribe(tenant, &name) {
            Ok(subscription) => subscription,
            Err(Full::Node) => {
                return Err(error_status(
                    ErrorReason::LimitExceeded,
                    format!("{OBSERVERS_MAX} Observe streams are open on this node (OBSERVERS_MAX)"),
                    &[],
                ))
            }
            Err(Full::Tenant) => {
                return Err(error_status(
                    ErrorReason::LimitExceeded,
                    format!(
                        "{OBSERVERS_PER_TENANT_MAX} Observe streams of this tenant's elections are open on this node \
                         (OBSERVERS_PER_TENANT_MAX)"
                    ),
                    &[],
                ))
            }
        };
        let (initial_index, initial) = self
            .replica
            .read(false, |machine| (machine.last_applied_index(), current_leader(machine, tenant, &name)))
            .await?;
        let (replies, outgoing) = mpsc::channel(OBSERVE_REPLIES_QUEUED_MAX);
        let auth = self.auth.clone();
        tokio::spawn(async move {
            let first = pb::ObserveResponse { leader: initial.map(leader_info), applied_index: initial_index };
            if replies.send(Ok(first)).await.is_err() {
                return;
            }
            // Until the client goes away (even from a quiet election): the subscription
            // then leaves the registry as it is dropped. A credential revoked meanwhile
            // ends the stream as soon as the node applies the revocation.
            loop {
                let change = tokio::select! {
                    _ = replies.closed() => return,
                    changed = credentials_changed.changed() => {
                        if changed.is_err() {
                            return;
                        }
                        if let Err(status) = auth.still_valid(&mut credential) {
                            let _ = replies.send(Err(status)).await;
                            return;
                        }
                        continue;
                    }
                    change = subscription.changes.recv() => change,
                };
                let Some(change) = change else { return };
                if change.index <= initial_index {
                    continue;
                }
                let reply = pb::ObserveResponse { leader: change.leader.map(leader_info), applied_index: change.index };
                if replies.send(Ok(reply)).await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(outgoing))))
    }
}
