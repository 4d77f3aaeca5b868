//! Lock-delay timers (see `machine::delay`), kept on every node from the applied log
//! and acted on by the leader.
//!
//! Every node arms a timer when it applies an expiry that holds a grant back. It
//! applies the entry after it was committed, so the delay it counts from there is
//! never shorter than the delay since the commit; the clock-drift allowance is added
//! as for leases, so that another node's clock running faster cannot end it early
//! either. A node that becomes leader keeps the timers it armed as a follower. A node
//! that starts from its stored state or installs a snapshot arms every held-back grant
//! afresh with its whole delay: that lengthens a delay by at most the time since its
//! commit, never shortens it. When a timer runs out the leader proposes
//! `EndLockDelays`, whose entry hands the lock or permit to the next waiter.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

use leasehold_proto::lease::with_drift_ms;

use crate::machine::limits::LOCK_DELAYS_ENDED_PER_COMMAND_MAX;
use crate::machine::DelayKey;
use crate::shell::clock::{Clock, MonotonicMs};

pub struct LockDelays {
    clock: Clock,
    table: Mutex<Table>,
}

#[derive(Default)]
struct Table {
    /// When each held-back grant's delay ends on this node's clock.
    deadlines: BTreeMap<DelayKey, MonotonicMs>,
    /// Delays the leader proposed to end and has not seen applied yet, so that the
    /// next scan does not propose them again.
    proposed: BTreeSet<DelayKey>,
}

impl LockDelays {
    pub fn new(clock: Clock) -> Self {
        Self { clock, table: Mutex::new(Table::default()) }
    }

    /// An applied entry held a grant back for `delay_ms`.
    pub fn started(&self, key: DelayKey, delay_ms: u64) {
        let deadline_ms = self.clock.now_ms() + with_drift_ms(delay_ms);
        self.table.lock().unwrap().deadlines.insert(key, deadline_ms);
    }

    /// An applied entry ended the delay.
    pub fn ended(&self, key: &DelayKey) {
        let mut table = self.table.lock().unwrap();
        table.deadlines.remove(key);
        table.proposed.remove(key);
    }

    /// The state was replaced (a restart or an installed snapshot): every held-back
    /// grant's delay starts afresh, whole.
    pub fn restart_all(&self, held: impl IntoIterator<Item = (DelayKey, u64)>) {
        let now = self.clock.now_ms();
        let mut table = self.table.lock().unwrap();
        table.deadlines = held.into_iter().map(|(key, delay_ms)| (key, now + with_drift_ms(delay_ms))).collect();
        table.proposed.clear();
    }

    /// The delays that ran out and are not proposed yet, at most one command's worth;
    /// they count as proposed until `not_proposed` or their end is applied.
    pub fn take_due(&self) -> Vec<DelayKey> {
        let now = self.clock.now_ms();
        let mut table = self.table.lock().unwrap();
        let due: Vec<DelayKey> = table
            .deadlines
            .iter()
            .filter(|(key, deadline_ms)| **deadline_ms <= now && !table.proposed.contains(*key))
            .map(|(key, _)| key.clone())
            .take(LOCK_DELAYS_ENDED_PER_COMMAND_MAX)
            .collect();
        table.proposed.extend(due.iter().cloned());
        due
    }

    /// A proposal of `keys` failed (a leader change); the next scan tries again.
    pub fn not_proposed(&self, keys: &[DelayKey]) {
        let mut table = self.table.lock().unwrap();
        for key in keys {
            table.proposed.remove(key);
        }
    }

    /// How long the delay of `key` has left on this node's clock, if it runs.
    pub fn remaining_ms(&self, key: &DelayKey) -> Option<u64> {
        let now = self.clock.now_ms();
        self.table.lock().unwrap().deadlines.get(key).map(|deadline_ms| deadline_ms.saturating_sub(now))
    }

    /// Delays running on this node.
    pub fn len(&self) -> usize {
        self.table.lock().unwrap().deadlines.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::machine::ResourceKind;

    fn key(name: &str) -> DelayKey {
        DelayKey { tenant: 0, kind: ResourceKind::Lock, name: name.to_owned(), session: 7 }
    }

    #[test]
    fn a_delay_is_due_only_after_its_whole_time_with_the_drift_allowance() {
        let clock = Clock::manual();
        let delays = LockDelays::new(clock.clone());
        delays.started(key("a"), 10_000);
        clock.advance(Duration::from_millis(10_000));
        assert!(delays.take_due().is_empty(), "the drift allowance is not over yet");
        clock.advance(Duration::from_millis(with_drift_ms(10_000) - 10_000));
        assert_eq!(delays.take_due(), vec![key("a")]);
        assert!(delays.take_due().is_empty(), "a proposed end is not proposed again");
        delays.not_proposed(&[key("a")]);
        assert_eq!(delays.take_due(), vec![key("a")], "a failed proposal is tried again");
        delays.ended(&key("a"));
        assert!(delays.is_empty());
    }

    #[test]
    fn a_restart_starts_every_delay_afresh_and_whole() {
        let clock = Clock::manual();
        let delays = LockDelays::new(clock.clone());
        delays.started(key("a"), 5_000);
        clock.advance(Duration::from_millis(4_000));
        delays.restart_all([(key("a"), 5_000), (key("b"), 1_000)]);
        assert_eq!(delays.remaining_ms(&key("a")), Some(with_drift_ms(5_000)));
        clock.advance(Duration::from_millis(with_drift_ms(1_000)));
        assert_eq!(delays.take_due(), vec![key("b")]);
    }
}
