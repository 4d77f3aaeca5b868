//! Fail-stop: a panic anywhere in a node stops the process.
//!
//! A panic is a broken invariant or a state the code says cannot happen. Left to
//! itself it would end one thread or one task and the node would serve on: a panic
//! on the applier leaves an entry half applied and every later request hanging, and a
//! tokio task's panic is only a failed task. So `install` makes every panic log what
//! it was and abort the process, before anything else runs on the broken state; the
//! node's next start replays its log from what RocksDB holds.
//!
//! Code that expects a panic and handles it (checking a snapshot's invariants before
//! it is used, to refuse it with a reason) runs that code inside `catching`.

use std::any::Any;
use std::cell::Cell;
use std::panic::{self, AssertUnwindSafe};

thread_local! {
    /// Whether this thread is inside `catching`.
    static CATCHING: Cell<bool> = const { Cell::new(false) };
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
        tracing::error!(thread, %location, panic = %payload_text(info.payload()), "a panic: stopping the node");
        eprintln!("leasehold-server: a panic on thread {thread} at {location}: stopping the node (fail-stop)");
        std::process::abort();
    }));
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
        let worker = std::thread::Builder::new().name("applier".into()).spawn(|| panic!("a broken invariant"));
        let _ = worker.unwrap().join();
        println!("still running after the panic");
    }

    #[test]
    fn a_panic_stops_the_process_unless_caught() {
        let output = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "shell::fail_stop::tests::fail_stop_child_process", "--nocapture", "--test-threads=1"])
            .env(CHILD, "1")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.signal(), Some(libc::SIGABRT), "{}\n{stdout}\n{stderr}", output.status);
        assert!(stdout.contains("caught: an expected panic"), "a caught panic goes on: {stdout}");
        assert!(!stdout.contains("still running"), "{stdout}");
        assert!(stderr.contains("a panic on thread applier"), "{stderr}");
        assert!(stderr.contains("a broken invariant"), "the default message is kept: {stderr}");
    }

    #[test]
    fn catching_returns_the_message_and_nests() {
        assert_eq!(catching(|| 7), Ok(7));
        let inner = catching(|| catching(|| -> u8 { panic!("inner") }));
        assert_eq!(inner, Ok(Err("inner".to_string())));
        assert!(!CATCHING.with(Cell::get), "the flag is restored");
    }
}
