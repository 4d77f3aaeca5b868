//! One client's lease and everything that hangs off it.

use std::borrow::Borrow;
use std::collections::BTreeSet;
use std::ops::Deref;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use thin_vec::ThinVec;

use super::caller::{Caller, SecretHash, TenantId, ADMIN_TENANT};
use super::delay::DelayKey;
use super::error::{
    checkpoint_batch_too_large, expire_batch_too_large, not_tenants_session, quota_exceeded, sessions_full,
    unknown_session, unknown_tenant, validate_client_name, validate_ttl_ms,
};
use super::{
    share_name, unshare_name, AcquireOutcome, CancelOutcome, Command, CommandError, Event, RequestId, ResourceKind,
    Response, SessionId, StateMachine, Token, WaitFailure, COMMAND_LEVEL_CHECKPOINT, COMMAND_LEVEL_END_SESSION,
};
use crate::machine::limits::{
    CHECKPOINT_SESSIONS_PER_COMMAND_MAX, CLAIM_STATE_BYTES, EXPIRE_SESSIONS_PER_COMMAND_MAX, SESSIONS_MAX,
    SESSION_STATE_BYTES,
};

/// A live session. Closing or expiring it releases what it holds and ends its waits in
/// one entry.
///
/// Kept small because there can be `SESSIONS_MAX` of them: the lists are `ThinVec`s
/// (one pointer inline, nothing on the heap while empty) that start with room for one
/// entry, since most sessions hold one or two locks. Semaphores and elections share
/// one list, `claims`, so that a session that uses neither pays for one empty pointer.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Session {
    /// The index of the entry that created the session: unique and the same everywhere.
    pub(super) id: SessionId,
    /// At most `SESSION_TTL_MS_MAX`, an hour, so 32 bits, sharing a word with `tenant`.
    pub(super) ttl_ms: u32,
    /// The tenant whose namespace the session's locks, permits and elections are in.
    pub(super) tenant: TenantId,
    /// Shared by every session with the same client name (see
    /// `StateMachine::client_names`): a client process usually opens many.
    pub(super) client_name: ClientName,
    /// Names of the locks this session holds, in the order of their grants. Mirrors the
    /// lock table so that ending a session does not scan every lock.
    pub(super) held: ThinVec<String>,
    /// Names of the locks this session waits on, in the order it queued.
    pub(super) waiting: ThinVec<String>,
    /// The semaphore permits and elections this session holds or waits for. A claim is
    /// appended when it starts and moved to the end when a wait turns into a grant, so
    /// the claims of one kind and role are in the order of their grants or queueing.
    /// Mirrors the semaphore and election tables like `held` mirrors the lock table.
    pub(super) claims: ThinVec<Claim>,
    /// Answers to this session's last requests, oldest first, for retries.
    pub(super) remembered: ThinVec<Remembered>,
    /// The hash of the secret `CreateSession` returned; every session-scoped command
    /// must present the secret.
    pub(super) secret: SecretHash,
    /// What the session was last counted for in its tenant's usage.
    pub(super) counted: Counted,
}

/// A client name that sessions share: a thin pointer, so that a `Session` takes 80
/// bytes (an 80-byte heap block) rather than 88 (a 96-byte one). Encoded as the string.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[serde(transparent)]
pub struct ClientName(Arc<String>);

impl ClientName {
    pub(super) fn new(name: &str) -> ClientName {
        ClientName(Arc::new(name.to_owned()))
    }

