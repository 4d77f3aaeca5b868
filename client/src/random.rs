//! The client's random choices (its client id, the spread of its retry pauses) come
//! from one generator per thread: seeded from the operating system the first time it
//! is used, or by `seed_this_thread` before, which a simulator that runs its clients
//! on one thread calls so that a seed fixes their retries too.

use std::cell::RefCell;
use std::ops::RangeInclusive;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

thread_local! {
    static GENERATOR: RefCell<Option<StdRng>> = const { RefCell::new(None) };
}

/// From now on the client's random choices on this thread follow `seed`.
pub fn seed_this_thread(seed: u64) {
    GENERATOR.with(|generator| *generator.borrow_mut() = Some(StdRng::seed_from_u64(seed)));
}

fn with<T>(draw: impl FnOnce(&mut StdRng) -> T) -> T {
    GENERATOR.with(|generator| draw(generator.borrow_mut().get_or_insert_with(StdRng::from_os_rng)))
}

/// A number in `range`.
pub(crate) fn in_range(range: RangeInclusive<u64>) -> u64 {
    with(|generator| generator.random_range(range))
}

/// A number other than zero.
pub(crate) fn nonzero() -> u64 {
    with(|generator| generator.random_range(1..=u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seeded_thread_draws_the_same_numbers_again() {
        seed_this_thread(7);
        let first: Vec<u64> = (0..4).map(|_| in_range(10..=1_000)).chain([nonzero()]).collect();
        seed_this_thread(7);
        let again: Vec<u64> = (0..4).map(|_| in_range(10..=1_000)).chain([nonzero()]).collect();
        assert_eq!(first, again);
        assert!(first[..4].iter().all(|number| (10..=1_000).contains(number)), "{first:?}");
    }
}
