//! The commands that travel through the Raft log, and the fingerprint that tells a retry
//! from a reuse of its request id.

use serde::{Deserialize, Serialize};

use super::caller::{Caller, SecretHash, TenantId};
use super::delay::DelayKey;
use super::error::{
    validate_election_value, validate_lock_delay_ms, validate_name, validate_semaphore_limit, validate_shares,
    CommandError,
};
use super::limits::{QuotaChange, Quotas};
use super::{ResourceKind, SessionId, Token};

/// Names one mutating request of one client, so that a retry after a lost response gets
/// the original answer instead of a second effect.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RequestId {
    /// Chosen at random by the client library, so that two clients do not collide.
    pub client_id: u64,
    /// Increases with every new request of that client; a retry repeats it.
    pub sequence: u64,
}

/// The sets of commands a build can apply, each level adding to the one before. A
/// leader proposes a command only once every member was heard at its level or above
/// (see `raft::incarnations`), or the log already used that level
/// (`StateMachine::command_level`), so a rolling upgrade never hands an older build an
/// entry it cannot apply, and a new leader need not hear every member again.
/// 0: builds that send no member header.
/// 1: `Command::RecordMember` (builds that send the member header and no level).
/// 2: `Command::CheckpointSessions`.
/// 3: lock-delay: `Command::AcquireWithDelay`, `Command::SemAcquireWithDelay`,
///    `Command::EndLockDelays`.
/// 4: shares: `Command::SetTenantShares` (a tenant's weight and rate quota).
/// 5: `Command::EndSession` (the admin ends a tenant's session).
pub const COMMAND_LEVEL: u32 = 5;
pub const COMMAND_LEVEL_RECORD_MEMBER: u32 = 1;
pub const COMMAND_LEVEL_CHECKPOINT: u32 = 2;
pub const COMMAND_LEVEL_LOCK_DELAY: u32 = 3;
pub const COMMAND_LEVEL_SHARES: u32 = 4;
pub const COMMAND_LEVEL_END_SESSION: u32 = 5;
const _: () = assert!(
    COMMAND_LEVEL_RECORD_MEMBER <= COMMAND_LEVEL
        && COMMAND_LEVEL_CHECKPOINT <= COMMAND_LEVEL
        && COMMAND_LEVEL_LOCK_DELAY <= COMMAND_LEVEL
        && COMMAND_LEVEL_SHARES <= COMMAND_LEVEL
        && COMMAND_LEVEL_END_SESSION <= COMMAND_LEVEL
);

