//! Session deadlines, kept on every node from the applied log and acted on by the
//! leader.
//!
//! Every node tracks each session's deadline on its monotonic clock as sessions are
//! created and ended by applied entries, so a node that becomes leader already knows
//! every session. Keepalives renew a deadline only on the leader, after it confirmed
//! its leadership and applied everything committed before, and never write the log:
//! the deadline becomes the keepalive's arrival plus the TTL.
//!
//! A leader change may lengthen a lease, never shorten it, and lengthens it by a
//! bounded amount (see `leasehold_proto::lease`). Followers do not see keepalives, so
//! a new leader cannot know when a session was last kept alive, except for the ones
//! the leader checkpointed: a session that sent no keepalive for `quiet_after_ms(TTL)`
//! is listed, with the time its lease had left, in a `CheckpointSessions` entry. Every
//! node that applies it sets that session's deadline to the apply time plus that
//! remaining time (never earlier than the leader's: the entry is applied after it was
//! proposed), and marks it quiet. A new leader keeps the deadlines of quiet sessions
//! and starts the others afresh from its first moment as leader (now + TTL), which is
//! after the last keepalive any earlier leader answered. A keepalive for a quiet
//! session is answered only after a `CheckpointSessions` that resumes it committed, so
//! the log never says a session is quiet while a leader extended it. Live sessions
//! send a keepalive more often than `quiet_after_ms` and never cost a log write.
//!
//! When a deadline passes the leader proposes `ExpireSessions`; applying it ends the
//! session.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use leasehold_proto::lease::{quiet_after_ms, with_drift_ms};

use crate::machine::limits::{
    CHECKPOINT_SESSIONS_PER_COMMAND_MAX, EXPIRE_SESSIONS_PER_COMMAND_MAX, SESSION_TTL_MS_MAX,
};
use crate::machine::SessionId;
use crate::shell::clock::{Clock, MonotonicMs};

/// How often the leader looks for expired and quiet sessions.
pub const EXPIRY_SCAN_INTERVAL_MS: u64 = leasehold_proto::lease::CHECKPOINT_SCAN_MS;

/// Bits of a `Lease` that hold the TTL; one more holds the quiet mark; the rest hold
/// the deadline.
const TTL_BITS: u32 = 22;
const DEADLINE_BITS: u32 = u64::BITS - 1 - TTL_BITS;
const DEADLINE_MS_MAX: MonotonicMs = (1 << DEADLINE_BITS) - 1;
const QUIET_BIT: u64 = 1 << (u64::BITS - 1);
const _: () = assert!(SESSION_TTL_MS_MAX < 1 << TTL_BITS);

/// A session's TTL, quiet mark and deadline in one word: every node keeps one per
/// session, so a map slot is 16 bytes rather than 24. The deadline is in milliseconds
/// of this node's monotonic clock and has 41 bits: 69 years. Quiet means that the
/// applied log holds a checkpoint of the session (see the module's comment).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Lease(u64);

impl Lease {
    fn new(ttl_ms: u64, deadline_ms: MonotonicMs, quiet: bool) -> Lease {
        debug_assert!(ttl_ms <= SESSION_TTL_MS_MAX);
        let quiet = if quiet { QUIET_BIT } else { 0 };
        Lease(quiet | ttl_ms << DEADLINE_BITS | deadline_ms.min(DEADLINE_MS_MAX))
    }

    fn ttl_ms(self) -> u64 {
        (self.0 & !QUIET_BIT) >> DEADLINE_BITS
    }

    fn deadline_ms(self) -> MonotonicMs {
        self.0 & DEADLINE_MS_MAX
    }

    fn quiet(self) -> bool {
        self.0 & QUIET_BIT != 0
    }

    /// When the session, unless kept alive, is quiet enough to be checkpointed.
    fn quiet_at_ms(self) -> MonotonicMs {
        self.deadline_ms().saturating_sub(self.ttl_ms()) + quiet_after_ms(self.ttl_ms())
    }
}

