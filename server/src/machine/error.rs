//! Rejections: what a client can get wrong, each with a message that names the broken
//! rule and the values involved.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::{RequestId, ResourceKind, SessionId, Token};
use crate::machine::limits::{
    CHECKPOINT_SESSIONS_PER_COMMAND_MAX, CLIENT_NAME_BYTES_MAX, ELECTION_VALUE_BYTES_MAX,
    EXPIRE_SESSIONS_PER_COMMAND_MAX, LOCKS_PER_SESSION_MAX, LOCK_DELAYS_ENDED_PER_COMMAND_MAX, LOCK_DELAY_MS_MAX,
    LOCK_NAME_BYTES_MAX, SEMAPHORE_LIMIT_MAX, SESSIONS_MAX, SESSION_TTL_MS_MAX, SESSION_TTL_MS_MIN,
    WAITERS_PER_LOCK_MAX,
};
use crate::machine::limits::{TENANTS_MAX, TENANT_NAME_BYTES_MAX, TENANT_OPS_PER_S_MAX, TENANT_WEIGHT_MAX};

/// Why a command was rejected. A rejected command changed nothing but the last applied
/// index, so the client may fix it and send it again.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct CommandError {
    pub kind: ErrorKind,
    /// Names the rule and the values, for people reading logs and client errors.
    pub message: String,
    /// Facts a program may act on without reading the message (ErrorInfo metadata on
    /// the wire): `session_id` of an unknown session, the `tenant`, `quota`, `limit`
    /// and `usage` of a quota.
    pub metadata: Vec<(String, String)>,
}

/// The class of a rejection. The gRPC layer gives each its own `ErrorReason` (and the
/// code that goes with it), which is what clients decide on.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ErrorKind {
    InvalidArgument,
    UnknownSession,
    LimitExceeded,
    RequestIdReused,
    /// Release with a token that is not this session's current grant of this name (a
    /// lock, or a permit of a semaphore).
    NotHolder,
    /// `SemAcquire` with a limit other than the semaphore's current one.
    LimitMismatch,
    /// `Proclaim` or `Resign` with a token that is not this session's current leadership
    /// of the election. (Not the Raft leader: a node that does not lead the cluster
    /// refuses a request before any command is proposed.)
    NotElectionLeader,
    /// The caller's tenant no longer exists: it was removed after the request was
    /// authenticated and before its command was applied.
    Unauthenticated,
    /// A known caller acting outside its rights: another tenant's session, tenant
    /// management without the admin credential.
    PermissionDenied,
    /// A session-scoped command whose secret is not the session's.
    WrongSessionSecret,
    /// The tenant is at one of its quotas.
    QuotaExceeded,
    UnknownTenant,
    TenantExists,
}

impl fmt::Display for CommandError {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "{:?}: {}", self.kind, self.message)
    }
}

impl std::error::Error for CommandError {}

impl CommandError {
    fn new(kind: ErrorKind, message: String) -> Self {
        assert!(!message.is_empty());
        CommandError { kind, message, metadata: Vec::new() }
    }

    fn with(mut self, key: &str, value: impl ToString) -> Self {
        self.metadata.push((key.to_string(), value.to_string()));
        self
    }
}

/// Names of locks, semaphores and elections follow the same rules.
pub(super) fn validate_name(kind: ResourceKind, name: &str) -> Result<(), CommandError> {
    let noun = kind.noun();
    if name.is_empty() {
        let article = if kind == ResourceKind::Election { "an" } else { "a" };
        return Err(CommandError::new(
            ErrorKind::InvalidArgument,
            format!("{noun} name is empty; {article} {noun} name needs at least one byte"),
        ));
    }
    if name.len() > LOCK_NAME_BYTES_MAX {
        return Err(CommandError::new(
            ErrorKind::InvalidArgument,
            format!(
                "{noun} name is {} bytes; the limit is {LOCK_NAME_BYTES_MAX} \
                 (LOCK_NAME_BYTES_MAX)",
                name.len()
            ),
        ));
    }
    Ok(())
}

pub(super) fn validate_semaphore_limit(limit: u32) -> Result<(), CommandError> {
    if limit == 0 || limit > SEMAPHORE_LIMIT_MAX {
        return Err(CommandError::new(
            ErrorKind::InvalidArgument,
            format!(
                "semaphore limit is {limit}; it must be at least 1 and at most \
                 {SEMAPHORE_LIMIT_MAX} (SEMAPHORE_LIMIT_MAX)"
            ),
        ));
    }
    Ok(())
}

