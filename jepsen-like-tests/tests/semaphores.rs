//! Per-tenant semaphores on a 3-node cluster of real processes: K is enforced by the
//! replicated state, permits of dead workers come back, one tenant's flood does not
//! starve another.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use leasehold_jepsen::cluster::{binary, ClusterOptions, TestCluster};
use leasehold_jepsen::wait;

const LEADER_DEADLINE: Duration = Duration::from_secs(20);

fn leasehold(cluster: &TestCluster) -> Command {
    let mut command = Command::new(binary("leasehold"));
    command.envs(cluster.client_env());
    command
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_workers_never_exceed_three_permits_and_a_killed_workers_permit_returns() {
    let cluster = TestCluster::start(ClusterOptions::default());
    cluster.wait_for_leader(LEADER_DEADLINE).await;
    let client = cluster.client();

    // One worker that will be killed while it holds a permit.
    let mut doomed = leasehold(&cluster)
        .args(["sem", "jobs", "--limit", "3", "--ttl", "2s", "--", "sleep", "5"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let doomed_session = wait::until(Duration::from_secs(10), "the doomed worker to hold a permit", || {
        let client = client.clone();
        async move { client.describe_semaphore("jobs").await.ok()?.holders.first().map(|holder| holder.session_id) }
    })
    .await;

    // Ten workers cycling through short jobs.
    let mut workers: Vec<_> = (0..10)
        .map(|_| {
            leasehold(&cluster)
                .args(["sem", "jobs", "--limit", "3", "--ttl", "5s", "--wait", "30s", "--", "sleep", "0.3"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();

    doomed.kill().unwrap();
    let killed_at = Instant::now();
    let _ = doomed.wait();
    let holds = |semaphore: &leasehold::proto::DescribeSemaphoreResponse| {
        semaphore.holders.iter().any(|holder| holder.session_id == doomed_session)
    };
    assert!(holds(&client.describe_semaphore("jobs").await.unwrap()), "SIGKILL alone does not free the permit");

    let mut samples = 0;
    let mut most = 0;
    let deadline = Instant::now() + Duration::from_secs(40);
    while workers.iter_mut().any(|worker| worker.try_wait().unwrap().is_none()) {
        assert!(Instant::now() < deadline, "workers did not finish");
        let semaphore = client.describe_semaphore("jobs").await.unwrap();
        assert!(semaphore.holders.len() <= 3, "more than K=3 holders: {semaphore:?}");
        most = most.max(semaphore.holders.len());
        samples += 1;
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    for worker in &mut workers {
        assert!(worker.wait().unwrap().success(), "every worker got a permit in the end");
    }
    assert!(
        samples > 10 && most >= 2,
        "the sampling saw the semaphore busy ({samples} samples, at most {most} holders)"
    );
    wait::until(Duration::from_secs(10), "the killed worker's permit to come back", || {
        let client = client.clone();
        async move { (!holds(&client.describe_semaphore("jobs").await.ok()?)).then_some(()) }
    })
    .await;
    let reclaimed_after = killed_at.elapsed();
    assert!(reclaimed_after >= Duration::from_secs(1), "reclaimed by expiry (TTL 2 s), after {reclaimed_after:?}");
    let end = client.describe_semaphore("jobs").await.unwrap();
    assert!(end.holders.is_empty(), "every permit returned, including the killed worker's: {end:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flooding_tenant_does_not_starve_another() {
    let cluster = TestCluster::start(ClusterOptions::default());
    cluster.wait_for_leader(LEADER_DEADLINE).await;
    let client = cluster.client();
    let mut flood = Vec::new();
    for _ in 0..6 {
        let session = client.session(Duration::from_secs(30)).await.unwrap();
        let permit = session.semaphore("tenant-big", 2).try_acquire().await.unwrap();
        flood.push((session, permit));
    }
    let granted = flood.iter().filter(|(_, permit)| permit.is_some()).count();
    assert_eq!(granted, 2, "the big tenant is held at K=2");

    let small = client.session(Duration::from_secs(30)).await.unwrap();
    for _ in 0..3 {
        let permit = small
            .semaphore("tenant-small", 2)
            .try_acquire()
            .await
            .unwrap()
            .expect("the small tenant still gets a slot");
        permit.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_try_acquires_with_limit_two_two_run_and_one_exits_75() {
    let cluster = TestCluster::start(ClusterOptions::default());
    cluster.wait_for_leader(LEADER_DEADLINE).await;
    let children: Vec<_> = (0..3)
        .map(|_| {
            leasehold(&cluster)
                .args(["sem", "tenant-a", "--limit", "2", "--try", "--", "sleep", "5"])
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut codes: Vec<i32> =
        children.into_iter().map(|child| child.wait_with_output().unwrap().status.code().unwrap()).collect();
    codes.sort();
    assert_eq!(codes, vec![0, 0, 75]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_semaphore_input_is_refused_and_changes_nothing() {
    let cluster = TestCluster::start(ClusterOptions::default());
    cluster.wait_for_leader(LEADER_DEADLINE).await;
    let client = cluster.client();
    let session = client.session(Duration::from_secs(30)).await.unwrap();
    let permit = session.semaphore("limits", 2).try_acquire().await.unwrap().expect("free");
    let before = format!("{:?}", client.describe_semaphore("limits").await.unwrap());

    let zero = session.semaphore("limits", 0).try_acquire().await.unwrap_err();
    assert!(zero.to_string().contains("out of range"), "{zero}");
    let huge = session.semaphore("other", 1_000_000).try_acquire().await.unwrap_err();
    assert!(huge.to_string().contains("SEMAPHORE_LIMIT_MAX"), "{huge}");
    let other = client.session(Duration::from_secs(30)).await.unwrap();
    let mismatch = other.semaphore("limits", 5).try_acquire().await.unwrap_err();
    let message = mismatch.to_string();
    assert!(message.contains('2') && message.contains('5'), "the mismatch names both limits: {message}");

    assert_eq!(before, format!("{:?}", client.describe_semaphore("limits").await.unwrap()), "state changed");
    permit.release().await.unwrap();
}
