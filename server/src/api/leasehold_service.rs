//! The `Leasehold` gRPC service: sessions, locks and fences for clients.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;

use futures::{FutureExt, Stream, StreamExt};
use leasehold_proto as pb;
use leasehold_proto::errors::{error_status, METADATA_SESSION_ID};
use leasehold_proto::leasehold_server::Leasehold;
use leasehold_proto::ErrorReason;
use tonic::{Request, Response, Status, Streaming};

use crate::api::auth::{Auth, StreamCredential, Who};
use crate::api::convert;
use crate::api::lock_delay::LockDelayPolicy;
use crate::api::queued_wait::{self, WaitEnd};
use crate::machine::{
    AcquireOutcome, Command, FenceStatus, ResourceKind, Response as MachineResponse, SessionId, StateMachine, TenantId,
};
use crate::raft::replica::Replica;
use crate::shell::credentials::secret_hash;
use crate::shell::session_deadlines::Renewal;

/// Keepalives answered by one leadership confirmation at most.
pub const KEEPALIVES_PER_ROUND_MAX: usize = 1_024;
/// Bytes of a session secret: 128 random bits.
pub const SESSION_SECRET_BYTES: usize = 16;
/// Sessions in one page of `ListSessions` at most (and when the request says 0).
pub const LIST_SESSIONS_PAGE_MAX: usize = 1_000;

pub struct LeaseholdService {
    pub replica: Arc<Replica>,
    pub auth: Arc<Auth>,
    pub lock_delay: Arc<LockDelayPolicy>,
}

fn unexpected(response: MachineResponse) -> Status {
    error_status(ErrorReason::Internal, format!("unexpected answer from the state machine: {response:?}"), &[])
}

fn granted(token: u64) -> Response<pb::AcquireResponse> {
    Response::new(pb::AcquireResponse { outcome: Some(pb::acquire_response::Outcome::Granted(pb::Granted { token })) })
}

/// A try-lock refused because the machine found the lock held: the holder described is
/// the grant the machine decided against (`holder`, `token`), never a later one. Its
/// client name and a held-back grant's end are looked up for that grant; if it has
/// ended since, they are left empty.
fn busy(machine: &StateMachine, tenant: TenantId, name: &str, holder: SessionId, token: u64) -> pb::AcquireResponse {
    let view = machine.describe_lock(tenant, name).map(|lock| lock.holder).filter(|view| view.token == token);
    let (holder_client_name, delay_until_unix_ms) = match view {
        Some(view) => (view.client_name, view.held_back_until_ms.unwrap_or(0)),
        None => (machine.session_of(holder).map(|session| session.client_name().to_owned()).unwrap_or_default(), 0),
    };
    let not_acquired = pb::NotAcquired {
        holder_session_id: holder,
        holder_client_name,
        holder_token: token,
        timed_out: false,
        delay_until_unix_ms,
    };
    pb::AcquireResponse { outcome: Some(pb::acquire_response::Outcome::NotAcquired(not_acquired)) }
}

/// A wait that ran out. The machine's answer names no holder (the wait ended, the
/// session neither holds nor waits), so the holder described is the lock's holder as
/// this node has applied it now.
fn timed_out(machine: &StateMachine, tenant: TenantId, name: &str) -> pb::AcquireResponse {
    let holder = machine.describe_lock(tenant, name).map(|lock| lock.holder);
    let not_acquired = match holder {
        Some(holder) => pb::NotAcquired {
            holder_session_id: holder.session,
            holder_client_name: holder.client_name,
            holder_token: holder.token,
            timed_out: true,
            delay_until_unix_ms: holder.held_back_until_ms.unwrap_or(0),
        },
        None => pb::NotAcquired { timed_out: true, ..Default::default() },
    };
    pb::AcquireResponse { outcome: Some(pb::acquire_response::Outcome::NotAcquired(not_acquired)) }
}

