//! The round trip each node measures to each member, where an operator reads it to set
//! the timings (README "Timings for real networks"): `leasehold_peer_rtt_seconds` on
//! the metrics port, the members of the admin Status answer and the status page, on
//! the leader (heartbeats) and on followers (probes), and across a rolling upgrade,
//! where the nodes of the older release answer the probe UNIMPLEMENTED; and the warning
//! a node logs when its timings are too short for the round trip it measures.

use std::collections::BTreeMap;
use std::time::Duration;

use leasehold_jepsen::cluster::{
    binary, free_ports, previous_release, previous_server, Addressing, ClusterOptions, TestCluster,
};
use leasehold_jepsen::slow_link::{Links, Slowness};
use leasehold_jepsen::{https, wait};
use serde_json::Value;

const DEADLINE: Duration = Duration::from_secs(20);

/// Node `id`'s `leasehold_peer_rtt_seconds` as peer to seconds; None while it does
/// not answer.
async fn round_trips(cluster: &TestCluster, id: u64) -> Option<BTreeMap<u64, f64>> {
    let answer = cluster.scrape(id).await.ok()?;
    assert_eq!(answer.status, 200, "metrics answered {answer:?}");
    let series = answer.body.lines().filter_map(|line| {
        let rest = line.strip_prefix("leasehold_peer_rtt_seconds{peer=\"")?;
        let (peer, value) = rest.split_once("\"} ")?;
        Some((peer.parse().expect("a node id"), value.parse().expect("seconds")))
    });
    Some(series.collect())
}

/// Waits until node `id` shows a round trip to each of the other nodes; returns them.
async fn wait_measured(cluster: &TestCluster, id: u64, what: &str) -> BTreeMap<u64, f64> {
    let others: Vec<u64> = cluster.nodes.keys().copied().filter(|other| *other != id).collect();
    wait::until(DEADLINE, what, || async {
        let measured = round_trips(cluster, id).await?;
        others.iter().all(|other| measured.contains_key(other)).then_some(measured)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_node_shows_a_round_trip_to_every_other() {
    let cluster = TestCluster::start(ClusterOptions::default());
    let leader = cluster.wait_for_leader(DEADLINE).await;
    for id in 1..=3 {
        let what = if id == leader { "the leader's heartbeats timed" } else { "a follower's probes answered" };
        let measured = wait_measured(&cluster, id, &format!("node {id}: {what}")).await;
        assert!(!measured.contains_key(&id), "node {id} measures no round trip to itself: {measured:?}");
        println!("node {id} ({}): {measured:?}", if id == leader { "leader" } else { "follower" });
        for (peer, seconds) in &measured {
            // On one machine a round trip is well under a millisecond; a second would
            // be a unit gone wrong.
            assert!(*seconds > 0.0 && *seconds < 1.0, "node {id} to node {peer}: {seconds} s");
        }
    }

    // The admin Status answer carries the same, per member, and none for the node
    // that answers.
    let status = wait::until(DEADLINE, "the leader's Status to list round trips", || async {
        let status = cluster.status(leader).await?;
        let others = status.members.iter().filter(|member| member.node_id != leader);
        others.clone().all(|member| member.round_trip.is_some()).then_some(status)
    })
    .await;
    for member in &status.members {
        match &member.round_trip {
            None => assert_eq!(member.node_id, leader, "only the answering node has none: {status:?}"),
            Some(round_trip) => {
                assert!(round_trip.samples >= 1 && round_trip.samples <= 16, "{round_trip:?}");
                assert!(round_trip.median_us < 1_000_000 && round_trip.last_us < 1_000_000, "{round_trip:?}");
                assert!(round_trip.measured_ms_ago < 5_000, "the leader's heartbeats are recent: {round_trip:?}");
            }
        }
    }
}

/// A node of this build among nodes of the previous release, which lack the Ping
/// probe: their UNIMPLEMENTED answer is a round trip too, and nobody logs about it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_of_this_build_measures_nodes_of_the_previous_release() {
    let previous = previous_server().unwrap_or_else(|error| panic!("{error}"));
    let mut cluster = TestCluster::start(ClusterOptions { server: Some(previous), ..ClusterOptions::default() });
    let leader = cluster.wait_for_leader(DEADLINE).await;
    let upgraded = (1..=3).find(|id| *id != leader).unwrap();
    let status = cluster.stop(upgraded, DEADLINE).await;
    assert!(status.success(), "node {upgraded} stopped cleanly on SIGTERM: {status:?}");
    cluster.set_server(upgraded, binary("leasehold-server"));
    cluster.restart(upgraded);
    let what = format!("node {upgraded}, upgraded from {}, to measure both older nodes", previous_release());
    let measured = wait_measured(&cluster, upgraded, &what).await;
    assert_eq!(measured.len(), 2, "{measured:?}");
    // As a follower it sends no Raft messages: its round trips are the probes'.
    let state = cluster.status(upgraded).await.map(|status| status.state);
    assert_eq!(state.as_deref(), Some("follower"), "node {upgraded} rejoined as a follower");
    println!("node {upgraded} (this build) measured {measured:?} to nodes of {}", previous_release());
    let log = cluster.log_text(upgraded);
    for quiet in ["round-trip probe", "Unimplemented", "UNIMPLEMENTED"] {
        assert!(!log.contains(quiet), "an older node's UNIMPLEMENTED is taken quietly ({quiet:?}):\n{log}");
    }
    for older in (1..=3).filter(|id| *id != upgraded) {
        let log = cluster.log_text(older);
        assert!(!log.contains("Ping"), "node {older} of the previous release says nothing of the probe:\n{log}");
    }
}

/// A follower's status page: each other member's row carries the round trip this
/// node measured to it (its probes), none for itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_page_shows_this_nodes_round_trip_to_each_member() {
    let [client_port, peer_port] = free_ports();
    let addressing = Addressing::PerNodeIp { client_port, peer_port };
    let cluster = TestCluster::start(ClusterOptions { addressing, ..ClusterOptions::default() });
    let leader = cluster.wait_for_leader(DEADLINE).await;
    let follower = (1..=3).find(|id| *id != leader).unwrap();
    let address = cluster.nodes[&follower].status_addr.clone().expect("a status page with per-node addresses");
    let token = leasehold::settings::read_token_file(&cluster.credentials.admin_token_file).expect("the admin token");
    let ca_file = cluster.credentials.ca_file.clone();
    let members = wait::until(DEADLINE, "the follower's page to show a round trip to both others", || async {
        let answer = https::get(&address, Some(&ca_file), Some(&token), "/api/status").await.ok()?;
        assert_eq!(answer.status, 200, "{answer:?}");
        let report: Value = serde_json::from_str(&answer.body).expect("a JSON report");
        let members = report["members"].as_array()?.clone();
        let others = members.iter().filter(|member| member["id"] != follower);
        others.clone().all(|member| member["round_trip"].is_object()).then_some(members)
    })
    .await;
    assert_eq!(members.len(), 3);
    for member in &members {
        let trip = &member["round_trip"];
        if member["id"] == follower {
            assert!(trip.is_null(), "no round trip to itself: {member}");
            continue;
        }
        assert!(trip["median_us"].as_u64().is_some_and(|us| us < 1_000_000), "{member}");
        assert!(trip["samples"].as_u64().is_some_and(|samples| (1..=16).contains(&samples)), "{member}");
        assert!(trip["measured_ms_ago"].as_u64().is_some_and(|ms| ms < 5_000), "{member}");
    }
}

/// `log` without its terminal colours.
fn plain(log: &str) -> String {
    let mut text = String::with_capacity(log.len());
    let mut chars = log.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // An escape sequence: ESC [ parameters, ending with a letter.
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            text.push(c);
        }
    }
    text
}

