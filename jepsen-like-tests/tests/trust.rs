//! The trust boundary (DESIGN.md, Trust; invariant 7) through real `leasehold-server`
//! processes with TLS and credentials: who may call at all, tenants' namespaces,
//! session secrets, certificates replaced on SIGHUP, quotas and the state budget.
//!
//! Every refusal is checked for its gRPC code and its `ErrorReason` (each stated here,
//! not derived from the server's own mapping), and for having changed nothing: the
//! state is read before and after. Refusals are sent with the generated gRPC clients
//! (`Raw`), so what a test sees is the server's answer, not the client library's.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::channel::mpsc;
use leasehold::client::Transport;
use leasehold::proto::admin_client::AdminClient;
use leasehold::proto::elections_client::ElectionsClient;
use leasehold::proto::errors::{error_metadata, error_reason, METADATA_LEADER, METADATA_SESSION_ID, METADATA_TENANT};
use leasehold::proto::leasehold_client::LeaseholdClient;
use leasehold::proto::{self as pb, acquire_response::Outcome, ErrorReason};
use leasehold::{certs, Client, SessionState, Settings};
use leasehold_jepsen::cluster::{ClusterOptions, TestCluster, TEST_TENANT};
use leasehold_jepsen::wait;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};
use tonic::{Code, Status, Streaming};

const LEADER_DEADLINE: Duration = Duration::from_secs(30);
/// How long a condition (a reload, an expiry, a queued wait) may take on a loaded
/// machine before the test gives up.
const CONDITION_DEADLINE: Duration = Duration::from_secs(30);
/// How long a raw call keeps looking for the leader (NOT_LEADER answers).
const CALL_DEADLINE: Duration = Duration::from_secs(30);
/// How long one keepalive or Observe message may take to arrive.
const ANSWER_DEADLINE: Duration = Duration::from_secs(10);
/// A raw session nobody keeps alive, which must outlive its test.
const LONG_TTL_MS: u64 = 600_000;
/// A session that must expire within the test: short, yet long enough for a loaded
/// machine to answer its keepalives in time.
const SHORT_TTL_MS: u64 = 2_000;
/// Shown for raw sessions in describe output.
const RAW_CLIENT_NAME: &str = "trust-test";

/// A refusal as the API documents it: the gRPC code and the reason that comes with it.
type Refusal = (Code, ErrorReason);
const UNAUTHENTICATED: Refusal = (Code::Unauthenticated, ErrorReason::Unauthenticated);
const PERMISSION_DENIED: Refusal = (Code::PermissionDenied, ErrorReason::PermissionDenied);
const WRONG_SESSION_SECRET: Refusal = (Code::PermissionDenied, ErrorReason::WrongSessionSecret);
const QUOTA_EXCEEDED: Refusal = (Code::ResourceExhausted, ErrorReason::QuotaExceeded);
const BUDGET_EXCEEDED: Refusal = (Code::ResourceExhausted, ErrorReason::BudgetExceeded);
const UNKNOWN_SESSION: Refusal = (Code::NotFound, ErrorReason::UnknownSession);
const UNKNOWN_TENANT: Refusal = (Code::NotFound, ErrorReason::UnknownTenant);

// ---------------------------------------------------------------- helpers

/// Asserts that `result` was refused with one of `allowed` (its code and its reason),
/// and returns the status for its metadata.
fn refused<T>(result: Result<T, Status>, allowed: &[Refusal], what: &str) -> Status {
    let status = match result {
        Ok(_) => panic!("{what}: was answered, but must be refused with {allowed:?}"),
        Err(status) => status,
    };
    let reason = error_reason(&status)
        .unwrap_or_else(|| panic!("{what}: refused without a Leasehold reason, expected {allowed:?}: {status:?}"));
    assert!(
        allowed.contains(&(status.code(), reason)),
        "{what}: refused with {:?} / {reason:?}, expected one of {allowed:?}: {status:?}",
        status.code()
    );
    status
}

/// Asserts that `result` failed below the gRPC handlers (no connection, no TLS): a
/// status that carries no Leasehold reason.
fn transport_failure<T>(result: Result<T, Status>, what: &str) -> Status {
    let status = match result {
        Ok(_) => panic!("{what}: was answered, but must fail to connect"),
        Err(status) => status,
    };
    assert_eq!(error_reason(&status), None, "{what}: answered by a handler, not refused by the transport: {status:?}");
    status
}

fn metadata(status: &Status, key: &str) -> String {
    error_metadata(status, key).unwrap_or_else(|| panic!("no ErrorInfo metadata {key:?} in {status:?}"))
}

/// The token of a granted acquire.
fn granted(response: pb::AcquireResponse) -> u64 {
    match response.outcome {
        Some(Outcome::Granted(granted)) => granted.token,
        other => panic!("expected a grant, got {other:?}"),
    }
}

/// A lock's holder as (session, token).
fn holder(lock: &pb::DescribeLockResponse) -> Option<(u64, u64)> {
    lock.holder.as_ref().map(|holder| (holder.session_id, holder.token))
}

fn session_ids(sessions: &[pb::SessionInfo]) -> Vec<u64> {
    sessions.iter().map(|session| session.session_id).collect()
}

/// A cluster of three real nodes with a leader and the test tenant.
async fn started(options: ClusterOptions) -> TestCluster {
    let cluster = TestCluster::start(options);
    cluster.wait_for_leader(LEADER_DEADLINE).await;
    cluster
}

/// Settings that trust the cluster's CA and present `token`.
fn token_settings(cluster: &TestCluster, token: &str) -> Settings {
    Settings {
        endpoints: cluster.endpoints(),
        ca_file: Some(cluster.credentials.ca_file.clone()),
        token: Some(token.to_string()),
        ..Settings::default()
    }
}

/// The client library acting as the tenant whose token is `token`.
fn tenant_client(cluster: &TestCluster, token: &str) -> Client {
    token_settings(cluster, token).client().expect("valid client settings")
}

/// Adds tenant `name` as the admin and returns its token.
async fn add_tenant(cluster: &TestCluster, name: &str, quotas: pb::Quotas) -> String {
    let added =
        cluster.admin_client().add_tenant(name, quotas).await.unwrap_or_else(|error| panic!("add {name}: {error}"));
    added.token
}

/// A session as the raw API knows it: its id and the secret that acts for it.
#[derive(Debug, Clone)]
struct RawSession {
    id: u64,
    secret: Vec<u8>,
}

impl RawSession {
    /// The same session id presented with another secret.
    fn with_secret(&self, secret: Vec<u8>) -> RawSession {
        RawSession { id: self.id, secret }
    }
}

impl From<&leasehold::Session> for RawSession {
    fn from(session: &leasehold::Session) -> RawSession {
        RawSession { id: session.id(), secret: session.secret() }
    }
}

/// One keepalive stream: each request is answered in order.
struct Keepalives {
    requests: mpsc::UnboundedSender<pb::KeepAliveRequest>,
    answers: Streaming<pb::KeepAliveResponse>,
}

impl Keepalives {
    async fn send(&mut self, session: &RawSession) -> pb::KeepAliveResponse {
        self.try_send(session).await.expect("no error on the keepalive stream").expect("the keepalive stream goes on")
    }

    /// The answer to one keepalive as the stream gives it: an answer, an error, or
    /// the end of the stream.
    async fn try_send(&mut self, session: &RawSession) -> Result<Option<pb::KeepAliveResponse>, Status> {
        let request = pb::KeepAliveRequest { session_id: session.id, session_secret: session.secret.clone() };
        self.requests.unbounded_send(request).expect("the keepalive stream is open");
        tokio::time::timeout(ANSWER_DEADLINE, self.answers.message()).await.expect("a keepalive is answered in time")
    }
}

/// The next message of an Observe stream.
async fn observed(stream: &mut Streaming<pb::ObserveResponse>) -> pb::ObserveResponse {
    tokio::time::timeout(ANSWER_DEADLINE, stream.message())
        .await
        .expect("an Observe message in time")
        .expect("no error on the Observe stream")
        .expect("the Observe stream goes on")
}

/// One credential's calls through the generated gRPC clients, on the leader: an answer
/// NOT_LEADER (or another "ask again, nothing was applied") is followed to the node it
/// names, so a refusal a test sees is the server's verdict on the credential, never a
/// leader change. Anything else comes back as the server sent it.
#[derive(Clone)]
struct Raw {
    /// TLS (or not) and the credential (or none) of every call.
    client: Client,
    endpoints: Arc<Vec<String>>,
    /// The position in `endpoints` of the node believed to lead.
    leader: Arc<Mutex<usize>>,
    /// Request ids: random per `Raw`, so two never collide.
    client_id: u64,
    sequence: Arc<AtomicU64>,
}

impl Raw {
    fn with_settings(settings: Settings) -> Raw {
        let endpoints = Arc::new(settings.endpoints.clone());
        let client = settings.client().expect("valid client settings");
        Raw {
            client,
            endpoints,
            leader: Arc::new(Mutex::new(0)),
            client_id: rand::random::<u64>() | 1,
            sequence: Arc::new(AtomicU64::new(1)),
        }
    }

    fn admin(cluster: &TestCluster) -> Raw {
        Raw::with_settings(cluster.credentials.settings(cluster.endpoints(), true))
    }

    fn test_tenant(cluster: &TestCluster) -> Raw {
        Raw::with_settings(cluster.credentials.settings(cluster.endpoints(), false))
    }

    fn with_token(cluster: &TestCluster, token: &str) -> Raw {
        Raw::with_settings(token_settings(cluster, token))
    }

    /// TLS that trusts the cluster's CA, and no credential at all.
    fn without_credential(cluster: &TestCluster) -> Raw {
        Raw::with_settings(Settings {
            endpoints: cluster.endpoints(),
            ca_file: Some(cluster.credentials.ca_file.clone()),
            ..Settings::default()
        })
    }