fn held(list: Vec<crate::machine::HeldLock>) -> Vec<pb::HeldLock> {
    list.into_iter().map(|held| pb::HeldLock { name: held.name, token: held.token }).collect()
}

pub fn session_info(machine: &StateMachine, session: SessionId) -> Option<pb::SessionInfo> {
    let view = machine.describe_session(session)?;
    Some(pb::SessionInfo {
        session_id: view.id,
        ttl_ms: view.ttl_ms,
        client_name: view.client_name,
        tenant: machine.tenant_name(view.tenant).to_string(),
        held: held(view.held),
        waiting: view.waiting,
        permits: held(view.permits),
        waiting_semaphores: view.waiting_semaphores,
        leading: held(view.leading),
        campaigning: view.campaigning,
    })
}

type KeepAliveStream = Pin<Box<dyn Stream<Item = Result<pb::KeepAliveResponse, Status>> + Send>>;

/// One keepalive stream's state while its answers are polled.
struct KeepAlives {
    replica: Arc<Replica>,
    auth: Arc<Auth>,
    /// The stream's sender: it keeps alive only its own tenant's sessions, and only
    /// while the credential it opened with is valid.
    credential: StreamCredential,
    tenant: TenantId,
    incoming: Streaming<pb::KeepAliveRequest>,
    /// The keepalives that arrived together, answered by one leadership round.
    batch: Vec<Result<pb::KeepAliveRequest, Status>>,
    answers: VecDeque<Result<pb::KeepAliveResponse, Status>>,
    ended: bool,
}

/// The answers of one keepalive stream, computed as the response is sent: the
/// keepalives that arrived together are answered after one leadership confirmation
/// (a keepalive is acknowledged only by a node that is still the leader). The answers
/// are made in the task that sends the response, with no task or queue of their own,
/// and a client that stops reading stops the reading of its keepalives.
///
/// A keepalive renews its session only if the session is the stream sender's tenant's
/// and the keepalive carries the session's secret; any other is answered `alive =
/// false` and renews nothing, so knowing a session's id is not enough to keep it.
/// The stream ends with UNAUTHENTICATED at the first keepalive after the credential
/// it opened with was revoked (a tenant token rotated, a tenant removed): the sessions
/// it kept then expire as silent ones do.
fn keepalive_answers(
    replica: Arc<Replica>,
    auth: Arc<Auth>,
    credential: StreamCredential,
    incoming: Streaming<pb::KeepAliveRequest>,
) -> KeepAliveStream {
    let tenant = credential.who.tenant();
    let state = KeepAlives {
        replica,
        auth,
        credential,
        tenant,
        incoming,
        batch: Vec::new(),
        answers: VecDeque::new(),
        ended: false,
    };
    Box::pin(futures::stream::unfold(state, |mut state| async move {
        loop {
            if let Some(answer) = state.answers.pop_front() {
                // The stream ends after an error: nothing follows it in `answers`.
                state.ended = answer.is_err();
                return Some((answer, state));
            }
            if state.ended {
                return None;
            }
            let first = state.incoming.next().await?;
            state.batch.push(first);
            while state.batch.len() < KEEPALIVES_PER_ROUND_MAX {
                match state.incoming.next().now_or_never() {
                    Some(Some(more)) => state.batch.push(more),
                    _ => break,
                }
            }
            // The keepalives renew from now, before the leadership round: a leader
            // elected after this moment starts every lease it did not see renewed
            // from its own first moment, which is later.
            let arrived_ms = state.replica.shared.deadlines.clock().now_ms();
            if let Err(status) = state.replica.confirm_and_apply().await {
                state.batch.clear();
                state.answers.push_back(Err(status));
                continue;
            }
            // Checked against every entry committed before the keepalives arrived.
            if let Err(status) = state.auth.still_valid(&mut state.credential) {
                state.batch.clear();
                state.answers.push_back(Err(status));
                continue;
            }
            let mut resume = Vec::new();
            {
                let applied = state.replica.shared.applied.read().unwrap();
                for keepalive in state.batch.drain(..) {
                    let answer = keepalive.map(|keepalive| {
                        let owned = applied.machine.session_of(keepalive.session_id).is_some_and(|session| {
                            session.tenant() == state.tenant
                                && session.has_secret(&secret_hash(&keepalive.session_secret))
                        });
                        let renewal = if owned {
                            state.replica.shared.deadlines.renew(keepalive.session_id, arrived_ms)
                        } else {
                            Renewal::Gone
                        };
                        if renewal == Renewal::Resume {
                            resume.push((state.answers.len(), keepalive.session_id));
                        }
                        keepalive_answer(keepalive.session_id, renewal)
                    });
                    let failed = answer.is_err();
                    state.answers.push_back(answer);
                    if failed {
                        break;
                    }
                }
            }
            state.batch.clear();
            if !resume.is_empty() {
                resume_quiet_sessions(&state.replica, resume, arrived_ms, &mut state.answers).await;
            }
        }
    }))
}

