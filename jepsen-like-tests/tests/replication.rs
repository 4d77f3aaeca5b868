//! The replicated core with real server processes: acknowledged entries survive
//! crashes, lagging nodes catch up by snapshot, a 5-node cluster tolerates two
//! failures, and membership changes while traffic flows.

use std::fs::File;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::Duration;

use leasehold::{Client, Session};
use leasehold_jepsen::cluster::{binary, free_ports, ClusterOptions, TestCluster};
use leasehold_jepsen::wait;

const LEADER_DEADLINE: Duration = Duration::from_secs(20);
const SESSION_TTL: Duration = Duration::from_secs(60);
/// A node stops within this after SIGTERM (it waits for raft to shut down).
const STOP_DEADLINE: Duration = Duration::from_secs(10);

/// Takes `count` locks on one long-lived session; returns (name, token) of each
/// acknowledged grant.
async fn take_locks(session: &Session, prefix: &str, count: usize) -> Vec<(String, u64)> {
    let mut grants = Vec::new();
    for i in 0..count {
        let name = format!("{prefix}/{i}");
        let guard = session.try_lock(&name).await.expect("acquire").expect("the lock is free");
        grants.push((name, guard.detach()));
    }
    grants
}

async fn assert_held(client: &Client, session_id: u64, grants: &[(String, u64)]) {
    for (name, token) in grants {
        let lock = client.describe_lock(name, false).await.expect("describe lock");
        let holder = lock.holder.unwrap_or_else(|| panic!("acknowledged grant of {name} was lost"));
        assert_eq!((holder.session_id, holder.token), (session_id, *token), "grant of {name} changed");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_grants_survive_kill_of_the_leader() {
    let mut cluster = TestCluster::start(ClusterOptions::default());
    let leader = cluster.wait_for_leader(LEADER_DEADLINE).await;
    let client = cluster.client();
    let session = client.session(SESSION_TTL).await.expect("session");
    let grants = take_locks(&session, "survive-leader", 20).await;

    cluster.kill(leader);
    let new_leader = cluster.wait_for_leader(LEADER_DEADLINE).await;
    assert_ne!(new_leader, leader);
    assert_held(&client, session.id(), &grants).await;

    // The killed node rejoins from its data directory and catches up.
    cluster.restart(leader);
    let commit = cluster.status(new_leader).await.expect("leader status").commit_index;
    cluster.wait_applied(leader, commit, LEADER_DEADLINE).await;
}

/// The leader dies while one follower lags behind (it was paused while grants were
/// made): that follower may campaign first, and the other refuses it for its
/// shorter log, then must win itself (`peer_service::Takeover` makes it campaign at
/// once). Only the follower with every entry can lead, and every grant is kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_killed_while_a_follower_lags_is_replaced_by_the_follower_with_every_entry() {
    let mut cluster = TestCluster::start(ClusterOptions::default());
    let leader = cluster.wait_for_leader(LEADER_DEADLINE).await;
    let followers: Vec<u64> = cluster.nodes.keys().copied().filter(|id| *id != leader).collect();
    let (lagging, complete) = (followers[0], followers[1]);
    let client = cluster.client();
    let session = client.session(SESSION_TTL).await.expect("session");

    cluster.pause(lagging);
    let grants = take_locks(&session, "lagging", 20).await;
    cluster.kill(leader);
    cluster.resume(lagging);

    let new_leader = cluster.wait_for_leader(LEADER_DEADLINE).await;
    assert_eq!(new_leader, complete, "only the follower with every entry can win");
    assert_held(&client, session.id(), &grants).await;
    let commit = cluster.status(complete).await.expect("leader status").commit_index;
    cluster.wait_applied(lagging, commit, LEADER_DEADLINE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_every_node_at_once_keeps_every_acknowledged_entry() {
    let mut cluster = TestCluster::start(ClusterOptions::default());
    cluster.wait_for_leader(LEADER_DEADLINE).await;
    let client = cluster.client();
    let session = client.session(SESSION_TTL).await.expect("session");
    let grants = take_locks(&session, "survive-all", 30).await;
    let highest_token = grants.iter().map(|(_, token)| *token).max().unwrap();

    for id in 1..=3 {
        cluster.kill(id);
    }
    for id in 1..=3 {
        cluster.restart(id);
    }
    cluster.wait_for_leader(LEADER_DEADLINE).await;
    assert_held(&client, session.id(), &grants).await;

    // Tokens are never reused after a full restart: a new grant is above every old one.
    let fresh = session.try_lock("survive-all/after-restart").await.expect("acquire").expect("free");
    assert!(
        fresh.token() > highest_token,
        "token {} reused after restart (highest before: {highest_token})",
        fresh.token()
    );
}

/// An operator stops every node with SIGTERM, one after the other, leader first:
/// each logs its shutdown and exits with status 0 (not killed by a signal such as an
/// abort on the way out), and the restarted cluster has every acknowledged grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_stopped_with_sigterm_exit_cleanly_and_keep_every_entry() {
    let mut cluster = TestCluster::start(ClusterOptions::default());
    let leader = cluster.wait_for_leader(LEADER_DEADLINE).await;
    let client = cluster.client();
    let session = client.session(SESSION_TTL).await.expect("session");
    let grants = take_locks(&session, "stopped", 20).await;

    let mut order = vec![leader];
    order.extend((1..=3).filter(|id| *id != leader));
    for id in order {
        let status = cluster.stop(id, STOP_DEADLINE).await;
        let log = cluster.log_tail(id);
        assert!(status.success(), "node {id} exited with {status} after SIGTERM; its log ends:\n{log}");
        assert!(log.contains("SIGTERM: shutting down"), "node {id} did not log its shutdown:\n{log}");
    }
    for id in 1..=3 {
        cluster.restart(id);
    }
    cluster.wait_for_leader(LEADER_DEADLINE).await;
    assert_held(&client, session.id(), &grants).await;
}

/// The lowest-id initial member bootstraps a new cluster and the others wait for it,
/// but not forever: with node 1 down at the first start, nodes 2 and 3 bootstrap the
/// cluster themselves and serve, and node 1, started later with an empty data
/// directory, joins the same cluster (it holds every entry and can take over).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_cluster_bootstraps_without_its_lowest_member_and_takes_it_in_later() {
    let mut cluster = TestCluster::start_only(ClusterOptions::default(), &[2, 3]);
    let leader = cluster.wait_for_leader(LEADER_DEADLINE).await;
    let client = cluster.client();
    let session = client.session(SESSION_TTL).await.expect("session");
    let grants = take_locks(&session, "bootstrap", 10).await;

    cluster.restart(1);
    let applied = cluster.status(leader).await.expect("the leader answers").applied_index;
    cluster.wait_applied(1, applied, LEADER_DEADLINE).await;
    cluster.kill(leader);
    let successor = cluster.wait_for_leader(LEADER_DEADLINE).await;
    assert_ne!(successor, leader);
    assert_held(&client, session.id(), &grants).await;
}

/// Two nodes of another cluster whose member list names a node of this one as their
/// third member (a copied config, a reused address) elect a leader of their own, and
/// it campaigns at and replicates to that node: every Raft message is refused, naming
/// both clusters, and this cluster keeps its leader, term and log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_of_another_cluster_are_refused_and_change_nothing() {
    let cluster = TestCluster::start(ClusterOptions::default());
    let leader = cluster.wait_for_leader(LEADER_DEADLINE).await;
    let client = cluster.client();
    let session = client.session(SESSION_TTL).await.expect("session");
    let grants = take_locks(&session, "before-stray", 5).await;
    let before = cluster.status(leader).await.expect("the leader answers");
    let follower = cluster.nodes.values().find(|node| node.id != leader).expect("a follower");

    let strays: Vec<(String, String)> = (0..2)
        .map(|_| {
            let [client_port, peer_port] = free_ports();
            (format!("127.0.0.1:{client_port}"), format!("127.0.0.1:{peer_port}"))
        })
        .collect();
    let mut members: Vec<String> =
        strays.iter().enumerate().map(|(index, (client, peer))| format!("{}={client},{peer}", index + 1)).collect();
    members.push(format!("3={},{}", follower.client_addr, follower.peer_addr));
    let logs: Vec<PathBuf> = (1..=2).map(|id| cluster.root().join(format!("stray{id}.log"))).collect();
    let _strays: Vec<KillOnDrop> = (1..=2)
        .map(|id| {
            let (client_addr, peer_addr) = &strays[id - 1];
            let log = &logs[id - 1];
            let mut command = Command::new(binary("leasehold-server"));
            command
                .args(["--node-id", &id.to_string(), "--cluster-name", "stray"])
                .args(["--client-addr", client_addr, "--peer-addr", peer_addr])
                .arg("--data-dir")
                .arg(cluster.root().join(format!("stray{id}")));
            for member in &members {
                command.args(["--initial-member", member]);
            }
            let child = command
                .env("RUST_LOG", "info,openraft=warn")
                .stdout(File::create(log).expect("create a stray node's log"))
                .stderr(File::options().append(true).open(log).expect("open a stray node's log"))
                .spawn()
                .expect("start a stray node");
            KillOnDrop(child)
        })
        .collect();

    wait::until(LEADER_DEADLINE, "the stray leader's messages to this cluster's node to be refused", || async {
        let text: String = logs.iter().map(|log| std::fs::read_to_string(log).unwrap_or_default()).collect();
        let stray_leads = text.contains("leading:");
        (stray_leads && text.matches("belongs to cluster").count() >= 3).then_some(())
    })
    .await;
    let after = cluster.status(leader).await.expect("the leader answers");
    assert_eq!((after.state.as_str(), after.term), ("leader", before.term), "the stray nodes disturbed the cluster");
    let follower_status = cluster.status(follower.id).await.expect("the follower answers");
    assert_eq!(follower_status.term, before.term, "the follower moved to the stray nodes' term");
    assert!(follower_status.applied_index >= before.applied_index, "the follower lost entries");
    assert_held(&client, session.id(), &grants).await;
}

