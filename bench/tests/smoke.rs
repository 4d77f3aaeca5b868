//! A smoke run of `leasehold-bench` against a real 3-node cluster: every Leasehold
//! workload for about a second with two clients, so the tool keeps working. The
//! benchmark itself (long runs, etcd and Redis) is never part of the test suite.

use std::process::Command;
use std::time::Duration;

use leasehold_bench::report::Report;
use leasehold_bench::transport::Transport;
use leasehold_jepsen::cluster::{ClusterOptions, TestCluster};

/// How long a test waits for the cluster to elect a leader.
const LEADER_WAIT_MS: u64 = 30_000;

fn run_bench(cluster: &TestCluster, workload: &str, extra: &[&str]) -> Report {
    run_bench_with_env(cluster, workload, extra, &[])
}

/// `run_bench` with `env` over the cluster's client variables.
fn run_bench_with_env(cluster: &TestCluster, workload: &str, extra: &[&str], env: &[(&str, String)]) -> Report {
    let pids: Vec<String> = cluster.nodes.keys().map(|id| cluster.pid(*id).expect("node runs").to_string()).collect();
    let output = Command::new(env!("CARGO_BIN_EXE_leasehold-bench"))
        .args(["run", "--target", "leasehold", "--workload", workload, "--clients", "2"])
        .args(["--warmup", "200ms", "--ttl", "5s"])
        .args(["--endpoints", &cluster.endpoints().join(","), "--pids", &pids.join(",")])
        .args(extra)
        .envs(cluster.client_env())
        .envs(env.iter().map(|(name, value)| (*name, value.as_str())))
        .output()
        .expect("run leasehold-bench");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "leasehold-bench {workload} failed: {stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let line = stdout.lines().find(|line| line.starts_with('{')).expect("a JSON line");
    serde_json::from_str(line).expect("the JSON line is a report")
}

#[tokio::test(flavor = "multi_thread")]
async fn every_workload_runs_against_a_cluster() {
    let cluster = TestCluster::start(ClusterOptions::default());
    cluster.wait_for_leader(Duration::from_millis(LEADER_WAIT_MS)).await;
    for workload in ["lock-cycle", "contended", "keepalive", "semaphore", "refused"] {
        let report = run_bench(&cluster, workload, &["--duration", "1s", "--limit", "1"]);
        assert!(report.operations > 0, "{workload}: no operation completed: {report:?}");
        assert_eq!(report.errors, 0, "{workload}: {:?}", report.error_samples);
        assert!(report.p99_ms.is_some(), "{workload}: no latency");
        assert!(report.server_cpu_ms_per_op.is_some_and(|cpu| cpu > 0.0), "{workload}: no server CPU: {report:?}");
        assert_eq!(report.transport, Transport::Tls, "{workload}: the cluster's clients speak TLS");
    }
}

/// What compare.sh does: `add-tenant` with the admin credential (here from
/// LEASEHOLD_ADMIN_TOKEN_FILE), then a run as that tenant.
#[tokio::test(flavor = "multi_thread")]
async fn a_tenant_added_by_the_bench_runs_a_workload() {
    let cluster = TestCluster::start(ClusterOptions::default());
    cluster.wait_for_leader(Duration::from_millis(LEADER_WAIT_MS)).await;
    let token_file = cluster.credentials.directory.join("bench.token");
    let output = Command::new(env!("CARGO_BIN_EXE_leasehold-bench"))
        .args(["add-tenant", "--name", "bench", "--max-sessions", "10", "--endpoints", &cluster.endpoints().join(",")])
        .arg("--token-file")
        .arg(&token_file)
        .envs(cluster.client_env())
        .output()
        .expect("run leasehold-bench add-tenant");
    assert!(output.status.success(), "add-tenant failed: {}", String::from_utf8_lossy(&output.stderr));
    let tenants = cluster.admin_client().list_tenants().await.expect("list the tenants");
    let bench = tenants.iter().find(|tenant| tenant.name == "bench").expect("the tenant bench exists");
    assert_eq!(bench.quotas.map(|quotas| quotas.max_sessions), Some(10));

    let env = [("LEASEHOLD_TOKEN_FILE", token_file.display().to_string())];
    let report = run_bench_with_env(&cluster, "lock-cycle", &["--duration", "1s"], &env);
    assert!(report.operations > 0, "no operation completed as the tenant bench: {report:?}");
    assert_eq!(report.errors, 0, "{:?}", report.error_samples);
}

#[tokio::test(flavor = "multi_thread")]
async fn failover_kills_the_leader_and_clients_come_back() {
    let cluster = TestCluster::start(ClusterOptions::default());
    let leader = cluster.wait_for_leader(Duration::from_millis(LEADER_WAIT_MS)).await;
    let report = run_bench(&cluster, "failover", &["--duration", "4s", "--kill-after", "300ms"]);
    let failover = report.failover.expect("a failover section");
    assert_eq!(failover.killed_endpoint, cluster.nodes[&leader].client_addr, "the leader was killed");
    assert_eq!(failover.clients_not_back, 0, "every client succeeds again: {failover:?}");
    assert!(failover.all_clients_back_ms.is_some());
}