    /// Whether both are the same shared copy.
    pub(super) fn same_copy(&self, other: &ClientName) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Deref for ClientName {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

/// Lets the table of shared names be searched by `&str`; ordered as the strings are.
impl Borrow<str> for ClientName {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl Session {
    pub fn id(&self) -> SessionId {
        self.id
    }

    /// The lease the leader arms for this session, from scratch after a leader change.
    pub fn ttl_ms(&self) -> u64 {
        u64::from(self.ttl_ms)
    }

    /// The tenant the session belongs to.
    pub fn tenant(&self) -> TenantId {
        self.tenant
    }

    /// Whether `secret_hash` is the hash of this session's secret (a keepalive's check;
    /// commands are checked as they apply).
    pub fn has_secret(&self, secret_hash: &SecretHash) -> bool {
        &self.secret == secret_hash
    }

    /// Whether the session's secret may still change: no request has named it yet, so a
    /// retried `CreateSession` (whose first answer, with the secret, was lost) gives it
    /// the retry's secret (`StateMachine::recalled`).
    pub(super) fn secret_may_change(&self) -> bool {
        matches!(self.remembered.first(), Some(Remembered { answer: Answer::SessionCreated { .. }, .. }))
    }

    /// Whether the session remembers the answer to `request`: a retry gets that answer,
    /// whatever the state says now.
    pub(super) fn remembers(&self, request: RequestId) -> bool {
        self.remembered.iter().any(|remembered| remembered.request == request)
    }

    /// What the session holds, waits for and takes in the state now, for its tenant's
    /// usage.
    pub(super) fn counted_now(&self) -> Counted {
        let holds = self.held.len() + self.claims.iter().filter(|claim| claim.role == Role::Holds).count();
        let waiters = self.waiting.len() + self.claims.iter().filter(|claim| claim.role == Role::Waits).count();
        let names = self.held.iter().chain(self.waiting.iter()).chain(self.claims.iter().map(|claim| &claim.name));
        let bytes = session_bytes(&self.client_name) + names.map(|name| claim_bytes(name)).sum::<u32>();
        Counted {
            holds: u16::try_from(holds).expect("LOCKS_PER_SESSION_MAX fits 16 bits"),
            waiters: u16::try_from(waiters).expect("LOCKS_PER_SESSION_MAX fits 16 bits"),
            bytes,
        }
    }

    pub fn client_name(&self) -> &str {
        &self.client_name
    }

    /// The session id is the index of its creating entry; this says so by name.
    pub fn created_index(&self) -> u64 {
        self.id
    }

    pub fn held_names(&self) -> impl Iterator<Item = &str> + '_ {
        self.held.iter().map(String::as_str)
    }

    pub fn waiting_names(&self) -> impl Iterator<Item = &str> + '_ {
        self.waiting.iter().map(String::as_str)
    }

    /// Everything the session holds or waits for: what `LOCKS_PER_SESSION_MAX` bounds.
    pub(super) fn resource_count(&self) -> usize {
        self.held.len() + self.waiting.len() + self.claims.len()
    }

    /// Names of the semaphores or elections this session holds (or waits for), in the
    /// order of the grants (or of queueing).
    pub(super) fn claimed(&self, kind: ResourceKind, role: Role) -> impl Iterator<Item = &str> {
        self.claims
            .iter()
            .filter(move |claim| claim.kind == kind && claim.role == role)
            .map(|claim| claim.name.as_str())
    }

    pub(super) fn add_claim(&mut self, kind: ResourceKind, role: Role, name: &str) {
        push_compact(&mut self.claims, Claim { kind, role, name: name.to_owned() });
    }

    /// # Panics
    ///
    /// If the session does not list the claim: the tables and the sessions disagree.
    pub(super) fn remove_claim(&mut self, kind: ResourceKind, role: Role, name: &str) {
        let position = self
            .claims
            .iter()
            .position(|claim| claim.kind == kind && claim.role == role && claim.name == name)
            .unwrap_or_else(|| panic!("session {} does not list {role:?} {kind:?} {name:?}", self.id));
        self.claims.remove(position);
    }
}

/// One semaphore or election a session holds or waits for.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub(super) struct Claim {
    /// `Semaphore` or `Election`; locks have their own lists.
    pub(super) kind: ResourceKind,
    pub(super) role: Role,
    pub(super) name: String,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Role {
    /// Holds a permit of the semaphore, or leads the election.
    Holds,
    /// Waits in the semaphore's or election's queue.
    Waits,
}

/// The stored answer to one request, for a retry to find.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Remembered {
    pub(super) request: RequestId,
    /// `Command::fingerprint` of the command, to tell a retry from a reuse of the id.
    pub(super) fingerprint: u64,
    pub(super) answer: Answer,
}

