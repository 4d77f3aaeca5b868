//! When this node last heard from each member: an answer to a Raft message it sent,
//! or (on a follower) an AppendEntries from the leader. Only the status page reads it;
//! the Raft core keeps its own timers.
//!
//! Recording is on the commit path (every AppendEntries answer), so it is one atomic
//! store into a slot the connection looked up once (`slot`), never a lock.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use crate::shell::clock::Stopwatch;

/// A member's node id (the Raft glue's `NodeId`).
type NodeId = u64;

/// Milliseconds after `PeerContacts::started`, plus one (0: never heard).
pub type Heard = Arc<AtomicU64>;

#[derive(Debug)]
pub struct PeerContacts {
    started: Stopwatch,
    /// Read-locked by every AppendEntries a follower takes (a slot exists after the
    /// first), write-locked only to add a member's slot.
    slots: RwLock<BTreeMap<NodeId, Heard>>,
}

impl Default for PeerContacts {
    fn default() -> PeerContacts {
        PeerContacts { started: Stopwatch::start(), slots: RwLock::default() }
    }
}

impl PeerContacts {
    /// The slot of `node`, for a connection to keep and `heard_in` to write.
    pub fn slot(&self, node: NodeId) -> Heard {
        if let Some(slot) = self.slots.read().unwrap().get(&node) {
            return slot.clone();
        }
        self.slots.write().unwrap().entry(node).or_default().clone()
    }

    /// `node` was heard from now (through its slot).
    pub fn heard_in(&self, slot: &Heard) {
        slot.store(self.started.elapsed_ms() + 1, Ordering::Relaxed);
    }

    pub fn heard(&self, node: NodeId) {
        if let Some(slot) = self.slots.read().unwrap().get(&node) {
            return self.heard_in(slot);
        }
        self.heard_in(&self.slot(node));
    }

    /// Milliseconds since `node` was last heard from; `None` if never.
    pub fn since_ms(&self, node: NodeId) -> Option<u64> {
        let heard = self.slots.read().unwrap().get(&node)?.load(Ordering::Relaxed);
        let now = self.started.elapsed_ms() + 1;
        (heard != 0).then(|| now.saturating_sub(heard))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_member_never_heard_from_has_no_contact() {
        let contacts = PeerContacts::default();
        assert_eq!(contacts.since_ms(2), None);
        let slot = contacts.slot(3);
        assert_eq!(contacts.since_ms(3), None, "a slot alone is no contact");
        contacts.heard(2);
        contacts.heard_in(&slot);
        assert!(contacts.since_ms(2).is_some_and(|since_ms| since_ms < 60_000));
        assert!(contacts.since_ms(3).is_some_and(|since_ms| since_ms < 60_000));
        assert_eq!(contacts.since_ms(4), None);
    }
}
