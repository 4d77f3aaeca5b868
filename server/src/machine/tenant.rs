//! Tenants: who may act, in which namespace, under which quotas.
//!
//! Every command reaches the machine with its `Caller`, which the gRPC layer derived
//! from the request's credential: the cluster itself (the leader's own expiries), the
//! admin, or a tenant. A tenant's sessions, and everything they hold or wait for, live
//! in the tenant's `Namespace`: two tenants' locks named `orders/42` are two locks.
//! A session-scoped command is carried out only for the tenant that owns the session
//! and with the session's secret (its hash; the secret itself is never stored).
//! Fencing tokens stay the log index, one order across tenants.
//!
//! Usage is counted per tenant as commands apply (see `StateMachine::account`), so a
//! quota is checked in O(1), and the invariants recount it from scratch.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::caller::{Caller, SecretHash, TenantId, ADMIN_TENANT, ADMIN_TENANT_NAME};
use super::command::COMMAND_LEVEL_SHARES;
use super::election::Election;
use super::error::{
    permission_denied, quota_exceeded, session_locks_full, tenant_exists, tenant_removed, unknown_session,
    unknown_tenant, validate_tenant_name, wrong_session_secret,
};
use super::limits::{QuotaChange, Quotas, Shares};
use super::lock::Lock;
use super::semaphore::Semaphore;
use super::session::Role;
use super::{Command, CommandError, Event, RequestId, Response, SessionId, StateMachine};
use crate::machine::limits::{LOCKS_PER_SESSION_MAX, TENANTS_MAX};

/// What a tenant has now.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub sessions: u32,
    pub holds: u32,
    pub waiters: u32,
    /// The replicated state it takes, estimated: `SESSION_STATE_BYTES` per session and
    /// `CLAIM_STATE_BYTES` per hold or wait, plus the names' bytes.
    pub bytes: u64,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Tenant {
    pub name: Box<str>,
    /// The hash of the tenant's bearer token; `None` for the admin namespace.
    pub token_hash: Option<SecretHash>,
    pub quotas: Quotas,
    pub usage: Usage,
    /// The request that created the tenant: its retry (whose answer was lost) replaces
    /// the token with the retry's own instead of being refused as a duplicate name.
    pub created_by: Option<RequestId>,
}

/// One tenant's locks, semaphores and elections. Only names in use have an entry, as
/// in each table; a namespace with none has no entry either.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Namespace {
    /// Keyed by `Box<str>` rather than `String`: 8 bytes less in every slot.
    pub(super) locks: BTreeMap<Box<str>, Lock>,
    pub(super) semaphores: BTreeMap<String, Semaphore>,
    pub(super) elections: BTreeMap<String, Election>,
}

impl Namespace {
    pub(super) fn is_empty(&self) -> bool {
        self.locks.is_empty() && self.semaphores.is_empty() && self.elections.is_empty()
    }
}

/// The namespace of a tenant that has nothing in use.
pub(super) static EMPTY_NAMESPACE: std::sync::LazyLock<Namespace> = std::sync::LazyLock::new(Namespace::default);

impl StateMachine {
    pub(super) fn admin_tenant() -> Tenant {
        Tenant {
            name: ADMIN_TENANT_NAME.into(),
            token_hash: None,
            quotas: Quotas { sessions: u32::MAX, holds: u32::MAX, waiters: u32::MAX },
            usage: Usage::default(),
            created_by: None,
        }
    }

