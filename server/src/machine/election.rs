//! One entry of the election table, and the commands on elections.

use serde::{Deserialize, Serialize};

use super::caller::TenantId;
use super::error::{not_leader, session_locks_full, unknown_session, waiters_full};
use super::lock::Holder;
use super::session::Role;
use super::{
    position_u32, AcquireOutcome, CancelOutcome, CommandError, Event, LeaderView, ResourceKind, Response, SessionId,
    StateMachine, Token, WaitFailure,
};
use crate::machine::limits::{LOCKS_PER_SESSION_MAX, WAITERS_PER_LOCK_MAX};

const KIND: ResourceKind = ResourceKind::Election;

/// An election that has a leader. A vacant election has no entry: when the leader leaves
/// and no one campaigns the entry is removed, and a campaigner waits only while someone
/// leads, because the first campaigner in line leads as soon as the leader leaves.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub(super) struct Election {
    /// The token is the index of the entry that made this session leader.
    pub(super) leader: Holder,
    /// What the leader announces; a proclaim replaces it.
    pub(super) value: String,
    /// First in line first, each with the value it will announce once leading.
    pub(super) waiters: Vec<Campaigner>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub(super) struct Campaigner {
    pub(super) session: SessionId,
    pub(super) value: String,
}

impl Election {
    pub(super) fn waiter_position(&self, session: SessionId) -> Option<u32> {
        self.waiters.iter().position(|waiter| waiter.session == session).map(position_u32)
    }
}

impl StateMachine {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn campaign(
        &mut self,
        index: u64,
        stamp_ms: u64,
        session_id: SessionId,
        name: &str,
        value: &str,
        wait: bool,
        events: &mut Vec<Event>,
    ) -> Result<AcquireOutcome, CommandError> {
        let Some(session) = self.sessions.get(&session_id) else {
            return Err(unknown_session(session_id));
        };
        let tenant = session.tenant;
        let count = session.resource_count();
        let Some(election) = self.namespace(tenant).elections.get(name) else {
            self.admit_hold(tenant, session_id, count)?;
            self.namespace_mut(tenant).elections.insert(
                name.to_owned(),
                Election {
                    leader: Holder { session: session_id, token: index, since_ms: stamp_ms },
                    value: value.to_owned(),
                    waiters: Vec::new(),
                },
            );
            self.session_mut(session_id).add_claim(KIND, Role::Holds, name);
            self.announce_leader(tenant, name, true, events);
            return Ok(AcquireOutcome::Granted { token: index });
        };
        if election.leader.session == session_id {
            // Not a new leadership: the token stays, and so does the value (a proclaim
            // changes it).
            return Ok(AcquireOutcome::Granted { token: election.leader.token });
        }
        if !wait {
            return Ok(AcquireOutcome::Busy { holder: election.leader.session, token: election.leader.token });
        }
        if let Some(position) = election.waiter_position(session_id) {
            // The value it queued with stays: the campaign is the one already waiting.
            return Ok(AcquireOutcome::Queued { position });
        }
        if count >= LOCKS_PER_SESSION_MAX {
            return Err(session_locks_full(session_id, count));
        }
        if election.waiters.len() >= WAITERS_PER_LOCK_MAX {
            return Err(waiters_full(KIND, name, election.waiters.len()));
        }
        let position = position_u32(election.waiters.len());
        self.check_quota(tenant, Role::Waits)?;
        self.election_mut(tenant, name).waiters.push(Campaigner { session: session_id, value: value.to_owned() });
        self.session_mut(session_id).add_claim(KIND, Role::Waits, name);
        Ok(AcquireOutcome::Queued { position })
    }

    pub(super) fn campaign_cancel_wait(
        &mut self,
        session_id: SessionId,
        name: &str,
        events: &mut Vec<Event>,
    ) -> Result<CancelOutcome, CommandError> {
        let Some(tenant) = self.sessions.get(&session_id).map(|session| session.tenant) else {
            return Err(unknown_session(session_id));
        };
        let Some(election) = self.namespaces.get_mut(&tenant).and_then(|namespace| namespace.elections.get_mut(name))
        else {
            return Ok(CancelOutcome::NotWaiting);
        };
        if election.leader.session == session_id {
            return Ok(CancelOutcome::AlreadyGranted { token: election.leader.token });
        }
        let Some(position) = election.waiter_position(session_id) else {
            return Ok(CancelOutcome::NotWaiting);
        };
        // The election keeps its leader, so no one is granted here.
        election.waiters.remove(position as usize);
        self.session_mut(session_id).remove_claim(KIND, Role::Waits, name);
        events.push(Event::WaitFailed {
            kind: KIND,
            name: name.to_owned(),
            session: session_id,
            reason: WaitFailure::Cancelled,
        });
        Ok(CancelOutcome::Cancelled)
    }

