//! The connection to a cluster: endpoints, leader following and retries with the
//! same request id.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold_proto as pb;
use leasehold_proto::admin_client::AdminClient;
use leasehold_proto::elections_client::ElectionsClient;
use leasehold_proto::errors::{
    error_metadata, error_reason, METADATA_LEADER, METADATA_RETRY_AFTER_MS, METADATA_SESSION_ID,
};
use leasehold_proto::leasehold_client::LeaseholdClient;
use leasehold_proto::semaphores_client::SemaphoresClient;
use leasehold_proto::ErrorReason;
use tokio::time::Instant;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::service::Interceptor;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::{Code, Status};

use crate::error::{Error, Result};
use crate::random;
use crate::session::Session;

/// The metadata key in which a follower names the leader's client address.
pub const LEADER_METADATA_KEY: &str = "leasehold-leader";
/// The endpoints of a cluster started by `cluster.sh`.
pub const DEFAULT_ENDPOINTS: &str = "127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103";
/// How long one request keeps retrying (leader changes, lost connections) by default.
pub const REQUEST_DEADLINE_MS_DEFAULT: u64 = 10_000;
/// How long one attempt may take before it is abandoned and retried.
pub const ATTEMPT_TIMEOUT_MS: u64 = 2_000;
/// The first pause between attempts when no leader is known or an attempt was lost;
/// each further pause of the same request doubles it, up to `RETRY_PAUSE_MS_MAX`, and
/// each is drawn at random from its upper half (see `RetryPause`).
pub const RETRY_PAUSE_MS: u64 = 50;
/// The longest pause between two attempts of one request.
pub const RETRY_PAUSE_MS_MAX: u64 = 800;
/// The longest retry-after a client honours (a server asking for more is waited this).
pub const RETRY_AFTER_MS_CAP: u64 = 5_000;
const _: () = assert!(RETRY_PAUSE_MS <= RETRY_PAUSE_MS_MAX && RETRY_PAUSE_MS_MAX < REQUEST_DEADLINE_MS_DEFAULT);

/// The pauses between the attempts of one request. Each is drawn at random between
/// half and all of a step that doubles from `RETRY_PAUSE_MS` to `RETRY_PAUSE_MS_MAX`:
/// clients that lost the same leader at the same moment come back spread out rather
/// than in lock-step, and a cluster without a leader for a while is asked less and
/// less often.
#[derive(Debug)]
pub(crate) struct RetryPause {
    step_ms: u64,
}

impl RetryPause {
    pub(crate) fn new() -> Self {
        RetryPause { step_ms: RETRY_PAUSE_MS }
    }

    /// The next pause (the step then doubles).
    pub(crate) fn next(&mut self) -> Duration {
        let step_ms = self.step_ms;
        self.step_ms = (step_ms * 2).min(RETRY_PAUSE_MS_MAX);
        Duration::from_millis(random::in_range(step_ms / 2..=step_ms))
    }

    /// The pause before trying again after a server asked for `retry_after_ms`: drawn
    /// at random between that and half as long again (at most `RETRY_AFTER_MS_CAP`), so
    /// that the clients a leader refused at one moment come back spread out.
    pub(crate) fn after(retry_after_ms: u64) -> Duration {
        let retry_after_ms = retry_after_ms.clamp(1, RETRY_AFTER_MS_CAP);
        Duration::from_millis(random::in_range(retry_after_ms..=retry_after_ms + retry_after_ms / 2))
    }

    /// A pause of the first step, drawn the same way, for loops that retry for as long
    /// as they live (a keepalive stream, an observer) and must not fall behind a lease.
    pub(crate) fn first() -> Duration {
        RetryPause::new().next()
    }
}
pub const CONNECT_TIMEOUT_MS: u64 = 500;

/// A connection to one node that presents the client's credential on every request.
pub type Transport = InterceptedService<Channel, Credentials>;

/// How the client connects and what it presents: the CA it trusts (TLS), its client
/// certificate, and its bearer token.
#[derive(Clone, Default)]
pub struct Credentials {
    /// None: plaintext.
    ca_pem: Option<Vec<u8>>,
    identity: Option<(Vec<u8>, Vec<u8>)>,
    /// `Bearer <token>`, sent as `authorization` on every request.
    authorization: Option<MetadataValue<Ascii>>,
}

impl Interceptor for Credentials {
    fn call(&mut self, mut request: tonic::Request<()>) -> std::result::Result<tonic::Request<()>, Status> {
        if let Some(authorization) = &self.authorization {
            request.metadata_mut().insert("authorization", authorization.clone());
        }
        Ok(request)
    }
}

/// A client of one Leasehold cluster. Cheap to clone; clones share connections and
/// the request id sequence.
#[derive(Clone)]
pub struct Client {
    pub(crate) inner: Arc<ClientInner>,
}

/// A connection a `Dialer` made.
pub trait Connection: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static {}

impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static> Connection for T {}

/// Makes the connection to an endpoint (`host:port`) some other way than the
/// operating system's TCP: a simulator's network (`Client::with_dialer`).
pub type Dialer = Arc<
    dyn Fn(String) -> std::pin::Pin<Box<dyn Future<Output = std::io::Result<Box<dyn Connection>>> + Send>>
        + Send
        + Sync,
>;