/// The answer to a keepalive that was renewed (or not).
fn keepalive_answer(session_id: u64, renewal: Renewal) -> pb::KeepAliveResponse {
    match renewal {
        Renewal::Alive { ttl_ms } => pb::KeepAliveResponse { session_id, ttl_ms, alive: true },
        // Replaced after the resume (`resume_quiet_sessions`).
        Renewal::Resume => pb::KeepAliveResponse { session_id, ttl_ms: 0, alive: true },
        Renewal::Gone => pb::KeepAliveResponse { session_id, ttl_ms: 0, alive: false },
    }
}

/// Keepalives of sessions the log holds a checkpoint of (they were quiet), each with
/// the position of its answer: commits one `CheckpointSessions` that resumes them
/// all, then renews them and fills in their answers. Should the proposal fail, each is
/// answered with the time it has left, which is safe, and its next keepalive tries
/// again.
async fn resume_quiet_sessions(
    replica: &Replica,
    sessions: Vec<(usize, u64)>,
    arrived_ms: u64,
    answers: &mut VecDeque<Result<pb::KeepAliveResponse, Status>>,
) {
    let resumed: Vec<u64> = sessions.iter().map(|(_, session)| *session).collect();
    let command = Command::CheckpointSessions { quiet: Vec::new(), resumed };
    let committed = match replica.propose_quietly(command).await {
        Ok(_) => true,
        Err(error) => {
            tracing::warn!(%error, sessions = sessions.len(), "could not resume quiet sessions");
            false
        }
    };
    let deadlines = &replica.shared.deadlines;
    for (position, session_id) in sessions {
        let renewal = if committed { deadlines.renew(session_id, arrived_ms) } else { Renewal::Resume };
        let answer = match renewal {
            Renewal::Resume => match deadlines.unrenewed_ms(session_id) {
                Some(ttl_ms) if ttl_ms > 0 => pb::KeepAliveResponse { session_id, ttl_ms, alive: true },
                _ => pb::KeepAliveResponse { session_id, ttl_ms: 0, alive: false },
            },
            renewal => keepalive_answer(session_id, renewal),
        };
        answers[position] = Ok(answer);
    }
}

impl LeaseholdService {
    fn who<T>(&self, rpc: &str, request: &Request<T>) -> Result<Who, Status> {
        self.auth.who(rpc, request)
    }
}

