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
/// Open `Observe` streams of one tenant's elections per node at most: a tenth of the
/// node's, so that one tenant cannot take them all.
pub const OBSERVERS_PER_TENANT_MAX: usize = OBSERVERS_MAX / 10;

/// Why a stream was not opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Full {
    /// `OBSERVERS_MAX` streams are open on this node.
    Node,
    /// `OBSERVERS_PER_TENANT_MAX` streams of the tenant's elections are open.
    Tenant,
}

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
    /// Senders in `senders` per tenant; a tenant with none has no entry.
    open_by_tenant: BTreeMap<TenantId, usize>,
}

impl Registry {
    /// Drops the senders of `key` whose stream ended.
    fn prune(&mut self, key: &Key) {
        let Some(senders) = self.senders.get_mut(key) else { return };
        let before = senders.len();
        senders.retain(|sender| !sender.is_closed());
        let closed = before - senders.len();
        if senders.is_empty() {
            self.senders.remove(key);
        }
        self.closed(key.0, closed);
    }

    /// Counts `count` senders of `tenant`'s elections gone.
    fn closed(&mut self, tenant: TenantId, count: usize) {
        if count == 0 {
            return;
        }
        self.open -= count;
        let open = self.open_by_tenant.get_mut(&tenant).expect("a tenant with senders is counted");
        *open -= count;
        if *open == 0 {
            self.open_by_tenant.remove(&tenant);
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
    /// Registers an observer of election `name` in `tenant`'s namespace, or says which
    /// limit of open streams is reached.
    pub fn subscribe(&self, tenant: TenantId, name: &str) -> Result<Subscription, Full> {
        let mut registry = self.by_election.lock().unwrap();
        if registry.open >= OBSERVERS_MAX {
            return Err(Full::Node);
        }
        if registry.open_by_tenant.get(&tenant).copied().unwrap_or(0) >= OBSERVERS_PER_TENANT_MAX {
            return Err(Full::Tenant);
        }
        let (sender, receiver) = mpsc::channel(OBSERVE_CHANGES_QUEUED_MAX);
        let key = (tenant, name.to_string());
        registry.senders.entry(key.clone()).or_default().push(sender);
        registry.open += 1;
        *registry.open_by_tenant.entry(tenant).or_default() += 1;
        Ok(Subscription { registry: self.by_election.clone(), key, changes: receiver })
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
        registry.closed(tenant, dropped);
    }

    /// Drops every observer (the state was replaced by a snapshot): their clients
    /// reconnect and read the new state.
    pub fn reset(&self) {
        let mut registry = self.by_election.lock().unwrap();
        registry.senders.clear();
        registry.open = 0;
        registry.open_by_tenant.clear();
    }

    /// Open `Observe` streams, for the metrics and tests.
    pub fn open(&self) -> usize {
        self.by_election.lock().unwrap().open
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_tenant_cannot_take_every_stream_and_closed_streams_are_counted_out() {
        let observers = Observers::default();
        let mine: Vec<Subscription> =
            (0..OBSERVERS_PER_TENANT_MAX).map(|n| observers.subscribe(1, &format!("e{}", n % 7)).unwrap()).collect();
        assert_eq!(observers.subscribe(1, "e0").err(), Some(Full::Tenant));
        let other = observers.subscribe(2, "e0").expect("another tenant still observes");
        assert_eq!(observers.open(), OBSERVERS_PER_TENANT_MAX + 1);
        drop(mine);
        assert_eq!(observers.open(), 1);
        assert!(observers.subscribe(1, "e0").is_ok(), "the tenant's streams ended: it may open more");
        drop(other);
        observers.reset();
        assert_eq!(observers.open(), 0);
    }
}
