//! The Prometheus page of real server processes: what an operator scrapes.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use leasehold::client::Transport;
use leasehold::proto::errors::error_reason;
use leasehold::proto::leasehold_client::LeaseholdClient;
use leasehold::proto::{self as pb, acquire_response::Outcome, ErrorReason};
use leasehold_jepsen::cluster::{ClusterOptions, TestCluster, TEST_TENANT};
use leasehold_jepsen::wait;

const LEADER_DEADLINE: Duration = Duration::from_secs(20);

/// `GET /metrics` of node `id` as Prometheus scrapes it (HTTPS, the scrape token), as
/// metric name (with labels) to value; `None` while the node does not answer.
async fn scrape(cluster: &TestCluster, id: u64) -> Option<BTreeMap<String, f64>> {
    let answer = cluster.scrape(id).await.ok()?;
    assert_eq!(answer.status, 200, "metrics answered {answer:?}");
    Some(
        answer
            .body
            .lines()
            .filter(|line| !line.starts_with('#') && !line.is_empty())
            .map(|line| {
                let (name, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("malformed line {line:?}"));
                (name.to_string(), value.parse().unwrap_or_else(|_| panic!("malformed value in {line:?}")))
            })
            .collect(),
    )
}

fn request_id(sequence: u64) -> Option<pb::RequestId> {
    Some(pb::RequestId { client_id: 4343, sequence })
}

/// A session of the test tenant made over a raw channel to `address`, for requests
/// the client library would retry (a burst whose refusals the test reads).
async fn raw_session(
    cluster: &TestCluster,
    address: &str,
    client_name: &str,
) -> (LeaseholdClient<Transport>, pb::CreateSessionResponse) {
    let channel = cluster.client().raw_channel(address).expect("a channel");
    let raw: LeaseholdClient<Transport> = LeaseholdClient::new(channel);
    let created = raw
        .clone()
        .create_session(pb::CreateSessionRequest {
            request_id: request_id(1),
            ttl_ms: 600_000,
            client_name: client_name.into(),
        })
        .await
        .expect("create a session")
        .into_inner();
    (raw, created)
}

/// `count` try-locks of free locks `{prefix}/N` at once, each answered as it came.
async fn acquire_burst(
    raw: &LeaseholdClient<Transport>,
    created: &pb::CreateSessionResponse,
    prefix: &str,
    count: u64,
) -> Vec<Result<tonic::Response<pb::AcquireResponse>, tonic::Status>> {
    let burst = (0..count).map(|n| {
        let mut raw = raw.clone();
        let request = pb::AcquireRequest {
            request_id: request_id(100 + n),
            session_id: created.session_id,
            session_secret: created.session_secret.clone(),
            name: format!("{prefix}/{n}"),
            wait_ms: 0,
            lock_delay_ms: None,
        };
        async move { raw.acquire(request).await }
    });
    futures::future::join_all(burst).await
}

/// Expects a back-off refusal: RESOURCE_EXHAUSTED with `reason` and a retry-after of
/// 10 ms to 2 s.
fn expect_retry_after(status: &tonic::Status, reason: ErrorReason) {
    assert_eq!(error_reason(status), Some(reason), "{status:?}");
    assert_eq!(status.code(), tonic::Code::ResourceExhausted);
    let retry_after: u64 = leasehold::proto::errors::error_metadata(status, "retry_after_ms")
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| panic!("{reason:?} carries retry_after_ms: {status:?}"));
    assert!((10..=2_000).contains(&retry_after), "retry after {retry_after} ms");
}

/// The client library waits out a back-off refusal and tries again: `count` try-locks
/// at once all get through.
async fn library_burst_gets_through(cluster: &TestCluster, count: u64) {
    let session = cluster.client().session(Duration::from_secs(60)).await.expect("a session");
    let names: Vec<String> = (0..count).map(|n| format!("library/{n}")).collect();
    let locks = names.iter().map(|name| session.try_lock(name));
    for (n, outcome) in futures::future::join_all(locks).await.into_iter().enumerate() {
        let guard = outcome.unwrap_or_else(|error| panic!("lock {n} of the burst: {error}"));
        assert!(guard.is_some(), "lock {n} is free");
    }
}