/// One committed entry's instruction to the state machine.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub enum Command {
    CreateSession {
        request: RequestId,
        ttl_ms: u64,
        client_name: String,
    },
    CloseSession {
        request: RequestId,
        session: SessionId,
    },
    /// Proposed by the leader when its monotonic deadlines passed. No request id: the
    /// leader proposes it again for sessions that still exist, and sessions that are
    /// already gone are ignored, so a duplicate is harmless.
    ExpireSessions {
        sessions: Vec<SessionId>,
    },
    /// `wait = false` is try-lock: `Busy` instead of queueing.
    Acquire {
        request: RequestId,
        session: SessionId,
        name: String,
        wait: bool,
    },
    /// The leader proposes this when a waiting acquire's `wait_ms` ran out.
    CancelWait {
        request: RequestId,
        session: SessionId,
        name: String,
    },
    Release {
        request: RequestId,
        session: SessionId,
        name: String,
        token: Token,
    },
    /// A permit of the semaphore `name`. `limit` must be the semaphore's current limit;
    /// the first acquirer sets it. `wait = false` is try-acquire: `Busy` instead of
    /// queueing.
    SemAcquire {
        request: RequestId,
        session: SessionId,
        name: String,
        limit: u32,
        wait: bool,
    },
    /// Returns the permit granted with `token`.
    SemRelease {
        request: RequestId,
        session: SessionId,
        name: String,
        token: Token,
    },
    /// Changes the limit of a semaphore that has holders or waiters. Lowering it revokes
    /// no permit, it only holds back grants; raising it grants waiters at once. Any live
    /// session of the semaphore's tenant may send it; `session` names whose request this
    /// is, for retries. `tenant` names another tenant's semaphore: the admin's only. On
    /// an unused semaphore it is rejected (`InvalidArgument`): there is no entry to keep
    /// a limit in, and the next acquirer sets one.
    SemSetLimit {
        request: RequestId,
        session: SessionId,
        name: String,
        limit: u32,
        tenant: Option<TenantId>,
    },
    /// The leader proposes this when a waiting `SemAcquire`'s wait ran out.
    SemCancelWait {
        request: RequestId,
        session: SessionId,
        name: String,
    },
    /// Asks to lead the election `name`, announcing `value` once leading.
    /// `wait = false` is a try: `Busy` instead of queueing.
    Campaign {
        request: RequestId,
        session: SessionId,
        name: String,
        value: String,
        wait: bool,
    },
    /// The leader proposes this when a waiting `Campaign`'s wait ran out.
    CampaignCancelWait {
        request: RequestId,
        session: SessionId,
        name: String,
    },
    /// Replaces the leader's value; `token` must be the session's current leadership.
    Proclaim {
        request: RequestId,
        session: SessionId,
        name: String,
        token: Token,
        value: String,
    },
    /// Gives up the leadership granted with `token`.
    Resign {
        request: RequestId,
        session: SessionId,
        name: String,
        token: Token,
    },
    /// The admin adds a tenant; `token_hash` is the hash of its new bearer token, which
    /// only the admin's answer carries. A retry of the same request replaces the token
    /// with the retry's (the first answer was lost).
    AddTenant {
        request: RequestId,
        name: String,
        token_hash: SecretHash,
        quotas: Quotas,
    },
    /// The admin replaces a tenant's token; the old one stops working in this entry.
    RotateTenantToken {
        request: RequestId,
        name: String,
        token_hash: SecretHash,
    },
    /// The admin changes a tenant's quotas. Lowering one takes nothing away: it only
    /// refuses new sessions, holds or waits until the usage is below it.
    SetTenantQuotas {
        request: RequestId,
        name: String,
        quotas: QuotaChange,
    },
    /// The admin removes a tenant: its token stops working and its sessions end in this
    /// entry.
    RemoveTenant {
        request: RequestId,
        name: String,
    },
    /// Proposed by the leader the first time it hears from a member: the member's
    /// incarnation (see `members`), and the cluster's id if none is recorded yet.
    /// Only the cluster proposes it; a duplicate changes nothing.
    RecordMember {
        cluster_id: u128,
        node: u64,
        incarnation: u64,
    },
    /// The leader's checkpoint of session deadlines (see `shell::session_deadlines`):
    /// `quiet` lists sessions that sent no keepalive for a while, each with the time
    /// its lease had left on the leader's clock when the leader proposed this, so that
    /// a new leader starts them from that rather than from a full TTL; `resumed` lists
    /// checkpointed sessions that were kept alive again. Only the cluster proposes it;
    /// sessions that are gone are ignored. Used only once every member's build knows
    /// it (see `raft::incarnations`).
    CheckpointSessions {
        quiet: Vec<(SessionId, u64)>,
        resumed: Vec<SessionId>,
    },
    /// `Acquire` whose grant carries a lock-delay (see `delay`): if the session ends
    /// by expiry while holding it, the lock goes to no one for `delay_ms`. A plain
    /// `Acquire` has none. Used only once every member's build knows it.
    AcquireWithDelay {
        request: RequestId,
        session: SessionId,
        name: String,
        wait: bool,
        delay_ms: u64,
    },
    /// `SemAcquire` whose permit carries a lock-delay, as `AcquireWithDelay`.
    SemAcquireWithDelay {
        request: RequestId,
        session: SessionId,
        name: String,
        limit: u32,
        wait: bool,
        delay_ms: u64,
    },
    /// Proposed by the leader when the delays of locks and permits whose holders
    /// expired ran out on its monotonic clock: each is handed to the next waiter in
    /// this entry. Only the cluster proposes it; delays already ended are ignored, so
    /// a duplicate is harmless.
    EndLockDelays {
        ended: Vec<DelayKey>,
    },
    /// The admin changes a tenant's share of the leader (see `limits::Shares`): its
    /// weight and its rate quota. Those left `None` keep their values. Used only once
    /// every member's build knows it.
    SetTenantShares {
        request: RequestId,
        name: String,
        weight: Option<u32>,
        ops_per_s: Option<u32>,
    },
    /// The admin ends a session of the tenant named `tenant` (`leasehold session close
    /// ID --tenant NAME`), the remedy for a holder that must stop: its holder did not
    /// let go, so the session ends as an expired one does, and the lock-delays of its
    /// grants hold them back. Refused unless the session lives and is that tenant's.
    /// Used only once every member's build knows it.
    EndSession {
        request: RequestId,
        tenant: String,
        session: SessionId,
    },
}

