//! Which lock-delay an acquire carries (see `machine::delay`), and whether the cluster
//! may use lock-delay yet.
//!
//! An acquire that names no delay gets the node's default for its name: the longest
//! `--lock-delay-default` prefix that matches. The acquire commands that carry a delay
//! are of command level 3; the leader proposes one only once the log used that level
//! (every member's build knew it then) or it heard every member at it, so that a
//! rolling upgrade never hands an older build an entry it cannot apply. A leader that
//! took office a moment ago may not have heard every member yet, so it waits a little
//! before it refuses with `MEMBERS_TOO_OLD`.

use std::sync::Arc;
use std::time::Duration;

use leasehold_proto::errors::error_status;
use leasehold_proto::ErrorReason;
use openraft::ServerState;
use tonic::Status;

use crate::machine::COMMAND_LEVEL_LOCK_DELAY;
use crate::raft::incarnations::Incarnations;
use crate::raft::replica::{not_leader_status, Replica};
use crate::raft::types::NodeId;

/// How long a leader waits to hear every member at the lock-delay level before it
/// refuses an acquire with a delay: a few heartbeats.
pub const LOCK_DELAY_LEVEL_WAIT_MS: u64 = 1_000;
const LEVEL_POLL_MS: u64 = 20;

pub struct LockDelayPolicy {
    defaults: DelayDefaults,
    incarnations: Arc<Incarnations>,
}

/// `--lock-delay-default` entries, longest prefix first.
struct DelayDefaults(Vec<(String, u64)>);

impl DelayDefaults {
    fn new(mut defaults: Vec<(String, u64)>) -> Self {
        defaults.sort_by(|(left, _), (right, _)| right.len().cmp(&left.len()).then(left.cmp(right)));
        DelayDefaults(defaults)
    }

    /// The longest matching prefix's delay; 0 when none matches.
    fn for_name(&self, name: &str) -> u64 {
        self.0.iter().find(|(prefix, _)| name.starts_with(prefix.as_str())).map_or(0, |(_, delay_ms)| *delay_ms)
    }
}

impl LockDelayPolicy {
    pub fn new(defaults: Vec<(String, u64)>, incarnations: Arc<Incarnations>) -> Self {
        Self { defaults: DelayDefaults::new(defaults), incarnations }
    }

    /// The delay of an acquire of `name`: the one it asked for, or the default.
    pub fn delay_ms(&self, requested: Option<u64>, name: &str) -> u64 {
        requested.unwrap_or_else(|| self.defaults.for_name(name))
    }

    /// Ok once a command of the lock-delay level may be proposed (see `level_ready`).
    pub async fn admit(&self, replica: &Replica) -> Result<(), Status> {
        level_ready(replica, &self.incarnations, COMMAND_LEVEL_LOCK_DELAY, "lock-delay", "or acquire without a delay")
            .await
    }
}

/// Ok once a command of `level` may be proposed: the log used that level, or this
/// leader heard every member at it (waiting `LOCK_DELAY_LEVEL_WAIT_MS` for a leader
/// that took office a moment ago). Otherwise `MEMBERS_TOO_OLD`, naming `feature` and
/// what the caller may do instead (`instead`).
///
/// A node that does not lead answers `NOT_LEADER` here rather than leave that to the
/// proposal: a command waits in the admission queue for its batch, and a candidate
/// that let it through could win its election meanwhile and write it without having
/// heard the members' levels. A node whose own build is below `level` (an older build
/// emulated in tests) refuses at once, as that build would.
pub async fn level_ready(
    replica: &Replica,
    incarnations: &Incarnations,
    level: u32,
    feature: &str,
    instead: &str,
) -> Result<(), Status> {
    let too_old = |node: NodeId| {
        error_status(
            ErrorReason::MembersTooOld,
            format!(
                "{feature} needs every member's build at command level {level}, and node {node} was not heard at \
                 it; upgrade every member, {instead}"
            ),
            &[("command_level", level.to_string()), ("node", node.to_string())],
        )
    };
    let deadline = replica.clock.now_ms() + LOCK_DELAY_LEVEL_WAIT_MS;
    loop {
        if replica.shared.applied.read().unwrap().machine.command_level() >= level {
            return Ok(());
        }
        let (me, members) = {
            let metrics = replica.raft.metrics();
            let metrics = metrics.borrow();
            if metrics.state != ServerState::Leader {
                let membership = metrics.membership_config.membership();
                let leader_addr =
                    metrics.current_leader.and_then(|id| membership.get_node(&id).map(|node| node.client_addr.clone()));
                return Err(not_leader_status(metrics.id, metrics.current_leader, leader_addr));
            }
            let members: Vec<NodeId> = metrics.membership_config.membership().nodes().map(|(id, _)| *id).collect();
            (metrics.id, members)
        };
        if incarnations.level() < level {
            return Err(too_old(me));
        }
        let behind = incarnations.member_below(level, &members);
        let Some(node) = behind else { return Ok(()) };
        if replica.clock.now_ms() >= deadline {
            return Err(too_old(node));
        }
        tokio::time::sleep(Duration::from_millis(LEVEL_POLL_MS)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::DelayDefaults;

    #[test]
    fn the_longest_matching_prefix_gives_the_default() {
        let defaults = DelayDefaults::new(vec![("a/".to_owned(), 1_000), ("a/b/".to_owned(), 2_000)]);
        assert_eq!(defaults.for_name("a/b/c"), 2_000);
        assert_eq!(defaults.for_name("a/c"), 1_000);
        assert_eq!(defaults.for_name("b"), 0, "no default is no delay");
        let everything = DelayDefaults::new(vec![(String::new(), 5), ("a/".to_owned(), 0)]);
        assert_eq!(everything.for_name("x"), 5, "the empty prefix matches every name");
        assert_eq!(everything.for_name("a/x"), 0, "a longer prefix may take the delay away");
    }
}