/// Expects `result` refused with `reason`; panics naming `what` otherwise.
fn expect_reason<T: std::fmt::Debug>(result: Result<T, tonic::Status>, reason: ErrorReason, what: &str) {
    match result {
        Ok(answer) => panic!("{what}: answered {answer:?}, but must be refused with {reason:?}"),
        Err(status) => assert_eq!(error_reason(&status), Some(reason), "{what}: {status:?}"),
    }
}

/// A client that loops on commands certain to be refused (closing a session that is
/// gone, releasing with the token of a grant that ended, acting with a wrong secret)
/// gets the refusals applying them would give, and the leader proposes no log entry
/// for them: its log and `leasehold_entries_proposed_total` stay where they were while
/// `leasehold_commands_refused_early_total` counts every one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_certain_to_be_refused_cost_no_log_entry() {
    const REFUSALS: u64 = 600;
    let cluster = TestCluster::start(ClusterOptions::default());
    let leader = cluster.wait_for_leader(LEADER_DEADLINE).await;
    let channel = cluster.client().raw_channel(&cluster.nodes[&leader].client_addr).expect("a channel");
    let mut raw: LeaseholdClient<Transport> = LeaseholdClient::new(channel);
    let create = |sequence| {
        let mut raw = raw.clone();
        async move {
            let request = pb::CreateSessionRequest {
                request_id: request_id(sequence),
                ttl_ms: 600_000,
                client_name: "refused".into(),
            };
            let created = raw.create_session(request).await.expect("create a session").into_inner();
            (created.session_id, created.session_secret)
        }
    };
    let (gone, gone_secret) = create(1).await;
    let (live, secret) = create(2).await;
    let close = |sequence| pb::CloseSessionRequest {
        request_id: request_id(sequence),
        session_id: gone,
        session_secret: gone_secret.clone(),
    };
    raw.close_session(close(3)).await.expect("close the session");
    let acquire = |sequence, secret: &Vec<u8>| pb::AcquireRequest {
        request_id: request_id(sequence),
        session_id: live,
        session_secret: secret.clone(),
        name: "refused/lock".into(),
        wait_ms: 0,
        lock_delay_ms: None,
    };
    let granted = raw.acquire(acquire(4, &secret)).await.expect("acquire").into_inner();
    let Some(Outcome::Granted(pb::Granted { token })) = granted.outcome else { panic!("a free lock: {granted:?}") };
    let release = |sequence| pb::ReleaseRequest {
        request_id: request_id(sequence),
        session_id: live,
        session_secret: secret.clone(),
        name: "refused/lock".into(),
        token,
    };
    raw.release(release(5)).await.expect("release the lock");

    let before = scrape(&cluster, leader).await.expect("the leader's metrics");
    let wrong_secret = vec![7u8; secret.len()];
    for sequence in 10..10 + REFUSALS {
        match sequence % 3 {
            0 => expect_reason(raw.close_session(close(sequence)).await, ErrorReason::UnknownSession, "a gone session"),
            1 => expect_reason(raw.release(release(sequence)).await, ErrorReason::NotHolder, "an ended grant's token"),
            _ => expect_reason(
                raw.acquire(acquire(sequence, &wrong_secret)).await,
                ErrorReason::WrongSessionSecret,
                "a wrong secret",
            ),
        }
    }
    let after = scrape(&cluster, leader).await.expect("the leader's metrics");
    let value = |page: &BTreeMap<String, f64>, name: &str| *page.get(name).unwrap_or_else(|| panic!("no {name}"));
    assert_eq!(value(&after, "leasehold_raft_is_leader"), 1.0, "node {leader} led throughout");
    assert_eq!(value(&after, "leasehold_raft_term"), value(&before, "leasehold_raft_term"), "no election");
    // Entries the cluster proposes on its own (a checkpoint of quiet sessions) may
    // come meanwhile; one per refusal may not.
    let entries = value(&after, "leasehold_raft_last_log_index") - value(&before, "leasehold_raft_last_log_index");
    assert!(entries < 5.0, "{REFUSALS} refusals took {entries} log entries");
    assert_eq!(
        value(&after, "leasehold_commands_refused_early_total")
            - value(&before, "leasehold_commands_refused_early_total"),
        REFUSALS as f64
    );
    // And the session that was refused so often is still usable.
    let again = raw.acquire(acquire(1_000_000, &secret)).await.expect("acquire again").into_inner();
    assert!(matches!(again.outcome, Some(Outcome::Granted(_))), "{again:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_node_reports_the_replicated_state_and_the_leader_its_batching() {
    let options = ClusterOptions { extra_arguments: vec!["--metrics-per-tenant".into()], ..Default::default() };
    let cluster = TestCluster::start(options);
    cluster.wait_for_leader(LEADER_DEADLINE).await;
    let client = cluster.client();
    let session = client.session(Duration::from_secs(30)).await.unwrap();
    let guard = session.try_lock("metrics/orders").await.unwrap().expect("a free lock");
    let permit = session.semaphore("metrics/tenant", 2).try_acquire().await.unwrap().expect("a free permit");

    // Followers apply the grants a moment after the leader answers; the permit's
    // token is the index of the last of them.
    let last_grant = permit.token() as f64;
    let pages = wait::until(Duration::from_secs(10), "every node to apply the grants, with one leader", || {
        let cluster = &cluster;
        async move {
            let mut pages: Vec<(u64, BTreeMap<String, f64>)> = Vec::new();
            for id in cluster.nodes.keys() {
                pages.push((*id, scrape(cluster, *id).await?));
            }
            let applied = pages
                .iter()
                .all(|(_, page)| page.get("leasehold_raft_applied_index").is_some_and(|index| *index >= last_grant));
            let leaders: f64 = pages.iter().filter_map(|(_, page)| page.get("leasehold_raft_is_leader")).sum();
            (applied && leaders == 1.0).then_some(pages)
        }
    })
    .await;

    let mut commands_proposed = 0.0;
    for (id, page) in &pages {
        let value = |name: &str| *page.get(name).unwrap_or_else(|| panic!("node {id} has no {name}"));
        assert_eq!(value("leasehold_sessions"), 1.0, "node {id}");
        assert_eq!(value("leasehold_lease_deadlines"), 1.0, "node {id}: every node tracks the deadline");
        assert_eq!(value("leasehold_raft_members"), 3.0, "node {id}");
        assert_eq!(
            value("leasehold_semaphore_holders{tenant=\"test\",semaphore=\"metrics/tenant\"}"),
            1.0,
            "node {id}"
        );
        assert_eq!(value("leasehold_semaphore_limit{tenant=\"test\",semaphore=\"metrics/tenant\"}"), 2.0, "node {id}");
        assert_eq!(value("leasehold_locks"), 1.0, "node {id}");
        assert!(value("leasehold_heap_free_bytes") >= 0.0 && value("leasehold_heap_trims_total") >= 0.0);
        assert!(value("leasehold_commands_proposed_total") >= value("leasehold_entries_proposed_total"));
        // Every node, follower or leader, synced the entries it stored.
        let syncs = value("leasehold_log_sync_seconds_count");
        assert!(syncs >= 1.0, "node {id} counts its log's syncs: {syncs}");
        assert_eq!(value("leasehold_log_sync_seconds_bucket{le=\"+Inf\"}"), syncs, "node {id}");
        commands_proposed += value("leasehold_commands_proposed_total");
    }
    assert!(commands_proposed >= 3.0, "the session, the lock and the permit were proposed: {commands_proposed}");
    drop((guard, permit));
}