/// The answers that are worth remembering: those of commands that took effect while the
/// session lives on. Smaller than `Response` because it has no strings or lists, and
/// because answers of the same shape share a variant: the command, which a retry repeats
/// unchanged, tells which response to rebuild. That keeps one `AcquireOutcome` variant,
/// so the enum stays as small as the outcome itself.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Answer {
    SessionCreated {
        session: SessionId,
        ttl_ms: u64,
    },
    /// For `Acquire`, `SemAcquire` and `Campaign`.
    Acquire(AcquireOutcome),
    /// For `CancelWait`, `SemCancelWait` and `CampaignCancelWait`.
    WaitCancelled(CancelOutcome),
    /// For `Release`, `SemRelease`, `Proclaim` and `Resign`.
    Released {
        token: Token,
    },
    SemLimitSet {
        limit: u32,
        previous: u32,
    },
}

impl Answer {
    /// `None` for answers that are not kept: rejections (they changed nothing, so doing
    /// the command again is as good as answering it again) and the ends of sessions
    /// (whose remembered answers go with them).
    pub(super) fn from_response(response: &Response) -> Option<Answer> {
        match response {
            Response::SessionCreated { session, ttl_ms } => {
                Some(Answer::SessionCreated { session: *session, ttl_ms: *ttl_ms })
            }
            Response::Acquire(outcome) | Response::SemAcquire(outcome) | Response::Campaign(outcome) => {
                Some(Answer::Acquire(*outcome))
            }
            Response::WaitCancelled(outcome) => Some(Answer::WaitCancelled(*outcome)),
            Response::Released { token }
            | Response::SemReleased { token }
            | Response::Proclaimed { token }
            | Response::Resigned { token } => Some(Answer::Released { token: *token }),
            Response::SemLimitSet { limit, previous } => {
                Some(Answer::SemLimitSet { limit: *limit, previous: *previous })
            }
            // Tenant commands name no session to keep an answer in; their retries are
            // made harmless by the commands themselves (see `Command::AddTenant`).
            Response::SessionClosed
            | Response::SessionsExpired { .. }
            | Response::SessionsCheckpointed { .. }
            | Response::Rejected(_)
            | Response::TenantAdded { .. }
            | Response::TenantTokenRotated { .. }
            | Response::TenantQuotasSet { .. }
            | Response::TenantRemoved { .. }
            | Response::MemberRecorded { .. }
            | Response::LockDelaysEnded { .. } => None,
        }
    }

    /// The response this answer was made from; `command` is the command that got it.
    pub(super) fn to_response(self, command: &Command) -> Response {
        match self {
            Answer::SessionCreated { session, ttl_ms } => Response::SessionCreated { session, ttl_ms },
            Answer::Acquire(outcome) => match command {
                Command::SemAcquire { .. } | Command::SemAcquireWithDelay { .. } => Response::SemAcquire(outcome),
                Command::Campaign { .. } => Response::Campaign(outcome),
                _ => Response::Acquire(outcome),
            },
            Answer::WaitCancelled(outcome) => Response::WaitCancelled(outcome),
            Answer::Released { token } => match command {
                Command::SemRelease { .. } => Response::SemReleased { token },
                Command::Proclaim { .. } => Response::Proclaimed { token },
                Command::Resign { .. } => Response::Resigned { token },
                _ => Response::Released { token },
            },
            Answer::SemLimitSet { limit, previous } => Response::SemLimitSet { limit, previous },
        }
    }
}

/// Grows a small list one slot at a time. The default growth jumps from none to four
/// slots, which would triple the memory of the common session that holds one lock and
/// remembers one or two answers; past four entries the usual doubling applies.
pub(super) fn push_compact<T>(list: &mut ThinVec<T>, item: T) {
    if list.len() == list.capacity() && list.len() < 4 {
        list.reserve_exact(1);
    }
    list.push(item);
}

