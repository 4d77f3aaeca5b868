//! One entry of the semaphore table, and the commands on semaphores.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use super::caller::TenantId;
use super::error::{
    limit_mismatch, not_permit_holder, semaphore_unused, session_locks_full, unknown_session, waiters_full,
};
use super::lock::Holder;
use super::session::Role;
use super::{
    position_u32, AcquireOutcome, CancelOutcome, CommandError, Event, ResourceKind, Response, SessionId, StateMachine,
    Token, WaitFailure,
};
use crate::machine::limits::{LOCKS_PER_SESSION_MAX, WAITERS_PER_LOCK_MAX};

const KIND: ResourceKind = ResourceKind::Semaphore;

/// A semaphore that has holders or waiters; an unused one has no entry, and the next
/// acquirer sets its limit afresh.
///
/// A free permit is never left while someone waits: waiters are granted, first in line
/// first, whenever a permit is returned or the limit is raised, in that same entry. So
/// a semaphore with waiters has at least `limit` holders, and a semaphore with a holder
/// or a waiter has a holder.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub(super) struct Semaphore {
    /// Holders allowed at once. Lowering it revokes no permit, so `holders` may exceed it
    /// until enough holders leave.
    pub(super) limit: u32,
    /// The index of the entry that set the current limit: the first acquire, or the last
    /// `SemSetLimit` that changed it. Every grant finds fewer holders than the limit, so
    /// a semaphore with more holders than its limit has granted nothing since this index;
    /// the invariant check relies on it.
    pub(super) limit_set_index: u64,
    /// In the order of the grants. Permits granted in one entry share its index as their
    /// token, so tokens do not decrease along the list and several holders may share one.
    pub(super) holders: Vec<Holder>,
    /// Sessions waiting, first in line first.
    pub(super) waiters: Vec<SessionId>,
}

impl Semaphore {
    pub(super) fn holder(&self, session: SessionId) -> Option<&Holder> {
        self.holders.iter().find(|holder| holder.session == session)
    }

    pub(super) fn waiter_position(&self, session: SessionId) -> Option<u32> {
        self.waiters.iter().position(|waiter| *waiter == session).map(position_u32)
    }

    /// Whether a new acquirer gets a permit at once: one is free and nobody waits for it.
    fn has_free_permit(&self) -> bool {
        self.waiters.is_empty() && self.holders.len() < self.limit_usize()
    }

    pub(super) fn limit_usize(&self) -> usize {
        usize::try_from(self.limit).expect("SEMAPHORE_LIMIT_MAX fits a usize")
    }
}

impl StateMachine {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn sem_acquire(
        &mut self,
        index: u64,
        stamp_ms: u64,
        session_id: SessionId,
        name: &str,
        limit: u32,
        wait: bool,
        delay_ms: u64,
        events: &mut Vec<Event>,
    ) -> Result<AcquireOutcome, CommandError> {
        let Some(session) = self.sessions.get(&session_id) else {
            return Err(unknown_session(session_id));
        };
        let tenant = session.tenant;
        let count = session.resource_count();
        let Some(semaphore) = self.namespace(tenant).semaphores.get(name) else {
            self.admit_hold(tenant, session_id, count)?;
            self.namespace_mut(tenant).semaphores.insert(
                name.to_owned(),
                Semaphore { limit, limit_set_index: index, holders: Vec::new(), waiters: Vec::new() },
            );
            self.grant_permit(index, stamp_ms, tenant, name, session_id, events);
            self.note_claim_delay(session_id, KIND, name, delay_ms);
            return Ok(AcquireOutcome::Granted { token: index });
        };
        if semaphore.limit != limit {
            return Err(limit_mismatch(name, limit, semaphore.limit));
        }
        if let Some(holder) = semaphore.holder(session_id) {
            // One permit per session: the token stays the one the holder fences with.
            return Ok(AcquireOutcome::Granted { token: holder.token });
        }
        if semaphore.has_free_permit() {
            self.admit_hold(tenant, session_id, count)?;
            self.grant_permit(index, stamp_ms, tenant, name, session_id, events);
            self.note_claim_delay(session_id, KIND, name, delay_ms);
            return Ok(AcquireOutcome::Granted { token: index });
        }
        if !wait {
            let first = semaphore.holders.first().expect("a semaphore without a free permit has a holder");
            return Ok(AcquireOutcome::Busy { holder: first.session, token: first.token });
        }
        if let Some(position) = semaphore.waiter_position(session_id) {
            return Ok(AcquireOutcome::Queued { position });
        }
        if count >= LOCKS_PER_SESSION_MAX {
            return Err(session_locks_full(session_id, count));
        }
        if semaphore.waiters.len() >= WAITERS_PER_LOCK_MAX {
            return Err(waiters_full(KIND, name, semaphore.waiters.len()));
        }
        let position = position_u32(semaphore.waiters.len());
        self.check_quota(tenant, Role::Waits)?;
        self.semaphore_mut(tenant, name).waiters.push(session_id);
        self.session_mut(session_id).add_claim(KIND, Role::Waits, name);
        self.note_claim_delay(session_id, KIND, name, delay_ms);
        Ok(AcquireOutcome::Queued { position })
    }

