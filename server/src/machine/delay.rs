//! Lock-delay: a lock or permit whose holder's session expired goes to no one for the
//! delay its grant carries, so that a holder that is only slow (paused, partitioned)
//! has time to stop before anyone else acts. This is for side effects that no fencing
//! token can guard (an email, a call to an API without idempotency keys); storage
//! that checks tokens needs no delay.
//!
//! A grant carries a delay when its acquire asked for one (`Command::AcquireWithDelay`,
//! `Command::SemAcquireWithDelay`); `claim_delays` keeps it per session, kind and name
//! for holds and waits alike, since a waiter's request becomes its grant later. Only
//! an expiry holds a grant back: a release, a close or a removed tenant hand it on at
//! once, since the holder said it is done.
//!
//! A held-back grant stays in its table with the expired session as its holder, so a
//! lock keeps its queue (first in line first) and a semaphore counts the slot against
//! its limit. The session itself is gone, which is how every other rule tells a
//! held-back grant from a live one: its token is no longer current, no release can
//! name it, nobody lists it. `held_back` says for how long. The machine has no clock:
//! the leader arms a timer when it applies the expiry (and every node does, so that a
//! new leader already has them), and proposes `EndLockDelays` when it runs out; that
//! entry hands each lock to its first waiter, with the entry's index as the token.
//! Elections carry no delay.

use serde::{Deserialize, Serialize};

use super::caller::TenantId;
use super::error::{end_delays_batch_too_large, quota_exceeded};
use super::{
    Caller, Command, CommandError, Event, ResourceKind, Response, SessionId, StateMachine, Token, ADMIN_TENANT,
    COMMAND_LEVEL_LOCK_DELAY,
};
use crate::machine::limits::LOCK_DELAYS_ENDED_PER_COMMAND_MAX;

/// Names one held-back grant: the lock or semaphore and the expired session that held
/// it (several permits of one semaphore may be held back at once).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DelayKey {
    pub tenant: TenantId,
    pub kind: ResourceKind,
    pub name: String,
    pub session: SessionId,
}

/// A grant held back after its holder's session expired.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct HeldBack {
    /// How long, from the commit of the expiry, on the leader's monotonic clock.
    pub delay_ms: u32,
    /// The entry that expired the holder's session.
    pub since_index: u64,
    /// That entry's stamp plus the delay: when the delay ends, for people reading
    /// describe answers. The leader's timer decides, never this.
    pub until_ms: u64,
    /// The expired holder's client name, for describe answers: its session is gone.
    pub client_name: String,
    /// The token of the grant held back.
    pub token: Token,
}

/// A claim's delay, by session, kind and name. Session first, so that the claims of
/// an ending session are one range.
pub(super) type ClaimKey = (SessionId, ResourceKind, String);

impl StateMachine {
    /// Records the delay of a new hold or wait; 0 records nothing.
    pub(super) fn note_claim_delay(&mut self, session: SessionId, kind: ResourceKind, name: &str, delay_ms: u64) {
        if delay_ms == 0 {
            return;
        }
        let delay_ms = u32::try_from(delay_ms).expect("validated against LOCK_DELAY_MS_MAX");
        self.claim_delays.insert((session, kind, name.to_owned()), delay_ms);
        self.command_level = self.command_level.max(COMMAND_LEVEL_LOCK_DELAY);
    }

    /// A hold or wait ended without an expiry: its delay is no longer needed.
    pub(super) fn forget_claim_delay(&mut self, session: SessionId, kind: ResourceKind, name: &str) {
        if !self.claim_delays.is_empty() {
            self.claim_delays.remove(&(session, kind, name.to_owned()));
        }
    }

    /// The delay the claim of `session` on `name` carries; 0 for none.
    pub(super) fn claim_delay_ms(&self, session: SessionId, kind: ResourceKind, name: &str) -> u32 {
        if self.claim_delays.is_empty() {
            return 0;
        }
        self.claim_delays.get(&(session, kind, name.to_owned())).copied().unwrap_or(0)
    }

    /// Whether any hold or wait carries a delay: most clusters never use one, and
    /// then the expiry path looks nothing up.
    pub(super) fn has_claim_delays(&self) -> bool {
        !self.claim_delays.is_empty()
    }

    /// Drops every claim delay of an ending session.
    pub(super) fn forget_claim_delays_of(&mut self, session: SessionId) {
        if self.claim_delays.is_empty() {
            return;
        }
        let keys: Vec<ClaimKey> = self
            .claim_delays
            .range((session, ResourceKind::Lock, String::new())..)
            .take_while(|((owner, _, _), _)| *owner == session)
            .map(|(key, _)| key.clone())
            .collect();
        for key in keys {
            self.claim_delays.remove(&key);
        }
    }