pub(crate) struct ClientInner {
    endpoints: Vec<String>,
    channels: Mutex<BTreeMap<String, Transport>>,
    /// How connections are made and what every request presents.
    credentials: Credentials,
    /// The endpoint that answered last, or that a follower named as leader.
    preferred: Mutex<usize>,
    /// Random per client, so request ids of two processes never collide.
    client_id: u64,
    sequence: AtomicU64,
    pub(crate) request_deadline: Duration,
    pub(crate) client_name: String,
    /// None: the operating system's TCP. A simulator's network otherwise.
    dialer: Option<Dialer>,
    /// The keepalive task's inbox, while it runs (see `keepalive`).
    pub(crate) keepalives: Mutex<Option<tokio::sync::mpsc::UnboundedSender<crate::keepalive::Command>>>,
}

/// This machine's host name, for the default client name ("host:pid").
fn host_name() -> String {
    let mut buffer = [0u8; 256];
    // SAFETY: gethostname writes at most buffer.len() bytes into the buffer we own.
    let result = unsafe { libc::gethostname(buffer.as_mut_ptr().cast(), buffer.len()) };
    let end = buffer.iter().position(|byte| *byte == 0).unwrap_or(buffer.len());
    match (result, std::str::from_utf8(&buffer[..end])) {
        (0, Ok(name)) if !name.is_empty() => name.to_string(),
        _ => "unknown-host".to_string(),
    }
}

/// Parses "a:1,b:2" (or a list) into endpoints.
pub fn parse_endpoints(text: &str) -> Vec<String> {
    text.split(',').map(|endpoint| endpoint.trim().to_string()).filter(|endpoint| !endpoint.is_empty()).collect()
}

fn strip_scheme(endpoint: &str) -> String {
    endpoint.trim_start_matches("http://").to_string()
}

/// The outcome of one attempt, as the retry loop sees it.
enum Attempt<T> {
    Done(T),
    /// Not applied; try another node.
    Redirect(Option<String>),
    /// Sent but unanswered: may have been applied.
    Lost(String),
    /// Refused as a reuse of its request id: a definite refusal, unless an earlier
    /// attempt of this request went unanswered (then that one may have been applied).
    Reused(Error),
    /// Refused before any work with a time to wait (`OVERLOADED`): not applied; try
    /// again after the pause.
    Later(Duration, Error),
    Failed(Error),
}