impl Command {
    /// The request id of a command a client asked for; `None` for the leader's own
    /// `ExpireSessions`.
    pub fn request(&self) -> Option<RequestId> {
        match self {
            Command::CreateSession { request, .. }
            | Command::CloseSession { request, .. }
            | Command::Acquire { request, .. }
            | Command::CancelWait { request, .. }
            | Command::Release { request, .. }
            | Command::SemAcquire { request, .. }
            | Command::SemRelease { request, .. }
            | Command::SemSetLimit { request, .. }
            | Command::SemCancelWait { request, .. }
            | Command::Campaign { request, .. }
            | Command::CampaignCancelWait { request, .. }
            | Command::Proclaim { request, .. }
            | Command::Resign { request, .. }
            | Command::AddTenant { request, .. }
            | Command::RotateTenantToken { request, .. }
            | Command::SetTenantQuotas { request, .. }
            | Command::RemoveTenant { request, .. }
            | Command::AcquireWithDelay { request, .. }
            | Command::SemAcquireWithDelay { request, .. }
            | Command::SetTenantShares { request, .. }
            | Command::EndSession { request, .. } => Some(*request),
            Command::ExpireSessions { .. }
            | Command::RecordMember { .. }
            | Command::CheckpointSessions { .. }
            | Command::EndLockDelays { .. } => None,
        }
    }

    /// The one lock, semaphore or election the command touches, for commands that
    /// may share a log entry with others; `None` for commands that must have an entry
    /// of their own: a new session's id is the entry's index, and closing or expiring
    /// sessions touches everything those sessions hold.
    ///
    /// Commands on the same resource may share an entry too. A lock or an election
    /// still changes hands at most once per entry, so the entry's index stays a token
    /// that no two grants of one name share: a grant only ends by a release (or
    /// resign) of a token from an earlier entry, since a token presented in the entry
    /// that granted it is refused (`StateMachine::apply_batch`), or by the end of its
    /// session, which has an entry of its own.
    pub fn batch_key(&self) -> Option<(ResourceKind, &str)> {
        match self {
            Command::Acquire { name, .. }
            | Command::AcquireWithDelay { name, .. }
            | Command::CancelWait { name, .. }
            | Command::Release { name, .. } => Some((ResourceKind::Lock, name)),
            Command::SemAcquire { name, .. }
            | Command::SemAcquireWithDelay { name, .. }
            | Command::SemRelease { name, .. }
            | Command::SemSetLimit { name, .. }
            | Command::SemCancelWait { name, .. } => Some((ResourceKind::Semaphore, name)),
            Command::Campaign { name, .. }
            | Command::CampaignCancelWait { name, .. }
            | Command::Proclaim { name, .. }
            | Command::Resign { name, .. } => Some((ResourceKind::Election, name)),
            Command::CreateSession { .. }
            | Command::CloseSession { .. }
            | Command::ExpireSessions { .. }
            | Command::AddTenant { .. }
            | Command::RotateTenantToken { .. }
            | Command::SetTenantQuotas { .. }
            | Command::SetTenantShares { .. }
            | Command::RemoveTenant { .. }
            | Command::EndSession { .. }
            | Command::RecordMember { .. }
            | Command::CheckpointSessions { .. }
            | Command::EndLockDelays { .. } => None,
        }
    }

    /// The grant a release, resign or proclaim presents: its kind, name and token.
    pub fn presented_token(&self) -> Option<(ResourceKind, &str, Token)> {
        match self {
            Command::Release { name, token, .. } => Some((ResourceKind::Lock, name, *token)),
            Command::SemRelease { name, token, .. } => Some((ResourceKind::Semaphore, name, *token)),
            Command::Proclaim { name, token, .. } | Command::Resign { name, token, .. } => {
                Some((ResourceKind::Election, name, *token))
            }
            _ => None,
        }
    }

