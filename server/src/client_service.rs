//! The `Leasehold` gRPC service: sessions, locks and fences for clients.

use std::pin::Pin;
use std::sync::Arc;

use futures::{FutureExt, Stream, StreamExt};
use leasehold_proto as pb;
use leasehold_proto::leasehold_server::Leasehold;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::convert;
use crate::replica::Replica;
use crate::state_machine::{
    AcquireOutcome, Command, FenceStatus, ResourceKind, Response as Applied, SessionId, StateMachine,
};
use crate::waiting::{self, WaitEnd};

/// Keepalive answers buffered per stream before the stream pushes back.
pub const KEEPALIVE_REPLIES_QUEUED_MAX: usize = 1_024;
/// Keepalives answered by one leadership confirmation at most.
pub const KEEPALIVES_PER_ROUND_MAX: usize = 1_024;

pub struct LeaseholdService {
    pub replica: Arc<Replica>,
}

fn unexpected(response: Applied) -> Status {
    Status::internal(format!("unexpected answer from the state machine: {response:?}"))
}

fn granted(token: u64) -> Response<pb::AcquireResponse> {
    Response::new(pb::AcquireResponse { outcome: Some(pb::acquire_response::Outcome::Granted(pb::Granted { token })) })
}

fn not_acquired(machine: &StateMachine, name: &str, timed_out: bool) -> pb::AcquireResponse {
    let holder = machine.describe_lock(name).map(|lock| lock.holder);
    let not_acquired = match holder {
        Some(holder) => pb::NotAcquired {
            holder_session_id: holder.session,
            holder_client_name: holder.client_name,
            holder_token: holder.token,
            timed_out,
        },
        None => pb::NotAcquired { timed_out, ..Default::default() },
    };
    pb::AcquireResponse { outcome: Some(pb::acquire_response::Outcome::NotAcquired(not_acquired)) }
}

fn held(list: Vec<crate::state_machine::HeldLock>) -> Vec<pb::HeldLock> {
    list.into_iter().map(|held| pb::HeldLock { name: held.name, token: held.token }).collect()
}

fn session_info(machine: &StateMachine, session: SessionId) -> Option<pb::SessionInfo> {
    let view = machine.describe_session(session)?;
    Some(pb::SessionInfo {
        session_id: view.id,
        ttl_ms: view.ttl_ms,
        client_name: view.client_name,
        held: held(view.held),
        waiting: view.waiting,
        permits: held(view.permits),
        waiting_semaphores: view.waiting_semaphores,
        leading: held(view.leading),
        campaigning: view.campaigning,
    })
}

