//! The gRPC boundary: protobuf requests become domain commands here, with every
//! limit checked on the way in; domain errors become gRPC statuses. Nothing past
//! this module sees a prost type.

use leasehold_proto as pb;
use leasehold_proto::errors::error_status;
use leasehold_proto::ErrorReason;
use tonic::Status;

use crate::machine::limits::{
    CLIENT_NAME_BYTES_MAX, ELECTION_VALUE_BYTES_MAX, LOCK_DELAY_MS_MAX, LOCK_NAME_BYTES_MAX, SEMAPHORE_LIMIT_MAX,
    SESSION_TTL_MS_MAX, SESSION_TTL_MS_MIN,
};
use crate::machine::{Command, CommandError, ErrorKind, RequestId, ResourceKind, SessionId, TenantId};
use crate::raft::round_trips::RoundTrips;

/// A blocking acquire waits at most this long per request; a client that wants to
/// wait longer sends the same request again.
pub const ACQUIRE_WAIT_MS_MAX: u64 = 3_600_000;
/// Request sequences with these bits set are reserved for commands the server
/// derives from a client request: the `CancelWait` of a timed-out or abandoned
/// acquire, and the `Release` of an abandoned acquire that won the race.
pub const SERVER_SEQUENCE_BITS: u64 = 0b11 << 62;
const CANCEL_SEQUENCE_BITS: u64 = 0b10 << 62;
const ABANDON_SEQUENCE_BITS: u64 = 0b11 << 62;

/// INVALID_ARGUMENT with its reason: the request breaks the rule `message` names.
pub fn invalid_argument(message: impl Into<String>) -> Status {
    error_status(ErrorReason::InvalidArgument, message, &[])
}

pub fn request_id(request_id: Option<pb::RequestId>) -> Result<RequestId, Status> {
    let Some(pb::RequestId { client_id, sequence }) = request_id else {
        return Err(invalid_argument("request_id is required on every mutating request"));
    };
    if client_id == 0 {
        return Err(invalid_argument("request_id.client_id must not be 0"));
    }
    if sequence & SERVER_SEQUENCE_BITS != 0 {
        return Err(invalid_argument("request_id.sequence must be below 2^62"));
    }
    Ok(RequestId { client_id, sequence })
}

/// The request id of the `CancelWait` the server proposes when the acquire with
/// `acquire` timed out: derived, so that a retried acquire cancels idempotently.
pub fn cancel_request_id(acquire: RequestId) -> RequestId {
    RequestId { client_id: acquire.client_id, sequence: acquire.sequence | CANCEL_SEQUENCE_BITS }
}

/// The request id of the `Release` of an abandoned acquire that was granted.
pub fn abandon_request_id(acquire: RequestId) -> RequestId {
    RequestId { client_id: acquire.client_id, sequence: acquire.sequence | ABANDON_SEQUENCE_BITS }
}

/// The name of a lock, semaphore or election (`kind`): 1 to `LOCK_NAME_BYTES_MAX` bytes.
pub fn resource_name(kind: ResourceKind, name: &str) -> Result<String, Status> {
    let noun = kind.noun();
    if name.is_empty() {
        return Err(invalid_argument(format!(
            "{noun} name is empty; a name is 1 to {LOCK_NAME_BYTES_MAX} bytes (LOCK_NAME_BYTES_MAX)"
        )));
    }
    if name.len() > LOCK_NAME_BYTES_MAX {
        return Err(invalid_argument(format!(
            "{noun} name is {} bytes; the limit is {LOCK_NAME_BYTES_MAX} (LOCK_NAME_BYTES_MAX)",
            name.len()
        )));
    }
    Ok(name.to_string())
}

pub fn session_id(session_id: u64) -> Result<SessionId, Status> {
    if session_id == 0 {
        return Err(invalid_argument("session_id is required (0 is never a session)"));
    }
    Ok(session_id)
}