impl Client {
    /// Connects to a cluster through any of its nodes' client addresses. Fails if no
    /// node answers.
    pub async fn connect<I, S>(endpoints: I) -> Result<Client>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let client = Client::lazy(endpoints)?;
        client.status_any().await?;
        Ok(client)
    }

    /// Like `connect`, but does not contact the cluster until the first request.
    pub fn lazy<I, S>(endpoints: I) -> Result<Client>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let endpoints: Vec<String> = endpoints.into_iter().map(|endpoint| strip_scheme(endpoint.as_ref())).collect();
        if endpoints.is_empty() {
            return Err(Error::InvalidArgument("no endpoints given".into()));
        }
        let client_id = random::nonzero();
        let client_name = format!("{}:{}", host_name(), std::process::id());
        Ok(Client {
            inner: Arc::new(ClientInner {
                endpoints,
                channels: Mutex::new(BTreeMap::new()),
                credentials: Credentials::default(),
                preferred: Mutex::new(0),
                client_id,
                sequence: AtomicU64::new(1),
                request_deadline: Duration::from_millis(REQUEST_DEADLINE_MS_DEFAULT),
                client_name,
                dialer: None,
                keepalives: Mutex::new(None),
            }),
        })
    }

    /// Makes every connection with `dialer` instead of the operating system's TCP: a
    /// simulator's network. Connections made so carry no TLS.
    pub fn with_dialer(mut self, dialer: Dialer) -> Self {
        Arc::get_mut(&mut self.inner).expect("set before cloning").dialer = Some(dialer);
        self
    }

    /// Sets how long each request keeps retrying across leader changes.
    pub fn with_request_deadline(mut self, deadline: Duration) -> Self {
        Arc::get_mut(&mut self.inner).expect("set before cloning").request_deadline = deadline;
        self
    }

    /// Connects over TLS, trusting only `ca_pem` (the CA that signed the nodes'
    /// client-port certificates); without it the client speaks plaintext, which only a
    /// node started with --insecure-plaintext accepts.
    pub fn with_ca_certificate(mut self, ca_pem: impl Into<Vec<u8>>) -> Self {
        self.credentials_mut().ca_pem = Some(ca_pem.into());
        self
    }

    /// Presents a client certificate (with TLS): a node with --client-ca maps a
    /// certificate naming `<tenant>.<tag>.tenant.leasehold` to that tenant.
    pub fn with_client_certificate(mut self, cert_pem: impl Into<Vec<u8>>, key_pem: impl Into<Vec<u8>>) -> Self {
        self.credentials_mut().identity = Some((cert_pem.into(), key_pem.into()));
        self
    }

    /// Sends `token` (a tenant's or the admin's) as the bearer credential of every
    /// request.
    pub fn with_token(mut self, token: &str) -> Result<Self> {
        let value = MetadataValue::try_from(format!("Bearer {token}"))
            .map_err(|_| Error::InvalidArgument("a token is printable ASCII".into()))?;
        self.credentials_mut().authorization = Some(value);
        Ok(self)
    }

    fn credentials_mut(&mut self) -> &mut Credentials {
        let inner = Arc::get_mut(&mut self.inner).expect("set before cloning");
        assert!(inner.channels.lock().unwrap().is_empty(), "credentials are set before the first request");
        &mut inner.credentials
    }

    /// Sets the name shown for this client's sessions in describe output.
    pub fn with_client_name(mut self, name: impl Into<String>) -> Self {
        Arc::get_mut(&mut self.inner).expect("set before cloning").client_name = name.into();
        self
    }

    pub fn endpoints(&self) -> &[String] {
        &self.inner.endpoints
    }

    pub(crate) fn next_request_id(&self) -> pb::RequestId {
        pb::RequestId { client_id: self.inner.client_id, sequence: self.inner.sequence.fetch_add(1, Ordering::Relaxed) }
    }

    /// The connection to `endpoint`, made on first use and shared afterwards.
    pub(crate) fn channel(&self, endpoint: &str) -> Result<Transport> {
        let mut channels = self.inner.channels.lock().unwrap();
        if let Some(channel) = channels.get(endpoint) {
            return Ok(channel.clone());
        }
        let credentials = &self.inner.credentials;
        let invalid = |error: &dyn std::fmt::Display| Error::InvalidArgument(format!("endpoint {endpoint:?}: {error}"));
        let scheme = if credentials.ca_pem.is_some() { "https" } else { "http" };
        let mut builder = Endpoint::from_shared(format!("{scheme}://{endpoint}"))
            .map_err(|error| invalid(&error))?
            .connect_timeout(Duration::from_millis(CONNECT_TIMEOUT_MS))
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(1))
            .keep_alive_timeout(Duration::from_secs(2))
            .keep_alive_while_idle(true);
        if let Some(ca_pem) = &credentials.ca_pem {
            let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca_pem));
            if let Some((cert_pem, key_pem)) = &credentials.identity {
                tls = tls.identity(Identity::from_pem(cert_pem, key_pem));
            }
            builder = builder.tls_config(tls).map_err(|error| invalid(&error))?;
        }
        let channel = match &self.inner.dialer {
            None => builder.connect_lazy(),
            Some(dialer) => {
                let dialer = dialer.clone();
                builder.connect_with_connector_lazy(tower::service_fn(move |uri: tonic::codegen::http::Uri| {
                    let authority = uri.authority().map(|authority| authority.as_str().to_string()).unwrap_or_default();
                    let dialing = dialer(authority);
                    async move { dialing.await.map(hyper_util::rt::TokioIo::new) }
                }))
            }
        };
        let channel = InterceptedService::new(channel, credentials.clone());
        channels.insert(endpoint.to_string(), channel.clone());
        Ok(channel)
    }

    /// Forgets the connection to `endpoint` after an attempt on it went unanswered:
    /// the next attempt there dials a new one. A connection can be black-holed (a
    /// middlebox that lost its state, a partition that dropped what was in flight)
    /// while the node itself is fine again; reusing it would lose every attempt until
    /// the HTTP/2 keepalive gives up on it, seconds later. Calls still running on the
    /// old connection keep it until they end.
    fn forget_channel(&self, endpoint: &str) {
        self.inner.channels.lock().unwrap().remove(endpoint);
    }

    /// The connection to one node, with this client's TLS and credential, for calling
    /// the generated gRPC clients directly (`leasehold::proto::*_client`): no leader
    /// following, no retries.
    pub fn raw_channel(&self, endpoint: &str) -> Result<Transport> {
        self.channel(endpoint)
    }

    pub(crate) fn preferred_endpoint(&self) -> String {
        let preferred = *self.inner.preferred.lock().unwrap();
        self.inner.endpoints[preferred % self.inner.endpoints.len()].clone()
    }

    fn prefer(&self, endpoint: &str) {
        if let Some(position) = self.inner.endpoints.iter().position(|known| known == endpoint) {
            *self.inner.preferred.lock().unwrap() = position;
        }
    }

    /// After an attempt on `failed` that named no leader: points the next attempt at
    /// the node after it, unless the preference has moved off `failed` meanwhile. The
    /// preference is shared by every clone of the client (requests, the keepalive task,
    /// observers); another caller that moved it (to a leader a node named, or on from
    /// another failure) knows something newer than this failure, which began earlier.
    fn move_off(&self, failed: &str) {
        let count = self.inner.endpoints.len();
        let mut preferred = self.inner.preferred.lock().unwrap();
        if self.inner.endpoints[*preferred % count] == failed {
            *preferred = (*preferred % count + 1) % count;
        }
    }

    /// After a failure on `failed`: points the next attempt at the leader the status
    /// names, or off `failed` (`move_off`).
    pub(crate) fn follow_hint(&self, failed: &str, status: &Status) {
        let leader = leader_named(status);
        match leader.as_deref().and_then(|leader| self.learn_endpoint(leader)) {
            Some(leader) if leader != failed => self.prefer(&leader),
            _ => self.move_off(failed),
        }
    }

    /// Points the next attempt off `failed` (`move_off`).
    pub(crate) fn rotate(&self, failed: &str) {
        self.move_off(failed);
    }

    /// A leader named by a follower that is not among the configured endpoints is
    /// still followed (the cluster may have grown).
    fn learn_endpoint(&self, endpoint: &str) -> Option<String> {
        if self.inner.endpoints.iter().any(|known| known == endpoint) {
            Some(endpoint.to_string())
        } else {
            None
        }
    }

    /// Runs `call` against the leader, following redirects and retrying lost
    /// attempts until the request deadline. `call` must be safe to repeat: mutating
    /// calls carry the same request id on every attempt.
    pub(crate) async fn with_leader<T, F, Fut>(&self, what: &str, deadline: Duration, call: F) -> Result<T>
    where
        F: FnMut(Transport) -> Fut,
        Fut: Future<Output = std::result::Result<T, Status>>,
    {
        self.with_leader_patient(what, deadline, Duration::from_millis(ATTEMPT_TIMEOUT_MS), None, call).await
    }

    /// `with_leader` for calls that may legitimately take long (a blocking acquire):
    /// each attempt may take up to `attempt_timeout`. `session` is the session a
    /// waiting request belongs to: when the server says it ended, the call fails with
    /// `Error::SessionLost`.
    pub(crate) async fn with_leader_patient<T, F, Fut>(
        &self,
        what: &str,
        deadline: Duration,
        attempt_timeout: Duration,
        session: Option<u64>,
        mut call: F,
    ) -> Result<T>
    where
        F: FnMut(Transport) -> Fut,
        Fut: Future<Output = std::result::Result<T, Status>>,
    {
        let give_up = Instant::now() + deadline;
        let mut pause = RetryPause::new();
        let mut sent_unanswered: Option<String> = None;
        let mut last_error;
        let mut redirect: Option<String> = None;
        loop {
            let endpoint = redirect.take().unwrap_or_else(|| self.preferred_endpoint());
            let channel = self.channel(&endpoint)?;
            let left = give_up.saturating_duration_since(Instant::now());
            let limit = left.min(attempt_timeout).max(Duration::from_millis(1));
            let attempt = match tokio::time::timeout(limit, call(channel)).await {
                Ok(Ok(value)) => Attempt::Done(value),
                Ok(Err(status)) => classify(&status, &endpoint, session),
                Err(_) => Attempt::Lost(format!("{endpoint} did not answer within {} ms", limit.as_millis())),
            };
            match attempt {
                Attempt::Done(value) => {
                    self.prefer(&endpoint);
                    return Ok(value);
                }
                // A refusal of a retry as a reused request id means an earlier attempt
                // may have been applied with a different body: not a definite failure.
                Attempt::Reused(error) if sent_unanswered.is_some() => {
                    return Err(Error::Indeterminate(format!("{what}: {error}")));
                }
                Attempt::Reused(error) | Attempt::Failed(error) => return Err(error),
                Attempt::Later(asked, error) => {
                    // The leader refused it before any work: wait what it asked, or
                    // longer as refusals repeat (many clients of one tenant refused
                    // at once then come back spread over a growing time), if the
                    // deadline allows, and try the same node again.
                    let wait = asked.max(pause.next());
                    if Instant::now() + wait >= give_up {
                        return Err(match sent_unanswered {
                            Some(message) => Error::Indeterminate(format!("{what}: {message}")),
                            None => error,
                        });
                    }
                    last_error = error.to_string();
                    redirect = Some(endpoint.clone());
                    tokio::time::sleep(wait).await;
                }
                Attempt::Redirect(leader) => {
                    last_error = format!("{endpoint} is not the leader");
                    match leader.as_deref().and_then(|leader| self.learn_endpoint(leader)) {
                        Some(leader) if leader != endpoint => {
                            self.prefer(&leader);
                            redirect = Some(leader);
                        }
                        // No leader named, or a stale hint that names the node itself:
                        // another node, after a pause for a new leader.
                        _ => {
                            redirect = None;
                            self.move_off(&endpoint);
                            tokio::time::sleep(pause.next()).await;
                        }
                    }
                }
                Attempt::Lost(message) => {
                    last_error = message.clone();
                    sent_unanswered = Some(message);
                    self.forget_channel(&endpoint);
                    self.move_off(&endpoint);
                    tokio::time::sleep(pause.next()).await;
                }
            }
            if Instant::now() >= give_up {
                return Err(match sent_unanswered {
                    Some(message) => Error::Indeterminate(format!("{what}: {message}")),
                    None => Error::Unavailable(format!("{what}: {last_error}")),
                });
            }
        }
    }

    /// Asks the nodes in turn until one answers with its status.
    pub async fn status_any(&self) -> Result<pb::StatusResponse> {
        let mut last = String::new();
        for endpoint in &self.inner.endpoints {
            match self.status_of(endpoint).await {
                Ok(status) => return Ok(status),
                Err(error) => last = error.to_string(),
            }
        }
        Err(Error::Unavailable(format!("no node answered ({last})")))
    }

    /// One node's own view of the cluster.
    pub async fn status_of(&self, endpoint: &str) -> Result<pb::StatusResponse> {
        let mut admin = AdminClient::new(self.channel(endpoint)?);
        let mut request = tonic::Request::new(pb::StatusRequest {});
        request.set_timeout(Duration::from_millis(ATTEMPT_TIMEOUT_MS));
        match tokio::time::timeout(Duration::from_millis(ATTEMPT_TIMEOUT_MS), admin.status(request)).await {
            Ok(Ok(response)) => Ok(response.into_inner()),
            Ok(Err(status)) => Err(Error::Unavailable(format!("{endpoint}: {}", status.message()))),
            Err(_) => Err(Error::Unavailable(format!("{endpoint}: no answer"))),
        }
    }

    /// Creates a session with `ttl` and keeps it alive in the background until it is
    /// closed or dropped.
    pub async fn session(&self, ttl: Duration) -> Result<Session> {
        Session::create(self.clone(), ttl).await
    }

    pub(crate) fn leasehold(channel: Transport) -> LeaseholdClient<Transport> {
        LeaseholdClient::new(channel)
    }

    pub(crate) fn semaphores(channel: Transport) -> SemaphoresClient<Transport> {
        SemaphoresClient::new(channel)
    }

    pub(crate) fn elections(channel: Transport) -> ElectionsClient<Transport> {
        ElectionsClient::new(channel)
    }

    pub(crate) fn admin(channel: Transport) -> AdminClient<Transport> {
        AdminClient::new(channel)
    }

    /// Whether `token` is still the current grant of lock `name` (linearizable).
    pub async fn check_fence(&self, name: &str, token: u64) -> Result<pb::CheckFenceResponse> {
        let request = pb::CheckFenceRequest { name: name.to_string(), token, ..Default::default() };
        self.with_leader("check fence", self.inner.request_deadline, |channel| {
            let request = request.clone();
            async move { Client::leasehold(channel).check_fence(request).await.map(|response| response.into_inner()) }
        })
        .await
    }

    pub async fn describe_lock(&self, name: &str, stale: bool) -> Result<pb::DescribeLockResponse> {
        let request = pb::DescribeLockRequest { name: name.to_string(), stale, ..Default::default() };
        self.with_leader("describe lock", self.inner.request_deadline, |channel| {
            let request = request.clone();
            async move { Client::leasehold(channel).describe_lock(request).await.map(|response| response.into_inner()) }
        })
        .await
    }

    pub async fn describe_session(&self, session_id: u64) -> Result<pb::SessionInfo> {
        let request = pb::DescribeSessionRequest { session_id, stale: false };
        let response = self
            .with_leader("describe session", self.inner.request_deadline, |channel| async move {
                Client::leasehold(channel).describe_session(request).await.map(|response| response.into_inner())
            })
            .await?;
        response.session.ok_or_else(|| Error::NotFound(format!("session {session_id}")))
    }

    /// Every session this client's credential may see (its tenant's; the admin's sees
    /// every tenant's), in order of id, read a page at a time.
    pub async fn list_sessions(&self) -> Result<Vec<pb::SessionInfo>> {
        let mut sessions = Vec::new();
        let mut page_token = 0;
        loop {
            let request = pb::ListSessionsRequest { stale: false, page_size: 0, page_token, tenant: String::new() };
            let page = self
                .with_leader("list sessions", self.inner.request_deadline, |channel| {
                    let request = request.clone();
                    async move {
                        Client::leasehold(channel).list_sessions(request).await.map(|response| response.into_inner())
                    }
                })
                .await?;
            sessions.extend(page.sessions);
            if page.next_page_token == 0 {
                return Ok(sessions);
            }
            page_token = page.next_page_token;
        }
    }

    /// Adds a tenant (admin credential); the answer carries its token, shown only here.
    pub async fn add_tenant(&self, name: &str, quotas: pb::Quotas) -> Result<pb::AddTenantResponse> {
        let request = pb::AddTenantRequest {
            request_id: Some(self.next_request_id()),
            name: name.to_string(),
            quotas: Some(quotas),
        };
        self.with_leader("add tenant", self.inner.request_deadline, |channel| {
            let request = request.clone();
            async move { Client::admin(channel).add_tenant(request).await.map(|response| response.into_inner()) }
        })
        .await
    }

    /// Every tenant with its quotas and usage (admin credential).
    pub async fn list_tenants(&self) -> Result<Vec<pb::TenantInfo>> {
        let response = self
            .with_leader("list tenants", self.inner.request_deadline, |channel| async move {
                Client::admin(channel)
                    .list_tenants(pb::ListTenantsRequest {})
                    .await
                    .map(|response| response.into_inner())
            })
            .await?;
        Ok(response.tenants)
    }

    /// Replaces a tenant's token (admin credential); returns the new one.
    pub async fn rotate_tenant_token(&self, name: &str) -> Result<String> {
        let request = pb::RotateTenantTokenRequest { request_id: Some(self.next_request_id()), name: name.to_string() };
        let response = self
            .with_leader("rotate tenant token", self.inner.request_deadline, |channel| {
                let request = request.clone();
                async move {
                    Client::admin(channel).rotate_tenant_token(request).await.map(|response| response.into_inner())
                }
            })
            .await?;
        Ok(response.token)
    }

    /// Changes some of a tenant's quotas (admin credential); a quota given as 0 keeps
    /// its value.
    pub async fn set_tenant_quotas(&self, name: &str, quotas: pb::Quotas) -> Result<pb::TenantInfo> {
        let request = pb::SetTenantQuotasRequest {
            request_id: Some(self.next_request_id()),
            name: name.to_string(),
            quotas: Some(quotas),
        };
        let response = self
            .with_leader("set tenant quotas", self.inner.request_deadline, |channel| {
                let request = request.clone();
                async move { Client::admin(channel).set_tenant_quotas(request).await.map(|response| response.into_inner()) }
            })
            .await?;
        response.tenant.ok_or_else(|| Error::Other("the answer names no tenant".into()))
    }

    /// Removes a tenant (admin credential): its sessions end; returns how many.
    pub async fn remove_tenant(&self, name: &str) -> Result<u64> {
        let request = pb::RemoveTenantRequest { request_id: Some(self.next_request_id()), name: name.to_string() };
        let response = self
            .with_leader("remove tenant", self.inner.request_deadline, |channel| {
                let request = request.clone();
                async move { Client::admin(channel).remove_tenant(request).await.map(|response| response.into_inner()) }
            })
            .await?;
        Ok(response.sessions_ended)
    }

    /// Ends session `session_id` of tenant `tenant` (admin credential), as if it had
    /// expired: what it holds goes to the next waiters, after the lock-delays its
    /// grants asked for. `Error::NotFound` when the session is not that tenant's live
    /// session (also when an earlier attempt ended it and its answer was lost).
    pub async fn end_session(&self, tenant: &str, session_id: u64) -> Result<()> {
        let request =
            pb::EndSessionRequest { request_id: Some(self.next_request_id()), tenant: tenant.to_string(), session_id };
        self.with_leader("end session", self.inner.request_deadline, |channel| {
            let request = request.clone();
            async move { Client::admin(channel).end_session(request).await.map(|response| response.into_inner()) }
        })
        .await?;
        Ok(())
    }

    pub async fn add_member(
        &self,
        node_id: u64,
        client_addr: &str,
        peer_addr: &str,
        learner_only: bool,
    ) -> Result<Vec<pb::Member>> {
        let request = pb::AddMemberRequest {
            node_id,
            client_addr: client_addr.into(),
            peer_addr: peer_addr.into(),
            learner_only,
        };
        // The leader answers once the node caught up (or made no progress for 10 s):
        // an attempt may take that long.
        let response = self
            .with_leader_patient("add member", Duration::from_secs(120), Duration::from_secs(60), None, |channel| {
                let request = request.clone();
                async move {
                    let mut request = tonic::Request::new(request);
                    request.set_timeout(Duration::from_secs(60));
                    Client::admin(channel).add_member(request).await.map(|response| response.into_inner())
                }
            })
            .await?;
        Ok(response.members)
    }

    /// The fault suite's clock knob on one node (refused unless it runs with
    /// --test-clock-knob).
    pub async fn skew_clock(&self, endpoint: &str, rate_per_mille: u64, jump_ms: u64) -> Result<()> {
        let mut admin = Client::admin(self.channel(endpoint)?);
        admin
            .skew_clock(pb::SkewClockRequest { rate_per_mille, jump_ms })
            .await
            .map(|_| ())
            .map_err(|status| Error::from_status(&status))
    }

    /// The disk fault knob of the fault suite on the node at `endpoint`: from now on
    /// its fsyncs take `sync_delay_ms` longer (0 ends it). Refused unless the node was
    /// started with --test-disk-knob.
    pub async fn slow_disk(&self, endpoint: &str, sync_delay_ms: u64) -> Result<()> {
        let mut admin = Client::admin(self.channel(endpoint)?);
        admin
            .slow_disk(pb::SlowDiskRequest { sync_delay_ms })
            .await
            .map(|_| ())
            .map_err(|status| Error::from_status(&status))
    }

    /// The whole replicated state at a linearizable point, as a backup file
    /// (`leasehold-server restore` reads it), with the admin credential. What arrived
    /// is checked against the size and SHA-256 the leader sent with the first piece.
    pub async fn snapshot(&self) -> Result<Snapshot> {
        let received = self
            .with_leader_patient(
                "snapshot",
                Duration::from_secs(300),
                Duration::from_secs(240),
                None,
                |channel| async move {
                    let mut request = tonic::Request::new(pb::SnapshotRequest {});
                    request.set_timeout(Duration::from_secs(240));
                    let mut stream = Client::admin(channel).snapshot(request).await?.into_inner();
                    let mut first: Option<pb::SnapshotChunk> = None;
                    let mut file = Vec::new();
                    while let Some(mut chunk) = stream.message().await? {
                        file.append(&mut chunk.data);
                        first.get_or_insert(chunk);
                    }
                    Ok((first.unwrap_or_default(), file))
                },
            )
            .await?;
        let (first, file) = received;
        let sha256: String = ring::digest::digest(&ring::digest::SHA256, &file)
            .as_ref()
            .iter()
            .map(|byte| format!("{byte:02x}"))
            .collect();
        if file.len() as u64 != first.total_bytes || sha256 != first.sha256 {
            return Err(Error::Other(format!(
                "snapshot: received {} bytes with SHA-256 {sha256}, the leader sent {} bytes with SHA-256 {}",
                file.len(),
                first.total_bytes,
                first.sha256
            )));
        }
        Ok(Snapshot { file, index: first.index, cluster_id: first.cluster_id, sha256 })
    }

    pub async fn remove_member(&self, node_id: u64) -> Result<Vec<pb::Member>> {
        let request = pb::RemoveMemberRequest { node_id };
        let response = self
            .with_leader_patient(
                "remove member",
                Duration::from_secs(60),
                Duration::from_secs(30),
                None,
                |channel| async move {
                    // The leader waits for the voters to answer a probe before it changes anything.
                    let mut request = tonic::Request::new(request);
                    request.set_timeout(Duration::from_secs(30));
                    Client::admin(channel).remove_member(request).await.map(|response| response.into_inner())
                },
            )
            .await?;
        Ok(response.members)
    }
}