/// What a keepalive gets (see `SessionDeadlines::renew`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renewal {
    /// The session is alive with this much time left (ms from now).
    Alive { ttl_ms: u64 },
    /// The session is checkpointed as quiet: a `CheckpointSessions` that resumes it must
    /// commit before it is renewed.
    Resume,
    /// The session is gone or being expired.
    Gone,
}

/// What the leader's scan found (see `SessionDeadlines::take_due`).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Due {
    /// Sessions whose deadline passed, to propose `ExpireSessions` for.
    pub expired: Vec<SessionId>,
    /// Sessions that went quiet, with the time their lease has left, to checkpoint.
    pub quiet: Vec<(SessionId, u64)>,
}

pub struct SessionDeadlines {
    clock: Clock,
    table: Mutex<LeaseTable>,
    /// A planted bug for the control runs (`shorten_restarts_for_tests`).
    shortened_restarts: AtomicBool,
}

#[derive(Default)]
struct LeaseTable {
    leases: BTreeMap<SessionId, Lease>,
    /// No lease outside `expiring` has an earlier deadline, and none that is not quiet
    /// nor in `checkpointing` an earlier `quiet_at_ms`. The leader scans the leases
    /// only once this has passed, instead of keeping them ordered by deadline as well
    /// (which cost every node 30 more bytes per session, and every keepalive two more
    /// tree updates). Renewals only move deadlines later, so they keep it valid; after
    /// a scan it is the earliest time left. While sessions are kept alive, a scan
    /// happens about once per TTL / 30 (the time between a keepalive's due moment and
    /// the session's quiet moment); when sessions keep expiring, once per
    /// `EXPIRY_SCAN_INTERVAL_MS` (a few milliseconds of one core per scan of a million
    /// sessions).
    earliest_ms: MonotonicMs,
    /// Sessions whose expiry was proposed and not yet applied: a keepalive for one
    /// of them is answered "not alive", because the expiry will win.
    expiring: BTreeSet<SessionId>,
    /// Sessions whose checkpoint was proposed and not yet applied: a keepalive for one
    /// of them is answered with the time it has left, not renewed, because the
    /// checkpoint will say it has no more than that.
    checkpointing: BTreeSet<SessionId>,
}

impl LeaseTable {
    fn insert(&mut self, session: SessionId, lease: Lease) {
        self.leases.insert(session, lease);
        self.expiring.remove(&session);
        self.checkpointing.remove(&session);
        self.earliest_ms = self.earliest_ms.min(lease.deadline_ms()).min(lease.quiet_at_ms());
    }

    /// Changes a lease that exists, leaving what was proposed for it as it is.
    fn replace(&mut self, session: SessionId, lease: Lease) {
        if let Some(slot) = self.leases.get_mut(&session) {
            *slot = lease;
            self.earliest_ms = self.earliest_ms.min(lease.deadline_ms()).min(lease.quiet_at_ms());
        }
    }

    fn remove(&mut self, session: SessionId) {
        self.leases.remove(&session);
        self.expiring.remove(&session);
        self.checkpointing.remove(&session);
    }

    /// Forgets which expiries and checkpoints were proposed and makes the next scan
    /// look at every lease.
    fn rescan(&mut self) {
        self.expiring.clear();
        self.checkpointing.clear();
        self.earliest_ms = 0;
    }

    /// Sessions whose deadline passed by `now` and that are not being expired yet,
    /// and (with `checkpoints`) sessions that went quiet and are not checkpointed yet,
    /// at most one command's worth of each, marked as being expired or checkpointed.
    fn take_due(&mut self, now: MonotonicMs, checkpoints: bool) -> Due {
        let mut due = Due::default();
        if now < self.earliest_ms {
            return due;
        }
        let mut earliest_left = MonotonicMs::MAX;
        for (session, lease) in &self.leases {
            let deadline_ms = lease.deadline_ms();
            if deadline_ms <= now {
                if due.expired.len() == EXPIRE_SESSIONS_PER_COMMAND_MAX {
                    // More than one command's worth: the next scan takes the rest.
                    earliest_left = now;
                } else if !self.expiring.contains(session) {
                    due.expired.push(*session);
                }
                continue;
            }
            earliest_left = earliest_left.min(deadline_ms);
            if !checkpoints || lease.quiet() || self.checkpointing.contains(session) {
                continue;
            }
            let quiet_at_ms = lease.quiet_at_ms();
            if quiet_at_ms > now {
                earliest_left = earliest_left.min(quiet_at_ms);
            } else if due.quiet.len() == CHECKPOINT_SESSIONS_PER_COMMAND_MAX {
                earliest_left = now;
            } else {
                due.quiet.push((*session, deadline_ms - now));
            }
        }
        self.earliest_ms = earliest_left;
        self.expiring.extend(due.expired.iter().copied());
        self.checkpointing.extend(due.quiet.iter().map(|(session, _)| *session));
        due
    }
}