    /// Holds back the grant of `session`, whose session expired in the entry at
    /// `index` and is gone from the session table; the grant stays in its table.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn hold_back(
        &mut self,
        index: u64,
        stamp_ms: u64,
        key: DelayKey,
        token: Token,
        client_name: &str,
        delay_ms: u32,
        events: &mut Vec<Event>,
    ) {
        assert!(!self.sessions.contains_key(&key.session), "only the grant of an ended session is held back");
        assert_ne!(key.kind, ResourceKind::Election, "elections carry no delay");
        events.push(Event::DelayStarted { key: key.clone(), delay_ms: u64::from(delay_ms) });
        let held = HeldBack {
            delay_ms,
            since_index: index,
            until_ms: stamp_ms.saturating_add(u64::from(delay_ms)),
            client_name: client_name.to_owned(),
            token,
        };
        let previous = self.held_back.insert(key, held);
        assert!(previous.is_none(), "a grant is held back once");
    }

    /// Applies the leader's `EndLockDelays`: each held-back grant leaves its table and
    /// the lock or permit goes to the next waiter in this entry.
    pub(super) fn end_lock_delays(
        &mut self,
        index: u64,
        stamp_ms: u64,
        ended: &[DelayKey],
        events: &mut Vec<Event>,
    ) -> Result<Response, CommandError> {
        if ended.len() > LOCK_DELAYS_ENDED_PER_COMMAND_MAX {
            return Err(end_delays_batch_too_large(ended.len()));
        }
        let mut applied = 0;
        for key in ended {
            if self.held_back.remove(key).is_none() {
                continue;
            }
            applied += 1;
            self.release_held_back(index, stamp_ms, key, events);
        }
        self.command_level = self.command_level.max(COMMAND_LEVEL_LOCK_DELAY);
        Ok(Response::LockDelaysEnded { ended: applied })
    }

    /// Ends every delay of `tenant`'s grants at once: the tenant is being removed.
    pub(super) fn end_delays_of_tenant(
        &mut self,
        index: u64,
        stamp_ms: u64,
        tenant: TenantId,
        events: &mut Vec<Event>,
    ) {
        let keys: Vec<DelayKey> = self.held_back.keys().filter(|key| key.tenant == tenant).cloned().collect();
        for key in keys {
            self.held_back.remove(&key);
            self.release_held_back(index, stamp_ms, &key, events);
        }
    }

    /// Takes a grant whose delay ended (and is no longer in `held_back`) out of its
    /// table and hands the lock or permit on.
    fn release_held_back(&mut self, index: u64, stamp_ms: u64, key: &DelayKey, events: &mut Vec<Event>) {
        events.push(Event::DelayEnded { key: key.clone() });
        match key.kind {
            ResourceKind::Lock => {
                let holder = self.lock(key.tenant, &key.name).holder.session;
                assert_eq!(holder, key.session, "a held-back lock keeps its expired holder");
                self.hand_over(index, stamp_ms, key.tenant, &key.name, events);
            }
            ResourceKind::Semaphore => {
                let semaphore = self.semaphore_mut(key.tenant, &key.name);
                let before = semaphore.holders.len();
                semaphore.holders.retain(|holder| holder.session != key.session);
                assert_eq!(semaphore.holders.len() + 1, before, "a held-back permit keeps its expired holder");
                self.fill_semaphore(index, stamp_ms, key.tenant, &key.name, events);
            }
            ResourceKind::Election => unreachable!("elections carry no delay"),
        }
    }

    /// Every grant held back, in key order: the leader arms a timer for each when it
    /// restarts from a snapshot.
    pub fn held_back(&self) -> impl Iterator<Item = (&DelayKey, &HeldBack)> + '_ {
        self.held_back.iter()
    }

    /// The held-back grant of `session` on `name`, if it is one.
    pub fn held_back_grant(
        &self,
        tenant: TenantId,
        kind: ResourceKind,
        name: &str,
        session: SessionId,
    ) -> Option<&HeldBack> {
        if self.held_back.is_empty() {
            return None;
        }
        self.held_back.get(&DelayKey { tenant, kind, name: name.to_owned(), session })
    }

    /// How many grants are held back now.
    pub fn held_back_count(&self) -> usize {
        self.held_back.len()
    }

    /// The delay the grant of `session` on `name` carries (0 for none), for describe
    /// answers.
    pub fn grant_delay_ms(&self, session: SessionId, kind: ResourceKind, name: &str) -> u64 {
        u64::from(self.claim_delay_ms(session, kind, name))
    }

    /// Every claim's delay, for the model tests.
    #[cfg(test)]
    pub(super) fn claim_delays(&self) -> &std::collections::BTreeMap<ClaimKey, u32> {
        &self.claim_delays
    }
}

impl StateMachine {
    /// Grants of `tenant` held back after their holder's session expired.
    pub fn held_back_of(&self, tenant: TenantId) -> usize {
        let first = DelayKey { tenant, kind: ResourceKind::Lock, name: String::new(), session: 0 };
        self.held_back.range(first..).take_while(|(key, _)| key.tenant == tenant).count()
    }

    /// The leader's refusal of a new hold or wait for a lock, permit or leadership
    /// while the caller's tenant is at its holds quota once its held-back grants count
    /// too: those keep their names from everyone until their delay ends, as a hold
    /// does, so a tenant that lets sessions expire does not get more names than its
    /// quota. Not a refusal the log would make (the log counts what sessions hold), so
    /// it is the leader's admission only, like a rate quota: a delay that ends in an
    /// entry in flight may let one through.
    pub fn held_back_quota_refusal(&self, caller: &Caller, command: &Command) -> Option<CommandError> {
        let tenant = caller.tenant().filter(|tenant| *tenant != ADMIN_TENANT)?;
        let new_claim = matches!(
            command,
            Command::Acquire { .. }
                | Command::AcquireWithDelay { .. }
                | Command::SemAcquire { .. }
                | Command::SemAcquireWithDelay { .. }
                | Command::Campaign { .. }
        );
        if !new_claim || self.held_back.is_empty() {
            return None;
        }
        let entry = self.tenants.get(&tenant)?;
        let counted = entry.usage.holds.saturating_add(self.held_back_of(tenant) as u32);
        (counted >= entry.quotas.holds).then(|| quota_exceeded(&entry.name, "holds", entry.quotas.holds, counted))
    }
}
