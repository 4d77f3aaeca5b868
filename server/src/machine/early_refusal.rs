//! Refusals the leader can give before a command costs a log entry.
//!
//! A command that is certain to be refused still takes a whole entry if it is
//! proposed: fsynced, replicated and applied on every node, only to change nothing. A
//! client that sends such commands in a loop (closing sessions that are gone, releasing
//! with a stale token) would then fill the log and slow every other tenant. So the
//! leader asks its applied state first, and answers at once what that state proves
//! will be refused.
//!
//! Only refusals that no later entry can undo are decided early. The applied state
//! may be behind the log (entries in flight, a new leader still applying), so each
//! rule here holds for the applied state *and every state after it*:
//!
//! - the caller may not send the command at all (`authorize`): a removed tenant stays
//!   removed (tenant ids are never reused), a session's tenant never changes, and a
//!   session's secret never changes once a request named it;
//! - a field is malformed (a name, a limit, a value): that depends on the command only;
//! - the session is gone: session ids are the indexes of their creating entries, so a
//!   session whose id is at or below the applied index and that is not in the state
//!   was closed or expired (or never existed), and never comes back;
//! - a release, resign or proclaim presents a token below the last applied index that
//!   is not the session's current grant: that grant was made by an applied entry and
//!   has ended, and no later entry grants with an old index. (A token of the last
//!   applied entry or later is left to the log, which checks it against the entry the
//!   command lands in first of all.)
//!
//! A request the session remembers is never refused early: its retry gets the
//! remembered answer from the log, whatever the state says now. Everything else (a
//! quota, a full wait list, a busy lock, a wait that is not there) can change with the
//! entries in flight, so it is left to the log. The state machine checks everything
//! again when it applies; an early refusal is the answer applying the command would
//! give, decided sooner, never a second set of rules (the property test in
//! `model_tests.rs` applies every early-refused command and checks that it is refused
//! the same way, then and at the end of the run).

use super::caller::Caller;
use super::command::Command;
use super::error::{unknown_session, CommandError, ErrorKind};
use super::StateMachine;

impl StateMachine {
    /// The refusal `command` from `caller` is certain to get whenever it is applied
    /// after the entries applied so far, or `None` when only the log can tell. Commands
    /// of the cluster itself are never refused early.
    pub fn certain_refusal(&self, caller: &Caller, command: &Command) -> Option<CommandError> {
        if *caller == Caller::Cluster {
            return None;
        }
        let session = command.session().and_then(|session| self.sessions.get(&session));
        if let Err(error) = self.authorize(caller, command) {
            // A retried CreateSession may still give an unused session the secret this
            // command presents.
            let secret_may_change = session.is_some_and(|session| session.secret_may_change());
            if error.kind == ErrorKind::WrongSessionSecret && secret_may_change {
                return None;
            }
            return Some(error);
        }
        let session_id = command.session()?;
        let Some(session) = session else {
            if session_id > self.last_applied_index() {
                // Perhaps created by an entry this node has not applied yet.
                return None;
            }
            return Some(command.validate_fields().err().unwrap_or_else(|| unknown_session(session_id)));
        };
        if command.request().is_some_and(|request| session.remembers(request)) {
            return None;
        }
        // A token of the last applied entry or later may be a grant of the very entry
        // the command lands in, which `execute` refuses before anything else (a grant
        // must not end in the entry that made it): only the log can tell.
        if command.presented_token().is_some_and(|(_, _, token)| token >= self.last_applied_index()) {
            return None;
        }
        if let Err(error) = command.validate_fields() {
            return Some(error);
        }
        let tenant = session.tenant();
        // The token is older than the last applied entry (checked above): its grant
        // was made by an applied entry, and if it is not current it has ended.
        let ended = match command {
            Command::Release { name, token, .. } => self.check_lock_holder(tenant, session_id, name, *token),
            Command::SemRelease { name, token, .. } => self.check_permit_holder(tenant, session_id, name, *token),
            Command::Proclaim { name, token, .. } => {
                self.check_leadership(session_id, name, *token, "proclaim").map(|_| ())
            }
            Command::Resign { name, token, .. } => {
                self.check_leadership(session_id, name, *token, "resign").map(|_| ())
            }
            _ => Ok(()),
        };
        ended.err()
    }
}