impl SessionDeadlines {
    pub fn new(clock: Clock) -> Self {
        Self { clock, table: Mutex::new(LeaseTable::default()), shortened_restarts: AtomicBool::new(false) }
    }

    /// Plants a bug for the control runs of the lease checks: a new leader restarts
    /// every live session at half its TTL from now, whatever the deadline it had, so
    /// that it can end a lease its holder still counts on. Never in production.
    pub fn shorten_restarts_for_tests(&self) {
        self.shortened_restarts.store(true, Ordering::Relaxed);
    }

    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// A session was created by an applied entry.
    pub fn session_created(&self, session: SessionId, ttl_ms: u64) {
        let deadline_ms = self.clock.now_ms() + ttl_ms;
        self.table.lock().unwrap().insert(session, Lease::new(ttl_ms, deadline_ms, false));
    }

    /// A session was closed or expired by an applied entry.
    pub fn session_ended(&self, session: SessionId) {
        self.table.lock().unwrap().remove(session);
    }

    /// An applied `CheckpointSessions` says the session has `left_ms` from now (what it
    /// had when the leader proposed it, with the clock-drift allowance, less what this
    /// node's record says passed since: see `raft::quiet_deadlines`): its deadline is
    /// that much from now, and it is quiet.
    pub fn checkpointed(&self, session: SessionId, left_ms: u64) {
        let now = self.clock.now_ms();
        let mut table = self.table.lock().unwrap();
        if let Some(lease) = table.leases.get(&session).copied() {
            table.replace(session, Lease::new(lease.ttl_ms(), now + left_ms, true));
            table.checkpointing.remove(&session);
        }
    }

    /// An applied `CheckpointSessions` resumes the session: it is no longer quiet, and
    /// has at least a TTL from now.
    pub fn resumed(&self, session: SessionId) {
        let now = self.clock.now_ms();
        let mut table = self.table.lock().unwrap();
        if let Some(lease) = table.leases.get(&session).copied() {
            let deadline_ms = lease.deadline_ms().max(now + lease.ttl_ms());
            table.replace(session, Lease::new(lease.ttl_ms(), deadline_ms, false));
        }
    }

    /// Replaces every lease (after a snapshot was installed or at start): a session
    /// the state holds a checkpoint of gets the time it has left by it (as for
    /// `checkpointed`), any other a fresh TTL.
    pub fn restart_all(&self, sessions: impl IntoIterator<Item = (SessionId, u64, Option<u64>)>) {
        let now = self.clock.now_ms();
        let mut table = self.table.lock().unwrap();
        table.leases = sessions
            .into_iter()
            .map(|(id, ttl_ms, quiet_remaining_ms)| {
                let lease = match quiet_remaining_ms {
                    Some(left_ms) => Lease::new(ttl_ms, now + left_ms, true),
                    None => Lease::new(ttl_ms, now + ttl_ms, false),
                };
                (id, lease)
            })
            .collect();
        table.rescan();
    }

    /// This node just became leader and applied everything committed before its term:
    /// quiet sessions keep the deadline their checkpoint gave; every other one gets a
    /// fresh TTL from now.
    pub fn restart_deadlines(&self) {
        let now = self.clock.now_ms();
        let shortened = self.shortened_restarts.load(Ordering::Relaxed);
        let mut table = self.table.lock().unwrap();
        for lease in table.leases.values_mut() {
            if shortened && !lease.quiet() {
                *lease = Lease::new(lease.ttl_ms(), now + lease.ttl_ms() / 2, false);
            } else if !lease.quiet() {
                *lease = Lease::new(lease.ttl_ms(), lease.deadline_ms().max(now + lease.ttl_ms()), false);
            }
        }
        table.rescan();
    }