/// What one attempt's error status means for the retry loop, decided on the status's
/// `ErrorReason` and never on its message. `session` is the session a waiting request
/// belongs to: its end is `Error::SessionLost`.
fn classify<T>(status: &Status, endpoint: &str, session: Option<u64>) -> Attempt<T> {
    let lost = || Attempt::Lost(format!("{endpoint}: {}", status.message()));
    let Some(reason) = error_reason(status) else {
        // Not from a Leasehold handler. A connection that could not be made never
        // carried the request: try the next node. A broken connection or a deadline
        // (tonic reports both as statuses) may or may not have reached the node.
        if never_connected(status) {
            return Attempt::Redirect(None);
        }
        return match status.code() {
            Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::Unknown | Code::Internal => lost(),
            _ => Attempt::Failed(Error::from_status(status)),
        };
    };
    match reason {
        // Definite: nothing was applied; go to the leader the node names.
        ErrorReason::NotLeader => Attempt::Redirect(leader_named(status)),
        ErrorReason::ShuttingDown
        | ErrorReason::CommitUncertain
        | ErrorReason::LeadershipUnconfirmed
        | ErrorReason::ReadNotApplied
        | ErrorReason::Internal => lost(),
        ErrorReason::RequestIdReused => Attempt::Reused(Error::from_status(status)),
        ErrorReason::Overloaded | ErrorReason::RateLimited => {
            let retry_after_ms = error_metadata(status, METADATA_RETRY_AFTER_MS)
                .and_then(|value| value.parse::<u64>().ok())
                .unwrap_or(RETRY_PAUSE_MS);
            Attempt::Later(RetryPause::after(retry_after_ms), Error::from_status(status))
        }
        ErrorReason::UnknownSession | ErrorReason::SessionEnded
            if session.is_some()
                && error_metadata(status, METADATA_SESSION_ID) == session.map(|session| session.to_string()) =>
        {
            Attempt::Failed(Error::SessionLost(session.expect("checked above")))
        }
        _ => Attempt::Failed(Error::from_status(status)),
    }
}

