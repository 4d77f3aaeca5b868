//! Session deadlines, kept on every node from the applied log and acted on by the
//! leader.
//!
//! Every node tracks each session's deadline on its monotonic clock as sessions are
//! created and ended by applied entries, so a node that becomes leader already knows
//! every session. A new leader starts every deadline afresh (now + TTL): a leader
//! change may lengthen a lease, never shorten it. Keepalives renew a deadline only
//! on the leader, after it confirmed its leadership, and never write the log. When a
//! deadline passes the leader proposes `ExpireSessions`; applying it ends the session.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

use crate::clock::{Clock, MonotonicMs};
use crate::limits::EXPIRE_SESSIONS_PER_COMMAND_MAX;
use crate::state_machine::SessionId;

/// How often the leader looks for expired sessions.
pub const EXPIRY_SCAN_INTERVAL_MS: u64 = 50;

#[derive(Debug, Clone, Copy)]
struct Lease {
    ttl_ms: u64,
    deadline_ms: MonotonicMs,
}

pub struct Leases {
    clock: Clock,
    table: Mutex<LeaseTable>,
}

#[derive(Default)]
struct LeaseTable {
    leases: BTreeMap<SessionId, Lease>,
    /// The leases not being expired, ordered by deadline, so the leader finds the
    /// expired ones without scanning every session.
    by_deadline: BTreeSet<(MonotonicMs, SessionId)>,
    /// Sessions whose expiry was proposed and not yet applied: a keepalive for one
    /// of them is answered "not alive", because the expiry will win.
    expiring: BTreeSet<SessionId>,
}

impl LeaseTable {
    fn insert(&mut self, session: SessionId, lease: Lease) {
        if let Some(previous) = self.leases.insert(session, lease) {
            self.by_deadline.remove(&(previous.deadline_ms, session));
        }
        self.expiring.remove(&session);
        self.by_deadline.insert((lease.deadline_ms, session));
    }

    fn remove(&mut self, session: SessionId) {
        if let Some(lease) = self.leases.remove(&session) {
            self.by_deadline.remove(&(lease.deadline_ms, session));
        }
        self.expiring.remove(&session);
    }

    /// Moves a deadline later (never earlier).
    fn extend(&mut self, session: SessionId, deadline_ms: MonotonicMs) -> Option<MonotonicMs> {
        let lease = self.leases.get_mut(&session)?;
        if deadline_ms > lease.deadline_ms {
            let expiring = self.expiring.contains(&session);
            if !expiring {
                self.by_deadline.remove(&(lease.deadline_ms, session));
                self.by_deadline.insert((deadline_ms, session));
            }
            lease.deadline_ms = deadline_ms;
        }
        Some(lease.deadline_ms)
    }

    fn rebuild(&mut self) {
        self.expiring.clear();
        self.by_deadline = self.leases.iter().map(|(id, lease)| (lease.deadline_ms, *id)).collect();
    }
}

impl Leases {
    pub fn new(clock: Clock) -> Self {
        Self { clock, table: Mutex::new(LeaseTable::default()) }
    }

    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// A session was created by an applied entry.
    pub fn session_created(&self, session: SessionId, ttl_ms: u64) {
        let deadline_ms = self.clock.now_ms() + ttl_ms;
        self.table.lock().unwrap().insert(session, Lease { ttl_ms, deadline_ms });
    }

    /// A session was closed or expired by an applied entry.
    pub fn session_ended(&self, session: SessionId) {
        self.table.lock().unwrap().remove(session);
    }

    /// Replaces every lease (after a snapshot was installed or at start), each with a
    /// fresh deadline of now + TTL.
    pub fn restart_all(&self, sessions: impl IntoIterator<Item = (SessionId, u64)>) {
        let now = self.clock.now_ms();
        let mut table = self.table.lock().unwrap();
        table.leases =
            sessions.into_iter().map(|(id, ttl_ms)| (id, Lease { ttl_ms, deadline_ms: now + ttl_ms })).collect();
        table.rebuild();
    }

    /// Restarts the deadline of every known session (this node just became leader).
    pub fn restart_deadlines(&self) {
        let now = self.clock.now_ms();
        let mut table = self.table.lock().unwrap();
        for lease in table.leases.values_mut() {
            lease.deadline_ms = lease.deadline_ms.max(now + lease.ttl_ms);
        }
        table.rebuild();
    }

    /// A keepalive, after the leader confirmed its leadership: returns the TTL the
    /// session now has, or None when the session is gone or being expired.
    pub fn renew(&self, session: SessionId) -> Option<u64> {
        let now = self.clock.now_ms();
        let mut table = self.table.lock().unwrap();
        if table.expiring.contains(&session) {
            return None;
        }
        let ttl_ms = table.leases.get(&session)?.ttl_ms;
        let deadline_ms = table.extend(session, now + ttl_ms)?;
        Some(deadline_ms - now)
    }

    /// Time left before the session's deadline on this node's clock.
    pub fn remaining_ms(&self, session: SessionId) -> Option<u64> {
        let now = self.clock.now_ms();
        let table = self.table.lock().unwrap();
        table.leases.get(&session).map(|lease| lease.deadline_ms.saturating_sub(now))
    }

    /// Sessions whose deadline passed and whose expiry is not yet proposed, marked as
    /// proposed. At most one command's worth.
    pub fn take_expired(&self) -> Vec<SessionId> {
        let now = self.clock.now_ms();
        let mut table = self.table.lock().unwrap();
        let expired: Vec<(MonotonicMs, SessionId)> = table
            .by_deadline
            .iter()
            .take_while(|(deadline_ms, _)| *deadline_ms <= now)
            .take(EXPIRE_SESSIONS_PER_COMMAND_MAX)
            .copied()
            .collect();
        for entry in &expired {
            table.by_deadline.remove(entry);
            table.expiring.insert(entry.1);
        }
        expired.into_iter().map(|(_, session)| session).collect()
    }

    /// The proposal of these expiries failed (leadership lost): forget that they were
    /// proposed, so the next leader decides afresh.
    pub fn expiry_not_proposed(&self, sessions: &[SessionId]) {
        let mut table = self.table.lock().unwrap();
        for session in sessions {
            if table.expiring.remove(session) {
                if let Some(lease) = table.leases.get(session).copied() {
                    table.by_deadline.insert((lease.deadline_ms, *session));
                }
            }
        }
    }

    pub fn len(&self) -> usize {
        self.table.lock().unwrap().leases.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn expiry_renewal_and_new_leader_restart() {
        let clock = Clock::manual();
        let leases = Leases::new(clock.clone());
        leases.session_created(1, 2_000);
        leases.session_created(2, 5_000);
        clock.advance(Duration::from_millis(1_500));
        assert_eq!(leases.renew(1), Some(2_000));
        clock.advance(Duration::from_millis(2_100));
        assert_eq!(leases.take_expired(), vec![1]);
        assert!(leases.take_expired().is_empty(), "an expiry is proposed once");
        assert_eq!(leases.renew(1), None, "a session being expired is not renewed");
        leases.expiry_not_proposed(&[1]);

        // A new leader restarts every deadline: nothing expires for a full TTL.
        leases.restart_deadlines();
        clock.advance(Duration::from_millis(1_999));
        assert!(leases.take_expired().is_empty());
        clock.advance(Duration::from_millis(2));
        assert_eq!(leases.take_expired(), vec![1]);
        leases.session_ended(1);
        assert_eq!(leases.len(), 1);
    }
}