    /// A proclaim of the value the leader already has changes nothing and emits nothing.
    pub(super) fn proclaim(
        &mut self,
        session_id: SessionId,
        name: &str,
        token: Token,
        value: &str,
        events: &mut Vec<Event>,
    ) -> Result<Response, CommandError> {
        let tenant = self.check_leadership(session_id, name, token, "proclaim")?;
        let election = self.election_mut(tenant, name);
        if election.value != value {
            election.value = value.to_owned();
            self.announce_leader(tenant, name, false, events);
        }
        Ok(Response::Proclaimed { token })
    }

    pub(super) fn resign(
        &mut self,
        index: u64,
        stamp_ms: u64,
        session_id: SessionId,
        name: &str,
        token: Token,
        events: &mut Vec<Event>,
    ) -> Result<Response, CommandError> {
        let tenant = self.check_leadership(session_id, name, token, "resign")?;
        self.session_mut(session_id).remove_claim(KIND, Role::Holds, name);
        events.push(Event::Released { kind: KIND, name: name.to_owned(), session: session_id, token });
        self.hand_over_election(index, stamp_ms, tenant, name, events);
        Ok(Response::Resigned { token })
    }

    /// Where a queued `Campaign` of `session` stands now, for its retry.
    pub(super) fn campaign_wait_outcome(&self, session: SessionId, name: &str) -> AcquireOutcome {
        let Some(election) = self.namespace(self.session(session).tenant).elections.get(name) else {
            return AcquireOutcome::TimedOut;
        };
        if election.leader.session == session {
            return AcquireOutcome::Granted { token: election.leader.token };
        }
        match election.waiter_position(session) {
            Some(position) => AcquireOutcome::Queued { position },
            None => AcquireOutcome::TimedOut,
        }
    }

    /// The leader of `name` has left (and no longer lists it): the first campaigner in
    /// line leads with this entry's index as its token and its own value, or the election
    /// falls vacant and its entry goes. Either way observers hear of it.
    pub(super) fn hand_over_election(
        &mut self,
        index: u64,
        stamp_ms: u64,
        tenant: TenantId,
        name: &str,
        events: &mut Vec<Event>,
    ) {
        let election = self.election_mut(tenant, name);
        if election.waiters.is_empty() {
            self.namespace_mut(tenant).elections.remove(name);
            self.drop_namespace_if_unused(tenant);
            events.push(Event::LeaderChanged { tenant, name: name.to_owned(), leader: None });
            return;
        }
        assert!(
            index > election.leader.token,
            "leader tokens of one election strictly increase: {index} after {}",
            election.leader.token
        );
        let next = election.waiters.remove(0);
        election.leader = Holder { session: next.session, token: index, since_ms: stamp_ms };
        election.value = next.value;
        let session = self.session_mut(next.session);
        session.remove_claim(KIND, Role::Waits, name);
        session.add_claim(KIND, Role::Holds, name);
        self.announce_leader(tenant, name, true, events);
    }

    /// Tells the shell and observers about the leader of `name`: `Granted` when the
    /// leadership is new (not for a proclaim), then `LeaderChanged` either way.
    fn announce_leader(&self, tenant: TenantId, name: &str, new_leadership: bool, events: &mut Vec<Event>) {
        let leader = self.leader_view(tenant, name).expect("an announced election has a leader");
        if new_leadership {
            events.push(Event::Granted {
                kind: KIND,
                name: name.to_owned(),
                session: leader.session,
                token: leader.token,
            });
        }
        events.push(Event::LeaderChanged { tenant, name: name.to_owned(), leader: Some(leader) });
    }

    /// Rejects a proclaim or resign whose token is not the session's current leadership;
    /// returns the session's tenant.
    pub(super) fn check_leadership(
        &self,
        session_id: SessionId,
        name: &str,
        token: Token,
        action: &str,
    ) -> Result<TenantId, CommandError> {
        let Some(tenant) = self.sessions.get(&session_id).map(|session| session.tenant) else {
            return Err(unknown_session(session_id));
        };
        let current =
            self.namespace(tenant).elections.get(name).map(|election| (election.leader.session, election.leader.token));
        if current != Some((session_id, token)) {
            // A stale token must not act for a later leadership of the same session: it
            // may come from the paused process that held the earlier one.
            return Err(not_leader(session_id, name, token, action, current));
        }
        Ok(tenant)
    }

    /// The leader of election `name` in `tenant`'s namespace; `None` when vacant.
    pub fn leader_view(&self, tenant: TenantId, name: &str) -> Option<LeaderView> {
        let election = self.namespace(tenant).elections.get(name)?;
        Some(LeaderView {
            session: election.leader.session,
            client_name: self.session(election.leader.session).client_name.to_string(),
            token: election.leader.token,
            since_ms: election.leader.since_ms,
            value: election.value.clone(),
        })
    }

    fn election_mut(&mut self, tenant: TenantId, name: &str) -> &mut Election {
        self.namespaces
            .get_mut(&tenant)
            .and_then(|namespace| namespace.elections.get_mut(name))
            .unwrap_or_else(|| panic!("election {name:?} is referenced but vacant"))
    }
}