pub(super) fn validate_shares(weight: Option<u32>, ops_per_s: Option<u32>) -> Result<(), CommandError> {
    if let Some(weight) = weight.filter(|weight| !(1..=TENANT_WEIGHT_MAX).contains(weight)) {
        return Err(CommandError::new(
            ErrorKind::InvalidArgument,
            format!("weight is {weight}; it must be at least 1 and at most {TENANT_WEIGHT_MAX} (TENANT_WEIGHT_MAX)"),
        ));
    }
    if let Some(ops_per_s) = ops_per_s.filter(|ops_per_s| *ops_per_s > TENANT_OPS_PER_S_MAX) {
        return Err(CommandError::new(
            ErrorKind::InvalidArgument,
            format!(
                "the rate quota is {ops_per_s} operations a second; it must be at most {TENANT_OPS_PER_S_MAX} \
                 (TENANT_OPS_PER_S_MAX), or 0 for none"
            ),
        ));
    }
    Ok(())
}

pub(super) fn validate_election_value(value: &str) -> Result<(), CommandError> {
    if value.len() > ELECTION_VALUE_BYTES_MAX {
        return Err(CommandError::new(
            ErrorKind::InvalidArgument,
            format!(
                "election value is {} bytes; the limit is {ELECTION_VALUE_BYTES_MAX} \
                 (ELECTION_VALUE_BYTES_MAX)",
                value.len()
            ),
        ));
    }
    Ok(())
}

pub(super) fn validate_client_name(client_name: &str) -> Result<(), CommandError> {
    if client_name.len() > CLIENT_NAME_BYTES_MAX {
        return Err(CommandError::new(
            ErrorKind::InvalidArgument,
            format!(
                "client name is {} bytes; the limit is {CLIENT_NAME_BYTES_MAX} \
                 (CLIENT_NAME_BYTES_MAX)",
                client_name.len()
            ),
        ));
    }
    Ok(())
}

pub(super) fn validate_ttl_ms(ttl_ms: u64) -> Result<(), CommandError> {
    if ttl_ms < SESSION_TTL_MS_MIN {
        return Err(CommandError::new(
            ErrorKind::InvalidArgument,
            format!(
                "session ttl is {ttl_ms} ms; the minimum is {SESSION_TTL_MS_MIN} ms \
                 (SESSION_TTL_MS_MIN)"
            ),
        ));
    }
    if ttl_ms > SESSION_TTL_MS_MAX {
        return Err(CommandError::new(
            ErrorKind::InvalidArgument,
            format!(
                "session ttl is {ttl_ms} ms; the maximum is {SESSION_TTL_MS_MAX} ms \
                 (SESSION_TTL_MS_MAX)"
            ),
        ));
    }
    Ok(())
}

pub(super) fn sessions_full(count: usize) -> CommandError {
    CommandError::new(
        ErrorKind::LimitExceeded,
        format!("there are {count} sessions; the limit is {SESSIONS_MAX} (SESSIONS_MAX)"),
    )
}

pub(super) fn unknown_session(session: SessionId) -> CommandError {
    let message = format!("session {session} does not exist: it was never created, was closed, or expired");
    CommandError::new(ErrorKind::UnknownSession, message).with("session_id", session)
}

/// The admin's `EndSession` named a session that is not a live one of the tenant: the
/// admin sees every tenant, so the answer may say that much.
pub(super) fn not_tenants_session(tenant_name: &str, session: SessionId) -> CommandError {
    let message = format!(
        "tenant {tenant_name:?} has no session {session} (never created, ended, or another tenant's): nothing was \
         ended"
    );
    CommandError::new(ErrorKind::UnknownSession, message).with("session_id", session)
}

pub(super) fn session_locks_full(session: SessionId, count: usize) -> CommandError {
    CommandError::new(
        ErrorKind::LimitExceeded,
        format!(
            "session {session} holds or waits on {count} locks, semaphore permits and \
             elections together; the limit is {LOCKS_PER_SESSION_MAX} (LOCKS_PER_SESSION_MAX)"
        ),
    )
}

pub(super) fn waiters_full(kind: ResourceKind, name: &str, count: usize) -> CommandError {
    CommandError::new(
        ErrorKind::LimitExceeded,
        format!(
            "{} {name:?} has {count} waiters; the limit is {WAITERS_PER_LOCK_MAX} \
             (WAITERS_PER_LOCK_MAX)",
            kind.noun()
        ),
    )
}