impl StateMachine {
    /// A new session of the caller's tenant (the admin's namespace for the cluster's
    /// own callers, which only tests use), whose secret hashes to the caller's.
    pub(super) fn create_session(
        &mut self,
        index: u64,
        caller: &Caller,
        ttl_ms: u64,
        client_name: &str,
    ) -> Result<Response, CommandError> {
        validate_client_name(client_name)?;
        validate_ttl_ms(ttl_ms)?;
        if self.sessions.len() >= SESSIONS_MAX {
            return Err(sessions_full(self.sessions.len()));
        }
        let (tenant, secret) = match *caller {
            Caller::Cluster => (ADMIN_TENANT, SecretHash::default()),
            Caller::Admin { secret } => (ADMIN_TENANT, secret),
            Caller::Tenant { tenant, secret } => (tenant, secret),
        };
        let entry = self.tenants.get_mut(&tenant).expect("`authorize` refuses the callers of a removed tenant");
        if entry.usage.sessions >= entry.quotas.sessions {
            return Err(quota_exceeded(&entry.name, "sessions", entry.quotas.sessions, entry.usage.sessions));
        }
        entry.usage.sessions += 1;
        let session = Session {
            id: index,
            ttl_ms: u32::try_from(ttl_ms).expect("SESSION_TTL_MS_MAX fits 32 bits"),
            tenant,
            client_name: share_name(&mut self.client_names, client_name),
            held: ThinVec::new(),
            waiting: ThinVec::new(),
            claims: ThinVec::new(),
            remembered: ThinVec::new(),
            secret,
            counted: Counted::default(),
        };
        self.sessions_by_tenant.insert((session.tenant, index));
        let previous = self.sessions.insert(index, Box::new(session));
        assert!(previous.is_none(), "session ids are log indexes, which are never reused");
        Ok(Response::SessionCreated { session: index, ttl_ms })
    }

    pub(super) fn close_session(
        &mut self,
        index: u64,
        stamp_ms: u64,
        session: SessionId,
        events: &mut Vec<Event>,
    ) -> Result<Response, CommandError> {
        if !self.sessions.contains_key(&session) {
            return Err(unknown_session(session));
        }
        self.end_sessions(index, stamp_ms, &[session], false, events);
        Ok(Response::SessionClosed)
    }

    /// The admin's end of a session of the tenant named `tenant_name`
    /// (`Command::EndSession`). The holder did not let go, so it ends as an expired
    /// session does: the grants that asked for a lock-delay are held back for it.
    pub(super) fn end_session(
        &mut self,
        index: u64,
        stamp_ms: u64,
        tenant_name: &str,
        session: SessionId,
        events: &mut Vec<Event>,
    ) -> Result<Response, CommandError> {
        let Some((tenant, _)) = self.tenant_by_name(tenant_name) else {
            return Err(unknown_tenant(tenant_name));
        };
        // A session of another tenant is refused as one that does not exist, so that
        // a mistyped id or tenant ends nothing.
        if self.sessions.get(&session).is_none_or(|found| found.tenant != tenant) {
            return Err(not_tenants_session(tenant_name, session));
        }
        // Every member's build knew the command when it was proposed.
        self.command_level = self.command_level.max(COMMAND_LEVEL_END_SESSION);
        self.end_sessions(index, stamp_ms, &[session], true, events);
        Ok(Response::SessionClosed)
    }

    pub(super) fn expire_sessions(
        &mut self,
        index: u64,
        stamp_ms: u64,
        sessions: &[SessionId],
        events: &mut Vec<Event>,
    ) -> Result<Response, CommandError> {
        if sessions.len() > EXPIRE_SESSIONS_PER_COMMAND_MAX {
            return Err(expire_batch_too_large(sessions.len()));
        }
        // Sessions already gone were closed, or expired by an earlier proposal of the
        // same deadline; either way there is nothing left to do for them.
        let mut seen = BTreeSet::new();
        let expired: Vec<SessionId> = sessions
            .iter()
            .copied()
            .filter(|session| self.sessions.contains_key(session) && seen.insert(*session))
            .collect();
        self.end_sessions(index, stamp_ms, &expired, true, events);
        Ok(Response::SessionsExpired { expired })
    }

    /// Applies the leader's checkpoint of session deadlines (see
    /// `Command::CheckpointSessions`): a quiet session's remaining time replaces what
    /// an earlier checkpoint said; a resumed one is no longer checkpointed.
    pub(super) fn checkpoint_sessions(
        &mut self,
        index: u64,
        quiet: &[(SessionId, u64)],
        resumed: &[SessionId],
    ) -> Result<Response, CommandError> {
        if quiet.len() + resumed.len() > CHECKPOINT_SESSIONS_PER_COMMAND_MAX {
            return Err(checkpoint_batch_too_large(quiet.len() + resumed.len()));
        }
        let mut quiet_applied = Vec::with_capacity(quiet.len());
        for &(session, remaining_ms) in quiet {
            let Some(ttl_ms) = self.sessions.get(&session).map(|session| session.ttl_ms) else { continue };
            // A lease never has more left than its TTL; a checkpoint that says so is
            // held to the TTL rather than refused, so a replica's apply cannot fail.
            let remaining_ms = remaining_ms.min(u64::from(ttl_ms));
            self.quiet.insert(session, (remaining_ms as u32, index));
            quiet_applied.push((session, remaining_ms));
        }
        // Every member's build knew the command when the first one was proposed.
        self.command_level = self.command_level.max(COMMAND_LEVEL_CHECKPOINT);
        let mut resumed_applied = Vec::with_capacity(resumed.len());
        for &session in resumed {
            if self.quiet.remove(&session).is_some() {
                resumed_applied.push(session);
            }
        }
        Ok(Response::SessionsCheckpointed { quiet: quiet_applied, resumed: resumed_applied })
    }

