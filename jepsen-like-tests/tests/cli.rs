//! The `leasehold` CLI against a real cluster.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use leasehold_jepsen::cluster::{binary, ClusterOptions, TestCluster};

fn leasehold(cluster: &TestCluster) -> Command {
    let mut command = Command::new(binary("leasehold"));
    command.env("LEASEHOLD_ENDPOINTS", cluster.endpoints().join(","));
    command
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_try_locks_at_once_one_runs_and_one_exits_75() {
    let cluster = TestCluster::start(ClusterOptions::default());
    cluster.wait_for_leader(Duration::from_secs(20)).await;
    let spawn = || {
        leasehold(&cluster)
            .args(["lock", "cron/weekly-report", "--try", "--", "sh", "-c", "echo ran; sleep 3"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (first, second) = (spawn(), spawn());
    let outputs = [first.wait_with_output().unwrap(), second.wait_with_output().unwrap()];
    let codes: Vec<i32> = outputs.iter().map(|output| output.status.code().unwrap()).collect();
    let mut sorted = codes.clone();
    sorted.sort();
    assert_eq!(sorted, vec![0, 75], "one runs, one is refused: {outputs:?}");
    let refused = outputs.iter().find(|output| output.status.code() == Some(75)).unwrap();
    let message = String::from_utf8_lossy(&refused.stderr);
    assert!(message.contains("is held by session"), "the refusal names the holder: {message}");
    let ran = outputs.iter().find(|output| output.status.code() == Some(0)).unwrap();
    assert_eq!(String::from_utf8_lossy(&ran.stdout).trim(), "ran");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn successive_holders_print_increasing_tokens() {
    let cluster = TestCluster::start(ClusterOptions::default());
    cluster.wait_for_leader(Duration::from_secs(20)).await;
    let mut tokens = Vec::new();
    for _ in 0..3 {
        let output = leasehold(&cluster)
            .args(["lock", "tokens", "--try", "--", "sh", "-c", "echo $LEASEHOLD_FENCING_TOKEN"])
            .output()
            .unwrap();
        assert!(output.status.success(), "{output:?}");
        tokens.push(String::from_utf8_lossy(&output.stdout).trim().parse::<u64>().unwrap());
    }
    assert!(tokens.windows(2).all(|pair| pair[0] < pair[1]), "{tokens:?}");

    let fence = leasehold(&cluster).args(["fence", "check", "tokens", &tokens[0].to_string()]).output().unwrap();
    assert_eq!(fence.status.code(), Some(1), "an old token is superseded: {fence:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_lock_holder_loses_the_lock_and_its_command_is_terminated() {
    let cluster = TestCluster::start(ClusterOptions::default());
    cluster.wait_for_leader(Duration::from_secs(20)).await;
    let marker = tempfile::NamedTempFile::new().unwrap();
    let script = format!("echo $$ > {}; sleep 60", marker.path().display());
    let mut holder = leasehold(&cluster)
        .args(["lock", "paused", "--ttl", "2s", "--", "sh", "-c", &script])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let child_pid: i32 = leasehold_jepsen::wait::until(Duration::from_secs(20), "the command to start", || {
        let text = std::fs::read_to_string(marker.path()).unwrap_or_default();
        async move { text.trim().parse().ok() }
    })
    .await;

    // Pause the `leasehold lock` process (not its command) past its TTL.
    // SAFETY: signalling processes this test started.
    unsafe { libc::kill(holder.id() as i32, libc::SIGSTOP) };
    let client = cluster.client();
    let taken = leasehold_jepsen::wait::until(Duration::from_secs(20), "another session to take the lock", || {
        let client = client.clone();
        async move {
            let session = client.session(Duration::from_secs(10)).await.ok()?;
            let guard = session.try_lock("paused").await.ok()??;
            Some(guard.detach())
        }
    })
    .await;
    assert!(taken > 0);
    unsafe { libc::kill(holder.id() as i32, libc::SIGCONT) };

    let started = Instant::now();
    let status = loop {
        if let Some(status) = holder.try_wait().unwrap() {
            break status;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "leasehold lock did not exit after resuming");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(status.code(), Some(70), "exit 70 when the lock was lost");
    // SAFETY: probing whether the command's process still exists.
    let alive = unsafe { libc::kill(child_pid, 0) } == 0;
    assert!(!alive, "the command must have been terminated");
}