#[tonic::async_trait]
impl Leasehold for LeaseholdService {
    async fn create_session(
        &self,
        request: Request<pb::CreateSessionRequest>,
    ) -> Result<Response<pb::CreateSessionResponse>, Status> {
        let who = self.who("CreateSession", &request)?;
        let command = convert::create_session(request.into_inner())?;
        self.replica.check_budget(who.tenant())?;
        // Made here, per attempt: a retry whose first answer was lost gets a secret of
        // its own, which replaces the first one (see `StateMachine::recalled`).
        let secret: [u8; SESSION_SECRET_BYTES] = self.replica.entropy.bytes();
        match self.replica.propose(who.caller(&secret), command).await? {
            MachineResponse::SessionCreated { session, ttl_ms } => Ok(Response::new(pb::CreateSessionResponse {
                session_id: session,
                ttl_ms,
                session_secret: secret.to_vec(),
            })),
            MachineResponse::Rejected(error) => Err(convert::command_error(error)),
            other => Err(unexpected(other)),
        }
    }

    type KeepAliveStream = KeepAliveStream;

    async fn keep_alive(
        &self,
        request: Request<Streaming<pb::KeepAliveRequest>>,
    ) -> Result<Response<Self::KeepAliveStream>, Status> {
        let credential = self.auth.who_for_stream("KeepAlive", &request)?;
        if !self.replica.is_leader() {
            return Err(self.replica.leader_hint());
        }
        let answers = keepalive_answers(self.replica.clone(), self.auth.clone(), credential, request.into_inner());
        Ok(Response::new(answers))
    }

    async fn close_session(
        &self,
        request: Request<pb::CloseSessionRequest>,
    ) -> Result<Response<pb::CloseSessionResponse>, Status> {
        let who = self.who("CloseSession", &request)?;
        let request = request.into_inner();
        let caller = who.caller(&request.session_secret);
        let command = convert::close_session(request)?;
        match self.replica.propose(caller, command).await? {
            MachineResponse::SessionClosed => Ok(Response::new(pb::CloseSessionResponse {})),
            MachineResponse::Rejected(error) => Err(convert::command_error(error)),
            other => Err(unexpected(other)),
        }
    }

    async fn describe_session(
        &self,
        request: Request<pb::DescribeSessionRequest>,
    ) -> Result<Response<pb::DescribeSessionResponse>, Status> {
        let who = self.who("DescribeSession", &request)?;
        let request = request.into_inner();
        let session = convert::session_id(request.session_id)?;
        let found = self
            .replica
            .read(request.stale, |machine| {
                let tenant = machine.session_of(session)?.tenant();
                Some((tenant, session_info(machine, session)?))
            })
            .await?;
        match found {
            Some((tenant, info)) if tenant == who.tenant() || who == Who::Admin => {
                Ok(Response::new(pb::DescribeSessionResponse { session: Some(info) }))
            }
            // Another tenant's session is answered as one that does not exist, word for
            // word, so that a session id tells a tenant nothing of others.
            Some(_) | None => Err(error_status(
                ErrorReason::UnknownSession,
                format!("unknown session {session}: it never existed, expired or was closed"),
                &[(METADATA_SESSION_ID, session.to_string())],
            )),
        }
    }

    async fn list_sessions(
        &self,
        request: Request<pb::ListSessionsRequest>,
    ) -> Result<Response<pb::ListSessionsResponse>, Status> {
        let who = self.who("ListSessions", &request)?;
        let request = request.into_inner();
        // A tenant lists its own sessions; the admin every tenant's, or one tenant's.
        let only: Option<TenantId> = match (&who, request.tenant.as_str()) {
            (Who::Admin, "") => None,
            (_, requested) => Some(self.auth.namespace(&who, requested)?),
        };
        let page_size = match request.page_size as usize {
            0 => LIST_SESSIONS_PAGE_MAX,
            size if size <= LIST_SESSIONS_PAGE_MAX => size,
            size => {
                return Err(convert::invalid_argument(format!(
                    "page_size {size} is above the limit of {LIST_SESSIONS_PAGE_MAX} (LIST_SESSIONS_PAGE_MAX)"
                )))
            }
        };
        let start = request.page_token;
        let (sessions, next_page_token) = self
            .replica
            .read(request.stale, |machine| {
                // A tenant's page walks its own sessions only (an index by tenant).
                let sessions: Box<dyn Iterator<Item = &crate::machine::Session>> = match only {
                    Some(tenant) => Box::new(machine.tenant_sessions_from(tenant, start)),
                    None => Box::new(machine.sessions_from(start)),
                };
                let mut ids = sessions.map(|session| session.id());
                let page: Vec<SessionId> = ids.by_ref().take(page_size).collect();
                let next = ids.next().unwrap_or(0);
                (page.into_iter().filter_map(|id| session_info(machine, id)).collect(), next)
            })
            .await?;
        Ok(Response::new(pb::ListSessionsResponse { sessions, next_page_token }))
    }