    /// The time a checkpointed session's lease had left when the leader last
    /// checkpointed it; `None` for a session that is not checkpointed (or is gone).
    pub fn quiet_remaining_ms(&self, session: SessionId) -> Option<u64> {
        self.quiet_checkpoint(session).map(|(remaining_ms, _)| remaining_ms)
    }

    /// Every checkpointed session with the index of its checkpoint's entry.
    pub fn quiet_checkpoints(&self) -> impl Iterator<Item = (SessionId, u64)> + '_ {
        self.quiet.iter().map(|(session, (_, index))| (*session, *index))
    }

    /// The highest command level of 2 or above the log has used (0: none).
    pub fn command_level(&self) -> u32 {
        self.command_level
    }

    /// The time a checkpointed session's lease had left and the index of the
    /// checkpoint's entry; `None` for a session that is not checkpointed.
    pub fn quiet_checkpoint(&self, session: SessionId) -> Option<(u64, u64)> {
        self.quiet.get(&session).map(|(remaining_ms, index)| (u64::from(*remaining_ms), *index))
    }

    /// Ends live, distinct sessions in one entry: ends their waits, releases what they
    /// hold, grants the freed locks, permits and leaderships to the next waiters and
    /// forgets their answers.
    ///
    /// The order is what keeps every limit: first every ending session leaves every
    /// queue, then their semaphore permits are returned and the semaphores' waiters
    /// granted, then each session's locks and leaderships are released and handed on.
    /// Events come in that order: every ended wait (per session: locks, then its other
    /// waits in the order it queued), the returned permits and the grants they caused
    /// (per semaphore in name order), then for each session in the given order its lock
    /// releases and leaderships (each followed by the grant it caused) and its end.
    pub(super) fn end_sessions(
        &mut self,
        index: u64,
        stamp_ms: u64,
        ending: &[SessionId],
        expired: bool,
        events: &mut Vec<Event>,
    ) {
        let ending_set: BTreeSet<SessionId> = ending.iter().copied().collect();
        assert_eq!(ending_set.len(), ending.len(), "each ending session is listed once");

        // First every ending session leaves every queue, so that what is freed below goes
        // straight to a survivor: granting it to an ending waiter would hand it on again
        // in the same entry, two grants of one lock or election would share this entry's
        // index as their token, and a semaphore would count a permit that is about to be
        // returned.
        let mut queues_left: BTreeSet<(TenantId, ResourceKind, &str)> = BTreeSet::new();
        for session_id in ending {
            let session = self.sessions.get(session_id).expect("only live sessions are ended");
            let lock_waits = session.waiting.iter().map(|name| (ResourceKind::Lock, name.as_str()));
            let other_waits = session
                .claims
                .iter()
                .filter(|claim| claim.role == Role::Waits)
                .map(|claim| (claim.kind, claim.name.as_str()));
            for (kind, name) in lock_waits.chain(other_waits) {
                events.push(Event::WaitFailed {
                    kind,
                    name: name.to_owned(),
                    session: *session_id,
                    reason: WaitFailure::SessionEnded,
                });
                queues_left.insert((session.tenant, kind, name));
            }
        }
        for (tenant, kind, name) in queues_left {
            let namespace = self.namespaces.get_mut(&tenant).expect("a session waits only in a namespace in use");
            match kind {
                ResourceKind::Lock => namespace
                    .locks
                    .get_mut(name)
                    .expect("a session waits only on held locks")
                    .waiters
                    .retain(|waiter| !ending_set.contains(waiter)),
                ResourceKind::Semaphore => namespace
                    .semaphores
                    .get_mut(name)
                    .expect("a session waits only on semaphores in use")
                    .waiters
                    .retain(|waiter| !ending_set.contains(waiter)),
                ResourceKind::Election => namespace
                    .elections
                    .get_mut(name)
                    .expect("a session campaigns only in elections with a leader")
                    .waiters
                    .retain(|waiter| !ending_set.contains(&waiter.session)),
            }
        }

        // Then every permit of the ending sessions is returned before any is granted, so
        // that the freed permits are counted once and a semaphore never goes over its
        // limit.
        let delayed_permits = self.return_permits_of_ending(index, stamp_ms, &ending_set, expired, events);

        // Then release and hand over. A lock or an election has one holder, so each is
        // freed, and granted, at most once in this entry.
        for session_id in ending {
            let session = self.sessions.remove(session_id).expect("only live sessions are ended");
            self.sessions_by_tenant.remove(&(session.tenant, session.id));
            self.quiet.remove(session_id);
            // Taken before the claims' delays are forgotten: an expired holder's
            // grants that carry one are held back rather than handed on (see `delay`).
            let lock_delays: Vec<u32> = if expired && self.has_claim_delays() {
                session.held.iter().map(|name| self.claim_delay_ms(*session_id, ResourceKind::Lock, name)).collect()
            } else {
                Vec::new()
            };
            self.forget_claim_delays_of(*session_id);
            unshare_name(&mut self.client_names, &session.client_name);
            // Its lists still hold what it was last counted for (the queues and
            // semaphores above changed only their own tables).
            let usage = &mut self.tenants.get_mut(&session.tenant).expect("a session's tenant exists").usage;
            usage.sessions -= 1;
            usage.holds -= u32::from(session.counted.holds);
            usage.waiters -= u32::from(session.counted.waiters);
            usage.bytes -= u64::from(session.counted.bytes);
            self.bytes_total -= u64::from(session.counted.bytes);
            let tenant = session.tenant;
            for (position, name) in session.held.iter().enumerate() {
                let delay_ms = lock_delays.get(position).copied().unwrap_or(0);
                let token = self.lock(tenant, name).holder.token;
                events.push(Event::Released {
                    kind: ResourceKind::Lock,
                    name: name.clone(),
                    session: *session_id,
                    token,
                });
                if delay_ms > 0 {
                    let key = DelayKey { tenant, kind: ResourceKind::Lock, name: name.clone(), session: *session_id };
                    self.hold_back(index, stamp_ms, key, token, &session.client_name, delay_ms, events);
                } else {
                    self.hand_over(index, stamp_ms, tenant, name, events);
                }
            }
            for (held_tenant, name, holder, token, delay_ms) in
                delayed_permits.iter().filter(|(_, _, holder, _, _)| holder == session_id)
            {
                let key = DelayKey {
                    tenant: *held_tenant,
                    kind: ResourceKind::Semaphore,
                    name: name.clone(),
                    session: *holder,
                };
                self.hold_back(index, stamp_ms, key, *token, &session.client_name, *delay_ms, events);
            }
            for name in session.claimed(ResourceKind::Election, Role::Holds) {
                let token = self.namespace(tenant).elections[name].leader.token;
                events.push(Event::Released {
                    kind: ResourceKind::Election,
                    name: name.to_owned(),
                    session: *session_id,
                    token,
                });
                self.hand_over_election(index, stamp_ms, tenant, name, events);
            }
            for remembered in &session.remembered {
                if let Answer::SessionCreated { .. } = remembered.answer {
                    let owner = self.creations.remove(&remembered.request);
                    assert_eq!(owner, Some(*session_id));
                }
            }
            events.push(Event::SessionEnded { session: *session_id, expired });
        }
    }
}

/// What a session was last counted for in its tenant's `Usage`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counted {
    pub holds: u16,
    pub waiters: u16,
    pub bytes: u32,
}

/// The estimated bytes of a session with `client_name`, before what it holds.
pub(super) fn session_bytes(client_name: &str) -> u32 {
    SESSION_STATE_BYTES + client_name.len() as u32
}

/// The estimated bytes of one hold or wait on `name`.
pub(super) fn claim_bytes(name: &str) -> u32 {
    CLAIM_STATE_BYTES + name.len() as u32
}
