//! The lease guarantees across leader changes, on 3-node clusters of real processes:
//! a dead holder's lock reaches the next waiter within the published bound even when
//! the leader dies, or every node restarts, while the lease runs out, and a new
//! leader never calls a session alive whose expiry its predecessor committed.

use std::process::Child;
use std::time::{Duration, Instant};

use futures::channel::mpsc;
use futures::SinkExt;
use leasehold::proto::lease::{extension_bound_ms, KEEPALIVES_PER_TTL};
use leasehold::proto::leasehold_client::LeaseholdClient;
use leasehold::proto::{self as pb};
use leasehold_jepsen::cluster::{ClusterOptions, TestCluster};
use leasehold_jepsen::lock_holder::{kill_holder, start_lock_holder};
use tonic::Code;

const LEADER_DEADLINE: Duration = Duration::from_secs(20);
/// The TTL of the measurement: a holder killed, the leader killed 5 s later.
const TTL: Duration = Duration::from_secs(8);
const LEADER_KILL_AFTER: Duration = Duration::from_secs(5);
/// One election with the default timings: four election timeouts of at most 300 ms
/// (the README's bound: openraft's leader lease, the follower's own timeout, and
/// the delay of a follower that saw a longer log).
const ELECTION_MS: u64 = 1_200;
/// The expiry's commit, the waiter's grant and its answer reaching the test.
const HANDOVER_MS: u64 = 500;

/// `leasehold lock NAME --ttl 8s` running `sleep` as the holder, as a process of its
/// own; returns it once its command runs (the lock is held).
async fn start_holder(cluster: &TestCluster, name: &str, marker: &std::path::Path) -> Child {
    let arguments = [name.to_string(), "--ttl".into(), format!("{}s", TTL.as_secs())];
    start_lock_holder(cluster, &arguments, marker, "exec sleep 600").await
}

/// What the cluster suffers 5 s after the holder's death.
#[derive(Clone, Copy)]
enum Then {
    /// The Raft leader is killed; it is restarted once the waiter has the lock.
    KillLeader,
    /// Every node is killed and restarted on its data directory at once.
    RestartAll,
}

/// A holder of `name` is killed with SIGKILL while another session waits, and 5 s
/// later the cluster loses its leader (`then`). Returns how long after the holder's
/// death the waiter got the lock.
async fn dead_holder_then(then: Then, extra_arguments: &[&str]) -> Duration {
    let mut cluster = TestCluster::start(ClusterOptions {
        extra_arguments: extra_arguments.iter().map(|argument| argument.to_string()).collect(),
        ..ClusterOptions::default()
    });
    cluster.wait_for_leader(LEADER_DEADLINE).await;
    let name = "reports/weekly";
    let marker = tempfile::NamedTempFile::new().unwrap();
    let mut holder = start_holder(&cluster, name, marker.path()).await;

    let client = cluster.client();
    let session = client.session(TTL).await.expect("the waiter's session");
    let waiter = tokio::spawn(async move {
        let guard = session.lock(name).await.expect("the waiter gets the lock");
        (Instant::now(), guard.token(), session)
    });
    leasehold_jepsen::wait::until(Duration::from_secs(10), "the waiter to queue", || {
        let client = client.clone();
        async move { client.describe_lock(name, false).await.ok().filter(|lock| !lock.waiters.is_empty()) }
    })
    .await;

    let died = kill_holder(&mut holder, marker.path());
    // The fault schedule: the leader dies while the holder's lease runs out.
    tokio::time::sleep(LEADER_KILL_AFTER).await;
    let leader = cluster.wait_for_leader(LEADER_DEADLINE).await;
    let nodes: Vec<u64> = cluster.nodes.keys().copied().collect();
    match then {
        Then::KillLeader => cluster.kill(leader),
        Then::RestartAll => {
            for node in &nodes {
                cluster.kill(*node);
            }
            for node in &nodes {
                cluster.restart(*node);
            }
        }
    }

    let (granted, token, _session) = tokio::time::timeout(Duration::from_secs(60), waiter)
        .await
        .expect("the waiter is granted the lock within 60 s")
        .expect("the waiter's task");
    assert!(token > 0);
    if let Then::KillLeader = then {
        cluster.restart(leader);
    }
    granted - died
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_holders_lock_reaches_the_waiter_within_the_bound_across_a_leader_kill() {
    let waited = dead_holder_then(Then::KillLeader, &[]).await;
    eprintln!("the waiter got the lock {} ms after the holder died", waited.as_millis());
    assert_within_the_bound(waited);
}

/// The holder's last keepalive was answered at most one keepalive interval before it
/// died, and the lease runs a TTL from there: never sooner; and no later than the
/// published bound.
fn assert_within_the_bound(waited: Duration) {
    let ttl_ms = TTL.as_millis() as u64;
    let bound = Duration::from_millis(ttl_ms + extension_bound_ms(ttl_ms, ELECTION_MS) + HANDOVER_MS);
    let earliest = TTL - TTL / KEEPALIVES_PER_TTL;
    assert!(
        earliest <= waited && waited <= bound,
        "the waiter got the lock {} ms after the holder died; the bound is {} ms (no sooner than {} ms)",
        waited.as_millis(),
        bound.as_millis(),
        earliest.as_millis()
    );
}

/// Every node restarted from its disk 5 s after the holder died: each applies the
/// holder's checkpoint again, and starts it from what its first apply left, not from
/// the whole remaining time again (which would have made it 5 s + 6 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_holders_lock_reaches_the_waiter_within_the_bound_across_a_restart_of_every_node() {
    let waited = dead_holder_then(Then::RestartAll, &[]).await;
    eprintln!("after a restart of every node the waiter got the lock {} ms after the holder died", waited.as_millis());
    assert_within_the_bound(waited);
}

