//! The story Leasehold exists to end, with two real worker processes: worker A takes
//! the lock for order 42 with a 2 s TTL and is paused (SIGSTOP) for 5 s; its session
//! expires, worker B is granted the lock and charges through the fenced store; A
//! wakes, still believing it holds the lock, and tries to charge again.
//!
//! With the fence checked, the store rejects A's stale token: one charge. The
//! control, with the check switched off, shows the double charge the fence prevents.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use leasehold_jepsen::cluster::{binary, ClusterOptions, TestCluster};
use leasehold_jepsen::fenced_store::FencedStore;

const LINE_DEADLINE: Duration = Duration::from_secs(30);
const PAUSE: Duration = Duration::from_secs(5);

struct Worker {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Worker {
    fn start(cluster: &TestCluster, store: std::net::SocketAddr, value: &str, wait_for_go: bool) -> Worker {
        let mut command = Command::new(binary("leasehold-jepsen"));
        command.args([
            "worker",
            "--endpoints",
            &cluster.endpoints().join(","),
            "--lock",
            "orders/42",
            "--ttl-ms",
            "2000",
            "--store",
            &store.to_string(),
            "--resource",
            "orders/42",
            "--value",
            value,
        ]);
        if wait_for_go {
            command.arg("--wait-for-go");
        }
        command.envs(cluster.client_env());
        let mut child = command.stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().expect("start a worker");
        let stdout: ChildStdout = child.stdout.take().unwrap();
        let (sender, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = sender.send(line);
            }
        });
        Worker { child, lines }
    }

    fn next_line(&self, reason: &str) -> String {
        self.lines.recv_timeout(LINE_DEADLINE).unwrap_or_else(|_| panic!("timed out waiting for {reason}"))
    }

    fn signal(&self, signal: i32) {
        // SAFETY: signalling a worker process this test started.
        unsafe {
            libc::kill(self.child.id() as i32, signal);
        }
    }

    fn go(&mut self) {
        self.child.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.signal(libc::SIGCONT);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs the story and returns the writes the store accepted for order 42.
async fn run_story(fencing: bool) -> (Vec<leasehold_jepsen::fenced_store::Write>, String) {
    let cluster = TestCluster::start(ClusterOptions::default());
    cluster.wait_for_leader(Duration::from_secs(20)).await;
    let store = FencedStore::new(fencing);
    let address = store.serve().await.unwrap();

    let mut worker_a = Worker::start(&cluster, address, "charge-by-A", true);
    let acquired_a = worker_a.next_line("A to acquire");
    assert!(acquired_a.starts_with("acquired "), "{acquired_a}");
    // A stalls (a GC pause) while it believes it holds the lock.
    worker_a.signal(libc::SIGSTOP);

    let worker_b = Worker::start(&cluster, address, "charge-by-B", false);
    let acquired_b = worker_b.next_line("B to acquire after A's session expired");
    let token_a: u64 = acquired_a["acquired ".len()..].parse().unwrap();
    let token_b: u64 = acquired_b["acquired ".len()..].parse().unwrap();
    assert!(token_b > token_a, "B's token {token_b} must exceed A's {token_a}");
    assert_eq!(worker_b.next_line("B's write"), "write ACCEPTED");

    tokio::time::sleep(PAUSE.saturating_sub(Duration::from_secs(2))).await; // A's pause lasts 5 s in all
    worker_a.signal(libc::SIGCONT);
    worker_a.go();
    let late = worker_a.next_line("A's late write");
    (store.accepted_writes("orders/42"), late)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_holder_cannot_charge_twice_through_the_fence() {
    let (accepted, late) = run_story(true).await;
    assert!(late.starts_with("write REJECTED"), "A's stale write must be rejected, got {late:?}");
    assert_eq!(accepted.len(), 1, "exactly one charge: {accepted:?}");
    assert_eq!(accepted[0].value, "charge-by-B");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_without_the_fence_check_the_order_is_charged_twice() {
    let (accepted, late) = run_story(false).await;
    assert_eq!(late, "write ACCEPTED");
    assert_eq!(accepted.len(), 2, "without the fence both charges land: {accepted:?}");
}
