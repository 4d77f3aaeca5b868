//! The attack workload (`leasehold-jepsen workload-worker --workload attack`): one
//! worker process acting as a second tenant, "intruder", which keeps trying, all
//! run long and whatever the nemesis does, to get past the trust rules (DESIGN.md,
//! Trust; invariant 7):
//!
//! * (a) unauthenticated — requests with no credential, a made-up bearer token, or
//!   a client certificate from a rogue CA.
//! * (b) admin — membership, tenant management and the clock knob with the
//!   intruder's tenant token.
//! * (c) session hijack — releases, acquires, closes, keepalives and resigns naming
//!   other tenants' sessions (ids guessed near the commit index, or leaked from the
//!   other workers' histories: ids are log indexes, no secret), and its own session
//!   with a wrong secret.
//! * (d) cross-tenant — the test tenant's lock, semaphore and election names read in
//!   the intruder's namespace must be empty, a read naming tenant "test" must be
//!   refused, session lists and descriptions must show no other tenant's session; and
//!   with its own session, an acquire of a lock the workers use must find it free and
//!   a semaphore limit change must find no semaphore (the intruder's namespace).
//! * (e) peer port — Raft messages (well-formed, so that they pass the decoder, or
//!   garbage) and a retire notice sent with a node certificate from a rogue CA, with
//!   the intruder's own certificate from the real CA, or with none; and, with node
//!   certificates the cluster CA signed (a stolen node key): an admin command appended,
//!   a vote and a heartbeat far ahead of the cluster's term from a node that was never
//!   a member; a member's messages with forged headers; a member's retire notice to a
//!   voter.
//!
//! Every try is one `attack` operation in the history, named after the attack
//! (`Attack::name`): ok when the attack succeeded (an answer that should not exist),
//! fail when refused, info when no answer came (a fault). `checker::attacks` fails
//! the run on any success, and when some attack was never refused.
//!
//! The worker gets the intruder's token and certificate, the cluster CA's
//! certificate and node certificates (every member's and `NON_MEMBER_NODE_ID`'s),
//! never the admin token nor the test tenant's. Every choice it makes
//! (attack order, targets, made-up tokens and secrets) comes from its seed; only the
//! key pairs of its rogue certificates come from the system's randomness.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use leasehold::proto as pb;
use leasehold::proto::errors::{error_metadata, error_reason, METADATA_LEADER};
use leasehold::proto::ErrorReason;
use leasehold::{certs, client::Transport};
use rand::rngs::StdRng;
use rand::seq::{IndexedRandom, SliceRandom};
use rand::{Rng, SeedableRng};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::{Code, Status};

use rustls_pki_types::pem::PemObject;

use crate::history::{monotonic_ns, Function, HistoryWriter, Kind, Phase, Record, UNEXPECTED_REFUSAL};
use crate::peer_messages::{self, Headers, FORGED_TERM_AHEAD};
use crate::workload::{Workload, WorkloadWorkerArguments, REQUEST_DEADLINE_MS};

/// The tenant the attack worker acts as (made by the harness, with small quotas).
pub const INTRUDER_TENANT: &str = "intruder";
/// The tenant whose state the intruder is after (`cluster::TEST_TENANT`).
pub const VICTIM_TENANT: &str = crate::cluster::TEST_TENANT;
/// The lock the intruder holds with its own session, for the wrong-secret attack.
pub const OWN_LOCK: &str = "intruder/held";
/// How long one attack's requests may take before the try is info.
pub const ATTACK_RPC_TIMEOUT_MS: u64 = 3_000;
/// How long an Observe stream is read after its first message.
pub const OBSERVE_WINDOW_MS: u64 = 300;
/// How many not-leader redirects one try follows.
pub const LEADER_HOPS_MAX: usize = 3;
/// Pause between two tries: the intruder must not starve the workers of the machine.
/// Idle connections one try of `Attack::IdleHandshakes` opens, from an address of
/// its own (the nodes' budget per address is not the workers' then), and how long it
/// holds them: past the nodes' 2 s deadline for a connection's first bytes.
pub const IDLE_CONNECTIONS_PER_TRY: usize = 64;
pub const IDLE_SOURCE: &str = "127.0.0.250";
pub const IDLE_HOLD_MS: u64 = 3_500;
/// Slow readers one try of `Attack::SlowReaderStatus` opens, from an address of its
/// own (past the status page's 16 connections per address), the requests each
/// pipelines (more answer than the socket buffers hold), and how long it holds them:
/// past the page's 10 s write deadline.
pub const SLOW_READERS_PER_TRY: usize = 24;
pub const SLOW_READER_SOURCE: &str = "127.0.0.251";
pub const SLOW_READER_REQUESTS: usize = 64;
pub const SLOW_READER_HOLD_MS: u64 = 12_500;
/// The share of one address on the status page.
pub const STATUS_CONNECTIONS_PER_SOURCE: usize = leasehold_server::node::status::STATUS_LIMITS.sources.connections;
/// How often a `StreamAfterRotation` try sends a keepalive, how long after it sees
/// the rotation the stream may still answer (the node applies the rotation; the
/// leader may change), and how long it waits for a rotation at most (the harness
/// rotates every `harness::STOLEN_ROTATION_MS`).
pub const ROTATION_KEEPALIVE_MS: u64 = 200;
pub const ROTATION_GRACE_MS: u64 = 3_000;
pub const ROTATION_WAIT_MS: u64 = 12_000;
/// How long a node that runs takes to close a connection that sends nothing (its
/// first-bytes deadline, 2 s), with room for a busy machine: a node that does not
/// within it is paused (by the nemesis), and a try against it says nothing.
pub const ALIVE_PROBE_MS: u64 = 4_000;
pub const ATTACK_PAUSE_MS_MIN: u64 = 10;
pub const ATTACK_PAUSE_MS_MAX: u64 = 40;
/// Guessed session ids lie this far below the commit index at most.
pub const GUESS_WINDOW_ENTRIES: u64 = 256;
/// Leaked (session, name, token) triples kept per other worker, its newest.
pub const LEAKS_PER_HISTORY_MAX: usize = 8;
/// How much of each other worker's history is read for leaked ids.
pub const LEAK_TAIL_BYTES: u64 = 8_192;
/// Bytes of a made-up session secret (the server's are 16).
pub const SECRET_BYTES: usize = 16;
/// The peer codec's format version (`server/src/raft/codec.rs`, FORMAT_VERSION):
/// the crafted Raft messages carry it so that they pass the decoder and reach the
/// identity check. If the server's version moves on, they are refused as malformed
/// (INVALID_ARGUMENT), which the history shows as an unexpected refusal.
pub const PEER_FORMAT_VERSION: u8 = 2;
/// The error of a try refused in the TLS handshake (no gRPC status came back).
pub const TLS_REFUSED: &str = "TLS_REFUSED";
/// The error of a read in the intruder's own namespace that showed nothing: what a
/// refused snoop looks like.
pub const NOTHING_SEEN: &str = "NOTHING_SEEN";
/// The error of a keepalive answered `alive = false`.
pub const NOT_ALIVE: &str = "NOT_ALIVE";
/// The node id of the cluster-CA certificate that is never a member: above every
/// node id a run uses, so that no replacement ever makes it one.
pub const NON_MEMBER_NODE_ID: u64 = 9;
/// The forged `leasehold-log-command-level` of a member's vote: above every build's.
pub const FORGED_LOG_COMMAND_LEVEL: u32 = 999;
/// The forged `leasehold-record` of a member's heartbeat says the receiver is this
/// incarnation (recorded at an index and applied index no log reaches).
pub const FORGED_RECORD_INCARNATION: u64 = 12_345;
pub const FORGED_RECORD_INDEX: u64 = 999_999;
/// How many voters one try of a forged-message attack asks for their own status
/// before it gives up its turn (see `Intruder::voter_target`).
pub const VOTER_TARGET_TRIES_MAX: usize = 2;
/// The name of a node certificate file in `--node-certificates` (`node-<id>.pem`, its
/// key `node-<id>.key`).
pub const NODE_CERTIFICATE_PREFIX: &str = "node-";

/// The five families of attacks; the checker wants refusals of each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum AttackKind {
    Unauthenticated,
    Admin,
    Hijack,
    CrossTenant,
    PeerPort,
}

impl AttackKind {
    pub const ALL: [AttackKind; 5] = [
        AttackKind::Unauthenticated,
        AttackKind::Admin,
        AttackKind::Hijack,
        AttackKind::CrossTenant,
        AttackKind::PeerPort,
    ];

    pub fn name(self) -> &'static str {
        match self {
            AttackKind::Unauthenticated => "(a) unauthenticated",
            AttackKind::Admin => "(b) admin",
            AttackKind::Hijack => "(c) session hijack",
            AttackKind::CrossTenant => "(d) cross-tenant",
            AttackKind::PeerPort => "(e) peer port",
        }
    }
}

/// One attack; its name is the history's `key`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Attack {
    /// Status, CreateSession, DescribeLock or ListSessions with no credential.
    NoCredential,
    /// The same with a bearer token nobody was given.
    MadeUpToken,
    /// The same with a client certificate naming the test tenant, from a rogue CA.
    RogueClientCertificate,
    /// Connections to a client or peer port that send nothing, held past the
    /// nodes' first-bytes deadline: each must have been closed by then.
    IdleHandshakes,
    /// The same on the metrics port.
    MetricsIdle,
    /// Connections to the status page that ask for `page.js` again and again and
    /// never read: each must have been closed within the page's write deadline,
    /// and past the address's share at once.
    SlowReaderStatus,
    /// A keepalive stream opened with a leaked token of tenant `stolen`, kept open
    /// while the operator rotates that token: it must end UNAUTHENTICATED.
    StreamAfterRotation,
    AddMember,
    RemoveMember,
    AddTenant,
    SkewClock,
    ListTenants,
    RotateTenantToken,
    SetTenantQuotas,
    RemoveTenant,
    /// Admin.EndSession of a session of the workers' tenant.
    EndSession,
    /// Release a lock of the lock workloads' names in another tenant's session.
    HijackRelease,
    HijackSemaphoreRelease,
    HijackResign,
    /// Acquire in another tenant's session.
    HijackAcquire,
    HijackCloseSession,
    /// A keepalive for another tenant's session: must be answered `alive = false`.
    HijackKeepAlive,
    /// Release, acquire, keepalive or close on the intruder's own session with a
    /// wrong secret.
    WrongSecret,
    /// DescribeLock of the lock workloads' names: the intruder's namespace is empty.
    DescribeLock,
    CheckFence,
    DescribeSemaphore,
    Leader,
    /// The first messages of an Observe stream of an election the workers use.
    Observe,
    /// ListSessions: only the intruder's own sessions.
    ListSessions,
    /// DescribeSession of another tenant's session.
    DescribeSession,
    /// A read naming `tenant: "test"`: refused for a tenant.
    OtherTenantRead,
    /// An acquire (then release) of a lock the workers use, with the intruder's own
    /// session: its namespace has it free; "busy" names another tenant's holder.
    NamespaceAcquire,
    /// Semaphores.SetLimit of a semaphore the workers use, with the intruder's own
    /// session: nobody uses it in its namespace, so it is refused.
    NamespaceSetLimit,
    /// Raft messages with a node certificate from a rogue CA.
    PeerRogueCa,
    /// Raft messages with the intruder's certificate from the real CA (not a node's).
    PeerTenantCertificate,
    /// Raft messages with no client certificate.
    PeerNoCertificate,
    /// An AppendEntries holding a RotateTenantToken with the admin as its caller, far
    /// ahead of the cluster's term, from a cluster-CA certificate of a node that was
    /// never a member.
    PeerNonMemberAppend,
    /// A Vote far ahead of the cluster's term from the never-member's certificate.
    PeerNonMemberVote,
    /// A member's real certificate with forged headers: a term-0 Vote whose log command
    /// level is above every build, a term-0 heartbeat saying the receiver is another
    /// incarnation, or a heartbeat without the member and cluster-id headers.
    PeerForgedHeaders,
    /// A heartbeat far ahead of the cluster's term from the never-member's certificate.
    PeerHighTerm,
    /// A retire notice to a voter with a member's certificate (the leader's, half the
    /// time).
    PeerRetireVoter,
}

