//! Acquire RPCs waiting in a lock's FIFO queue, woken by the applied entry that
//! grants them (never by polling).
//!
//! The apply path dispatches `Granted` / `WaitFailed` events here after the state
//! changed. A handler registers after its `Acquire` entry answered `Queued`; it
//! checks the state under the registry's lock, so a grant applied between the two
//! is seen either in the state or as a wake-up, never missed.

use std::collections::BTreeMap;
use std::sync::Mutex;

use tokio::sync::oneshot;

use crate::machine::{ResourceKind, SessionId, StateMachine, Token};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WaitOutcome {
    Granted {
        token: Token,
    },
    /// The session ended (closed or expired) while it waited.
    SessionEnded,
    /// The wait was cancelled by a committed `CancelWait`.
    Cancelled,
}

/// A lock, semaphore or election name, for one session.
type WaitKey = (ResourceKind, SessionId, String);

#[derive(Default)]
pub struct WaitRegistry {
    waiting: Mutex<BTreeMap<WaitKey, Vec<oneshot::Sender<WaitOutcome>>>>,
}

/// What the handler found when it registered.
pub enum Registration {
    /// Already decided by entries applied before the registration.
    Decided(WaitOutcome),
    Waiting(oneshot::Receiver<WaitOutcome>),
}

impl WaitRegistry {
    /// Registers a waiter for (kind, session, name). `current` reads the state and
    /// says whether the wait is already decided; it runs under the registry's lock.
    pub fn register(
        &self,
        kind: ResourceKind,
        session: SessionId,
        name: &str,
        current: impl FnOnce() -> Option<WaitOutcome>,
    ) -> Registration {
        let mut waiting = self.waiting.lock().unwrap();
        if let Some(outcome) = current() {
            return Registration::Decided(outcome);
        }
        let (sender, receiver) = oneshot::channel();
        let senders = waiting.entry((kind, session, name.to_string())).or_default();
        senders.retain(|sender| !sender.is_closed());
        senders.push(sender);
        Registration::Waiting(receiver)
    }

    /// Wakes every handler waiting for (kind, session, name).
    pub fn wake(&self, kind: ResourceKind, session: SessionId, name: &str, outcome: WaitOutcome) {
        let senders = self.waiting.lock().unwrap().remove(&(kind, session, name.to_string()));
        for sender in senders.into_iter().flatten() {
            let _ = sender.send(outcome.clone());
        }
    }

    /// Wakes every waiter whose wait the state now decides (after a snapshot replaced
    /// the state wholesale).
    pub fn wake_decided(&self, decide: impl Fn(ResourceKind, SessionId, &str) -> Option<WaitOutcome>) {
        let mut waiting = self.waiting.lock().unwrap();
        let keys: Vec<WaitKey> = waiting.keys().cloned().collect();
        for key in keys {
            if let Some(outcome) = decide(key.0, key.1, &key.2) {
                for sender in waiting.remove(&key).into_iter().flatten() {
                    let _ = sender.send(outcome.clone());
                }
            }
        }
    }

    /// Drops registrations whose handler went away (client disconnected).
    pub fn forget_abandoned(&self) {
        let mut waiting = self.waiting.lock().unwrap();
        waiting.retain(|_, senders| {
            senders.retain(|sender| !sender.is_closed());
            !senders.is_empty()
        });
    }
}

/// What the state says about a wait of `session` for `name`: granted, ended, or
/// still undecided (None).
pub fn decision(machine: &StateMachine, kind: ResourceKind, session: SessionId, name: &str) -> Option<WaitOutcome> {
    let Some(view) = machine.describe_session(session) else {
        return Some(WaitOutcome::SessionEnded);
    };
    let (held, waiting) = match kind {
        ResourceKind::Lock => (&view.held, &view.waiting),
        ResourceKind::Semaphore => (&view.permits, &view.waiting_semaphores),
        ResourceKind::Election => (&view.leading, &view.campaigning),
    };
    if let Some(held) = held.iter().find(|held| held.name == name) {
        return Some(WaitOutcome::Granted { token: held.token });
    }
    if waiting.iter().any(|waiting| waiting == name) {
        return None;
    }
    Some(WaitOutcome::Cancelled)
}