/// The control: without checkpoints the new leader starts the dead holder's lease
/// afresh, and the waiter waits a whole TTL after the leader change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_without_checkpoints_the_waiter_waits_a_ttl_after_the_leader_change() {
    let waited = dead_holder_then(Then::KillLeader, &["--test-full-ttl-restart"]).await;
    eprintln!("without checkpoints the waiter got the lock {} ms after the holder died", waited.as_millis());
    assert!(
        waited > LEADER_KILL_AFTER + TTL,
        "without checkpoints the waiter got the lock {} ms after the holder died",
        waited.as_millis()
    );
}

type Raw = LeaseholdClient<leasehold::client::Transport>;

/// A keepalive for `session` on `node`, if `node` accepts a keepalive stream (it is
/// the leader) and answers within a second: whether it called the session alive.
async fn keepalive_on(cluster: &TestCluster, node: u64, session: u64, secret: &[u8]) -> Option<bool> {
    let channel = cluster.client().raw_channel(&cluster.nodes[&node].client_addr).ok()?;
    let mut raw: Raw = LeaseholdClient::new(channel);
    let (mut requests, outgoing) = mpsc::unbounded();
    requests.send(pb::KeepAliveRequest { session_id: session, session_secret: secret.to_vec() }).await.ok()?;
    let answer = tokio::time::timeout(Duration::from_secs(1), async move {
        let mut answers = raw.keep_alive(outgoing).await.ok()?.into_inner();
        answers.message().await.ok().flatten()
    })
    .await
    .ok()
    .flatten()?;
    assert_eq!(answer.session_id, session);
    Some(answer.alive)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_never_calls_alive_a_session_whose_expiry_its_predecessor_committed() {
    let mut cluster = TestCluster::start(ClusterOptions::default());
    let leader = cluster.wait_for_leader(LEADER_DEADLINE).await;
    let channel = cluster.client().raw_channel(&cluster.nodes[&leader].client_addr).expect("a channel");
    let mut raw: Raw = LeaseholdClient::new(channel);
    let created = raw
        .create_session(pb::CreateSessionRequest {
            request_id: Some(pb::RequestId { client_id: 4242, sequence: 1 }),
            ttl_ms: 1_000,
            client_name: "never-kept-alive".into(),
        })
        .await
        .expect("create session")
        .into_inner();
    let session = created.session_id;

    // No keepalive: the leader expires the session after its TTL. The moment its own
    // state no longer has it, the expiry is committed; the leader dies then, before
    // it can tell every follower.
    leasehold_jepsen::wait::until(Duration::from_secs(10), "the leader to apply the expiry", || {
        let mut raw = raw.clone();
        async move {
            match raw.describe_session(pb::DescribeSessionRequest { session_id: session, stale: true }).await {
                Err(status) if status.code() == Code::NotFound => Some(()),
                _ => None,
            }
        }
    })
    .await;
    cluster.kill(leader);

    // Keepalives to the survivors until one leads and answers: it must not call the
    // session alive, however soon after its election it is asked.
    let survivors: Vec<u64> = cluster.nodes.keys().copied().filter(|id| *id != leader).collect();
    let alive = leasehold_jepsen::wait::until(Duration::from_secs(20), "a new leader to answer a keepalive", || {
        let cluster = &cluster;
        let survivors = survivors.clone();
        let secret = created.session_secret.clone();
        async move {
            for node in survivors {
                if let Some(alive) = keepalive_on(cluster, node, session, &secret).await {
                    return Some(alive);
                }
            }
            None
        }
    })
    .await;
    assert!(!alive, "a new leader called session {session} alive after its predecessor committed its expiry");
    cluster.restart(leader);
}