impl Attack {
    pub const ALL: [Attack; 41] = [
        Attack::NoCredential,
        Attack::MadeUpToken,
        Attack::RogueClientCertificate,
        Attack::IdleHandshakes,
        Attack::MetricsIdle,
        Attack::SlowReaderStatus,
        Attack::StreamAfterRotation,
        Attack::AddMember,
        Attack::RemoveMember,
        Attack::AddTenant,
        Attack::SkewClock,
        Attack::ListTenants,
        Attack::RotateTenantToken,
        Attack::SetTenantQuotas,
        Attack::RemoveTenant,
        Attack::EndSession,
        Attack::HijackRelease,
        Attack::HijackSemaphoreRelease,
        Attack::HijackResign,
        Attack::HijackAcquire,
        Attack::HijackCloseSession,
        Attack::HijackKeepAlive,
        Attack::WrongSecret,
        Attack::DescribeLock,
        Attack::CheckFence,
        Attack::DescribeSemaphore,
        Attack::Leader,
        Attack::Observe,
        Attack::ListSessions,
        Attack::DescribeSession,
        Attack::OtherTenantRead,
        Attack::NamespaceAcquire,
        Attack::NamespaceSetLimit,
        Attack::PeerRogueCa,
        Attack::PeerTenantCertificate,
        Attack::PeerNoCertificate,
        Attack::PeerNonMemberAppend,
        Attack::PeerNonMemberVote,
        Attack::PeerForgedHeaders,
        Attack::PeerHighTerm,
        Attack::PeerRetireVoter,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Attack::NoCredential => "no-credential",
            Attack::MadeUpToken => "made-up-token",
            Attack::RogueClientCertificate => "rogue-client-certificate",
            Attack::IdleHandshakes => "idle-handshakes",
            Attack::MetricsIdle => "metrics-idle",
            Attack::SlowReaderStatus => "slow-reader-status",
            Attack::StreamAfterRotation => "stream-after-rotation",
            Attack::AddMember => "admin-add-member",
            Attack::RemoveMember => "admin-remove-member",
            Attack::AddTenant => "admin-add-tenant",
            Attack::SkewClock => "admin-skew-clock",
            Attack::ListTenants => "admin-list-tenants",
            Attack::RotateTenantToken => "admin-rotate-tenant-token",
            Attack::SetTenantQuotas => "admin-set-tenant-quotas",
            Attack::RemoveTenant => "admin-remove-tenant",
            Attack::EndSession => "admin-end-session",
            Attack::HijackRelease => "hijack-release",
            Attack::HijackSemaphoreRelease => "hijack-semaphore-release",
            Attack::HijackResign => "hijack-resign",
            Attack::HijackAcquire => "hijack-acquire",
            Attack::HijackCloseSession => "hijack-close-session",
            Attack::HijackKeepAlive => "hijack-keepalive",
            Attack::WrongSecret => "own-session-wrong-secret",
            Attack::DescribeLock => "read-describe-lock",
            Attack::CheckFence => "read-check-fence",
            Attack::DescribeSemaphore => "read-describe-semaphore",
            Attack::Leader => "read-leader",
            Attack::Observe => "read-observe",
            Attack::ListSessions => "read-list-sessions",
            Attack::DescribeSession => "read-describe-session",
            Attack::OtherTenantRead => "read-tenant-test",
            Attack::NamespaceAcquire => "namespace-acquire",
            Attack::NamespaceSetLimit => "namespace-set-limit",
            Attack::PeerRogueCa => "peer-rogue-ca",
            Attack::PeerTenantCertificate => "peer-tenant-certificate",
            Attack::PeerNoCertificate => "peer-no-certificate",
            Attack::PeerNonMemberAppend => "peer-non-member-append",
            Attack::PeerNonMemberVote => "peer-non-member-vote",
            Attack::PeerForgedHeaders => "peer-forged-headers",
            Attack::PeerHighTerm => "peer-high-term",
            Attack::PeerRetireVoter => "peer-retire-voter",
        }
    }

    /// Whether the attack needs what the previous release (`scripts/previous-release`,
    /// the rolling upgrade's older side) lacks: only the peer port's membership checks
    /// refuse it, the RPC is newer (`EndSession`), it holds connections longer than
    /// that release's listeners let pass (`IdleHandshakes`, `MetricsIdle`), or the port
    /// is newer (`SlowReaderStatus`). It is not tried while such nodes run.
    pub fn needs_this_release(self) -> bool {
        matches!(
            self,
            Attack::EndSession
                | Attack::IdleHandshakes
                | Attack::MetricsIdle
                | Attack::SlowReaderStatus
                | Attack::StreamAfterRotation
                | Attack::PeerNonMemberAppend
                | Attack::PeerNonMemberVote
                | Attack::PeerForgedHeaders
                | Attack::PeerHighTerm
                | Attack::PeerRetireVoter
        )
    }

    pub fn from_name(name: &str) -> Option<Attack> {
        Attack::ALL.into_iter().find(|attack| attack.name() == name)
    }

    pub fn kind(self) -> AttackKind {
        match self {
            Attack::NoCredential
            | Attack::MadeUpToken
            | Attack::RogueClientCertificate
            | Attack::IdleHandshakes
            | Attack::MetricsIdle
            | Attack::SlowReaderStatus
            | Attack::StreamAfterRotation => AttackKind::Unauthenticated,
            Attack::AddMember
            | Attack::RemoveMember
            | Attack::AddTenant
            | Attack::SkewClock
            | Attack::ListTenants
            | Attack::RotateTenantToken
            | Attack::SetTenantQuotas
            | Attack::RemoveTenant
            | Attack::EndSession => AttackKind::Admin,
            Attack::HijackRelease
            | Attack::HijackSemaphoreRelease
            | Attack::HijackResign
            | Attack::HijackAcquire
            | Attack::HijackCloseSession
            | Attack::HijackKeepAlive
            | Attack::WrongSecret => AttackKind::Hijack,
            Attack::DescribeLock
            | Attack::CheckFence
            | Attack::DescribeSemaphore
            | Attack::Leader
            | Attack::Observe
            | Attack::ListSessions
            | Attack::DescribeSession
            | Attack::OtherTenantRead
            | Attack::NamespaceAcquire
            | Attack::NamespaceSetLimit => AttackKind::CrossTenant,
            Attack::PeerRogueCa
            | Attack::PeerTenantCertificate
            | Attack::PeerNoCertificate
            | Attack::PeerNonMemberAppend
            | Attack::PeerNonMemberVote
            | Attack::PeerForgedHeaders
            | Attack::PeerHighTerm
            | Attack::PeerRetireVoter => AttackKind::PeerPort,
        }
    }
}

/// How one try ended.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    /// The attack got in; what the answer showed.
    Succeeded(String),
    /// Refused; the reason (`UNEXPECTED_REFUSAL` first when not an expected one).
    Refused(String),
    /// No answer (a fault): proves nothing.
    Unknown(String),
}

/// What one request got back.
enum Answer<T> {
    Ok(T),
    Status(Status),
    Timeout,
}

/// The server's refusal reasons that mean "not now", not "no": the try is unknown.
fn is_transient(reason: ErrorReason) -> bool {
    matches!(
        reason,
        ErrorReason::NotLeader
            | ErrorReason::ShuttingDown
            | ErrorReason::CommitUncertain
            | ErrorReason::LeadershipUnconfirmed
            | ErrorReason::ReadNotApplied
    )
}

/// The status's message and the chain of errors under it, for classing a status that
/// carries no reason (it came from the transport) and for the history.
fn error_chain(status: &Status) -> String {
    let mut text = format!("{:?}: {}", status.code(), status.message());
    let mut source = std::error::Error::source(status);
    while let Some(error) = source {
        text.push_str(&format!(": {error}"));
        source = error.source();
    }
    text
}

/// Whether a status without a reason is a TLS handshake's refusal (a certificate
/// the server does not accept: rustls answers with an alert and drops the
/// connection). Decided on the transport's error text, for want of a type to match:
/// a wording that changes makes such tries unknown, and then the checker finds the
/// attack never refused — loud, not a silent pass.
fn looks_like_tls_refusal(chain: &str) -> bool {
    let chain = chain.to_ascii_lowercase();
    ["alert", "certificate", "handshake", "tls", "unknownca", "unknown ca"].iter().any(|word| chain.contains(word))
}

/// Whether an unknown try's error is a connection the server dropped (not one it
/// refused, not a deadline): with TLS 1.3 a client learns that its certificate was
/// refused only on its first read after the handshake, and often its first write
/// finds the connection already closed instead of reading the alert.
fn is_dropped_connection(why: &str) -> bool {
    let why = why.to_ascii_lowercase();
    !why.contains("refused") && ["closed", "broken pipe", "reset"].iter().any(|word| why.contains(word))
}

/// Classes an error status: `expected` reasons are refusals, transient ones unknown,
/// any other reason an unexpected refusal. A status without a reason is a TLS
/// refusal when `handshake_refusal` allows one and the error says so, else unknown
/// (a broken connection, a deadline) or, for other codes, an unexpected refusal.
fn classify(status: &Status, expected: &[ErrorReason], handshake_refusal: bool) -> Outcome {
    if let Some(reason) = error_reason(status) {
        if expected.contains(&reason) {
            // The message too: what a refusal tells an intruder is worth reading.
            return Outcome::Refused(format!("{}: {}", reason.as_str_name(), status.message()));
        }
        if is_transient(reason) {
            return Outcome::Unknown(format!("{}: {}", reason.as_str_name(), status.message()));
        }
        return Outcome::Refused(format!("{UNEXPECTED_REFUSAL} {}: {}", reason.as_str_name(), status.message()));
    }
    let chain = error_chain(status);
    if handshake_refusal && looks_like_tls_refusal(&chain) {
        return Outcome::Refused(format!("{TLS_REFUSED}: {chain}"));
    }
    match status.code() {
        Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::Unknown => Outcome::Unknown(chain),
        _ => Outcome::Refused(format!("{UNEXPECTED_REFUSAL} {chain}")),
    }
}

/// An answer that should never be OK: an OK is the attack's success (`evidence`
/// describes it), an error is classed by `classify`.
fn must_refuse<T>(
    answer: Answer<T>,
    expected: &[ErrorReason],
    handshake_refusal: bool,
    evidence: impl FnOnce(T) -> String,
) -> Outcome {
    match answer {
        Answer::Ok(value) => Outcome::Succeeded(evidence(value)),
        Answer::Status(status) => classify(&status, expected, handshake_refusal),
        Answer::Timeout => Outcome::Unknown(format!("no answer within {ATTACK_RPC_TIMEOUT_MS} ms")),
    }
}

/// A refusal of a request that named only a session id and that names the session's
/// tenant has told the intruder whose the session is: a leak, so the attack's success.
fn names_the_owner(outcome: Outcome) -> Outcome {
    match outcome {
        Outcome::Refused(text) if text.contains(&format!("\"{VICTIM_TENANT}\"")) => {
            Outcome::Succeeded(format!("the refusal named the session's tenant: {text}"))
        }
        other => other,
    }
}

/// A read's outcome. Naming another tenant, any answer is the attack's success; in
/// the intruder's own namespace, `judge` says whether the answer showed anything.
fn judge_read<T: std::fmt::Debug>(
    other_tenant: bool,
    reply: Answer<T>,
    expected: &[ErrorReason],
    judge: impl FnOnce(T) -> Outcome,
) -> Outcome {
    match reply {
        Answer::Ok(value) if other_tenant => Outcome::Succeeded(format!("another tenant's read answered {value:?}")),
        Answer::Ok(value) => judge(value),
        Answer::Status(status) => classify(&status, expected, false),
        Answer::Timeout => Outcome::Unknown(format!("no answer within {ATTACK_RPC_TIMEOUT_MS} ms")),
    }
}

/// A read of the intruder's own namespace that showed nothing of anyone else's.
fn nothing_seen(what: &str) -> Outcome {
    Outcome::Refused(format!("{NOTHING_SEEN}: {what}"))
}

/// Waits for a request's answer at most `ATTACK_RPC_TIMEOUT_MS`.
async fn answer<T>(future: impl Future<Output = Result<tonic::Response<T>, Status>>) -> Answer<T> {
    match tokio::time::timeout(Duration::from_millis(ATTACK_RPC_TIMEOUT_MS), future).await {
        Ok(Ok(response)) => Answer::Ok(response.into_inner()),
        Ok(Err(status)) => Answer::Status(status),
        Err(_) => Answer::Timeout,
    }
}

/// A request with the attack's deadline.
fn request<T>(message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(Duration::from_millis(ATTACK_RPC_TIMEOUT_MS));
    request
}

/// Runs `call` on the node at `first` with `client`'s credential, following up to
/// `LEADER_HOPS_MAX` not-leader answers to the leader they name.
async fn on_leader<T, F, Fut>(client: &leasehold::Client, first: String, mut call: F) -> Answer<T>
where
    F: FnMut(Transport) -> Fut,
    Fut: Future<Output = Result<tonic::Response<T>, Status>>,
{
    let mut endpoint = first;
    let mut last = Answer::Timeout;
    for _ in 0..LEADER_HOPS_MAX {
        let Ok(channel) = client.raw_channel(&endpoint) else {
            return last;
        };
        let reply = answer(call(channel)).await;
        if let Answer::Status(status) = &reply {
            if error_reason(status) == Some(ErrorReason::NotLeader) {
                if let Some(leader) = error_metadata(status, METADATA_LEADER).filter(|leader| !leader.is_empty()) {
                    endpoint = leader;
                    last = reply;
                    continue;
                }
            }
        }
        return reply;
    }
    last
}

/// postcard's unsigned varint (LEB128).
fn varint(mut value: u64, bytes: &mut Vec<u8>) {
    while value >= 0x80 {
        bytes.push((value as u8 & 0x7f) | 0x80);
        value >>= 7;
    }
    bytes.push(value as u8);
}

/// A well-formed openraft `VoteRequest` from `node` in term 0 (harmless if it were
/// taken: every node's vote is higher), as the peer codec encodes it: the format
/// version, then postcard of `{ vote: { leader_id: { term, node_id }, committed },
/// last_log_id: None }`.
pub fn crafted_vote(node: u64) -> Vec<u8> {
    let mut bytes = vec![PEER_FORMAT_VERSION];
    varint(0, &mut bytes);
    varint(node, &mut bytes);
    bytes.push(0); // committed: false
    bytes.push(0); // last_log_id: None
    bytes
}

/// A well-formed, empty openraft `AppendEntriesRequest` (a heartbeat) from `node` in
/// term 0: `{ vote, prev_log_id: None, entries: [], leader_commit: None }`.
pub fn crafted_heartbeat(node: u64) -> Vec<u8> {
    let mut bytes = vec![PEER_FORMAT_VERSION];
    varint(0, &mut bytes);
    varint(node, &mut bytes);
    bytes.push(1); // committed: true
    bytes.push(0); // prev_log_id: None
    varint(0, &mut bytes); // no entries
    bytes.push(0); // leader_commit: None
    bytes
}

/// A session id, lock name and token of another worker, read from its history.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Leak {
    session: u64,
    function: Function,
    key: String,
    token: Option<u64>,
}