pub fn create_session(request: pb::CreateSessionRequest) -> Result<Command, Status> {
    let request_id = request_id(request.request_id)?;
    if !(SESSION_TTL_MS_MIN..=SESSION_TTL_MS_MAX).contains(&request.ttl_ms) {
        return Err(invalid_argument(format!(
            "ttl_ms {} is out of range: a session TTL is {SESSION_TTL_MS_MIN} to {SESSION_TTL_MS_MAX} ms",
            request.ttl_ms
        )));
    }
    if request.client_name.len() > CLIENT_NAME_BYTES_MAX {
        return Err(invalid_argument(format!(
            "client_name is {} bytes; the limit is {CLIENT_NAME_BYTES_MAX} (CLIENT_NAME_BYTES_MAX)",
            request.client_name.len()
        )));
    }
    Ok(Command::CreateSession { request: request_id, ttl_ms: request.ttl_ms, client_name: request.client_name })
}

pub fn close_session(request: pb::CloseSessionRequest) -> Result<Command, Status> {
    Ok(Command::CloseSession { request: request_id(request.request_id)?, session: session_id(request.session_id)? })
}

/// What a handler keeps of a request that may wait in a queue (acquire, semaphore
/// acquire, campaign) beside the command it proposes: what a queued wait needs, and the
/// name a refusal describes. The conversion hands it over with the command, so the
/// handler never unpacks the command it built.
#[derive(Debug)]
pub struct Waiting {
    pub request: RequestId,
    pub session: SessionId,
    pub name: String,
    /// How long the request waits in the queue at most.
    pub wait_ms: u64,
}

/// The command and what its wait needs. `default_delay_ms` gives the lock-delay of a
/// name when the request asks for none (see `api::lock_delay`).
pub fn acquire(
    request: pb::AcquireRequest,
    default_delay_ms: impl FnOnce(&str) -> u64,
) -> Result<(Command, Waiting), Status> {
    let request_id = request_id(request.request_id)?;
    let session = session_id(request.session_id)?;
    let name = resource_name(ResourceKind::Lock, &request.name)?;
    if request.wait_ms > ACQUIRE_WAIT_MS_MAX {
        return Err(invalid_argument(format!(
            "wait_ms {} is above the limit of {ACQUIRE_WAIT_MS_MAX} (ACQUIRE_WAIT_MS_MAX)",
            request.wait_ms
        )));
    }
    let wait = request.wait_ms > 0;
    let waiting = Waiting { request: request_id, session, name: name.clone(), wait_ms: request.wait_ms };
    let command = match lock_delay_ms(request.lock_delay_ms, &name, default_delay_ms)? {
        0 => Command::Acquire { request: request_id, session, name, wait },
        delay_ms => Command::AcquireWithDelay { request: request_id, session, name, wait, delay_ms },
    };
    Ok((command, waiting))
}

/// The lock-delay an acquire carries: the one it asks for, checked against
/// `LOCK_DELAY_MS_MAX`, or the name's default.
fn lock_delay_ms(
    requested: Option<u64>,
    name: &str,
    default_delay_ms: impl FnOnce(&str) -> u64,
) -> Result<u64, Status> {
    match requested {
        Some(delay_ms) if delay_ms > LOCK_DELAY_MS_MAX => Err(invalid_argument(format!(
            "lock_delay_ms {delay_ms} is above the limit of {LOCK_DELAY_MS_MAX} (LOCK_DELAY_MS_MAX)"
        ))),
        Some(delay_ms) => Ok(delay_ms),
        None => Ok(default_delay_ms(name)),
    }
}

pub fn release(request: pb::ReleaseRequest) -> Result<Command, Status> {
    let request_id = request_id(request.request_id)?;
    let session = session_id(request.session_id)?;
    let name = resource_name(ResourceKind::Lock, &request.name)?;
    if request.token == 0 {
        return Err(invalid_argument("token is required (0 is never a fencing token)"));
    }
    Ok(Command::Release { request: request_id, session, name, token: request.token })
}