    async fn acquire(&self, request: Request<pb::AcquireRequest>) -> Result<Response<pb::AcquireResponse>, Status> {
        let who = self.who("Acquire", &request)?;
        let started_ms = self.replica.clock.now_ms();
        let request = request.into_inner();
        let caller = who.caller(&request.session_secret);
        let (command, waiting) = convert::acquire(request, |name| self.lock_delay.delay_ms(None, name))?;
        if command.level() > 0 {
            self.lock_delay.admit(&self.replica).await?;
        }
        let tenant = who.tenant();
        let name = waiting.name.as_str();
        self.replica.check_budget(who.tenant())?;
        match self.replica.propose(caller, command).await? {
            MachineResponse::Acquire(AcquireOutcome::Granted { token }) => Ok(granted(token)),
            MachineResponse::Acquire(AcquireOutcome::Busy { holder, token }) => {
                self.replica.read(true, |machine| Response::new(busy(machine, tenant, name, holder, token))).await
            }
            MachineResponse::Acquire(AcquireOutcome::TimedOut) => {
                self.replica.read(true, |machine| Response::new(timed_out(machine, tenant, name))).await
            }
            MachineResponse::Acquire(AcquireOutcome::Queued { .. }) => {
                match queued_wait::wait_for_grant(&self.replica, caller, ResourceKind::Lock, &waiting, started_ms)
                    .await?
                {
                    WaitEnd::Granted(token) => Ok(granted(token)),
                    WaitEnd::TimedOut => {
                        self.replica.read(true, |machine| Response::new(timed_out(machine, tenant, name))).await
                    }
                }
            }
            MachineResponse::Rejected(error) => Err(convert::command_error(error)),
            other => Err(unexpected(other)),
        }
    }

    async fn release(&self, request: Request<pb::ReleaseRequest>) -> Result<Response<pb::ReleaseResponse>, Status> {
        let who = self.who("Release", &request)?;
        let request = request.into_inner();
        let caller = who.caller(&request.session_secret);
        let command = convert::release(request)?;
        match self.replica.propose(caller, command).await? {
            MachineResponse::Released { .. } => Ok(Response::new(pb::ReleaseResponse {})),
            MachineResponse::Rejected(error) => Err(convert::command_error(error)),
            other => Err(unexpected(other)),
        }
    }

    async fn check_fence(
        &self,
        request: Request<pb::CheckFenceRequest>,
    ) -> Result<Response<pb::CheckFenceResponse>, Status> {
        let who = self.who("CheckFence", &request)?;
        let request = request.into_inner();
        let tenant = self.auth.namespace(&who, &request.tenant)?;
        let name = convert::resource_name(ResourceKind::Lock, &request.name)?;
        let (status, current_token) = self
            .replica
            .read(false, |machine| {
                let current = machine.describe_lock(tenant, &name).map(|lock| lock.holder.token);
                (machine.check_fence(tenant, &name, request.token), current.unwrap_or(0))
            })
            .await?;
        Ok(Response::new(pb::CheckFenceResponse { current: status == FenceStatus::Current, current_token }))
    }