/// Below its disk reserve a leader refuses new state before any write can fail for
/// want of space (DISK_LOW, naming the free space and the reserve), while a release
/// still goes through; `Status`, `leasehold status` and the metrics say so. The
/// nodes are restarted with a reserve no disk here has.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn below_its_disk_reserve_the_leader_refuses_new_state_and_says_so() {
    let mut cluster = TestCluster::start(ClusterOptions::default());
    cluster.wait_for_leader(LEADER_DEADLINE).await;
    let client = cluster.client();
    let session = client.session(Duration::from_secs(60)).await.unwrap();
    let held = session.try_lock("disk/held").await.unwrap().expect("a free lock");

    let reserve = (1u64 << 60).to_string();
    for id in 1..=3 {
        cluster.restart_with(id, &["--disk-reserve-bytes", &reserve]);
    }
    let leader = cluster.wait_for_leader(LEADER_DEADLINE).await;
    let status = cluster.status(leader).await.expect("leader status");
    assert_eq!(status.disk_reserve_bytes, 1 << 60);
    assert!(status.disk_free_bytes > 0 && status.disk_free_bytes < status.disk_reserve_bytes, "{status:?}");

    let refused = client.session(Duration::from_secs(60)).await.expect_err("no new session below the reserve");
    let message = refused.to_string();
    assert!(matches!(refused, leasehold::Error::LimitReached(_)), "{message}");
    assert!(message.contains("below its reserve") && message.contains("--disk-reserve-bytes"), "{message}");
    held.release().await.expect("a release still goes through");

    let metrics = wait::until(LEADER_DEADLINE, "the leader's metrics", || scrape(&cluster, leader)).await;
    assert_eq!(metrics.get("leasehold_disk_low"), Some(&1.0), "{metrics:?}");
    assert_eq!(metrics.get("leasehold_disk_reserve_bytes"), Some(&((1u64 << 60) as f64)));

    let output = std::process::Command::new(leasehold_jepsen::cluster::binary("leasehold"))
        .arg("status")
        .env("LEASEHOLD_ENDPOINTS", cluster.endpoints().join(","))
        .envs(cluster.credentials.env())
        .output()
        .expect("run leasehold status");
    let printed = String::from_utf8_lossy(&output.stdout);
    assert!(printed.contains("below its reserve") && printed.contains("DISK_LOW"), "{printed}");
}

