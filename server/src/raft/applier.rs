//! The thread on which the replicated state is built: committed entries are applied,
//! and snapshots decoded, there and nowhere else.
//!
//! glibc's malloc gives each thread an arena of its own. On the tokio workers, the
//! state's long-lived blocks (sessions, names, tree nodes) were carved between the
//! short-lived ones of requests in flight, and a leader serving many requests kept
//! their freed gaps: with 100k idle sessions it held about 40 MB of free heap in
//! half-used pages that `malloc_trim` could not return, where a follower held almost
//! none. On one thread of its own the state is packed into its own arena.
//!
//! What is freed also matters: glibc keeps a thread's recently freed blocks for that
//! thread's next allocations, whatever arena they came from. So the entries, which
//! were decoded on a worker, go back to be dropped there rather than on this thread.
//!
//! Under a simulator (`Blocking::Inline`) there is no thread: the work runs at once on
//! the task that asks for it.

use std::panic::{self, AssertUnwindSafe};
use std::sync::mpsc;
use std::thread;

use tokio::sync::oneshot;

use crate::raft::blocking::Blocking;

type Job = Box<dyn FnOnce() + Send>;

/// A handle on the applier thread; clones share it. The thread ends when the last
/// handle is dropped.
#[derive(Clone)]
pub struct Applier {
    /// None under `Blocking::Inline`: the work runs where it is asked for.
    jobs: Option<mpsc::Sender<Job>>,
}

impl Applier {
    pub fn start(blocking: Blocking) -> std::io::Result<Applier> {
        if blocking == Blocking::Inline {
            return Ok(Applier { jobs: None });
        }
        let (jobs, queue) = mpsc::channel::<Job>();
        thread::Builder::new().name("applier".into()).spawn(move || {
            for job in queue {
                job();
            }
        })?;
        Ok(Applier { jobs: Some(jobs) })
    }

    /// Runs `work` on the applier thread and returns its result. A panic in `work`
    /// resumes here, where no fail-stop hook is installed (unit tests); in a node the
    /// hook has stopped the process first (`shell::fail_stop`).
    pub async fn run<T: Send + 'static>(&self, work: impl FnOnce() -> T + Send + 'static) -> T {
        if self.jobs.is_none() {
            return work();
        }
        let (reply, answer) = oneshot::channel();
        self.send(move || {
            let _ = reply.send(panic::catch_unwind(AssertUnwindSafe(work)));
        });
        match answer.await.expect("the applier thread answers every job") {
            Ok(value) => value,
            Err(payload) => panic::resume_unwind(payload),
        }
    }

    /// `run` for callers outside the runtime (opening the store at start).
    pub fn run_blocking<T: Send + 'static>(&self, work: impl FnOnce() -> T + Send + 'static) -> T {
        if self.jobs.is_none() {
            return work();
        }
        let (reply, answer) = mpsc::sync_channel(1);
        self.send(move || {
            let _ = reply.send(panic::catch_unwind(AssertUnwindSafe(work)));
        });
        match answer.recv().expect("the applier thread answers every job") {
            Ok(value) => value,
            Err(payload) => panic::resume_unwind(payload),
        }
    }

    fn send(&self, job: impl FnOnce() + Send + 'static) {
        let jobs = self.jobs.as_ref().expect("only a thread is sent jobs");
        jobs.send(Box::new(job)).expect("the applier thread runs while a handle exists");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn work_runs_on_the_applier_thread_and_panics_come_back() {
        let applier = Applier::start(Blocking::Threads).unwrap();
        let name = applier.run(|| thread::current().name().map(str::to_owned)).await;
        assert_eq!(name.as_deref(), Some("applier"));
        assert_eq!(applier.run_blocking(|| 6 * 7), 42);

        let clone = applier.clone();
        let panicked = tokio::spawn(async move { clone.run(|| panic!("broken invariant")).await }).await;
        assert!(panicked.unwrap_err().is_panic());
        assert_eq!(applier.run(|| 1).await, 1, "the thread survives a panicking job");

        let inline = Applier::start(Blocking::Inline).unwrap();
        let here = thread::current().id();
        assert_eq!(inline.run(move || thread::current().id()).await, here, "inline work runs on the asking task");
    }
}
