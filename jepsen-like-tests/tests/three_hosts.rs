//! The README's three-machine setup by hand: `scripts/three-hosts.sh` makes three hosts
//! (network namespaces on a bridge, each with its own address, host name,
//! `/etc/leasehold` and `/var/lib`) and runs the files of `deploy/three-machines/`
//! verbatim there, with certificates from `leasehold cert`: a tenant, a fenced lock, a
//! follower replaced, the leader cut off by nftables and healed, the leader killed
//! with SIGKILL and restarted. The script must pass; exit 77 means it could not run
//! here (no root and no user namespaces, or a tool missing) and is printed as a skip.
//!
//! The files must also be what the server reads: each parses as its configuration
//! file (unknown keys are refused), names its own node, and the three differ only in
//! the lines that name the node. The server has no flag that validates a file
//! without starting; the script starts each node on its file, which validates it.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use leasehold_jepsen::cluster::binary;
use leasehold_server::node::config::RawConfig;

/// What the script exits with when it cannot run here (automake's "skipped").
const EXIT_SKIPPED: i32 = 77;
/// The script's whole run: about 10 s on the 2-core machine; each of its waits has
/// a deadline of its own, and this one bounds their sum.
const SCRIPT_DEADLINE_MS: u64 = 240_000;
/// How often the test looks whether the script ended.
const POLL_INTERVAL_MS: u64 = 100;
/// After SIGTERM at the deadline, how long the script has to end its namespaces.
const STOP_GRACE_MS: u64 = 10_000;
const NODES: [u64; 3] = [1, 2, 3];
/// The README's section that shows node1.toml verbatim.
const README_SECTION: &str = "Three machines by hand";

fn repository() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn config_path(id: u64) -> PathBuf {
    repository().join(format!("deploy/three-machines/node{id}.toml"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|error| panic!("read {}: {error}", path.display()))
}

#[test]
fn the_three_hosts_script_passes() {
    let bin_dir = binary("leasehold-server").parent().expect("the binaries' directory").to_path_buf();
    let script = repository().join("scripts/three-hosts.sh");
    let output_path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("three-hosts.out");
    let output = std::fs::File::create(&output_path).expect("create the script's output file");
    let started = Instant::now();
    let mut child = Command::new("bash")
        .arg(&script)
        .env("LEASEHOLD_BIN_DIR", &bin_dir)
        .env_remove("LEASEHOLD_THREE_HOSTS_KEEP")
        .env_remove("LEASEHOLD_REQUEST_TIMEOUT")
        .stdin(Stdio::null())
        .stdout(output.try_clone().expect("share the output file"))
        .stderr(output)
        .spawn()
        .unwrap_or_else(|error| panic!("run {}: {error}", script.display()));
    let deadline = started + Duration::from_millis(SCRIPT_DEADLINE_MS);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the script") {
            break Some(status);
        }
        if Instant::now() >= deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(POLL_INTERVAL_MS));
    };
    let status = status.unwrap_or_else(|| {
        // The script's own process: its trap ends the namespaces, and everything in them.
        let pid = libc::pid_t::try_from(child.id()).expect("a process id");
        // SAFETY: kill has no memory preconditions; the process is our child, not yet reaped.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let grace = Instant::now() + Duration::from_millis(STOP_GRACE_MS);
        while child.try_wait().expect("wait for the script").is_none() && Instant::now() < grace {
            std::thread::sleep(Duration::from_millis(POLL_INTERVAL_MS));
        }
        let _ = child.kill();
        let _ = child.wait();
        panic!(
            "scripts/three-hosts.sh did not end within {SCRIPT_DEADLINE_MS} ms; its output:\n{}",
            read(&output_path)
        );
    });
    let text = read(&output_path);
    let seconds = started.elapsed().as_secs_f64();
    match status.code() {
        Some(0) => {
            assert!(text.contains("three-hosts: PASSED"), "exit 0 without the PASSED line:\n{text}");
            eprintln!("scripts/three-hosts.sh passed in {seconds:.1} s");
        }
        Some(EXIT_SKIPPED) => {
            let reason = text.lines().find(|line| line.contains("SKIPPED")).unwrap_or("no reason printed");
            eprintln!("skipped: {reason}");
        }
        _ => panic!("scripts/three-hosts.sh failed ({status}) after {seconds:.1} s:\n{text}"),
    }
}

