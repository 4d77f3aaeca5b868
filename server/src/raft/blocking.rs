//! Where a node's blocking work runs: on threads in a node that serves clients, or
//! at once on the asking task under a simulator.
//!
//! A node keeps disk syncs, snapshot encoding and applying off the async runtime: on
//! tokio's blocking pool, the applier thread (`applier`) and the log flusher thread
//! (`log_store`). A simulator runs a whole cluster on one thread, in an order its
//! seed fixes; work on other threads would finish at moments no seed decides. With
//! `Blocking::Inline` the same work runs on the task that asks for it, and the log
//! flusher is a task, so that an append is still written before it is synced.

/// See the module's doc.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Blocking {
    /// A node: tokio's blocking pool, the applier thread, the log flusher thread.
    Threads,
    /// A simulator: at once, on the task that asks; the log flusher is a task.
    Inline,
}

impl Blocking {
    /// Runs `work`, which may block, and returns its result; a panic in it resumes here.
    pub async fn run<T: Send + 'static>(self, work: impl FnOnce() -> T + Send + 'static) -> T {
        match self {
            Blocking::Threads => match tokio::task::spawn_blocking(work).await {
                Ok(value) => value,
                Err(error) => std::panic::resume_unwind(error.into_panic()),
            },
            Blocking::Inline => work(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn threads_run_work_elsewhere_and_inline_runs_it_here() {
        let here = std::thread::current().id();
        assert_ne!(Blocking::Threads.run(move || std::thread::current().id()).await, here);
        assert_eq!(Blocking::Inline.run(move || std::thread::current().id()).await, here);
    }
}