/// `--watch`: the grants of a tenant's watched name and of the names a watched prefix
/// matches are counted under the watch as written, with the time of the latest, on
/// every node; another tenant's grant of a watched name is not counted (it must not
/// silence the alert), and an unwatched name adds no series.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watched_names_report_their_grants_and_the_time_of_the_latest() {
    let options = ClusterOptions {
        extra_arguments: ["--watch", "test:weekly-report", "--watch", "test:cron/*"].map(String::from).to_vec(),
        ..ClusterOptions::default()
    };
    let cluster = TestCluster::start(options);
    cluster.wait_for_leader(LEADER_DEADLINE).await;
    let client = cluster.client();
    let session = client.session(Duration::from_secs(30)).await.unwrap();
    let before_s = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
    for name in ["weekly-report", "weekly-report", "cron/cleanup", "cron/backup", "unwatched"] {
        let guard = session.try_lock(name).await.unwrap().expect("a free lock");
        guard.release().await.unwrap();
    }
    let after_s = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
    // The admin's namespace takes the watched names too: not the test tenant's job.
    let other = cluster.admin_client().session(Duration::from_secs(30)).await.unwrap();
    for name in ["weekly-report", "cron/cleanup"] {
        other.try_lock(name).await.unwrap().expect("a free lock").release().await.unwrap();
    }
    // Every node applied them all before it is read.
    let leader = cluster.wait_for_leader(LEADER_DEADLINE).await;
    let commit = cluster.status(leader).await.expect("the leader's status").commit_index;
    for id in cluster.nodes.keys() {
        cluster.wait_applied(*id, commit, LEADER_DEADLINE).await;
    }

    let grants = "leasehold_watched_grants_total";
    let last = "leasehold_watched_last_grant_timestamp_seconds";
    for id in cluster.nodes.keys() {
        let page = wait::until(Duration::from_secs(10), "the node to apply the grants", || {
            let cluster = &cluster;
            async move {
                let page = scrape(cluster, *id).await?;
                (page.get(&format!("{grants}{{watch=\"test:cron/*\"}}")) == Some(&2.0)).then_some(page)
            }
        })
        .await;
        assert_eq!(page.get(&format!("{grants}{{watch=\"test:weekly-report\"}}")), Some(&2.0), "node {id}");
        for watch in ["test:weekly-report", "test:cron/*"] {
            let at = page[&format!("{last}{{watch=\"{watch}\"}}")];
            assert!(before_s - 1.0 <= at && at <= after_s + 1.0, "node {id}: {watch} last granted at {at}");
        }
        assert!(!page.keys().any(|key| key.contains("unwatched")), "node {id}: an unwatched name has a series");
    }
}

