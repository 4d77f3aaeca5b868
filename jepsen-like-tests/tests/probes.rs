//! The health probes on the metrics port, as a Kubernetes probe or a load balancer
//! reads them: `/livez` while the process serves, `/readyz` while the node can serve
//! (a member that knows a leader, has applied what it knows committed, and, leading,
//! hears a quorum), under a kill, a pause, and a node cut off from its quorum.

use std::time::Duration;

use leasehold_jepsen::cluster::{ClusterOptions, TestCluster};
use leasehold_jepsen::wait;

const DEADLINE: Duration = Duration::from_secs(20);
/// Longer than any answer of a node that runs, shorter than the probe's own deadline.
const PAUSED_SILENCE: Duration = Duration::from_secs(2);

/// Node `id`'s `/readyz` as (HTTP status, body), None when it does not answer.
async fn readyz(cluster: &TestCluster, id: u64, with_token: bool) -> Option<(u16, String)> {
    let answer = cluster.probe(id, "/readyz", with_token).await.ok()?;
    Some((answer.status, answer.body))
}

/// Waits until node `id`'s `/readyz` (with the scrape token) has `status`; its body.
async fn wait_readyz(cluster: &TestCluster, id: u64, status: u16, what: &str) -> String {
    wait::until(DEADLINE, what, || async {
        readyz(cluster, id, true).await.filter(|(answered, _)| *answered == status).map(|(_, body)| body)
    })
    .await
}

fn open_probes() -> ClusterOptions {
    ClusterOptions { extra_arguments: vec!["--probes-without-token".into()], ..ClusterOptions::default() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_with_a_leader_and_not_ready_without_one_under_kill_and_pause() {
    let mut cluster = TestCluster::start(open_probes());
    let leader = cluster.wait_for_leader(DEADLINE).await;
    for id in 1..=3 {
        let body = wait_readyz(&cluster, id, 200, "every node ready").await;
        assert!(body.starts_with(&format!("ok: node {id}, ")), "the scraper is told what the node is: {body}");
        let live = cluster.probe(id, "/livez", false).await.expect("livez");
        assert_eq!((live.status, live.body.as_str()), (200, "ok\n"), "without a token: ok and nothing else");
        assert_eq!(readyz(&cluster, id, false).await, Some((200, "ok\n".to_string())));
    }

    // A follower killed: it answers nothing; the other two keep a quorum and stay ready.
    let follower = (1..=3).find(|id| *id != leader).unwrap();
    let other = (1..=3).find(|id| *id != leader && *id != follower).unwrap();
    cluster.kill(follower);
    assert!(cluster.probe(follower, "/livez", false).await.is_err(), "a killed node answers no probe");
    // (A wait, not one look: a leader stalled on a busy machine for longer than two
    // election timeouts is rightly not ready for that moment.)
    for id in [leader, other] {
        wait_readyz(&cluster, id, 200, "the two that keep a quorum ready").await;
    }

    // Then the leader paused: it answers nothing, and the last follower, with no
    // quorum to elect anyone, soon knows no leader: not ready, but alive.
    cluster.pause(leader);
    let silent = tokio::time::timeout(PAUSED_SILENCE, cluster.probe(leader, "/readyz", true)).await;
    assert!(silent.is_err() || silent.unwrap().is_err(), "a paused node answers no probe");
    let body = wait_readyz(&cluster, other, 503, "the last follower not ready").await;
    assert!(body.starts_with("not ok: ") && body.contains("knows no leader"), "{body}");
    assert_eq!(readyz(&cluster, other, false).await, Some((503, "not ok\n".to_string())), "and no reason untold");
    assert_eq!(cluster.probe(other, "/livez", false).await.expect("livez").status, 200, "alive all the same");

    cluster.resume(leader);
    cluster.restart(follower);
    for id in 1..=3 {
        wait_readyz(&cluster, id, 200, "every node ready again").await;
    }
}

/// A leader cut off from every follower stays leader in its own eyes (openraft 0.9
/// does not step down), but it cannot commit: it is not ready once it has heard no
/// quorum for two maximal election timeouts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_without_its_quorum_is_not_ready() {
    let cluster = TestCluster::start(open_probes());
    let leader = cluster.wait_for_leader(DEADLINE).await;
    wait_readyz(&cluster, leader, 200, "the leader ready").await;
    for id in (1..=3).filter(|id| *id != leader) {
        cluster.pause(id);
    }
    let body = wait_readyz(&cluster, leader, 503, "the cut-off leader not ready").await;
    assert!(body.contains("has not heard a quorum"), "{body}");
    for id in (1..=3).filter(|id| *id != leader) {
        cluster.resume(id);
    }
    for id in 1..=3 {
        wait_readyz(&cluster, id, 200, "every node ready once the followers are back").await;
    }
}

/// Without --probes-without-token the probes are the metrics': no credential, 401.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_flag_a_probe_needs_the_scrape_token() {
    let cluster = TestCluster::start(ClusterOptions::default());
    let leader = cluster.wait_for_leader(DEADLINE).await;
    assert_eq!(readyz(&cluster, leader, false).await.map(|(status, _)| status), Some(401));
    assert_eq!(cluster.probe(leader, "/livez", false).await.expect("an answer").status, 401);
    wait_readyz(&cluster, leader, 200, "the leader ready, asked with the scrape token").await;
}