    fn request_id(&self) -> Option<pb::RequestId> {
        Some(pb::RequestId { client_id: self.client_id, sequence: self.sequence.fetch_add(1, Ordering::Relaxed) })
    }

    fn endpoint(&self) -> String {
        self.endpoints[*self.leader.lock().unwrap() % self.endpoints.len()].clone()
    }

    /// Whether `status` (from `endpoint`) means "ask the leader, nothing was applied";
    /// if so, points the next call at the leader it names, or at the next node.
    fn redirected(&self, status: &Status, endpoint: &str) -> bool {
        let elsewhere = matches!(
            error_reason(status),
            Some(ErrorReason::NotLeader | ErrorReason::LeadershipUnconfirmed | ErrorReason::ReadNotApplied)
        );
        if elsewhere {
            let named = error_metadata(status, METADATA_LEADER)
                .filter(|leader| leader != endpoint)
                .and_then(|leader| self.endpoints.iter().position(|known| *known == leader));
            let mut leader = self.leader.lock().unwrap();
            *leader = named.unwrap_or((*leader + 1) % self.endpoints.len());
        }
        elsewhere
    }

    /// Calls `rpc` with `request` on the leader.
    async fn call<Request, Answer, Reply>(
        &self,
        request: Request,
        rpc: impl Fn(Transport, Request) -> Reply,
    ) -> Result<Answer, Status>
    where
        Request: Clone,
        Reply: Future<Output = Result<tonic::Response<Answer>, Status>>,
    {
        let give_up = Instant::now() + CALL_DEADLINE;
        loop {
            let endpoint = self.endpoint();
            let channel = self.client.raw_channel(&endpoint).expect("a channel to the node");
            match rpc(channel, request.clone()).await {
                Ok(response) => return Ok(response.into_inner()),
                Err(status) if self.redirected(&status, &endpoint) && Instant::now() < give_up => {
                    tokio::time::sleep(Duration::from_millis(wait::POLL_INTERVAL_MS)).await;
                }
                Err(status) => return Err(status),
            }
        }
    }

    // ------------------------------------------------ Leasehold

    async fn create_named_session(&self, ttl_ms: u64, client_name: &str) -> Result<RawSession, Status> {
        let request =
            pb::CreateSessionRequest { request_id: self.request_id(), ttl_ms, client_name: client_name.to_string() };
        let created =
            self.call(request, |channel, request| async move {
                LeaseholdClient::new(channel).create_session(request).await
            })
            .await?;
        Ok(RawSession { id: created.session_id, secret: created.session_secret })
    }

    async fn create_session(&self, ttl_ms: u64) -> Result<RawSession, Status> {
        self.create_named_session(ttl_ms, RAW_CLIENT_NAME).await
    }

    /// A keepalive stream on the leader.
    async fn keep_alive(&self) -> Result<Keepalives, Status> {
        let give_up = Instant::now() + CALL_DEADLINE;
        loop {
            let endpoint = self.endpoint();
            let (requests, outgoing) = mpsc::unbounded();
            let mut client = LeaseholdClient::new(self.client.raw_channel(&endpoint).expect("a channel to the node"));
            match client.keep_alive(outgoing).await {
                Ok(response) => return Ok(Keepalives { requests, answers: response.into_inner() }),
                Err(status) if self.redirected(&status, &endpoint) && Instant::now() < give_up => {
                    tokio::time::sleep(Duration::from_millis(wait::POLL_INTERVAL_MS)).await;
                }
                Err(status) => return Err(status),
            }
        }
    }

    async fn close_session(&self, session: &RawSession) -> Result<(), Status> {
        let request = pb::CloseSessionRequest {
            request_id: self.request_id(),
            session_id: session.id,
            session_secret: session.secret.clone(),
        };
        self.call(request, |channel, request| async move { LeaseholdClient::new(channel).close_session(request).await })
            .await
            .map(|_| ())
    }

    async fn describe_session(&self, session_id: u64) -> Result<pb::SessionInfo, Status> {
        let request = pb::DescribeSessionRequest { session_id, stale: false };
        let described =
            self.call(request, |channel, request| async move {
                LeaseholdClient::new(channel).describe_session(request).await
            })
            .await?;
        Ok(described.session.expect("a described session"))
    }

    /// The sessions the credential may list (the admin: of `tenant`, or every tenant's
    /// when empty), in one page.
    async fn list_sessions(&self, tenant: &str) -> Result<Vec<pb::SessionInfo>, Status> {
        let request = pb::ListSessionsRequest { stale: false, page_size: 0, page_token: 0, tenant: tenant.to_string() };
        let page = self
            .call(request, |channel, request| async move { LeaseholdClient::new(channel).list_sessions(request).await })
            .await?;
        assert_eq!(page.next_page_token, 0, "the tests list fewer sessions than a page holds");
        Ok(page.sessions)
    }

    async fn acquire(&self, session: &RawSession, name: &str, wait_ms: u64) -> Result<pb::AcquireResponse, Status> {
        let request = pb::AcquireRequest {
            lock_delay_ms: None,
            request_id: self.request_id(),
            session_id: session.id,
            name: name.to_string(),
            wait_ms,
            session_secret: session.secret.clone(),
        };
        self.call(request, |channel, request| async move { LeaseholdClient::new(channel).acquire(request).await }).await
    }

    async fn acquire_with_delay(
        &self,
        session: &RawSession,
        name: &str,
        delay_ms: u64,
    ) -> Result<pb::AcquireResponse, Status> {
        let request = pb::AcquireRequest {
            lock_delay_ms: Some(delay_ms),
            request_id: self.request_id(),
            session_id: session.id,
            name: name.to_string(),
            wait_ms: 0,
            session_secret: session.secret.clone(),
        };
        self.call(request, |channel, request| async move { LeaseholdClient::new(channel).acquire(request).await }).await
    }

    async fn release(&self, session: &RawSession, name: &str, token: u64) -> Result<(), Status> {
        let request = pb::ReleaseRequest {
            request_id: self.request_id(),
            session_id: session.id,
            name: name.to_string(),
            token,
            session_secret: session.secret.clone(),
        };
        self.call(request, |channel, request| async move { LeaseholdClient::new(channel).release(request).await })
            .await
            .map(|_| ())
    }

    /// Lock `name` in the caller's namespace, or (the admin) in `tenant`'s.
    async fn describe_lock(&self, name: &str, tenant: &str) -> Result<pb::DescribeLockResponse, Status> {
        let request = pb::DescribeLockRequest { name: name.to_string(), stale: false, tenant: tenant.to_string() };
        self.call(request, |channel, request| async move { LeaseholdClient::new(channel).describe_lock(request).await })
            .await
    }

    // ------------------------------------------------ Elections

    async fn leader(&self, name: &str, tenant: &str) -> Result<Option<pb::LeaderInfo>, Status> {
        let request = pb::LeaderRequest { name: name.to_string(), stale: false, tenant: tenant.to_string() };
        let answer = self
            .call(request, |channel, request| async move { ElectionsClient::new(channel).leader(request).await })
            .await?;
        Ok(answer.leader)
    }

    async fn observe(&self, name: &str, tenant: &str) -> Result<Streaming<pb::ObserveResponse>, Status> {
        let request = pb::ObserveRequest { name: name.to_string(), tenant: tenant.to_string() };
        self.call(request, |channel, request| async move { ElectionsClient::new(channel).observe(request).await }).await
    }

    // ------------------------------------------------ Admin

    /// One node's status (any credential may ask).
    async fn status_of(&self, endpoint: &str) -> Result<pb::StatusResponse, Status> {
        let channel = self.client.raw_channel(endpoint).expect("a channel to the node");
        AdminClient::new(channel).status(pb::StatusRequest {}).await.map(tonic::Response::into_inner)
    }

    async fn add_member(&self, node_id: u64, client_addr: &str, peer_addr: &str) -> Result<Vec<pb::Member>, Status> {
        let request = pb::AddMemberRequest {
            node_id,
            client_addr: client_addr.to_string(),
            peer_addr: peer_addr.to_string(),
            learner_only: false,
        };
        let answer = self
            .call(request, |channel, request| async move { AdminClient::new(channel).add_member(request).await })
            .await?;
        Ok(answer.members)
    }

    async fn remove_member(&self, node_id: u64) -> Result<Vec<pb::Member>, Status> {
        let request = pb::RemoveMemberRequest { node_id };
        let answer = self
            .call(request, |channel, request| async move { AdminClient::new(channel).remove_member(request).await })
            .await?;
        Ok(answer.members)
    }

    async fn skew_clock(&self, rate_per_mille: u64, jump_ms: u64) -> Result<(), Status> {
        let request = pb::SkewClockRequest { rate_per_mille, jump_ms };
        self.call(request, |channel, request| async move { AdminClient::new(channel).skew_clock(request).await })
            .await
            .map(|_| ())
    }

    async fn add_tenant(&self, name: &str, quotas: pb::Quotas) -> Result<pb::AddTenantResponse, Status> {
        let request =
            pb::AddTenantRequest { request_id: self.request_id(), name: name.to_string(), quotas: Some(quotas) };
        self.call(request, |channel, request| async move { AdminClient::new(channel).add_tenant(request).await }).await
    }

    async fn list_tenants(&self) -> Result<Vec<pb::TenantInfo>, Status> {
        let answer = self
            .call(pb::ListTenantsRequest {}, |channel, request| async move {
                AdminClient::new(channel).list_tenants(request).await
            })
            .await?;
        Ok(answer.tenants)
    }

    async fn rotate_tenant_token(&self, name: &str) -> Result<String, Status> {
        let request = pb::RotateTenantTokenRequest { request_id: self.request_id(), name: name.to_string() };
        let answer =
            self.call(request, |channel, request| async move {
                AdminClient::new(channel).rotate_tenant_token(request).await
            })
            .await?;
        Ok(answer.token)
    }