pub fn semaphore_limit(limit: u32) -> Result<u32, Status> {
    if limit == 0 || limit > SEMAPHORE_LIMIT_MAX {
        return Err(invalid_argument(format!(
            "limit {limit} is out of range: a semaphore allows 1 to {SEMAPHORE_LIMIT_MAX} holders (SEMAPHORE_LIMIT_MAX)"
        )));
    }
    Ok(limit)
}

fn wait_ms(wait_ms: u64) -> Result<u64, Status> {
    if wait_ms > ACQUIRE_WAIT_MS_MAX {
        return Err(invalid_argument(format!(
            "wait_ms {wait_ms} is above the limit of {ACQUIRE_WAIT_MS_MAX} (ACQUIRE_WAIT_MS_MAX)"
        )));
    }
    Ok(wait_ms)
}

fn election_value(value: &str) -> Result<String, Status> {
    if value.len() > ELECTION_VALUE_BYTES_MAX {
        return Err(invalid_argument(format!(
            "value is {} bytes; the limit is {ELECTION_VALUE_BYTES_MAX} (ELECTION_VALUE_BYTES_MAX)",
            value.len()
        )));
    }
    Ok(value.to_string())
}

fn token(token: u64) -> Result<u64, Status> {
    if token == 0 {
        return Err(invalid_argument("token is required (0 is never a fencing token)"));
    }
    Ok(token)
}

/// The command and what its wait needs; `default_delay_ms` as for `acquire`.
pub fn sem_acquire(
    request: pb::SemAcquireRequest,
    default_delay_ms: impl FnOnce(&str) -> u64,
) -> Result<(Command, Waiting), Status> {
    let request_id = request_id(request.request_id)?;
    let session = session_id(request.session_id)?;
    let name = resource_name(ResourceKind::Semaphore, &request.name)?;
    let limit = semaphore_limit(request.limit)?;
    let wait = request.wait_ms > 0;
    let waiting = Waiting { request: request_id, session, name: name.clone(), wait_ms: wait_ms(request.wait_ms)? };
    let command = match lock_delay_ms(request.lock_delay_ms, &name, default_delay_ms)? {
        0 => Command::SemAcquire { request: request_id, session, name, limit, wait },
        delay_ms => Command::SemAcquireWithDelay { request: request_id, session, name, limit, wait, delay_ms },
    };
    Ok((command, waiting))
}

pub fn sem_release(request: pb::SemReleaseRequest) -> Result<Command, Status> {
    Ok(Command::SemRelease {
        request: request_id(request.request_id)?,
        session: session_id(request.session_id)?,
        name: resource_name(ResourceKind::Semaphore, &request.name)?,
        token: token(request.token)?,
    })
}

/// `tenant`: whose semaphore, when not the session's own (the admin's only).
pub fn sem_set_limit(request: &pb::SemSetLimitRequest, tenant: Option<TenantId>) -> Result<Command, Status> {
    Ok(Command::SemSetLimit {
        request: request_id(request.request_id)?,
        session: session_id(request.session_id)?,
        name: resource_name(ResourceKind::Semaphore, &request.name)?,
        limit: semaphore_limit(request.limit)?,
        tenant,
    })
}

/// The command and what its wait to lead needs.
pub fn campaign(request: pb::CampaignRequest) -> Result<(Command, Waiting), Status> {
    let waiting = Waiting {
        request: request_id(request.request_id)?,
        session: session_id(request.session_id)?,
        name: resource_name(ResourceKind::Election, &request.name)?,
        wait_ms: wait_ms(request.wait_ms)?,
    };
    let command = Command::Campaign {
        request: waiting.request,
        session: waiting.session,
        name: waiting.name.clone(),
        value: election_value(&request.value)?,
        wait: request.wait_ms > 0,
    };
    Ok((command, waiting))
}

pub fn proclaim(request: pb::ProclaimRequest) -> Result<Command, Status> {
    Ok(Command::Proclaim {
        request: request_id(request.request_id)?,
        session: session_id(request.session_id)?,
        name: resource_name(ResourceKind::Election, &request.name)?,
        token: token(request.token)?,
        value: election_value(&request.value)?,
    })
}

