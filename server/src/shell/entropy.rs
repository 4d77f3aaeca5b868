//! Every random choice a node makes, from one source that the node is given, as it is
//! given its clock: new incarnations and cluster ids, session secrets, tenant tokens.
//!
//! A node that serves clients always draws from the operating system's generator
//! (`Entropy::os`): the secrets and tokens guard sessions and tenants, so they must
//! not be predictable. `Entropy::seeded` is for runs that must replay exactly (a
//! simulated cluster under one seed), where one seed fixes every choice and nothing
//! guards anything real.

use std::sync::Mutex;

use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};

pub struct Entropy {
    /// `None`: the operating system's generator (through the thread-local one it seeds).
    seeded: Option<Mutex<StdRng>>,
}

impl Entropy {
    /// Unpredictable choices: the only source for a node that serves clients.
    pub fn os() -> Self {
        Entropy { seeded: None }
    }

    /// Choices fixed by `seed`, the same sequence every time: for replayable runs only.
    pub fn seeded(seed: u64) -> Self {
        Entropy { seeded: Some(Mutex::new(StdRng::seed_from_u64(seed))) }
    }

    pub fn fill(&self, bytes: &mut [u8]) {
        match &self.seeded {
            None => rand::rng().fill_bytes(bytes),
            Some(generator) => generator.lock().unwrap().fill_bytes(bytes),
        }
    }

    pub fn u64(&self) -> u64 {
        match &self.seeded {
            None => rand::rng().random(),
            Some(generator) => generator.lock().unwrap().random(),
        }
    }

    pub fn u128(&self) -> u128 {
        match &self.seeded {
            None => rand::rng().random(),
            Some(generator) => generator.lock().unwrap().random(),
        }
    }

    pub fn bytes<const N: usize>(&self) -> [u8; N] {
        let mut bytes = [0u8; N];
        self.fill(&mut bytes);
        bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_seed_gives_one_sequence_and_two_seeds_two() {
        let draw = |entropy: &Entropy| (entropy.u64(), entropy.u128(), entropy.bytes::<16>());
        let (first, again, other) = (Entropy::seeded(7), Entropy::seeded(7), Entropy::seeded(8));
        let sequence: Vec<_> = (0..4).map(|_| draw(&first)).collect();
        assert_eq!(sequence, (0..4).map(|_| draw(&again)).collect::<Vec<_>>());
        assert_ne!(sequence, (0..4).map(|_| draw(&other)).collect::<Vec<_>>());
    }

    #[test]
    fn the_operating_system_source_does_not_repeat_itself() {
        let (one, two) = (Entropy::os(), Entropy::os());
        assert_ne!(one.bytes::<16>(), two.bytes::<16>(), "128 bits drawn twice the same");
    }
}