/// Whether the status is a failure to connect (refused, unreachable, timed out, the
/// TLS handshake), read from its source chain: the request was never sent. tonic
/// wraps every error of making a connection in `ConnectError`.
fn never_connected(status: &Status) -> bool {
    use std::io::ErrorKind;
    let mut source = std::error::Error::source(status);
    while let Some(error) = source {
        if error.downcast_ref::<tonic::ConnectError>().is_some() {
            return true;
        }
        if let Some(io) = error.downcast_ref::<std::io::Error>() {
            return matches!(
                io.kind(),
                ErrorKind::ConnectionRefused
                    | ErrorKind::HostUnreachable
                    | ErrorKind::NetworkUnreachable
                    | ErrorKind::AddrNotAvailable
            );
        }
        source = error.source();
    }
    false
}

/// The leader's client address a not-leader answer names, if it names one.
fn leader_named(status: &Status) -> Option<String> {
    let from_details = error_metadata(status, METADATA_LEADER);
    let from_header =
        || status.metadata().get(LEADER_METADATA_KEY).and_then(|value| value.to_str().ok()).map(String::from);
    from_details.or_else(from_header).filter(|leader| !leader.is_empty())
}

#[cfg(test)]
mod tests {
    use leasehold_proto::errors::error_status;

    use super::*;