pub fn resign(request: pb::ResignRequest) -> Result<Command, Status> {
    Ok(Command::Resign {
        request: request_id(request.request_id)?,
        session: session_id(request.session_id)?,
        name: resource_name(ResourceKind::Election, &request.name)?,
        token: token(request.token)?,
    })
}

/// The status of a command the state machine refused: one reason per `ErrorKind`, and
/// the error's facts (an unknown session's id, a quota's tenant, limit and usage) as
/// ErrorInfo metadata.
pub fn command_error(error: CommandError) -> Status {
    let reason = match error.kind {
        ErrorKind::InvalidArgument => ErrorReason::InvalidArgument,
        ErrorKind::UnknownSession => ErrorReason::UnknownSession,
        ErrorKind::LimitExceeded => ErrorReason::LimitExceeded,
        ErrorKind::RequestIdReused => ErrorReason::RequestIdReused,
        ErrorKind::NotHolder => ErrorReason::NotHolder,
        ErrorKind::LimitMismatch => ErrorReason::LimitMismatch,
        ErrorKind::NotElectionLeader => ErrorReason::NotElectionLeader,
        ErrorKind::Unauthenticated => ErrorReason::Unauthenticated,
        ErrorKind::PermissionDenied => ErrorReason::PermissionDenied,
        ErrorKind::WrongSessionSecret => ErrorReason::WrongSessionSecret,
        ErrorKind::QuotaExceeded => ErrorReason::QuotaExceeded,
        ErrorKind::UnknownTenant => ErrorReason::UnknownTenant,
        ErrorKind::TenantExists => ErrorReason::TenantExists,
    };
    let metadata: Vec<(&str, String)> =
        error.metadata.iter().map(|(key, value)| (key.as_str(), value.clone())).collect();
    error_status(reason, error.message, &metadata)
}

