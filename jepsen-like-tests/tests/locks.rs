//! Sessions and fenced locks on a 3-node cluster of real processes.

use std::time::{Duration, Instant};

use leasehold::client::Transport;
use leasehold::proto::leasehold_client::LeaseholdClient;
use leasehold::proto::{self as pb, acquire_response::Outcome};
use leasehold_jepsen::cluster::{ClusterOptions, TestCluster};

const LEADER_DEADLINE: Duration = Duration::from_secs(20);

async fn raw_leader(cluster: &TestCluster) -> LeaseholdClient<Transport> {
    let leader = cluster.wait_for_leader(LEADER_DEADLINE).await;
    LeaseholdClient::new(cluster.client().raw_channel(&cluster.nodes[&leader].client_addr).expect("a channel"))
}

fn request_id(sequence: u64) -> Option<pb::RequestId> {
    Some(pb::RequestId { client_id: 4242, sequence })
}

/// A session made through the raw API: its id and its secret.
async fn raw_session(raw: &mut LeaseholdClient<Transport>, sequence: u64, ttl_ms: u64) -> (u64, Vec<u8>) {
    let created = raw
        .create_session(pb::CreateSessionRequest {
            request_id: request_id(sequence),
            ttl_ms,
            client_name: "raw".into(),
        })
        .await
        .expect("create session")
        .into_inner();
    (created.session_id, created.session_secret)
}