    const OWN_SESSION: u64 = 7;

    #[test]
    fn a_failure_does_not_move_the_preference_off_a_leader_another_caller_learned() {
        let client = Client::lazy(["n1:1", "n2:1", "n3:1"]).unwrap();
        // A request's attempt on n1 is under way; meanwhile an observer hears that n3 leads.
        client.prefer("n3:1");
        // The request's attempt on n1 then fails: n3 stays preferred (it used to become n1).
        client.move_off("n1:1");
        assert_eq!(client.preferred_endpoint(), "n3:1");
        // A failure on the preferred node itself moves on to the next one.
        client.move_off("n3:1");
        assert_eq!(client.preferred_endpoint(), "n1:1");
        client.rotate("n1:1");
        assert_eq!(client.preferred_endpoint(), "n2:1");
    }

    /// A connection that timed out while it was being made never carried the request:
    /// the next node is tried, and the request is not counted as sent (a deadline on
    /// a request that was sent is).
    #[test]
    fn a_connect_timeout_is_a_request_never_sent() {
        let timed_out = std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out");
        let status = Status::from_error(Box::new(tonic::ConnectError(Box::new(timed_out))));
        assert_eq!(status.code(), Code::Unavailable);
        assert_eq!(shape(classify(&status, "n1", None)), "redirect to None");
        let sent = Status::deadline_exceeded("no answer in time");
        assert_eq!(shape(classify(&sent, "n1", None)), "lost");
    }