/// The members of a Status answer with the round trip this node measured to each
/// (`raft::round_trips`); a member not measured (and this node) has none.
pub fn with_round_trips(members: Vec<pb::Member>, round_trips: &RoundTrips) -> Vec<pb::Member> {
    members
        .into_iter()
        .map(|member| pb::Member {
            round_trip: round_trips.of(member.node_id).map(|round_trip| pb::RoundTrip {
                median_us: round_trip.median_us,
                last_us: round_trip.last_us,
                samples: round_trip.samples,
                measured_ms_ago: round_trip.since_ms,
            }),
            ..member
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The proto's comments name the limits they quote (`NAME = value`): each value
    /// must be the constant's, so the documented API cannot drift from the code.
    #[test]
    fn the_limits_the_proto_quotes_are_the_codes() {
        use crate::api::leasehold_service::{LIST_SESSIONS_PAGE_MAX, SESSION_SECRET_BYTES};
        use crate::machine::limits::*;
        let known: Vec<(&str, u64)> = vec![
            ("REQUESTS_REMEMBERED_PER_SESSION_MAX", REQUESTS_REMEMBERED_PER_SESSION_MAX as u64),
            ("SESSION_TTL_MS_MIN", SESSION_TTL_MS_MIN),
            ("SESSION_TTL_MS_MAX", SESSION_TTL_MS_MAX),
            ("CLIENT_NAME_BYTES_MAX", CLIENT_NAME_BYTES_MAX as u64),
            ("LOCK_NAME_BYTES_MAX", LOCK_NAME_BYTES_MAX as u64),
            ("SEMAPHORE_LIMIT_MAX", u64::from(SEMAPHORE_LIMIT_MAX)),
            ("ELECTION_VALUE_BYTES_MAX", ELECTION_VALUE_BYTES_MAX as u64),
            ("LIST_SESSIONS_PAGE_MAX", LIST_SESSIONS_PAGE_MAX as u64),
            ("SESSION_SECRET_BYTES", SESSION_SECRET_BYTES as u64),
            ("SESSIONS_PER_TENANT_DEFAULT", u64::from(SESSIONS_PER_TENANT_DEFAULT)),
            ("HOLDS_PER_TENANT_DEFAULT", u64::from(HOLDS_PER_TENANT_DEFAULT)),
            ("WAITERS_PER_TENANT_DEFAULT", u64::from(WAITERS_PER_TENANT_DEFAULT)),
            ("TENANT_NAME_BYTES_MAX", TENANT_NAME_BYTES_MAX as u64),
            ("LOCK_DELAY_MS_MAX", LOCK_DELAY_MS_MAX),
            ("TENANT_WEIGHT_MAX", u64::from(TENANT_WEIGHT_MAX)),
            ("TENANT_OPS_PER_S_MAX", u64::from(TENANT_OPS_PER_S_MAX)),
        ];
        let proto = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../proto/proto/leasehold.proto"))
            .expect("read the proto");
        let mut quoted = 0;
        for line in proto.lines().filter(|line| line.trim_start().starts_with("//")) {
            let words: Vec<&str> = line.split_whitespace().collect();
            for window in words.windows(3) {
                if window[1] != "=" || !window[0].chars().all(|c| c.is_ascii_uppercase() || c == '_') {
                    continue;
                }
                let value: String = window[2].chars().take_while(char::is_ascii_digit).collect();
                let Some((_, constant)) = known.iter().find(|(name, _)| *name == window[0]) else {
                    panic!("the proto quotes {} = {value}, which this test does not know", window[0]);
                };
                assert_eq!(value.parse::<u64>().ok(), Some(*constant), "the proto says {} = {value}", window[0]);
                quoted += 1;
            }
        }
        assert!(quoted >= known.len(), "only {quoted} limits quoted");
    }

    fn id() -> Option<pb::RequestId> {
        Some(pb::RequestId { client_id: 9, sequence: 1 })
    }

    #[test]
    fn bad_input_is_named() {
        let cases: Vec<(Result<Command, Status>, &str)> = vec![
            (
                create_session(pb::CreateSessionRequest { request_id: id(), ttl_ms: 0, client_name: String::new() }),
                "ttl_ms 0 is out of range",
            ),
            (
                create_session(pb::CreateSessionRequest {
                    request_id: id(),
                    ttl_ms: SESSION_TTL_MS_MAX + 1,
                    client_name: String::new(),
                }),
                "out of range",
            ),
            (
                create_session(pb::CreateSessionRequest {
                    request_id: None,
                    ttl_ms: 5_000,
                    client_name: String::new(),
                }),
                "request_id is required",
            ),
            (
                acquire(
                    pb::AcquireRequest {
                        lock_delay_ms: None,
                        request_id: id(),
                        session_id: 5,
                        name: String::new(),
                        wait_ms: 0,
                        session_secret: vec![],
                    },
                    |_| 0,
                )
                .map(|(command, _)| command),
                "name is empty",
            ),
            (
                acquire(
                    pb::AcquireRequest {
                        lock_delay_ms: None,
                        request_id: id(),
                        session_id: 5,
                        name: "x".repeat(257),
                        wait_ms: 0,
                        session_secret: vec![],
                    },
                    |_| 0,
                )
                .map(|(command, _)| command),
                "257 bytes",
            ),
            (
                acquire(
                    pb::AcquireRequest {
                        lock_delay_ms: None,
                        request_id: id(),
                        session_id: 0,
                        name: "a".into(),
                        wait_ms: 0,
                        session_secret: vec![],
                    },
                    |_| 0,
                )
                .map(|(command, _)| command),
                "session_id is required",
            ),
            (
                release(pb::ReleaseRequest {
                    request_id: id(),
                    session_id: 5,
                    name: "a".into(),
                    token: 0,
                    session_secret: vec![],
                }),
                "token is required",
            ),
        ];
        for (result, expected) in cases {
            let status = result.unwrap_err();
            assert_eq!(status.code(), tonic::Code::InvalidArgument);
            assert!(status.message().contains(expected), "{:?} lacks {expected:?}", status.message());
        }
    }
}