fn token_of(response: pb::AcquireResponse) -> Option<u64> {
    match response.outcome {
        Some(Outcome::Granted(granted)) => Some(granted.token),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_granted_in_fifo_order_with_increasing_tokens() {
    let cluster = TestCluster::start(ClusterOptions::default());
    cluster.wait_for_leader(LEADER_DEADLINE).await;
    let client = cluster.client();
    let holder = client.session(Duration::from_secs(30)).await.unwrap();
    let first = holder.try_lock("fifo").await.unwrap().expect("free lock");

    let (grants, mut granted) = tokio::sync::mpsc::unbounded_channel();
    let mut sessions = Vec::new();
    for position in 0..3u64 {
        let session = client.session(Duration::from_secs(30)).await.unwrap();
        sessions.push(session.id());
        let grants = grants.clone();
        tokio::spawn(async move {
            let guard = session.lock_with_timeout("fifo", Duration::from_secs(20)).await.unwrap().expect("granted");
            grants.send((position, guard.token())).unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
            guard.release().await.unwrap();
        });
        // Queue in a known order.
        leasehold_jepsen::wait::until(Duration::from_secs(5), "the waiter to queue", || {
            let client = client.clone();
            async move {
                let lock = client.describe_lock("fifo", false).await.ok()?;
                (lock.waiters.len() as u64 == position + 1).then_some(())
            }
        })
        .await;
    }
    let lock = client.describe_lock("fifo", false).await.unwrap();
    let waiting: Vec<u64> = lock.waiters.iter().map(|waiter| waiter.session_id).collect();
    assert_eq!(waiting, sessions, "describe lists waiters in FIFO order");

    let first_token = first.token();
    first.release().await.unwrap();
    let mut previous = first_token;
    for expected_position in 0..3 {
        let (position, token) = tokio::time::timeout(Duration::from_secs(10), granted.recv()).await.unwrap().unwrap();
        assert_eq!(position, expected_position, "grants follow the queue order");
        assert!(token > previous, "token {token} must exceed the previous grant's {previous}");
        previous = token;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_holder_hands_the_lock_to_the_waiter() {
    let cluster = TestCluster::start(ClusterOptions::default());
    let mut raw = raw_leader(&cluster).await;
    // A session that is never kept alive: it expires after its TTL.
    let (doomed, secret) = raw_session(&mut raw, 1, 1_000).await;
    let doomed_token = token_of(
        raw.acquire(pb::AcquireRequest {
            lock_delay_ms: None,
            request_id: request_id(2),
            session_id: doomed,
            name: "expiry".into(),
            wait_ms: 0,
            session_secret: secret,
        })
        .await
        .unwrap()
        .into_inner(),
    )
    .expect("granted");

    let client = cluster.client();
    let waiter = client.session(Duration::from_secs(30)).await.unwrap();
    let started = Instant::now();
    let guard =
        waiter.lock_with_timeout("expiry", Duration::from_secs(15)).await.unwrap().expect("granted after expiry");
    assert!(guard.token() > doomed_token);
    assert!(started.elapsed() >= Duration::from_millis(500), "granted only once the holder expired");
    let gone = client.describe_session(doomed).await;
    assert!(matches!(gone, Err(leasehold::Error::NotFound(_))), "the expired session is gone: {gone:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_survives_the_leader_being_killed_without_a_double_grant() {
    let mut cluster = TestCluster::start(ClusterOptions::default());
    let leader = cluster.wait_for_leader(LEADER_DEADLINE).await;
    let client = cluster.client();
    let holder = client.session(Duration::from_secs(30)).await.unwrap();
    let held = holder.try_lock("failover").await.unwrap().expect("free");

    let waiter = client.session(Duration::from_secs(30)).await.unwrap();
    let waiting = tokio::spawn(async move {
        let guard = waiter.lock_with_timeout("failover", Duration::from_secs(30)).await.unwrap().expect("granted");
        // The session stays alive with the test; dropping it would close it.
        let token = guard.detach();
        (waiter, token)
    });
    leasehold_jepsen::wait::until(Duration::from_secs(5), "the waiter to queue", || {
        let client = client.clone();
        async move { (client.describe_lock("failover", false).await.ok()?.waiters.len() == 1).then_some(()) }
    })
    .await;

    cluster.kill(leader);
    cluster.wait_for_leader(LEADER_DEADLINE).await;
    let held_token = held.token();
    held.release().await.expect("release after failover");
    let (waiter, token) = tokio::time::timeout(Duration::from_secs(30), waiting).await.unwrap().unwrap();
    assert!(token > held_token);
    let lock = client.describe_lock("failover", false).await.unwrap();
    let current = lock.holder.expect("held by the waiter");
    assert_eq!((current.session_id, current.token), (waiter.id(), token), "exactly one holder, the waiter");
    assert!(lock.waiters.is_empty(), "no second queue entry: {:?}", lock.waiters);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_acquire_returns_the_same_grant_and_a_reused_id_is_refused() {
    let cluster = TestCluster::start(ClusterOptions::default());
    let mut raw = raw_leader(&cluster).await;
    let (session, first_secret) = raw_session(&mut raw, 10, 30_000).await;
    // A retried CreateSession returns the same session, with a new secret that
    // replaces the one whose answer was "lost".
    let (again, secret) = raw_session(&mut raw, 10, 30_000).await;
    assert_eq!(again, session);
    assert_ne!(secret, first_secret);

    let acquire = pb::AcquireRequest {
        lock_delay_ms: None,
        request_id: request_id(11),
        session_id: session,
        name: "retry".into(),
        wait_ms: 0,
        session_secret: secret,
    };
    let first = token_of(raw.acquire(acquire.clone()).await.unwrap().into_inner()).expect("granted");
    // The response was "lost": the client sends the same request again.
    let again = token_of(raw.acquire(acquire.clone()).await.unwrap().into_inner()).expect("same grant");
    assert_eq!(first, again, "a retry returns the original grant, not a new token");

    let reused = pb::AcquireRequest { name: "another".into(), ..acquire };
    let status = raw.acquire(reused).await.expect_err("a reused request id for another request is refused");
    assert_eq!(status.code(), tonic::Code::AlreadyExists, "{status:?}");
    let lock = raw
        .describe_lock(pb::DescribeLockRequest { name: "another".into(), ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert!(lock.holder.is_none(), "the refused request changed nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_a_clear_error_and_changes_nothing() {
    let cluster = TestCluster::start(ClusterOptions::default());
    let mut raw = raw_leader(&cluster).await;
    let (session, secret) = raw_session(&mut raw, 20, 30_000).await;
    let token = token_of(
        raw.acquire(pb::AcquireRequest {
            lock_delay_ms: None,
            request_id: request_id(21),
            session_id: session,
            name: "guarded".into(),
            wait_ms: 0,
            session_secret: secret.clone(),
        })
        .await
        .unwrap()
        .into_inner(),
    )
    .unwrap();
    let describe = |raw: &mut LeaseholdClient<Transport>| {
        let mut raw = raw.clone();
        async move {
            let lock = raw
                .describe_lock(pb::DescribeLockRequest { name: "guarded".into(), ..Default::default() })
                .await
                .unwrap()
                .into_inner();
            let sessions = raw.list_sessions(pb::ListSessionsRequest::default()).await.unwrap().into_inner();
            (format!("{lock:?}"), format!("{sessions:?}"))
        }
    };
    let before = describe(&mut raw).await;

    let mut sequence = 100;
    let mut next = || {
        sequence += 1;
        request_id(sequence)
    };
    let cases: Vec<(Result<(), tonic::Status>, tonic::Code, &str)> = vec![
        (
            raw.acquire(pb::AcquireRequest {
                lock_delay_ms: None,
                request_id: next(),
                session_id: session,
                name: String::new(),
                wait_ms: 0,
                session_secret: secret.clone(),
            })
            .await
            .map(|_| ()),
            tonic::Code::InvalidArgument,
            "name is empty",
        ),
        (
            raw.acquire(pb::AcquireRequest {
                lock_delay_ms: None,
                request_id: next(),
                session_id: session,
                name: "n".repeat(300),
                wait_ms: 0,
                session_secret: secret.clone(),
            })
            .await
            .map(|_| ()),
            tonic::Code::InvalidArgument,
            "300 bytes",
        ),
        (
            raw.create_session(pb::CreateSessionRequest { request_id: next(), ttl_ms: 0, client_name: String::new() })
                .await
                .map(|_| ()),
            tonic::Code::InvalidArgument,
            "ttl_ms 0 is out of range",
        ),
        (
            raw.create_session(pb::CreateSessionRequest {
                request_id: next(),
                ttl_ms: 100_000_000,
                client_name: String::new(),
            })
            .await
            .map(|_| ()),
            tonic::Code::InvalidArgument,
            "out of range",
        ),
        (
            raw.acquire(pb::AcquireRequest {
                lock_delay_ms: None,
                request_id: next(),
                session_id: 999_999,
                name: "guarded".into(),
                wait_ms: 0,
                session_secret: secret.clone(),
            })
            .await
            .map(|_| ()),
            tonic::Code::NotFound,
            "999999",
        ),
        (
            raw.release(pb::ReleaseRequest {
                request_id: next(),
                session_id: session,
                name: "guarded".into(),
                token: token + 1,
                session_secret: secret.clone(),
            })
            .await
            .map(|_| ()),
            tonic::Code::FailedPrecondition,
            "token",
        ),
        (
            raw.acquire(pb::AcquireRequest {
                lock_delay_ms: None,
                request_id: None,
                session_id: session,
                name: "guarded".into(),
                wait_ms: 0,
                session_secret: secret.clone(),
            })
            .await
            .map(|_| ()),
            tonic::Code::InvalidArgument,
            "request_id is required",
        ),
    ];
    for (result, code, expected) in cases {
        let status = result.expect_err("bad input must be refused");
        assert_eq!(status.code(), code, "{status:?}");
        assert!(status.message().contains(expected), "{:?} should mention {expected:?}", status.message());
    }
    assert_eq!(before, describe(&mut raw).await, "bad input changed the state");

    // Garbage bytes on the wire: a malformed gRPC body is refused too.
    let address = cluster.nodes[&cluster.wait_for_leader(LEADER_DEADLINE).await].client_addr.clone();
    let mut grpc = tonic::client::Grpc::new(cluster.client().raw_channel(&address).unwrap());
    grpc.ready().await.unwrap();
    let path = tonic::codegen::http::uri::PathAndQuery::from_static("/leasehold.v1.Leasehold/Acquire");
    // A RequestId's bytes, sent where an AcquireRequest is expected: field 1 arrives
    // as a varint where a message belongs.
    let codec = tonic_prost::ProstCodec::<pb::RequestId, pb::AcquireResponse>::default();
    let garbage = pb::RequestId { client_id: u64::MAX, sequence: 7 };
    let refused = grpc.unary(tonic::Request::new(garbage), path, codec).await;
    assert!(refused.is_err(), "garbage bytes must be refused: {refused:?}");
    assert_eq!(before, describe(&mut raw).await);
}

/// A wait whose session ends while it waits reports the session lost: whatever the
/// wait got went with the session, and the caller must start over with a new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_whose_session_ends_reports_the_session_lost() {
    let cluster = TestCluster::start(ClusterOptions::default());
    let mut raw = raw_leader(&cluster).await;
    let (holder, holder_secret) = raw_session(&mut raw, 1, 30_000).await;
    raw.acquire(pb::AcquireRequest {
        lock_delay_ms: None,
        request_id: request_id(2),
        session_id: holder,
        name: "ended".into(),
        wait_ms: 0,
        session_secret: holder_secret,
    })
    .await
    .expect("the holder is granted");

    let client = cluster.client();
    let waiter = client.session(Duration::from_secs(30)).await.unwrap();
    let (waiter_id, waiter_secret) = (waiter.id(), waiter.secret());
    let wait = tokio::spawn(async move { waiter.lock_with_timeout("ended", Duration::from_secs(20)).await });
    // Close the waiting session from outside once it is queued.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let lock = client.describe_lock("ended", false).await.expect("describe the lock");
        if lock.waiters.iter().any(|waiter| waiter.session_id == waiter_id) {
            break;
        }
        assert!(Instant::now() < deadline, "the waiter did not queue within 10 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    raw.close_session(pb::CloseSessionRequest {
        request_id: request_id(3),
        session_id: waiter_id,
        session_secret: waiter_secret,
    })
    .await
    .expect("close the waiting session");
    let outcome = tokio::time::timeout(Duration::from_secs(10), wait).await.expect("the wait ends").unwrap();
    assert!(
        matches!(outcome, Err(leasehold::Error::SessionLost(id)) if id == waiter_id),
        "the wait reports its session lost: {outcome:?}"
    );
}
