//! Fail-stop: a panic anywhere in a node stops the process.
//!
//! A panic is a broken invariant or a state the code says cannot happen. Left to
//! itself it would end one thread or one task and the node would serve on: a panic
//! on the applier leaves an entry half applied and every later request hanging, and a
//! tokio task's panic is only a failed task. So `install` makes every panic log what
//! it was and abort the process, before anything else runs on the broken state; the
//! node's next start replays its log from what RocksDB holds.
//!
//! A task that runs as long as the node does (a server's accept loop, the expiry
//! loop, the disk watch) is spawned with `Essential::spawn`: if it ends while the
//! node is not stopping, the process stops too (`EXIT_TASK_ENDED`), rather than keep
//! a port open with nothing behind it.
//!
//! Every such stop goes through `Exit`: a node that serves clients exits with the
//! code; under a simulator the code is reported, and the simulator takes the node
//! down before it runs another step.
//!
//! Code that expects a panic and handles it (checking a snapshot's invariants before
//! it is used, to refuse it with a reason) runs that code inside `catching`.
//!
//! A panic while an entry is applied names the entry (`applying`). Such a panic is
//! deterministic: every replica applies the same committed entries in the same
//! order, so each one stops at the same index. Nothing of the entry was written (the
//! applied state is persisted only by snapshots, which are built between batches),
//! so the data directory holds the entry, unapplied, for a build with the bug fixed.

use std::any::Any;
use std::cell::Cell;
use std::future::Future;
use std::panic::{self, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The exit code of a node one of whose essential tasks ended while it ran.
pub const EXIT_TASK_ENDED: i32 = 7;

thread_local! {
    /// Whether this thread is inside `catching`.
    static CATCHING: Cell<bool> = const { Cell::new(false) };
    /// The (index, term) of the log entry this thread is applying, if any.
    static APPLYING: Cell<Option<(u64, u64)>> = const { Cell::new(None) };
}

/// Marks the log entry (index, term) this thread applies from now on, or none.
pub fn applying(entry: Option<(u64, u64)>) {
    APPLYING.with(|applying| applying.set(entry));
}

/// Makes any panic outside `catching` stop the process (SIGABRT), after the default
/// message and an error log line that name the thread.
pub fn install() {
    let default = panic::take_hook();
    panic::set_hook(Box::new(move |info| {
        if CATCHING.with(Cell::get) {
            return;
        }
        default(info);
        let thread = std::thread::current();
        let thread = thread.name().unwrap_or("unnamed");
        let location = info.location().map(ToString::to_string).unwrap_or_default();
        let panic = payload_text(info.payload());
        if let Some((index, term)) = APPLYING.with(Cell::get) {
            tracing::error!(thread, %location, %panic, index, term, "a panic while applying a log entry: stopping");
            eprintln!(
                "leasehold-server: a panic while applying the log entry at index {index} (term {term}) at {location}: \
                 {panic}; stopping the node (fail-stop). Every replica stops at this entry; the data directory holds \
                 it unapplied: restart with a build that fixes the bug"
            );
        } else {
            tracing::error!(thread, %location, %panic, "a panic: stopping the node");
            eprintln!("leasehold-server: a panic on thread {thread} at {location}: stopping the node (fail-stop)");
        }
        std::process::abort();
    }));
}

/// How a node stops itself when it must (exit codes 4 to 7, README "Operations").
#[derive(Clone)]
pub enum Exit {
    /// The process exits with the code, after the message on stderr.
    Process,
    /// The code and the message go to a simulator, which takes the node down before
    /// its next step; until then the caller goes on as after a refusal.
    Report(Arc<dyn Fn(i32, &str) + Send + Sync>),
}

impl Exit {
    /// Stops the node with `code`; `message` says why and what to do.
    pub fn stop(&self, code: i32, message: &str) {
        match self {
            Exit::Process => {
                eprintln!("leasehold-server: {message}");
                std::process::exit(code);
            }
            Exit::Report(report) => report(code, message),
        }
    }

    /// The same, `delay` from now: a refusal the node is answering has a moment to
    /// reach its sender first.
    pub fn stop_after(&self, delay: Duration, code: i32, message: String) {
        match self {
            Exit::Process => {
                eprintln!("leasehold-server: {message}");
                std::thread::spawn(move || {
                    std::thread::sleep(delay);
                    std::process::exit(code);
                });
            }
            Exit::Report(_) => {
                let exit = self.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    exit.stop(code, &message);
                });
            }
        }
    }
}

impl std::fmt::Debug for Exit {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(match self {
            Exit::Process => "Exit::Process",
            Exit::Report(_) => "Exit::Report",
        })
    }
}

/// Spawns the tasks meant to run until the node stops.
#[derive(Clone)]
pub struct Essential {
    stopped: watch::Receiver<bool>,
    exit: Exit,
}

impl Essential {
    /// Tasks that end once `stopped` says so (or its sender is gone), and otherwise
    /// stop the node through `exit`.
    pub fn new(stopped: watch::Receiver<bool>, exit: Exit) -> Essential {
        Essential { stopped, exit }
    }

    /// Spawns `work`: if it ends while `stopped` says nothing asked it to (not set,
    /// and its sender still there), the node stops with `EXIT_TASK_ENDED` and a last
    /// line naming the task.
    pub fn spawn(&self, name: &'static str, work: impl Future<Output = ()> + Send + 'static) -> JoinHandle<()> {
        let Essential { stopped, exit } = self.clone();
        tokio::spawn(async move {
            work.await;
            if *stopped.borrow() || stopped.has_changed().is_err() {
                return;
            }
            tracing::error!(task = name, "an essential task ended while the node runs: stopping the node");
            exit.stop(
                EXIT_TASK_ENDED,
                &format!(
                    "the {name} task ended while the node runs; stopping the node (exit code {EXIT_TASK_ENDED}) rather \
                     than serve without it"
                ),
            );
        })
    }
}