/// The last records (at most `LEAKS_PER_HISTORY_MAX`) of every history in
/// `directory` but `own`, as leaks.
fn read_leaks(directory: &Path, own: &Path) -> Vec<Leak> {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(entries) = std::fs::read_dir(directory) else {
        return Vec::new();
    };
    let mut paths: Vec<PathBuf> = entries
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .filter(|path| path.extension().is_some_and(|extension| extension == "jsonl") && path != own)
        .collect();
    // Directory order is the file system's: sort, so that the seed decides.
    paths.sort();
    let mut leaks = Vec::new();
    for path in paths {
        let Ok(mut file) = std::fs::File::open(&path) else { continue };
        let length = file.metadata().map(|metadata| metadata.len()).unwrap_or(0);
        let _ = file.seek(SeekFrom::Start(length.saturating_sub(LEAK_TAIL_BYTES)));
        let mut text = String::new();
        if file.read_to_string(&mut text).is_err() {
            continue;
        }
        let mut found = Vec::new();
        for line in text.lines() {
            let Ok(record) = serde_json::from_str::<Record>(line) else { continue };
            if record.session == 0 && record.leader_session.is_none() {
                continue;
            }
            let session = if record.session != 0 { record.session } else { record.leader_session.unwrap_or(0) };
            found.push(Leak { session, function: record.function, key: record.key, token: record.token });
        }
        let keep = found.len().saturating_sub(LEAKS_PER_HISTORY_MAX);
        leaks.extend(found.split_off(keep));
    }
    leaks
}

/// The intruder's own session and the token of the lock it holds with it.
struct Own {
    session: leasehold::Session,
    held_token: Option<u64>,
}

/// Where to send a Raft message on the peer port, and as whom.
enum PeerIdentity {
    RogueNode,
    Tenant,
    Nobody,
}

struct Intruder {
    arguments: WorkloadWorkerArguments,
    random: StdRng,
    history: HistoryWriter,
    sequence: u64,
    endpoints: Vec<String>,
    peer_endpoints: Vec<String>,
    /// The nodes' metrics and status page addresses (host:port).
    metrics_endpoints: Vec<String>,
    status_endpoints: Vec<String>,
    /// Tries that run in tasks of their own, completed once done.
    pending: Vec<(u64, Attack, tokio::task::JoinHandle<Outcome>)>,
    /// The nodes' peer addresses by id, as the harness laid the cluster out: an
    /// attacker on the network finds them by scanning, and a tenant's Status does not
    /// list them.
    peer_addresses: BTreeMap<u64, String>,
    ca_pem: Vec<u8>,
    /// The intruder's own credential (its tenant token).
    client: leasehold::Client,
    /// The intruder's certificate from the real CA (a tenant's, not a node's).
    tenant_identity: (Vec<u8>, Vec<u8>),
    /// Node certificates from the real CA (PEM certificate and key) by node id: every
    /// member's and `NON_MEMBER_NODE_ID`'s, as a stolen node key would give them.
    node_identities: BTreeMap<u64, (String, String)>,
    /// The client id of the request ids the intruder makes up.
    client_id: u64,
    request_sequence: u64,
    /// The last status a node answered (commit index, members, cluster name).
    status: Option<pb::StatusResponse>,
    own: Option<Own>,
    /// Every session the intruder created (its own, which it may see).
    own_sessions: BTreeSet<u64>,
    /// Every token granted to the intruder (its own grants, which it may see).
    own_tokens: BTreeSet<u64>,
    leaks: Vec<Leak>,
}

impl Intruder {
    fn record(&mut self, sequence: u64, kind: Kind, attack: Attack, value: Option<String>, outcome: Option<&Outcome>) {
        let (error, evidence) = match outcome {
            Some(Outcome::Succeeded(evidence)) => (None, Some(evidence.clone())),
            Some(Outcome::Refused(reason)) | Some(Outcome::Unknown(reason)) => (Some(reason.clone()), None),
            None => (None, None),
        };
        let record = Record {
            process: self.arguments.process,
            sequence,
            kind,
            function: Function::Attack,
            key: attack.name().to_string(),
            session: self.own.as_ref().map(|own| own.session.id()).unwrap_or(0),
            token: None,
            value,
            error,
            alive_ns: None,
            leader_session: None,
            evidence,
            phase: Phase::Main,
            time_ns: monotonic_ns(),
        };
        if let Err(error) = self.history.append(&record) {
            panic!("cannot append to the history: {error}");
        }
    }

    fn invoke(&mut self, attack: Attack, tried: String) -> u64 {
        self.sequence += 1;
        let sequence = self.sequence;
        self.record(sequence, Kind::Invoke, attack, Some(tried), None);
        sequence
    }

    fn complete(&mut self, sequence: u64, attack: Attack, outcome: Outcome) {
        let kind = match outcome {
            Outcome::Succeeded(_) => Kind::Ok,
            Outcome::Refused(_) => Kind::Fail,
            Outcome::Unknown(_) => Kind::Info,
        };
        self.record(sequence, kind, attack, None, Some(&outcome));
    }

    fn request_id(&mut self) -> pb::RequestId {
        self.request_sequence += 1;
        pb::RequestId { client_id: self.client_id, sequence: self.request_sequence }
    }

    fn random_endpoint(&mut self) -> String {
        self.endpoints.choose(&mut self.random).expect("endpoints").clone()
    }

    /// The leader's client address as last seen, else a random node.
    fn leader_endpoint(&mut self) -> String {
        let known = self.status.as_ref().map(|status| status.leader_client_addr.clone()).unwrap_or_default();
        if self.endpoints.contains(&known) {
            known
        } else {
            self.random_endpoint()
        }
    }

    fn commit_index(&self) -> u64 {
        self.status.as_ref().map(|status| status.commit_index).unwrap_or(0)
    }

    fn member_ids(&self) -> Vec<u64> {
        self.status
            .as_ref()
            .map(|status| status.members.iter().map(|member| member.node_id).collect())
            .unwrap_or_default()
    }

    fn made_up_secret(&mut self) -> Vec<u8> {
        if self.random.random_bool(0.25) {
            return Vec::new();
        }
        let mut secret = vec![0u8; SECRET_BYTES];
        self.random.fill(secret.as_mut_slice());
        secret
    }

    /// A bearer token in the form the cluster hands out, that nobody was given.
    fn made_up_token(&mut self) -> String {
        let bytes: [u8; 32] = self.random.random();
        let hex: String = bytes.iter().map(|byte| format!("{byte:02x}")).collect();
        format!("tenant_{hex}")
    }

    /// The names the victim's workloads use for `function`'s kind of resource.
    fn victim_names(function: Function) -> Vec<String> {
        match function {
            Function::SemRelease | Function::SemAcquire => Workload::Semaphore.keys(),
            Function::Resign | Function::Campaign => Workload::Election.keys(),
            _ => Workload::Lock.keys().into_iter().chain(Workload::FencedCounter.keys()).collect(),
        }
    }

    /// Another tenant's session to hijack, and a name and token of `function`'s kind:
    /// leaked from a worker's history (half the time, when there are leaks), or
    /// guessed near the commit index. Never one of the intruder's own sessions.
    fn victim(&mut self, function: Function) -> (u64, String, u64, &'static str) {
        let grant = match function {
            Function::Release => Some(Function::Acquire),
            Function::SemRelease => Some(Function::SemAcquire),
            Function::Resign => Some(Function::Campaign),
            _ => None,
        };
        let own = &self.own_sessions;
        let leaks: Vec<Leak> = self
            .leaks
            .iter()
            .filter(|leak| !own.contains(&leak.session))
            .filter(|leak| grant.is_none_or(|grant| leak.function == grant && leak.token.is_some()))
            .cloned()
            .collect();
        let names = Self::victim_names(function);
        if !leaks.is_empty() && self.random.random_bool(0.5) {
            let leak = leaks.choose(&mut self.random).expect("leaks").clone();
            let name = if grant.is_some() { leak.key } else { names.choose(&mut self.random).expect("names").clone() };
            let token = leak.token.unwrap_or_else(|| leak.session + self.random.random_range(0..=GUESS_WINDOW_ENTRIES));
            return (leak.session, name, token, "leaked");
        }
        let commit = self.commit_index().max(1);
        let session = loop {
            let guess = commit.saturating_sub(self.random.random_range(0..=GUESS_WINDOW_ENTRIES)).max(1);
            if !self.own_sessions.contains(&guess) || self.own_sessions.len() as u64 >= commit {
                break guess;
            }
        };
        let token = self.random.random_range(session..=commit.max(session));
        let name = names.choose(&mut self.random).expect("names").clone();
        (session, name, token, "guessed")
    }

    /// Reads a node's status (any credential may): the commit index to guess session
    /// ids near, the members, the cluster name the peer port wants, the leader.
    async fn refresh_status(&mut self) {
        let endpoint = self.random_endpoint();
        if let Ok(Ok(status)) =
            tokio::time::timeout(Duration::from_millis(ATTACK_RPC_TIMEOUT_MS), self.client.status_of(&endpoint)).await
        {
            self.status = Some(status);
        }
    }

    /// Keeps a session of the intruder's own, holding `OWN_LOCK`.
    async fn ensure_own(&mut self) {
        let deadline = Duration::from_millis(REQUEST_DEADLINE_MS + ATTACK_RPC_TIMEOUT_MS);
        if self.own.as_ref().is_some_and(|own| own.session.state() == leasehold::SessionState::Lost) {
            self.own = None;
        }
        if self.own.is_none() {
            let ttl = Duration::from_millis(self.arguments.ttl_ms);
            match tokio::time::timeout(deadline, self.client.session(ttl)).await {
                Ok(Ok(session)) => {
                    self.own_sessions.insert(session.id());
                    self.own = Some(Own { session, held_token: None });
                }
                _ => return,
            }
        }
        let own = self.own.as_mut().expect("made above");
        if own.held_token.is_none() {
            if let Ok(Ok(Some(guard))) = tokio::time::timeout(deadline, own.session.try_lock(OWN_LOCK)).await {
                self.own_tokens.insert(guard.token());
                own.held_token = Some(guard.detach());
            }
        }
    }

    /// A try whose connection was dropped after a certificate the node should refuse
    /// (see `is_dropped_connection`) counts as refused in the handshake when the same
    /// node answers the intruder's own credential right after: it was up, so it
    /// closed the connection itself. Otherwise (a node killed at that moment) the try
    /// stays unknown.
    async fn confirm_drop(&self, outcome: Outcome, peer_or_client_endpoint: &str) -> Outcome {
        let Outcome::Unknown(why) = &outcome else {
            return outcome;
        };
        if !is_dropped_connection(why) {
            return outcome;
        }
        let host = |endpoint: &str| endpoint.rsplit_once(':').map(|(host, _)| host.to_string());
        let Some(endpoint) = self.endpoints.iter().find(|endpoint| host(endpoint) == host(peer_or_client_endpoint))
        else {
            return outcome;
        };
        let control =
            tokio::time::timeout(Duration::from_millis(ATTACK_RPC_TIMEOUT_MS), self.client.status_of(endpoint)).await;
        match control {
            Ok(Ok(_)) => {
                Outcome::Refused(format!("{TLS_REFUSED}: {why} (and {endpoint} answered a status right after)"))
            }
            _ => outcome,
        }
    }

    /// One try of `attack` (the wrong-secret attack waits for an own session).
    async fn attempt(&mut self, attack: Attack) {
        match attack.kind() {
            AttackKind::Unauthenticated if attack == Attack::IdleHandshakes => self.idle_connections(),
            AttackKind::Unauthenticated if attack == Attack::MetricsIdle => self.idle_metrics_connections(),
            AttackKind::Unauthenticated if attack == Attack::SlowReaderStatus => self.slow_status_readers(),
            AttackKind::Unauthenticated if attack == Attack::StreamAfterRotation => self.stream_after_rotation(),
            AttackKind::Unauthenticated => self.unauthenticated(attack).await,
            AttackKind::Admin => self.admin(attack).await,
            AttackKind::Hijack => self.hijack(attack).await,
            AttackKind::CrossTenant => match attack {
                Attack::NamespaceAcquire | Attack::NamespaceSetLimit => self.namespace_write(attack).await,
                _ => self.read(attack).await,
            },
            AttackKind::PeerPort => match attack {
                Attack::PeerRogueCa | Attack::PeerTenantCertificate | Attack::PeerNoCertificate => {
                    self.peer(attack).await
                }
                _ => self.forged(attack).await,
            },
        }
    }

    /// (a) Connections that send nothing, to a client or a peer port, from
    /// `IDLE_SOURCE`: held in a task of their own for `IDLE_HOLD_MS`, so the other
    /// attacks go on meanwhile; the try completes when the task has looked.
    fn idle_connections(&mut self) {
        let endpoint = if self.random.random_bool(0.5) {
            self.peer_endpoints.choose(&mut self.random).expect("peer endpoints").clone()
        } else {
            self.random_endpoint()
        };
        let tried = format!(
            "{IDLE_CONNECTIONS_PER_TRY} connections to {endpoint} from {IDLE_SOURCE} that send nothing, held \
             {IDLE_HOLD_MS} ms"
        );
        let sequence = self.invoke(Attack::IdleHandshakes, tried);
        self.pending.push((sequence, Attack::IdleHandshakes, tokio::spawn(idle_try(endpoint))));
    }

    /// (a) The same on a node's metrics port.
    fn idle_metrics_connections(&mut self) {
        let endpoint = self.metrics_endpoints.choose(&mut self.random).expect("metrics endpoints").clone();
        let tried = format!(
            "{IDLE_CONNECTIONS_PER_TRY} connections to the metrics port {endpoint} from {IDLE_SOURCE} that send \
             nothing, held {IDLE_HOLD_MS} ms"
        );
        let sequence = self.invoke(Attack::MetricsIdle, tried);
        self.pending.push((sequence, Attack::MetricsIdle, tokio::spawn(idle_try(endpoint))));
    }

