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

use crate::machine::limits::{EXPIRE_SESSIONS_PER_COMMAND_MAX, SESSION_TTL_MS_MAX};
use crate::machine::SessionId;
use crate::shell::clock::{Clock, MonotonicMs};

/// How often the leader looks for expired sessions.
pub const EXPIRY_SCAN_INTERVAL_MS: u64 = 50;

/// Bits of a `Lease` that hold the TTL; the rest hold the deadline.
const TTL_BITS: u32 = 22;
const DEADLINE_BITS: u32 = u64::BITS - TTL_BITS;
const DEADLINE_MS_MAX: MonotonicMs = (1 << DEADLINE_BITS) - 1;
const _: () = assert!(SESSION_TTL_MS_MAX < 1 << TTL_BITS);

/// A session's TTL and deadline in one word: every node keeps one per session, so
/// a map slot is 16 bytes rather than 24. The deadline is in milliseconds of this
/// node's monotonic clock and has 42 bits: 139 years.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Lease(u64);

impl Lease {
    fn new(ttl_ms: u64, deadline_ms: MonotonicMs) -> Lease {
        debug_assert!(ttl_ms <= SESSION_TTL_MS_MAX);
        Lease(ttl_ms << DEADLINE_BITS | deadline_ms.min(DEADLINE_MS_MAX))
    }

    fn ttl_ms(self) -> u64 {
        self.0 >> DEADLINE_BITS
    }

    fn deadline_ms(self) -> MonotonicMs {
        self.0 & DEADLINE_MS_MAX
    }
}

pub struct SessionDeadlines {
    clock: Clock,
    table: Mutex<LeaseTable>,
}

#[derive(Default)]
struct LeaseTable {
    leases: BTreeMap<SessionId, Lease>,
    /// No lease outside `expiring` has an earlier deadline. The leader scans the
    /// leases only once this has passed, instead of keeping them ordered by deadline
    /// as well (which cost every node 30 more bytes per session, and every keepalive
    /// two more tree updates). Renewals only move deadlines later, so they keep it
    /// valid; after a scan it is the earliest deadline left. While sessions are kept
    /// alive, a scan happens about once per two thirds of a TTL; when sessions keep
    /// expiring, once per `EXPIRY_SCAN_INTERVAL_MS` (a few milliseconds of one core per
    /// scan of a million sessions).
    earliest_ms: MonotonicMs,
    /// Sessions whose expiry was proposed and not yet applied: a keepalive for one
    /// of them is answered "not alive", because the expiry will win.
    expiring: BTreeSet<SessionId>,
}

impl LeaseTable {
    fn insert(&mut self, session: SessionId, lease: Lease) {
        self.leases.insert(session, lease);
        self.expiring.remove(&session);
        self.earliest_ms = self.earliest_ms.min(lease.deadline_ms());
    }

    fn remove(&mut self, session: SessionId) {
        self.leases.remove(&session);
        self.expiring.remove(&session);
    }

    /// Moves a deadline later (never earlier).
    fn extend(&mut self, session: SessionId, deadline_ms: MonotonicMs) -> Option<MonotonicMs> {
        let lease = self.leases.get_mut(&session)?;
        if deadline_ms > lease.deadline_ms() {
            *lease = Lease::new(lease.ttl_ms(), deadline_ms);
        }
        Some(lease.deadline_ms())
    }

    /// Forgets which expiries were proposed and makes the next scan look at every lease.
    fn rescan(&mut self) {
        self.expiring.clear();
        self.earliest_ms = 0;
    }

    /// Sessions whose deadline passed by `now` and that are not being expired yet, at
    /// most one command's worth, marked as being expired.
    fn take_expired(&mut self, now: MonotonicMs) -> Vec<SessionId> {
        if now < self.earliest_ms {
            return Vec::new();
        }
        let mut expired = Vec::new();
        let mut earliest_left = MonotonicMs::MAX;
        for (session, lease) in &self.leases {
            let deadline_ms = lease.deadline_ms();
            if deadline_ms > now {
                earliest_left = earliest_left.min(deadline_ms);
            } else if expired.len() == EXPIRE_SESSIONS_PER_COMMAND_MAX {
                // More than one command's worth: the next scan takes the rest.
                earliest_left = now;
            } else if !self.expiring.contains(session) {
                expired.push(*session);
            }
        }
        self.earliest_ms = earliest_left;
        self.expiring.extend(expired.iter().copied());
        expired
    }
}