pub(super) fn limit_mismatch(name: &str, requested: u32, current: u32) -> CommandError {
    CommandError::new(
        ErrorKind::LimitMismatch,
        format!(
            "semaphore {name:?} has limit {current}, but this acquire asks for limit \
             {requested}; every acquirer must ask for the current limit (the first acquirer \
             set it, SemSetLimit changes it)"
        ),
    )
}

pub(super) fn semaphore_unused(name: &str) -> CommandError {
    CommandError::new(
        ErrorKind::InvalidArgument,
        format!(
            "semaphore {name:?} has no holders; the next acquirer sets its limit, so there \
             is no limit to change"
        ),
    )
}

pub(super) fn expire_batch_too_large(count: usize) -> CommandError {
    CommandError::new(
        ErrorKind::LimitExceeded,
        format!(
            "expire command lists {count} sessions; the limit is \
             {EXPIRE_SESSIONS_PER_COMMAND_MAX} (EXPIRE_SESSIONS_PER_COMMAND_MAX)"
        ),
    )
}

pub(super) fn checkpoint_batch_too_large(count: usize) -> CommandError {
    CommandError::new(
        ErrorKind::LimitExceeded,
        format!(
            "checkpoint command lists {count} sessions; the limit is \
             {CHECKPOINT_SESSIONS_PER_COMMAND_MAX} (CHECKPOINT_SESSIONS_PER_COMMAND_MAX)"
        ),
    )
}

pub(super) fn validate_lock_delay_ms(delay_ms: u64) -> Result<(), CommandError> {
    if delay_ms == 0 || delay_ms > LOCK_DELAY_MS_MAX {
        return Err(CommandError::new(
            ErrorKind::InvalidArgument,
            format!(
                "lock delay is {delay_ms} ms; it must be at least 1 ms (0 means no delay and \
                 takes the plain acquire) and at most {LOCK_DELAY_MS_MAX} ms (LOCK_DELAY_MS_MAX)"
            ),
        ));
    }
    Ok(())
}

pub(super) fn end_delays_batch_too_large(count: usize) -> CommandError {
    CommandError::new(
        ErrorKind::LimitExceeded,
        format!(
            "end-of-delay command lists {count} delays; the limit is \
             {LOCK_DELAYS_ENDED_PER_COMMAND_MAX} (LOCK_DELAYS_ENDED_PER_COMMAND_MAX)"
        ),
    )
}

pub(super) fn request_id_reused(request: RequestId) -> CommandError {
    CommandError::new(
        ErrorKind::RequestIdReused,
        format!(
            "request id (client {}, sequence {}) was already used for a different command; \
             a retry must repeat its command unchanged, and a new command needs a new \
             sequence number",
            request.client_id, request.sequence
        ),
    )
}

/// `current` is the lock's holder and token, `None` when the lock is free.
pub(super) fn not_holder(
    session: SessionId,
    name: &str,
    token: Token,
    current: Option<(SessionId, Token)>,
) -> CommandError {
    let state = match current {
        None => "the lock is free".to_owned(),
        Some((holder, current_token)) if holder == session => {
            format!("this session holds it with token {current_token}")
        }
        Some((holder, current_token)) => {
            format!("session {holder} holds it with token {current_token}")
        }
    };
    CommandError::new(
        ErrorKind::NotHolder,
        format!(
            "session {session} cannot release lock {name:?} with token {token}: {state}; only \
             the holder can release, with the token of its current grant"
        ),
    )
}

/// `current` is the session's permit of the semaphore, `None` when it holds none.
pub(super) fn not_permit_holder(session: SessionId, name: &str, token: Token, current: Option<Token>) -> CommandError {
    let state = match current {
        None => "this session holds no permit of it".to_owned(),
        Some(current_token) => format!("this session holds its permit with token {current_token}"),
    };
    CommandError::new(
        ErrorKind::NotHolder,
        format!(
            "session {session} cannot release a permit of semaphore {name:?} with token \
             {token}: {state}; only a holder can release, with the token of its current grant"
        ),
    )
}