    /// A keepalive that arrived at `arrived_ms` (this clock, before the leader confirmed
    /// its leadership for it): renews a live session to a TTL from then.
    pub fn renew(&self, session: SessionId, arrived_ms: MonotonicMs) -> Renewal {
        let now = self.clock.now_ms();
        let mut table = self.table.lock().unwrap();
        if table.expiring.contains(&session) {
            return Renewal::Gone;
        }
        let Some(lease) = table.leases.get(&session).copied() else { return Renewal::Gone };
        if lease.quiet() {
            return Renewal::Resume;
        }
        if table.checkpointing.contains(&session) {
            return Renewal::Alive { ttl_ms: lease.deadline_ms().saturating_sub(now) };
        }
        let deadline_ms = lease.deadline_ms().max(arrived_ms + lease.ttl_ms());
        table.leases.insert(session, Lease::new(lease.ttl_ms(), deadline_ms, false));
        Renewal::Alive { ttl_ms: deadline_ms.saturating_sub(now) }
    }

    /// Time left of a quiet session's lease that may be promised to its client in a
    /// keepalive answer that did not renew it: its deadline here, less the drift
    /// allowance its checkpoint added (at most a TTL's).
    pub fn unrenewed_ms(&self, session: SessionId) -> Option<u64> {
        let now = self.clock.now_ms();
        let table = self.table.lock().unwrap();
        let lease = table.leases.get(&session)?;
        let allowance_ms = with_drift_ms(lease.ttl_ms()) - lease.ttl_ms();
        Some(lease.deadline_ms().saturating_sub(now).saturating_sub(allowance_ms))
    }

    /// Time left before the session's deadline on this node's clock.
    pub fn remaining_ms(&self, session: SessionId) -> Option<u64> {
        let now = self.clock.now_ms();
        let table = self.table.lock().unwrap();
        table.leases.get(&session).map(|lease| lease.deadline_ms().saturating_sub(now))
    }

