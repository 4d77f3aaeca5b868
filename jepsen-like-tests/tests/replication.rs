//! The replicated core with real server processes: acknowledged entries survive
//! crashes, lagging nodes catch up by snapshot, a 5-node cluster tolerates two
//! failures, and membership changes while traffic flows.

use std::fs::File;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::Duration;

use leasehold::certs;
use leasehold_jepsen::cluster::{binary, free_ports, ClusterOptions, TestCluster};
use leasehold_jepsen::grants::{assert_held, take_locks};
use leasehold_jepsen::wait;

const LEADER_DEADLINE: Duration = Duration::from_secs(20);
const SESSION_TTL: Duration = Duration::from_secs(60);
/// A node stops within this after SIGTERM (it waits for raft to shut down).
const STOP_DEADLINE: Duration = Duration::from_secs(10);

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

/// Who the stray nodes of `strays_refused` are.
struct Strays {
    /// Their cluster name; None: this cluster's own.
    cluster_name: Option<&'static str>,
    /// Whether their certificates come from this cluster's CA (else from a CA of
    /// their own, as another cluster's would).
    same_ca: bool,
    /// The node id their certificates name, whatever id they run as (None: their own).
    certificate_id: Option<u64>,
    /// Whose log shows the refusal: the follower's (it refused the handshake or the
    /// message) or the strays' (the refusal came back to them as the answer).
    refusal_logged_by_follower: bool,
}

/// Two stray nodes whose member list names a follower of this cluster as their third
/// member (a copied config, a reused address, a forged certificate) elect a leader of
/// their own, and it campaigns at and replicates to that follower. Every Raft message
/// must be refused — the text `refusal` shows up in the strays' or the follower's log —
/// and the cluster keeps its leader, term and grants.
async fn strays_refused(strays: Strays, refusal: &str) {
    let cluster = TestCluster::start(ClusterOptions::default());
    let leader = cluster.wait_for_leader(LEADER_DEADLINE).await;
    let client = cluster.client();
    let session = client.session(SESSION_TTL).await.expect("session");
    let grants = take_locks(&session, "before-stray", 5).await;
    let before = cluster.status(leader).await.expect("the leader answers");
    let follower = cluster.nodes.values().find(|node| node.id != leader).expect("a follower");

    let certificates = if strays.same_ca {
        cluster.credentials.directory.clone()
    } else {
        let directory = cluster.root().join("stray-ca");
        std::fs::create_dir_all(&directory).unwrap();
        certs::write_pair(&directory, "ca", &certs::new_ca().unwrap()).unwrap();
        directory
    };
    let ca_key = std::fs::read_to_string(certificates.join("ca.key")).unwrap();
    let addresses: Vec<(String, String)> = (0..2)
        .map(|_| {
            let [client_port, peer_port] = free_ports();
            (format!("127.0.0.1:{client_port}"), format!("127.0.0.1:{peer_port}"))
        })
        .collect();
    // The strays take the two ids the follower does not have, and list the follower
    // under its own id (its certificate names it: a peer dialled under another id is
    // refused by the dialler's TLS check before anything is sent).
    let stray_ids: Vec<u64> = (1..=3).filter(|id| *id != follower.id).collect();
    let mut members: Vec<String> =
        addresses.iter().zip(&stray_ids).map(|((client, peer), id)| format!("{id}={client},{peer}")).collect();
    members.push(format!("{}={},{}", follower.id, follower.client_addr, follower.peer_addr));
    let logs: Vec<PathBuf> = (0..2).map(|index| cluster.root().join(format!("stray{index}.log"))).collect();
    let _strays: Vec<KillOnDrop> = (0..2)
        .map(|index| {
            let id = stray_ids[index];
            let (client_addr, peer_addr) = &addresses[index];
            let log = &logs[index];
            let named = strays.certificate_id.unwrap_or(id);
            let pem = certs::node_certificate(&ca_key, named, &["127.0.0.1".to_string()]).unwrap();
            let (cert, key) = certs::write_pair(cluster.root(), &format!("stray-{id}"), &pem).unwrap();
            let mut command = Command::new(binary("leasehold-server"));
            command
                .args(["--node-id", &id.to_string()])
                .args(["--cluster-name", strays.cluster_name.unwrap_or(&cluster.cluster_name)])
                .args(["--client-addr", client_addr, "--peer-addr", peer_addr])
                .arg("--data-dir")
                .arg(cluster.root().join(format!("stray{index}")));
            for (flag, path) in
                [("--tls-cert", &cert), ("--tls-key", &key), ("--peer-cert", &cert), ("--peer-key", &key)]
            {
                command.arg(flag).arg(path);
            }
            command.arg("--peer-ca").arg(certificates.join("ca.pem"));
            command.arg("--admin-token-file").arg(&cluster.credentials.admin_token_file);
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

    let follower_log = follower.log.clone();
    // Only what the follower logs from now on counts.
    let follower_log_start = std::fs::read_to_string(&follower_log).unwrap_or_default().len();
    let logged_by = if strays.refusal_logged_by_follower { "the follower's" } else { "the strays'" };
    wait::until(
        LEADER_DEADLINE,
        &format!("the strays' messages to be refused ({refusal:?} in {logged_by} log)"),
        || {
            let (logs, follower_log) = (&logs, &follower_log);
            async move {
                let strays_text: String =
                    logs.iter().map(|log| std::fs::read_to_string(log).unwrap_or_default()).collect();
                let text = if strays.refusal_logged_by_follower {
                    let text = std::fs::read_to_string(follower_log).unwrap_or_default();
                    text.get(follower_log_start..).unwrap_or_default().to_string()
                } else {
                    strays_text.clone()
                };
                // The strays bootstrap and campaign whether or not they win (their third
                // member refuses them): wait until one has, and its messages were refused.
                (strays_text.contains("bootstrapping") && text.matches(refusal).count() >= 2).then_some(())
            }
        },
    )
    .await;
    let after = cluster.status(leader).await.expect("the leader answers");
    assert_eq!((after.state.as_str(), after.term), ("leader", before.term), "the stray nodes disturbed the cluster");
    let follower_status = cluster.status(follower.id).await.expect("the follower answers");
    assert_eq!(follower_status.term, before.term, "the follower moved to the stray nodes' term");
    assert!(follower_status.applied_index >= before.applied_index, "the follower lost entries");
    assert_held(&client, session.id(), &grants).await;
}

/// Another cluster's nodes, with their own CA: refused at the TLS handshake.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_with_another_ca_are_refused_and_change_nothing() {
    let strays =
        Strays { cluster_name: Some("stray"), same_ca: false, certificate_id: None, refusal_logged_by_follower: true };
    strays_refused(strays, "refused a TLS handshake").await;
}

/// Another cluster's nodes with certificates from the same CA (one CA shared by two
/// clusters): refused by the cluster name every Raft message carries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_of_another_cluster_are_refused_and_change_nothing() {
    let strays =
        Strays { cluster_name: Some("stray"), same_ca: true, certificate_id: None, refusal_logged_by_follower: false };
    strays_refused(strays, "belongs to cluster").await;
}