    /// The checks of a session command's own fields (names, limits, values, delays),
    /// which depend on nothing in the state: `execute` runs them before it looks the
    /// session up, so a command with a bad field gets the same refusal whether or not its
    /// session lives, and the leader's early refusal (`StateMachine::certain_refusal`)
    /// runs the same ones. Other commands check their fields where they are carried out.
    pub(super) fn validate_fields(&self) -> Result<(), CommandError> {
        use ResourceKind::{Election, Lock, Semaphore};
        match self {
            Command::Acquire { name, .. } | Command::CancelWait { name, .. } | Command::Release { name, .. } => {
                validate_name(Lock, name)
            }
            Command::AcquireWithDelay { name, delay_ms, .. } => {
                validate_lock_delay_ms(*delay_ms).and_then(|()| validate_name(Lock, name))
            }
            Command::SemAcquire { name, limit, .. } | Command::SemSetLimit { name, limit, .. } => {
                validate_name(Semaphore, name).and_then(|()| validate_semaphore_limit(*limit))
            }
            Command::SemAcquireWithDelay { name, limit, delay_ms, .. } => validate_lock_delay_ms(*delay_ms)
                .and_then(|()| validate_name(Semaphore, name))
                .and_then(|()| validate_semaphore_limit(*limit)),
            Command::SemRelease { name, .. } | Command::SemCancelWait { name, .. } => validate_name(Semaphore, name),
            Command::Campaign { name, value, .. } | Command::Proclaim { name, value, .. } => {
                validate_name(Election, name).and_then(|()| validate_election_value(value))
            }
            Command::CampaignCancelWait { name, .. } | Command::Resign { name, .. } => validate_name(Election, name),
            Command::SetTenantShares { weight, ops_per_s, .. } => validate_shares(*weight, *ops_per_s),
            Command::CreateSession { .. }
            | Command::CloseSession { .. }
            | Command::ExpireSessions { .. }
            | Command::AddTenant { .. }
            | Command::RotateTenantToken { .. }
            | Command::SetTenantQuotas { .. }
            | Command::RemoveTenant { .. }
            | Command::EndSession { .. }
            | Command::RecordMember { .. }
            | Command::CheckpointSessions { .. }
            | Command::EndLockDelays { .. } => Ok(()),
        }
    }

    /// The existing session the command acts on in its caller's name; `None` for the
    /// commands that create sessions or list several, and for the admin's `EndSession`,
    /// which acts on another tenant's session without its secret.
    pub fn session(&self) -> Option<SessionId> {
        match self {
            Command::CloseSession { session, .. }
            | Command::Acquire { session, .. }
            | Command::CancelWait { session, .. }
            | Command::Release { session, .. }
            | Command::SemAcquire { session, .. }
            | Command::SemRelease { session, .. }
            | Command::SemSetLimit { session, .. }
            | Command::SemCancelWait { session, .. }
            | Command::Campaign { session, .. }
            | Command::CampaignCancelWait { session, .. }
            | Command::Proclaim { session, .. }
            | Command::Resign { session, .. }
            | Command::AcquireWithDelay { session, .. }
            | Command::SemAcquireWithDelay { session, .. } => Some(*session),
            Command::CreateSession { .. }
            | Command::ExpireSessions { .. }
            | Command::AddTenant { .. }
            | Command::RotateTenantToken { .. }
            | Command::SetTenantQuotas { .. }
            | Command::SetTenantShares { .. }
            | Command::RemoveTenant { .. }
            | Command::EndSession { .. }
            | Command::RecordMember { .. }
            | Command::CheckpointSessions { .. }
            | Command::EndLockDelays { .. } => None,
        }
    }