    /// Refuses `command` unless `caller` may send it: tenant management is the admin's;
    /// a session-scoped command needs the session's tenant and secret; the expiry of
    /// sessions is the cluster's.
    pub(super) fn authorize(&self, caller: &Caller, command: &Command) -> Result<(), CommandError> {
        let Some(tenant) = caller.tenant() else {
            return Ok(());
        };
        // The gRPC layer authenticated the caller against the tenants as they were
        // then; a RemoveTenant may have been applied since.
        if !self.tenants.contains_key(&tenant) {
            return Err(tenant_removed(tenant));
        }
        let tenant_name = self.tenant_name(tenant);
        match command {
            Command::ExpireSessions { .. } => {
                return Err(permission_denied(tenant_name, "the expiry of sessions, which only the cluster proposes"))
            }
            Command::RecordMember { .. } => {
                return Err(permission_denied(tenant_name, "the record of a member, which only the cluster proposes"))
            }
            Command::CheckpointSessions { .. } => {
                return Err(permission_denied(tenant_name, "a checkpoint of sessions, which only the cluster proposes"))
            }
            Command::EndLockDelays { .. } => {
                return Err(permission_denied(tenant_name, "the end of lock-delays, which only the cluster proposes"))
            }
            Command::AddTenant { .. }
            | Command::RotateTenantToken { .. }
            | Command::RemoveTenant { .. }
            | Command::SetTenantQuotas { .. }
            | Command::SetTenantShares { .. }
                if tenant != ADMIN_TENANT =>
            {
                return Err(permission_denied(tenant_name, "tenant management, which needs the admin credential"))
            }
            Command::EndSession { .. } if tenant != ADMIN_TENANT => {
                return Err(permission_denied(
                    tenant_name,
                    "ending a session without its secret, which needs the admin credential",
                ))
            }
            Command::SemSetLimit { tenant: Some(owner), name, .. } if *owner != tenant && tenant != ADMIN_TENANT => {
                return Err(permission_denied(
                    tenant_name,
                    &format!("semaphore {name:?} of tenant {:?}", self.tenant_name(*owner)),
                ))
            }
            _ => {}
        }
        let Some(session_id) = command.session() else {
            return Ok(());
        };
        let Some(session) = self.sessions.get(&session_id) else {
            // The command's own check says the session does not exist.
            return Ok(());
        };
        if session.tenant != tenant {
            // To a tenant, another tenant's session is one that does not exist: the same
            // answer, word for word, so that no session id tells it anything of others.
            // The admin is told whose it is.
            if tenant != ADMIN_TENANT {
                return Err(unknown_session(session_id));
            }
            return Err(permission_denied(
                tenant_name,
                &format!("session {session_id}, which belongs to tenant {:?}", self.tenant_name(session.tenant)),
            ));
        }
        if Some(&session.secret) != caller.secret() {
            return Err(wrong_session_secret(session_id));
        }
        Ok(())
    }

    /// A tenant's name, for messages ("?" for one that no longer exists).
    pub fn tenant_name(&self, tenant: TenantId) -> &str {
        self.tenants.get(&tenant).map(|tenant| &*tenant.name).unwrap_or("?")
    }

    /// The tenant whose token hashes to `token_hash`.
    pub fn tenant_by_token(&self, token_hash: &SecretHash) -> Option<(TenantId, &Tenant)> {
        let id = *self.tenants_by_token.get(token_hash)?;
        Some((id, &self.tenants[&id]))
    }

    /// The tenant named `name`.
    pub fn tenant_by_name(&self, name: &str) -> Option<(TenantId, &Tenant)> {
        self.tenants.iter().find(|(_, tenant)| &*tenant.name == name).map(|(id, tenant)| (*id, tenant))
    }