/// Nodes with a certificate from the right CA that names another node id than the
/// one they claim in their messages (node 9's certificate, running as nodes 1 and 2
/// of this very cluster): refused, naming the id the certificate presents.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_whose_certificate_names_another_node_is_refused() {
    let strays =
        Strays { cluster_name: None, same_ca: true, certificate_id: Some(9), refusal_logged_by_follower: true };
    strays_refused(strays, "names node 9").await;
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
    let admin = cluster.admin_client();
    let members = admin.add_member(4, &client_addr, &peer_addr, false).await.expect("add member 4");
    assert!(members.iter().any(|member| member.node_id == 4 && member.role == "voter"), "{members:?}");

    let leader = cluster.wait_for_leader(LEADER_DEADLINE).await;
    let removed = (1..=3).find(|id| *id != leader).unwrap();
    let members = admin.remove_member(removed).await.expect("remove a member");
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

/// How long `member add` waits for a learner that acknowledges nothing more
/// (`CATCH_UP_STALL_MS`), with room for the probe and the answer.
const CATCH_UP_REFUSED_WITHIN: Duration = Duration::from_secs(20);

fn unused_addresses() -> (String, String) {
    let [client_port, peer_port] = free_ports();
    (format!("127.0.0.1:{client_port}"), format!("127.0.0.1:{peer_port}"))
}

/// Adding a node that nobody runs used to answer OK at once and make it a voter: a
/// 3-node cluster then needed 3 of 4 votes and stalled on the next crash. It is
/// refused, naming what the node lacked, and stays a learner that counts for no quorum.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adding_a_node_nobody_runs_is_refused_and_costs_no_quorum() {
    let mut cluster = TestCluster::start(ClusterOptions::default());
    let leader = cluster.wait_for_leader(LEADER_DEADLINE).await;
    let admin = cluster.admin_client();
    let (client_addr, peer_addr) = unused_addresses();
    let added = tokio::time::timeout(CATCH_UP_REFUSED_WITHIN, admin.add_member(4, &client_addr, &peer_addr, false))
        .await
        .expect("answered within the stall deadline");
    let error = added.expect_err("a node nobody runs is not promoted").to_string();
    assert!(error.contains("node 4 did not catch up") && error.contains("never acknowledged"), "{error}");
    let members = admin.status_any().await.expect("status").members;
    assert!(members.iter().any(|member| member.node_id == 4 && member.role == "learner"), "{members:?}");

    // A voter dies: the three voters still have a majority.
    let follower = (1..=3).find(|id| *id != leader).unwrap();
    cluster.kill(follower);
    let session = cluster.client().session(SESSION_TTL).await.expect("a session with one voter down");
    take_locks(&session, "unrun", 2).await;
    let members = admin.remove_member(4).await.expect("the learner is removed");
    assert!(!members.iter().any(|member| member.node_id == 4), "{members:?}");
}

