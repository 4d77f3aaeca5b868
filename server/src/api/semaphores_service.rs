//! The `Semaphores` gRPC service: at most K holders per name, K enforced by the
//! replicated state machine.

use std::sync::Arc;
use std::time::Duration;

use leasehold_proto as pb;
use leasehold_proto::errors::error_status;
use leasehold_proto::semaphores_server::Semaphores;
use leasehold_proto::ErrorReason;
use tonic::{Request, Response, Status};

use crate::api::auth::{audit, Auth};
use crate::api::convert;
use crate::api::lock_delay::LockDelayPolicy;
use crate::api::queued_wait::{self, WaitEnd};
use crate::machine::{AcquireOutcome, ResourceKind, Response as MachineResponse, StateMachine, TenantId};
use crate::raft::replica::Replica;

pub struct SemaphoresService {
    pub replica: Arc<Replica>,
    pub auth: Arc<Auth>,
    pub lock_delay: Arc<LockDelayPolicy>,
}

fn granted(token: u64) -> Response<pb::SemAcquireResponse> {
    Response::new(pb::SemAcquireResponse {
        outcome: Some(pb::sem_acquire_response::Outcome::Granted(pb::Granted { token })),
    })
}

/// A semaphore acquire that got no permit. The answer carries the semaphore's holder
/// count and limit, which the machine's refusal does not (it names its first holder):
/// they are the counts as this node has applied them now.
fn full(machine: &StateMachine, tenant: TenantId, name: &str, timed_out: bool) -> Response<pb::SemAcquireResponse> {
    let (holders, limit) = machine
        .describe_semaphore(tenant, name)
        .map(|semaphore| (semaphore.holders.len() as u32, semaphore.limit))
        .unwrap_or((0, 0));
    let not_acquired = pb::SemNotAcquired { holders, limit, timed_out };
    Response::new(pb::SemAcquireResponse {
        outcome: Some(pb::sem_acquire_response::Outcome::NotAcquired(not_acquired)),
    })
}

fn unexpected(response: MachineResponse) -> Status {
    error_status(ErrorReason::Internal, format!("unexpected answer from the state machine: {response:?}"), &[])
}

#[tonic::async_trait]
impl Semaphores for SemaphoresService {
    async fn acquire(
        &self,
        request: Request<pb::SemAcquireRequest>,
    ) -> Result<Response<pb::SemAcquireResponse>, Status> {
        let who = self.auth.who("Semaphores.Acquire", &request)?;
        let started_ms = self.replica.clock.now_ms();
        let request = request.into_inner();
        let caller = who.caller(&request.session_secret);
        let (command, waiting) = convert::sem_acquire(request, |name| self.lock_delay.delay_ms(None, name))?;
        if command.level() > 0 {
            self.lock_delay.admit(&self.replica).await?;
        }
        let tenant = who.tenant();
        let name = waiting.name.as_str();
        let record_wait = |replica: &Replica| {
            let waited = replica.clock.now_ms().saturating_sub(started_ms);
            replica.shared.semaphore_waits.record(who.name(), name, Duration::from_millis(waited));
        };
        self.replica.check_budget(who.tenant())?;
        match self.replica.propose(caller, command).await? {
            MachineResponse::SemAcquire(AcquireOutcome::Granted { token }) => {
                record_wait(&self.replica);
                Ok(granted(token))
            }
            MachineResponse::SemAcquire(AcquireOutcome::Busy { .. }) => {
                self.replica.read(true, |machine| full(machine, tenant, name, false)).await
            }
            MachineResponse::SemAcquire(AcquireOutcome::TimedOut) => {
                self.replica.read(true, |machine| full(machine, tenant, name, true)).await
            }
            MachineResponse::SemAcquire(AcquireOutcome::Queued { .. }) => {
                match queued_wait::wait_for_grant(&self.replica, caller, ResourceKind::Semaphore, &waiting, started_ms)
                    .await?
                {
                    WaitEnd::Granted(token) => {
                        record_wait(&self.replica);
                        Ok(granted(token))
                    }
                    WaitEnd::TimedOut => self.replica.read(true, |machine| full(machine, tenant, name, true)).await,
                }
            }
            MachineResponse::Rejected(error) => Err(convert::command_error(error)),
            other => Err(unexpected(other)),
        }
    }

    async fn release(
        &self,
        request: Request<pb::SemReleaseRequest>,
    ) -> Result<Response<pb::SemReleaseResponse>, Status> {
        let who = self.auth.who("Semaphores.Release", &request)?;
        let request = request.into_inner();
        let caller = who.caller(&request.session_secret);
        match self.replica.propose(caller, convert::sem_release(request)?).await? {
            MachineResponse::SemReleased { .. } => Ok(Response::new(pb::SemReleaseResponse {})),
            MachineResponse::Rejected(error) => Err(convert::command_error(error)),
            other => Err(unexpected(other)),
        }
    }

    async fn set_limit(
        &self,
        request: Request<pb::SemSetLimitRequest>,
    ) -> Result<Response<pb::SemSetLimitResponse>, Status> {
        let who = self.auth.who("Semaphores.SetLimit", &request)?;
        let request = request.into_inner();
        let tenant = if request.tenant.is_empty() || request.tenant == who.name() {
            None
        } else {
            who.require_admin(&format!("change tenant {:?}'s semaphore {:?}", request.tenant, request.name))?;
            let tenant = self.auth.namespace(&who, &request.tenant)?;
            audit(
                "Semaphores.SetLimit",
                &who,
                &format!("tenant {:?}'s semaphore {:?}: limit {}", request.tenant, request.name, request.limit),
            );
            Some(tenant)
        };
        let command = convert::sem_set_limit(&request, tenant)?;
        match self.replica.propose(who.caller(&request.session_secret), command).await? {
            MachineResponse::SemLimitSet { previous, .. } => {
                Ok(Response::new(pb::SemSetLimitResponse { previous_limit: previous }))
            }
            MachineResponse::Rejected(error) => Err(convert::command_error(error)),
            other => Err(unexpected(other)),
        }
    }

    async fn describe(
        &self,
        request: Request<pb::DescribeSemaphoreRequest>,
    ) -> Result<Response<pb::DescribeSemaphoreResponse>, Status> {
        let who = self.auth.who("Semaphores.Describe", &request)?;
        let request = request.into_inner();
        let tenant = self.auth.namespace(&who, &request.tenant)?;
        let name = convert::resource_name(ResourceKind::Semaphore, &request.name)?;
        let view = self.replica.read(request.stale, |machine| machine.describe_semaphore(tenant, &name)).await?;
        let Some(view) = view else {
            return Ok(Response::new(pb::DescribeSemaphoreResponse::default()));
        };
        Ok(Response::new(pb::DescribeSemaphoreResponse {
            limit: view.limit,
            holders: view
                .holders
                .into_iter()
                .map(|holder| pb::SemaphoreHolder {
                    session_id: holder.session,
                    client_name: holder.client_name,
                    token: holder.token,
                    since_unix_ms: holder.since_ms,
                    lock_delay_ms: holder.lock_delay_ms,
                    delay_until_unix_ms: holder.held_back_until_ms.unwrap_or(0),
                })
                .collect(),
            waiters: view
                .waiters
                .into_iter()
                .map(|waiter| pb::LockWaiter { session_id: waiter.session, client_name: waiter.client_name })
                .collect(),
        }))
    }
}