    /// Every tenant, the admin namespace first, in order of creation.
    pub fn tenants(&self) -> impl Iterator<Item = (TenantId, &Tenant)> + '_ {
        self.tenants.iter().map(|(id, tenant)| (*id, tenant))
    }

    /// The estimated size of the replicated state, and the tenant taking most of it.
    pub fn state_bytes(&self) -> (u64, Option<(&str, u64)>) {
        let largest = self.tenants.values().max_by_key(|tenant| tenant.usage.bytes);
        (self.bytes_total, largest.map(|tenant| (&*tenant.name, tenant.usage.bytes)))
    }

    /// The estimated bytes of what `tenant` holds (0 for one that does not exist).
    pub fn tenant_bytes(&self, tenant: TenantId) -> u64 {
        self.tenants.get(&tenant).map_or(0, |tenant| tenant.usage.bytes)
    }

    /// The estimated size of the replicated state (see `limits::SESSION_STATE_BYTES`).
    pub fn bytes_total(&self) -> u64 {
        self.bytes_total
    }

    pub(super) fn add_tenant(
        &mut self,
        request: RequestId,
        name: &str,
        token_hash: SecretHash,
        quotas: Quotas,
    ) -> Result<Response, CommandError> {
        validate_tenant_name(name)?;
        if let Some((id, existing)) = self.tenant_by_name(name) {
            if existing.created_by == Some(request) {
                // A retry of the request that created it, whose answer was lost: its
                // token is the one the retry's answer carries.
                let old = existing.token_hash;
                let tenant = self.tenants.get_mut(&id).expect("found above");
                tenant.token_hash = Some(token_hash);
                if let Some(old) = old {
                    self.tenants_by_token.remove(&old);
                }
                self.tenants_by_token.insert(token_hash, id);
                return Ok(Response::TenantAdded { tenant: id });
            }
            return Err(tenant_exists(name));
        }
        if self.tenants.len() >= TENANTS_MAX {
            return Err(super::error::tenants_full(self.tenants.len()));
        }
        let id = self.next_tenant_id;
        self.next_tenant_id = id.checked_add(1).expect("TENANTS_MAX keeps tenant ids far below u32::MAX");
        let tenant = Tenant {
            name: name.into(),
            token_hash: Some(token_hash),
            quotas,
            usage: Usage::default(),
            created_by: Some(request),
        };
        self.tenants.insert(id, tenant);
        let previous = self.tenants_by_token.insert(token_hash, id);
        assert!(previous.is_none(), "a new token hashes like no other (128 random bits)");
        Ok(Response::TenantAdded { tenant: id })
    }

    pub(super) fn rotate_tenant_token(&mut self, name: &str, token_hash: SecretHash) -> Result<Response, CommandError> {
        let Some((id, _)) = self.tenant_by_name(name).filter(|(id, _)| *id != ADMIN_TENANT) else {
            return Err(unknown_tenant(name));
        };
        let tenant = self.tenants.get_mut(&id).expect("found above");
        let old = tenant.token_hash.replace(token_hash);
        // Any later retry of the creation must not bring back a token.
        tenant.created_by = None;
        if let Some(old) = old {
            self.tenants_by_token.remove(&old);
        }
        self.tenants_by_token.insert(token_hash, id);
        Ok(Response::TenantTokenRotated { tenant: id })
    }

    pub(super) fn set_tenant_quotas(&mut self, name: &str, change: QuotaChange) -> Result<Response, CommandError> {
        let Some((id, _)) = self.tenant_by_name(name).filter(|(id, _)| *id != ADMIN_TENANT) else {
            return Err(unknown_tenant(name));
        };
        let tenant = self.tenants.get_mut(&id).expect("found above");
        tenant.quotas = change.applied_to(tenant.quotas);
        Ok(Response::TenantQuotasSet { tenant: id })
    }

    /// Changes a tenant's share of the leader; a share back at the default is dropped
    /// from the state.
    pub(super) fn set_tenant_shares(
        &mut self,
        name: &str,
        weight: Option<u32>,
        ops_per_s: Option<u32>,
    ) -> Result<Response, CommandError> {
        let Some((id, _)) = self.tenant_by_name(name).filter(|(id, _)| *id != ADMIN_TENANT) else {
            return Err(unknown_tenant(name));
        };
        let current = self.tenant_shares(id);
        let shares =
            Shares { weight: weight.unwrap_or(current.weight), ops_per_s: ops_per_s.unwrap_or(current.ops_per_s) };
        if shares == Shares::default() {
            self.tenant_shares.remove(&id);
        } else {
            self.tenant_shares.insert(id, shares);
        }
        self.command_level = self.command_level.max(COMMAND_LEVEL_SHARES);
        Ok(Response::TenantQuotasSet { tenant: id })
    }

    /// The tenant's share of the leader (the default for one never given one).
    pub fn tenant_shares(&self, tenant: TenantId) -> Shares {
        self.tenant_shares.get(&tenant).copied().unwrap_or_default()
    }

    /// Removes a tenant: its token stops working and its sessions end in this entry,
    /// releasing everything they held.
    pub(super) fn remove_tenant(
        &mut self,
        index: u64,
        stamp_ms: u64,
        name: &str,
        events: &mut Vec<Event>,
    ) -> Result<Response, CommandError> {
        let Some((id, _)) = self.tenant_by_name(name).filter(|(id, _)| *id != ADMIN_TENANT) else {
            return Err(unknown_tenant(name));
        };
        let sessions: Vec<SessionId> =
            self.sessions.values().filter(|session| session.tenant == id).map(|session| session.id).collect();
        self.end_sessions(index, stamp_ms, &sessions, false, events);
        // Held-back grants wait for no one now: none of the tenant's sessions is left.
        self.end_delays_of_tenant(index, stamp_ms, id, events);
        let tenant = self.tenants.remove(&id).expect("found above");
        self.tenant_shares.remove(&id);
        assert_eq!(tenant.usage, Usage::default(), "a tenant whose sessions all ended uses nothing");
        if let Some(token_hash) = tenant.token_hash {
            self.tenants_by_token.remove(&token_hash);
        }
        assert!(!self.namespaces.contains_key(&id), "an unused namespace has no entry");
        Ok(Response::TenantRemoved { tenant: id, sessions_ended: sessions.len() as u64 })
    }

    /// Refuses a new hold of a session of `tenant` that already has `count` locks,
    /// permits and elections: at `LOCKS_PER_SESSION_MAX`, or at the tenant's quota.
    pub(super) fn admit_hold(&self, tenant: TenantId, session: SessionId, count: usize) -> Result<(), CommandError> {
        if count >= LOCKS_PER_SESSION_MAX {
            return Err(session_locks_full(session, count));
        }
        self.check_quota(tenant, Role::Holds)
    }

    /// Refuses a new hold (`Role::Holds`) or wait of `tenant` at its quota.
    pub(super) fn check_quota(&self, tenant: TenantId, role: Role) -> Result<(), CommandError> {
        let entry = &self.tenants[&tenant];
        let (quota, limit, usage) = match role {
            Role::Holds => ("holds", entry.quotas.holds, entry.usage.holds),
            Role::Waits => ("waiters", entry.quotas.waiters, entry.usage.waiters),
        };
        if usage >= limit {
            return Err(quota_exceeded(&entry.name, quota, limit, usage));
        }
        Ok(())
    }

    /// Counts what `session` holds and waits for now into its tenant's usage. Every
    /// change to a session's lists is the acting session's, or shows in an event naming
    /// the session (a grant handed to it, a wait ended), so counting those after each
    /// command keeps every tenant's usage exact; the invariants recount it. Ended
    /// sessions were taken out of the usage as they ended.
    pub(super) fn account(&mut self, session: SessionId) {
        let Some(session) = self.sessions.get_mut(&session) else { return };
        let now = session.counted_now();
        let before = std::mem::replace(&mut session.counted, now);
        if before == now {
            return;
        }
        let usage = &mut self.tenants.get_mut(&session.tenant).expect("a session's tenant exists").usage;
        usage.holds = usage.holds + u32::from(now.holds) - u32::from(before.holds);
        usage.waiters = usage.waiters + u32::from(now.waiters) - u32::from(before.waiters);
        usage.bytes = usage.bytes + u64::from(now.bytes) - u64::from(before.bytes);
        self.bytes_total = self.bytes_total + u64::from(now.bytes) - u64::from(before.bytes);
    }
}
