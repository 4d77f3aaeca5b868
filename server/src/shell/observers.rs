//! Observers of elections: every change of an election's leader or value, in apply
//! order, pushed to the `Observe` streams of that election.
//!
//! A subscriber registers before it reads the current state, and each change carries
//! the index of the entry that made it, so the stream skips changes the initial state
//! already includes and never goes back in time. A subscriber that falls more than
//! `OBSERVE_CHANGES_QUEUED_MAX` changes behind is dropped; its client reconnects and
//! starts again from the current state, so the latest state is never missed.

use std::collections::BTreeMap;
use std::sync::Mutex;

use tokio::sync::mpsc;

use crate::machine::LeaderView;

pub const OBSERVE_CHANGES_QUEUED_MAX: usize = 1_024;
/// Open `Observe` streams per node at most.
pub const OBSERVERS_MAX: usize = 100_000;

/// One state of an election and the index of the entry that made it.
#[derive(Debug, Clone)]
pub struct Change {
    pub index: u64,
    pub leader: Option<LeaderView>,
}

#[derive(Default)]
pub struct Observers {
    by_name: Mutex<BTreeMap<String, Vec<mpsc::Sender<Change>>>>,
}

impl Observers {
    /// Registers an observer of `name`, or None when too many streams are open.
    pub fn subscribe(&self, name: &str) -> Option<mpsc::Receiver<Change>> {
        let mut by_name = self.by_name.lock().unwrap();
        let open: usize = by_name.values().map(Vec::len).sum();
        if open >= OBSERVERS_MAX {
            return None;
        }
        let (sender, receiver) = mpsc::channel(OBSERVE_CHANGES_QUEUED_MAX);
        by_name.entry(name.to_string()).or_default().push(sender);
        Some(receiver)
    }

    /// Delivers a change to every observer of `name`, dropping the ones that are gone
    /// or too far behind.
    pub fn publish(&self, name: &str, change: Change) {
        let mut by_name = self.by_name.lock().unwrap();
        let Some(senders) = by_name.get_mut(name) else { return };
        senders.retain(|sender| sender.try_send(change.clone()).is_ok());
        if senders.is_empty() {
            by_name.remove(name);
        }
    }

    /// Drops every observer (the state was replaced by a snapshot): their clients
    /// reconnect and read the new state.
    pub fn reset(&self) {
        self.by_name.lock().unwrap().clear();
    }
}