    /// The command level (see `COMMAND_LEVEL`) a build needs to apply this command.
    pub fn level(&self) -> u32 {
        match self {
            Command::RecordMember { .. } => COMMAND_LEVEL_RECORD_MEMBER,
            Command::CheckpointSessions { .. } => COMMAND_LEVEL_CHECKPOINT,
            Command::AcquireWithDelay { .. } | Command::SemAcquireWithDelay { .. } | Command::EndLockDelays { .. } => {
                COMMAND_LEVEL_LOCK_DELAY
            }
            Command::SetTenantShares { .. } => COMMAND_LEVEL_SHARES,
            Command::EndSession { .. } => COMMAND_LEVEL_END_SESSION,
            _ => 0,
        }
    }

    /// A hash of everything in the command except its request id.
    ///
    /// It is stored in the replicated state beside a remembered answer, so it must be the
    /// same on every replica, platform and version: it is FNV-1a 64 over an encoding
    /// written out here field by field (a tag byte per kind of command, integers, `u32`
    /// limits included, as 8 little-endian bytes, a `bool` as one byte, strings as their
    /// length and then their bytes), not std's randomly seeded hasher nor a
    /// serialization format that may change.
    pub fn fingerprint(&self) -> u64 {
        let mut hasher = Fnv1a::new();
        match self {
            Command::CreateSession { request: _, ttl_ms, client_name } => {
                hasher.write_tag(1);
                hasher.write_u64(*ttl_ms);
                hasher.write_str(client_name);
            }
            Command::CloseSession { request: _, session } => {
                hasher.write_tag(2);
                hasher.write_u64(*session);
            }
            Command::ExpireSessions { sessions } => {
                hasher.write_tag(3);
                hasher.write_u64(sessions.len() as u64);
                for session in sessions {
                    hasher.write_u64(*session);
                }
            }
            Command::Acquire { request: _, session, name, wait } => {
                hasher.write_tag(4);
                hasher.write_u64(*session);
                hasher.write_str(name);
                hasher.write_tag(u8::from(*wait));
            }
            Command::CancelWait { request: _, session, name } => {
                hasher.write_tag(5);
                hasher.write_u64(*session);
                hasher.write_str(name);
            }
            Command::Release { request: _, session, name, token } => {
                hasher.write_tag(6);
                hasher.write_u64(*session);
                hasher.write_str(name);
                hasher.write_u64(*token);
            }
            Command::SemAcquire { request: _, session, name, limit, wait } => {
                hasher.write_tag(7);
                hasher.write_u64(*session);
                hasher.write_str(name);
                hasher.write_u64(u64::from(*limit));
                hasher.write_tag(u8::from(*wait));
            }
            Command::SemRelease { request: _, session, name, token } => {
                hasher.write_tag(8);
                hasher.write_u64(*session);
                hasher.write_str(name);
                hasher.write_u64(*token);
            }
            Command::SemSetLimit { request: _, session, name, limit, tenant } => {
                hasher.write_tag(9);
                hasher.write_u64(*session);
                hasher.write_str(name);
                hasher.write_u64(u64::from(*limit));
                hasher.write_u64(tenant.map_or(0, |tenant| u64::from(tenant) + 1));
            }
            Command::SemCancelWait { request: _, session, name } => {
                hasher.write_tag(10);
                hasher.write_u64(*session);
                hasher.write_str(name);
            }
            Command::Campaign { request: _, session, name, value, wait } => {
                hasher.write_tag(11);
                hasher.write_u64(*session);
                hasher.write_str(name);
                hasher.write_str(value);
                hasher.write_tag(u8::from(*wait));
            }
            Command::CampaignCancelWait { request: _, session, name } => {
                hasher.write_tag(12);
                hasher.write_u64(*session);
                hasher.write_str(name);
            }
            Command::Proclaim { request: _, session, name, token, value } => {
                hasher.write_tag(13);
                hasher.write_u64(*session);
                hasher.write_str(name);
                hasher.write_u64(*token);
                hasher.write_str(value);
            }
            Command::Resign { request: _, session, name, token } => {
                hasher.write_tag(14);
                hasher.write_u64(*session);
                hasher.write_str(name);
                hasher.write_u64(*token);
            }
            // A tenant's token is not part of its command's identity: a retry carries a
            // new one, and replaces the first.
            Command::AddTenant { request: _, name, token_hash: _, quotas } => {
                hasher.write_tag(15);
                hasher.write_str(name);
                hasher.write_quotas(quotas);
            }
            Command::RotateTenantToken { request: _, name, token_hash: _ } => {
                hasher.write_tag(16);
                hasher.write_str(name);
            }
            Command::SetTenantQuotas { request: _, name, quotas } => {
                hasher.write_tag(17);
                hasher.write_str(name);
                for quota in [quotas.sessions, quotas.holds, quotas.waiters] {
                    hasher.write_u64(quota.map_or(0, |quota| u64::from(quota) + 1));
                }
            }
            Command::RemoveTenant { request: _, name } => {
                hasher.write_tag(18);
                hasher.write_str(name);
            }
            Command::RecordMember { cluster_id, node, incarnation } => {
                hasher.write_tag(19);
                hasher.write_u64((*cluster_id >> 64) as u64);
                hasher.write_u64(*cluster_id as u64);
                hasher.write_u64(*node);
                hasher.write_u64(*incarnation);
            }
            Command::CheckpointSessions { quiet, resumed } => {
                hasher.write_tag(20);
                hasher.write_u64(quiet.len() as u64);
                for (session, remaining_ms) in quiet {
                    hasher.write_u64(*session);
                    hasher.write_u64(*remaining_ms);
                }
                hasher.write_u64(resumed.len() as u64);
                for session in resumed {
                    hasher.write_u64(*session);
                }
            }
            Command::AcquireWithDelay { request: _, session, name, wait, delay_ms } => {
                hasher.write_tag(21);
                hasher.write_u64(*session);
                hasher.write_str(name);
                hasher.write_tag(u8::from(*wait));
                hasher.write_u64(*delay_ms);
            }
            Command::SemAcquireWithDelay { request: _, session, name, limit, wait, delay_ms } => {
                hasher.write_tag(22);
                hasher.write_u64(*session);
                hasher.write_str(name);
                hasher.write_u64(u64::from(*limit));
                hasher.write_tag(u8::from(*wait));
                hasher.write_u64(*delay_ms);
            }
            Command::SetTenantShares { request: _, name, weight, ops_per_s } => {
                hasher.write_tag(24);
                hasher.write_str(name);
                for share in [weight, ops_per_s] {
                    hasher.write_u64(share.map_or(0, |share| u64::from(share) + 1));
                }
            }
            Command::EndSession { request: _, tenant, session } => {
                hasher.write_tag(25);
                hasher.write_str(tenant);
                hasher.write_u64(*session);
            }
            Command::EndLockDelays { ended } => {
                hasher.write_tag(23);
                hasher.write_u64(ended.len() as u64);
                for key in ended {
                    hasher.write_u64(u64::from(key.tenant));
                    hasher.write_tag(key.kind as u8);
                    hasher.write_str(&key.name);
                    hasher.write_u64(key.session);
                }
            }
        }
        hasher.finish()
    }
}

