//! The files an operator installs (`deploy/`) are checked offline: the systemd unit
//! passes `systemd-analyze verify` with this build's server as its program, and it
//! refuses to restart exactly the exit codes that a restart cannot mend.

use std::path::{Path, PathBuf};
use std::process::Command;

use leasehold_jepsen::cluster::binary;
use leasehold_server::node::running_node::EXIT_DATA_DIRECTORY_REFUSED;
use leasehold_server::raft::incarnations::{EXIT_BUILD_TOO_OLD, EXIT_STALE_INCARNATION};

/// Where the unit calls the server; the test puts the built one there.
const INSTALLED_SERVER: &str = "/usr/local/bin/leasehold-server";
/// `leasehold-server` exits 2 on invalid configuration (src/main.rs).
const EXIT_INVALID_CONFIGURATION: i32 = 2;

fn unit_text() -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/systemd/leasehold@.service");
    std::fs::read_to_string(&path).unwrap_or_else(|error| panic!("read {}: {error}", path.display()))
}

/// `systemd-analyze verify` of `text` as the instance `leasehold@node1.service`: its
/// complaints, empty when it has none; None when systemd-analyze is not installed.
fn verify(text: &str, directory: &Path) -> Option<String> {
    let unit = directory.join("leasehold@node1.service");
    std::fs::write(&unit, text).unwrap();
    let output = match Command::new("systemd-analyze").arg("verify").arg(&unit).output() {
        Ok(output) => output,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return None,
        Err(error) => panic!("run systemd-analyze: {error}"),
    };
    let mut complaints = String::from_utf8_lossy(&output.stdout).into_owned();
    complaints.push_str(&String::from_utf8_lossy(&output.stderr));
    if !output.status.success() && complaints.trim().is_empty() {
        complaints = format!("exited with {}", output.status);
    }
    Some(complaints.trim().to_string())
}

#[test]
fn the_systemd_unit_verifies_and_a_broken_one_does_not() {
    let directory = tempfile::tempdir().unwrap();
    let server = binary("leasehold-server");
    let text = unit_text();
    assert!(text.contains(INSTALLED_SERVER), "the unit runs {INSTALLED_SERVER}");
    let unit = text.replace(INSTALLED_SERVER, server.to_str().unwrap());
    let Some(complaints) = verify(&unit, directory.path()) else {
        eprintln!("skipped: systemd-analyze is not installed (Debian's systemd package has it)");
        return;
    };
    assert_eq!(complaints, "", "systemd-analyze verify complained about deploy/systemd/leasehold@.service");

    // The check finds what it is for: a key systemd does not know (a misspelt one),
    // a program that is not there.
    let misspelt = unit.replace("RestartSec=2s", "RestartSecs=2s");
    let complaints = verify(&misspelt, directory.path()).unwrap();
    assert!(complaints.contains("Unknown key"), "{complaints}");
    let missing = text.replace(INSTALLED_SERVER, "/nonexistent/leasehold-server");
    let complaints = verify(&missing, directory.path()).unwrap();
    assert!(complaints.contains("is not executable"), "{complaints}");
}

#[test]
fn the_unit_does_not_restart_a_node_that_a_restart_cannot_mend() {
    let text = unit_text();
    let line = text
        .lines()
        .find_map(|line| line.strip_prefix("RestartPreventExitStatus="))
        .expect("a RestartPreventExitStatus= line");
    let mut codes: Vec<i32> = line.split_whitespace().map(|code| code.parse().expect("a number")).collect();
    codes.sort_unstable();
    let mut expected = vec![
        EXIT_INVALID_CONFIGURATION,
        i32::from(EXIT_DATA_DIRECTORY_REFUSED),
        EXIT_STALE_INCARNATION,
        EXIT_BUILD_TOO_OLD,
    ];
    expected.sort_unstable();
    assert_eq!(codes, expected, "invalid configuration, a refused directory, a stale incarnation, an older build");
    assert!(text.contains("\nRestart=on-failure\n"), "every other failure is restarted");
    assert!(text.contains("\nExecReload=/bin/kill -HUP $MAINPID\n"), "reload is SIGHUP");
    assert!(text.contains("--config /etc/leasehold/%i.toml"), "one configuration file per instance");
}