    async fn set_tenant_quotas(&self, name: &str, quotas: pb::Quotas) -> Result<pb::SetTenantQuotasResponse, Status> {
        let request =
            pb::SetTenantQuotasRequest { request_id: self.request_id(), name: name.to_string(), quotas: Some(quotas) };
        self.call(request, |channel, request| async move { AdminClient::new(channel).set_tenant_quotas(request).await })
            .await
    }

    async fn remove_tenant(&self, name: &str) -> Result<u64, Status> {
        let request = pb::RemoveTenantRequest { request_id: self.request_id(), name: name.to_string() };
        let answer = self
            .call(request, |channel, request| async move { AdminClient::new(channel).remove_tenant(request).await })
            .await?;
        Ok(answer.sessions_ended)
    }

    async fn end_session(&self, tenant: &str, session_id: u64) -> Result<(), Status> {
        let request = pb::EndSessionRequest { request_id: self.request_id(), tenant: tenant.to_string(), session_id };
        self.call(request, |channel, request| async move { AdminClient::new(channel).end_session(request).await })
            .await
            .map(drop)
    }
}

/// Everything the admin can see that a refused request could have changed: every
/// session (its tenant, what it holds and waits for), every tenant (quotas, usage),
/// the members, and the locks named (tenant, name).
#[derive(Debug, PartialEq)]
struct Seen {
    sessions: Vec<pb::SessionInfo>,
    tenants: Vec<pb::TenantInfo>,
    members: Vec<pb::Member>,
    locks: Vec<pb::DescribeLockResponse>,
}

async fn seen(admin: &Raw, locks: &[(&str, &str)]) -> Seen {
    let sessions = admin.list_sessions("").await.expect("the admin lists every session");
    let tenants = admin.list_tenants().await.expect("the admin lists the tenants");
    let status = admin.status_of(&admin.endpoint()).await.expect("a node's status");
    let mut described = Vec::new();
    for (tenant, name) in locks {
        described.push(admin.describe_lock(name, tenant).await.expect("the admin describes any tenant's lock"));
    }
    // A member's round trip is this node's measurement, not replicated state: it moves
    // with every heartbeat.
    let members = status.members.into_iter().map(|member| pb::Member { round_trip: None, ..member }).collect();
    Seen { sessions, tenants, members, locks: described }
}

/// Opens a new TLS connection to `address`, trusting the cluster's CA and checking the
/// node's certificate against `server_name` (the address itself when None), and asks
/// for the node's status as the test tenant. Err says why it failed.
async fn dial(cluster: &TestCluster, address: &str, server_name: Option<&str>) -> Result<pb::StatusResponse, String> {
    let ca = std::fs::read(&cluster.credentials.ca_file).expect("read the CA");
    let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca));
    if let Some(server_name) = server_name {
        tls = tls.domain_name(server_name);
    }
    let endpoint = Endpoint::from_shared(format!("https://{address}"))
        .expect("an endpoint")
        .connect_timeout(Duration::from_secs(5))
        .tls_config(tls)
        .expect("a TLS configuration");
    let channel = match tokio::time::timeout(ANSWER_DEADLINE, endpoint.connect()).await {
        Err(_) => return Err("no connection in time".into()),
        Ok(Err(error)) => return Err(format!("connect: {error:?}")),
        Ok(Ok(channel)) => channel,
    };
    let token = leasehold::settings::read_token_file(&cluster.credentials.token_file).expect("the test tenant's token");
    let mut request = tonic::Request::new(pb::StatusRequest {});
    request.metadata_mut().insert("authorization", format!("Bearer {token}").parse().expect("ASCII"));
    match tokio::time::timeout(ANSWER_DEADLINE, AdminClient::new(channel).status(request)).await {
        Err(_) => Err("no status in time".into()),
        Ok(Err(status)) => Err(format!("status: {status:?}")),
        Ok(Ok(response)) => Ok(response.into_inner()),
    }
}

fn sighup(cluster: &TestCluster, id: u64) {
    let pid = cluster.pid(id).unwrap_or_else(|| panic!("node {id} runs"));
    // SAFETY: signalling a server process this test started, by its id.
    let sent = unsafe { libc::kill(pid, libc::SIGHUP) };
    assert_eq!(sent, 0, "SIGHUP to node {id} (pid {pid}): {}", std::io::Error::last_os_error());
}

// ---------------------------------------------------------------- 1. credentials

/// Promise: a request with no credential, a made-up token, a token rotated away or
/// the token of a removed tenant is refused UNAUTHENTICATED, whatever it asks; a
/// tenant's token on an admin RPC is refused PERMISSION_DENIED; neither changes
/// anything. A client that does not speak TLS, or does not trust the cluster's CA,
/// gets no answer from a node at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_without_a_known_credential_or_the_admin_role_are_refused_and_change_nothing() {
    const HELD: &str = "trust/held";
    const FREE: &str = "trust/free";
    let cluster = started(ClusterOptions::default()).await;
    let admin = Raw::admin(&cluster);
    let test = Raw::test_tenant(&cluster);

    // What the refused requests aim at: a session of the test tenant holding a lock.
    let owner = test.create_session(LONG_TTL_MS).await.expect("create a session");
    let held_token = granted(test.acquire(&owner, HELD, 0).await.expect("acquire"));

    // A tenant whose token was rotated away, and one that was removed with its session.
    let rotated_away = add_tenant(&cluster, "rotated", pb::Quotas::default()).await;
    let current = cluster.admin_client().rotate_tenant_token("rotated").await.expect("rotate the token");
    Raw::with_token(&cluster, &current).list_sessions("").await.expect("the new token works");
    let removed_token = add_tenant(&cluster, "removed", pb::Quotas::default()).await;
    let removed = Raw::with_token(&cluster, &removed_token);
    let doomed = removed.create_session(LONG_TTL_MS).await.expect("the removed tenant's session");
    granted(removed.acquire(&doomed, HELD, 0).await.expect("the removed tenant's lock"));
    assert_eq!(cluster.admin_client().remove_tenant("removed").await.expect("remove the tenant"), 1);

    let watched = [(TEST_TENANT, HELD), (TEST_TENANT, FREE)];
    let before = seen(&admin, &watched).await;
    assert_eq!(holder(&before.locks[0]), Some((owner.id, held_token)));
    assert!(before.sessions.iter().all(|session| session.tenant != "removed"), "its sessions ended with it");

    let strangers = [
        ("no credential", Raw::without_credential(&cluster)),
        ("a made-up token", Raw::with_token(&cluster, &certs::new_token("tenant"))),
        ("a rotated-away token", Raw::with_token(&cluster, &rotated_away)),
        ("a removed tenant's token", Raw::with_token(&cluster, &removed_token)),
    ];
    for (credential, stranger) in &strangers {
        let what = |rpc: &str| format!("{rpc} with {credential}");
        refused(stranger.create_session(LONG_TTL_MS).await, &[UNAUTHENTICATED], &what("CreateSession"));
        refused(stranger.keep_alive().await, &[UNAUTHENTICATED], &what("KeepAlive"));
        // With the owner's session id and secret: the secret alone is no credential.
        refused(stranger.acquire(&owner, FREE, 0).await, &[UNAUTHENTICATED], &what("Acquire"));
        refused(stranger.release(&owner, HELD, held_token).await, &[UNAUTHENTICATED], &what("Release"));
        refused(stranger.close_session(&owner).await, &[UNAUTHENTICATED], &what("CloseSession"));
        refused(stranger.describe_lock(HELD, "").await, &[UNAUTHENTICATED], &what("DescribeLock"));
        refused(stranger.describe_session(owner.id).await, &[UNAUTHENTICATED], &what("DescribeSession"));
        refused(stranger.list_sessions("").await, &[UNAUTHENTICATED], &what("ListSessions"));
        refused(stranger.leader("trust/election", "").await, &[UNAUTHENTICATED], &what("Leader"));
        refused(stranger.status_of(&stranger.endpoint()).await, &[UNAUTHENTICATED], &what("Status"));
        refused(stranger.add_tenant("intruder", pb::Quotas::default()).await, &[UNAUTHENTICATED], &what("AddTenant"));
        refused(stranger.remove_tenant(TEST_TENANT).await, &[UNAUTHENTICATED], &what("RemoveTenant"));
        refused(stranger.end_session(TEST_TENANT, owner.id).await, &[UNAUTHENTICATED], &what("EndSession"));
    }
    assert_eq!(seen(&admin, &watched).await, before, "a request without a known credential changed the state");

    // A tenant's token on every admin-only RPC.
    let leader = cluster.wait_for_leader(LEADER_DEADLINE).await;
    let follower = *cluster.nodes.keys().find(|id| **id != leader).expect("three nodes");
    let denied = |result: Result<(), Status>, rpc: &str| {
        let status = refused(result, &[PERMISSION_DENIED], &format!("{rpc} with a tenant's token"));
        assert_eq!(metadata(&status, METADATA_TENANT), TEST_TENANT, "the refusal names the tenant");
    };
    denied(test.add_member(4, "127.0.0.1:9", "127.0.0.1:10").await.map(drop), "AddMember");
    denied(test.remove_member(follower).await.map(drop), "RemoveMember");
    denied(test.add_tenant("intruder", pb::Quotas::default()).await.map(drop), "AddTenant");
    denied(test.list_tenants().await.map(drop), "ListTenants");
    denied(test.skew_clock(10_000, 60_000).await, "SkewClock");
    denied(test.rotate_tenant_token(TEST_TENANT).await.map(drop), "RotateTenantToken");
    let tiny = pb::Quotas { max_sessions: 1, max_holds: 1, max_waiters: 1, ..Default::default() };
    denied(test.set_tenant_quotas(TEST_TENANT, tiny).await.map(drop), "SetTenantQuotas");
    denied(test.remove_tenant(TEST_TENANT).await.map(drop), "RemoveTenant");
    denied(test.end_session(TEST_TENANT, owner.id).await, "EndSession");
    assert_eq!(seen(&admin, &watched).await, before, "a tenant's admin request changed the state");
    // Not rotated: the tenant's token still works.
    assert_eq!(session_ids(&test.list_sessions("").await.expect("the token still works")), vec![owner.id]);

    // A client that speaks plaintext to a TLS port, or trusts another CA, connects to
    // nothing: the failure comes from the transport, never from a handler.
    let plaintext = Raw::with_settings(Settings {
        endpoints: cluster.endpoints(),
        token_file: Some(cluster.credentials.token_file.clone()),
        insecure_plaintext: true,
        ..Settings::default()
    });
    let other_ca_directory = tempfile::tempdir().expect("a temporary directory");
    let other_ca = certs::new_ca().expect("a CA");
    let (other_ca_file, _) = certs::write_pair(other_ca_directory.path(), "ca", &other_ca).expect("write the CA");
    let untrusting = Raw::with_settings(Settings {
        ca_file: Some(other_ca_file),
        ..cluster.credentials.settings(cluster.endpoints(), false)
    });
    for (client, name) in [(&plaintext, "a plaintext client"), (&untrusting, "a client trusting another CA")] {
        for endpoint in cluster.endpoints() {
            let answer = tokio::time::timeout(CALL_DEADLINE, client.status_of(&endpoint))
                .await
                .unwrap_or_else(|_| panic!("{name}: {endpoint} neither answered nor closed the connection"));
            transport_failure(answer, &format!("Status from {name} to {endpoint}"));
        }
        let created = tokio::time::timeout(CALL_DEADLINE, client.create_session(LONG_TTL_MS))
            .await
            .unwrap_or_else(|_| panic!("{name}: CreateSession neither answered nor failed"));
        transport_failure(created, &format!("CreateSession from {name}"));
    }
    assert_eq!(seen(&admin, &watched).await, before, "a client without TLS changed the state");
}

