//! A node started with a bad configuration or someone else's data directory exits
//! non-zero with a message that names the problem, and changes nothing on disk.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use leasehold::certs;
use leasehold_jepsen::cluster::{binary, free_ports};

/// Every file under `path` with its size and contents' length, to compare before/after.
fn snapshot(path: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut files = BTreeMap::new();
    if !path.exists() {
        return files;
    }
    for entry in walk(path) {
        let contents = std::fs::read(&entry).unwrap_or_default();
        files.insert(entry.strip_prefix(path).unwrap().display().to_string(), contents);
    }
    files
}

fn walk(path: &Path) -> Vec<std::path::PathBuf> {
    let mut found = vec![path.to_path_buf()];
    if path.is_dir() {
        for entry in std::fs::read_dir(path).unwrap() {
            found.extend(walk(&entry.unwrap().path()));
        }
    }
    found
}

struct Outcome {
    code: Option<i32>,
    stderr: String,
}

fn run_server(arguments: &[String]) -> Outcome {
    let output = Command::new(binary("leasehold-server")).args(arguments).output().expect("run leasehold-server");
    Outcome { code: output.status.code(), stderr: String::from_utf8_lossy(&output.stderr).into_owned() }
}

/// An admin token file that would do, shared by the tests of this process.
fn admin_token_file() -> PathBuf {
    static FILE: std::sync::OnceLock<tempfile::TempPath> = std::sync::OnceLock::new();
    FILE.get_or_init(|| {
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), certs::new_token("admin")).unwrap();
        file.into_temp_path()
    })
    .to_path_buf()
}

/// Two initial members, with plaintext and an admin token, so that the rule a test
/// breaks is the only one broken.
fn members() -> (Vec<String>, String, String) {
    let [client_port, peer_port, other_client_port, other_peer_port] = free_ports();
    let client = format!("127.0.0.1:{client_port}");
    let peer = format!("127.0.0.1:{peer_port}");
    let mut arguments = vec!["--insecure-plaintext".to_string(), "--admin-token-file".to_string()];
    arguments.push(admin_token_file().display().to_string());
    arguments.extend(["--initial-member".to_string(), format!("1={client},{peer}")]);
    arguments.push("--initial-member".into());
    arguments.push(format!("2=127.0.0.1:{other_client_port},127.0.0.1:{other_peer_port}"));
    (arguments, client, peer)
}

fn assert_refused(arguments: Vec<String>, data_dir: &Path, expected: &str) {
    let before = snapshot(data_dir);
    let outcome = run_server(&arguments);
    assert_ne!(outcome.code, Some(0), "the node must not start; stderr: {}", outcome.stderr);
    assert!(outcome.code.is_some(), "the node must exit, not crash");
    assert!(outcome.stderr.contains(expected), "stderr should mention {expected:?}: {}", outcome.stderr);
    assert_eq!(before, snapshot(data_dir), "the data directory changed");
}

fn base(data_dir: &Path, node_id: u64) -> Vec<String> {
    let (mut arguments, _, _) = members();
    arguments.extend(["--node-id".into(), node_id.to_string(), "--data-dir".into(), data_dir.display().to_string()]);
    arguments
}

#[test]
fn unknown_node_id_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let data_dir = root.path().join("data");
    assert_refused(base(&data_dir, 7), &data_dir, "unknown node id 7");
    assert!(!data_dir.exists(), "nothing may be created");
}

#[test]
fn election_timeout_not_above_heartbeat_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let data_dir = root.path().join("data");
    let mut arguments = base(&data_dir, 1);
    arguments.extend(["--heartbeat-ms".into(), "300".into(), "--election-timeout-min-ms".into(), "300".into()]);
    assert_refused(arguments, &data_dir, "must be above the heartbeat interval");
    assert!(!data_dir.exists());
}

#[test]
fn zero_worker_threads_is_refused_with_exit_code_2() {
    let root = tempfile::tempdir().unwrap();
    let data_dir = root.path().join("data");
    let mut arguments = base(&data_dir, 1);
    arguments.extend(["--worker-threads".into(), "0".into()]);
    let outcome = run_server(&arguments);
    assert_eq!(outcome.code, Some(2), "bad configuration exits with 2; stderr: {}", outcome.stderr);
    assert!(outcome.stderr.contains("--worker-threads 0 is not between 1 and"), "stderr: {}", outcome.stderr);
    assert!(!data_dir.exists(), "nothing may be created");
}

