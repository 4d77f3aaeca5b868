//! Observers of elections: every change of an election's leader or value, in apply
//! order, pushed to the `Observe` streams of that election.
//!
//! A subscriber registers before it reads the current state, and each change carries
//! the index of the entry that made it, so the stream skips changes the initial state
//! already includes and never goes back in time. A subscriber that falls more than
//! `OBSERVE_CHANGES_QUEUED_MAX` changes behind is dropped; its client reconnects and
//! starts again from the current state, so the latest state is never missed.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;

use crate::machine::{LeaderView, TenantId};

pub const OBSERVE_CHANGES_QUEUED_MAX: usize = 1_024;
/// Open `Observe` streams per node at most.
pub const OBSERVERS_MAX: usize = 100_000;

/// One state of an election and the index of the entry that made it.
#[derive(Debug, Clone)]
pub struct Change {
    pub index: u64,
    pub leader: Option<LeaderView>,
}

/// An election: its tenant's namespace and its name.
type Key = (TenantId, String);

#[derive(Default)]
pub struct Observers {
    /// Shared with the subscriptions, which leave it when they end.
    by_election: Arc<Mutex<Registry>>,
}

#[derive(Default)]
struct Registry {
    senders: BTreeMap<Key, Vec<mpsc::Sender<Change>>>,
    /// Senders in `senders`, so that a subscription checks the limit in O(1).
    open: usize,
}

impl Registry {
    /// Drops the senders of `key` whose stream ended.
    fn prune(&mut self, key: &Key) {
        let Some(senders) = self.senders.get_mut(key) else { return };
        let before = senders.len();
        senders.retain(|sender| !sender.is_closed());
        self.open -= before - senders.len();
        if senders.is_empty() {
            self.senders.remove(key);
        }
    }
}

/// An `Observe` stream's registration: dropping it (the stream ended, the client went
/// away) removes it at once, so streams that come and go on a quiet election leave
/// nothing behind.
pub struct Subscription {
    registry: Arc<Mutex<Registry>>,
    key: Key,
    pub changes: mpsc::Receiver<Change>,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.changes.close();
        self.registry.lock().unwrap().prune(&self.key);
    }
}

impl Observers {
    /// Registers an observer of election `name` in `tenant`'s namespace, or None when
    /// too many streams are open.
    pub fn subscribe(&self, tenant: TenantId, name: &str) -> Option<Subscription> {
        let mut registry = self.by_election.lock().unwrap();
        if registry.open >= OBSERVERS_MAX {
            return None;
        }
        let (sender, receiver) = mpsc::channel(OBSERVE_CHANGES_QUEUED_MAX);
        let key = (tenant, name.to_string());
        registry.senders.entry(key.clone()).or_default().push(sender);
        registry.open += 1;
        Some(Subscription { registry: self.by_election.clone(), key, changes: receiver })
    }

    /// Delivers a change to every observer of the election, dropping the ones that are
    /// gone or too far behind.
    pub fn publish(&self, tenant: TenantId, name: &str, change: Change) {
        let mut registry = self.by_election.lock().unwrap();
        let key = (tenant, name.to_string());
        let Some(senders) = registry.senders.get_mut(&key) else { return };
        let before = senders.len();
        senders.retain(|sender| sender.try_send(change.clone()).is_ok());
        let dropped = before - senders.len();
        if senders.is_empty() {
            registry.senders.remove(&key);
        }
        registry.open -= dropped;
    }

    /// Drops every observer (the state was replaced by a snapshot): their clients
    /// reconnect and read the new state.
    pub fn reset(&self) {
        let mut registry = self.by_election.lock().unwrap();
        registry.senders.clear();
        registry.open = 0;
    }

    /// Open `Observe` streams, for the metrics and tests.
    pub fn open(&self) -> usize {
        self.by_election.lock().unwrap().open
    }
}