/// Promise: a tenant's Status tells it what a client needs (the members' client
/// addresses and roles, the leader, the term and indexes) and its own namespace's
/// counts; never the others' counts, the peer addresses, incarnations, cluster id,
/// free disk or the state budget, which the admin sees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_status_tells_it_nothing_of_the_others_or_of_the_operators_figures() {
    let cluster = started(ClusterOptions::default()).await;
    let admin = Raw::admin(&cluster);
    let test = Raw::test_tenant(&cluster);
    for index in 0..3 {
        let session = test.create_session(LONG_TTL_MS).await.expect("a session of the test tenant");
        granted(test.acquire(&session, &format!("status/{index}"), 0).await.expect("acquire"));
    }
    let other = Raw::with_token(&cluster, &add_tenant(&cluster, "other", pb::Quotas::default()).await);
    let session = other.create_session(LONG_TTL_MS).await.expect("the other tenant's session");
    granted(other.acquire(&session, "status/0", 0).await.expect("the other tenant's lock"));

    let leader = cluster.wait_for_leader(LEADER_DEADLINE).await;
    let address = cluster.nodes[&leader].client_addr.clone();
    let seen_by_admin = admin.status_of(&address).await.expect("the admin's status");
    assert!(seen_by_admin.sessions >= 4 && seen_by_admin.locks >= 4, "{seen_by_admin:?}");
    assert!(seen_by_admin.members.iter().all(|member| !member.peer_addr.is_empty()), "{seen_by_admin:?}");
    assert!(!seen_by_admin.cluster_id.is_empty() && seen_by_admin.state_budget_bytes > 0, "{seen_by_admin:?}");

    let seen_by_other = other.status_of(&address).await.expect("the other tenant's status");
    assert_eq!((seen_by_other.sessions, seen_by_other.locks), (1, 1), "its own counts: {seen_by_other:?}");
    assert!(
        seen_by_other.state_bytes > 0 && seen_by_other.state_bytes < seen_by_admin.state_bytes,
        "its own part of the state: {seen_by_other:?}"
    );
    assert_eq!(seen_by_other.leader_id, leader);
    assert_eq!(seen_by_other.leader_client_addr, address);
    assert_eq!(seen_by_other.members.len(), seen_by_admin.members.len());
    for (member, full) in seen_by_other.members.iter().zip(&seen_by_admin.members) {
        assert_eq!((member.node_id, &member.client_addr, &member.role), (full.node_id, &full.client_addr, &full.role));
        assert!(member.peer_addr.is_empty() && member.incarnation == 0, "{member:?}");
    }
    let operators = (
        seen_by_other.cluster_id.as_str(),
        seen_by_other.incarnation,
        seen_by_other.disk_free_bytes,
        seen_by_other.disk_reserve_bytes,
        seen_by_other.state_budget_bytes,
    );
    assert_eq!(operators, ("", 0, 0, 0, 0), "the operator's figures: {seen_by_other:?}");
}

/// Promise: a valid credential is not refused for good by a node that is behind. A
/// node stopped while a tenant was added, and started again while the others are
/// stopped with SIGSTOP, does not know the tenant's token: it answers NOT_LEADER,
/// which sends a client to the leader, rather than UNAUTHENTICATED, which a client
/// takes as final. Once the others run again, the tenant's client, given that node
/// first, gets its session; a token nobody has is still refused UNAUTHENTICATED.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_behind_sends_a_credential_it_does_not_know_on_to_the_leader() {
    let mut cluster = started(ClusterOptions::default()).await;
    let leader = cluster.wait_for_leader(LEADER_DEADLINE).await;
    let behind = *cluster.nodes.keys().find(|id| **id != leader).expect("three nodes");
    cluster.stop(behind, CALL_DEADLINE).await;
    let token = add_tenant(&cluster, "late", pb::Quotas::default()).await;
    let others: Vec<u64> = cluster.nodes.keys().copied().filter(|id| *id != behind).collect();
    for id in &others {
        cluster.pause(*id);
    }
    cluster.restart(behind);
    let address = cluster.nodes[&behind].client_addr.clone();
    let admin = Raw::admin(&cluster);
    wait::until(CONDITION_DEADLINE, "the node behind to serve again", || async {
        admin.status_of(&address).await.ok()
    })
    .await;
    let late = Raw::with_token(&cluster, &token);
    let request = pb::CreateSessionRequest {
        request_id: late.request_id(),
        ttl_ms: LONG_TTL_MS,
        client_name: RAW_CLIENT_NAME.to_string(),
    };
    let channel = late.client.raw_channel(&address).expect("a channel to the node behind");
    let answer = tokio::time::timeout(ANSWER_DEADLINE, LeaseholdClient::new(channel).create_session(request)).await;
    let status = answer.expect("the node behind answers").expect_err("no session while the others are stopped");
    assert_eq!(error_reason(&status), Some(ErrorReason::NotLeader), "sent on, not refused: {status:?}");
    for id in &others {
        cluster.resume(*id);
    }

    let mut endpoints = vec![address];
    endpoints.extend(others.iter().map(|id| cluster.nodes[id].client_addr.clone()));
    let client = Settings { endpoints, ..token_settings(&cluster, &token) }.client().expect("valid settings");
    let session = client.session(Duration::from_secs(10)).await.expect("a session, the node behind asked first");
    session.close().await.expect("close the session");
    let stranger = Raw::with_token(&cluster, &certs::new_token("tenant"));
    refused(stranger.create_session(LONG_TTL_MS).await, &[UNAUTHENTICATED], "a token nobody has, at the leader");
}

// ---------------------------------------------------------------- 2. namespaces