    /// Sessions whose deadline passed and whose expiry is not yet proposed, and (with
    /// `checkpoints`) sessions that went quiet and are not checkpointed yet, marked as
    /// proposed. At most one command's worth of each.
    pub fn take_due(&self, checkpoints: bool) -> Due {
        let now = self.clock.now_ms();
        self.table.lock().unwrap().take_due(now, checkpoints)
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

    /// The proposal of these checkpoints failed: the next scan takes them again.
    pub fn checkpoint_not_proposed(&self, sessions: &[(SessionId, u64)]) {
        let mut table = self.table.lock().unwrap();
        for (session, _) in sessions {
            if table.checkpointing.remove(session) {
                table.earliest_ms = 0;
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

    fn advance(clock: &Clock, ms: u64) {
        clock.advance(Duration::from_millis(ms));
    }

    fn renew_now(leases: &SessionDeadlines, session: SessionId) -> Renewal {
        leases.renew(session, leases.clock().now_ms())
    }

    #[test]
    fn expiry_renewal_and_new_leader_restart() {
        let clock = Clock::manual();
        let leases = SessionDeadlines::new(clock.clone());
        leases.session_created(1, 2_000);
        leases.session_created(2, 5_000);
        advance(&clock, 1_500);
        assert_eq!(renew_now(&leases, 1), Renewal::Alive { ttl_ms: 2_000 });
        advance(&clock, 2_100);
        assert_eq!(leases.take_due(false).expired, vec![1]);
        assert!(leases.take_due(false).expired.is_empty(), "an expiry is proposed once");
        assert_eq!(renew_now(&leases, 1), Renewal::Gone, "a session being expired is not renewed");
        leases.expiry_not_proposed(&[1]);

        // A new leader restarts every deadline that no checkpoint holds: nothing
        // expires for a full TTL.
        leases.restart_deadlines();
        advance(&clock, 1_999);
        assert!(leases.take_due(false).expired.is_empty());
        advance(&clock, 2);
        assert_eq!(leases.take_due(false).expired, vec![1]);
        leases.session_ended(1);
        assert_eq!(leases.len(), 1);
    }

    #[test]
    fn a_keepalive_renews_from_its_arrival_not_from_its_answer() {
        let clock = Clock::manual();
        let leases = SessionDeadlines::new(clock.clone());
        leases.session_created(1, 2_000);
        let arrived = clock.now_ms();
        advance(&clock, 300);
        // The leadership round took 300 ms: the lease runs from the arrival.
        assert_eq!(leases.renew(1, arrived), Renewal::Alive { ttl_ms: 1_700 });
        // A renewal never moves a deadline earlier.
        assert_eq!(leases.renew(1, arrived - 100.min(arrived)), Renewal::Alive { ttl_ms: 1_700 });
    }

    #[test]
    fn a_lease_packs_its_ttl_mark_and_deadline_into_one_word() {
        for quiet in [false, true] {
            let lease = Lease::new(SESSION_TTL_MS_MAX, DEADLINE_MS_MAX, quiet);
            assert_eq!(
                (lease.ttl_ms(), lease.deadline_ms(), lease.quiet()),
                (SESSION_TTL_MS_MAX, DEADLINE_MS_MAX, quiet)
            );
            let lease = Lease::new(1_000, 123_456, quiet);
            assert_eq!((lease.ttl_ms(), lease.deadline_ms(), lease.quiet()), (1_000, 123_456, quiet));
        }
        assert_eq!(std::mem::size_of::<Lease>(), 8);
    }

    #[test]
    fn a_scan_finds_every_expired_session_without_ordering_the_deadlines() {
        let clock = Clock::manual();
        let leases = SessionDeadlines::new(clock.clone());
        leases.session_created(1, 10_000);
        assert!(leases.take_due(false).expired.is_empty(), "the scan notes 10 s as the earliest deadline");
        // A session created after the scan with an earlier deadline still expires on time.
        leases.session_created(2, 1_000);
        advance(&clock, 1_000);
        assert_eq!(leases.take_due(false).expired, vec![2]);
        // Kept alive, session 1 never expires.
        for _ in 0..30 {
            advance(&clock, 1_000);
            assert_eq!(renew_now(&leases, 1), Renewal::Alive { ttl_ms: 10_000 });
            assert!(leases.take_due(false).expired.is_empty());
        }

        // More expired sessions than one command may end: the next scan takes the rest.
        let many = EXPIRE_SESSIONS_PER_COMMAND_MAX as u64 + 5;
        for session in 10..10 + many {
            leases.session_created(session, 1_000);
        }
        advance(&clock, 1_000);
        let first = leases.take_due(false).expired;
        assert_eq!(first.len(), EXPIRE_SESSIONS_PER_COMMAND_MAX);
        let second = leases.take_due(false).expired;
        assert_eq!(second.len(), 5);
        assert!(first.iter().all(|session| !second.contains(session)));
        assert!(leases.take_due(false).expired.is_empty());

        // An expiry that was not proposed is found again by the next scan.
        leases.expiry_not_proposed(&second);
        assert_eq!(leases.take_due(false).expired, second);
    }

    #[test]
    fn live_sessions_are_never_checkpointed_and_a_quiet_one_is_once() {
        let clock = Clock::manual();
        let leases = SessionDeadlines::new(clock.clone());
        let ttl_ms = 6_000;
        leases.session_created(1, ttl_ms);
        leases.session_created(2, ttl_ms);
        // Session 1 sends a keepalive every TTL / 6, 10 ms late each time; 2 is silent.
        let mut checkpoints = Vec::new();
        for step in 1..=50 {
            advance(&clock, 10);
            if step % 10 == 0 {
                for _ in 0..10 {
                    advance(&clock, 100);
                    checkpoints.extend(leases.take_due(true).quiet);
                }
                assert!(matches!(renew_now(&leases, 1), Renewal::Alive { .. }));
            }
        }
        // 2 went quiet at TTL / 5 + 100 ms = 1.3 s, and was taken then with what it had left.
        assert_eq!(checkpoints.len(), 1, "{checkpoints:?}");
        let (session, remaining_ms) = checkpoints[0];
        assert_eq!(session, 2);
        assert!((4_600..=4_700).contains(&remaining_ms), "{remaining_ms}");
        assert!(leases.take_due(true).quiet.is_empty(), "a checkpoint in flight is not taken again");
        leases.checkpointed(2, remaining_ms);
        assert!(leases.take_due(true).quiet.is_empty(), "a checkpointed session is not taken again");
    }

    #[test]
    fn a_new_leader_keeps_the_deadline_a_checkpoint_gave() {
        let leader_clock = Clock::manual();
        let leader = SessionDeadlines::new(leader_clock.clone());
        let follower_clock = Clock::manual();
        let follower = SessionDeadlines::new(follower_clock.clone());
        for leases in [&leader, &follower] {
            leases.session_created(1, 8_000);
            leases.session_created(2, 8_000);
        }
        // Session 1 dies at once; session 2 is kept alive.
        for _ in 0..20 {
            advance(&leader_clock, 100);
            advance(&follower_clock, 100);
            assert!(matches!(renew_now(&leader, 2), Renewal::Alive { .. }));
            let due = leader.take_due(true);
            for (session, remaining_ms) in &due.quiet {
                // The entry commits 5 ms later on the follower, which starts the
                // session from its remaining time and the drift allowance.
                advance(&follower_clock, 5);
                follower.checkpointed(*session, with_drift_ms(*remaining_ms));
                leader.checkpointed(*session, with_drift_ms(*remaining_ms));
            }
        }
        // 2 s after its death the leader dies too; the follower takes over at once.
        follower.restart_deadlines();
        let remaining_ms = follower.remaining_ms(1).unwrap();
        // 8 s - 2 s, plus the 5 ms the entry took and the drift allowance.
        assert!((6_000..=6_000 + 5 + 10).contains(&remaining_ms), "{remaining_ms}");
        // The live session restarts at a full TTL: its last keepalive may have been
        // answered just before the leader died.
        assert_eq!(follower.remaining_ms(2), Some(8_000));
        advance(&follower_clock, remaining_ms);
        assert_eq!(follower.take_due(true).expired, vec![1]);
    }

    #[test]
    fn a_quiet_session_is_renewed_only_after_it_is_resumed() {
        let clock = Clock::manual();
        let leases = SessionDeadlines::new(clock.clone());
        leases.session_created(1, 4_000);
        advance(&clock, 1_000);
        let due = leases.take_due(true);
        assert_eq!(due.quiet, vec![(1, 3_000)]);
        // While the checkpoint is in flight a keepalive gets what is left, no more.
        advance(&clock, 10);
        assert_eq!(renew_now(&leases, 1), Renewal::Alive { ttl_ms: 2_990 });
        leases.checkpointed(1, 3_000);
        assert_eq!(renew_now(&leases, 1), Renewal::Resume);
        leases.resumed(1);
        assert_eq!(leases.remaining_ms(1), Some(4_000));
        advance(&clock, 100);
        assert_eq!(renew_now(&leases, 1), Renewal::Alive { ttl_ms: 4_000 });

        // A checkpoint that was not proposed is taken again by a later scan.
        advance(&clock, 2_000);
        let due = leases.take_due(true);
        assert_eq!(due.quiet.len(), 1);
        leases.checkpoint_not_proposed(&due.quiet);
        assert_eq!(leases.take_due(true).quiet.len(), 1);
    }

    #[test]
    fn a_restart_from_the_state_starts_checkpointed_sessions_from_their_remaining_time() {
        let clock = Clock::manual();
        let leases = SessionDeadlines::new(clock.clone());
        advance(&clock, 50_000);
        leases.restart_all([(1, 10_000, Some(2_002)), (2, 10_000, None)]);
        assert_eq!(leases.remaining_ms(1), Some(2_002));
        assert_eq!(leases.unrenewed_ms(1), Some(2_002 - 10), "less a TTL's drift allowance");
        assert_eq!(leases.remaining_ms(2), Some(10_000));
        assert_eq!(renew_now(&leases, 1), Renewal::Resume);
    }
}