impl SessionDeadlines {
    pub fn new(clock: Clock) -> Self {
        Self { clock, table: Mutex::new(LeaseTable::default()) }
    }

    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// A session was created by an applied entry.
    pub fn session_created(&self, session: SessionId, ttl_ms: u64) {
        let deadline_ms = self.clock.now_ms() + ttl_ms;
        self.table.lock().unwrap().insert(session, Lease::new(ttl_ms, deadline_ms));
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
        table.leases = sessions.into_iter().map(|(id, ttl_ms)| (id, Lease::new(ttl_ms, now + ttl_ms))).collect();
        table.rescan();
    }

    /// Restarts the deadline of every known session (this node just became leader).
    pub fn restart_deadlines(&self) {
        let now = self.clock.now_ms();
        let mut table = self.table.lock().unwrap();
        for lease in table.leases.values_mut() {
            *lease = Lease::new(lease.ttl_ms(), lease.deadline_ms().max(now + lease.ttl_ms()));
        }
        table.rescan();
    }

    /// A keepalive, after the leader confirmed its leadership: returns the TTL the
    /// session now has, or None when the session is gone or being expired.
    pub fn renew(&self, session: SessionId) -> Option<u64> {
        let now = self.clock.now_ms();
        let mut table = self.table.lock().unwrap();
        if table.expiring.contains(&session) {
            return None;
        }
        let ttl_ms = table.leases.get(&session)?.ttl_ms();
        let deadline_ms = table.extend(session, now + ttl_ms)?;
        Some(deadline_ms - now)
    }

    /// Time left before the session's deadline on this node's clock.
    pub fn remaining_ms(&self, session: SessionId) -> Option<u64> {
        let now = self.clock.now_ms();
        let table = self.table.lock().unwrap();
        table.leases.get(&session).map(|lease| lease.deadline_ms().saturating_sub(now))
    }

    /// Sessions whose deadline passed and whose expiry is not yet proposed, marked as
    /// proposed. At most one command's worth.
    pub fn take_expired(&self) -> Vec<SessionId> {
        let now = self.clock.now_ms();
        self.table.lock().unwrap().take_expired(now)
    }

    /// The proposal of these expiries failed (leadership lost): forget that they were
    /// proposed, so the next leader decides afresh.
    pub fn expiry_not_proposed(&self, sessions: &[SessionId]) {
        let mut table = self.table.lock().unwrap();
        for session in sessions {
            if table.expiring.remove(session) {
                if let Some(lease) = table.leases.get(session).copied() {
                    table.earliest_ms = table.earliest_ms.min(lease.deadline_ms());
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
        let leases = SessionDeadlines::new(clock.clone());
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

    #[test]
    fn a_lease_packs_its_ttl_and_deadline_into_one_word() {
        let lease = Lease::new(SESSION_TTL_MS_MAX, DEADLINE_MS_MAX);
        assert_eq!((lease.ttl_ms(), lease.deadline_ms()), (SESSION_TTL_MS_MAX, DEADLINE_MS_MAX));
        let lease = Lease::new(1_000, 123_456);
        assert_eq!((lease.ttl_ms(), lease.deadline_ms()), (1_000, 123_456));
        assert_eq!(std::mem::size_of::<Lease>(), 8);
    }

    #[test]
    fn a_scan_finds_every_expired_session_without_ordering_the_deadlines() {
        let clock = Clock::manual();
        let leases = SessionDeadlines::new(clock.clone());
        leases.session_created(1, 10_000);
        assert!(leases.take_expired().is_empty(), "the scan notes 10 s as the earliest deadline");
        // A session created after the scan with an earlier deadline still expires on time.
        leases.session_created(2, 1_000);
        clock.advance(Duration::from_millis(1_000));
        assert_eq!(leases.take_expired(), vec![2]);
        // Kept alive, session 1 never expires.
        for _ in 0..30 {
            clock.advance(Duration::from_millis(1_000));
            assert_eq!(leases.renew(1), Some(10_000));
            assert!(leases.take_expired().is_empty());
        }

        // More expired sessions than one command may end: the next scan takes the rest.
        let many = EXPIRE_SESSIONS_PER_COMMAND_MAX as u64 + 5;
        for session in 10..10 + many {
            leases.session_created(session, 1_000);
        }
        clock.advance(Duration::from_millis(1_000));
        let first = leases.take_expired();
        assert_eq!(first.len(), EXPIRE_SESSIONS_PER_COMMAND_MAX);
        let second = leases.take_expired();
        assert_eq!(second.len(), 5);
        assert!(first.iter().all(|session| !second.contains(session)));
        assert!(leases.take_expired().is_empty());

        // An expiry that was not proposed is found again by the next scan.
        leases.expiry_not_proposed(&second);
        assert_eq!(leases.take_expired(), second);
    }
}
