//! The short fault suite, run by the normal test command: the `leasehold-jepsen
//! run` harness on 3 nodes with every nemesis, with a fixed seed and a random one
//! (printed), must end `valid: true`; the control with fencing switched off must
//! end `valid: false` with the lost writes listed.
//!
//! The harness runs in its own network and pid namespaces (it re-executes itself
//! under `unshare`): nothing it starts outlives it.

use std::path::PathBuf;
use std::process::{Command, Output};

use leasehold_jepsen::cluster::binary;

/// The fixed seed of the suite; the second run's seed is random.
const FIXED_SEED: u64 = 20_261_130;
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

fn assert_valid(seed: u64) {
    let name = format!("fault-suite-{seed}");
    let seed_text = seed.to_string();
    println!("fault suite: seed {seed}");
    let (output, text, out) = run_harness(
        &name,
        &["--nodes", "3", "--time", RUN_TIME, "--seed", &seed_text, "--workload", "all", "--nemesis", "all"],
    );
    assert!(
        output.status.success() && text.contains("\nvalid: true"),
        "the fault suite with seed {seed} is not valid (exit {:?}); kept under {}:\n{text}",
        output.status.code(),
        out.display()
    );
    println!("{text}");
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn every_nemesis_leaves_the_history_valid() {
    assert_valid(FIXED_SEED);
    assert_valid(rand::random());
}

#[test]
fn without_fencing_worker_pauses_lose_writes() {
    let seed = FIXED_SEED.to_string();
    let (output, text, out) = run_harness(
        "fault-suite-control",
        &[
            "--nodes",
            "3",
            "--time",
            CONTROL_TIME,
            "--seed",
            &seed,
            "--workload",
            "fenced-counter",
            "--nemesis",
            "worker-pause",
            "--no-fencing",
        ],
    );
    assert_eq!(output.status.code(), Some(1), "the unfenced control must fail its checks:\n{text}");
    assert!(text.contains("\nvalid: false"), "{text}");
    assert!(
        text.contains("acknowledged increment lost") || text.contains("stale write accepted"),
        "the control must list lost or stale writes:\n{text}"
    );
    println!("{text}");
    let _ = std::fs::remove_dir_all(&out);
}