    /// (a) A keepalive stream with the leaked token of tenant `stolen`, kept open
    /// until the operator rotates that token, in a task of its own; at most one
    /// try at a time (each waits for a rotation).
    fn stream_after_rotation(&mut self) {
        if self.pending.iter().any(|(_, attack, _)| *attack == Attack::StreamAfterRotation) {
            return;
        }
        let Some(token_file) = self.arguments.stolen_token_file.clone() else { return };
        let endpoint = self.leader_endpoint();
        let tried = format!(
            "a keepalive stream on {endpoint} with tenant stolen's leaked token, a keepalive every \
             {ROTATION_KEEPALIVE_MS} ms until the token is rotated"
        );
        let sequence = self.invoke(Attack::StreamAfterRotation, tried);
        let settings = leasehold::Settings { endpoints: vec![endpoint.clone()], ..leasehold::Settings::from_env() };
        let task = tokio::spawn(stream_after_rotation_try(endpoint, settings, token_file, self.request_id()));
        self.pending.push((sequence, Attack::StreamAfterRotation, task));
    }

    /// (a) Connections to a node's status page from `SLOW_READER_SOURCE` that ask for
    /// `page.js` `SLOW_READER_REQUESTS` times and read nothing, held in a task of
    /// their own for `SLOW_READER_HOLD_MS`.
    fn slow_status_readers(&mut self) {
        let endpoint = self.status_endpoints.choose(&mut self.random).expect("status endpoints").clone();
        let tried = format!(
            "{SLOW_READERS_PER_TRY} connections to the status page {endpoint} from {SLOW_READER_SOURCE}, each \
             asking for page.js {SLOW_READER_REQUESTS} times and reading nothing, held {SLOW_READER_HOLD_MS} ms"
        );
        let sequence = self.invoke(Attack::SlowReaderStatus, tried);
        let task = tokio::spawn(slow_reader_try(endpoint, self.ca_pem.clone()));
        self.pending.push((sequence, Attack::SlowReaderStatus, task));
    }

    /// Completes the tries whose tasks are done (all of them when `all`).
    async fn finish_pending(&mut self, all: bool) {
        let mut index = 0;
        while index < self.pending.len() {
            if !all && !self.pending[index].2.is_finished() {
                index += 1;
                continue;
            }
            let (sequence, attack, task) = self.pending.remove(index);
            let outcome =
                task.await.unwrap_or_else(|error| Outcome::Unknown(format!("the try's task failed: {error}")));
            self.complete(sequence, attack, outcome);
        }
    }

    /// (a) A request with no credential, a made-up token or a rogue CA's certificate.
    async fn unauthenticated(&mut self, attack: Attack) {
        let endpoint = self.random_endpoint();
        let mut client = match leasehold::Client::lazy([endpoint.as_str()]) {
            Ok(client) => client.with_ca_certificate(self.ca_pem.clone()),
            Err(error) => panic!("a client of {endpoint}: {error}"),
        };
        let credential = match attack {
            Attack::NoCredential => "no credential".to_string(),
            Attack::MadeUpToken => {
                let token = self.made_up_token();
                client = client.with_token(&token).expect("a printable token");
                format!("bearer token {}…", &token[..15])
            }
            _ => {
                let rogue = certs::new_ca().expect("a rogue CA");
                let pem = certs::tenant_certificate(&rogue.key, VICTIM_TENANT, &self.made_up_token())
                    .expect("a rogue certificate");
                client = client.with_client_certificate(pem.cert, pem.key);
                format!("a certificate naming tenant {VICTIM_TENANT} from a rogue CA")
            }
        };
        let channel = client.raw_channel(&endpoint).expect("a valid endpoint");
        let rpc = *["Status", "CreateSession", "DescribeLock", "ListSessions"].choose(&mut self.random).unwrap();
        let sequence = self.invoke(attack, format!("{rpc} on {endpoint} with {credential}"));
        let expected = [ErrorReason::Unauthenticated];
        let handshake = attack == Attack::RogueClientCertificate;
        let outcome = match rpc {
            "Status" => {
                let mut admin = pb::admin_client::AdminClient::new(channel);
                let reply = answer(admin.status(request(pb::StatusRequest {}))).await;
                must_refuse(reply, &expected, handshake, |status| {
                    format!("Status answered: node {} commit {}", status.node_id, status.commit_index)
                })
            }
            "CreateSession" => {
                let message = pb::CreateSessionRequest {
                    request_id: Some(self.request_id()),
                    ttl_ms: self.arguments.ttl_ms,
                    client_name: "intruder-unauthenticated".into(),
                };
                let mut leasehold = pb::leasehold_client::LeaseholdClient::new(channel);
                let reply = answer(leasehold.create_session(request(message))).await;
                must_refuse(reply, &expected, handshake, |created| {
                    format!("CreateSession answered: session {}", created.session_id)
                })
            }
            "DescribeLock" => {
                let message = pb::DescribeLockRequest { name: "lock/0".into(), stale: true, ..Default::default() };
                let mut leasehold = pb::leasehold_client::LeaseholdClient::new(channel);
                let reply = answer(leasehold.describe_lock(request(message))).await;
                must_refuse(reply, &expected, handshake, |lock| format!("DescribeLock answered: {lock:?}"))
            }
            _ => {
                let message = pb::ListSessionsRequest { stale: true, ..Default::default() };
                let mut leasehold = pb::leasehold_client::LeaseholdClient::new(channel);
                let reply = answer(leasehold.list_sessions(request(message))).await;
                must_refuse(reply, &expected, handshake, |list| {
                    format!("ListSessions answered {} sessions", list.sessions.len())
                })
            }
        };
        let outcome = if handshake { self.confirm_drop(outcome, &endpoint).await } else { outcome };
        self.complete(sequence, attack, outcome);
    }

    /// (b) An admin RPC with the intruder's tenant token, on any node (the credential
    /// is checked before leadership).
    async fn admin(&mut self, attack: Attack) {
        let endpoint = self.random_endpoint();
        let channel = self.client.raw_channel(&endpoint).expect("a valid endpoint");
        let mut admin = pb::admin_client::AdminClient::new(channel);
        let expected = [ErrorReason::PermissionDenied];
        let members = self.member_ids();
        let (sequence, outcome) = match attack {
            Attack::AddMember => {
                let node_id = 1_000 + self.random.random_range(0..1_000u64);
                let message = pb::AddMemberRequest {
                    node_id,
                    client_addr: "127.0.0.250:7100".into(),
                    peer_addr: "127.0.0.250:7200".into(),
                    learner_only: true,
                };
                let sequence = self.invoke(attack, format!("AddMember of a fake node {node_id} on {endpoint}"));
                let reply = answer(admin.add_member(request(message))).await;
                (sequence, must_refuse(reply, &expected, false, |added| format!("members now {:?}", added.members)))
            }
            Attack::RemoveMember => {
                let node_id = members.choose(&mut self.random).copied().unwrap_or(1);
                let sequence = self.invoke(attack, format!("RemoveMember of node {node_id} on {endpoint}"));
                let reply = answer(admin.remove_member(request(pb::RemoveMemberRequest { node_id }))).await;
                (sequence, must_refuse(reply, &expected, false, |removed| format!("members now {:?}", removed.members)))
            }
            Attack::AddTenant => {
                let name = format!("{INTRUDER_TENANT}-{}", self.random.random_range(0..1_000_000u32));
                let message = pb::AddTenantRequest {
                    request_id: Some(self.request_id()),
                    name: name.clone(),
                    quotas: Some(pb::Quotas::default()),
                };
                let sequence = self.invoke(attack, format!("AddTenant {name:?} on {endpoint}"));
                let reply = answer(admin.add_tenant(request(message))).await;
                (sequence, must_refuse(reply, &expected, false, |added| format!("tenant {:?} added", added.tenant)))
            }
            Attack::SkewClock => {
                // The values that change nothing, should the knob ever obey.
                let sequence = self.invoke(attack, format!("SkewClock rate 1000, jump 0 on {endpoint}"));
                let message = pb::SkewClockRequest { rate_per_mille: 1_000, jump_ms: 0 };
                let reply = answer(admin.skew_clock(request(message))).await;
                (sequence, must_refuse(reply, &expected, false, |_| "the clock knob obeyed".to_string()))
            }
            Attack::ListTenants => {
                let sequence = self.invoke(attack, format!("ListTenants on {endpoint}"));
                let reply = answer(admin.list_tenants(request(pb::ListTenantsRequest {}))).await;
                (
                    sequence,
                    must_refuse(reply, &expected, false, |list| {
                        let names: Vec<String> = list.tenants.iter().map(|tenant| tenant.name.clone()).collect();
                        format!("tenants listed: {names:?}")
                    }),
                )
            }
            Attack::RotateTenantToken => {
                let message =
                    pb::RotateTenantTokenRequest { request_id: Some(self.request_id()), name: VICTIM_TENANT.into() };
                let sequence = self.invoke(attack, format!("RotateTenantToken of {VICTIM_TENANT:?} on {endpoint}"));
                let reply = answer(admin.rotate_tenant_token(request(message))).await;
                (sequence, must_refuse(reply, &expected, false, |_| format!("{VICTIM_TENANT}'s new token handed out")))
            }
            Attack::SetTenantQuotas => {
                let message = pb::SetTenantQuotasRequest {
                    request_id: Some(self.request_id()),
                    name: VICTIM_TENANT.into(),
                    quotas: Some(pb::Quotas { max_sessions: 1, max_holds: 1, max_waiters: 1, ..Default::default() }),
                };
                let sequence = self.invoke(attack, format!("SetTenantQuotas of {VICTIM_TENANT:?} to 1 on {endpoint}"));
                let reply = answer(admin.set_tenant_quotas(request(message))).await;
                (sequence, must_refuse(reply, &expected, false, |set| format!("quotas set: {:?}", set.tenant)))
            }
            Attack::EndSession => {
                let (session_id, _, _, how) = self.victim(Function::Acquire);
                let message = pb::EndSessionRequest {
                    request_id: Some(self.request_id()),
                    tenant: VICTIM_TENANT.into(),
                    session_id,
                };
                let sequence =
                    self.invoke(attack, format!("EndSession of {how} session {session_id} of {VICTIM_TENANT:?}"));
                let reply = answer(admin.end_session(request(message))).await;
                (sequence, must_refuse(reply, &expected, false, |_| format!("session {session_id} ended")))
            }
            _ => {
                let message =
                    pb::RemoveTenantRequest { request_id: Some(self.request_id()), name: VICTIM_TENANT.into() };
                let sequence = self.invoke(attack, format!("RemoveTenant {VICTIM_TENANT:?} on {endpoint}"));
                let reply = answer(admin.remove_tenant(request(message))).await;
                (
                    sequence,
                    must_refuse(reply, &expected, false, |removed| {
                        format!("{VICTIM_TENANT} removed, {} sessions ended", removed.sessions_ended)
                    }),
                )
            }
        };
        self.complete(sequence, attack, outcome);
    }

    /// (c) A session-scoped request naming a session that is not the intruder's, or
    /// its own with a wrong secret.
    async fn hijack(&mut self, attack: Attack) {
        let secret = self.made_up_secret();
        let secret_text = if secret.is_empty() { "no secret" } else { "a made-up secret" };
        // Another tenant's session is, to the intruder, one that does not exist.
        let refusals = [
            ErrorReason::WrongSessionSecret,
            ErrorReason::UnknownSession,
            ErrorReason::NotHolder,
            ErrorReason::NotElectionLeader,
        ];
        let endpoint = self.leader_endpoint();
        let client = self.client.clone();
        let (sequence, outcome) = match attack {
            Attack::WrongSecret => {
                let Some(own) = &self.own else { return };
                let (session_id, held) = (own.session.id(), own.held_token);
                let mut wrong = own.session.secret();
                if wrong.is_empty() {
                    wrong.push(0);
                }
                wrong[0] ^= 1 + self.random.random_range(0..255u8);
                let expected = [ErrorReason::WrongSessionSecret, ErrorReason::UnknownSession];
                let rpc = *["Release", "Acquire", "KeepAlive", "CloseSession"].choose(&mut self.random).unwrap();
                let tried =
                    format!("{rpc} on its own session {session_id} ({OWN_LOCK}, token {held:?}) with a wrong secret");
                let sequence = self.invoke(attack, tried);
                let outcome = match rpc {
                    "Release" => {
                        let message = pb::ReleaseRequest {
                            request_id: Some(self.request_id()),
                            session_id,
                            name: OWN_LOCK.into(),
                            token: held.unwrap_or(session_id),
                            session_secret: wrong,
                        };
                        self.release(&client, endpoint, message, &expected).await
                    }
                    "Acquire" => {
                        let message = pb::AcquireRequest {
                            lock_delay_ms: None,
                            request_id: Some(self.request_id()),
                            session_id,
                            name: format!("{OWN_LOCK}/2"),
                            wait_ms: 0,
                            session_secret: wrong,
                        };
                        self.acquire(&client, endpoint, message, &expected).await
                    }
                    "KeepAlive" => self.keepalive(&client, endpoint, session_id, wrong).await,
                    _ => {
                        let message = pb::CloseSessionRequest {
                            request_id: Some(self.request_id()),
                            session_id,
                            session_secret: wrong,
                        };
                        self.close(&client, endpoint, message, &expected).await
                    }
                };
                (sequence, outcome)
            }
            Attack::HijackRelease => {
                let (session_id, name, token, how) = self.victim(Function::Release);
                let tried = format!("Release of {name} token {token} in {how} session {session_id} with {secret_text}");
                let sequence = self.invoke(attack, tried);
                let message = pb::ReleaseRequest {
                    request_id: Some(self.request_id()),
                    session_id,
                    name,
                    token,
                    session_secret: secret,
                };
                (sequence, self.release(&client, endpoint, message, &refusals).await)
            }
            Attack::HijackSemaphoreRelease => {
                let (session_id, name, token, how) = self.victim(Function::SemRelease);
                let tried = format!(
                    "Semaphores.Release of {name} token {token} in {how} session {session_id} with {secret_text}"
                );
                let sequence = self.invoke(attack, tried);
                let message = pb::SemReleaseRequest {
                    request_id: Some(self.request_id()),
                    session_id,
                    name,
                    token,
                    session_secret: secret,
                };
                let reply = on_leader(&client, endpoint, |channel| {
                    let message = message.clone();
                    async move { pb::semaphores_client::SemaphoresClient::new(channel).release(request(message)).await }
                })
                .await;
                (sequence, must_refuse(reply, &refusals, false, |_| "the permit was released".to_string()))
            }
            Attack::HijackResign => {
                let (session_id, name, token, how) = self.victim(Function::Resign);
                let tried = format!("Resign of {name} token {token} in {how} session {session_id} with {secret_text}");
                let sequence = self.invoke(attack, tried);
                let message = pb::ResignRequest {
                    request_id: Some(self.request_id()),
                    session_id,
                    name,
                    token,
                    session_secret: secret,
                };
                let reply = on_leader(&client, endpoint, |channel| {
                    let message = message.clone();
                    async move { pb::elections_client::ElectionsClient::new(channel).resign(request(message)).await }
                })
                .await;
                (sequence, must_refuse(reply, &refusals, false, |_| "the leadership was resigned".to_string()))
            }
            Attack::HijackAcquire => {
                let (session_id, name, _, how) = self.victim(Function::Acquire);
                let tried = format!("Acquire of {name} in {how} session {session_id} with {secret_text}");
                let sequence = self.invoke(attack, tried);
                let message = pb::AcquireRequest {
                    lock_delay_ms: None,
                    request_id: Some(self.request_id()),
                    session_id,
                    name,
                    wait_ms: 0,
                    session_secret: secret,
                };
                (sequence, self.acquire(&client, endpoint, message, &refusals).await)
            }
            Attack::HijackCloseSession => {
                let (session_id, _, _, how) = self.victim(Function::Session);
                let sequence =
                    self.invoke(attack, format!("CloseSession of {how} session {session_id} with {secret_text}"));
                let message =
                    pb::CloseSessionRequest { request_id: Some(self.request_id()), session_id, session_secret: secret };
                (sequence, self.close(&client, endpoint, message, &refusals).await)
            }
            _ => {
                let (session_id, _, _, how) = self.victim(Function::Session);
                let sequence =
                    self.invoke(attack, format!("KeepAlive of {how} session {session_id} with {secret_text}"));
                (sequence, self.keepalive(&client, endpoint, session_id, secret).await)
            }
        };
        self.complete(sequence, attack, names_the_owner(outcome));
    }

