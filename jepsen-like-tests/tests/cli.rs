//! The `leasehold` CLI against a real cluster, and its exit codes: one test per code
//! that a test can reach (`leasehold --help` has the table).

use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use leasehold_jepsen::cluster::{binary, free_ports, ClusterOptions, TestCluster};

/// How long a `leasehold` command that should end on its own may take.
const COMMAND_DEADLINE_MS: u64 = 30_000;

fn leasehold(cluster: &TestCluster) -> Command {
    let mut command = Command::new(binary("leasehold"));
    command.envs(cluster.client_env());
    command.env_remove("LEASEHOLD_REQUEST_TIMEOUT");
    command
}

/// The CLI pointed at `endpoints` where no cluster runs, with credentials that would
/// do: whatever fails is the connection.
fn leasehold_at(endpoints: &str) -> Command {
    static TOKEN_FILE: std::sync::OnceLock<tempfile::TempPath> = std::sync::OnceLock::new();
    let token_file = TOKEN_FILE.get_or_init(|| {
        let file = tempfile::NamedTempFile::new().expect("a temporary file");
        std::fs::write(file.path(), "a-token-nobody-checks\n").expect("write the token");
        file.into_temp_path()
    });
    let mut command = Command::new(binary("leasehold"));
    command
        .env("LEASEHOLD_ENDPOINTS", endpoints)
        .env("LEASEHOLD_INSECURE_PLAINTEXT", "1")
        .env("LEASEHOLD_TOKEN_FILE", token_file)
        .env("LEASEHOLD_ADMIN_TOKEN_FILE", token_file);
    command.env_remove("LEASEHOLD_REQUEST_TIMEOUT").env_remove("LEASEHOLD_CA_FILE");
    command
}

/// One node is enough for the exit codes, and starts faster than three.
async fn single_node_cluster() -> TestCluster {
    let cluster = TestCluster::start(ClusterOptions { nodes: 1, ..ClusterOptions::default() });
    cluster.wait_for_leader(Duration::from_secs(20)).await;
    cluster
}