#[test]
fn a_lock_delay_default_out_of_range_or_malformed_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let data_dir = root.path().join("data");
    for (entry, expected) in [
        ("reports/=60001", "60001 ms is above the limit of 60000 ms (LOCK_DELAY_MS_MAX)"),
        ("reports/", "a lock-delay default is written PREFIX=MS"),
        ("reports/=soon", "\"soon\" is not a number of milliseconds"),
    ] {
        let mut arguments = base(&data_dir, 1);
        arguments.extend(["--lock-delay-default".into(), entry.into()]);
        assert_refused(arguments, &data_dir, expected);
    }
    let mut twice = base(&data_dir, 1);
    twice.extend(["--lock-delay-default".into(), "a/=1".into(), "--lock-delay-default".into(), "a/=2".into()]);
    assert_refused(twice, &data_dir, "the prefix \"a/\" is given twice");
    assert!(!data_dir.exists(), "nothing may be created");
}

#[test]
fn a_malformed_watch_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let data_dir = root.path().join("data");
    for (entry, expected) in [
        ("weekly-report", "names no tenant: write TENANT:NAME"),
        ("ops:", "an empty name"),
        ("Ops:cron/*", "is not a tenant name"),
        ("ops:cron*/x", "'*' may only end a prefix, as in cron/*"),
    ] {
        let mut arguments = base(&data_dir, 1);
        arguments.extend(["--watch".into(), entry.into()]);
        assert_refused(arguments, &data_dir, expected);
    }
    let mut twice = base(&data_dir, 1);
    twice.extend(["--watch".into(), "ops:cron/*".into(), "--watch".into(), "ops:cron/*".into()]);
    assert_refused(twice, &data_dir, "--watch \"ops:cron/*\" is given twice");
    assert!(!data_dir.exists(), "nothing may be created");
}

#[test]
fn a_port_in_use_is_refused_before_the_data_directory_is_touched() {
    let root = tempfile::tempdir().unwrap();
    let data_dir = root.path().join("data");
    let (members, client, _) = members();
    let _occupant = std::net::TcpListener::bind(&client).expect("occupy the client port");
    let mut arguments = members;
    arguments.extend(["--node-id".into(), "1".into(), "--data-dir".into(), data_dir.display().to_string()]);
    assert_refused(arguments, &data_dir, &format!("cannot listen on the client address {client}"));
    assert!(!data_dir.exists());
}

#[test]
fn a_status_page_address_that_is_malformed_or_taken_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let data_dir = root.path().join("data");
    let mut malformed = base(&data_dir, 1);
    malformed.extend(["--status-addr".into(), "localhost".into()]);
    assert_refused(malformed, &data_dir, "--status-addr \"localhost\" is not a host:port address");
    let occupant = std::net::TcpListener::bind("127.0.0.1:0").expect("occupy a port");
    let taken = occupant.local_addr().unwrap();
    let mut in_use = base(&data_dir, 1);
    in_use.extend(["--status-addr".into(), taken.to_string()]);
    assert_refused(in_use, &data_dir, &format!("cannot listen on the status page address {taken}"));
    assert!(!data_dir.exists(), "nothing may be created");
}

#[test]
fn a_foreign_data_directory_is_refused_and_left_alone() {
    let root = tempfile::tempdir().unwrap();
    let data_dir = root.path().join("photos");
    std::fs::create_dir(&data_dir).unwrap();
    std::fs::write(data_dir.join("holiday.jpg"), b"not leasehold data").unwrap();
    assert_refused(base(&data_dir, 1), &data_dir, "not a Leasehold data directory");
}

#[test]
fn a_data_directory_of_another_node_or_cluster_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let data_dir = root.path().join("node");
    std::fs::create_dir(&data_dir).unwrap();
    std::fs::create_dir(data_dir.join("db")).unwrap();
    std::fs::write(data_dir.join("LEASEHOLD"), "format = 2\ncluster_name = \"leasehold\"\nnode_id = 2\n").unwrap();
    assert_refused(base(&data_dir, 1), &data_dir, "belongs to node 2, not to node 1");

    let mut other_cluster = base(&data_dir, 2);
    other_cluster.extend(["--cluster-name".into(), "payments".into()]);
    assert_refused(other_cluster, &data_dir, "belongs to cluster \"leasehold\"");
}

#[test]
fn a_data_directory_of_an_older_format_is_refused_with_what_to_do() {
    let root = tempfile::tempdir().unwrap();
    let data_dir = root.path().join("node");
    std::fs::create_dir_all(data_dir.join("db")).unwrap();
    std::fs::write(data_dir.join("LEASEHOLD"), "format = 1\ncluster_name = \"leasehold\"\nnode_id = 1\n").unwrap();
    assert_refused(base(&data_dir, 1), &data_dir, "was written in format 1 but this build reads format 2");
}

#[test]
fn a_corrupt_identity_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let data_dir = root.path().join("node");
    std::fs::create_dir(&data_dir).unwrap();
    std::fs::write(data_dir.join("LEASEHOLD"), "\u{0}garbage[").unwrap();
    assert_refused(base(&data_dir, 1), &data_dir, "corrupt");
}

