//! Error statuses with a machine-readable reason: a `google.rpc.ErrorInfo` in the
//! status details, whose `reason` names an `ErrorReason` and whose `domain` is
//! `ERROR_DOMAIN`. The server makes every error status here, so a reason always comes
//! with the code `ErrorReason::code` gives it; clients decide on the reason, never on
//! the message text, which may be reworded.

use std::collections::HashMap;

use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

use crate::ErrorReason;

/// The `domain` of every Leasehold `ErrorInfo`.
pub const ERROR_DOMAIN: &str = "leasehold";
/// ErrorInfo metadata: the session a refusal is about (`UNKNOWN_SESSION`, `SESSION_ENDED`).
pub const METADATA_SESSION_ID: &str = "session_id";
/// ErrorInfo metadata of `NOT_LEADER`: the leader's client address, empty when unknown.
pub const METADATA_LEADER: &str = "leader";
/// ErrorInfo metadata of `NOT_LEADER`: the leader's node id, "0" when unknown.
pub const METADATA_LEADER_ID: &str = "leader_id";
/// ErrorInfo metadata: the tenant a refusal is about.
pub const METADATA_TENANT: &str = "tenant";
/// ErrorInfo metadata of `OVERLOADED` and `RATE_LIMITED`: how long to wait before trying again, in
/// milliseconds (a client adds jitter).
pub const METADATA_RETRY_AFTER_MS: &str = "retry_after_ms";

impl ErrorReason {
    /// The gRPC code that always comes with this reason.
    pub fn code(self) -> Code {
        match self {
            ErrorReason::Unspecified | ErrorReason::Internal => Code::Internal,
            ErrorReason::InvalidArgument => Code::InvalidArgument,
            ErrorReason::UnknownSession | ErrorReason::UnknownMember | ErrorReason::UnknownTenant => Code::NotFound,
            ErrorReason::LimitExceeded
            | ErrorReason::QuotaExceeded
            | ErrorReason::BudgetExceeded
            | ErrorReason::DiskLow
            | ErrorReason::Overloaded
            | ErrorReason::RateLimited => Code::ResourceExhausted,
            ErrorReason::RequestIdReused | ErrorReason::AlreadyMember | ErrorReason::TenantExists => {
                Code::AlreadyExists
            }
            ErrorReason::Unauthenticated => Code::Unauthenticated,
            ErrorReason::PermissionDenied | ErrorReason::WrongSessionSecret | ErrorReason::WrongPeer => {
                Code::PermissionDenied
            }
            ErrorReason::NotHolder
            | ErrorReason::LimitMismatch
            | ErrorReason::NotElectionLeader
            | ErrorReason::SessionEnded
            | ErrorReason::LastVoter
            | ErrorReason::MembershipRefused
            | ErrorReason::ClockKnobOff
            | ErrorReason::WrongCluster
            | ErrorReason::StaleIncarnation
            | ErrorReason::MembersTooOld
            | ErrorReason::BuildTooOld => Code::FailedPrecondition,
            ErrorReason::NotLeader
            | ErrorReason::ShuttingDown
            | ErrorReason::CommitUncertain
            | ErrorReason::LeadershipUnconfirmed
            | ErrorReason::ReadNotApplied => Code::Unavailable,
        }
    }
}

/// A status with `reason`'s code, `message` for people, and an ErrorInfo carrying the
/// reason and `metadata`.
pub fn error_status(reason: ErrorReason, message: impl Into<String>, metadata: &[(&str, String)]) -> Status {
    assert!(reason != ErrorReason::Unspecified, "a status names its reason");
    let metadata: HashMap<String, String> =
        metadata.iter().map(|(key, value)| ((*key).to_string(), value.clone())).collect();
    let details = ErrorDetails::with_error_info(reason.as_str_name(), ERROR_DOMAIN, metadata);
    Status::with_error_details(reason.code(), message, details)
}

/// The reason a Leasehold server gave for `status`: `None` when the status carries no
/// Leasehold ErrorInfo (it came from the transport, not a handler) or names a reason
/// this build does not know.
pub fn error_reason(status: &Status) -> Option<ErrorReason> {
    let info = status.get_details_error_info()?;
    if info.domain != ERROR_DOMAIN {
        return None;
    }
    ErrorReason::from_str_name(&info.reason).filter(|reason| *reason != ErrorReason::Unspecified)
}

/// A metadata value of the status's Leasehold ErrorInfo.
pub fn error_metadata(status: &Status, key: &str) -> Option<String> {
    let info = status.get_details_error_info()?;
    if info.domain != ERROR_DOMAIN {
        return None;
    }
    info.metadata.get(key).cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reason_and_its_metadata_survive_the_status_bytes() {
        let status =
            error_status(ErrorReason::NotLeader, "node 2 is not the leader", &[(METADATA_LEADER, "a:1".into())]);
        assert_eq!(status.code(), Code::Unavailable);
        // As a client receives it: the details travel as bytes.
        let received = Status::with_details(status.code(), "reworded", status.details().to_vec().into());
        assert_eq!(error_reason(&received), Some(ErrorReason::NotLeader));
        assert_eq!(error_metadata(&received, METADATA_LEADER).as_deref(), Some("a:1"));
        assert_eq!(error_reason(&Status::unavailable("is not the leader")), None, "no details, no reason");
    }

    #[test]
    fn every_reason_has_its_name_and_a_code() {
        for value in 1..=i32::MAX {
            let Ok(reason) = ErrorReason::try_from(value) else { break };
            assert_eq!(ErrorReason::from_str_name(reason.as_str_name()), Some(reason));
            assert_eq!(error_status(reason, "x", &[]).code(), reason.code());
        }
    }
}