/// How `child` ended, waited for at most `within`; else the test fails with `why`.
async fn exit_within(child: &mut std::process::Child, within: Duration, why: &str) -> std::process::ExitStatus {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(started.elapsed() < within, "{why}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Runs `command` to its end, or fails the test after `COMMAND_DEADLINE_MS`.
async fn run(command: Command, reason: &str) -> Output {
    let deadline = Duration::from_millis(COMMAND_DEADLINE_MS);
    let mut command = tokio::process::Command::from(command);
    command.kill_on_drop(true);
    match tokio::time::timeout(deadline, command.output()).await {
        Ok(output) => output.expect("run leasehold"),
        Err(_) => panic!("timed out after {deadline:?} waiting for: {reason}"),
    }
}

/// Runs `leasehold ARGUMENTS` and checks its exit code; returns (stdout, stderr).
async fn expect_exit(mut command: Command, arguments: &[&str], code: i32) -> (String, String) {
    command.args(arguments);
    let output = run(command, &format!("leasehold {arguments:?}")).await;
    let (stdout, stderr) =
        (String::from_utf8_lossy(&output.stdout).into_owned(), String::from_utf8_lossy(&output.stderr).into_owned());
    assert_eq!(output.status.code(), Some(code), "leasehold {arguments:?}\nstdout: {stdout}\nstderr: {stderr}");
    (stdout, stderr)
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

    let status = exit_within(&mut holder, Duration::from_secs(10), "leasehold lock did not exit after resuming").await;
    assert_eq!(status.code(), Some(70), "exit 70 when the lock was lost");
    // SAFETY: probing whether the command's process still exists.
    let alive = unsafe { libc::kill(child_pid, 0) } == 0;
    assert!(!alive, "the command must have been terminated");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn help_and_version_exit_0_and_a_wrong_command_line_exits_64() {
    // Nothing is contacted: the command line is refused before any request.
    let [port] = free_ports();
    let nowhere = format!("127.0.0.1:{port}");
    let (help, _) = expect_exit(leasehold_at(&nowhere), &["--help"], 0).await;
    for code in ["0 ", "1 ", "64 ", "69 ", "70 ", "71 ", "74 ", "75 ", "76 ", "126 ", "127 "] {
        assert!(help.lines().any(|line| line.trim_start().starts_with(code)), "--help lists exit code {code}:\n{help}");
    }
    expect_exit(leasehold_at(&nowhere), &["--version"], 0).await;
    let (_, stderr) = expect_exit(leasehold_at(&nowhere), &["--no-such-flag", "status"], 64).await;
    assert!(stderr.contains("--no-such-flag"), "{stderr}");
    let (_, stderr) = expect_exit(leasehold_at(&nowhere), &["lock", "a", "--ttl", "10x", "--", "true"], 64).await;
    assert!(stderr.contains("10x"), "the error names the bad duration: {stderr}");
    expect_exit(leasehold_at(&nowhere), &["sem", "a", "--wait", "soon", "--limit", "2"], 64).await;
    expect_exit(leasehold_at(&nowhere), &["--request-timeout", "1 fortnight", "status"], 64).await;
    expect_exit(leasehold_at(&nowhere), &["fence", "check", "a", "not-a-token"], 64).await;
    expect_exit(leasehold_at(&nowhere), &[], 64).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_the_server_finds_malformed_exits_64() {
    let cluster = single_node_cluster().await;
    let name = "n".repeat(300);
    let (_, stderr) = expect_exit(leasehold(&cluster), &["lock", &name, "--try", "--", "true"], 64).await;
    assert!(stderr.contains("invalid request"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fence_check_exits_0_for_the_current_token_and_1_for_a_superseded_one() {
    let cluster = single_node_cluster().await;
    let session = cluster.client().session(Duration::from_secs(10)).await.unwrap();
    let first = session.try_lock("fenced").await.unwrap().expect("the lock is free");
    let first_token = first.token().to_string();
    let (stdout, _) = expect_exit(leasehold(&cluster), &["fence", "check", "fenced", &first_token], 0).await;
    assert!(stdout.starts_with("current:"), "{stdout}");

    first.release().await.unwrap();
    let (stdout, _) = expect_exit(leasehold(&cluster), &["fence", "check", "fenced", &first_token], 1).await;
    assert!(stdout.contains("is free now"), "{stdout}");

    let second = session.try_lock("fenced").await.unwrap().expect("the lock is free again");
    let second_token = second.token().to_string();
    let (stdout, _) = expect_exit(leasehold(&cluster), &["fence", "check", "fenced", &first_token], 1).await;
    assert!(stdout.contains(&format!("is token {second_token}")), "{stdout}");
    expect_exit(leasehold(&cluster), &["fence", "check", "fenced", &second_token], 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_reachable_node_exits_69() {
    // A reserved port nothing listens on: every connection is refused.
    let [port] = free_ports();
    let nowhere = format!("127.0.0.1:{port}");
    let (stdout, _) = expect_exit(leasehold_at(&nowhere), &["status"], 69).await;
    assert!(stdout.contains("unreachable"), "{stdout}");
    let (_, stderr) = expect_exit(leasehold_at(&nowhere), &["member", "list"], 69).await;
    assert!(stderr.contains("unavailable"), "{stderr}");
    // A request never sent (the connection was refused) is unavailable, not
    // indeterminate: a cron job's `fence check` must not read it as "superseded".
    let (_, stderr) =
        expect_exit(leasehold_at(&nowhere), &["--request-timeout", "1s", "fence", "check", "x", "5"], 69).await;
    assert!(stderr.contains("unavailable"), "{stderr}");
    let (_, stderr) =
        expect_exit(leasehold_at(&nowhere), &["--request-timeout", "1s", "lock", "x", "--try", "--", "true"], 69).await;
    assert!(stderr.contains("unavailable"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_a_paused_node_never_answers_exits_74() {
    let cluster = single_node_cluster().await;
    // The kernel still accepts connections to the stopped node, so each request is
    // sent and never answered: it may have taken effect.
    cluster.pause(1);
    let started = Instant::now();
    let (_, stderr) =
        expect_exit(leasehold(&cluster), &["--request-timeout", "1s", "lock", "paused", "--try", "--", "true"], 74)
            .await;
    assert!(stderr.contains("indeterminate"), "{stderr}");
    let (_, stderr) =
        expect_exit(leasehold(&cluster), &["fence", "check", "paused", "1", "--request-timeout", "1s"], 74).await;
    assert!(stderr.contains("indeterminate"), "{stderr}");
    assert!(started.elapsed() < Duration::from_secs(15), "--request-timeout 1s gave up after {:?}", started.elapsed());
    cluster.resume(1);
    cluster.wait_for_leader(Duration::from_secs(20)).await;
    expect_exit(leasehold(&cluster), &["fence", "check", "paused", "1"], 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_a_permit_or_leadership_that_is_taken_exits_75() {
    let cluster = single_node_cluster().await;
    let session = cluster.client().session(Duration::from_secs(10)).await.unwrap();
    let _lock = session.try_lock("busy").await.unwrap().expect("the lock is free");
    let _permit = session.semaphore("full", 1).try_acquire().await.unwrap().expect("a permit is free");
    let _leadership = session.campaign_within("led", "first", Duration::ZERO).await.unwrap().expect("vacant");

    let (_, stderr) = expect_exit(leasehold(&cluster), &["lock", "busy", "--try", "--", "true"], 75).await;
    assert!(stderr.contains("is held by session"), "{stderr}");
    let (_, stderr) = expect_exit(leasehold(&cluster), &["lock", "busy", "--wait", "300ms", "--", "true"], 75).await;
    assert!(stderr.contains("waited"), "{stderr}");
    let (_, stderr) =
        expect_exit(leasehold(&cluster), &["sem", "full", "--limit", "1", "--try", "--", "true"], 75).await;
    assert!(stderr.contains("is full"), "{stderr}");
    let (_, stderr) = expect_exit(leasehold(&cluster), &["elect", "led", "second", "--try", "--", "true"], 75).await;
    assert!(stderr.contains("not elected"), "{stderr}");
    expect_exit(leasehold(&cluster), &["elect", "led", "second", "--wait", "300ms", "--", "true"], 75).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_the_server_refuses_exits_76() {
    let cluster = single_node_cluster().await;
    let session = cluster.client().session(Duration::from_secs(10)).await.unwrap();
    let _permit = session.semaphore("pool", 3).try_acquire().await.unwrap().expect("a permit is free");
    let (_, stderr) =
        expect_exit(leasehold(&cluster), &["sem", "pool", "--limit", "2", "--try", "--", "true"], 76).await;
    assert!(stderr.contains("refused"), "{stderr}");
    expect_exit(leasehold(&cluster), &["sem", "pool", "--limit", "3", "--try", "--", "true"], 0).await;

    let unknown = (session.id() + 1_000_000).to_string();
    let (_, stderr) = expect_exit(leasehold(&cluster), &["describe", "session", &unknown], 76).await;
    assert!(stderr.contains("not found"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_that_cannot_be_run_exits_127_or_126_and_the_lock_is_given_back() {
    let cluster = single_node_cluster().await;
    let (_, stderr) =
        expect_exit(leasehold(&cluster), &["lock", "runs", "--try", "--", "/nonexistent/leasehold-test-command"], 127)
            .await;
    assert!(stderr.contains("cannot run"), "{stderr}");

    let not_executable = tempfile::NamedTempFile::new().unwrap();
    std::fs::set_permissions(not_executable.path(), std::fs::Permissions::from_mode(0o644)).unwrap();
    let path = not_executable.path().display().to_string();
    let (_, stderr) =
        expect_exit(leasehold(&cluster), &["sem", "runs", "--limit", "1", "--try", "--", &path], 126).await;
    assert!(stderr.contains("cannot run"), "{stderr}");

    // Both were released when the command could not start, not left to expire.
    expect_exit(leasehold(&cluster), &["lock", "runs", "--try", "--", "true"], 0).await;
    expect_exit(leasehold(&cluster), &["sem", "runs", "--limit", "1", "--try", "--", "true"], 0).await;
    // A command's own code passes through.
    expect_exit(leasehold(&cluster), &["lock", "runs", "--try", "--", "sh", "-c", "exit 3"], 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_list_shows_permits_leaderships_and_campaigns() {
    let cluster = single_node_cluster().await;
    let client = cluster.client();
    let holder = client.session(Duration::from_secs(10)).await.unwrap();
    let lock = holder.try_lock("orders/42").await.unwrap().expect("the lock is free");
    let permit = holder.semaphore("tenant-42", 2).try_acquire().await.unwrap().expect("a permit is free");
    let leadership = holder.campaign_within("scheduler", "a", Duration::ZERO).await.unwrap().expect("vacant");
    // Another session campaigns for the same election in the background.
    let candidate = client.session(Duration::from_secs(10)).await.unwrap();
    let candidate_id = candidate.id().to_string();
    let campaign =
        tokio::spawn(async move { candidate.campaign_within("scheduler", "b", Duration::from_secs(60)).await });

    let text = leasehold_jepsen::wait::until(Duration::from_secs(20), "the candidate's campaign to show", || {
        let mut command = leasehold(&cluster);
        command.args(["session", "list"]);
        let candidate_id = candidate_id.clone();
        async move {
            let output = run(command, "session list").await;
            assert!(output.status.success(), "{output:?}");
            let text = String::from_utf8_lossy(&output.stdout).into_owned();
            let candidate_row = text.lines().find(|line| line.starts_with(&format!("{candidate_id} ")))?;
            candidate_row.contains("election scheduler").then_some(text)
        }
    })
    .await;
    let header = text.lines().next().unwrap();
    for column in ["SESSION", "TTL", "CLIENT", "LOCKS (token)", "PERMITS (token)", "LEADS (token)", "WAITS FOR"] {
        assert!(header.contains(column), "{text}");
    }
    let holder_row =
        text.lines().find(|line| line.starts_with(&format!("{} ", holder.id()))).expect("the holder's row");
    for held in [
        format!("orders/42 ({})", lock.token()),
        format!("tenant-42 ({})", permit.token()),
        format!("scheduler ({})", leadership.token()),
    ] {
        assert!(holder_row.contains(&held), "{held} in {text}");
    }

    let (stdout, _) = expect_exit(leasehold(&cluster), &["session", "list", "--json"], 0).await;
    let sessions: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let holder_json = sessions.as_array().unwrap().iter().find(|row| row["session_id"] == holder.id()).unwrap();
    assert_eq!(holder_json["permits"][0]["token"], permit.token());
    assert_eq!(holder_json["leading"][0]["name"], "scheduler");
    campaign.abort();
}

/// `tenant list --json`'s row for `name`, if it is listed.
async fn tenant_row(cluster: &TestCluster, name: &str) -> Option<serde_json::Value> {
    let (stdout, _) = expect_exit(leasehold(cluster), &["tenant", "list", "--json"], 0).await;
    let tenants: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    tenants.as_array().unwrap().iter().find(|tenant| tenant["name"] == name).cloned()
}

/// The CLI acting as the tenant whose token is in `token_file`.
fn leasehold_as(cluster: &TestCluster, token_file: &std::path::Path) -> Command {
    let mut command = leasehold(cluster);
    command.env("LEASEHOLD_TOKEN_FILE", token_file);
    command
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_added_by_the_admin_locks_with_its_token_until_rotated_and_removed() {
    let cluster = single_node_cluster().await;
    let directory = tempfile::tempdir().unwrap();
    let token_file = directory.path().join("payments.token");
    let token_file_text = token_file.display().to_string();

    let (stdout, _) = expect_exit(
        leasehold(&cluster),
        &["tenant", "add", "payments", "--max-sessions", "5", "--token-file", &token_file_text],
        0,
    )
    .await;
    assert_eq!(stdout, format!("{token_file_text}\n"), "only the path is printed, never the token");
    let mode = std::fs::metadata(&token_file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the token file is readable by its owner only");
    let first_token = std::fs::read_to_string(&token_file).unwrap();
    assert!(first_token.starts_with("tenant_"), "{first_token}");
    expect_exit(leasehold_as(&cluster, &token_file), &["lock", "payments/1", "--try", "--", "true"], 0).await;

    // Rotated: the old token is refused, the new one (written over the file) works.
    let old_token_file = directory.path().join("old.token");
    std::fs::write(&old_token_file, &first_token).unwrap();
    let (stdout, _) =
        expect_exit(leasehold(&cluster), &["tenant", "rotate-token", "payments", "--token-file", &token_file_text], 0)
            .await;
    assert_eq!(stdout, format!("{token_file_text}\n"));
    assert_ne!(std::fs::read_to_string(&token_file).unwrap(), first_token);
    let (_, stderr) =
        expect_exit(leasehold_as(&cluster, &old_token_file), &["lock", "payments/1", "--try", "--", "true"], 77).await;
    assert!(stderr.contains("unauthenticated"), "{stderr}");
    expect_exit(leasehold_as(&cluster, &token_file), &["lock", "payments/1", "--try", "--", "true"], 0).await;

    // Held: the list counts its session and hold against the quotas.
    let mut holder = leasehold_as(&cluster, &token_file)
        .args(["lock", "payments/1", "--ttl", "3s", "--", "sleep", "60"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let row = leasehold_jepsen::wait::until(Duration::from_secs(20), "the holder's session to be listed", || async {
        tenant_row(&cluster, "payments").await.filter(|row| row["sessions"] == 1 && row["holds"] == 1)
    })
    .await;
    assert_eq!(row["quotas"]["max_sessions"], 5);
    assert!(row["state_bytes"].as_u64().unwrap() > 0, "{row}");
    let (table, _) = expect_exit(leasehold(&cluster), &["tenant", "list"], 0).await;
    let header = table.lines().next().unwrap();
    for column in ["TENANT", "SESSIONS", "HOLDS", "WAITERS", "STATE BYTES"] {
        assert!(header.contains(column), "{table}");
    }
    let payments = table.lines().find(|line| line.starts_with("payments ")).expect("a row for payments");
    let cells: Vec<&str> = payments.split_whitespace().collect();
    assert_eq!(cells[1..4], ["1/5", "1/100000", "0/100000"], "{table}");

    let (stdout, _) =
        expect_exit(leasehold(&cluster), &["tenant", "set-quotas", "payments", "--max-holds", "7"], 0).await;
    let cells: Vec<&str> = stdout.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(cells[..4], ["payments", "1/5", "1/7", "0/100000"], "the other quotas stay: {stdout}");

    // Removed: its session ends, the holder's command is stopped, the token is refused.
    let (stdout, _) = expect_exit(leasehold(&cluster), &["tenant", "remove", "payments"], 0).await;
    assert_eq!(stdout, "tenant payments removed: 1 session ended\n");
    let status = exit_within(&mut holder, Duration::from_secs(20), "the holder did not end with its tenant").await;
    assert_eq!(status.code(), Some(70), "the lock was lost with the session: {status:?}");
    assert!(tenant_row(&cluster, "payments").await.is_none(), "removed tenants are not listed");
    expect_exit(leasehold_as(&cluster, &token_file), &["lock", "payments/1", "--try", "--", "true"], 77).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_token_is_printed_once_and_never_written_to_the_token_file_of_the_environment() {
    let cluster = single_node_cluster().await;
    // LEASEHOLD_TOKEN_FILE names the test tenant's token (the CLI reads it); `tenant
    // add` must not write there.
    let own_token_before = std::fs::read_to_string(&cluster.credentials.token_file).unwrap();
    let (stdout, stderr) = expect_exit(leasehold(&cluster), &["tenant", "add", "reports"], 0).await;
    assert_eq!(std::fs::read_to_string(&cluster.credentials.token_file).unwrap(), own_token_before);
    let token = stdout.trim_end();
    assert!(token.starts_with("tenant_") && stdout.lines().count() == 1, "only the token: {stdout}");
    assert!(stderr.contains("only time"), "{stderr}");

    let token_file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(token_file.path(), format!("{token}\n")).unwrap();
    expect_exit(leasehold_as(&cluster, token_file.path()), &["lock", "reports/weekly", "--try", "--", "true"], 0).await;
    let (_, stderr) = expect_exit(leasehold(&cluster), &["tenant", "add", "reports"], 76).await;
    assert!(stderr.contains("reports"), "the refusal names the tenant: {stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_commands_without_the_admin_credential_exit_77() {
    let cluster = single_node_cluster().await;
    let token_file = cluster.credentials.token_file.display().to_string();
    // A tenant's token where the admin's should be: the server refuses it.
    let mut as_tenant = leasehold(&cluster);
    as_tenant.env("LEASEHOLD_ADMIN_TOKEN_FILE", &token_file);
    let (_, stderr) = expect_exit(as_tenant, &["tenant", "list"], 77).await;
    assert!(stderr.contains("permission denied"), "{stderr}");
    // No admin credential at all: refused before anything is sent.
    let mut without_admin = leasehold(&cluster);
    without_admin.env_remove("LEASEHOLD_ADMIN_TOKEN_FILE");
    let (_, stderr) = expect_exit(without_admin, &["tenant", "remove", "test"], 77).await;
    assert!(stderr.contains("--admin-token-file"), "{stderr}");
    // Nothing was removed.
    expect_exit(leasehold(&cluster), &["lock", "still-here", "--try", "--", "true"], 0).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn status_all_adds_the_tenants_for_the_admin_only() {
    let cluster = single_node_cluster().await;
    let (stdout, _) = expect_exit(leasehold(&cluster), &["status", "--all"], 0).await;
    assert!(stdout.contains("state: ") && stdout.contains(" budget ("), "the state against its budget: {stdout}");
    assert!(stdout.contains("TENANT") && stdout.contains("\ntest "), "the tenants table: {stdout}");
    assert!(!stdout.contains("WARNING"), "the cluster runs TLS: {stdout}");
    let (stdout, _) = expect_exit(leasehold(&cluster), &["status", "--all", "--json"], 0).await;
    let view: serde_json::Value = serde_json::from_str(&stdout).expect("one JSON document");
    assert_eq!(view["nodes"][0]["insecure_plaintext"], false);
    assert!(view["tenants"].as_array().unwrap().iter().any(|tenant| tenant["name"] == "test"), "{view}");
    let mut without_admin = leasehold(&cluster);
    without_admin.env_remove("LEASEHOLD_ADMIN_TOKEN_FILE");
    let (_, stderr) = expect_exit(without_admin, &["status", "--all"], 77).await;
    assert!(stderr.contains("--admin-token-file"), "{stderr}");
}

/// `session close ID --tenant NAME`: the admin ends a tenant's session as if it had
/// expired. The holder's command is stopped (70), the lock goes to the tenant's
/// waiter with a newer token, and every node's audit log has the change. The tenant's
/// own token may not do it (77); a wrong tenant, or an id that is no live session of
/// the tenant, ends nothing (76); an empty tenant is malformed (64).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_ends_a_tenants_session_and_its_holder_is_stopped() {
    const LOCK: &str = "ended/held";
    let deadline = Duration::from_secs(20);
    let cluster = TestCluster::start(ClusterOptions::default());
    cluster.wait_for_leader(deadline).await;
    let mut holder = leasehold(&cluster)
        .args(["lock", LOCK, "--ttl", "10s", "--", "sleep", "60"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let client = cluster.client();
    let held = || async { client.describe_lock(LOCK, false).await.ok()?.holder.map(|h| (h.session_id, h.token)) };
    let (session_id, token) = leasehold_jepsen::wait::until(deadline, "the holder to take the lock", held).await;
    let waiter = client.session(Duration::from_secs(10)).await.expect("the waiter's session");
    let waiting = tokio::spawn(async move { waiter.lock(LOCK).await });
    let id = session_id.to_string();

    let mut as_tenant = leasehold(&cluster);
    as_tenant.env("LEASEHOLD_ADMIN_TOKEN_FILE", &cluster.credentials.token_file);
    let (_, stderr) = expect_exit(as_tenant, &["session", "close", &id, "--tenant", "test"], 77).await;
    assert!(stderr.contains("permission denied"), "{stderr}");
    let (_, stderr) = expect_exit(leasehold(&cluster), &["session", "close", &id, "--tenant", "admin"], 76).await;
    assert!(stderr.contains(&format!("has no session {id}")), "another tenant's session is not found: {stderr}");
    expect_exit(leasehold(&cluster), &["session", "close", "999999999", "--tenant", "test"], 76).await;
    let (_, stderr) = expect_exit(leasehold(&cluster), &["session", "close", &id, "--tenant", ""], 64).await;
    assert!(stderr.contains("tenant"), "{stderr}");
    assert_eq!(held().await, Some((session_id, token)), "the refused closes ended nothing");

    let (stdout, _) = expect_exit(leasehold(&cluster), &["session", "close", &id, "--tenant", "test"], 0).await;
    assert!(stdout.starts_with(&format!("session {id} of tenant \"test\" ended")), "{stdout}");
    let status = exit_within(&mut holder, deadline, "the holder's command went on after its session ended").await;
    assert_eq!(status.code(), Some(70), "the holder learnt that its lock was lost: {status:?}");
    let guard = tokio::time::timeout(deadline, waiting).await.expect("the waiter is granted").unwrap().unwrap();
    assert!(guard.token() > token, "the waiter's token {} is newer than {token}", guard.token());
    expect_exit(leasehold(&cluster), &["session", "close", &id, "--tenant", "test"], 76).await;
    for node in cluster.nodes.keys() {
        leasehold_jepsen::wait::until(deadline, &format!("node {node} to audit the end of session {id}"), || async {
            let log = cluster.log_text(*node);
            log.lines()
                .any(|line| line.contains("admin change applied from the log") && line.contains("EndSession"))
                .then_some(())
        })
        .await;
    }
    guard.release().await.expect("release");
}

/// The CLI acting as the tenant whose client certificate is `stem`.pem/.key.
fn leasehold_with_certificate(cluster: &TestCluster, stem: &std::path::Path) -> Command {
    let mut command = leasehold(cluster);
    command.env_remove("LEASEHOLD_TOKEN_FILE");
    command
        .env("LEASEHOLD_CERT_FILE", stem.with_extension("pem"))
        .env("LEASEHOLD_KEY_FILE", stem.with_extension("key"));
    command
}

/// Promise: a tenant certificate is bound to the tenant's token, not to its name:
/// `leasehold cert tenant --token-file` makes one that works until the token is
/// rotated (a holder on it loses its lock as its keepalives are refused) or the
/// tenant removed, and a later tenant of the same name does not inherit it. Without
/// --token-file the CLI refuses to make one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_certificate_stops_working_when_its_token_is_rotated_or_the_tenant_removed() {
    let cluster = single_node_cluster().await;
    let directory = tempfile::tempdir().unwrap();
    for file in ["ca.pem", "ca.key"] {
        std::fs::copy(cluster.credentials.directory.join(file), directory.path().join(file)).unwrap();
    }
    let certs = directory.path().display().to_string();
    let token_file = directory.path().join("payments.token");
    let token_file_text = token_file.display().to_string();
    let certificate = directory.path().join("tenant-payments");
    let keep = |name: &str| {
        let kept = directory.path().join(name);
        for extension in ["pem", "key"] {
            std::fs::copy(certificate.with_extension(extension), kept.with_extension(extension)).unwrap();
        }
        kept
    };
    let lock_once = ["lock", "payments/once", "--try", "--", "true"];

    expect_exit(leasehold(&cluster), &["tenant", "add", "payments", "--token-file", &token_file_text], 0).await;
    let (_, stderr) = expect_exit(leasehold(&cluster), &["cert", "tenant", &certs, "payments"], 64).await;
    assert!(stderr.contains("--token-file"), "the refusal says what is missing: {stderr}");
    expect_exit(leasehold(&cluster), &["cert", "tenant", &certs, "payments", "--token-file", &token_file_text], 0)
        .await;
    let first = keep("first");
    expect_exit(leasehold_with_certificate(&cluster, &first), &lock_once, 0).await;

    // Rotated: the holder on the first certificate loses its lock, the certificate is
    // refused, and one made for the new token works.
    let mut holder = leasehold_with_certificate(&cluster, &first)
        .args(["lock", "payments/held", "--ttl", "3s", "--", "sleep", "60"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let client = cluster.admin_client();
    leasehold_jepsen::wait::until(Duration::from_secs(20), "the certificate's holder to take its lock", || async {
        let tenants = client.list_tenants().await.ok()?;
        tenants.into_iter().find(|tenant| tenant.name == "payments" && tenant.holds == 1).map(drop)
    })
    .await;
    expect_exit(leasehold(&cluster), &["tenant", "rotate-token", "payments", "--token-file", &token_file_text], 0)
        .await;
    let (_, stderr) = expect_exit(leasehold_with_certificate(&cluster, &first), &lock_once, 77).await;
    assert!(stderr.contains("no longer has"), "the refusal says why: {stderr}");
    let status =
        exit_within(&mut holder, Duration::from_secs(20), "the rotated certificate's holder kept its lock").await;
    assert_eq!(status.code(), Some(70), "the holder learnt that its lock was lost: {status:?}");
    expect_exit(leasehold(&cluster), &["cert", "tenant", &certs, "payments", "--token-file", &token_file_text], 0)
        .await;
    let second = keep("second");
    expect_exit(leasehold_with_certificate(&cluster, &second), &lock_once, 0).await;

    // Removed and added again under the same name: no earlier certificate works.
    expect_exit(leasehold(&cluster), &["tenant", "remove", "payments"], 0).await;
    expect_exit(leasehold(&cluster), &["tenant", "add", "payments", "--token-file", &token_file_text], 0).await;
    for old in [&first, &second] {
        expect_exit(leasehold_with_certificate(&cluster, old), &lock_once, 77).await;
    }
    expect_exit(leasehold(&cluster), &["cert", "tenant", &certs, "payments", "--token-file", &token_file_text], 0)
        .await;
    expect_exit(leasehold_with_certificate(&cluster, &certificate), &lock_once, 0).await;
}