    async fn release(
        &self,
        client: &leasehold::Client,
        endpoint: String,
        message: pb::ReleaseRequest,
        expected: &[ErrorReason],
    ) -> Outcome {
        let reply = on_leader(client, endpoint, |channel| {
            let message = message.clone();
            async move { pb::leasehold_client::LeaseholdClient::new(channel).release(request(message)).await }
        })
        .await;
        must_refuse(reply, expected, false, |_| "the lock was released".to_string())
    }

    async fn acquire(
        &self,
        client: &leasehold::Client,
        endpoint: String,
        message: pb::AcquireRequest,
        expected: &[ErrorReason],
    ) -> Outcome {
        let reply = on_leader(client, endpoint, |channel| {
            let message = message.clone();
            async move { pb::leasehold_client::LeaseholdClient::new(channel).acquire(request(message)).await }
        })
        .await;
        must_refuse(reply, expected, false, |acquired| format!("Acquire answered {:?}", acquired.outcome))
    }

    async fn close(
        &self,
        client: &leasehold::Client,
        endpoint: String,
        message: pb::CloseSessionRequest,
        expected: &[ErrorReason],
    ) -> Outcome {
        let reply = on_leader(client, endpoint, |channel| {
            let message = message.clone();
            async move { pb::leasehold_client::LeaseholdClient::new(channel).close_session(request(message)).await }
        })
        .await;
        must_refuse(reply, expected, false, |_| "the session was closed".to_string())
    }

    /// One keepalive on a stream of its own: a session that is not the sender's, or
    /// a wrong secret, must be answered `alive = false`.
    async fn keepalive(
        &self,
        client: &leasehold::Client,
        endpoint: String,
        session_id: u64,
        session_secret: Vec<u8>,
    ) -> Outcome {
        let message = pb::KeepAliveRequest { session_id, session_secret };
        let reply = on_leader(client, endpoint, |channel| {
            let message = message.clone();
            async move {
                let mut leasehold = pb::leasehold_client::LeaseholdClient::new(channel);
                let mut answers = leasehold.keep_alive(request(futures::stream::iter([message]))).await?.into_inner();
                Ok(tonic::Response::new(answers.message().await?))
            }
        })
        .await;
        match reply {
            Answer::Ok(Some(answer)) if answer.alive => {
                Outcome::Succeeded(format!("alive = true, ttl {} ms for session {}", answer.ttl_ms, answer.session_id))
            }
            Answer::Ok(Some(_)) => Outcome::Refused(NOT_ALIVE.into()),
            Answer::Ok(None) => Outcome::Unknown("the keepalive stream ended without an answer".into()),
            Answer::Status(status) => classify(&status, &[], false),
            Answer::Timeout => Outcome::Unknown(format!("no answer within {ATTACK_RPC_TIMEOUT_MS} ms")),
        }
    }

    /// (d) Reads of the victim's names in the intruder's namespace (they must show
    /// nothing), session lists and descriptions, and reads naming tenant "test".
    async fn read(&mut self, attack: Attack) {
        let stale = self.random.random_bool(0.5);
        // A stale read may be answered by any node; a linearizable one by the leader.
        let endpoint = if stale { self.random_endpoint() } else { self.leader_endpoint() };
        let client = self.client.clone();
        let other_tenant = attack == Attack::OtherTenantRead;
        let tenant = if other_tenant { VICTIM_TENANT.to_string() } else { String::new() };
        let denied = [ErrorReason::PermissionDenied];
        let (own_sessions, own_tokens) = (self.own_sessions.clone(), self.own_tokens.clone());
        let read = match attack {
            Attack::OtherTenantRead => {
                *["DescribeLock", "CheckFence", "DescribeSemaphore", "Leader", "Observe", "ListSessions"]
                    .choose(&mut self.random)
                    .expect("reads")
            }
            Attack::DescribeLock => "DescribeLock",
            Attack::CheckFence => "CheckFence",
            Attack::DescribeSemaphore => "DescribeSemaphore",
            Attack::Leader => "Leader",
            Attack::Observe => "Observe",
            Attack::ListSessions => "ListSessions",
            _ => "DescribeSession",
        };
        let in_tenant = if other_tenant { format!("tenant {tenant:?}") } else { "its own namespace".to_string() };
        let staleness = if stale { "stale" } else { "linearizable" };
        let (sequence, outcome) = match read {
            "DescribeLock" => {
                let name = Self::victim_names(Function::Acquire).choose(&mut self.random).expect("names").clone();
                let sequence = self.invoke(attack, format!("{staleness} DescribeLock {name} in {in_tenant}"));
                let message = pb::DescribeLockRequest { name, stale, tenant };
                let reply =
                    on_leader(&client, endpoint, |channel| {
                        let message = message.clone();
                        async move {
                            pb::leasehold_client::LeaseholdClient::new(channel).describe_lock(request(message)).await
                        }
                    })
                    .await;
                let outcome = judge_read(other_tenant, reply, &denied, |lock| {
                    let own = |session: u64| own_sessions.contains(&session);
                    let holder_own = lock.holder.as_ref().is_none_or(|holder| own(holder.session_id));
                    if holder_own && lock.waiters.iter().all(|waiter| own(waiter.session_id)) {
                        nothing_seen("no holder or waiter but its own")
                    } else {
                        Outcome::Succeeded(format!("holder {:?}, waiters {:?}", lock.holder, lock.waiters))
                    }
                });
                (sequence, outcome)
            }
            "CheckFence" => {
                let name = Self::victim_names(Function::Acquire).choose(&mut self.random).expect("names").clone();
                let below = self.random.random_range(0..=GUESS_WINDOW_ENTRIES);
                let token = self.commit_index().saturating_sub(below).max(1);
                let sequence = self.invoke(attack, format!("CheckFence {name} token {token} in {in_tenant}"));
                let message = pb::CheckFenceRequest { name, token, tenant };
                let reply =
                    on_leader(&client, self.leader_endpoint(), |channel| {
                        let message = message.clone();
                        async move {
                            pb::leasehold_client::LeaseholdClient::new(channel).check_fence(request(message)).await
                        }
                    })
                    .await;
                let outcome = judge_read(other_tenant, reply, &denied, |fence| {
                    if fence.current_token == 0 || own_tokens.contains(&fence.current_token) {
                        nothing_seen("no grant but its own")
                    } else {
                        Outcome::Succeeded(format!("current {}, current token {}", fence.current, fence.current_token))
                    }
                });
                (sequence, outcome)
            }
            "DescribeSemaphore" => {
                let name = Self::victim_names(Function::SemAcquire).choose(&mut self.random).expect("names").clone();
                let sequence = self.invoke(attack, format!("{staleness} Semaphores.Describe {name} in {in_tenant}"));
                let message = pb::DescribeSemaphoreRequest { name, stale, tenant };
                let reply = on_leader(&client, endpoint, |channel| {
                    let message = message.clone();
                    async move { pb::semaphores_client::SemaphoresClient::new(channel).describe(request(message)).await }
                })
                .await;
                let outcome = judge_read(other_tenant, reply, &denied, |semaphore| {
                    if semaphore.limit == 0 && semaphore.holders.is_empty() && semaphore.waiters.is_empty() {
                        nothing_seen("no limit, holders or waiters")
                    } else {
                        Outcome::Succeeded(format!(
                            "limit {}, holders {:?}, waiters {:?}",
                            semaphore.limit, semaphore.holders, semaphore.waiters
                        ))
                    }
                });
                (sequence, outcome)
            }
            "Leader" => {
                let name = Self::victim_names(Function::Campaign).choose(&mut self.random).expect("names").clone();
                let sequence = self.invoke(attack, format!("{staleness} Leader of {name} in {in_tenant}"));
                let message = pb::LeaderRequest { name, stale, tenant };
                let reply = on_leader(&client, endpoint, |channel| {
                    let message = message.clone();
                    async move { pb::elections_client::ElectionsClient::new(channel).leader(request(message)).await }
                })
                .await;
                let outcome = judge_read(other_tenant, reply, &denied, |leader| match leader.leader {
                    None => nothing_seen("vacant"),
                    Some(leader) => Outcome::Succeeded(format!("leader {leader:?}")),
                });
                (sequence, outcome)
            }
            "Observe" => {
                let name = Self::victim_names(Function::Campaign).choose(&mut self.random).expect("names").clone();
                let tried = format!("Observe {name} in {in_tenant} for {OBSERVE_WINDOW_MS} ms after the first state");
                let sequence = self.invoke(attack, tried);
                let message = pb::ObserveRequest { name, tenant };
                let reply = on_leader(&client, self.leader_endpoint(), |channel| {
                    let message = message.clone();
                    async move {
                        let mut elections = pb::elections_client::ElectionsClient::new(channel);
                        let mut states = elections.observe(request(message)).await?.into_inner();
                        let mut seen = Vec::new();
                        if let Some(first) = states.message().await? {
                            seen.push(first);
                            let window = Duration::from_millis(OBSERVE_WINDOW_MS);
                            while let Ok(Ok(Some(next))) = tokio::time::timeout(window, states.message()).await {
                                seen.push(next);
                            }
                        }
                        Ok(tonic::Response::new(seen))
                    }
                })
                .await;
                let outcome = judge_read(other_tenant, reply, &denied, |seen| {
                    let leaders: Vec<pb::LeaderInfo> = seen.iter().filter_map(|state| state.leader.clone()).collect();
                    if seen.is_empty() {
                        Outcome::Unknown("the stream ended before its first state".into())
                    } else if leaders.is_empty() {
                        nothing_seen(&format!("{} states, all vacant", seen.len()))
                    } else {
                        Outcome::Succeeded(format!("leaders {leaders:?}"))
                    }
                });
                (sequence, outcome)
            }
            "ListSessions" => {
                let sequence = self.invoke(attack, format!("{staleness} ListSessions in {in_tenant}"));
                let message = pb::ListSessionsRequest { stale, page_size: 0, page_token: 0, tenant };
                let reply =
                    on_leader(&client, endpoint, |channel| {
                        let message = message.clone();
                        async move {
                            pb::leasehold_client::LeaseholdClient::new(channel).list_sessions(request(message)).await
                        }
                    })
                    .await;
                let outcome = judge_read(other_tenant, reply, &denied, |list| {
                    let foreign: Vec<String> = list
                        .sessions
                        .iter()
                        .filter(|session| session.tenant != INTRUDER_TENANT)
                        .map(|session| format!("session {} of tenant {:?}", session.session_id, session.tenant))
                        .collect();
                    if foreign.is_empty() {
                        nothing_seen(&format!("{} sessions, all its own", list.sessions.len()))
                    } else {
                        Outcome::Succeeded(format!("listed {}", foreign.join(", ")))
                    }
                });
                (sequence, outcome)
            }
            _ => {
                let (session_id, _, _, how) = self.victim(Function::Session);
                let sequence =
                    self.invoke(attack, format!("{staleness} DescribeSession of {how} session {session_id}"));
                let message = pb::DescribeSessionRequest { session_id, stale };
                let reply = on_leader(&client, endpoint, |channel| async move {
                    pb::leasehold_client::LeaseholdClient::new(channel).describe_session(request(message)).await
                })
                .await;
                let expected = [ErrorReason::UnknownSession];
                let outcome = judge_read(false, reply, &expected, |described| match described.session {
                    Some(session) if session.tenant == INTRUDER_TENANT => {
                        nothing_seen(&format!("session {} is its own", session.session_id))
                    }
                    Some(session) => Outcome::Succeeded(format!(
                        "session {} of tenant {:?}: holds {:?}",
                        session.session_id, session.tenant, session.held
                    )),
                    None => nothing_seen("an empty answer"),
                });
                (sequence, names_the_owner(outcome))
            }
        };
        self.complete(sequence, attack, outcome);
    }

