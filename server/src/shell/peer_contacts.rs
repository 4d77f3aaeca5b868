//! When this node last heard from each member: an answer to a Raft message it sent,
//! or (on a follower) an AppendEntries from the leader. Only the status page reads it;
//! the Raft core keeps its own timers.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Instant;

/// A member's node id (the Raft glue's `NodeId`).
type NodeId = u64;

#[derive(Debug, Default)]
pub struct PeerContacts {
    heard: Mutex<BTreeMap<NodeId, Instant>>,
}

impl PeerContacts {
    pub fn heard(&self, node: NodeId) {
        self.heard.lock().unwrap().insert(node, Instant::now());
    }

    /// Milliseconds since `node` was last heard from; `None` if never.
    pub fn since_ms(&self, node: NodeId) -> Option<u64> {
        let heard = *self.heard.lock().unwrap().get(&node)?;
        Some(heard.elapsed().as_millis() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_member_never_heard_from_has_no_contact() {
        let contacts = PeerContacts::default();
        assert_eq!(contacts.since_ms(2), None);
        contacts.heard(2);
        assert!(contacts.since_ms(2).is_some_and(|since_ms| since_ms < 60_000));
        assert_eq!(contacts.since_ms(3), None);
    }
}