/// Promise: each tenant has its own namespace. Two tenants hold `orders/42` at once;
/// neither can see, list, describe, keep alive, release, close or observe the other's
/// locks, sessions and elections, even knowing their ids, tokens and secrets; the
/// admin reads any tenant's namespace by naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_share_no_lock_session_or_election() {
    const ORDERS: &str = "orders/42";
    const ELECTION: &str = "orders/primary";
    let cluster = started(ClusterOptions::default()).await;
    let admin = Raw::admin(&cluster);
    let token_a = add_tenant(&cluster, "a", pb::Quotas::default()).await;
    let token_b = add_tenant(&cluster, "b", pb::Quotas::default()).await;
    assert_ne!(token_a, token_b);
    let raw_a = Raw::with_token(&cluster, &token_a);
    let session_a = tenant_client(&cluster, &token_a).session(Duration::from_secs(60)).await.expect("A's session");
    let session_b = tenant_client(&cluster, &token_b).session(Duration::from_secs(60)).await.expect("B's session");

    // Both hold orders/42 at the same time: two locks, one order of tokens.
    let lock_a = session_a.try_lock(ORDERS).await.expect("acquire").expect("A's orders/42 is free");
    let lock_b = session_b.try_lock(ORDERS).await.expect("acquire").expect("B's orders/42 is free, whoever holds A's");
    assert_ne!(lock_a.token(), lock_b.token(), "fencing tokens are log indexes, one order across tenants");
    let leadership_b = session_b.campaign(ELECTION, "b-first").await.expect("B leads its election");

    // B's namespace as the admin sees it, before A tries anything.
    let namespace_b = || async {
        (
            admin.describe_lock(ORDERS, "b").await.expect("the admin describes B's lock"),
            admin.list_sessions("b").await.expect("the admin lists B's sessions"),
            admin.leader(ELECTION, "b").await.expect("the admin reads B's election"),
        )
    };
    let b_before = namespace_b().await;
    assert_eq!(holder(&b_before.0), Some((session_b.id(), lock_b.token())));
    assert_eq!(session_ids(&b_before.1), vec![session_b.id()]);
    assert_eq!(b_before.2.as_ref().map(|leader| leader.session_id), Some(session_b.id()));

    // A's reads show A's namespace only.
    let seen_by_a = raw_a.describe_lock(ORDERS, "").await.expect("A describes its lock");
    assert_eq!(holder(&seen_by_a), Some((session_a.id(), lock_a.token())), "A sees its own orders/42");
    let listed = raw_a.list_sessions("").await.expect("A lists its sessions");
    assert_eq!(session_ids(&listed), vec![session_a.id()], "B's session is not in A's list");
    assert!(listed.iter().all(|session| session.tenant == "a"), "{listed:?}");
    assert_eq!(raw_a.leader(ELECTION, "").await.expect("A reads its election"), None, "A's election is vacant");
    // B's session is to A one that does not exist, in the same words as a session id
    // that was never used.
    let status = refused(raw_a.describe_session(session_b.id()).await, &[UNKNOWN_SESSION], "A describes B's session");
    let never = refused(raw_a.describe_session(u64::MAX / 2).await, &[UNKNOWN_SESSION], "a session never created");
    let unused = (u64::MAX / 2).to_string();
    assert_eq!(status.message(), never.message().replace(&unused, &session_b.id().to_string()));
    assert!(!status.message().contains("\"b\""), "{}", status.message());
    refused(raw_a.describe_lock(ORDERS, "b").await, &[PERMISSION_DENIED], "A names B's namespace in DescribeLock");
    refused(raw_a.list_sessions("b").await, &[PERMISSION_DENIED], "A names B's namespace in ListSessions");
    refused(raw_a.leader(ELECTION, "b").await, &[PERMISSION_DENIED], "A names B's namespace in Leader");
    refused(raw_a.observe(ELECTION, "b").await, &[PERMISSION_DENIED], "A names B's namespace in Observe");

    // A acts on B's session with B's session id and B's fencing token, presenting A's
    // own secret, or even B's (as if it had leaked): all refused, B's session is B's.
    let mut keepalives_a = raw_a.keep_alive().await.expect("A's keepalive stream");
    // Either way the session is, to A, one that does not exist: nothing in the answer
    // tells A that B's session lives or whose it is.
    let as_b = [
        ("A's secret", RawSession::from(&session_b).with_secret(session_a.secret())),
        ("B's secret", RawSession::from(&session_b)),
    ];
    for (secret, key) in &as_b {
        let what = |rpc: &str| format!("A's {rpc} of B's session with {secret}");
        for status in [
            refused(raw_a.release(key, ORDERS, lock_b.token()).await, &[UNKNOWN_SESSION], &what("Release")),
            refused(raw_a.acquire(key, "orders/43", 0).await, &[UNKNOWN_SESSION], &what("Acquire")),
            refused(raw_a.close_session(key).await, &[UNKNOWN_SESSION], &what("CloseSession")),
        ] {
            assert!(!status.message().contains("\"b\""), "{}: {}", what("request"), status.message());
        }
        let answer = keepalives_a.send(key).await;
        assert_eq!((answer.session_id, answer.alive, answer.ttl_ms), (key.id, false, 0), "{}", what("KeepAlive"));
    }
    assert_eq!(namespace_b().await, b_before, "A changed B's namespace");

    // A's Observe shows A's election only: B's proclamation does not reach it, and the
    // next change it shows is A's own campaign.
    let mut observed_by_a = raw_a.observe(ELECTION, "").await.expect("A observes its election");
    let first = observed(&mut observed_by_a).await;
    assert_eq!(first.leader, None, "A's election is vacant, whoever leads B's");
    leadership_b.proclaim("b-second").await.expect("B proclaims");
    let _leadership_a = session_a.campaign(ELECTION, "a-first").await.expect("A leads its own election");
    let next = observed(&mut observed_by_a).await;
    let leader = next.leader.expect("A's campaign is the next change A observes");
    assert_eq!((leader.session_id, leader.value.as_str()), (session_a.id(), "a-first"), "not B's proclamation");

    // The admin reads either namespace by naming it.
    let b_now = namespace_b().await;
    assert_eq!(holder(&b_now.0), Some((session_b.id(), lock_b.token())));
    let b_leader = b_now.2.expect("B's election has its leader");
    assert_eq!((b_leader.session_id, b_leader.value.as_str()), (session_b.id(), "b-second"));
    let a_by_admin = admin.describe_lock(ORDERS, "a").await.expect("the admin describes A's lock");
    assert_eq!(holder(&a_by_admin), Some((session_a.id(), lock_a.token())));
    let described = admin.describe_session(session_b.id()).await.expect("the admin describes B's session");
    assert_eq!(described.tenant, "b");
    assert_eq!(described.held, vec![pb::HeldLock { name: ORDERS.into(), token: lock_b.token() }]);
    let mut observed_by_admin = admin.observe(ELECTION, "b").await.expect("the admin observes B's election");
    let b_observed = observed(&mut observed_by_admin).await.leader.expect("B's election has a leader");
    assert_eq!((b_observed.session_id, b_observed.value.as_str()), (session_b.id(), "b-second"));
}

// ---------------------------------------------------------------- 3. session secrets

/// Promise: a session belongs to the client that created it. Another client of the
/// same tenant that knows the session's id but not its secret cannot keep it alive
/// (answered alive = false, and the session expires after its TTL once its owner
/// stops), cannot close it, and cannot release or take locks with it.
#[tokio::test(flavor = "multi_thread")]
async fn only_a_semaphores_tenant_or_the_admin_changes_its_limit() {
    let cluster = started(ClusterOptions::default()).await;
    let token_a = add_tenant(&cluster, "a", pb::Quotas::default()).await;
    let token_b = add_tenant(&cluster, "b", pb::Quotas::default()).await;
    let client_a = tenant_client(&cluster, &token_a);
    let session_a = client_a.session(Duration::from_secs(60)).await.expect("A's session");
    let _permit = session_a.semaphore("jobs", 3).try_acquire().await.expect("acquire").expect("a free permit");
    let session_b = tenant_client(&cluster, &token_b).session(Duration::from_secs(60)).await.expect("B's session");

    let error = session_b.set_tenant_semaphore_limit("a", "jobs", 1).await.expect_err("B names A's semaphore");
    assert!(matches!(error, leasehold::Error::PermissionDenied(_)), "{error:?}");
    let error = session_b.semaphore("jobs", 1).set_limit(1).await.expect_err("B's own jobs is unused");
    assert!(matches!(error, leasehold::Error::InvalidArgument(_)), "{error:?}");
    assert_eq!(client_a.describe_semaphore("jobs").await.expect("describe").limit, 3, "B changed nothing");

    let admin_session = cluster.admin_client().session(Duration::from_secs(60)).await.expect("the admin's session");
    let previous = admin_session.set_tenant_semaphore_limit("a", "jobs", 5).await.expect("the admin sets A's limit");
    assert_eq!(previous, 3);
    assert_eq!(client_a.describe_semaphore("jobs").await.expect("describe").limit, 5);
    let error = admin_session.set_tenant_semaphore_limit("nobody", "jobs", 5).await.expect_err("an unknown tenant");
    assert!(matches!(error, leasehold::Error::NotFound(_)), "{error:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_id_without_its_secret_cannot_keep_close_or_release_the_session() {
    const LOCK: &str = "secret/held";
    const OTHER: &str = "secret/free";
    let cluster = started(ClusterOptions::default()).await;
    let owner = Raw::test_tenant(&cluster);
    let intruder = Raw::test_tenant(&cluster);
    let session = owner.create_session(SHORT_TTL_MS).await.expect("create a session");
    let mut owner_keepalives = owner.keep_alive().await.expect("the owner's keepalive stream");
    let token = granted(owner.acquire(&session, LOCK, 0).await.expect("acquire"));
    let forged = [session.with_secret(Vec::new()), session.with_secret(vec![0x5a; 16])];

    for key in &forged {
        // The owner renews before each attempt, so that only an attempt could end it.
        assert!(owner_keepalives.send(&session).await.alive, "the owner keeps its session");
        let status =
            refused(intruder.close_session(key).await, &[WRONG_SESSION_SECRET], "CloseSession without the secret");
        assert_eq!(metadata(&status, METADATA_SESSION_ID), session.id.to_string());
        assert!(owner_keepalives.send(&session).await.alive, "the owner keeps its session");
        refused(intruder.release(key, LOCK, token).await, &[WRONG_SESSION_SECRET], "Release without the secret");
        assert!(owner_keepalives.send(&session).await.alive, "the owner keeps its session");
        refused(intruder.acquire(key, OTHER, 0).await, &[WRONG_SESSION_SECRET], "Acquire without the secret");
        assert!(owner_keepalives.send(&session).await.alive, "the owner keeps its session");
        let described = owner.describe_session(session.id).await.expect("the session is still there");
        assert_eq!(described.held, vec![pb::HeldLock { name: LOCK.into(), token }], "its lock is still held");
        assert_eq!(holder(&owner.describe_lock(LOCK, "").await.expect("describe")), Some((session.id, token)));
        assert_eq!(holder(&owner.describe_lock(OTHER, "").await.expect("describe")), None);
    }

    // From here the owner sends nothing; the intruder sends keepalives without the
    // secret every quarter TTL. Each is answered not alive and renews nothing: the
    // session expires, and its lock with it.
    assert!(owner_keepalives.send(&session).await.alive, "alive when the owner stops");
    drop(owner_keepalives);
    let mut intruder_keepalives = intruder.keep_alive().await.expect("the intruder's keepalive stream");
    let give_up = Instant::now() + CONDITION_DEADLINE;
    loop {
        for key in &forged {
            let answer = intruder_keepalives.send(key).await;
            assert_eq!(
                (answer.session_id, answer.alive, answer.ttl_ms),
                (session.id, false, 0),
                "a keepalive without the secret"
            );
        }
        match owner.describe_session(session.id).await {
            Ok(_) => {}
            Err(status) => {
                refused(Err::<(), _>(status), &[UNKNOWN_SESSION], "describe the expired session");
                break;
            }
        }
        assert!(
            Instant::now() < give_up,
            "the session outlived {CONDITION_DEADLINE:?} on keepalives without its secret"
        );
        tokio::time::sleep(Duration::from_millis(SHORT_TTL_MS / 4)).await;
    }
    assert_eq!(holder(&owner.describe_lock(LOCK, "").await.expect("describe")), None, "released by the expiry");
}

/// Promise: a credential revoked while a stream is open stops working on that stream
/// too. After `rotate-token`, the next keepalive on a stream opened with the old token
/// ends the stream UNAUTHENTICATED, and an Observe stream opened with it ends as soon
/// as the node applies the rotation; the old token opens nothing new, while the
/// tenant's new token keeps the same session alive (the session belongs to the
/// tenant, not to the token). Removing the tenant ends the new token's streams too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_credential_ends_the_streams_it_opened() {
    const LOCK: &str = "revoked/held";
    const ELECTION: &str = "revoked/election";
    let cluster = started(ClusterOptions::default()).await;
    let admin = Raw::admin(&cluster);
    let old_token = add_tenant(&cluster, "revoked", pb::Quotas::default()).await;
    let old = Raw::with_token(&cluster, &old_token);
    let session = old.create_session(SHORT_TTL_MS).await.expect("create a session");
    let mut keepalives = old.keep_alive().await.expect("a keepalive stream with the old token");
    granted(old.acquire(&session, LOCK, 0).await.expect("acquire"));
    let mut observing = old.observe(ELECTION, "").await.expect("an Observe stream with the old token");
    assert_eq!(observed(&mut observing).await.leader, None, "the election is vacant");
    assert!(keepalives.send(&session).await.alive, "alive before the rotation");

    let new_token = admin.rotate_tenant_token("revoked").await.expect("rotate the token");
    let ended = keepalives.try_send(&session).await;
    refused(ended, &[UNAUTHENTICATED], "a keepalive on a stream opened with a rotated-away token");
    let ended = tokio::time::timeout(ANSWER_DEADLINE, observing.message()).await.expect("the Observe stream ends");
    refused(ended, &[UNAUTHENTICATED], "an Observe stream opened with a rotated-away token");
    let reopened = old.keep_alive().await.map(drop);
    refused(reopened, &[UNAUTHENTICATED], "a keepalive stream opened with a rotated-away token");

    let new = Raw::with_token(&cluster, &new_token);
    let mut keepalives = new.keep_alive().await.expect("a keepalive stream with the new token");
    assert!(keepalives.send(&session).await.alive, "the new token keeps the tenant's session");
    let mut observing = new.observe(ELECTION, "").await.expect("an Observe stream with the new token");
    observed(&mut observing).await;
    let described = new.describe_session(session.id).await.expect("the session lives on");
    assert_eq!(described.held.len(), 1, "its lock with it: {described:?}");

    admin.remove_tenant("revoked").await.expect("remove the tenant");
    let ended = keepalives.try_send(&session).await;
    refused(ended, &[UNAUTHENTICATED], "a keepalive on a stream of a removed tenant");
    let ended = tokio::time::timeout(ANSWER_DEADLINE, observing.message()).await.expect("the Observe stream ends");
    refused(ended, &[UNAUTHENTICATED], "an Observe stream of a removed tenant");
}