/// A node that stops answering while it is being added is refused; once it runs
/// again the same command promotes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_node_is_promoted_only_once_it_answers() {
    let mut cluster = TestCluster::start(ClusterOptions::default());
    cluster.wait_for_leader(LEADER_DEADLINE).await;
    let node = cluster.start_joining_node(4);
    let (client_addr, peer_addr) = (node.client_addr.clone(), node.peer_addr.clone());
    wait::until(LEADER_DEADLINE, "node 4 to answer", || cluster.status(4)).await;
    cluster.pause(4);
    let admin = cluster.admin_client();
    let refused = admin.add_member(4, &client_addr, &peer_addr, false).await;
    assert!(refused.is_err(), "a paused node is not promoted: {refused:?}");
    cluster.resume(4);
    let members = admin.add_member(4, &client_addr, &peer_addr, false).await.expect("promoted once it answers");
    assert!(members.iter().any(|member| member.node_id == 4 && member.role == "voter"), "{members:?}");
}

/// The leader dies between adding the learner and promoting it: the command fails,
/// the node is a learner in the new leader's membership, and the same command
/// finishes the job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_killed_between_the_two_steps_leaves_a_learner_the_command_can_promote() {
    let mut cluster = TestCluster::start(ClusterOptions::default());
    let leader = cluster.wait_for_leader(LEADER_DEADLINE).await;
    let node = cluster.start_joining_node(4);
    let (client_addr, peer_addr) = (node.client_addr.clone(), node.peer_addr.clone());
    wait::until(LEADER_DEADLINE, "node 4 to answer", || cluster.status(4)).await;
    // Paused, node 4 keeps the leader waiting between the two steps.
    cluster.pause(4);
    let admin = cluster.admin_client_of(leader);
    let mut adding = {
        let (admin, client_addr, peer_addr) = (admin.clone(), client_addr.clone(), peer_addr.clone());
        tokio::spawn(async move { admin.add_member(4, &client_addr, &peer_addr, false).await })
    };
    wait::until(LEADER_DEADLINE, "node 4 to be a learner", || async {
        let status = cluster.status(leader).await?;
        status.members.iter().any(|member| member.node_id == 4 && member.role == "learner").then_some(())
    })
    .await;
    cluster.kill(leader);
    // The client knows only the dead leader's address: it retries it until its own
    // deadline. What matters is that the add did not succeed.
    let ended = tokio::time::timeout(Duration::from_secs(5), &mut adding).await;
    assert!(!matches!(ended, Ok(Ok(Ok(_)))), "the add ended with its leader: {ended:?}");
    adding.abort();
    cluster.resume(4);
    cluster.wait_for_leader(LEADER_DEADLINE).await;
    let admin = cluster.admin_client();
    let members = admin.add_member(4, &client_addr, &peer_addr, false).await.expect("promoted by the same command");
    assert!(members.iter().any(|member| member.node_id == 4 && member.role == "voter"), "{members:?}");
    // Four voters, one of them down (the old leader): three answer, a quorum.
    let session = cluster.client().session(SESSION_TTL).await.expect("session");
    take_locks(&session, "between", 2).await;
}

/// Removing a voter that answers while another is down would leave one reachable
/// voter of two: refused, naming the silent one. Removing the dead one is fine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removal_that_leaves_no_reachable_quorum_is_refused() {
    let mut cluster = TestCluster::start(ClusterOptions::default());
    let leader = cluster.wait_for_leader(LEADER_DEADLINE).await;
    let followers: Vec<u64> = (1..=3).filter(|id| *id != leader).collect();
    let (alive, dead) = (followers[0], followers[1]);
    cluster.kill(dead);
    let admin = cluster.admin_client();
    let error = admin.remove_member(alive).await.expect_err("refused").to_string();
    assert!(error.contains("fewer than a quorum") && error.contains(&format!("[{dead}] did not")), "{error}");
    let members = admin.status_any().await.expect("status").members;
    assert_eq!(members.iter().filter(|member| member.role == "voter").count(), 3, "nothing changed: {members:?}");
    let members = admin.remove_member(dead).await.expect("the dead voter is removed");
    assert_eq!(members.len(), 2, "{members:?}");
    let session = cluster.client().session(SESSION_TTL).await.expect("session");
    take_locks(&session, "after-removal", 2).await;
}