    /// (d) Writes with the intruder's own session (and secret) to names the workers
    /// use: they must act on its own namespace only.
    async fn namespace_write(&mut self, attack: Attack) {
        let Some(own) = &self.own else { return };
        let (session_id, secret) = (own.session.id(), own.session.secret());
        let client = self.client.clone();
        let endpoint = self.leader_endpoint();
        if attack == Attack::NamespaceSetLimit {
            let name = Self::victim_names(Function::SemAcquire).choose(&mut self.random).expect("names").clone();
            let limit = crate::workload::SEMAPHORE_LIMIT;
            let tried = format!("Semaphores.SetLimit of {name} to {limit} with its own session {session_id}");
            let sequence = self.invoke(attack, tried);
            let message = pb::SemSetLimitRequest {
                request_id: Some(self.request_id()),
                session_id,
                name,
                limit,
                session_secret: secret,
                ..Default::default()
            };
            let reply = on_leader(&client, endpoint, |channel| {
                let message = message.clone();
                async move { pb::semaphores_client::SemaphoresClient::new(channel).set_limit(request(message)).await }
            })
            .await;
            // Nobody uses the semaphore in the intruder's namespace: a change is refused
            // (or the intruder's own session expired, while it was paused, say).
            let expected = [ErrorReason::InvalidArgument, ErrorReason::UnknownSession];
            let outcome = must_refuse(reply, &expected, false, |set| {
                format!("the limit changed from {}: another tenant's semaphore", set.previous_limit)
            });
            self.complete(sequence, attack, outcome);
            return;
        }
        let name = Self::victim_names(Function::Acquire).choose(&mut self.random).expect("names").clone();
        let sequence = self.invoke(attack, format!("Acquire of {name} (no wait) with its own session {session_id}"));
        let message = pb::AcquireRequest {
            lock_delay_ms: None,
            request_id: Some(self.request_id()),
            session_id,
            name: name.clone(),
            wait_ms: 0,
            session_secret: secret.clone(),
        };
        let reply = on_leader(&client, endpoint.clone(), |channel| {
            let message = message.clone();
            async move { pb::leasehold_client::LeaseholdClient::new(channel).acquire(request(message)).await }
        })
        .await;
        let outcome = match reply {
            Answer::Ok(pb::AcquireResponse { outcome: Some(pb::acquire_response::Outcome::Granted(granted)) }) => {
                self.own_tokens.insert(granted.token);
                let message = pb::ReleaseRequest {
                    request_id: Some(self.request_id()),
                    session_id,
                    name,
                    token: granted.token,
                    session_secret: secret,
                };
                // Not checked: a grant left behind is its own, and reads allow for it.
                let _ = on_leader(&client, endpoint, |channel| {
                    let message = message.clone();
                    async move { pb::leasehold_client::LeaseholdClient::new(channel).release(request(message)).await }
                })
                .await;
                Outcome::Refused(format!("{NOTHING_SEEN}: granted {} in its own namespace", granted.token))
            }
            Answer::Ok(pb::AcquireResponse { outcome: Some(pb::acquire_response::Outcome::NotAcquired(busy)) })
                if busy.holder_session_id != 0 && !self.own_sessions.contains(&busy.holder_session_id) =>
            {
                Outcome::Succeeded(format!(
                    "busy: held by session {} ({:?}) with token {}",
                    busy.holder_session_id, busy.holder_client_name, busy.holder_token
                ))
            }
            Answer::Ok(answer) => Outcome::Refused(format!("{NOTHING_SEEN}: {answer:?}, its own")),
            // The intruder's own session may have expired (while it was paused, say).
            other => must_refuse(other, &[ErrorReason::UnknownSession], false, |_| unreachable!("answered above")),
        };
        self.complete(sequence, attack, outcome);
    }

    /// A TLS channel to a node's peer port, presenting `identity` (or no
    /// certificate), trusting the cluster CA for the node's own certificate.
    fn peer_channel(&self, endpoint: &str, identity: Option<(String, String)>) -> Channel {
        let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&self.ca_pem));
        if let Some((cert, key)) = identity {
            tls = tls.identity(Identity::from_pem(cert, key));
        }
        Endpoint::from_shared(format!("https://{endpoint}"))
            .expect("a peer address")
            .connect_timeout(Duration::from_millis(ATTACK_RPC_TIMEOUT_MS))
            .tls_config(tls)
            .expect("a TLS configuration")
            .connect_lazy()
    }

    /// (e) A Raft message or a retire notice on a node's peer port, with a rogue
    /// node certificate, the intruder's tenant certificate, or none.
    async fn peer(&mut self, attack: Attack) {
        let endpoint = self.peer_endpoints.choose(&mut self.random).expect("peer endpoints").clone();
        let claimed = self.member_ids().choose(&mut self.random).copied().unwrap_or(1);
        let (identity, who) = match attack {
            Attack::PeerRogueCa => (PeerIdentity::RogueNode, format!("node-{claimed}'s certificate from a rogue CA")),
            Attack::PeerTenantCertificate => {
                (PeerIdentity::Tenant, format!("{INTRUDER_TENANT}'s tenant certificate from the cluster CA"))
            }
            _ => (PeerIdentity::Nobody, "no client certificate".to_string()),
        };
        let identity = match identity {
            PeerIdentity::RogueNode => {
                let rogue = certs::new_ca().expect("a rogue CA");
                let pem = certs::node_certificate(&rogue.key, claimed, &[]).expect("a rogue node certificate");
                Some((pem.cert, pem.key))
            }
            PeerIdentity::Tenant => {
                let (cert, key) = &self.tenant_identity;
                Some((String::from_utf8_lossy(cert).into_owned(), String::from_utf8_lossy(key).into_owned()))
            }
            PeerIdentity::Nobody => None,
        };
        let channel = self.peer_channel(&endpoint, identity);
        let cluster_name = self.status.as_ref().map(|status| status.cluster_name.clone()).unwrap_or_default();
        let mut expected = vec![ErrorReason::WrongPeer];
        if cluster_name.is_empty() {
            // Not learned yet: the cluster check refuses first.
            expected.push(ErrorReason::WrongCluster);
        }
        let message = *["vote", "heartbeat", "garbage", "retire"].choose(&mut self.random).unwrap();
        let tried = format!("{message} from node {claimed} to {endpoint} with {who}");
        let sequence = self.invoke(attack, tried);
        let mut peer = pb::peer_client::PeerClient::new(channel);
        let with_cluster = |payload: Vec<u8>| {
            let mut raft = request(pb::RaftMessage { payload });
            if let Ok(value) = cluster_name.parse() {
                raft.metadata_mut().insert("leasehold-cluster", value);
            }
            raft
        };
        let outcome = match message {
            "vote" => {
                let reply = answer(peer.vote(with_cluster(crafted_vote(claimed)))).await;
                must_refuse(reply, &expected, true, |_| "the node answered the vote".to_string())
            }
            "heartbeat" => {
                let reply = answer(peer.append_entries(with_cluster(crafted_heartbeat(claimed)))).await;
                must_refuse(reply, &expected, true, |_| "the node answered the heartbeat".to_string())
            }
            "garbage" => {
                let length = self.random.random_range(1..=64usize);
                let mut payload = vec![0u8; length];
                self.random.fill(payload.as_mut_slice());
                expected.push(ErrorReason::InvalidArgument);
                let reply = answer(peer.append_entries(with_cluster(payload))).await;
                must_refuse(reply, &expected, true, |_| "the node answered the garbage".to_string())
            }
            _ => {
                let reply = answer(
                    peer.retire(request(pb::RetireRequest { cluster_name: cluster_name.clone(), incarnation: 0 })),
                )
                .await;
                must_refuse(reply, &expected, true, |_| "the node took the retire notice".to_string())
            }
        };
        let outcome = self.confirm_drop(outcome, &endpoint).await;
        self.complete(sequence, attack, outcome);
    }
    /// A voter that says so itself, to send forged messages to: a node the last status
    /// lists as a voter whose own status, asked now, lists it as a voter in a term
    /// above 0. A node in no cluster yet (started with --new-incarnation and not added
    /// yet) takes Raft messages from any node of the cluster CA by design
    /// (`check_raft_member`), and one in term 0 would take a term-0 heartbeat as its
    /// leader's: those are not what these attacks test. None when no voter said so in
    /// time (a fault); the attack then waits for its next turn, unrecorded.
    async fn voter_target(&mut self) -> Option<VoterTarget> {
        let mut voters: Vec<pb::Member> =
            self.status.as_ref()?.members.iter().filter(|member| member.role == VOTER_ROLE).cloned().collect();
        voters.shuffle(&mut self.random);
        for member in voters.into_iter().take(VOTER_TARGET_TRIES_MAX) {
            let asked = tokio::time::timeout(
                Duration::from_millis(ATTACK_RPC_TIMEOUT_MS),
                self.client.status_of(&member.client_addr),
            )
            .await;
            let Ok(Ok(status)) = asked else { continue };
            let says_voter =
                status.members.iter().any(|listed| listed.node_id == status.node_id && listed.role == VOTER_ROLE);
            // An older release's Status lists the peer address; this one's only to the
            // admin.
            let peer_addr = match member.peer_addr.as_str() {
                "" => self.peer_addresses.get(&member.node_id).cloned(),
                listed => Some(listed.to_owned()),
            };
            if let Some(peer_addr) =
                peer_addr.filter(|_| status.node_id == member.node_id && status.term > 0 && says_voter)
            {
                return Some(VoterTarget { id: member.node_id, peer_addr, status });
            }
        }
        None
    }

    /// The node whose certificate an attack on `target` presents: the never-member
    /// for the non-member attacks; a member other than the target for the forged
    /// headers; for a retire notice the target's leader half the time, else any
    /// member. None when the intruder holds no such certificate.
    fn forged_sender(&mut self, attack: Attack, target: &VoterTarget) -> Option<u64> {
        let members: Vec<u64> = target
            .status
            .members
            .iter()
            .map(|member| member.node_id)
            .filter(|id| self.node_identities.contains_key(id))
            .collect();
        match attack {
            Attack::PeerNonMemberAppend | Attack::PeerNonMemberVote | Attack::PeerHighTerm => Some(NON_MEMBER_NODE_ID),
            Attack::PeerForgedHeaders => {
                let others: Vec<u64> = members.into_iter().filter(|id| *id != target.id).collect();
                others.choose(&mut self.random).copied()
            }
            _ => {
                let leader = target.status.leader_id;
                if self.random.random_bool(0.5) && members.contains(&leader) {
                    Some(leader)
                } else {
                    members.choose(&mut self.random).copied()
                }
            }
        }
    }

    /// (e) Raft messages and a retire notice with node certificates the cluster CA
    /// signed: from a node that was never a member (far ahead of the cluster's term),
    /// or from a member with forged headers or to retire a voter. The certificate is
    /// genuine, so what must refuse these is the membership and header checks, not
    /// the TLS handshake.
    async fn forged(&mut self, attack: Attack) {
        let Some(target) = self.voter_target().await else { return };
        let Some(sender) = self.forged_sender(attack, &target) else { return };
        let (cert, key) = self.node_identities[&sender].clone();
        let VoterTarget { id: target_id, peer_addr, status } = target;
        let channel = peer_messages::peer_channel(&peer_addr, &self.ca_pem, (&cert, &key));
        let mut peer = pb::peer_client::PeerClient::new(channel);
        let headers = Headers::complete(&status, sender);
        let ahead = status.term + FORGED_TERM_AHEAD;
        let to = format!("to node {target_id} at {peer_addr} (term {})", status.term);
        let wrong_peer = [ErrorReason::WrongPeer];
        match attack {
            Attack::PeerNonMemberAppend => {
                let tenant = if self.random.random_bool(0.5) { INTRUDER_TENANT } else { VICTIM_TENANT };
                let token = self.made_up_token();
                let prev = peer_messages::leaders_last_log(&status);
                let tried = format!(
                    "AppendEntries rotating {tenant}'s token as the admin in term {ahead} from never-member node \
                     {sender} {to}"
                );
                let sequence = self.invoke(attack, tried);
                let message = peer_messages::admin_append(sender, ahead, prev, tenant, &token);
                let reply = answer(peer.append_entries(headers.on(message))).await;
                let outcome = must_refuse(reply, &wrong_peer, false, answered("the node answered the append"));
                self.complete(sequence, attack, outcome);
            }
            Attack::PeerNonMemberVote => {
                let sequence =
                    self.invoke(attack, format!("Vote in term {ahead} from never-member node {sender} {to}"));
                let reply = answer(peer.vote(headers.on(peer_messages::vote(sender, ahead)))).await;
                let outcome = must_refuse(reply, &wrong_peer, false, answered("the node answered the vote"));
                self.complete(sequence, attack, outcome);
            }
            Attack::PeerHighTerm => {
                let tried = format!("heartbeat in term {ahead} from never-member node {sender} {to}");
                let sequence = self.invoke(attack, tried);
                let reply = answer(peer.append_entries(headers.on(peer_messages::heartbeat(sender, ahead)))).await;
                let outcome = must_refuse(reply, &wrong_peer, false, answered("the node answered the heartbeat"));
                self.complete(sequence, attack, outcome);
            }
            Attack::PeerForgedHeaders => {
                // Term 0: below every vote a node in a cluster holds, so the receiver
                // never takes the message for its leader's, even from its leader's
                // certificate, and refuses what it says about it instead of stopping.
                let forgery = *["log-command-level", "record", "no-member-header"].choose(&mut self.random).unwrap();
                let (message, headers, expected, rpc) = match forgery {
                    "log-command-level" => {
                        let headers = Headers { log_command_level: Some(FORGED_LOG_COMMAND_LEVEL), ..headers };
                        (peer_messages::vote(sender, 0), headers, ErrorReason::BuildTooOld, "Vote")
                    }
                    "record" => {
                        let incarnation = if status.incarnation == FORGED_RECORD_INCARNATION {
                            FORGED_RECORD_INCARNATION + 1
                        } else {
                            FORGED_RECORD_INCARNATION
                        };
                        let record = format!("{target_id}.{incarnation}.{FORGED_RECORD_INDEX}.{FORGED_RECORD_INDEX}");
                        let headers = Headers { record: Some(record), ..headers };
                        (peer_messages::heartbeat(sender, 0), headers, ErrorReason::StaleIncarnation, "heartbeat")
                    }
                    _ => {
                        let headers = Headers { cluster_name: headers.cluster_name, ..Headers::default() };
                        (peer_messages::heartbeat(sender, 0), headers, ErrorReason::WrongPeer, "heartbeat")
                    }
                };
                let tried = format!("term-0 {rpc} with forged headers ({forgery}) from member node {sender} {to}");
                let sequence = self.invoke(attack, tried);
                let reply = if rpc == "Vote" {
                    answer(peer.vote(headers.on(message))).await
                } else {
                    answer(peer.append_entries(headers.on(message))).await
                };
                let outcome = must_refuse(reply, &[expected], false, answered("the node answered the forged message"));
                self.complete(sequence, attack, outcome);
            }
            _ => {
                let leader = if sender == status.leader_id { " (its leader)" } else { "" };
                let tried =
                    format!("Retire from member node {sender}{leader} to voter node {target_id} at {peer_addr}");
                let sequence = self.invoke(attack, tried);
                let message = pb::RetireRequest { cluster_name: status.cluster_name.clone(), incarnation: 0 };
                let outcome = match answer(peer.retire(request(message))).await {
                    Answer::Ok(_) => self.judge_retirement(target_id).await,
                    other => must_refuse(other, &wrong_peer, false, |_| unreachable!("answered above")),
                };
                self.complete(sequence, attack, outcome);
            }
        }
    }

    /// A voter took a forged retire notice: the attack's success, unless the leader
    /// was removing the node at that moment (a member-replace or a disk fault), when
    /// the node was retiring anyway and the notice proves nothing.
    async fn judge_retirement(&mut self, target: u64) -> Outcome {
        for endpoint in self.endpoints.clone() {
            let asked =
                tokio::time::timeout(Duration::from_millis(ATTACK_RPC_TIMEOUT_MS), self.client.status_of(&endpoint))
                    .await;
            let Ok(Ok(status)) = asked else { continue };
            if status.state != "leader" {
                continue;
            }
            let role = status.members.iter().find(|member| member.node_id == target).map(|member| member.role.clone());
            return match role.as_deref() {
                Some(VOTER_ROLE) => Outcome::Succeeded(format!(
                    "voter node {target} took the retire notice; leader {} still lists it as a voter",
                    status.node_id
                )),
                other => Outcome::Unknown(format!(
                    "node {target} took the retire notice while leader {} was removing it (now {})",
                    status.node_id,
                    other.unwrap_or("not a member")
                )),
            };
        }
        Outcome::Succeeded(format!("voter node {target} took the retire notice (no leader answered a status after)"))
    }
}

