//! Who sent a request: the admin or a tenant, from the bearer token in its metadata or
//! the client certificate of its connection. Every client RPC asks here first; what
//! the caller may then do is decided by the state machine (sessions, tenants, quotas)
//! and by `Who` (admin-only RPCs, which namespace a read looks in).
//!
//! Secrets are compared as hashes (`shell::credentials::secret_hash`) and never
//! logged. Refused credentials are logged on the `audit` target, at most once a second.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock, RwLock};
use std::time::Duration;

use leasehold_proto::errors::{error_status, METADATA_TENANT};
use leasehold_proto::ErrorReason;
use tonic::{Request, Status};

use crate::machine::{Caller, SecretHash, TenantId, ADMIN_TENANT, ADMIN_TENANT_NAME};
use crate::raft::state_machine_store::Shared;
use crate::shell::clock::LogLimiter;
use crate::shell::credentials::{read_admin_token, read_token_file, secret_hash, KnownTenant};
use crate::shell::tls::tenant_presented;

/// The metadata key of the bearer credential: `authorization: Bearer <token>`.
pub const AUTHORIZATION_METADATA_KEY: &str = "authorization";
/// The RPC that answers with the node's own view, whatever it knows of the tenants.
pub const STATUS_RPC: &str = "Admin.Status";

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
    /// The scrape token's file and the hash of what it held when last read: the
    /// metrics port's credential (`may_scrape`).
    scrape_token: Option<(PathBuf, RwLock<SecretHash>)>,
    shared: Arc<Shared>,
    refusals: LogLimiter,
    streams_outlive_revocation: bool,
    /// Whether this node leads, and if not the NOT_LEADER status naming the leader
    /// it knows (`redirect_unknown_credentials`).
    leadership: OnceLock<Leadership>,
}

/// None when this node leads; else the NOT_LEADER status that sends a client on.
type Leadership = Box<dyn Fn() -> Option<Status> + Send + Sync>;

/// How a request authenticated: a bearer token (its hash) or a client certificate.
#[derive(Debug, Clone)]
enum Presented {
    Token(SecretHash),
    /// A client certificate with its tag (the tenant's token when it was made).
    Certificate(Arc<str>),
}

/// The caller of a stream, kept with the credential it presented for as long as the
/// stream lives (`Auth::still_valid`): a unary request is checked as it arrives, a
/// stream would otherwise keep a revoked credential working.
#[derive(Debug, Clone)]
pub struct StreamCredential {
    pub who: Who,
    presented: Presented,
    rpc: &'static str,
    /// The credentials' generation the stream was last found valid at.
    checked: u64,
}

impl Auth {
    /// Reads the admin token from `admin_token_file` (checked with the configuration).
    pub fn new(admin_token_file: PathBuf, shared: Arc<Shared>) -> Result<Auth, String> {
        let token = read_admin_token(&admin_token_file)?;
        Ok(Auth {
            admin_token_file,
            admin_token_hash: RwLock::new(secret_hash(token.as_bytes())),
            scrape_token: None,
            shared,
            refusals: LogLimiter::new(Duration::from_millis(REFUSAL_LOG_INTERVAL_MS)),
            streams_outlive_revocation: false,
            leadership: OnceLock::new(),
        })
    }

    /// From now on a credential this node does not know is answered NOT_LEADER with
    /// `leadership`'s leader, on a node that does not lead (Status excepted, which
    /// is this node's own view): such a node may not have applied the tenant's
    /// addition or its new token yet (it was restarted, replaced or cut off), and
    /// only the leader's answer is final. A client follows the redirect as for any
    /// request a follower does not serve; the leader refuses a credential nobody
    /// has UNAUTHENTICATED.
    pub fn redirect_unknown_credentials(&self, leadership: impl Fn() -> Option<Status> + Send + Sync + 'static) {
        let _ = self.leadership.set(Box::new(leadership));
    }

    /// The refusal of a credential this node does not know: a redirect to the
    /// leader on a node that does not lead, else UNAUTHENTICATED.
    fn unknown<T>(&self, rpc: &str, request: &Request<T>, problem: &str) -> Status {
        if rpc != STATUS_RPC {
            if let Some(redirect) = self.leadership.get().and_then(|leadership| leadership()) {
                return redirect;
            }
        }
        self.refuse(rpc, request, problem)
    }

    /// Reads the scrape token from `file` (checked with the configuration), now and
    /// on every reload.
    pub fn with_scrape_token_file(mut self, file: PathBuf) -> Result<Auth, String> {
        let token = read_token_file("scrape", &file)?;
        self.scrape_token = Some((file, RwLock::new(secret_hash(token.as_bytes()))));
        Ok(self)
    }

    /// Reads the admin token file, and the scrape token's, again (SIGHUP): the old
    /// tokens stop working. A file that does not load leaves its old token working.
    pub fn reload_token_files(&self) -> Result<(), String> {
        let token = read_admin_token(&self.admin_token_file);
        if let Ok(token) = &token {
            *self.admin_token_hash.write().unwrap() = secret_hash(token.as_bytes());
            self.shared.credentials.changed();
        }
        let scrape = match &self.scrape_token {
            None => Ok(()),
            Some((file, hash)) => read_token_file("scrape", file).map(|token| {
                *hash.write().unwrap() = secret_hash(token.as_bytes());
            }),
        };
        token.and(scrape)
    }

    /// Whether a scraper presenting `token` may read the metrics: the scrape token
    /// or the admin's, and anything when no scrape token is configured (only with
    /// --insecure-plaintext).
    pub fn may_scrape(&self, token: &str) -> bool {
        match &self.scrape_token {
            None => true,
            Some((_, hash)) => {
                self.is_admin_token(token)
                    || (!token.is_empty() && secret_hash(token.as_bytes()) == *hash.read().unwrap())
            }
        }
    }