// ---------------------------------------------------------------- 4. SIGHUP reload

/// Promise: certificates (and the admin token) are replaced without a restart. New
/// files on disk are not used until the node gets SIGHUP; then every new connection
/// gets the new certificate, while connections already open, and the sessions and
/// locks kept alive over them, go on as if nothing happened.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_swapped_on_disk_are_served_after_sighup_and_open_sessions_survive() {
    const ROTATED_HOST: &str = "rotated.example";
    const LOCK: &str = "rotation/held";
    // Long enough that the library keeps it alive on a loaded machine without a
    // moment of jeopardy; the test waits two of them after the reload.
    let ttl = Duration::from_secs(4);
    let cluster = started(ClusterOptions::default()).await;
    let node = cluster.wait_for_leader(LEADER_DEADLINE).await;
    let address = cluster.nodes[&node].client_addr.clone();
    let client = cluster.client();
    let session = client.session(ttl).await.expect("a session kept alive by the library");
    let guard = session.try_lock(LOCK).await.expect("acquire").expect("the lock is free");

    // The node's certificate names its address, not the new host name.
    dial(&cluster, &address, None).await.expect("a new connection by address");
    let before = dial(&cluster, &address, Some(ROTATED_HOST)).await;
    assert!(before.is_err(), "the first certificate does not name {ROTATED_HOST}: {before:?}");

    // A new certificate for the node from the same CA (its peers must still trust it):
    // the same identity and addresses, and one more host name.
    let directory = &cluster.credentials.directory;
    let ca_key = std::fs::read_to_string(directory.join("ca.key")).expect("read the CA key");
    let hosts = ["127.0.0.1", "localhost", ROTATED_HOST].map(String::from);
    let pem = certs::node_certificate(&ca_key, node, &hosts).expect("a node certificate");
    certs::write_pair(directory, &format!("node-{node}"), &pem).expect("write the new certificate");
    // On disk but not read: the node serves what it read at start until told.
    let written = dial(&cluster, &address, Some(ROTATED_HOST)).await;
    assert!(written.is_err(), "the node used new files before SIGHUP: {written:?}");

    let reloaded_at = Instant::now();
    sighup(&cluster, node);
    wait::until(CONDITION_DEADLINE, "a new connection to be served the new certificate", || async {
        dial(&cluster, &address, Some(ROTATED_HOST)).await.ok()
    })
    .await;
    dial(&cluster, &address, None).await.expect("the new certificate names the address too");
    cluster.client_of(node).status_of(&address).await.expect("a new library client connects");

    // The session opened before the reload: its keepalives were answered for more than
    // a whole TTL after it, and the server agrees that it still holds its lock.
    wait::until(CONDITION_DEADLINE, "keepalives answered for a TTL after the reload", || async {
        (session.deadline() > reloaded_at + 2 * ttl).then_some(())
    })
    .await;
    assert_ne!(session.state(), SessionState::Lost);
    let lock = cluster.client().describe_lock(LOCK, false).await.expect("describe the lock");
    assert_eq!(holder(&lock), Some((session.id(), guard.token())), "the lock is held as before the reload");

    // The admin token is read again too: after SIGHUP the old one is unknown to every
    // node and the new one is the admin's.
    let old_admin = Raw::admin(&cluster);
    certs::write_file(&cluster.credentials.admin_token_file, &certs::new_token("admin"), true)
        .expect("write the new admin token");
    let new_admin = Raw::admin(&cluster);
    for id in cluster.nodes.keys() {
        sighup(&cluster, *id);
    }
    for (id, node) in &cluster.nodes {
        let address = &node.client_addr;
        let old = wait::until(CONDITION_DEADLINE, &format!("node {id} to drop the old admin token"), || async {
            old_admin.status_of(address).await.err()
        })
        .await;
        refused(Err::<(), _>(old), &[UNAUTHENTICATED], &format!("the old admin token on node {id}"));
        new_admin.status_of(address).await.expect("the new admin token works");
    }
    new_admin.list_tenants().await.expect("the new admin token is the admin's");
    refused(old_admin.list_tenants().await, &[UNAUTHENTICATED], "ListTenants with the old admin token");
    assert_ne!(session.state(), SessionState::Lost, "the session lived through both reloads");
    guard.release().await.expect("release after the reloads");
}

// ---------------------------------------------------------------- 5. quotas