/// The evidence of a forged Raft message that was answered: `what`, and the answer's size.
fn answered(what: &'static str) -> impl FnOnce(pb::RaftMessage) -> String {
    move |message| format!("{what} ({} bytes)", message.payload.len())
}

/// A voter the forged-message attacks aim at, and its own status.
struct VoterTarget {
    id: u64,
    peer_addr: String,
    status: pb::StatusResponse,
}

/// A member's role in a status as the server spells it.
const VOTER_ROLE: &str = "voter";

/// The certificate and key files of node `id` in a `--node-certificates` directory.
pub fn node_certificate_files(directory: &Path, id: u64) -> (PathBuf, PathBuf) {
    let stem = format!("{NODE_CERTIFICATE_PREFIX}{id}");
    (directory.join(format!("{stem}.pem")), directory.join(format!("{stem}.key")))
}

/// The node id a certificate file of a `--node-certificates` directory is for.
fn node_certificate_id(file_name: &str) -> Option<u64> {
    file_name.strip_prefix(NODE_CERTIFICATE_PREFIX)?.strip_suffix(".pem")?.parse().ok()
}

/// Every node certificate in `directory`, by node id.
fn read_node_identities(directory: &Path) -> anyhow::Result<BTreeMap<u64, (String, String)>> {
    let mut identities = BTreeMap::new();
    for entry in std::fs::read_dir(directory).with_context(|| format!("read {}", directory.display()))? {
        let path = entry?.path();
        let Some(id) = path.file_name().and_then(|name| name.to_str()).and_then(node_certificate_id) else {
            continue;
        };
        let (cert_file, key_file) = node_certificate_files(directory, id);
        let read = |path: &Path| std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()));
        identities.insert(id, (read(&cert_file)?, read(&key_file)?));
    }
    Ok(identities)
}

/// Runs the intruder until the harness says `final`; then closes its own session.
pub async fn run(arguments: WorkloadWorkerArguments) -> anyhow::Result<()> {
    if std::env::var_os(leasehold::settings::ENV_ADMIN_TOKEN_FILE).is_some() {
        bail!("the attack worker must not hold the admin credential ({})", leasehold::settings::ENV_ADMIN_TOKEN_FILE);
    }
    let (settings, client) =
        crate::workload::worker_client(&arguments, format!("{INTRUDER_TENANT}-{}", arguments.process))?;
    let ca_file = settings.ca_file.clone().context("the attack worker needs the cluster CA (LEASEHOLD_CA_FILE)")?;
    let ca_pem = std::fs::read(&ca_file).with_context(|| format!("read {}", ca_file.display()))?;
    let peer_addresses = parse_peer_addresses(arguments.peer_endpoints.as_deref().unwrap_or_default())?;
    if peer_addresses.is_empty() {
        bail!("the attack worker needs --peer-endpoints");
    }
    let peer_endpoints = peer_addresses.values().cloned().collect();
    let list = |text: &Option<String>| -> Vec<String> {
        text.as_deref()
            .unwrap_or_default()
            .split(',')
            .map(str::trim)
            .filter(|a| !a.is_empty())
            .map(String::from)
            .collect()
    };
    let (metrics_endpoints, status_endpoints) = (list(&arguments.metrics_endpoints), list(&arguments.status_endpoints));
    if metrics_endpoints.is_empty() || status_endpoints.is_empty() {
        bail!("the attack worker needs --metrics-endpoints and --status-endpoints");
    }
    let (Some(cert_file), Some(key_file)) = (&arguments.tenant_certificate, &arguments.tenant_key) else {
        bail!("the attack worker needs --tenant-certificate and --tenant-key");
    };
    let tenant_identity = (std::fs::read(cert_file)?, std::fs::read(key_file)?);
    let Some(node_certificates) = &arguments.node_certificates else {
        bail!("the attack worker needs --node-certificates");
    };
    let node_identities = read_node_identities(node_certificates)?;
    if !node_identities.contains_key(&NON_MEMBER_NODE_ID) {
        bail!("--node-certificates {} has no certificate of node {NON_MEMBER_NODE_ID}", node_certificates.display());
    }
    let history = HistoryWriter::create(&arguments.history).context("open the history")?;
    let mut final_signal = crate::workload::final_signal();
    let mut random = StdRng::seed_from_u64(arguments.seed);
    let client_id = random.random_range(1..u64::MAX);
    let mut intruder = Intruder {
        endpoints: settings.endpoints.clone(),
        random,
        history,
        sequence: 0,
        peer_endpoints,
        metrics_endpoints,
        status_endpoints,
        pending: Vec::new(),
        peer_addresses,
        ca_pem,
        client,
        tenant_identity,
        node_identities,
        client_id,
        request_sequence: 0,
        status: None,
        own: None,
        own_sessions: BTreeSet::new(),
        own_tokens: BTreeSet::new(),
        leaks: Vec::new(),
        arguments,
    };
    let mut order = Attack::ALL.to_vec();
    if intruder.arguments.older_release_nodes {
        order.retain(|attack| !attack.needs_this_release());
    }
    while !*final_signal.borrow_and_update() {
        intruder.refresh_status().await;
        intruder.ensure_own().await;
        if let Some(directory) = intruder.arguments.leak_from.clone() {
            intruder.leaks = read_leaks(&directory, &intruder.arguments.history);
        }
        order.shuffle(&mut intruder.random);
        for attack in &order {
            if *final_signal.borrow() {
                break;
            }
            intruder.attempt(*attack).await;
            intruder.finish_pending(false).await;
            let pause = intruder.random.random_range(ATTACK_PAUSE_MS_MIN..=ATTACK_PAUSE_MS_MAX);
            tokio::time::sleep(Duration::from_millis(pause)).await;
        }
    }
    intruder.finish_pending(true).await;
    if let Some(own) = intruder.own.take() {
        let _ = tokio::time::timeout(Duration::from_secs(5), own.session.close()).await;
    }
    Ok(())
}

/// One try of `Attack::IdleHandshakes` (or `MetricsIdle`) against `endpoint`:
/// refused when the node closed every connection it took within `IDLE_HOLD_MS`.
async fn idle_try(endpoint: String) -> Outcome {
    let address = endpoint.trim_start_matches("https://").trim_start_matches("http://");
    let Ok(target) = address.parse::<std::net::SocketAddr>() else {
        return Outcome::Unknown(format!("{endpoint} is not a socket address"));
    };
    let mut held = Vec::new();
    for _ in 0..IDLE_CONNECTIONS_PER_TRY {
        if let Some(stream) = connect_from(IDLE_SOURCE, target).await {
            held.push(stream);
        }
    }
    if held.is_empty() {
        return Outcome::Unknown(format!("no connection to {endpoint} was made"));
    }
    tokio::time::sleep(Duration::from_millis(IDLE_HOLD_MS)).await;
    judge_held(target, &mut held, &format!("idle connections still open after {IDLE_HOLD_MS} ms"), "CLOSED_IDLE").await
}

/// A TCP connection to `target` from the address `source`, if one is made in time.
async fn connect_from(source: &str, target: std::net::SocketAddr) -> Option<tokio::net::TcpStream> {
    let socket = tokio::net::TcpSocket::new_v4().ok()?;
    socket.bind(format!("{source}:0").parse().expect("a socket address")).ok()?;
    tokio::time::timeout(Duration::from_millis(ATTACK_RPC_TIMEOUT_MS), socket.connect(target)).await.ok()?.ok()
}

/// How many of `held` the node has not closed (nothing to read and no end of stream).
async fn still_open(held: &mut [tokio::net::TcpStream]) -> usize {
    use tokio::io::AsyncReadExt;
    let mut open = 0;
    for stream in held {
        let mut buffer = [0u8; 4096];
        loop {
            match tokio::time::timeout(Duration::from_millis(10), stream.read(&mut buffer)).await {
                // Answers the node wrote before it closed: read on to the end.
                Ok(Ok(read)) if read > 0 => continue,
                Ok(_) => break,
                Err(_) => {
                    open += 1;
                    break;
                }
            }
        }
    }
    open
}

/// The verdict on connections a try held: refused (`refusal`) when the node closed
/// them all; when some are open, succeeded only if the node is running (it closes
/// a silent probe connection within `ALIVE_PROBE_MS`): a node the nemesis paused
/// closes nothing, and a try against it says nothing.
async fn judge_held(
    target: std::net::SocketAddr,
    held: &mut [tokio::net::TcpStream],
    open_means: &str,
    refusal: &str,
) -> Outcome {
    if still_open(held).await == 0 {
        return Outcome::Refused(refusal.to_string());
    }
    let Ok(Ok(mut probe)) =
        tokio::time::timeout(Duration::from_millis(ATTACK_RPC_TIMEOUT_MS), tokio::net::TcpStream::connect(target))
            .await
    else {
        return Outcome::Unknown(format!("{target} takes no connection now"));
    };
    let probe_closed = {
        use tokio::io::AsyncReadExt;
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_millis(ALIVE_PROBE_MS), probe.read(&mut byte)).await;
        matches!(read, Ok(Ok(0)) | Ok(Err(_)))
    };
    if !probe_closed {
        return Outcome::Unknown(format!("{target} closed no connection within {ALIVE_PROBE_MS} ms: paused?"));
    }
    // The node runs: what it held past its deadlines it has closed by now.
    match still_open(held).await {
        0 => Outcome::Refused(refusal.to_string()),
        open => Outcome::Succeeded(format!("{open} of {} {open_means}", held.len())),
    }
}

