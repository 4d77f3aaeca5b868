//! What can go wrong, said honestly: a request that may or may not have taken effect
//! is `Indeterminate`, never reported as failed.

use leasehold_proto::errors::error_reason;
use leasehold_proto::ErrorReason;
use tonic::Code;

#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// The request broke a rule (empty name, TTL out of range, …); nothing changed.
    #[error("invalid request: {0}")]
    InvalidArgument(String),
    /// The session, lock or member does not exist (any more).
    #[error("not found: {0}")]
    NotFound(String),
    /// The request is well-formed but the state refuses it (a token that is not the
    /// current grant, a session that ended while waiting, …); nothing changed.
    #[error("refused: {0}")]
    Refused(String),
    /// A server limit was reached (sessions, locks per session, waiters per lock), or
    /// a quota of the tenant, or the cluster's budget for its state.
    #[error("limit reached: {0}")]
    LimitReached(String),
    /// The request carried no credential, or one the cluster does not know (never
    /// issued, rotated, revoked); nothing changed.
    #[error("unauthenticated: {0}")]
    Unauthenticated(String),
    /// The credential is known but may not do this (an admin request without the
    /// admin credential, another tenant's session, a wrong session secret); nothing
    /// changed.
    #[error("permission denied: {0}")]
    PermissionDenied(String),
    /// The request was sent, but no answer came before the deadline: it may or may
    /// not have taken effect. Retrying with the same request id is safe; the client
    /// already did so until its deadline.
    #[error("indeterminate: the request was sent but not answered in time ({0}); it may have taken effect")]
    Indeterminate(String),
    /// No node could be reached, or none leads; the request was never applied.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// The leader had as many of this tenant's requests waiting for the log as it
    /// queues for one tenant, or the tenant was past its rate quota; the request was
    /// never applied. The client waited the
    /// retry-after the leader gave (with jitter) and tried again until the request's
    /// deadline; this is the last refusal.
    #[error("overloaded: {0}")]
    Overloaded(String),
    /// The session expired or was closed: every lock it held is lost. A wait (acquire,
    /// semaphore acquire, campaign) whose session ended reports this too; it may have
    /// been granted just before the end, and is released with the session either way.
    #[error("session {0} is lost (expired or closed); its locks are released")]
    SessionLost(u64),
    #[error("{0}")]
    Other(String),
}

impl Error {
    /// The error a refusal from the server stands for. Decided on the status's
    /// `ErrorReason` (see `leasehold_proto::errors`), never on its message; a status
    /// without one (from the transport, not a handler) is classed by its code.
    pub(crate) fn from_status(status: &tonic::Status) -> Error {
        let message = status.message().to_string();
        match error_reason(status) {
            Some(reason) => Error::from_reason(reason, message),
            None => match status.code() {
                Code::InvalidArgument => Error::InvalidArgument(message),
                Code::Unauthenticated => Error::Unauthenticated(message),
                Code::PermissionDenied => Error::PermissionDenied(message),
                Code::NotFound => Error::NotFound(message),
                Code::FailedPrecondition | Code::AlreadyExists => Error::Refused(message),
                Code::ResourceExhausted => Error::LimitReached(message),
                Code::Unavailable => Error::Unavailable(message),
                code => Error::Other(format!("{code:?}: {message}")),
            },
        }
    }

    fn from_reason(reason: ErrorReason, message: String) -> Error {
        match reason {
            ErrorReason::InvalidArgument => Error::InvalidArgument(message),
            ErrorReason::UnknownSession | ErrorReason::UnknownMember | ErrorReason::UnknownTenant => {
                Error::NotFound(message)
            }
            ErrorReason::LimitExceeded
            | ErrorReason::QuotaExceeded
            | ErrorReason::BudgetExceeded
            | ErrorReason::DiskLow => Error::LimitReached(message),
            ErrorReason::Overloaded | ErrorReason::RateLimited => Error::Overloaded(message),
            ErrorReason::Unauthenticated => Error::Unauthenticated(message),
            ErrorReason::PermissionDenied | ErrorReason::WrongSessionSecret | ErrorReason::WrongPeer => {
                Error::PermissionDenied(message)
            }
            ErrorReason::TenantExists => Error::Refused(message),
            ErrorReason::RequestIdReused
            | ErrorReason::NotHolder
            | ErrorReason::LimitMismatch
            | ErrorReason::NotElectionLeader
            | ErrorReason::SessionEnded
            | ErrorReason::AlreadyMember
            | ErrorReason::LastVoter
            | ErrorReason::MembershipRefused
            | ErrorReason::ClockKnobOff
            | ErrorReason::WrongCluster
            | ErrorReason::StaleIncarnation
            | ErrorReason::MembersTooOld
            | ErrorReason::BuildTooOld => Error::Refused(message),
            ErrorReason::NotLeader
            | ErrorReason::ShuttingDown
            | ErrorReason::CommitUncertain
            | ErrorReason::LeadershipUnconfirmed
            | ErrorReason::ReadNotApplied => Error::Unavailable(message),
            ErrorReason::Unspecified | ErrorReason::Internal => Error::Other(format!("internal: {message}")),
        }
    }

    /// Whether the request certainly had no effect.
    pub fn is_definite(&self) -> bool {
        !matches!(self, Error::Indeterminate(_) | Error::Other(_))
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