/// Promise: a tenant stays within its quotas. Past max_sessions it gets no session,
/// past max_holds no lock, past max_waiters no place in a queue: each refused
/// QUOTA_EXCEEDED naming the tenant, the quota, its limit and the usage, and changing
/// nothing. A closed session, a released lock and a granted wait free their slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_is_held_to_its_quotas_and_a_freed_slot_can_be_used_again() {
    let cluster = started(ClusterOptions::default()).await;
    let assert_quota = |status: &Status, tenant: &str, quota: &str| {
        assert_eq!(metadata(status, METADATA_TENANT), tenant);
        assert_eq!(metadata(status, "quota"), quota);
        assert_eq!((metadata(status, "limit"), metadata(status, "usage")), ("1".into(), "1".into()), "{status:?}");
    };

    // Sessions: max_sessions 2.
    let quotas = pb::Quotas { max_sessions: 2, ..pb::Quotas::default() };
    let sessions = Raw::with_token(&cluster, &add_tenant(&cluster, "few-sessions", quotas).await);
    let first = sessions.create_session(LONG_TTL_MS).await.expect("a first session");
    let second = sessions.create_session(LONG_TTL_MS).await.expect("a second session");
    let status = refused(sessions.create_session(LONG_TTL_MS).await, &[QUOTA_EXCEEDED], "a third session");
    assert_eq!(metadata(&status, METADATA_TENANT), "few-sessions");
    assert_eq!(metadata(&status, "quota"), "sessions");
    assert_eq!((metadata(&status, "limit"), metadata(&status, "usage")), ("2".into(), "2".into()), "{status:?}");
    let listed = sessions.list_sessions("").await.expect("list");
    assert_eq!(session_ids(&listed), vec![first.id, second.id], "the refused session was not made");
    sessions.close_session(&first).await.expect("close the first session");
    let third = sessions.create_session(LONG_TTL_MS).await.expect("a closed session frees its slot");
    assert_eq!(session_ids(&sessions.list_sessions("").await.expect("list")), vec![second.id, third.id]);

    // Holds: max_holds 1, counted for the tenant, not per session.
    let quotas = pb::Quotas { max_holds: 1, ..pb::Quotas::default() };
    let holds = Raw::with_token(&cluster, &add_tenant(&cluster, "few-holds", quotas).await);
    let holder = holds.create_session(LONG_TTL_MS).await.expect("a session");
    let other = holds.create_session(LONG_TTL_MS).await.expect("another session");
    let token = granted(holds.acquire(&holder, "holds/1", 0).await.expect("a first lock"));
    for (session, whose) in [(&holder, "the holder"), (&other, "another session")] {
        let status = refused(
            holds.acquire(session, "holds/2", 0).await,
            &[QUOTA_EXCEEDED],
            &format!("a second lock by {whose}"),
        );
        assert_quota(&status, "few-holds", "holds");
    }
    assert_eq!(holder_of(&holds, "holds/2").await, None, "the refused lock was not granted");
    holds.release(&holder, "holds/1", token).await.expect("release");
    granted(holds.acquire(&other, "holds/2", 0).await.expect("a released lock frees its slot"));

    // Waiters: max_waiters 1. Two locks are held; a first session queues for one, a
    // second session's wait for the other is refused.
    let quotas = pb::Quotas { max_waiters: 1, ..pb::Quotas::default() };
    let waits = Raw::with_token(&cluster, &add_tenant(&cluster, "few-waiters", quotas).await);
    let holder = waits.create_session(LONG_TTL_MS).await.expect("a session");
    let first_waiter = waits.create_session(LONG_TTL_MS).await.expect("a waiting session");
    let second_waiter = waits.create_session(LONG_TTL_MS).await.expect("another waiting session");
    let token_1 = granted(waits.acquire(&holder, "waits/1", 0).await.expect("acquire"));
    let token_2 = granted(waits.acquire(&holder, "waits/2", 0).await.expect("acquire"));
    let first_wait = {
        let (waits, first_waiter) = (waits.clone(), first_waiter.clone());
        tokio::spawn(async move { waits.acquire(&first_waiter, "waits/1", 60_000).await })
    };
    wait_for_waiters(&waits, "waits/1", &[first_waiter.id]).await;
    let status = refused(waits.acquire(&second_waiter, "waits/2", 60_000).await, &[QUOTA_EXCEEDED], "a second wait");
    assert_quota(&status, "few-waiters", "waiters");
    let waits_2 = waits.describe_lock("waits/2", "").await.expect("describe");
    assert!(waits_2.waiters.is_empty(), "the refused wait is not queued: {waits_2:?}");
    // The first wait is granted, which frees its slot; the second session may queue.
    waits.release(&holder, "waits/1", token_1).await.expect("release");
    granted(first_wait.await.expect("the waiting task").expect("the first wait is granted"));
    let second_wait = {
        let (waits, second_waiter) = (waits.clone(), second_waiter.clone());
        tokio::spawn(async move { waits.acquire(&second_waiter, "waits/2", 60_000).await })
    };
    wait_for_waiters(&waits, "waits/2", &[second_waiter.id]).await;
    waits.release(&holder, "waits/2", token_2).await.expect("release");
    granted(second_wait.await.expect("the waiting task").expect("the second wait is granted"));

    // The admin sees each tenant's quotas and usage.
    let tenants = cluster.admin_client().list_tenants().await.expect("list the tenants");
    let usage = |name: &str| {
        let tenant = tenants.iter().find(|tenant| tenant.name == name).expect("listed");
        (tenant.sessions, tenant.holds, tenant.waiters)
    };
    assert_eq!(usage("few-sessions"), (2, 0, 0));
    assert_eq!(usage("few-holds"), (2, 1, 0));
    assert_eq!(usage("few-waiters"), (3, 2, 0));
}

/// Promise: a lock held back by its lock-delay after its holder's session expired
/// counts toward its tenant's holds quota until the delay ends. With max_holds 1, the
/// held-back lock keeps the tenant from a second lock (QUOTA_EXCEEDED, 1 of 1), though
/// no session of the tenant holds anything; once the delay ended, the slot is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_held_back_by_its_delay_counts_toward_the_holds_quota() {
    const DELAY_MS: u64 = 6_000;
    let cluster = started(ClusterOptions::default()).await;
    let quotas = pb::Quotas { max_holds: 1, ..pb::Quotas::default() };
    let raw = Raw::with_token(&cluster, &add_tenant(&cluster, "delayed-holds", quotas).await);
    let other = raw.create_session(LONG_TTL_MS).await.expect("a long session");
    // A session of the shortest TTL that sends no keepalive expires within seconds.
    let expiring = raw.create_session(1_000).await.expect("a short session");
    granted(raw.acquire_with_delay(&expiring, "delayed/1", DELAY_MS).await.expect("a lock with a delay"));
    wait::until(CONDITION_DEADLINE, "the short session to expire and its lock to be held back", || async {
        let lock = raw.describe_lock("delayed/1", "").await.ok()?;
        lock.holder.filter(|holder| holder.delay_until_unix_ms > 0).map(|_| ())
    })
    .await;
    let tenant = cluster.admin_client().list_tenants().await.expect("the tenants");
    let usage = tenant.iter().find(|tenant| tenant.name == "delayed-holds").expect("listed");
    assert_eq!(usage.holds, 0, "no session of the tenant holds anything");

    let status = refused(raw.acquire(&other, "delayed/2", 0).await, &[QUOTA_EXCEEDED], "a lock beside a held-back one");
    assert_eq!(metadata(&status, "quota"), "holds");
    assert_eq!((metadata(&status, "limit"), metadata(&status, "usage")), ("1".into(), "1".into()), "{status:?}");
    assert_eq!(holder_of(&raw, "delayed/2").await, None, "the refused lock was not granted");

    // The delay ends: the held-back lock is free and the slot with it.
    wait::until(CONDITION_DEADLINE, "the delay to end", || async {
        raw.describe_lock("delayed/1", "").await.ok()?.holder.is_none().then_some(())
    })
    .await;
    granted(raw.acquire(&other, "delayed/2", 0).await.expect("the slot is free once the delay ended"));
}

async fn holder_of(raw: &Raw, name: &str) -> Option<(u64, u64)> {
    holder(&raw.describe_lock(name, "").await.expect("describe the lock"))
}

/// Waits until lock `name` has exactly the waiters `sessions`, in that order.
async fn wait_for_waiters(raw: &Raw, name: &str, sessions: &[u64]) {
    wait::until(CONDITION_DEADLINE, &format!("{sessions:?} to wait for {name}"), || async {
        let lock = raw.describe_lock(name, "").await.ok()?;
        let waiting: Vec<u64> = lock.waiters.iter().map(|waiter| waiter.session_id).collect();
        (waiting == sessions).then_some(())
    })
    .await;
}

// ---------------------------------------------------------------- 6. state budget

/// Promise: no tenant can grow the replicated state past the cluster's budget. At the
/// budget, new sessions, locks and tenants are refused BUDGET_EXCEEDED for every
/// tenant, and change nothing; the admin is told which tenant uses most, a tenant only
/// its own part (never another tenant's name or size). Releases and closes still
/// work, and once enough is released new state is accepted again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_state_budget_new_state_is_refused_while_releases_and_closes_work() {
    const BUDGET_BYTES: u64 = 1 << 20;
    /// Locks one filling session takes, below the per-session limit (1024).
    const LOCKS_PER_SESSION: usize = 1_000;
    const FILL_SESSIONS: usize = 4;
    /// Acquires in flight at once while filling (one connection, batched entries).
    const FILL_CONCURRENCY: usize = 32;
    let options = ClusterOptions {
        extra_arguments: vec!["--state-budget-bytes".into(), BUDGET_BYTES.to_string()],
        ..ClusterOptions::default()
    };
    let cluster = started(options).await;
    let admin = Raw::admin(&cluster);
    let test = Raw::test_tenant(&cluster);
    let hog = Raw::with_token(&cluster, &add_tenant(&cluster, "hog", pb::Quotas::default()).await);

    // Sessions with the longest client names and locks with the longest names: about
    // 450 and 380 estimated bytes each, so ~2,700 grants reach a mebibyte.
    let client_name = "h".repeat(128);
    let lock_name = |index: usize| format!("budget/{index:0>249}");
    let mut filling = Vec::new();
    for _ in 0..FILL_SESSIONS {
        filling.push(hog.create_named_session(LONG_TTL_MS, &client_name).await.expect("a filling session"));
    }
    let spare = hog.create_named_session(LONG_TTL_MS, &client_name).await.expect("a session holding nothing");
    let mut held: Vec<(usize, String, u64)> = Vec::new();
    let mut first_refusal = None;
    let mut next = 0;
    while first_refusal.is_none() {
        assert!(next < FILL_SESSIONS * LOCKS_PER_SESSION, "{next} locks and the budget was never reached");
        let round = (next..next + FILL_CONCURRENCY).map(|index| {
            let (hog, session, name) = (&hog, &filling[index / LOCKS_PER_SESSION], lock_name(index));
            async move {
                let answer = hog.acquire(session, &name, 0).await;
                (index / LOCKS_PER_SESSION, name, answer)
            }
        });
        for (session, name, answer) in futures::future::join_all(round).await {
            match answer {
                Ok(answer) => held.push((session, name, granted(answer))),
                Err(status) => first_refusal = Some(refused(Err::<(), _>(status), &[BUDGET_EXCEEDED], "filling")),
            }
        }
        next += FILL_CONCURRENCY;
    }
    let first_refusal = first_refusal.expect("refused");
    let own: u64 = metadata(&first_refusal, "tenant_bytes").parse().expect("a number");
    assert!(own > 0, "the hog is told its own part: {first_refusal:?}");

    // At the budget: nothing new, from any tenant, and nothing changes.
    let leader = cluster.wait_for_leader(LEADER_DEADLINE).await;
    let leader_address = cluster.nodes[&leader].client_addr.clone();
    let state_bytes = || async { admin.status_of(&leader_address).await.expect("the leader's status").state_bytes };
    let bytes_before = state_bytes().await;
    let watched = [("hog", "budget/refused")];
    let before = seen(&admin, &watched).await;
    assert!(bytes_before >= BUDGET_BYTES, "{bytes_before} bytes at the budget");
    // A tenant learns nothing of the others: no name, no cluster-wide figure.
    let over_budget = |status: Status, what: &str| {
        let status = refused(Err::<(), _>(status), &[BUDGET_EXCEEDED], what);
        for key in ["largest_tenant", "used_bytes", "budget_bytes"] {
            assert_eq!(error_metadata(&status, key), None, "{what} tells a tenant {key}: {status:?}");
        }
        assert!(!status.message().contains("hog") || what.starts_with("the hog"), "{what}: {status:?}");
        status
    };
    over_budget(hog.acquire(&filling[3], "budget/refused", 0).await.expect_err("refused"), "the hog's new lock");
    over_budget(hog.create_session(LONG_TTL_MS).await.expect_err("refused"), "the hog's new session");
    let status = over_budget(test.create_session(LONG_TTL_MS).await.expect_err("refused"), "another's session");
    assert_eq!(metadata(&status, "tenant_bytes"), "0", "the test tenant holds nothing: {status:?}");
    // The admin is told who uses most, and how full the state is.
    let status = refused(admin.add_tenant("late", pb::Quotas::default()).await, &[BUDGET_EXCEEDED], "a new tenant");
    assert_eq!(metadata(&status, "largest_tenant"), "hog", "{status:?}");
    assert_eq!(metadata(&status, "budget_bytes"), BUDGET_BYTES.to_string());
    let used: u64 = metadata(&status, "used_bytes").parse().expect("a number");
    assert!(used >= BUDGET_BYTES, "refused at {used} of {BUDGET_BYTES} bytes");
    assert_eq!(seen(&admin, &watched).await, before, "a request refused at the budget changed the state");
    assert_eq!(state_bytes().await, bytes_before);

    // Releases and closes still work at the budget.
    let (session, name, token) = held.pop().expect("a held lock");
    let (released, closed) = tokio::join!(hog.release(&filling[session], &name, token), hog.close_session(&spare));
    released.expect("a release at the budget");
    closed.expect("a close at the budget");
    assert_eq!(holder_of(&hog, &name).await, None, "released");

    // Once a filling session is closed (a thousand locks with it), new state fits again.
    hog.close_session(&filling[0]).await.expect("close a filling session");
    let regained = wait::until(CONDITION_DEADLINE, "a new lock to be accepted under the budget", || async {
        match hog.acquire(&filling[3], "budget/after", 0).await {
            Ok(answer) => Some(granted(answer)),
            Err(status) => {
                refused(Err::<(), _>(status), &[BUDGET_EXCEEDED], "a new lock after the close");
                None
            }
        }
    })
    .await;
    assert!(regained > 0);
    test.create_session(LONG_TTL_MS).await.expect("another tenant's new session under the budget");
    assert!(state_bytes().await < bytes_before, "closing a session shrank the state");
}

