//! One entry of the lock table, and the commands on locks: acquire, cancel a wait,
//! release, and the hand-over to the next waiter.

use serde::{Deserialize, Serialize};
use thin_vec::ThinVec;

use super::caller::TenantId;
use super::error::{not_holder, session_locks_full, unknown_session, waiters_full};
use super::session::{push_compact, Role};
use super::{
    position_u32, remove_name, AcquireOutcome, CancelOutcome, CommandError, Event, ResourceKind, Response, SessionId,
    StateMachine, Token, WaitFailure,
};
use crate::machine::limits::{LOCKS_PER_SESSION_MAX, WAITERS_PER_LOCK_MAX};

/// A lock that is held. A free lock has no entry at all: when the holder leaves and no
/// one waits the entry is removed, so the table is bounded by the held locks, and a lock
/// with waiters always has a holder because the first waiter is granted at once.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub(super) struct Lock {
    pub(super) holder: Holder,
    /// Sessions waiting, first in line first. A `ThinVec` (one pointer, no heap while
    /// empty) rather than a `Vec` or `VecDeque`, because most held locks have no
    /// waiters and every byte here is paid in every slot of the lock table; queues are
    /// short (`WAITERS_PER_LOCK_MAX`), so taking the first one out is cheap.
    pub(super) waiters: ThinVec<SessionId>,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Holder {
    pub(super) session: SessionId,
    /// The index of the entry that granted the lock: the fencing token.
    pub(super) token: Token,
    /// The leader's stamp of that entry, shown by describe queries only.
    pub(super) since_ms: u64,
}