/// The 64-bit FNV-1a hash: a few lines, no seed, the same result everywhere.
struct Fnv1a {
    state: u64,
}

impl Fnv1a {
    const OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;

    fn new() -> Self {
        Fnv1a { state: Self::OFFSET_BASIS }
    }

    fn write_bytes(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.state ^= u64::from(*byte);
            self.state = self.state.wrapping_mul(Self::PRIME);
        }
    }

    fn write_tag(&mut self, tag: u8) {
        self.write_bytes(&[tag]);
    }

    fn write_u64(&mut self, value: u64) {
        self.write_bytes(&value.to_le_bytes());
    }

    /// The length comes first so that ("ab", "c") and ("a", "bc") differ.
    fn write_str(&mut self, value: &str) {
        self.write_u64(value.len() as u64);
        self.write_bytes(value.as_bytes());
    }

    fn write_quotas(&mut self, quotas: &Quotas) {
        self.write_u64(u64::from(quotas.sessions));
        self.write_u64(u64::from(quotas.holds));
        self.write_u64(u64::from(quotas.waiters));
    }

    fn finish(&self) -> u64 {
        self.state
    }
}

#[cfg(test)]
pub(super) fn fnv1a(bytes: &[u8]) -> u64 {
    let mut hasher = Fnv1a::new();
    hasher.write_bytes(bytes);
    hasher.finish()
}

/// A command and who sent it: what a log entry carries per command.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Submission {
    pub caller: Caller,
    pub command: Command,
}
