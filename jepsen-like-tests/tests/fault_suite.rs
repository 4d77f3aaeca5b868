//! The short fault suite, run by the normal test command: the `leasehold-jepsen
//! run` harness on 3 nodes with every nemesis and every workload, with a fixed seed
//! and a random one (printed), must end `valid: true` — the nodes sharing this
//! machine's cores in one run, each with a thread per core in the other — and its
//! attack workload must have run, every attack refused (forged Raft messages with
//! node certificates of the cluster CA included, and idle connections, slow readers
//! and a stream opened with a token then rotated) with the workers' releases as
//! fast beside it as beside the flood, no node may have exited outside the
//! faults that stop nodes, and a follower wiped in the fresh cluster's first second
//! must have been refused and replaced; the control with fencing
//! switched off must end `valid: false` with the lost writes listed, and the control
//! with the nodes' incarnation checks off must take a wiped node back. A lock holder
//! stopped while the leader is killed must lose its lock within the published bound
//! (check (i)), and the control without checkpoints must miss it; a stopped
//! holder's lock that asked for a lock-delay must go to nobody for that delay
//! (check (j)), and the control that records the delay without asking for it must
//! see the lock handed on inside it; with streams keeping a rotated-away token, the
//! intruder's `stream-after-rotation` must succeed. A cluster started on the previous release's
//! build and upgraded one node at a time to this one, under every workload and
//! kills and pauses, must end `valid: true` with every node upgraded cleanly. The
//! fenced counter writing through PostgreSQL (`--fenced-store postgres`) under pauses
//! and kills must end `valid: true`, the store holding what the harness recorded. The
//! grey faults (slow links, a starved CPU, slow fsyncs) must leave the history valid
//! and their figures in the summary.
//!
//! The harness runs in its own network and pid namespaces (it re-executes itself
//! under `unshare`): nothing it starts outlives it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use leasehold_jepsen::checker::{
    ATTACKS_CHECK_NAME, DEAD_HOLDER_CHECK_NAME, FLOOD_CHECK_NAME, INTRUDER_LATENCY_CHECK_NAME, LOCK_DELAY_CHECK_NAME,
    NODE_EXITS_CHECK_NAME, STORE_READ_BACK_CHECK_NAME, UPGRADE_CHECK_NAME,
};
use leasehold_jepsen::cluster::{binary, previous_release, previous_server};

/// The fixed seed of the suite; the second run's seed is random.
const FIXED_SEED: u64 = 20_261_130;
/// The seed of the flood run.
const FLOOD_SEED: u64 = 20_261_204;
/// The seed of the grey faults' run.
const GREY_SEED: u64 = 20_261_205;
const RUN_TIME: &str = "45s";
const CONTROL_TIME: &str = "30s";

fn out_directory(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name)
}