/// A tenant with more commands in flight than the leader queues for one tenant
/// (`--tenant-queue-max`) is refused with OVERLOADED and a retry-after, before any
/// work; another tenant's command goes in at once meanwhile; and the client library,
/// honouring the retry-after, gets every command of the burst through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_past_its_queue_is_told_when_to_retry_and_others_go_on() {
    const BURST: u64 = 64;
    let options =
        ClusterOptions { extra_arguments: vec!["--tenant-queue-max".into(), "1".into()], ..Default::default() };
    let cluster = TestCluster::start(options);
    let leader = cluster.wait_for_leader(LEADER_DEADLINE).await;
    let (raw, created) = raw_session(&cluster, &cluster.nodes[&leader].client_addr, "burst").await;
    let other_tenant = cluster.admin_client().session(Duration::from_secs(60)).await.expect("the admin's session");

    let (answers, other) = tokio::join!(acquire_burst(&raw, &created, "burst", BURST), async {
        other_tenant.try_lock("other/lock").await
    });
    let other = other.expect("another tenant's lock is not held back");
    assert!(other.is_some(), "the other tenant's free lock is granted");
    let mut overloaded = 0;
    for answer in &answers {
        match answer {
            Ok(granted) => {
                assert!(matches!(granted.get_ref().outcome, Some(Outcome::Granted(_))), "{granted:?}")
            }
            Err(status) => {
                expect_retry_after(status, ErrorReason::Overloaded);
                overloaded += 1;
            }
        }
    }
    assert!(overloaded > 0, "{BURST} commands at once past a queue of 1: none was refused");
    let page = scrape(&cluster, leader).await.expect("the leader's metrics");
    assert!(page["leasehold_commands_refused_overloaded_total"] >= overloaded as f64, "{page:?}");

    // The library waits the retry-after and tries again: the whole burst gets through.
    library_burst_gets_through(&cluster, BURST).await;
}