#[test]
fn the_three_machine_files_are_server_configuration_files() {
    let members = NODES.map(|id| format!("{id}=node{id}.example:7100,node{id}.example:7200")).to_vec();
    for id in NODES {
        let path = config_path(id);
        let raw = RawConfig::from_toml_file(&path).unwrap_or_else(|error| panic!("{error}"));
        let file = |name: &str| Some(PathBuf::from(format!("/etc/leasehold/{name}")));
        assert_eq!(raw.node_id, Some(id), "{}", path.display());
        assert_eq!(raw.data_dir, Some(PathBuf::from("/var/lib/leasehold")));
        assert_eq!(raw.cluster_name.as_deref(), Some("payments"));
        assert_eq!(raw.initial_members, members, "every node is started with the same members");
        assert_eq!(raw.client_addr, None, "the client address is this node's initial member entry");
        assert_eq!(raw.peer_addr, None, "the peer address is this node's initial member entry");
        assert_eq!(raw.metrics_addr, Some(format!("node{id}.example:7300")));
        assert_eq!(raw.status_addr, Some(format!("node{id}.example:7400")));
        assert_eq!(raw.metrics_token_file, file("scrape.token"));
        assert_eq!(raw.tls_cert, file(&format!("node{id}.pem")));
        assert_eq!(raw.tls_key, file(&format!("node{id}.key")));
        assert_eq!(raw.peer_cert, file(&format!("node{id}.pem")));
        assert_eq!(raw.peer_key, file(&format!("node{id}.key")));
        assert_eq!(raw.client_ca, file("ca.pem"));
        assert_eq!(raw.peer_ca, file("ca.pem"));
        assert_eq!(raw.admin_token_file, file("admin.token"));
        assert!(!raw.insecure_plaintext);
    }

    // The files differ only in the lines that name their node (not the members' list).
    let generic = |id: u64| -> String {
        read(&config_path(id))
            .lines()
            .map(|line| {
                if line.trim_start().starts_with('"') {
                    line.to_string()
                } else {
                    line.replace(&format!("node{id}"), "nodeN")
                        .replace(&format!("node-{id}"), "node-N")
                        .replace(&format!("node_id = {id}"), "node_id = N")
                }
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_eq!(generic(2), generic(1), "node2.toml differs from node1.toml in more than its node");
    assert_eq!(generic(3), generic(1), "node3.toml differs from node1.toml in more than its node");

    // The parse is strict: a misspelt key is refused, so the check above can fail.
    let directory = tempfile::tempdir().expect("a temporary directory");
    let misspelt = directory.path().join("node1.toml");
    std::fs::write(&misspelt, read(&config_path(1)).replace("metrics_token_file", "metrics_token_files")).unwrap();
    let error = RawConfig::from_toml_file(&misspelt).expect_err("an unknown key must be refused");
    assert!(error.0.contains("metrics_token_files"), "{error}");
}

#[test]
fn the_readme_shows_node1_toml_verbatim() {
    let readme = read(&repository().join("README.md"));
    assert!(readme.contains(README_SECTION), "README.md has no section {README_SECTION:?}");
    let text = read(&config_path(1));
    assert!(
        readme.contains(&format!("```toml\n{text}```")),
        "README.md does not show deploy/three-machines/node1.toml verbatim in a toml block"
    );
    assert!(readme.contains("deploy/three-machines/node1.toml"), "README.md does not name the file it shows");
    assert!(readme.contains("scripts/three-hosts.sh"), "README.md does not name the script that runs the files");
}
