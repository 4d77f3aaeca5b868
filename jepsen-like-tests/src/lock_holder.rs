//! A `leasehold lock` process as a lock holder, for the cluster tests that kill a
//! holder and measure how soon its lock moves on.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::cluster::{binary, TestCluster};

/// How long the holder's command may take to start once the lock is asked for.
const HOLDER_START_DEADLINE: Duration = Duration::from_secs(20);

/// Runs `leasehold lock ARGUMENTS -- sh -c 'echo $$ > MARKER; COMMAND'` against
/// `cluster`, and returns it once its command runs: the lock is held then. The
/// marker file gets the command's process id, for `kill_holder`.
pub async fn start_lock_holder(cluster: &TestCluster, arguments: &[String], marker: &Path, command: &str) -> Child {
    let script = format!("echo $$ > {}; {command}", marker.display());
    let holder = Command::new(binary("leasehold"))
        .envs(cluster.client_env())
        .env_remove("LEASEHOLD_REQUEST_TIMEOUT")
        .arg("lock")
        .args(arguments)
        .args(["--", "sh", "-c", &script])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start leasehold lock");
    crate::wait::until(HOLDER_START_DEADLINE, "the holder's command to start", || {
        let text = std::fs::read_to_string(marker).unwrap_or_default();
        async move { text.trim().parse::<i32>().ok() }
    })
    .await;
    holder
}

/// Kills the holder (`leasehold lock`, kill -9) and its command; the moment it died.
pub fn kill_holder(holder: &mut Child, marker: &Path) -> Instant {
    let _ = holder.kill();
    let died = Instant::now();
    let _ = holder.wait();
    if let Ok(pid) = std::fs::read_to_string(marker).unwrap_or_default().trim().parse::<i32>() {
        // SAFETY: signalling the command this test started (through the holder).
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    died
}