/// Node `id`'s `leasehold_peer_timings_too_short` as peer to 0 or 1.
async fn too_short(cluster: &TestCluster, id: u64) -> Option<BTreeMap<u64, f64>> {
    let answer = cluster.scrape(id).await.ok()?;
    let series = answer.body.lines().filter_map(|line| {
        let rest = line.strip_prefix("leasehold_peer_timings_too_short{peer=\"")?;
        let (peer, value) = rest.split_once("\"} ")?;
        Some((peer.parse().expect("a node id"), value.parse().expect("0 or 1")))
    });
    Some(series.collect())
}

/// A node whose peer links are slow from the start (a delaying proxy in front of its
/// peer port: 25 ms each way) in a cluster whose heartbeat_ms of 100 wants a round
/// trip under 25 ms: the others warn about it within seconds of starting, name it, and
/// the metric says so; once the links are fast again the metric clears and the node
/// logs that the round trip fits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_warns_when_its_timings_are_too_short_for_the_round_trip() {
    let links = Links::new(1);
    let slow = 3;
    links.set(slow, Some(Slowness { delay: Duration::from_millis(25), jitter: Duration::ZERO }));
    let options = ClusterOptions {
        heartbeat_ms: Some(100),
        election_timeout_min_ms: Some(1_000),
        election_timeout_max_ms: Some(2_000),
        peer_proxy: Some(links.clone()),
        ..ClusterOptions::default()
    };
    let cluster = TestCluster::start(options);
    cluster.wait_for_leader(DEADLINE).await;
    // In the host's namespace every node dials from 127.0.0.1, so the proxy slows
    // what goes to node 3 (both ways): node 1 measures it slow, as leader
    // (heartbeats) or follower (probes).
    let watcher = 1;
    wait::until(DEADLINE, "node 1 to find its timings too short for node 3", || async {
        let flags = too_short(&cluster, watcher).await?;
        (flags.get(&slow) == Some(&1.0) && flags.values().filter(|flag| **flag == 1.0).count() == 1).then_some(())
    })
    .await;
    // The metric is set at the first judgement; the warning is logged by the
    // probe task's next round, within a second.
    let warning = wait::until(DEADLINE, "node 1 to log the warning", || async {
        let log = plain(&cluster.log_text(watcher));
        log.lines().find(|line| line.contains("the timings are too short for the round trip")).map(str::to_string)
    })
    .await;
    assert!(warning.contains("peer=3") && warning.contains("heartbeat_ms=100"), "{warning}");
    assert!(warning.contains("suggested_heartbeat_ms="), "the warning says what would fit: {warning}");

    links.heal();
    wait::until(DEADLINE, "the metric to clear once the links are fast again", || async {
        let flags = too_short(&cluster, watcher).await?;
        (flags.get(&slow) == Some(&0.0)).then_some(())
    })
    .await;
    let warnings = plain(&cluster.log_text(watcher)).matches("the timings are too short for the round trip").count();
    assert_eq!(warnings, 1, "one warning while it lasted, not one per round trip");
}