    #[test]
    fn retry_pauses_grow_to_their_bound_and_are_spread_at_random() {
        let mut pause = RetryPause::new();
        let mut step_ms = RETRY_PAUSE_MS;
        for _ in 0..12 {
            let next = pause.next().as_millis() as u64;
            assert!(next >= step_ms / 2 && next <= step_ms, "{next} ms from a step of {step_ms} ms");
            step_ms = (step_ms * 2).min(RETRY_PAUSE_MS_MAX);
        }
        // Clients that start retrying together do not all wait the same: 200 first
        // pauses of 26 possible values (25 to 50 ms) all equal would be a broken draw.
        let firsts: std::collections::BTreeSet<u128> = (0..200).map(|_| RetryPause::first().as_millis()).collect();
        assert!(firsts.len() > 5, "first pauses drawn: {firsts:?}");
        assert!(firsts.iter().all(|ms| (RETRY_PAUSE_MS as u128 / 2..=RETRY_PAUSE_MS as u128).contains(ms)));
    }

    #[test]
    fn an_overloaded_refusal_is_tried_again_after_its_retry_after_with_jitter() {
        let waits: std::collections::BTreeSet<u128> = (0..200)
            .map(|_| match classify::<()>(&status(ErrorReason::Overloaded, "queue full"), "n1", None) {
                Attempt::Later(wait, Error::Overloaded(_)) => wait.as_millis(),
                _ => panic!("OVERLOADED is tried again later"),
            })
            .collect();
        assert!(waits.iter().all(|ms| (40..=60).contains(ms)), "the server asked for 40 ms: {waits:?}");
        assert!(waits.len() > 5, "clients refused together come back spread out: {waits:?}");
        let capped = RetryPause::after(60_000).as_millis() as u64;
        assert!((RETRY_AFTER_MS_CAP..=RETRY_AFTER_MS_CAP * 3 / 2).contains(&capped), "{capped} ms for 60 s asked");
    }

