//! openraft's async runtime for Leasehold: tokio, with the random choices openraft
//! makes (each election timeout) drawn from a generator that a simulator can seed.
//!
//! openraft draws election timeouts from its runtime's `thread_rng`. Tokio's runtime
//! hands it the operating system's thread generator, which no seed reaches, so two
//! runs of one simulated cluster would campaign at different times. Here each thread
//! has a generator of its own, seeded from the operating system the first time it is
//! used, or from `seed_this_thread` (a simulator, which runs every node on one thread)
//! before. Everything else is tokio's.

use std::cell::RefCell;
use std::future::Future;
use std::time::Duration;

use openraft::{AsyncRuntime, OptionalSend, TokioRuntime};
use rand08::rngs::StdRng;
use rand08::{RngCore, SeedableRng};

thread_local! {
    /// This thread's generator for openraft's random choices; None until first used
    /// or seeded.
    static GENERATOR: RefCell<Option<StdRng>> = const { RefCell::new(None) };
}

/// From now on, openraft's random choices on this thread follow `seed`.
pub fn seed_this_thread(seed: u64) {
    GENERATOR.with(|generator| *generator.borrow_mut() = Some(StdRng::seed_from_u64(seed)));
}

/// A handle on this thread's generator (what `thread_rng` returns).
pub struct ThreadGenerator;

impl ThreadGenerator {
    fn with<T>(draw: impl FnOnce(&mut StdRng) -> T) -> T {
        GENERATOR.with(|generator| draw(generator.borrow_mut().get_or_insert_with(StdRng::from_entropy)))
    }
}

impl RngCore for ThreadGenerator {
    fn next_u32(&mut self) -> u32 {
        Self::with(|generator| generator.next_u32())
    }

    fn next_u64(&mut self) -> u64 {
        Self::with(|generator| generator.next_u64())
    }

    fn fill_bytes(&mut self, bytes: &mut [u8]) {
        Self::with(|generator| generator.fill_bytes(bytes))
    }

    fn try_fill_bytes(&mut self, bytes: &mut [u8]) -> Result<(), rand08::Error> {
        Self::with(|generator| generator.try_fill_bytes(bytes))
    }
}

/// tokio, but for `thread_rng` (see the module's doc).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct RaftRuntime;

impl AsyncRuntime for RaftRuntime {
    type JoinError = <TokioRuntime as AsyncRuntime>::JoinError;
    type JoinHandle<T: OptionalSend + 'static> = <TokioRuntime as AsyncRuntime>::JoinHandle<T>;
    type Sleep = <TokioRuntime as AsyncRuntime>::Sleep;
    type Instant = <TokioRuntime as AsyncRuntime>::Instant;
    type TimeoutError = <TokioRuntime as AsyncRuntime>::TimeoutError;
    type Timeout<R, T: Future<Output = R> + OptionalSend> = <TokioRuntime as AsyncRuntime>::Timeout<R, T>;
    type ThreadLocalRng = ThreadGenerator;
    type OneshotSender<T: OptionalSend> = <TokioRuntime as AsyncRuntime>::OneshotSender<T>;
    type OneshotReceiverError = <TokioRuntime as AsyncRuntime>::OneshotReceiverError;
    type OneshotReceiver<T: OptionalSend> = <TokioRuntime as AsyncRuntime>::OneshotReceiver<T>;

    fn spawn<T>(future: T) -> Self::JoinHandle<T::Output>
    where
        T: Future + OptionalSend + 'static,
        T::Output: OptionalSend + 'static,
    {
        TokioRuntime::spawn(future)
    }

    fn sleep(duration: Duration) -> Self::Sleep {
        TokioRuntime::sleep(duration)
    }

    fn sleep_until(deadline: Self::Instant) -> Self::Sleep {
        TokioRuntime::sleep_until(deadline)
    }

    fn timeout<R, F: Future<Output = R> + OptionalSend>(duration: Duration, future: F) -> Self::Timeout<R, F> {
        TokioRuntime::timeout(duration, future)
    }

    fn timeout_at<R, F: Future<Output = R> + OptionalSend>(deadline: Self::Instant, future: F) -> Self::Timeout<R, F> {
        TokioRuntime::timeout_at(deadline, future)
    }

    fn is_panic(join_error: &Self::JoinError) -> bool {
        TokioRuntime::is_panic(join_error)
    }

    fn thread_rng() -> Self::ThreadLocalRng {
        ThreadGenerator
    }

    fn oneshot<T>() -> (Self::OneshotSender<T>, Self::OneshotReceiver<T>)
    where
        T: OptionalSend,
    {
        TokioRuntime::oneshot()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn election_timeouts() -> Vec<u64> {
        let config = openraft::Config { election_timeout_min: 150, election_timeout_max: 300, ..Default::default() };
        (0..8).map(|_| config.new_rand_election_timeout::<RaftRuntime>()).collect()
    }

    #[test]
    fn a_seeded_thread_draws_the_same_election_timeouts_again() {
        seed_this_thread(20261204);
        let first = election_timeouts();
        seed_this_thread(20261204);
        assert_eq!(election_timeouts(), first, "the same seed, the same timeouts");
        assert!(first.iter().all(|timeout| (150..300).contains(timeout)), "{first:?}");
        seed_this_thread(20261205);
        assert_ne!(election_timeouts(), first, "another seed, other timeouts");
    }
}