/// Runs the harness; returns its output and the --out directory.
fn run_harness(name: &str, arguments: &[&str]) -> (Output, String, PathBuf) {
    let out = out_directory(name);
    let _ = std::fs::remove_dir_all(&out);
    let output = Command::new(binary("leasehold-jepsen"))
        .arg("run")
        .args(arguments)
        .arg("--out")
        .arg(&out)
        .output()
        .expect("run leasehold-jepsen");
    let text = format!("{}\n{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    (output, text, out)
}

/// A control run: `workload` under `nemesis` with the planted bug `flag`, 3 nodes,
/// `CONTROL_TIME`, the fixed seed; it must end `valid: false` (exit 1). Returns the
/// report's text and the run's directory.
fn run_control(name: &str, workload: &str, nemesis: &str, flag: &str) -> (String, PathBuf) {
    let seed = FIXED_SEED.to_string();
    let arguments =
        ["--nodes", "3", "--time", CONTROL_TIME, "--seed", &seed, "--workload", workload, "--nemesis", nemesis, flag];
    let (output, text, out) = run_harness(name, &arguments);
    assert_eq!(output.status.code(), Some(1), "the control ({flag}) must fail its checks:\n{text}");
    assert!(text.contains("\nvalid: false"), "{text}");
    (text, out)
}

/// The report's lines that say why a run is not valid, first in a failure's message
/// so that a log cut short still shows them: the checks that did not pass, the
/// anomalies' headings, the seed, and the harness's own errors.
fn why_invalid(text: &str) -> String {
    let mut in_checks = false;
    let mut lines = Vec::new();
    for line in text.lines() {
        let trimmed = line.trim_start();
        if line.starts_with("checks:") {
            in_checks = true;
            continue;
        }
        let failed_check = in_checks
            && line.starts_with("  ")
            && !trimmed.contains(" pass ")
            && !trimmed.contains(" skipped ")
            && !trimmed.starts_with('[');
        if !line.starts_with("  ") {
            in_checks = false;
        }
        let heading = trimmed.starts_with('[') && trimmed.contains("] ") && line.starts_with("  [");
        let said = line.starts_with("seed:") || line.starts_with("Error") || line.starts_with("error");
        if failed_check || heading || said {
            lines.push(line);
        }
    }
    let total = lines.len();
    let mut shown: Vec<&str> = lines.into_iter().take(30).collect();
    if total > shown.len() {
        shown.push("  …");
    }
    shown.join("\n")
}

/// Expects the run `what` (e.g. "with seed 7") valid; its directory `out` is kept
/// for a look otherwise.
fn expect_valid(output: &Output, text: &str, out: &Path, what: &str) {
    assert!(
        output.status.success() && text.contains("\nvalid: true"),
        "the fault suite {what} is not valid (exit {:?}); kept under {}\n{}\n---- the whole report ----\n{text}",
        output.status.code(),
        out.display(),
        why_invalid(text)
    );
}

/// What a valid run prints: the seed's line and the checks, not the whole report,
/// so that the failure of a later run in the same test comes early in the log.
fn print_checks(text: &str) {
    let mut in_checks = false;
    for line in text.lines() {
        if line.starts_with("seed:") || line.starts_with("checks:") {
            in_checks |= line.starts_with("checks:");
            println!("{line}");
        } else if in_checks && line.starts_with("  ") {
            println!("{line}");
        } else {
            in_checks = false;
        }
    }
}

/// Expects the check `name` in the report passed (not failed, not skipped); `why`
/// says what that shows.
fn expect_passed(text: &str, name: &str, why: &str) {
    assert!(
        text.lines().any(|line| line.contains(name) && line.contains(" pass ")),
        "{why}:\n{}\n---- the whole report ----\n{text}",
        why_invalid(text)
    );
}

/// `node_threads`: the worker threads of each node; None leaves the harness's
/// default, this machine's cores shared among the nodes.
fn assert_valid(seed: u64, node_threads: Option<usize>) {
    let name = format!("fault-suite-{seed}");
    let seed_text = seed.to_string();
    println!("fault suite: seed {seed}, worker threads per node: {node_threads:?} (None: a share of the cores)");
    let mut arguments =
        vec!["--nodes", "3", "--time", RUN_TIME, "--seed", &seed_text, "--workload", "all", "--nemesis", "all"];
    let threads_text = node_threads.map(|threads| threads.to_string());
    if let Some(threads) = &threads_text {
        arguments.extend(["--node-threads", threads.as_str()]);
    }
    let (output, text, out) = run_harness(&name, &arguments);
    expect_valid(&output, &text, &out, &format!("with seed {seed}"));
    expect_passed(
        &text,
        ATTACKS_CHECK_NAME,
        &format!("the attack workload must run under every nemesis, every attack refused (seed {seed})"),
    );
    expect_passed(
        &text,
        INTRUDER_LATENCY_CHECK_NAME,
        &format!("the workers' releases must stay fast beside the intruder's connection attacks (seed {seed})"),
    );
    expect_passed(
        &text,
        NODE_EXITS_CHECK_NAME,
        &format!("no node may exit on its own outside the faults that stop nodes (seed {seed})"),
    );
    assert!(
        text.lines().any(|line| line.trim_start().starts_with("wipe-early") && line.contains("installed   1")),
        "the early wipe must have run once and been healed (seed {seed}):\n{text}"
    );
    print_checks(&text);
    let _ = std::fs::remove_dir_all(&out);
}

/// A third tenant floods the cluster (lock cycles of its own names and closes of a
/// gone session, held to its rate quota) under every nemesis, beside the lock and
/// semaphore workloads: the history stays valid, and their releases outside fault
/// windows stay within `FLOOD_RELEASE_P99_MS_MAX` at the 99th percentile.
#[test]
fn a_flooding_tenant_leaves_the_others_fast_and_the_history_valid() {
    let seed_text = FLOOD_SEED.to_string();
    let arguments = [
        "--nodes",
        "3",
        "--time",
        RUN_TIME,
        "--seed",
        &seed_text,
        "--workload",
        "lock,semaphore,flood",
        "--nemesis",
        "all",
    ];
    let (output, text, out) = run_harness("fault-suite-flood", &arguments);
    expect_valid(&output, &text, &out, &format!("with the flood (seed {FLOOD_SEED})"));
    expect_passed(&text, FLOOD_CHECK_NAME, &format!("the flood check must pass, not be skipped (seed {FLOOD_SEED})"));
    print_checks(&text);
    let _ = std::fs::remove_dir_all(&out);
}

/// The fixed seed runs the nodes as `cluster.sh` does on this machine (its cores
/// shared among them); the random one as a node alone on its machine runs (one
/// worker thread per core, at least two, so that a node's tasks also run in
/// parallel).
#[test]
fn every_nemesis_leaves_the_history_valid() {
    assert_valid(FIXED_SEED, None);
    let cores = std::thread::available_parallelism().map(|cores| cores.get()).unwrap_or(1);
    assert_valid(rand::random(), Some(cores.max(2)));
}

/// The grey faults (a node's peer links delayed, its CPU starved, its fsyncs slowed;
/// the leader or a follower) leave the history valid, and the summary sets their
/// figures beside the calm.
#[test]
fn grey_faults_leave_the_history_valid_and_report_their_figures() {
    let seed_text = GREY_SEED.to_string();
    let arguments = [
        "--nodes",
        "3",
        "--time",
        CONTROL_TIME,
        "--seed",
        &seed_text,
        "--workload",
        "lock,fenced-counter",
        "--nemesis",
        "grey",
    ];
    let (output, text, out) = run_harness("fault-suite-grey", &arguments);
    expect_valid(&output, &text, &out, &format!("under the grey faults (seed {GREY_SEED})"));
    let figures: Vec<&str> = text
        .lines()
        .skip_while(|line| !line.starts_with("grey faults"))
        .take_while(|line| line.starts_with("grey") || line.starts_with("  "))
        .collect();
    assert!(
        figures.iter().any(|line| line.trim_start().starts_with("calm")),
        "no grey figures in the summary:\n{text}"
    );
    assert!(
        figures.iter().any(|line| line.trim_start().starts_with("slow-")),
        "no grey fault was installed (seed {GREY_SEED}):\n{text}"
    );
    println!("{}", figures.join("\n"));
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn without_fencing_worker_pauses_lose_writes() {
    let (text, out) = run_control("fault-suite-control", "fenced-counter", "worker-pause", "--no-fencing");
    assert!(
        text.contains("acknowledged increment lost") || text.contains("stale write accepted"),
        "the control must list lost or stale writes:\n{text}"
    );
    println!("{text}");
    let _ = std::fs::remove_dir_all(&out);
}

/// The fenced counter through a real store: PostgreSQL, `scripts/stores.sh`'s shared
/// instance (started if it is not running), outside the harness's namespace. Under
/// pauses (workers stopped mid-increment among them) and kills the store decides
/// every write, the history stays valid, and the counters read back from the store
/// are what the record of its answers says.
#[test]
fn the_fenced_counter_through_postgres_stays_valid_under_pauses_and_kills() {
    let seed = FIXED_SEED.to_string();
    let arguments = [
        "--nodes",
        "3",
        "--time",
        "20s",
        "--seed",
        &seed,
        "--workload",
        "fenced-counter",
        "--nemesis",
        "pause,kill",
        "--fenced-store",
        "postgres",
    ];
    let (output, text, out) = run_harness("fault-suite-fenced-postgres", &arguments);
    expect_valid(&output, &text, &out, "with the fenced counter through PostgreSQL");
    assert!(text.contains("\nfenced store: postgres at "), "the summary must name the store:\n{text}");
    expect_passed(
        &text,
        STORE_READ_BACK_CHECK_NAME,
        "the counters read back from PostgreSQL must be the recorded ones",
    );
    let line = text.lines().find(|line| line.contains("fenced store (b)")).expect("check (b)'s line");
    let accepted: u64 = line
        .split(" writes accepted")
        .next()
        .and_then(|before| before.rsplit(' ').next())
        .and_then(|count| count.parse().ok())
        .unwrap_or_else(|| panic!("check (b) names no accepted writes: {line}"));
    assert!(line.contains(" pass ") && accepted > 0, "PostgreSQL must have accepted writes: {line}");
    print_checks(&text);
    let _ = std::fs::remove_dir_all(&out);
}

/// The control of the `stream-after-rotation` attack: with the nodes keeping a
/// stream's credential as it opened, the intruder's keepalive stream opened with a
/// token the harness then rotates goes on answering, and the attacks check fails
/// naming that attack. (The run with the check on is `every_nemesis_...`.)
#[test]
fn a_stream_that_outlives_its_rotated_token_fails_the_attacks_check() {
    let (text, out) = run_control("fault-suite-control-rotation", "lock,attack", "kill", "--streams-outlive-rotation");
    assert!(
        text.contains("attack stream-after-rotation succeeded") && text.contains("after its token was rotated"),
        "the control must name the stream that outlived its token:\n{text}"
    );
    println!("{text}");
    let _ = std::fs::remove_dir_all(&out);
}

/// The control of the disk faults: with the nodes' incarnation checks off, a wiped
/// node is taken back as the member it was, and the `refused-nodes` check fails.
/// (The run with the checks on is the `disk` nemesis in `every_nemesis_...`.)
#[test]
fn without_incarnation_checks_a_wiped_node_is_taken_back() {
    let (output, text, out) = run_harness(
        "fault-suite-control-incarnations",
        &[
            "--nodes",
            "3",
            "--time",
            "10s",
            "--seed",
            "7",
            "--workload",
            "lock,fenced-counter",
            "--nemesis",
            "disk",
            "--no-incarnation-checks",
        ],
    );
    assert_eq!(output.status.code(), Some(1), "the control must fail its checks:\n{text}");
    assert!(text.contains("\nvalid: false"), "{text}");
    assert!(
        text.lines().any(|line| line.contains("[refused-nodes]") && line.contains("kept running")),
        "the control must name the wiped node that was taken back:\n{text}"
    );
    println!("{text}");
    let _ = std::fs::remove_dir_all(&out);
}

/// The `holder-kill` fault alone (a lock holder stopped for two TTLs, the leader
/// killed three quarters of a TTL in), with an 8 s TTL so that a lease restarted by
/// the new leader overshoots the bound by seconds, not by timing noise.
fn holder_kill_run(name: &str, control: bool) -> (Output, String, PathBuf) {
    let seed = FIXED_SEED.to_string();
    let mut arguments = vec![
        "--nodes",
        "3",
        "--time",
        "40s",
        "--seed",
        &seed,
        "--workload",
        "lock",
        "--nemesis",
        "holder-kill",
        "--ttl-ms",
        "8000",
    ];
    if control {
        arguments.push("--full-ttl-restart");
    }
    run_harness(name, &arguments)
}

#[test]
fn a_stopped_holders_lock_is_handed_on_within_the_bound_across_a_leader_kill() {
    let (output, text, out) = holder_kill_run("fault-suite-holder-kill", false);
    expect_valid(&output, &text, &out, "with a holder killed");
    // Whether a handover is measured depends on a waiter being queued when the lease
    // runs out (tests/leases.rs measures one every time); the check must pass.
    let line = text.lines().find(|line| line.contains(DEAD_HOLDER_CHECK_NAME)).expect("the check's line");
    assert!(line.contains(" pass ") && line.contains("stopped holders"), "{line}");
    // The lock workload's grants carry the lock-delay: each stopped holder's lock
    // went to nobody for it, and some worker took the lock after it (not skipped).
    let line = text.lines().find(|line| line.contains(LOCK_DELAY_CHECK_NAME)).expect("the check's line");
    assert!(line.contains(" pass ") && line.contains("the next grant came at least"), "{line}");
    println!("{text}");
    let _ = std::fs::remove_dir_all(&out);
}

/// The control: nodes that write no checkpoints restart the stopped holder's lease
/// at a full TTL when the leader dies, and check (i) fails.
#[test]
fn without_checkpoints_a_stopped_holder_blocks_a_ttl_past_the_bound() {
    let (output, text, out) = holder_kill_run("fault-suite-control-holder-kill", true);
    assert_eq!(output.status.code(), Some(1), "the control must fail its checks:\n{text}");
    assert!(
        text.lines().any(|line| line.contains(&format!("[{DEAD_HOLDER_CHECK_NAME}]")) && line.contains("the bound is")),
        "the control must name the late handover:\n{text}"
    );
    println!("{text}");
    let _ = std::fs::remove_dir_all(&out);
}

/// The control of check (j): the workers record the lock-delay but do not ask the
/// cluster for it, so a paused holder's lock goes to a waiter as soon as its session
/// expires, inside the delay the history claims, and (j) fails.
#[test]
fn a_lock_delay_not_asked_for_is_not_kept() {
    let (text, out) = run_control("fault-suite-control-lock-delay", "lock", "worker-pause", "--unrequested-lock-delay");
    assert!(
        text.lines().any(|line| line.contains(&format!("[{LOCK_DELAY_CHECK_NAME}]")) && line.contains("lock-delay")),
        "the control must name the grant inside the delay:\n{text}"
    );
    println!("{text}");
    let _ = std::fs::remove_dir_all(&out);
}

/// A rolling upgrade from the previous release (`scripts/previous-release`, built by
/// `scripts/previous-release.sh`): the nodes start on its build and are moved to this
/// one a node at a time (SIGTERM, the same data directory and flags), spread over the
/// run, while every workload runs and nodes are killed and paused.
#[test]
fn a_rolling_upgrade_from_the_previous_release_leaves_the_history_valid() {
    let previous = previous_server().unwrap_or_else(|error| panic!("{error}"));
    let seed: u64 = rand::random();
    let seed_text = seed.to_string();
    println!("rolling upgrade from {} ({}), seed {seed}", previous_release(), previous.display());
    let previous_text = previous.display().to_string();
    let (output, text, out) = run_harness(
        "fault-suite-upgrade",
        &[
            "--nodes",
            "3",
            "--time",
            RUN_TIME,
            "--seed",
            &seed_text,
            "--workload",
            "all",
            "--nemesis",
            "upgrade,kill,pause",
            "--previous-server",
            &previous_text,
        ],
    );
    expect_valid(&output, &text, &out, &format!("across a rolling upgrade (seed {seed})"));
    let line = text.lines().find(|line| line.contains(UPGRADE_CHECK_NAME)).expect("the upgrade check's line");
    assert!(line.contains(" pass ") && line.contains("3 of 3 node(s) upgraded"), "{line}");
    println!("{text}");
    let _ = std::fs::remove_dir_all(&out);
}

/// A failure's message starts with what failed: the checks that did not pass and
/// the anomalies' headings, not the operations under them, nor passing checks.
#[test]
fn a_failed_runs_message_starts_with_the_checks_that_failed() {
    let report = "operations: 10\n  acquire ok 5\nchecks:\n  tokens increase (a)      pass     5 ok grants\n  \
                  believed at once (h)     fail     1 overlapping belief\n  lock-delay (j)           skipped  none\n\
                  anomalies: 1\n  [believed at once (h)] worker 3 believed lock/0 after worker 4's grant\n      \
                  3 acquire lock/0 ok token 17\nvalid: false\nseed: 7 (rerun with --seed 7)\n";
    let why = why_invalid(report);
    assert_eq!(
        why.lines().collect::<Vec<_>>(),
        [
            "  believed at once (h)     fail     1 overlapping belief",
            "  [believed at once (h)] worker 3 believed lock/0 after worker 4's grant",
            "seed: 7 (rerun with --seed 7)",
        ]
    );
}