/// Kills a process this test started when the test ends, however it ends.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_missed_compacted_entries_catches_up_by_snapshot() {
    let options = ClusterOptions { snapshot_every_entries: Some(50), ..Default::default() };
    let mut cluster = TestCluster::start(options);
    let leader = cluster.wait_for_leader(LEADER_DEADLINE).await;
    let lagging = (1..=3).find(|id| *id != leader).unwrap();
    cluster.kill(lagging);

    let client = cluster.client();
    let session = client.session(SESSION_TTL).await.expect("session");
    let grants = take_locks(&session, "snapshot", 200).await;
    let leader_status = wait::until(LEADER_DEADLINE, "the leader to compact its log", || async {
        let leader = cluster.leader().await?;
        cluster.status(leader).await.filter(|status| status.snapshot_index > 100)
    })
    .await;

    cluster.restart(lagging);
    let caught_up = cluster.wait_applied(lagging, leader_status.commit_index, LEADER_DEADLINE).await;
    assert!(caught_up.snapshot_index > 0, "the lagging node should have installed a snapshot: {caught_up:?}");
    assert_eq!(caught_up.sessions, 1);
    // The caught-up node can lead with the same state.
    cluster.kill(cluster.leader().await.unwrap());
    cluster.wait_for_leader(LEADER_DEADLINE).await;
    assert_held(&client, session.id(), &grants).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_nodes_keep_serving_with_two_killed() {
    let mut cluster = TestCluster::start(ClusterOptions { nodes: 5, ..Default::default() });
    let leader = cluster.wait_for_leader(LEADER_DEADLINE).await;
    let client = cluster.client();
    let session = client.session(SESSION_TTL).await.expect("session");
    let before = take_locks(&session, "five/before", 5).await;

    let victims: Vec<u64> = std::iter::once(leader).chain((1..=5).filter(|id| *id != leader).take(1)).collect();
    for id in &victims {
        cluster.kill(*id);
    }
    cluster.wait_for_leader(LEADER_DEADLINE).await;
    let after = take_locks(&session, "five/after", 5).await;
    assert_held(&client, session.id(), &before).await;
    assert_held(&client, session.id(), &after).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_are_added_and_removed_while_traffic_flows() {
    let mut cluster = TestCluster::start(ClusterOptions::default());
    cluster.wait_for_leader(LEADER_DEADLINE).await;
    let client = cluster.client();

    // Traffic: a worker cycling a lock the whole time.
    let traffic_client = client.clone();
    let traffic = tokio::spawn(async move {
        let session = traffic_client.session(SESSION_TTL).await.expect("traffic session");
        let mut tokens = Vec::new();
        let stop = tokio::time::Instant::now() + Duration::from_secs(8);
        while tokio::time::Instant::now() < stop {
            let guard = session
                .lock_with_timeout("traffic", Duration::from_secs(5))
                .await
                .expect("acquire during membership change");
            let guard = guard.expect("uncontended lock is granted");
            tokens.push(guard.token());
            guard.release().await.expect("release during membership change");
        }
        tokens
    });

    let new_node = cluster.start_joining_node(4);
    let (client_addr, peer_addr) = (new_node.client_addr.clone(), new_node.peer_addr.clone());
    let members = client.add_member(4, &client_addr, &peer_addr, false).await.expect("add member 4");
    assert!(members.iter().any(|member| member.node_id == 4 && member.role == "voter"), "{members:?}");

    let leader = cluster.wait_for_leader(LEADER_DEADLINE).await;
    let removed = (1..=3).find(|id| *id != leader).unwrap();
    let members = client.remove_member(removed).await.expect("remove a member");
    assert!(!members.iter().any(|member| member.node_id == removed), "{members:?}");
    wait::until(Duration::from_secs(10), "the removed node to stop serving", || {
        let running = cluster.is_running(removed);
        async move { (!running).then_some(()) }
    })
    .await;

    let tokens = traffic.await.expect("traffic task");
    assert!(tokens.len() > 5, "traffic made progress: {} cycles", tokens.len());
    assert!(tokens.windows(2).all(|pair| pair[0] < pair[1]), "tokens strictly increase: {tokens:?}");
    let status = cluster.status(4).await.expect("the new member answers");
    assert_eq!(status.members.len(), 3);
}