/// A release, resign or proclaim presented a token that is not from an entry before
/// this one. Clients only learn a token once its entry is applied, so only a guessed
/// token gets here; refusing it keeps a grant from ending in the entry that made it.
pub(super) fn token_not_yet_applied(
    kind: ResourceKind,
    session: SessionId,
    name: &str,
    token: Token,
    index: u64,
) -> CommandError {
    let error_kind = if kind == ResourceKind::Election { ErrorKind::NotElectionLeader } else { ErrorKind::NotHolder };
    CommandError::new(
        error_kind,
        format!(
            "session {session} presented token {token} for {} {name:?} in entry {index}: a token is the index of \
             an applied entry that granted it, and no entry before {index} did",
            kind.noun()
        ),
    )
}

/// `current` is the election's leader and token, `None` when it is vacant.
pub(super) fn not_leader(
    session: SessionId,
    name: &str,
    token: Token,
    action: &str,
    current: Option<(SessionId, Token)>,
) -> CommandError {
    let state = match current {
        None => "the election is vacant".to_owned(),
        Some((leader, current_token)) if leader == session => {
            format!("this session leads it with token {current_token}")
        }
        Some((leader, current_token)) => {
            format!("session {leader} leads it with token {current_token}")
        }
    };
    CommandError::new(
        ErrorKind::NotElectionLeader,
        format!(
            "session {session} cannot {action} in election {name:?} with token {token}: \
             {state}; only the leader can, with the token of its current leadership"
        ),
    )
}

pub(super) fn tenant_removed(tenant: u32) -> CommandError {
    CommandError::new(
        ErrorKind::Unauthenticated,
        "the request's tenant was removed before its command was applied; its credential no longer works".into(),
    )
    .with("tenant_id", tenant)
}

pub(super) fn permission_denied(tenant: &str, what: &str) -> CommandError {
    CommandError::new(ErrorKind::PermissionDenied, format!("tenant {tenant:?} may not act on {what}"))
        .with("tenant", tenant)
}

pub(super) fn wrong_session_secret(session: SessionId) -> CommandError {
    CommandError::new(
        ErrorKind::WrongSessionSecret,
        format!(
            "the request does not present session {session}'s secret; only the client that created a session \
             (with the secret CreateSession returned) may act on it"
        ),
    )
    .with("session_id", session)
}

pub(super) fn quota_exceeded(tenant: &str, quota: &str, limit: u32, usage: u32) -> CommandError {
    CommandError::new(ErrorKind::QuotaExceeded, format!("tenant {tenant:?} has {usage} {quota}; its quota is {limit}"))
        .with("tenant", tenant)
        .with("quota", quota)
        .with("limit", limit)
        .with("usage", usage)
}

pub(super) fn unknown_tenant(name: &str) -> CommandError {
    CommandError::new(ErrorKind::UnknownTenant, format!("tenant {name:?} does not exist")).with("tenant", name)
}

pub(super) fn tenant_exists(name: &str) -> CommandError {
    CommandError::new(
        ErrorKind::TenantExists,
        format!("tenant {name:?} exists already; rotate its token to get a new one"),
    )
    .with("tenant", name)
}

pub(super) fn tenants_full(count: usize) -> CommandError {
    CommandError::new(
        ErrorKind::LimitExceeded,
        format!("there are {count} tenants; the limit is {TENANTS_MAX} (TENANTS_MAX)"),
    )
}

/// Whether `name` could name a tenant: a DNS label (it is part of a client
/// certificate's DNS name) of lowercase letters, digits and '-', not at either end;
/// "admin" too (the admin's namespace), which no tenant added may take.
pub fn is_tenant_label(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= TENANT_NAME_BYTES_MAX
        && name.bytes().all(|byte| byte.is_ascii_lowercase() || byte.is_ascii_digit() || byte == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

/// A tenant name is a DNS label (`is_tenant_label`) other than "admin".
pub(super) fn validate_tenant_name(name: &str) -> Result<(), CommandError> {
    if !is_tenant_label(name) {
        return Err(CommandError::new(
            ErrorKind::InvalidArgument,
            format!(
                "tenant name {name:?} is not 1 to {TENANT_NAME_BYTES_MAX} lowercase letters, digits and inner \
                 '-' (TENANT_NAME_BYTES_MAX)"
            ),
        ));
    }
    if name == super::caller::ADMIN_TENANT_NAME {
        return Err(CommandError::new(
            ErrorKind::InvalidArgument,
            "tenant name \"admin\" is reserved for the admin's own namespace".to_string(),
        ));
    }
    Ok(())
}