    async fn describe_lock(
        &self,
        request: Request<pb::DescribeLockRequest>,
    ) -> Result<Response<pb::DescribeLockResponse>, Status> {
        let who = self.who("DescribeLock", &request)?;
        let request = request.into_inner();
        let tenant = self.auth.namespace(&who, &request.tenant)?;
        let name = convert::resource_name(ResourceKind::Lock, &request.name)?;
        let view = self.replica.read(request.stale, |machine| machine.describe_lock(tenant, &name)).await?;
        let Some(view) = view else {
            return Ok(Response::new(pb::DescribeLockResponse::default()));
        };
        Ok(Response::new(pb::DescribeLockResponse {
            holder: Some(pb::LockHolder {
                session_id: view.holder.session,
                client_name: view.holder.client_name,
                token: view.holder.token,
                since_unix_ms: view.holder.since_ms,
                lock_delay_ms: view.holder.lock_delay_ms,
                delay_until_unix_ms: view.holder.held_back_until_ms.unwrap_or(0),
            }),
            waiters: view
                .waiters
                .into_iter()
                .map(|waiter| pb::LockWaiter { session_id: waiter.session, client_name: waiter.client_name })
                .collect(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::{RequestId, ADMIN_TENANT};

    /// A machine applying commands one entry each, as the cluster's own caller (the
    /// admin's namespace).
    struct Applied {
        machine: StateMachine,
        index: u64,
    }

    impl Applied {
        fn new() -> Self {
            let mut machine = StateMachine::new();
            machine.apply_empty(0);
            Applied { machine, index: 0 }
        }

        fn apply(&mut self, command: Command) -> MachineResponse {
            self.index += 1;
            self.machine.apply(self.index, 1_700_000_000_000 + self.index, &command).0
        }

        fn request(&self) -> RequestId {
            RequestId { client_id: 7, sequence: self.index + 1 }
        }

        fn create(&mut self, client_name: &str) -> SessionId {
            let command =
                Command::CreateSession { request: self.request(), ttl_ms: 10_000, client_name: client_name.into() };
            match self.apply(command) {
                MachineResponse::SessionCreated { session, .. } => session,
                other => panic!("expected a session, got {other:?}"),
            }
        }
    }

    fn holder_of(answer: &pb::AcquireResponse) -> (u64, &str, u64) {
        match &answer.outcome {
            Some(pb::acquire_response::Outcome::NotAcquired(not)) => {
                (not.holder_session_id, not.holder_client_name.as_str(), not.holder_token)
            }
            other => panic!("expected not acquired, got {other:?}"),
        }
    }

    #[test]
    fn a_busy_answer_describes_the_grant_the_machine_found_not_a_later_holder() {
        let mut applied = Applied::new();
        let first = applied.create("first");
        let second = applied.create("second");
        let acquire = Command::Acquire { request: applied.request(), session: first, name: "x".into(), wait: false };
        let MachineResponse::Acquire(AcquireOutcome::Granted { token: found }) = applied.apply(acquire) else {
            panic!("the free lock is granted")
        };
        // The machine refused someone against (first, found); the lock then changes
        // hands before the answer is built.
        let release = Command::Release { request: applied.request(), session: first, name: "x".into(), token: found };
        applied.apply(release);
        let acquire = Command::Acquire { request: applied.request(), session: second, name: "x".into(), wait: false };
        let MachineResponse::Acquire(AcquireOutcome::Granted { token: later }) = applied.apply(acquire) else {
            panic!("the released lock is granted")
        };
        assert!(later > found);
        let answer = busy(&applied.machine, ADMIN_TENANT, "x", first, found);
        assert_eq!(holder_of(&answer), (first, "first", found), "the grant the machine decided against");
        let answer = busy(&applied.machine, ADMIN_TENANT, "x", second, later);
        assert_eq!(holder_of(&answer), (second, "second", later));
        // The first holder's session gone: its name is not made up from the lock.
        applied.apply(Command::CloseSession { request: applied.request(), session: first });
        let answer = busy(&applied.machine, ADMIN_TENANT, "x", first, found);
        assert_eq!(holder_of(&answer), (first, "", found));
    }
}