// ---------------------------------------------------------------- removal race

/// Promise: removing a tenant ends it at one point of the log. Its requests still in
/// flight then either were applied before the removal (and their sessions ended with
/// it) or are refused UNAUTHENTICATED; none is applied after it, and the cluster goes
/// on serving everyone else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_removed_while_its_requests_are_in_flight_leaves_nothing_behind() {
    /// Loops creating sessions as the tenant while it is removed.
    const RACERS: usize = 8;
    let mut cluster = started(ClusterOptions::default()).await;
    let admin = Raw::admin(&cluster);
    let racer = Raw::with_token(&cluster, &add_tenant(&cluster, "racer", pb::Quotas::default()).await);
    let created = Arc::new(AtomicU64::new(0));
    let racing: Vec<_> = (0..RACERS)
        .map(|_| {
            let (racer, created) = (racer.clone(), created.clone());
            tokio::spawn(async move {
                loop {
                    match racer.create_session(LONG_TTL_MS).await {
                        Ok(_) => created.fetch_add(1, Ordering::Relaxed),
                        Err(status) => return status,
                    };
                }
            })
        })
        .collect();
    wait::until(CONDITION_DEADLINE, "the racers to create sessions", || async {
        (created.load(Ordering::Relaxed) >= 2 * RACERS as u64).then_some(())
    })
    .await;
    let ended = admin.remove_tenant("racer").await.expect("remove the tenant while its requests fly");
    let stopped = tokio::time::timeout(CALL_DEADLINE, futures::future::join_all(racing)).await;
    let ids: Vec<u64> = cluster.nodes.keys().copied().collect();
    let Ok(stopped) = stopped else {
        let running: Vec<(u64, bool)> = ids.iter().map(|id| (*id, cluster.is_running(*id))).collect();
        panic!(
            "the tenant's CreateSessions in flight at its removal went unanswered for {CALL_DEADLINE:?}; nodes \
             running (id, running): {running:?}; see the nodes' logs below"
        );
    };
    for status in stopped {
        let status = status.expect("the racer task");
        refused(Err::<(), _>(status), &[UNAUTHENTICATED], "a CreateSession in flight when the tenant was removed");
    }
    assert_eq!(
        ended,
        created.load(Ordering::Relaxed),
        "every session created was created before the removal and ended with it"
    );

    // The cluster serves on, with nothing of the tenant left.
    for id in ids {
        assert!(cluster.is_running(id), "node {id} died:\n{}", cluster.log_tail(id));
    }
    let test = Raw::test_tenant(&cluster);
    test.create_session(LONG_TTL_MS).await.expect("another tenant still gets sessions");
    let sessions = admin.list_sessions("").await.expect("the admin lists every session");
    let left: Vec<&pb::SessionInfo> = sessions.iter().filter(|session| session.tenant != TEST_TENANT).collect();
    assert!(left.is_empty(), "sessions outlived their tenant: {left:?}");
    refused(admin.list_sessions("racer").await, &[UNKNOWN_TENANT], "the removed tenant's sessions");
}

// ---------------------------------------------------------------- 7. hostile connections

/// Connections a flooding address opens per second.
const FLOOD_CONNECTS_PER_S: u64 = 400;
/// The flood's sockets the test keeps open at once (they send nothing).
const FLOOD_SOCKETS_KEPT: usize = 600;
/// How long a client from another address may take to connect and be answered.
const SERVED_WITHIN: Duration = Duration::from_secs(1);

/// Promise: connections that send nothing keep no one else out, without any
/// credential being needed to try. While 127.0.0.2 opens 400 connections a second to
/// the leader's client port and sends nothing on them (keeping hundreds open), a
/// client from 127.0.0.1 connects afresh and is answered within a second, again and
/// again; and the flooding address holds no more than its share of the port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connect_flood_from_one_address_leaves_clients_from_others_served_within_a_second() {
    let cluster = started(ClusterOptions::default()).await;
    let leader = cluster.wait_for_leader(LEADER_DEADLINE).await;
    let address: std::net::SocketAddr = cluster.nodes[&leader].client_addr.parse().expect("a socket address");
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (attempted, connected) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let flood = tokio::spawn({
        let (stop, attempted, connected) = (stop.clone(), attempted.clone(), connected.clone());
        async move {
            let mut kept = std::collections::VecDeque::new();
            let mut ticks = tokio::time::interval(Duration::from_micros(1_000_000 / FLOOD_CONNECTS_PER_S));
            while !stop.load(Ordering::Relaxed) {
                ticks.tick().await;
                let socket = tokio::net::TcpSocket::new_v4().expect("a socket");
                socket.bind("127.0.0.2:0".parse().unwrap()).expect("bind the flooding address");
                attempted.fetch_add(1, Ordering::Relaxed);
                if let Ok(Ok(stream)) = tokio::time::timeout(Duration::from_millis(100), socket.connect(address)).await
                {
                    connected.fetch_add(1, Ordering::Relaxed);
                    kept.push_back(stream);
                    if kept.len() > FLOOD_SOCKETS_KEPT {
                        kept.pop_front();
                    }
                }
            }
        }
    });
    wait::until(CONDITION_DEADLINE, "the flood to have tried 1,000 connections", || async {
        (attempted.load(Ordering::Relaxed) >= 1_000).then_some(())
    })
    .await;
    let mut slowest = Duration::ZERO;
    for attempt in 0..10 {
        // A new client each time: a new connection and handshake from 127.0.0.1.
        let fresh = Raw::admin(&cluster);
        let started = Instant::now();
        let answer = tokio::time::timeout(SERVED_WITHIN, fresh.status_of(&address.to_string())).await;
        let took = started.elapsed();
        let status = answer.unwrap_or_else(|_| panic!("attempt {attempt}: not answered within {SERVED_WITHIN:?}"));
        assert_eq!(status.expect("the status").node_id, leader);
        slowest = slowest.max(took);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    stop.store(true, Ordering::Relaxed);
    flood.await.expect("the flood ends");
    let (attempted, connected) = (attempted.load(Ordering::Relaxed), connected.load(Ordering::Relaxed));
    println!("{connected} of {attempted} flood connects made; the slowest fresh client was answered in {slowest:?}");
    let log = cluster.log_text(leader);
    assert!(
        log.contains("its address already has 128 handshakes in progress"),
        "the flood was held to its share: {log}"
    );

    // A connection that sends nothing is closed at the 2 s deadline for its first bytes.
    let socket = tokio::net::TcpSocket::new_v4().expect("a socket");
    socket.bind("127.0.0.3:0".parse().unwrap()).expect("bind another address");
    let mut idle = socket.connect(address).await.expect("connect");
    let opened = Instant::now();
    let mut byte = [0u8; 1];
    let read = tokio::time::timeout(Duration::from_secs(8), tokio::io::AsyncReadExt::read(&mut idle, &mut byte)).await;
    let waited = opened.elapsed();
    assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "an idle connection stayed open 8 s: {read:?}");
    assert!(
        Duration::from_millis(1_500) < waited && waited < Duration::from_secs(4),
        "an idle connection was closed after {waited:?}, not at the 2 s deadline"
    );
}