    /// What the retry loop does with an attempt, with the error's variant.
    fn shape(attempt: Attempt<()>) -> String {
        match attempt {
            Attempt::Done(()) => "done".into(),
            Attempt::Redirect(leader) => format!("redirect to {leader:?}"),
            Attempt::Lost(_) => "lost".into(),
            Attempt::Reused(error) => format!("reused: {}", variant(&error)),
            Attempt::Later(_, error) => format!("later: {}", variant(&error)),
            Attempt::Failed(error) => format!("failed: {}", variant(&error)),
        }
    }

    fn variant(error: &Error) -> String {
        let text = format!("{error:?}");
        text[..text.find('(').unwrap_or(text.len())].to_string()
    }

    fn every_reason() -> Vec<ErrorReason> {
        (1..).map_while(|value| ErrorReason::try_from(value).ok()).collect()
    }

    fn status(reason: ErrorReason, message: &str) -> Status {
        let metadata = [
            (METADATA_SESSION_ID, OWN_SESSION.to_string()),
            (METADATA_LEADER, "127.0.0.1:7102".to_string()),
            (leasehold_proto::errors::METADATA_LEADER_ID, "2".to_string()),
            (METADATA_RETRY_AFTER_MS, "40".to_string()),
        ];
        let sent = error_status(reason, message, &metadata);
        // As it arrives: code, message and the details' bytes.
        Status::with_details(sent.code(), sent.message(), sent.details().to_vec().into())
    }

    #[test]
    fn classification_follows_the_reason_whatever_the_message_says() {
        let rewordings = [
            "",
            "reworded entirely",
            // Texts the client once matched on, now under reasons that mean otherwise.
            "node 1 is not the leader",
            "request id (client 1, sequence 2) was already used for a different command",
            "session 7 ended (expired or closed) while waiting for lock \"a\"",
            "session 7 does not exist",
        ];
        for reason in every_reason() {
            let original = shape(classify(&status(reason, "the server's own words"), "n1", Some(OWN_SESSION)));
            for reworded in rewordings {
                let again = shape(classify(&status(reason, reworded), "n1", Some(OWN_SESSION)));
                assert_eq!(again, original, "{reason:?} with the message {reworded:?}");
                let error = Error::from_status(&status(reason, reworded));
                assert_eq!(variant(&error), variant(&Error::from_status(&status(reason, "x"))), "{reason:?}");
            }
        }
    }

    #[test]
    fn each_reason_gets_the_treatment_it_documents() {
        let classify_as = |reason, session| shape(classify(&status(reason, "x"), "n1", session));
        assert_eq!(classify_as(ErrorReason::NotLeader, None), "redirect to Some(\"127.0.0.1:7102\")");
        for maybe_applied in [ErrorReason::ShuttingDown, ErrorReason::CommitUncertain] {
            assert_eq!(classify_as(maybe_applied, None), "lost", "{maybe_applied:?} is retried with the same id");
        }
        assert_eq!(classify_as(ErrorReason::RequestIdReused, None), "reused: Refused");
        assert_eq!(classify_as(ErrorReason::Overloaded, None), "later: Overloaded", "tried again after a pause");
        assert_eq!(classify_as(ErrorReason::RateLimited, None), "later: Overloaded", "tried again after a pause");
        assert_eq!(classify_as(ErrorReason::UnknownSession, Some(OWN_SESSION)), "failed: SessionLost");
        assert_eq!(classify_as(ErrorReason::SessionEnded, Some(OWN_SESSION)), "failed: SessionLost");
        assert_eq!(classify_as(ErrorReason::UnknownSession, Some(8)), "failed: NotFound", "another session");
        assert_eq!(classify_as(ErrorReason::UnknownSession, None), "failed: NotFound");
        assert_eq!(classify_as(ErrorReason::NotHolder, None), "failed: Refused");
        assert_eq!(classify_as(ErrorReason::LimitExceeded, None), "failed: LimitReached");
        assert_eq!(classify_as(ErrorReason::InvalidArgument, None), "failed: InvalidArgument");
    }

    #[test]
    fn a_status_without_a_reason_is_classed_by_its_code_not_its_message() {
        // A broken connection is UNAVAILABLE too; saying "is not the leader" does not
        // make it a definite refusal.
        let transport = Status::unavailable("node 1 is not the leader");
        assert_eq!(shape(classify(&transport, "n1", None)), "lost");
        let refused = Status::failed_precondition("was already used for a different command");
        assert_eq!(shape(classify(&refused, "n1", None)), "failed: Refused");
    }
}

/// A backup file as `Client::snapshot` received and checked it.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub file: Vec<u8>,
    /// The log index the state was read at.
    pub index: u64,
    /// The cluster's id (32 hex digits), empty if none was recorded.
    pub cluster_id: String,
    /// The file's SHA-256, hex.
    pub sha256: String,
}