/// One try of `Attack::SlowReaderStatus` against the status page at `endpoint`:
/// refused when the node kept at most `STATUS_CONNECTIONS_PER_SOURCE` of the
/// connections and closed every one within `SLOW_READER_HOLD_MS`.
async fn slow_reader_try(endpoint: String, ca_pem: Vec<u8>) -> Outcome {
    use tokio::io::AsyncWriteExt;
    let Ok(target) = endpoint.parse::<std::net::SocketAddr>() else {
        return Outcome::Unknown(format!("{endpoint} is not a socket address"));
    };
    let mut roots = rustls::RootCertStore::empty();
    for certificate in rustls_pki_types::CertificateDer::pem_slice_iter(&ca_pem).flatten() {
        let _ = roots.add(certificate);
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let Ok(builder) = rustls::ClientConfig::builder_with_provider(provider).with_safe_default_protocol_versions()
    else {
        return Outcome::Unknown("no TLS configuration".into());
    };
    let mut config = builder.with_root_certificates(roots).with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    let name = rustls_pki_types::ServerName::IpAddress(target.ip().into());
    let requests = "GET /page.js HTTP/1.1\r\nHost: status\r\n\r\n".repeat(SLOW_READER_REQUESTS);
    // All at once, as a client that opens many connections does.
    let tries = (0..SLOW_READERS_PER_TRY).map(|_| {
        let (connector, name, requests) = (connector.clone(), name.clone(), requests.clone());
        async move {
            let Some(stream) = connect_from(SLOW_READER_SOURCE, target).await else { return Err(false) };
            let handshake = connector.connect(name, stream);
            match tokio::time::timeout(Duration::from_millis(ATTACK_RPC_TIMEOUT_MS), handshake).await {
                Ok(Ok(mut stream)) => {
                    // What fits in the buffers is sent; the rest would wait for a reader.
                    let write = stream.write_all(requests.as_bytes());
                    let _ = tokio::time::timeout(Duration::from_millis(200), write).await;
                    Ok(stream)
                }
                // Closed by the node at once (past the address's share).
                Ok(Err(_)) => Err(true),
                Err(_) => Err(false),
            }
        }
    });
    let mut handshaken = Vec::new();
    let mut closed_at_once = 0;
    for outcome in futures::future::join_all(tries).await {
        match outcome {
            Ok(stream) => handshaken.push(stream),
            Err(closed) => closed_at_once += usize::from(closed),
        }
    }
    if handshaken.is_empty() {
        // Every connection closed at once: the address's share is held (by an
        // earlier try's slow readers) and the node refuses more.
        if closed_at_once == SLOW_READERS_PER_TRY {
            return Outcome::Refused("CLOSED_PAST_SHARE".to_string());
        }
        return Outcome::Unknown(format!("no TLS connection to {endpoint} was made"));
    }
    let kept = handshaken.len();
    if kept > STATUS_CONNECTIONS_PER_SOURCE {
        return Outcome::Succeeded(format!(
            "{kept} connections from one address kept by the status page (its share is \
             {STATUS_CONNECTIONS_PER_SOURCE})"
        ));
    }
    tokio::time::sleep(Duration::from_millis(SLOW_READER_HOLD_MS)).await;
    // The TLS streams' sockets, to see whether the node closed them.
    let mut tcp: Vec<tokio::net::TcpStream> = handshaken.into_iter().map(|stream| stream.into_inner().0).collect();
    let open_means = format!("slow readers still open after {SLOW_READER_HOLD_MS} ms");
    judge_held(target, &mut tcp, &open_means, "CLOSED_SLOW_READER").await
}

/// One try of `Attack::StreamAfterRotation`: a session made with the token in
/// `token_file` (tenant `stolen`'s, which the harness rotates as an operator would
/// after a leak), and a keepalive stream on `endpoint` opened with it, kept going
/// until the file holds another token. Refused when the stream then ends
/// UNAUTHENTICATED; succeeded when it still answers `alive` `ROTATION_GRACE_MS`
/// after the rotation was seen.
async fn stream_after_rotation_try(
    endpoint: String,
    settings: leasehold::Settings,
    token_file: PathBuf,
    request_id: pb::RequestId,
) -> Outcome {
    let read = || leasehold::settings::read_token_file(&token_file).ok();
    let Some(token) = read() else { return Outcome::Unknown("no stolen token to try".into()) };
    let settings = leasehold::Settings { token: Some(token.clone()), token_file: None, ..settings };
    let Ok(client) = settings.client() else { return Outcome::Unknown("no client for the stolen token".into()) };
    // The session is made on the leader (following its redirects), and the stream
    // opened there.
    let create = pb::CreateSessionRequest { request_id: Some(request_id), ttl_ms: 3_000, client_name: "stolen".into() };
    let mut endpoint = endpoint;
    let mut made = None;
    for _ in 0..LEADER_HOPS_MAX {
        let Ok(channel) = client.raw_channel(&endpoint) else { break };
        let mut leasehold = pb::leasehold_client::LeaseholdClient::new(channel);
        match answer(leasehold.create_session(request(create.clone()))).await {
            Answer::Ok(created) => {
                made = Some((leasehold, created));
                break;
            }
            Answer::Status(status) if error_reason(&status) == Some(ErrorReason::NotLeader) => {
                match error_metadata(&status, METADATA_LEADER).filter(|leader| !leader.is_empty()) {
                    Some(leader) => endpoint = leader,
                    None => return Outcome::Unknown(format!("no leader for the session: {status}")),
                }
            }
            Answer::Status(status) => return Outcome::Unknown(format!("no session with the stolen token: {status}")),
            Answer::Timeout => return Outcome::Unknown("no session with the stolen token in time".into()),
        }
    }
    let Some((mut leasehold, created)) = made else {
        return Outcome::Unknown(format!("no session with the stolen token within {LEADER_HOPS_MAX} redirects"));
    };
    let keepalive = pb::KeepAliveRequest { session_id: created.session_id, session_secret: created.session_secret };
    let (sender, receiver) = futures::channel::mpsc::unbounded();
    let _ = sender.unbounded_send(keepalive.clone());
    let mut answers = match answer(leasehold.keep_alive(request(receiver))).await {
        Answer::Ok(answers) => answers,
        Answer::Status(status) => return Outcome::Unknown(format!("no keepalive stream: {status}")),
        Answer::Timeout => return Outcome::Unknown("no keepalive stream in time".into()),
    };
    let started = tokio::time::Instant::now();
    let mut rotated_at: Option<tokio::time::Instant> = None;
    loop {
        let next = tokio::time::timeout(Duration::from_millis(ATTACK_RPC_TIMEOUT_MS), answers.message()).await;
        if rotated_at.is_none() && read().is_some_and(|now| now != token) {
            rotated_at = Some(tokio::time::Instant::now());
        }
        match next {
            Ok(Ok(Some(answer))) if answer.alive => {
                if let Some(at) = rotated_at.filter(|at| at.elapsed() > Duration::from_millis(ROTATION_GRACE_MS)) {
                    return Outcome::Succeeded(format!(
                        "alive = true for session {} {} ms after its token was rotated",
                        answer.session_id,
                        at.elapsed().as_millis()
                    ));
                }
            }
            Ok(Ok(Some(_))) => return Outcome::Unknown("the session expired before the rotation".into()),
            Ok(Ok(None)) => return Outcome::Unknown("the keepalive stream ended without an error".into()),
            Ok(Err(status)) if status.code() == Code::Unauthenticated && rotated_at.is_some() => {
                return Outcome::Refused("UNAUTHENTICATED".into())
            }
            // Ended before this try saw the file change: the rotation came first.
            Ok(Err(status)) if status.code() == Code::Unauthenticated => {
                return match read().is_some_and(|now| now != token) {
                    true => Outcome::Refused("UNAUTHENTICATED".into()),
                    false => Outcome::Unknown(format!("refused before any rotation: {status}")),
                }
            }
            Ok(Err(status)) => return Outcome::Unknown(format!("the keepalive stream ended: {status}")),
            Err(_) => return Outcome::Unknown(format!("no keepalive answer within {ATTACK_RPC_TIMEOUT_MS} ms")),
        }
        if rotated_at.is_none() && started.elapsed() > Duration::from_millis(ROTATION_WAIT_MS) {
            return Outcome::Unknown(format!("no rotation within {ROTATION_WAIT_MS} ms"));
        }
        tokio::time::sleep(Duration::from_millis(ROTATION_KEEPALIVE_MS)).await;
        // A stream the node ended takes no more; its answer says how it ended.
        let _ = sender.unbounded_send(keepalive.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attack_names_are_unique_and_parse_back() {
        let names: BTreeSet<&str> = Attack::ALL.iter().map(|attack| attack.name()).collect();
        assert_eq!(names.len(), Attack::ALL.len());
        for attack in Attack::ALL {
            assert_eq!(Attack::from_name(attack.name()), Some(attack));
        }
        for kind in AttackKind::ALL {
            assert!(Attack::ALL.iter().any(|attack| attack.kind() == kind), "{kind:?} has no attack");
        }
        assert_eq!(Attack::from_name("lock/0"), None);
        for name in ["peer-non-member-append", "peer-non-member-vote", "peer-forged-headers", "peer-high-term"] {
            let attack = Attack::from_name(name).unwrap_or_else(|| panic!("{name} is an attack"));
            assert_eq!(attack.kind(), AttackKind::PeerPort, "{name}");
        }
        assert_eq!(Attack::from_name("peer-retire-voter").map(Attack::kind), Some(AttackKind::PeerPort));
    }

    #[test]
    fn node_certificate_files_are_found_by_node_id() {
        let directory = tempfile::tempdir().unwrap();
        for id in [1, 2, NON_MEMBER_NODE_ID] {
            let (cert, key) = node_certificate_files(directory.path(), id);
            std::fs::write(cert, format!("cert {id}")).unwrap();
            std::fs::write(key, format!("key {id}")).unwrap();
        }
        std::fs::write(directory.path().join("node-x.pem"), "not a node's").unwrap();
        std::fs::write(directory.path().join("ca.pem"), "the CA's").unwrap();
        let identities = read_node_identities(directory.path()).unwrap();
        assert_eq!(identities.keys().copied().collect::<Vec<_>>(), vec![1, 2, NON_MEMBER_NODE_ID]);
        let expected = (format!("cert {NON_MEMBER_NODE_ID}"), format!("key {NON_MEMBER_NODE_ID}"));
        assert_eq!(identities[&NON_MEMBER_NODE_ID], expected);
        assert_eq!(node_certificate_id("node-12.pem"), Some(12));
        assert_eq!(node_certificate_id("node-12.key"), None);
    }

    #[test]
    fn crafted_raft_messages_are_postcard_of_openraft_types() {
        // term 0, node 300 (a two-byte varint), committed false, no last log id.
        assert_eq!(crafted_vote(300), vec![PEER_FORMAT_VERSION, 0, 0xac, 0x02, 0, 0]);
        assert_eq!(crafted_heartbeat(3), vec![PEER_FORMAT_VERSION, 0, 3, 1, 0, 0, 0]);
    }

    #[test]
    fn leaks_come_from_every_other_history() {
        let directory = tempfile::tempdir().unwrap();
        let record = |process: u64, sequence: u64, session: u64| Record {
            process,
            sequence,
            kind: Kind::Ok,
            function: Function::Acquire,
            key: "lock/0".into(),
            session,
            token: Some(session + 1),
            value: None,
            error: None,
            alive_ns: None,
            leader_session: None,
            evidence: None,
            phase: Phase::Main,
            time_ns: sequence,
        };
        for process in 1..=3 {
            let mut history = HistoryWriter::create(&directory.path().join(format!("worker-{process}.jsonl"))).unwrap();
            for sequence in 1..=20 {
                history.append(&record(process, sequence, process * 100 + sequence)).unwrap();
            }
        }
        let own = directory.path().join("worker-3.jsonl");
        let leaks = read_leaks(directory.path(), &own);
        assert_eq!(leaks.len(), 2 * LEAKS_PER_HISTORY_MAX);
        assert!(leaks.iter().all(|leak| leak.session / 100 != 3), "its own history is no leak");
        assert!(leaks.iter().any(|leak| leak.session == 120) && leaks.iter().any(|leak| leak.session == 220));
        assert_eq!(
            leaks[0],
            Leak { session: 113, function: Function::Acquire, key: "lock/0".into(), token: Some(114) }
        );
    }

    #[test]
    fn statuses_are_classed_by_reason_and_transport_errors_by_code() {
        use leasehold::proto::errors::error_status;
        let received = |reason: ErrorReason| {
            let sent = error_status(reason, "x", &[]);
            Status::with_details(sent.code(), sent.message(), sent.details().to_vec().into())
        };
        let expected = [ErrorReason::PermissionDenied];
        assert_eq!(
            classify(&received(ErrorReason::PermissionDenied), &expected, false),
            Outcome::Refused("PERMISSION_DENIED: x".into())
        );
        assert!(matches!(classify(&received(ErrorReason::NotLeader), &expected, false), Outcome::Unknown(_)));
        let Outcome::Refused(unexpected) = classify(&received(ErrorReason::TenantExists), &expected, false) else {
            panic!("a definite refusal with another reason is still a refusal");
        };
        assert!(unexpected.starts_with(UNEXPECTED_REFUSAL), "{unexpected}");
        let alert = Status::unavailable("transport error: received fatal alert: UnknownCA");
        assert!(
            matches!(classify(&alert, &expected, true), Outcome::Refused(reason) if reason.starts_with(TLS_REFUSED))
        );
        assert!(matches!(classify(&alert, &expected, false), Outcome::Unknown(_)));
        assert!(matches!(classify(&Status::unavailable("connection refused"), &expected, true), Outcome::Unknown(_)));
        assert!(is_dropped_connection("Cancelled: operation was canceled: connection closed"));
        assert!(is_dropped_connection("Unknown: connection error: stream closed because of a broken pipe"));
        assert!(!is_dropped_connection("Unavailable: tcp connect error: Connection refused (os error 111)"));
        assert!(!is_dropped_connection("no answer within 3000 ms"));
        let answered: Answer<()> = Answer::Ok(());
        assert!(matches!(must_refuse(answered, &expected, false, |_| "in".into()), Outcome::Succeeded(_)));
    }

    #[test]
    fn a_refusal_that_names_the_sessions_tenant_is_a_leak() {
        let named = Outcome::Refused(format!("PERMISSION_DENIED: session 9 belongs to tenant \"{VICTIM_TENANT}\""));
        assert!(matches!(names_the_owner(named), Outcome::Succeeded(_)));
        let unknown = Outcome::Refused("UNKNOWN_SESSION: session 9 does not exist".into());
        assert_eq!(names_the_owner(unknown), Outcome::Refused("UNKNOWN_SESSION: session 9 does not exist".into()));
    }
}

/// `--peer-endpoints`: `ID=ADDRESS` pairs, comma-separated.
fn parse_peer_addresses(text: &str) -> anyhow::Result<BTreeMap<u64, String>> {
    let mut addresses = BTreeMap::new();
    for pair in text.split(',').map(str::trim).filter(|pair| !pair.is_empty()) {
        let Some((id, address)) = pair.split_once('=') else {
            bail!("--peer-endpoints {pair:?} is not ID=ADDRESS");
        };
        let id = id.parse::<u64>().with_context(|| format!("--peer-endpoints {pair:?}: a node id"))?;
        addresses.insert(id, address.to_owned());
    }
    Ok(addresses)
}