/// Runs `work`, returning its panic's message instead of stopping the process.
pub fn catching<R>(work: impl FnOnce() -> R) -> Result<R, String> {
    let outer = CATCHING.with(|catching| catching.replace(true));
    let result = panic::catch_unwind(AssertUnwindSafe(work));
    CATCHING.with(|catching| catching.set(outer));
    result.map_err(|payload| payload_text(&*payload))
}

fn payload_text(payload: &(dyn Any + Send)) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|text| text.to_string()))
        .unwrap_or_else(|| "a panic without a message".to_string())
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::ExitStatusExt;
    use std::process::Command;

    use super::*;

    const CHILD: &str = "LEASEHOLD_FAIL_STOP_CHILD";

    /// Runs the test `name` of this module in a process of its own, as a child.
    fn run_child(name: &str) -> std::process::Output {
        Command::new(std::env::current_exe().unwrap())
            .args(["--exact", &format!("shell::fail_stop::tests::{name}"), "--nocapture", "--test-threads=1"])
            .env(CHILD, "1")
            .output()
            .unwrap()
    }

    /// Run by `a_panic_stops_the_process_unless_caught` in a process of its own, with
    /// the hook installed; run directly, it does nothing.
    #[test]
    fn fail_stop_child_process() {
        if std::env::var_os(CHILD).is_none() {
            return;
        }
        install();
        let caught = catching(|| -> u32 { panic!("an expected panic") });
        println!("caught: {}", caught.unwrap_err());
        let worker = std::thread::Builder::new().name("applier".into()).spawn(|| {
            applying(Some((17, 3)));
            applying(None);
            panic!("a broken invariant")
        });
        let _ = worker.unwrap().join();
        println!("still running after the panic");
    }

    #[test]
    fn a_panic_stops_the_process_unless_caught() {
        let output = run_child("fail_stop_child_process");
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.signal(), Some(libc::SIGABRT), "{}\n{stdout}\n{stderr}", output.status);
        assert!(stdout.contains("caught: an expected panic"), "a caught panic goes on: {stdout}");
        assert!(!stdout.contains("still running"), "{stdout}");
        assert!(stderr.contains("a panic on thread applier"), "{stderr}");
        assert!(stderr.contains("a broken invariant"), "the default message is kept: {stderr}");
    }

    /// Run by `a_panic_in_apply_names_the_entry` in a process of its own.
    #[test]
    fn fail_stop_apply_child_process() {
        if std::env::var_os(CHILD).is_none() {
            return;
        }
        install();
        applying(Some((42, 7)));
        panic!("a deterministic bug");
    }

    #[test]
    fn a_panic_in_apply_names_the_entry() {
        let output = run_child("fail_stop_apply_child_process");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.signal(), Some(libc::SIGABRT), "{}\n{stderr}", output.status);
        assert!(stderr.contains("applying the log entry at index 42 (term 7)"), "{stderr}");
        assert!(stderr.contains("a deterministic bug"), "{stderr}");
    }

    /// Run by `an_essential_task_that_ends_stops_the_process` in a process of its own.
    #[test]
    fn fail_stop_task_child_process() {
        if std::env::var_os(CHILD).is_none() {
            return;
        }
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            let (stop, stopped) = watch::channel(false);
            stop.send_replace(true);
            Essential::new(stopped, Exit::Process).spawn("stopping", async {}).await.unwrap();
            println!("a task that ends when asked to goes unnoticed");
            let (_stop, stopped) = watch::channel(false);
            Essential::new(stopped, Exit::Process).spawn("client server", async {}).await.unwrap();
            println!("still running after the task ended");
        });
    }

    #[test]
    fn an_essential_task_that_ends_stops_the_process() {
        let output = run_child("fail_stop_task_child_process");
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(EXIT_TASK_ENDED), "{}\n{stdout}\n{stderr}", output.status);
        assert!(stdout.contains("goes unnoticed"), "{stdout}");
        assert!(!stdout.contains("still running"), "{stdout}");
        assert!(stderr.contains("the client server task ended while the node runs"), "{stderr}");
    }

    /// Under a simulator the same stop is reported, and the caller goes on.
    #[tokio::test]
    async fn an_ended_task_under_a_simulator_reports_the_code() {
        let reported = Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = reported.clone();
        let exit =
            Exit::Report(Arc::new(move |code, message: &str| sink.lock().unwrap().push((code, message.to_string()))));
        let (stop, stopped) = watch::channel(false);
        Essential::new(stopped, exit.clone()).spawn("expiry", async {}).await.unwrap();
        stop.send_replace(true);
        Essential::new(stop.subscribe(), exit).spawn("stopping", async {}).await.unwrap();
        let reported = reported.lock().unwrap();
        assert_eq!(reported.len(), 1, "{reported:?}");
        assert_eq!(reported[0].0, EXIT_TASK_ENDED);
        assert!(reported[0].1.contains("the expiry task ended"), "{}", reported[0].1);
    }

    #[test]
    fn catching_returns_the_message_and_nests() {
        assert_eq!(catching(|| 7), Ok(7));
        let inner = catching(|| catching(|| -> u8 { panic!("inner") }));
        assert_eq!(inner, Ok(Err("inner".to_string())));
        assert!(!CATCHING.with(Cell::get), "the flag is restored");
    }
}