/// A tenant past its rate quota is refused with RATE_LIMITED and a retry-after, before
/// any work; the client library waits it out and gets every command of a burst
/// through; the weight and the quota show in the tenant's info, and a quota of 0
/// takes it away again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_past_its_rate_quota_is_told_when_to_retry() {
    const RATE: u32 = 20;
    let options = ClusterOptions { extra_arguments: vec!["--metrics-per-tenant".into()], ..Default::default() };
    let cluster = TestCluster::start(options);
    let leader = cluster.wait_for_leader(LEADER_DEADLINE).await;
    let admin = cluster.admin_client();
    let limited = pb::Quotas { weight: 3, max_ops_per_second: Some(RATE), ..Default::default() };
    let info = admin.set_tenant_quotas(TEST_TENANT, limited).await.expect("set a rate quota");
    let quotas = info.quotas.expect("quotas in the answer");
    assert_eq!((quotas.weight, quotas.max_ops_per_second), (3, Some(RATE)));
    assert_eq!(quotas.max_sessions, 1_000_000, "the other quotas are left as they were");

    // The session is made within the quota.
    let (raw, created) = raw_session(&cluster, &cluster.nodes[&leader].client_addr, "rate").await;
    // Three seconds' worth at once: about one second's worth goes through.
    let mut limited = 0;
    for answer in acquire_burst(&raw, &created, "rate", u64::from(3 * RATE)).await {
        let Err(status) = answer else { continue };
        expect_retry_after(&status, ErrorReason::RateLimited);
        limited += 1;
    }
    // However slowly this machine sends them, they do not take 2 s.
    assert!(limited >= RATE / 2, "{} commands at once against {RATE} a second: {limited} refused", 3 * RATE);
    let page = scrape(&cluster, leader).await.expect("the leader's metrics");
    assert!(page["leasehold_commands_refused_rate_limited_total"] >= f64::from(limited), "{page:?}");
    let per_tenant = r#"leasehold_tenant_commands_refused_total{tenant="test",reason="rate_limited"}"#;
    assert!(page[per_tenant] >= f64::from(limited), "{page:?}");
    let admitted = page[r#"leasehold_tenant_commands_admitted_total{tenant="test"}"#];
    assert!(admitted >= 1.0, "{page:?}");
    // Every admitted command was answered before the scrape: each has its commit wait
    // in the tenant's histogram, and none waited past its last bound.
    let waits = r#"leasehold_tenant_commit_wait_seconds_count{tenant="test"}"#;
    assert_eq!(page[waits], admitted, "{page:?}");
    assert_eq!(page[r#"leasehold_tenant_commit_wait_seconds_bucket{tenant="test",le="+Inf"}"#], admitted);
    assert_eq!(page[r#"leasehold_tenant_commit_wait_seconds_bucket{tenant="test",le="10"}"#], admitted);
    assert!(page[r#"leasehold_tenant_commit_wait_seconds_sum{tenant="test"}"#] > 0.0, "{page:?}");

    // The library waits the retry-after and tries again: a burst of two seconds' worth
    // gets through.
    library_burst_gets_through(&cluster, u64::from(2 * RATE)).await;

    let unlimited = pb::Quotas { max_ops_per_second: Some(0), ..Default::default() };
    let info = admin.set_tenant_quotas(TEST_TENANT, unlimited).await.expect("take the quota away");
    let quotas = info.quotas.expect("quotas in the answer");
    assert_eq!((quotas.weight, quotas.max_ops_per_second), (3, Some(0)), "the weight is left as it was");
}

/// Whether the node closed `stream` (end of stream or a reset), within `within`.
async fn closed_by_the_node(stream: &mut tokio::net::TcpStream, within: Duration) -> bool {
    use tokio::io::AsyncReadExt;
    let mut byte = [0u8; 1];
    matches!(tokio::time::timeout(within, stream.read(&mut byte)).await, Ok(Ok(0)) | Ok(Err(_)))
}

/// The metrics port keeps no connection that sends nothing: one address gets at most
/// 8 connections (the rest are closed at once), an idle one is closed after the
/// first-bytes timeout, and scrapes from another address are answered throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_to_the_metrics_port_are_closed_and_scrapes_go_on() {
    const IDLE: usize = 100;
    let cluster = TestCluster::start(ClusterOptions::default());
    let leader = cluster.wait_for_leader(LEADER_DEADLINE).await;
    let address = cluster.nodes[&leader].metrics_addr.clone().expect("a metrics address");
    let target: std::net::SocketAddr = address.parse().expect("a socket address");
    let mut idle = Vec::new();
    for _ in 0..IDLE {
        let socket = tokio::net::TcpSocket::new_v4().expect("a socket");
        socket.bind("127.0.0.2:0".parse().unwrap()).expect("bind the idle address");
        idle.push(socket.connect(target).await.expect("connect"));
    }
    assert!(scrape(&cluster, leader).await.is_some(), "a scrape from another address beside {IDLE} idle connections");
    let mut closed_at_once = 0;
    for stream in &mut idle {
        if closed_by_the_node(stream, Duration::from_millis(200)).await {
            closed_at_once += 1;
        }
    }
    assert!(closed_at_once >= IDLE - 8, "only {closed_at_once} of {IDLE} closed at once: 8 may stay");
    let started = Instant::now();
    for stream in &mut idle {
        assert!(closed_by_the_node(stream, Duration::from_secs(10)).await, "an idle connection stayed open");
    }
    assert!(started.elapsed() < Duration::from_secs(10), "closed after the 2 s first-bytes timeout");
    assert!(scrape(&cluster, leader).await.is_some(), "scrapes go on");
}

/// The metrics are served the way Prometheus scrapes a protected target: over HTTPS
/// with the node's certificate, to a scraper that sends the scrape token (or the
/// admin's); plain HTTP, no token, a tenant's token or a token the file no longer
/// holds after SIGHUP get nothing. By default the page names no tenant and no
/// semaphore; `--metrics-per-tenant` (here on node 1 only) adds those series.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_served_over_https_to_the_scrape_token_only_and_name_no_tenant_unless_asked() {
    use leasehold_jepsen::https;
    let mut cluster = TestCluster::start(ClusterOptions::default());
    cluster.wait_for_leader(LEADER_DEADLINE).await;
    cluster.restart_with(1, &["--metrics-per-tenant"]);
    let leader = cluster.wait_for_leader(LEADER_DEADLINE).await;
    let client = cluster.client();
    let session = client.session(Duration::from_secs(30)).await.unwrap();
    let permit = session.semaphore("secret-project/jobs", 2).try_acquire().await.unwrap().expect("a free permit");
    let commit = cluster.status(leader).await.expect("the leader's status").commit_index;
    cluster.wait_applied(2, commit, LEADER_DEADLINE).await;
    cluster.wait_applied(1, commit, LEADER_DEADLINE).await;

    let address = cluster.nodes[&2].metrics_addr.clone().expect("a metrics address");
    let ca = cluster.credentials.ca_file.clone();
    let read = |file: &std::path::Path| std::fs::read_to_string(file).unwrap().trim().to_string();
    let (scrape_token, admin_token, tenant_token) = (
        read(&cluster.credentials.scrape_token_file),
        read(&cluster.credentials.admin_token_file),
        read(&cluster.credentials.token_file),
    );
    let get = |token: Option<String>| {
        let (address, ca) = (address.clone(), ca.clone());
        async move { https::get(&address, Some(&ca), token.as_deref(), "/metrics").await.expect("an answer") }
    };
    let plain = https::get(&address, None, Some(&scrape_token), "/metrics").await;
    assert!(plain.is_err(), "plain HTTP got an answer from a TLS node: {plain:?}");
    for (what, token) in [("no token", None), ("a tenant's token", Some(tenant_token.clone()))] {
        let answer = get(token).await;
        assert_eq!(answer.status, 401, "{what}: {answer:?}");
        assert!(!answer.body.contains("leasehold_"), "{what} read metrics: {}", answer.body);
    }
    let page = get(Some(scrape_token.clone())).await;
    assert_eq!(page.status, 200, "{page:?}");
    assert!(page.body.contains("leasehold_semaphores 1"), "the cluster-wide count is there: {}", page.body);
    for named in ["tenant=", "semaphore=", "secret-project", "\"test\""] {
        assert!(!page.body.contains(named), "the default page shows {named}: {}", page.body);
    }
    assert_eq!(get(Some(admin_token)).await.status, 200, "the admin token scrapes too");

    let per_tenant = scrape(&cluster, 1).await.expect("node 1's metrics");
    let holders = r#"leasehold_semaphore_holders{tenant="test",semaphore="secret-project/jobs"}"#;
    assert_eq!(per_tenant.get(holders), Some(&1.0), "--metrics-per-tenant names them: {per_tenant:?}");

    // A new scrape token: the old one works until SIGHUP, then only the new one.
    let new_token = leasehold::certs::new_token("scrape");
    leasehold::certs::write_file(&cluster.credentials.scrape_token_file, &new_token, true).unwrap();
    assert_eq!(get(Some(scrape_token.clone())).await.status, 200, "read again only on SIGHUP");
    let pid = cluster.pid(2).expect("node 2 runs");
    // SAFETY: signalling a server process this test started, by its id.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGHUP) }, 0);
    wait::until(Duration::from_secs(10), "node 2 to read the new scrape token", || async {
        (get(Some(scrape_token.clone())).await.status == 401).then_some(())
    })
    .await;
    assert_eq!(get(Some(new_token)).await.status, 200, "the new token scrapes");
    drop(permit);
}
