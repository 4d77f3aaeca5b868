//! The invariants of the state, checked by tests after every apply.

use super::StateMachine;
use crate::limits::{
    CLIENT_NAME_BYTES_MAX, LOCKS_PER_SESSION_MAX, LOCK_NAME_BYTES_MAX,
    REQUESTS_REMEMBERED_PER_SESSION_MAX, SESSIONS_MAX, SESSION_TTL_MS_MAX, SESSION_TTL_MS_MIN,
    WAITERS_PER_LOCK_MAX,
};

impl StateMachine {
    /// Asserts every invariant of the state.
    ///
    /// # Panics
    ///
    /// Naming the broken invariant, unless the state is consistent.
    ///
    /// Some invariants hold by construction and need no check here: a lock has a single
    /// `holder` field, so it cannot have two holders, and a free lock has no entry, so it
    /// cannot keep waiters (the first waiter is granted when the holder leaves).
    ///
    /// Linear in the size of the state (quadratic in one session's list of locks, which is
    /// bounded), for tests to call after every apply.
    pub fn check_invariants(&self) {
        let last_applied = self.last_applied;
        assert!(
            self.sessions.len() <= SESSIONS_MAX,
            "{} sessions exceed SESSIONS_MAX",
            self.sessions.len()
        );
        let mut held_total = 0;
        let mut waiting_total = 0;
        let mut remembered_total = 0;
        for (id, session) in &self.sessions {
            assert_eq!(*id, session.id, "session {id} is stored under another id");
            assert!(
                last_applied.is_some_and(|last_applied| *id <= last_applied),
                "session {id} was created after the last applied index {last_applied:?}"
            );
            assert!(
                (SESSION_TTL_MS_MIN..=SESSION_TTL_MS_MAX).contains(&session.ttl_ms),
                "session {id} has a ttl of {} ms, outside the allowed range",
                session.ttl_ms
            );
            assert!(
                session.client_name.len() <= CLIENT_NAME_BYTES_MAX,
                "session {id} has a client name over CLIENT_NAME_BYTES_MAX"
            );
            assert!(
                session.lock_count() <= LOCKS_PER_SESSION_MAX,
                "session {id} holds or waits on {} locks, over LOCKS_PER_SESSION_MAX",
                session.lock_count()
            );
            for (position, name) in session.held.iter().enumerate() {
                assert!(
                    !session.held[..position].contains(name),
                    "session {id} lists lock {name:?} as held twice"
                );
                assert!(
                    !session.waiting.contains(name),
                    "session {id} both holds and waits on lock {name:?}"
                );
                let lock = self.locks.get(name).unwrap_or_else(|| {
                    panic!("session {id} lists lock {name:?} as held, but it is free")
                });
                assert_eq!(
                    lock.holder.session, *id,
                    "session {id} lists lock {name:?} as held, but another session holds it"
                );
            }
            for (position, name) in session.waiting.iter().enumerate() {
                assert!(
                    !session.waiting[..position].contains(name),
                    "session {id} lists lock {name:?} as waited on twice"
                );
                let lock = self.locks.get(name).unwrap_or_else(|| {
                    panic!("session {id} waits on lock {name:?}, which is free")
                });
                assert!(
                    lock.waiters.contains(id),
                    "session {id} lists lock {name:?} as waited on, but is not in its queue"
                );
            }
            assert!(
                session.remembered.len() <= REQUESTS_REMEMBERED_PER_SESSION_MAX,
                "session {id} remembers {} answers, over REQUESTS_REMEMBERED_PER_SESSION_MAX",
                session.remembered.len()
            );
            for remembered in &session.remembered {
                assert_eq!(
                    self.requests.get(&remembered.request),
                    Some(id),
                    "session {id} remembers {:?}, but the request index disagrees",
                    remembered.request
                );
            }
            held_total += session.held.len();
            waiting_total += session.waiting.len();
            remembered_total += session.remembered.len();
        }

        let mut waiters_total = 0;
        for (name, lock) in &self.locks {
            assert!(
                !name.is_empty() && name.len() <= LOCK_NAME_BYTES_MAX,
                "lock name {name:?} breaks the name rules"
            );
            let holder = lock.holder.session;
            let holder_session = self.sessions.get(&holder).unwrap_or_else(|| {
                panic!("lock {name:?} is held by session {holder}, which does not exist")
            });
            assert!(
                holder_session.held.contains(name),
                "lock {name:?} is held by session {holder}, which does not list it"
            );
            assert!(
                last_applied.is_some_and(|last_applied| lock.holder.token <= last_applied),
                "lock {name:?} has token {} after the last applied index {last_applied:?}",
                lock.holder.token
            );
            assert!(
                lock.holder.token > holder,
                "lock {name:?} was granted at {} to session {holder}, created no earlier",
                lock.holder.token
            );
            assert!(
                lock.waiters.len() <= WAITERS_PER_LOCK_MAX,
                "lock {name:?} has {} waiters, over WAITERS_PER_LOCK_MAX",
                lock.waiters.len()
            );
            for (position, waiter) in lock.waiters.iter().enumerate() {
                assert!(
                    !lock.waiters[..position].contains(waiter),
                    "session {waiter} is queued twice on lock {name:?}"
                );
                assert_ne!(
                    *waiter, holder,
                    "session {holder} both holds and waits on lock {name:?}"
                );
                let waiter_session = self.sessions.get(waiter).unwrap_or_else(|| {
                    panic!("session {waiter} waits on lock {name:?} but does not exist")
                });
                assert!(
                    waiter_session.waiting.contains(name),
                    "session {waiter} is queued on lock {name:?} but does not list it"
                );
            }
            waiters_total += lock.waiters.len();
        }

        // With the checks in both directions above, equal totals mean the sessions' lists
        // and the lock table describe the same grants and waits.
        assert_eq!(
            held_total,
            self.locks.len(),
            "sessions list {held_total} held locks, the table has {}",
            self.locks.len()
        );
        assert_eq!(
            waiting_total, waiters_total,
            "sessions list {waiting_total} waits, the queues have {waiters_total}"
        );
        // Each remembered answer points back at its session, and the index maps a request
        // to one session, so equal counts make the index and the sessions agree exactly.
        assert_eq!(
            remembered_total,
            self.requests.len(),
            "sessions remember {remembered_total} answers, the request index has {}",
            self.requests.len()
        );
    }
}
