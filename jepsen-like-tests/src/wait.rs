//! Tests wait on a condition with a deadline and a reason, never on a bare sleep.

use std::future::Future;
use std::time::{Duration, Instant};

/// How often a condition is re-checked.
pub const POLL_INTERVAL_MS: u64 = 50;

/// Polls `check` until it returns Some, or panics after `deadline` saying `reason`.
pub async fn until<T, F, Fut>(deadline: Duration, reason: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let give_up = Instant::now() + deadline;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        if Instant::now() >= give_up {
            panic!("timed out after {deadline:?} waiting for: {reason}");
        }
        tokio::time::sleep(Duration::from_millis(POLL_INTERVAL_MS)).await;
    }
}