#[test]
fn an_unreadable_data_directory_is_refused() {
    let root = tempfile::tempdir().unwrap();
    // A path through a regular file cannot be read as a directory, even by root.
    let file = root.path().join("plain-file");
    std::fs::write(&file, b"x").unwrap();
    let data_dir = file.join("data");
    assert_refused(base(&data_dir, 1), &file, "cannot be read");
}

/// `base` without --insecure-plaintext, with the TLS flags `tls` adds.
fn with_tls(data_dir: &Path, tls: &[(&str, PathBuf)]) -> Vec<String> {
    let mut arguments: Vec<String> =
        base(data_dir, 1).into_iter().filter(|flag| flag != "--insecure-plaintext").collect();
    for (flag, path) in tls {
        arguments.push(flag.to_string());
        arguments.push(path.display().to_string());
    }
    arguments
}

#[test]
fn tls_is_required_unless_plaintext_is_asked_for_and_its_files_must_load() {
    let root = tempfile::tempdir().unwrap();
    let data_dir = root.path().join("data");
    let exit_2 = |arguments: Vec<String>, expected: &str| {
        let outcome = run_server(&arguments);
        assert_eq!(outcome.code, Some(2), "a bad TLS configuration exits with 2; stderr: {}", outcome.stderr);
        assert!(outcome.stderr.contains(expected), "stderr should mention {expected:?}: {}", outcome.stderr);
    };
    exit_2(with_tls(&data_dir, &[]), "TLS needs --tls-cert, --tls-key, --peer-cert, --peer-key, --peer-ca");

    let directory = root.path().join("certs");
    std::fs::create_dir(&directory).unwrap();
    let ca_pem = certs::new_ca().unwrap();
    let (ca, _) = certs::write_pair(&directory, "ca", &ca_pem).unwrap();
    let (cert, key) =
        certs::write_pair(&directory, "node-1", &certs::node_certificate(&ca_pem.key, 1, &[]).unwrap()).unwrap();
    let (_, other_key) =
        certs::write_pair(&directory, "node-2", &certs::node_certificate(&ca_pem.key, 2, &[]).unwrap()).unwrap();
    let missing = directory.join("missing.pem");
    let complete = |cert: &PathBuf, key: &PathBuf, ca: &PathBuf| {
        vec![
            ("--tls-cert", cert.clone()),
            ("--tls-key", key.clone()),
            ("--peer-cert", cert.clone()),
            ("--peer-key", key.clone()),
            ("--peer-ca", ca.clone()),
        ]
    };
    exit_2(with_tls(&data_dir, &complete(&missing, &key, &ca)), &format!("client port TLS: {}", missing.display()));
    exit_2(with_tls(&data_dir, &complete(&cert, &other_key, &ca)), "the key does not fit the certificate");
    exit_2(with_tls(&data_dir, &complete(&cert, &key, &key)), "no PEM certificate");
    let mut plaintext_too = with_tls(&data_dir, &complete(&cert, &key, &ca));
    plaintext_too.push("--insecure-plaintext".into());
    exit_2(plaintext_too, "was given with --insecure-plaintext");
    // Metrics over TLS are served to a scraper with the scrape token only.
    let [metrics_port] = free_ports();
    let mut open_metrics = with_tls(&data_dir, &complete(&cert, &key, &ca));
    open_metrics.extend(["--metrics-addr".into(), format!("127.0.0.1:{metrics_port}")]);
    exit_2(open_metrics.clone(), "--metrics-addr needs --metrics-token-file");
    let weak = directory.join("weak.token");
    std::fs::write(&weak, "scrape\n").unwrap();
    open_metrics.extend(["--metrics-token-file".into(), weak.display().to_string()]);
    exit_2(open_metrics, "the scrape token in");
    assert!(!data_dir.exists(), "nothing may be created");
}

#[test]
fn the_admin_token_file_is_required_and_must_hold_a_real_secret() {
    let root = tempfile::tempdir().unwrap();
    let data_dir = root.path().join("data");
    let without: Vec<String> = {
        let arguments = base(&data_dir, 1);
        let at = arguments.iter().position(|flag| flag == "--admin-token-file").unwrap();
        arguments[..at].iter().chain(&arguments[at + 2..]).cloned().collect()
    };
    let outcome = run_server(&without);
    assert_eq!(outcome.code, Some(2), "stderr: {}", outcome.stderr);
    assert!(outcome.stderr.contains("--admin-token-file is required"), "stderr: {}", outcome.stderr);
    let short = root.path().join("short.token");
    std::fs::write(&short, "hunter2\n").unwrap();
    let mut weak = without.clone();
    weak.extend(["--admin-token-file".into(), short.display().to_string()]);
    let outcome = run_server(&weak);
    assert_eq!(outcome.code, Some(2), "stderr: {}", outcome.stderr);
    assert!(outcome.stderr.contains("is 7 bytes on its first line"), "stderr: {}", outcome.stderr);
    assert!(!data_dir.exists(), "nothing may be created");
}