    /// Whether `token` is the admin credential (for the status page, which has no
    /// gRPC request to read it from).
    pub fn is_admin_token(&self, token: &str) -> bool {
        !token.is_empty() && secret_hash(token.as_bytes()) == *self.admin_token_hash.read().unwrap()
    }

    /// Who sent `request` (for `rpc`): its bearer token's owner, else the tenant its
    /// client certificate names. UNAUTHENTICATED for no credential or an unknown one.
    pub fn who<T>(&self, rpc: &str, request: &Request<T>) -> Result<Who, Status> {
        self.identify(rpc, request).map(|(who, _)| who)
    }

    /// Who opened a stream, and the credential it presented, which the stream checks
    /// again (`still_valid`) for as long as it lives.
    pub fn who_for_stream<T>(&self, rpc: &'static str, request: &Request<T>) -> Result<StreamCredential, Status> {
        let checked = self.shared.credentials.generation();
        let (who, presented) = self.identify(rpc, request)?;
        Ok(StreamCredential { who, presented, rpc, checked })
    }

    fn identify<T>(&self, rpc: &str, request: &Request<T>) -> Result<(Who, Presented), Status> {
        if let Some(value) = request.metadata().get(AUTHORIZATION_METADATA_KEY) {
            let token = value.to_str().ok().and_then(|value| value.strip_prefix("Bearer ")).map(str::trim);
            let Some(token) = token.filter(|token| !token.is_empty()) else {
                return Err(self.refuse(rpc, request, "an authorization header that is not `Bearer <token>`"));
            };
            let hash = secret_hash(token.as_bytes());
            if hash == *self.admin_token_hash.read().unwrap() {
                return Ok((Who::Admin, Presented::Token(hash)));
            }
            return match self.shared.credentials.by_token(&hash) {
                Some(tenant) => Ok((Who::Tenant(tenant), Presented::Token(hash))),
                None => Err(self.unknown(rpc, request, "a token no tenant has (never issued, rotated, or removed)")),
            };
        }
        if let Some(chain) = request.peer_certs() {
            let Some(presented) = tenant_presented(&chain) else {
                return Err(self.refuse(rpc, request, "a client certificate that names no tenant"));
            };
            let name = &presented.tenant;
            let Some(tag) = presented.tag else {
                return Err(self.refuse(
                    rpc,
                    request,
                    &format!(
                        "a client certificate naming {name}.tenant.leasehold, without the tag that binds it to the \
                         tenant's token; make a new one with `leasehold cert tenant DIR {name} --token-file FILE`"
                    ),
                ));
            };
            return match self.shared.credentials.by_name(name) {
                Some(tenant) if tenant.certificate_tag.as_deref() == Some(tag.as_str()) => {
                    Ok((Who::Tenant(tenant), Presented::Certificate(Arc::from(tag))))
                }
                Some(_) => Err(self.unknown(
                    rpc,
                    request,
                    &format!(
                        "a client certificate of tenant {name:?} made for a token it no longer has (rotated, or the \
                         tenant removed and added again)"
                    ),
                )),
                None => Err(self.unknown(
                    rpc,
                    request,
                    &format!("a client certificate of tenant {name:?}, which does not exist"),
                )),
            };
        }
        Err(self.refuse(rpc, request, "no credential"))
    }

    /// Whether the credential a stream opened with still authenticates the same
    /// caller: a tenant token rotated or removed since, a tenant removed (even if one
    /// of the same name was added again), or an admin token no longer in the node's
    /// file ends the stream with UNAUTHENTICATED. Looked up only after credentials
    /// changed, so that a stream's many answers cost one atomic read each.
    pub fn still_valid(&self, credential: &mut StreamCredential) -> Result<(), Status> {
        let generation = self.shared.credentials.generation();
        if generation == credential.checked || self.streams_outlive_revocation {
            return Ok(());
        }
        let valid = match (&credential.who, &credential.presented) {
            (Who::Admin, Presented::Token(hash)) => *hash == *self.admin_token_hash.read().unwrap(),
            (Who::Admin, Presented::Certificate(_)) => false,
            (Who::Tenant(tenant), Presented::Token(hash)) => {
                self.shared.credentials.by_token(hash).is_some_and(|now| now.id == tenant.id)
            }
            (Who::Tenant(tenant), Presented::Certificate(tag)) => self
                .shared
                .credentials
                .by_name(&tenant.name)
                .is_some_and(|now| now.id == tenant.id && now.certificate_tag.as_deref() == Some(&**tag)),
        };
        if valid {
            credential.checked = generation;
            return Ok(());
        }
        tracing::info!(
            target: "audit",
            rpc = credential.rpc,
            caller = credential.who.name(),
            "ended a stream whose credential was revoked since it opened"
        );
        Err(error_status(
            ErrorReason::Unauthenticated,
            format!(
                "{}: the credential this stream opened with was revoked (a tenant token rotated or removed, the \
                 tenant removed, or the admin token replaced); open it again with the current credential",
                credential.rpc
            ),
            &[],
        ))
    }

    /// Plants a bug for the simulator's control: streams keep the credential they
    /// opened with, whatever happens to it (`--test-stream-outlives-rotation`).
    pub fn streams_outliving_revocation(mut self) -> Auth {
        self.streams_outlive_revocation = true;
        self
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
                 certificate naming <tenant>.<tag>.tenant.leasehold (`leasehold cert tenant`)"
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