    pub(super) fn sem_release(
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
        self.check_permit_holder(tenant, session_id, name, token)?;
        let semaphore = self.semaphore_mut(tenant, name);
        semaphore.holders.retain(|holder| holder.session != session_id);
        self.session_mut(session_id).remove_claim(KIND, Role::Holds, name);
        self.forget_claim_delay(session_id, KIND, name);
        events.push(Event::Released { kind: KIND, name: name.to_owned(), session: session_id, token });
        self.fill_semaphore(index, stamp_ms, tenant, name, events);
        Ok(Response::SemReleased { token })
    }

    /// Rejects a permit's release whose token is not the session's current permit of
    /// `name` in `tenant`'s namespace.
    pub(super) fn check_permit_holder(
        &self,
        tenant: TenantId,
        session_id: SessionId,
        name: &str,
        token: Token,
    ) -> Result<(), CommandError> {
        let current = self
            .namespace(tenant)
            .semaphores
            .get(name)
            .and_then(|semaphore| semaphore.holder(session_id))
            .map(|holder| holder.token);
        if current != Some(token) {
            return Err(not_permit_holder(session_id, name, token, current));
        }
        Ok(())
    }

    /// Lowering the limit revokes nobody; raising it grants waiters up to the new limit
    /// in this entry.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn sem_set_limit(
        &mut self,
        index: u64,
        stamp_ms: u64,
        session_id: SessionId,
        name: &str,
        limit: u32,
        of_tenant: Option<TenantId>,
        events: &mut Vec<Event>,
    ) -> Result<Response, CommandError> {
        let Some(own) = self.sessions.get(&session_id).map(|session| session.tenant) else {
            return Err(unknown_session(session_id));
        };
        // `authorize` let another tenant's semaphore through for the admin only.
        let tenant = of_tenant.unwrap_or(own);
        let Some(semaphore) = self.namespaces.get_mut(&tenant).and_then(|namespace| namespace.semaphores.get_mut(name))
        else {
            return Err(semaphore_unused(name));
        };
        let previous = semaphore.limit;
        if limit != previous {
            semaphore.limit = limit;
            semaphore.limit_set_index = index;
        }
        self.fill_semaphore(index, stamp_ms, tenant, name, events);
        Ok(Response::SemLimitSet { limit, previous })
    }

    pub(super) fn sem_cancel_wait(
        &mut self,
        session_id: SessionId,
        name: &str,
        events: &mut Vec<Event>,
    ) -> Result<CancelOutcome, CommandError> {
        let Some(tenant) = self.sessions.get(&session_id).map(|session| session.tenant) else {
            return Err(unknown_session(session_id));
        };
        let Some(semaphore) = self.namespaces.get_mut(&tenant).and_then(|namespace| namespace.semaphores.get_mut(name))
        else {
            return Ok(CancelOutcome::NotWaiting);
        };
        if let Some(holder) = semaphore.holder(session_id) {
            return Ok(CancelOutcome::AlreadyGranted { token: holder.token });
        }
        let Some(position) = semaphore.waiter_position(session_id) else {
            return Ok(CancelOutcome::NotWaiting);
        };
        // The semaphore has waiters, so no permit is free, and one waiter fewer frees
        // none: no one is granted here.
        semaphore.waiters.remove(position as usize);
        self.session_mut(session_id).remove_claim(KIND, Role::Waits, name);
        self.forget_claim_delay(session_id, KIND, name);
        events.push(Event::WaitFailed {
            kind: KIND,
            name: name.to_owned(),
            session: session_id,
            reason: WaitFailure::Cancelled,
        });
        Ok(CancelOutcome::Cancelled)
    }

    /// Where a queued `SemAcquire` of `session` stands now, for its retry.
    pub(super) fn sem_wait_outcome(&self, session: SessionId, name: &str) -> AcquireOutcome {
        let Some(semaphore) = self.namespace(self.session(session).tenant).semaphores.get(name) else {
            return AcquireOutcome::TimedOut;
        };
        if let Some(holder) = semaphore.holder(session) {
            return AcquireOutcome::Granted { token: holder.token };
        }
        match semaphore.waiter_position(session) {
            Some(position) => AcquireOutcome::Queued { position },
            None => AcquireOutcome::TimedOut,
        }
    }

    /// Returns the permits of sessions that are ending (and have left every queue
    /// already), then grants the freed permits to the waiters, first in line first.
    /// Semaphores are visited in name order and their holders in grant order, which fixes
    /// the order of the events. The ending sessions still exist and keep their claims:
    /// the caller drops them. When they `expired`, a permit whose grant carries a
    /// lock-delay stays in the holders, counted against the limit, and is listed in the
    /// answer with its delay, for the caller to hold back once the session is gone
    /// (see `delay`).
    pub(super) fn return_permits_of_ending(
        &mut self,
        index: u64,
        stamp_ms: u64,
        ending: &BTreeSet<SessionId>,
        expired: bool,
        events: &mut Vec<Event>,
    ) -> Vec<(TenantId, String, SessionId, Token, u32)> {
        let mut delayed = Vec::new();
        let names: BTreeSet<(TenantId, String)> = ending
            .iter()
            .flat_map(|session| {
                let session = self.session(*session);
                session.claimed(KIND, Role::Holds).map(|name| (session.tenant, name.to_owned()))
            })
            .collect();
        for (tenant, name) in names {
            // The ending holders' delays, looked up for this semaphore's holders only.
            let delays: Vec<(SessionId, u32)> = if expired && self.has_claim_delays() {
                let ending_holders: Vec<SessionId> = self
                    .semaphore_mut(tenant, &name)
                    .holders
                    .iter()
                    .map(|holder| holder.session)
                    .filter(|session| ending.contains(session))
                    .collect();
                ending_holders
                    .into_iter()
                    .map(|session| (session, self.claim_delay_ms(session, KIND, &name)))
                    .filter(|(_, delay_ms)| *delay_ms > 0)
                    .collect()
            } else {
                Vec::new()
            };
            let semaphore = self.semaphore_mut(tenant, &name);
            // All of them leave before anyone is granted, so the freed permits are
            // counted once and go to survivors only.
            semaphore.holders.retain(|holder| {
                if !ending.contains(&holder.session) {
                    return true;
                }
                events.push(Event::Released {
                    kind: KIND,
                    name: name.clone(),
                    session: holder.session,
                    token: holder.token,
                });
                match delays.iter().find(|(session, _)| *session == holder.session) {
                    Some((session, delay_ms)) => {
                        delayed.push((tenant, name.clone(), *session, holder.token, *delay_ms));
                        true
                    }
                    None => false,
                }
            });
            self.fill_semaphore(index, stamp_ms, tenant, &name, events);
        }
        delayed
    }

    /// Grants free permits of `name` to its waiters, first in line first, and removes the
    /// semaphore if it has neither holders nor waiters left.
    pub(super) fn fill_semaphore(
        &mut self,
        index: u64,
        stamp_ms: u64,
        tenant: TenantId,
        name: &str,
        events: &mut Vec<Event>,
    ) {
        loop {
            let semaphore = self.semaphore_mut(tenant, name);
            if semaphore.waiters.is_empty() {
                if semaphore.holders.is_empty() {
                    self.namespace_mut(tenant).semaphores.remove(name);
                    self.drop_namespace_if_unused(tenant);
                }
                return;
            }
            if semaphore.holders.len() >= semaphore.limit_usize() {
                return;
            }
            let next = semaphore.waiters.remove(0);
            self.session_mut(next).remove_claim(KIND, Role::Waits, name);
            self.grant_permit(index, stamp_ms, tenant, name, next, events);
        }
    }

    /// The one place that adds a holder: it asserts that the limit allows one more.
    pub(super) fn grant_permit(
        &mut self,
        index: u64,
        stamp_ms: u64,
        tenant: TenantId,
        name: &str,
        session: SessionId,
        events: &mut Vec<Event>,
    ) {
        let semaphore = self.semaphore_mut(tenant, name);
        assert!(
            semaphore.holders.len() < semaphore.limit_usize(),
            "semaphore {name:?} has {} holders and limit {}: no permit to grant",
            semaphore.holders.len(),
            semaphore.limit
        );
        if let Some(last) = semaphore.holders.last() {
            assert!(
                index >= last.token,
                "permit tokens of one semaphore do not decrease: {index} after {}",
                last.token
            );
        }
        semaphore.holders.push(Holder { session, token: index, since_ms: stamp_ms });
        self.session_mut(session).add_claim(KIND, Role::Holds, name);
        events.push(Event::Granted { kind: KIND, name: name.to_owned(), session, token: index });
    }

    pub(super) fn semaphore_mut(&mut self, tenant: TenantId, name: &str) -> &mut Semaphore {
        self.namespaces
            .get_mut(&tenant)
            .and_then(|namespace| namespace.semaphores.get_mut(name))
            .unwrap_or_else(|| panic!("semaphore {name:?} is referenced but unused"))
    }
}
