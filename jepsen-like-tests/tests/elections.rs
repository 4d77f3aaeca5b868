//! Leader elections on a 3-node cluster of real processes: handover when the leader
//! dies, observers see every change in order, no double leadership across a leader
//! node's crash, and bad input refused.

use std::process::{Command, Stdio};
use std::time::Duration;

use futures::StreamExt;
use leasehold::Leader;
use leasehold_jepsen::cluster::{binary, ClusterOptions, TestCluster};
use leasehold_jepsen::wait;

const LEADER_DEADLINE: Duration = Duration::from_secs(20);

fn leasehold(cluster: &TestCluster) -> Command {
    let mut command = Command::new(binary("leasehold"));
    command.envs(cluster.client_env());
    command
}

/// Collects observed states until `done` says enough.
async fn observe_until(
    observation: &mut leasehold::Observation,
    seen: &mut Vec<Option<Leader>>,
    deadline: Duration,
    done: impl Fn(&[Option<Leader>]) -> bool,
) {
    let result = tokio::time::timeout(deadline, async {
        while !done(seen) {
            match observation.next().await {
                Some(Ok(state)) => seen.push(state),
                Some(Err(error)) => panic!("observe failed: {error}"),
                None => panic!("observe ended"),
            }
        }
    })
    .await;
    assert!(result.is_ok(), "timed out observing; seen so far: {seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_leader_is_replaced_and_observers_see_it_in_order() {
    let cluster = TestCluster::start(ClusterOptions::default());
    cluster.wait_for_leader(LEADER_DEADLINE).await;
    let client = cluster.client();
    let mut observation = client.observe("scheduler");
    let mut seen = Vec::new();
    observe_until(&mut observation, &mut seen, Duration::from_secs(10), |seen| !seen.is_empty()).await;
    assert_eq!(seen[0], None, "the election starts vacant");

    let mut first = leasehold(&cluster)
        .args(["elect", "scheduler", "pod-a", "--ttl", "2s"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    observe_until(&mut observation, &mut seen, Duration::from_secs(10), |seen| {
        seen.last().is_some_and(|state| state.as_ref().is_some_and(|leader| leader.value == "pod-a"))
    })
    .await;
    let mut second = leasehold(&cluster)
        .args(["elect", "scheduler", "pod-b", "--ttl", "2s"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // pod-b is queued behind pod-a.
    wait::until(Duration::from_secs(10), "pod-b to campaign", || {
        let client = client.clone();
        async move {
            let sessions = client.list_sessions().await.ok()?;
            sessions.iter().any(|session| session.campaigning.iter().any(|name| name == "scheduler")).then_some(())
        }
    })
    .await;

    first.kill().unwrap();
    let _ = first.wait();
    observe_until(&mut observation, &mut seen, Duration::from_secs(15), |seen| {
        seen.last().is_some_and(|state| state.as_ref().is_some_and(|leader| leader.value == "pod-b"))
    })
    .await;
    let leaders: Vec<&Leader> = seen.iter().flatten().collect();
    assert_eq!(leaders.first().unwrap().value, "pod-a");
    assert_eq!(leaders.last().unwrap().value, "pod-b");
    assert!(leaders.windows(2).all(|pair| pair[0].token <= pair[1].token), "tokens never go back: {seen:?}");
    assert!(leaders.last().unwrap().token > leaders.first().unwrap().token, "a new leader has a larger token");
    let _ = second.kill();
    let _ = second.wait();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_cluster_leader_mid_campaign_gives_no_double_leadership() {
    let mut cluster = TestCluster::start(ClusterOptions::default());
    let node_leader = cluster.wait_for_leader(LEADER_DEADLINE).await;
    let client = cluster.client();
    let a = client.session(Duration::from_secs(30)).await.unwrap();
    let b = client.session(Duration::from_secs(30)).await.unwrap();
    let leadership_a = a.campaign("primary", "a").await.unwrap();
    let campaign_b = tokio::spawn(async move {
        let leadership = b.campaign("primary", "b").await.unwrap();
        (b, leadership.token(), leadership)
    });
    wait::until(Duration::from_secs(10), "b to queue", || {
        let client = client.clone();
        async move {
            let sessions = client.list_sessions().await.ok()?;
            sessions.iter().any(|session| session.campaigning.iter().any(|name| name == "primary")).then_some(())
        }
    })
    .await;

    cluster.kill(node_leader);
    cluster.wait_for_leader(LEADER_DEADLINE).await;
    let leader = client.leader("primary").await.unwrap().expect("a still leads");
    assert_eq!((leader.value.as_str(), leader.token), ("a", leadership_a.token()));

    let token_a = leadership_a.token();
    leadership_a.resign().await.unwrap();
    let (_b, token_b, _leadership_b) =
        tokio::time::timeout(Duration::from_secs(20), campaign_b).await.unwrap().unwrap();
    assert!(token_b > token_a);
    let leader = client.leader("primary").await.unwrap().expect("b leads");
    assert_eq!((leader.value.as_str(), leader.token), ("b", token_b), "exactly one leader, b");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_resign_and_foreign_proclaim_are_refused() {
    let cluster = TestCluster::start(ClusterOptions::default());
    cluster.wait_for_leader(LEADER_DEADLINE).await;
    let client = cluster.client();
    let a = client.session(Duration::from_secs(30)).await.unwrap();
    let leadership = a.campaign("db-primary", "10.0.0.1").await.unwrap();
    leadership.proclaim("10.0.0.2").await.unwrap();
    assert_eq!(client.leader("db-primary").await.unwrap().unwrap().value, "10.0.0.2");
    let before = client.leader("db-primary").await.unwrap();

    // Another session pretending to lead, with the leader's token.
    let b = client.session(Duration::from_secs(30)).await.unwrap();
    let leader = cluster.wait_for_leader(LEADER_DEADLINE).await;
    let mut elections = leasehold::proto::elections_client::ElectionsClient::new(
        client.raw_channel(&cluster.nodes[&leader].client_addr).unwrap(),
    );
    let proclaim = elections
        .proclaim(leasehold::proto::ProclaimRequest {
            request_id: Some(leasehold::proto::RequestId { client_id: 77, sequence: 1 }),
            session_id: b.id(),
            name: "db-primary".into(),
            token: leadership.token(),
            value: "evil".into(),
            // b's own secret: b may act for itself, not lead.
            session_secret: b.secret(),
        })
        .await
        .unwrap_err();
    assert_eq!(proclaim.code(), tonic::Code::FailedPrecondition, "{proclaim:?}");
    let stale = elections
        .resign(leasehold::proto::ResignRequest {
            request_id: Some(leasehold::proto::RequestId { client_id: 77, sequence: 2 }),
            session_id: a.id(),
            name: "db-primary".into(),
            token: leadership.token() + 1,
            session_secret: a.secret(),
        })
        .await
        .unwrap_err();
    assert_eq!(stale.code(), tonic::Code::FailedPrecondition, "{stale:?}");
    assert_eq!(before, client.leader("db-primary").await.unwrap(), "state changed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elect_handover_is_visible_in_observe() {
    let cluster = TestCluster::start(ClusterOptions::default());
    cluster.wait_for_leader(LEADER_DEADLINE).await;
    let mut observer = leasehold(&cluster).args(["observe", "cron", "--json"]).stdout(Stdio::piped()).spawn().unwrap();
    let stdout = observer.stdout.take().unwrap();
    let (lines_sender, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = lines_sender.send(line);
        }
    });
    let first = leasehold(&cluster)
        .args(["elect", "cron", "pod-1", "--", "sleep", "1"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let second = leasehold(&cluster)
        .args(["elect", "cron", "pod-2", "--", "sleep", "1"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    assert!(first.wait_with_output().unwrap().status.success());
    assert!(second.wait_with_output().unwrap().status.success());
    let mut values = Vec::new();
    while values.iter().filter(|value: &&String| value.starts_with("pod")).count() < 2 {
        let line = lines.recv_timeout(Duration::from_secs(20)).expect("observe printed the handover");
        let parsed: serde_json::Value = serde_json::from_str(&line).unwrap();
        values.push(parsed["leader"]["value"].as_str().unwrap_or("vacant").to_string());
    }
    let _ = observer.kill();
    let _ = observer.wait();
    let leaders: Vec<&String> = values.iter().filter(|value| value.starts_with("pod")).collect();
    assert_ne!(leaders[0], leaders[1], "both pods led in turn: {values:?}");
}
