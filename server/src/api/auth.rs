//! Who sent a request: the admin or a tenant, from the bearer token in its metadata or
//! the client certificate of its connection. Every client RPC asks here first; what
//! the caller may then do is decided by the state machine (sessions, tenants, quotas)
//! and by `Who` (admin-only RPCs, which namespace a read looks in).
//!
//! Secrets are compared as hashes (`shell::credentials::secret_hash`) and never
//! logged. Refused credentials are logged on the `audit` target, at most once a second.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use leasehold_proto::errors::{error_status, METADATA_TENANT};
use leasehold_proto::ErrorReason;
use tonic::{Request, Status};

use crate::machine::{Caller, SecretHash, TenantId, ADMIN_TENANT, ADMIN_TENANT_NAME};
use crate::raft::state_machine_store::Shared;
use crate::shell::clock::LogLimiter;
use crate::shell::credentials::{read_admin_token, secret_hash, KnownTenant};
use crate::shell::tls::tenant_presented;

/// The metadata key of the bearer credential: `authorization: Bearer <token>`.
pub const AUTHORIZATION_METADATA_KEY: &str = "authorization";
/// A refused credential is logged at most once per this interval.
pub const REFUSAL_LOG_INTERVAL_MS: u64 = 1_000;

/// The authenticated sender of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Who {
    Admin,
    Tenant(KnownTenant),
}

impl Who {
    /// The namespace the sender acts in.
    pub fn tenant(&self) -> TenantId {
        match self {
            Who::Admin => ADMIN_TENANT,
            Who::Tenant(tenant) => tenant.id,
        }
    }

    pub fn name(&self) -> &str {
        match self {
            Who::Admin => ADMIN_TENANT_NAME,
            Who::Tenant(tenant) => &tenant.name,
        }
    }

    /// The caller of a command, presenting the session secret `secret` (empty for
    /// commands that name no session).
    pub fn caller(&self, secret: &[u8]) -> Caller {
        self.caller_with(secret_hash(secret))
    }

    pub fn caller_with(&self, secret: SecretHash) -> Caller {
        match self {
            Who::Admin => Caller::Admin { secret },
            Who::Tenant(tenant) => Caller::Tenant { tenant: tenant.id, secret },
        }
    }

    /// Refuses a tenant: `what` needs the admin credential.
    pub fn require_admin(&self, what: &str) -> Result<(), Status> {
        match self {
            Who::Admin => Ok(()),
            Who::Tenant(tenant) => Err(error_status(
                ErrorReason::PermissionDenied,
                format!("tenant {:?} may not {what}: it needs the admin credential", tenant.name),
                &[(METADATA_TENANT, tenant.name.to_string())],
            )),
        }
    }
}

pub struct Auth {
    admin_token_file: PathBuf,
    /// The hash of the admin token the file held when last read.
    admin_token_hash: RwLock<SecretHash>,
    shared: Arc<Shared>,
    refusals: LogLimiter,
}

impl Auth {
    /// Reads the admin token from `admin_token_file` (checked with the configuration).
    pub fn new(admin_token_file: PathBuf, shared: Arc<Shared>) -> Result<Auth, String> {
        let token = read_admin_token(&admin_token_file)?;
        Ok(Auth {
            admin_token_file,
            admin_token_hash: RwLock::new(secret_hash(token.as_bytes())),
            shared,
            refusals: LogLimiter::new(Duration::from_millis(REFUSAL_LOG_INTERVAL_MS)),
        })
    }

    /// Reads the admin token file again (SIGHUP): the old token stops working.
    pub fn reload_admin_token(&self) -> Result<(), String> {
        let token = read_admin_token(&self.admin_token_file)?;
        *self.admin_token_hash.write().unwrap() = secret_hash(token.as_bytes());
        Ok(())
    }

    /// Who sent `request` (for `rpc`): its bearer token's owner, else the tenant its
    /// client certificate names. UNAUTHENTICATED for no credential or an unknown one.
    /// Whether `token` is the admin credential (for the status page, which has no
    /// gRPC request to read it from).
    pub fn is_admin_token(&self, token: &str) -> bool {
        !token.is_empty() && secret_hash(token.as_bytes()) == *self.admin_token_hash.read().unwrap()
    }

    pub fn who<T>(&self, rpc: &str, request: &Request<T>) -> Result<Who, Status> {
        if let Some(value) = request.metadata().get(AUTHORIZATION_METADATA_KEY) {
            let token = value.to_str().ok().and_then(|value| value.strip_prefix("Bearer ")).map(str::trim);
            let Some(token) = token.filter(|token| !token.is_empty()) else {
                return Err(self.refuse(rpc, request, "an authorization header that is not `Bearer <token>`"));
            };
            let hash = secret_hash(token.as_bytes());
            if hash == *self.admin_token_hash.read().unwrap() {
                return Ok(Who::Admin);
            }
            return match self.shared.credentials.by_token(&hash) {
                Some(tenant) => Ok(Who::Tenant(tenant)),
                None => Err(self.refuse(rpc, request, "a token no tenant has (never issued, rotated, or removed)")),
            };
        }
        if let Some(chain) = request.peer_certs() {
            let Some(name) = tenant_presented(&chain) else {
                return Err(self.refuse(rpc, request, "a client certificate that names no tenant"));
            };
            return match self.shared.credentials.by_name(&name) {
                Some(tenant) => Ok(Who::Tenant(tenant)),
                None => Err(self.refuse(
                    rpc,
                    request,
                    &format!("a client certificate of tenant {name:?}, which does not exist"),
                )),
            };
        }
        Err(self.refuse(rpc, request, "no credential"))
    }

    /// The namespace a read of `who` looks in: its own, or for the admin the tenant
    /// `requested` names (empty: the admin's own).
    pub fn namespace(&self, who: &Who, requested: &str) -> Result<TenantId, Status> {
        if requested.is_empty() || requested == who.name() {
            return Ok(who.tenant());
        }
        who.require_admin(&format!("read tenant {requested:?}'s namespace"))?;
        if requested == ADMIN_TENANT_NAME {
            return Ok(ADMIN_TENANT);
        }
        match self.shared.credentials.by_name(requested) {
            Some(tenant) => Ok(tenant.id),
            None => Err(error_status(
                ErrorReason::UnknownTenant,
                format!("tenant {requested:?} does not exist"),
                &[(METADATA_TENANT, requested.to_string())],
            )),
        }
    }

    fn refuse<T>(&self, rpc: &str, request: &Request<T>, problem: &str) -> Status {
        if self.refusals.allow() {
            let remote = request.remote_addr().map(|address| address.to_string()).unwrap_or_default();
            tracing::warn!(
                target: "audit",
                rpc,
                %remote,
                problem,
                "refused a request's credential (logged at most once a second)"
            );
        }
        error_status(
            ErrorReason::Unauthenticated,
            format!(
                "{rpc}: {problem}; send a tenant's token as `authorization: Bearer <token>`, or a client \
                 certificate naming <tenant>.tenant.leasehold"
            ),
            &[],
        )
    }
}

/// The audit line of an admin action: the RPC, the caller, what it changed (never a
/// secret).
pub fn audit(rpc: &str, who: &Who, what: &str) {
    tracing::info!(target: "audit", rpc, caller = who.name(), what, "admin action");
}