impl StateMachine {
    /// `delay_ms` is the lock-delay a new grant or wait carries (see `delay`); 0 for
    /// none. A session that already holds or waits keeps the delay it asked for first.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn acquire(
        &mut self,
        index: u64,
        stamp_ms: u64,
        session_id: SessionId,
        name: &str,
        wait: bool,
        delay_ms: u64,
        events: &mut Vec<Event>,
    ) -> Result<AcquireOutcome, CommandError> {
        let Some(session) = self.sessions.get(&session_id) else {
            return Err(unknown_session(session_id));
        };
        let tenant = session.tenant;
        let count = session.resource_count();
        let Some(lock) = self.namespace(tenant).locks.get(name) else {
            self.admit_hold(tenant, session_id, count)?;
            self.namespace_mut(tenant).locks.insert(
                name.into(),
                Lock {
                    holder: Holder { session: session_id, token: index, since_ms: stamp_ms },
                    waiters: ThinVec::new(),
                },
            );
            push_compact(&mut self.session_mut(session_id).held, name.to_owned());
            self.note_claim_delay(session_id, ResourceKind::Lock, name, delay_ms);
            events.push(Event::Granted {
                kind: ResourceKind::Lock,
                name: name.to_owned(),
                session: session_id,
                token: index,
            });
            return Ok(AcquireOutcome::Granted { token: index });
        };
        if lock.holder.session == session_id {
            // Not a new grant: the token must stay the one the holder already fences with.
            return Ok(AcquireOutcome::Granted { token: lock.holder.token });
        }
        if !wait {
            // Even when this session also waits in the queue: a try-lock asks whether it
            // holds the lock now, and it does not.
            return Ok(AcquireOutcome::Busy { holder: lock.holder.session, token: lock.holder.token });
        }
        if let Some(position) = queue_position(lock, session_id) {
            return Ok(AcquireOutcome::Queued { position });
        }
        if count >= LOCKS_PER_SESSION_MAX {
            return Err(session_locks_full(session_id, count));
        }
        if lock.waiters.len() >= WAITERS_PER_LOCK_MAX {
            return Err(waiters_full(ResourceKind::Lock, name, lock.waiters.len()));
        }
        let position = position_u32(lock.waiters.len());
        self.check_quota(tenant, Role::Waits)?;
        push_compact(&mut self.lock_mut(tenant, name).waiters, session_id);
        push_compact(&mut self.session_mut(session_id).waiting, name.to_owned());
        self.note_claim_delay(session_id, ResourceKind::Lock, name, delay_ms);
        Ok(AcquireOutcome::Queued { position })
    }

    pub(super) fn cancel_wait(
        &mut self,
        session_id: SessionId,
        name: &str,
        events: &mut Vec<Event>,
    ) -> Result<CancelOutcome, CommandError> {
        let Some(session) = self.sessions.get_mut(&session_id) else {
            return Err(unknown_session(session_id));
        };
        let Some(lock) = self.namespaces.get_mut(&session.tenant).and_then(|namespace| namespace.locks.get_mut(name))
        else {
            return Ok(CancelOutcome::NotWaiting);
        };
        if lock.holder.session == session_id {
            return Ok(CancelOutcome::AlreadyGranted { token: lock.holder.token });
        }
        let Some(position) = lock.waiters.iter().position(|waiter| *waiter == session_id) else {
            return Ok(CancelOutcome::NotWaiting);
        };
        // The lock keeps its holder, so no one is granted here.
        lock.waiters.remove(position);
        remove_name(&mut session.waiting, name);
        self.forget_claim_delay(session_id, ResourceKind::Lock, name);
        events.push(Event::WaitFailed {
            kind: ResourceKind::Lock,
            name: name.to_owned(),
            session: session_id,
            reason: WaitFailure::Cancelled,
        });
        Ok(CancelOutcome::Cancelled)
    }

    pub(super) fn release(
        &mut self,
        index: u64,
        stamp_ms: u64,
        session_id: SessionId,
        name: &str,
        token: Token,
        events: &mut Vec<Event>,
    ) -> Result<Response, CommandError> {
        let Some(tenant) = self.sessions.get(&session_id).map(|session| session.tenant) else {
            return Err(unknown_session(session_id));
        };
        self.check_lock_holder(tenant, session_id, name, token)?;
        remove_name(&mut self.session_mut(session_id).held, name);
        self.forget_claim_delay(session_id, ResourceKind::Lock, name);
        events.push(Event::Released { kind: ResourceKind::Lock, name: name.to_owned(), session: session_id, token });
        self.hand_over(index, stamp_ms, tenant, name, events);
        Ok(Response::Released { token })
    }

    /// Rejects a release whose token is not the session's current grant of `name` in
    /// `tenant`'s namespace.
    pub(super) fn check_lock_holder(
        &self,
        tenant: TenantId,
        session_id: SessionId,
        name: &str,
        token: Token,
    ) -> Result<(), CommandError> {
        let current = self.namespace(tenant).locks.get(name).map(|lock| (lock.holder.session, lock.holder.token));
        if current != Some((session_id, token)) {
            // A stale token must not release a later grant of the same session either:
            // the release may come from the paused process that held the earlier grant.
            return Err(not_holder(session_id, name, token, current));
        }
        Ok(())
    }

    /// The holder of `name` in `tenant`'s namespace has left (and no longer lists it):
    /// the first waiter gets the lock with this entry's index as its token, or the
    /// entry goes if no one waits.
    pub(super) fn hand_over(
        &mut self,
        index: u64,
        stamp_ms: u64,
        tenant: TenantId,
        name: &str,
        events: &mut Vec<Event>,
    ) {
        let lock = self.lock_mut(tenant, name);
        if lock.waiters.is_empty() {
            self.namespace_mut(tenant).locks.remove(name);
            self.drop_namespace_if_unused(tenant);
            return;
        }
        assert!(index > lock.holder.token, "tokens of one lock strictly increase: {index} after {}", lock.holder.token);
        let next = lock.waiters.remove(0);
        lock.holder = Holder { session: next, token: index, since_ms: stamp_ms };
        let session = self.session_mut(next);
        remove_name(&mut session.waiting, name);
        push_compact(&mut session.held, name.to_owned());
        events.push(Event::Granted { kind: ResourceKind::Lock, name: name.to_owned(), session: next, token: index });
    }

    pub(super) fn wait_outcome(&self, session: SessionId, name: &str) -> AcquireOutcome {
        let Some(lock) = self.namespace(self.session(session).tenant).locks.get(name) else {
            return AcquireOutcome::TimedOut;
        };
        if lock.holder.session == session {
            return AcquireOutcome::Granted { token: lock.holder.token };
        }
        match queue_position(lock, session) {
            Some(position) => AcquireOutcome::Queued { position },
            None => AcquireOutcome::TimedOut,
        }
    }

    pub(super) fn lock(&self, tenant: TenantId, name: &str) -> &Lock {
        self.namespace(tenant).locks.get(name).unwrap_or_else(|| panic!("lock {name:?} is referenced but not held"))
    }

    pub(super) fn lock_mut(&mut self, tenant: TenantId, name: &str) -> &mut Lock {
        self.namespaces
            .get_mut(&tenant)
            .and_then(|namespace| namespace.locks.get_mut(name))
            .unwrap_or_else(|| panic!("lock {name:?} is referenced but not held"))
    }
}

pub(super) fn queue_position(lock: &Lock, session: SessionId) -> Option<u32> {
    lock.waiters.iter().position(|waiter| *waiter == session).map(position_u32)
}
