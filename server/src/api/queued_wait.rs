//! The server side of a request that waits in a FIFO queue (acquire, semaphore
//! acquire, campaign): wait for the granting entry, and when the wait runs out or the
//! client goes away, take the session out of the queue with a committed cancel.

use std::sync::Arc;
use std::time::Duration;

use leasehold_proto::errors::{error_status, METADATA_SESSION_ID};
use leasehold_proto::ErrorReason;
use tonic::Status;

use crate::api::convert::{self, Waiting};
use crate::machine::{Caller, CancelOutcome, Command, ErrorKind, RequestId, ResourceKind, Response, SessionId, Token};
use crate::raft::replica::{shutting_down, Replica};
use crate::shell::wait_registry::{Registration, WaitOutcome};

/// How a queued request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitEnd {
    Granted(Token),
    /// The wait ran out, or was cancelled, before a grant.
    TimedOut,
}

/// The commit that takes a waiting session out of the queue.
fn cancel_command(kind: ResourceKind, request: RequestId, session: SessionId, name: &str) -> Command {
    let request = convert::cancel_request_id(request);
    let name = name.to_string();
    match kind {
        ResourceKind::Lock => Command::CancelWait { request, session, name },
        ResourceKind::Semaphore => Command::SemCancelWait { request, session, name },
        ResourceKind::Election => Command::CampaignCancelWait { request, session, name },
    }
}

/// The commit that gives back a grant nobody is waiting for any more.
fn give_back_command(kind: ResourceKind, request: RequestId, session: SessionId, name: &str, token: Token) -> Command {
    let request = convert::abandon_request_id(request);
    let name = name.to_string();
    match kind {
        ResourceKind::Lock => Command::Release { request, session, name, token },
        ResourceKind::Semaphore => Command::SemRelease { request, session, name, token },
        ResourceKind::Election => Command::Resign { request, session, name, token },
    }
}

pub fn session_ended(kind: ResourceKind, session: SessionId, name: &str) -> Status {
    let message = format!(
        "session {session} ended (expired or closed) while waiting for {} {name:?}; a grant made just before \
         the end went with the session",
        kind.noun()
    );
    error_status(ErrorReason::SessionEnded, message, &[(METADATA_SESSION_ID, session.to_string())])
}

/// Cancels a wait whose RPC went away before it was answered, so the session is not
/// granted something nobody will use or give back.
struct AbandonedWait {
    replica: Arc<Replica>,
    /// The waiting request's caller: the cancel and give-back act for it.
    caller: Caller,
    kind: ResourceKind,
    request: RequestId,
    session: SessionId,
    name: String,
    armed: bool,
}

impl Drop for AbandonedWait {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let replica = self.replica.clone();
        let caller = self.caller;
        let (kind, request, session, name) = (self.kind, self.request, self.session, std::mem::take(&mut self.name));
        tokio::spawn(async move {
            let cancel = cancel_command(kind, request, session, &name);
            if let Ok(Response::WaitCancelled(CancelOutcome::AlreadyGranted { token })) =
                replica.propose(caller, cancel).await
            {
                let _ = replica.propose(caller, give_back_command(kind, request, session, &name, token)).await;
            }
        });
    }
}

/// Waits until the session's queued request (`waiting`) is granted, or its `wait_ms`
/// (counted from `started_ms` on the node's clock) runs out. `caller` sent the
/// request: the cancel of a wait that ran out acts for it.
pub async fn wait_for_grant(
    replica: &Arc<Replica>,
    caller: Caller,
    kind: ResourceKind,
    waiting: &Waiting,
    started_ms: u64,
) -> Result<WaitEnd, Status> {
    let Waiting { request, session, ref name, wait_ms } = *waiting;
    let name = name.as_str();
    let shared = replica.shared.clone();
    let registration = shared.wait_registry.register(kind, session, name, || {
        let applied = shared.applied.read().unwrap();
        crate::shell::wait_registry::decision(&applied.machine, kind, session, name)
    });
    let mut abandoned =
        AbandonedWait { replica: replica.clone(), caller, kind, request, session, name: name.to_string(), armed: true };
    let outcome = match registration {
        Registration::Decided(outcome) => Some(outcome),
        Registration::Waiting(receiver) => {
            let elapsed_ms = replica.clock.now_ms().saturating_sub(started_ms);
            let left = Duration::from_millis(wait_ms.saturating_sub(elapsed_ms));
            match tokio::time::timeout(left, receiver).await {
                Ok(Ok(outcome)) => Some(outcome),
                Ok(Err(_)) => return Err(shutting_down()),
                Err(_) => None,
            }
        }
    };
    abandoned.armed = false;
    match outcome {
        Some(WaitOutcome::Granted { token }) => Ok(WaitEnd::Granted(token)),
        Some(WaitOutcome::SessionEnded) => Err(session_ended(kind, session, name)),
        Some(WaitOutcome::Cancelled) => Ok(WaitEnd::TimedOut),
        None => {
            // The wait ran out: take the session out of the queue. The grant may have
            // won the race, in which case the caller holds it.
            match replica.propose(caller, cancel_command(kind, request, session, name)).await? {
                Response::WaitCancelled(CancelOutcome::AlreadyGranted { token }) => Ok(WaitEnd::Granted(token)),
                Response::WaitCancelled(_) => Ok(WaitEnd::TimedOut),
                Response::Rejected(error) if error.kind == ErrorKind::UnknownSession => {
                    Err(session_ended(kind, session, name))
                }
                Response::Rejected(error) => Err(convert::command_error(error)),
                other => {
                    Err(error_status(ErrorReason::Internal, format!("unexpected answer to a cancel: {other:?}"), &[]))
                }
            }
        }
    }
}