type KeepAliveStream = Pin<Box<dyn Stream<Item = Result<pb::KeepAliveResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Leasehold for LeaseholdService {
    async fn create_session(
        &self,
        request: Request<pb::CreateSessionRequest>,
    ) -> Result<Response<pb::CreateSessionResponse>, Status> {
        let command = convert::create_session(request.into_inner())?;
        match self.replica.propose(command).await? {
            Applied::SessionCreated { session, ttl_ms } => {
                Ok(Response::new(pb::CreateSessionResponse { session_id: session, ttl_ms }))
            }
            Applied::Rejected(error) => Err(convert::command_error(error)),
            other => Err(unexpected(other)),
        }
    }

    type KeepAliveStream = KeepAliveStream;

    async fn keep_alive(
        &self,
        request: Request<Streaming<pb::KeepAliveRequest>>,
    ) -> Result<Response<Self::KeepAliveStream>, Status> {
        if !self.replica.is_leader() {
            return Err(self.replica.leader_hint());
        }
        let mut incoming = request.into_inner();
        let (replies, outgoing) = mpsc::channel(KEEPALIVE_REPLIES_QUEUED_MAX);
        let replica = self.replica.clone();
        tokio::spawn(async move {
            while let Some(first) = incoming.next().await {
                let mut batch = vec![first];
                while batch.len() < KEEPALIVES_PER_ROUND_MAX {
                    match incoming.next().now_or_never() {
                        Some(Some(more)) => batch.push(more),
                        _ => break,
                    }
                }
                // One leadership confirmation answers the whole batch; a keepalive
                // is acknowledged only by a node that is still the leader.
                if let Err(status) = replica.confirm_leadership().await {
                    let _ = replies.send(Err(status)).await;
                    return;
                }
                for keepalive in batch {
                    let reply = match keepalive {
                        Ok(keepalive) => {
                            let remaining = replica.shared.leases.renew(keepalive.session_id);
                            Ok(pb::KeepAliveResponse {
                                session_id: keepalive.session_id,
                                ttl_ms: remaining.unwrap_or(0),
                                alive: remaining.is_some(),
                            })
                        }
                        Err(status) => Err(status),
                    };
                    let failed = reply.is_err();
                    if replies.send(reply).await.is_err() || failed {
                        return;
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(outgoing))))
    }

    async fn close_session(
        &self,
        request: Request<pb::CloseSessionRequest>,
    ) -> Result<Response<pb::CloseSessionResponse>, Status> {
        let command = convert::close_session(request.into_inner())?;
        match self.replica.propose(command).await? {
            Applied::SessionClosed => Ok(Response::new(pb::CloseSessionResponse {})),
            Applied::Rejected(error) => Err(convert::command_error(error)),
            other => Err(unexpected(other)),
        }
    }

    async fn describe_session(
        &self,
        request: Request<pb::DescribeSessionRequest>,
    ) -> Result<Response<pb::DescribeSessionResponse>, Status> {
        let request = request.into_inner();
        let session = convert::session_id(request.session_id)?;
        match self.replica.read(request.stale, |machine| session_info(machine, session)).await? {
            Some(info) => Ok(Response::new(pb::DescribeSessionResponse { session: Some(info) })),
            None => {
                Err(Status::not_found(format!("unknown session {session}: it never existed, expired or was closed")))
            }
        }
    }

    async fn list_sessions(
        &self,
        request: Request<pb::ListSessionsRequest>,
    ) -> Result<Response<pb::ListSessionsResponse>, Status> {
        let stale = request.into_inner().stale;
        let sessions = self
            .replica
            .read(stale, |machine| {
                let ids: Vec<SessionId> = machine.sessions().map(|session| session.id()).collect();
                ids.into_iter().filter_map(|id| session_info(machine, id)).collect()
            })
            .await?;
        Ok(Response::new(pb::ListSessionsResponse { sessions }))
    }

    async fn acquire(&self, request: Request<pb::AcquireRequest>) -> Result<Response<pb::AcquireResponse>, Status> {
        let started_ms = self.replica.clock.now_ms();
        let (command, wait_ms) = convert::acquire(request.into_inner())?;
        let Command::Acquire { request, session, ref name, .. } = command else { unreachable!("convert::acquire") };
        let name = name.clone();
        match self.replica.propose(command).await? {
            Applied::Acquire(AcquireOutcome::Granted { token }) => Ok(granted(token)),
            Applied::Acquire(AcquireOutcome::Busy { .. }) => {
                self.replica.read(true, |machine| Response::new(not_acquired(machine, &name, false))).await
            }
            Applied::Acquire(AcquireOutcome::TimedOut) => {
                self.replica.read(true, |machine| Response::new(not_acquired(machine, &name, true))).await
            }
            Applied::Acquire(AcquireOutcome::Queued { .. }) => {
                match waiting::wait_for_grant(
                    &self.replica,
                    ResourceKind::Lock,
                    request,
                    session,
                    &name,
                    wait_ms,
                    started_ms,
                )
                .await?
                {
                    WaitEnd::Granted(token) => Ok(granted(token)),
                    WaitEnd::TimedOut => {
                        self.replica.read(true, |machine| Response::new(not_acquired(machine, &name, true))).await
                    }
                }
            }
            Applied::Rejected(error) => Err(convert::command_error(error)),
            other => Err(unexpected(other)),
        }
    }

    async fn release(&self, request: Request<pb::ReleaseRequest>) -> Result<Response<pb::ReleaseResponse>, Status> {
        let command = convert::release(request.into_inner())?;
        match self.replica.propose(command).await? {
            Applied::Released { .. } => Ok(Response::new(pb::ReleaseResponse {})),
            Applied::Rejected(error) => Err(convert::command_error(error)),
            other => Err(unexpected(other)),
        }
    }

    async fn check_fence(
        &self,
        request: Request<pb::CheckFenceRequest>,
    ) -> Result<Response<pb::CheckFenceResponse>, Status> {
        let request = request.into_inner();
        let name = convert::lock_name(&request.name)?;
        let (status, current_token) = self
            .replica
            .read(false, |machine| {
                let current = machine.describe_lock(&name).map(|lock| lock.holder.token);
                (machine.check_fence(&name, request.token), current.unwrap_or(0))
            })
            .await?;
        Ok(Response::new(pb::CheckFenceResponse { current: status == FenceStatus::Current, current_token }))
    }

    async fn describe_lock(
        &self,
        request: Request<pb::DescribeLockRequest>,
    ) -> Result<Response<pb::DescribeLockResponse>, Status> {
        let request = request.into_inner();
        let name = convert::lock_name(&request.name)?;
        let view = self.replica.read(request.stale, |machine| machine.describe_lock(&name)).await?;
        let Some(view) = view else {
            return Ok(Response::new(pb::DescribeLockResponse::default()));
        };
        Ok(Response::new(pb::DescribeLockResponse {
            holder: Some(pb::LockHolder {
                session_id: view.holder.session,
                client_name: view.holder.client_name,
                token: view.holder.token,
                since_unix_ms: view.holder.since_ms,
            }),
            waiters: view
                .waiters
                .into_iter()
                .map(|waiter| pb::LockWaiter { session_id: waiter.session, client_name: waiter.client_name })
                .collect(),
        }))
    }
}
