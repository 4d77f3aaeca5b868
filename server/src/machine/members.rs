//! The cluster's identity and its members' incarnations, as the log records them.
//!
//! A node's data directory holds a random incarnation, drawn when the directory was
//! first used. The leader records each member's incarnation in the log
//! (`Command::RecordMember`) the first time it hears from it, and with the first
//! record the cluster's random id. A node whose directory was wiped comes back with
//! another incarnation; every peer that applied the record then refuses its votes,
//! its acknowledgements and its messages, so it can never count as the voter that
//! lost its log. Removing a member forgets its record (`retain_members`), and the
//! node can then join again as a new member with its new directory.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::machine::command::{COMMAND_LEVEL_CHECKPOINT, COMMAND_LEVEL_LOCK_DELAY, COMMAND_LEVEL_SHARES};
use crate::machine::delay::{ClaimKey, DelayKey, HeldBack};
use crate::machine::{CommandError, Response, SessionId, Shares, StateMachine, TenantId};

/// A node id as Raft's membership knows it.
pub type NodeId = u64;

/// What the log says about the cluster and its members.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterRecord {
    /// Set by the first `RecordMember` applied; never changes after.
    pub cluster_id: Option<u128>,
    /// Each member's incarnation, recorded when the leader first heard from it.
    pub incarnations: BTreeMap<NodeId, Recorded>,
}

/// A member's incarnation and the index of the entry that recorded it. A record made
/// later (the member was removed and added again) says more than an earlier one: a
/// node that is still applying old entries holds an old record for a while.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub struct Recorded {
    pub incarnation: u64,
    pub index: u64,
}

impl ClusterRecord {
    /// The recorded incarnation of `node`, if any.
    pub fn incarnation(&self, node: NodeId) -> Option<u64> {
        self.incarnations.get(&node).map(|recorded| recorded.incarnation)
    }

    pub fn recorded(&self, node: NodeId) -> Option<Recorded> {
        self.incarnations.get(&node).copied()
    }
}

impl StateMachine {
    pub(super) fn record_member(
        &mut self,
        index: u64,
        cluster_id: u128,
        node: NodeId,
        incarnation: u64,
    ) -> Result<Response, CommandError> {
        let record = &mut self.cluster;
        let cluster_id = *record.cluster_id.get_or_insert(cluster_id);
        // The first record of a member stands until the member is removed: a later
        // proposal with another incarnation comes from a leader that heard a node
        // whose directory was replaced, and changes nothing.
        let recorded = *record.incarnations.entry(node).or_insert(Recorded { incarnation, index });
        Ok(Response::MemberRecorded { cluster_id, incarnation: recorded.incarnation })
    }

    /// Forgets the incarnations of nodes that are no longer members (applied with
    /// each membership entry), so that a removed node may join again with a new
    /// directory.
    pub fn retain_members(&mut self, is_member: impl Fn(NodeId) -> bool) {
        self.cluster.incarnations.retain(|node, _| is_member(*node));
    }

    /// Makes this state (read from a backup) the start of a restored cluster: applied
    /// up to `index`, which is at least its own last index, so that every index the
    /// new cluster gives out, and so every token, is above `index`; and no member or
    /// cluster id recorded (the new cluster's nodes are other incarnations, recorded
    /// as they answer, under a new id); and no session checkpointed as quiet (the old
    /// cluster may have kept one alive after the backup: each starts with a full TTL).
    ///
    /// # Panics
    ///
    /// If `index` is below the last applied index.
    pub fn restore_at(&mut self, index: u64) {
        assert!(Some(index) >= self.last_applied, "a restored state starts at or above its own index");
        self.last_applied = Some(index);
        self.cluster = ClusterRecord::default();
        self.quiet.clear();
    }

    pub fn cluster_record(&self) -> &ClusterRecord {
        &self.cluster
    }

    /// Appends the machine as a snapshot holds it to `bytes`: the machine's own
    /// fields, then its cluster record. Behind, not inside, so that a snapshot written
    /// before the record existed still decodes, and a build that predates the record
    /// reads the machine and ignores the rest.
    pub fn snapshot_into(&self, bytes: Vec<u8>) -> Vec<u8> {
        let bytes = postcard::to_extend(self, bytes).expect("postcard encoding into a Vec cannot fail");
        let bytes = postcard::to_extend(&self.cluster, bytes).expect("postcard encoding into a Vec cannot fail");
        if self.quiet.is_empty() && self.command_level < COMMAND_LEVEL_CHECKPOINT {
            return bytes;
        }
        let bytes = postcard::to_extend(&self.quiet, bytes).expect("postcard encoding into a Vec cannot fail");
        let bytes = postcard::to_extend(&self.command_level, bytes).expect("postcard encoding into a Vec cannot fail");
        if self.command_level < COMMAND_LEVEL_LOCK_DELAY {
            return bytes;
        }
        let bytes = postcard::to_extend(&self.claim_delays, bytes).expect("postcard encoding into a Vec cannot fail");
        let bytes = postcard::to_extend(&self.held_back, bytes).expect("postcard encoding into a Vec cannot fail");
        if self.command_level < COMMAND_LEVEL_SHARES {
            return bytes;
        }
        postcard::to_extend(&self.tenant_shares, bytes).expect("postcard encoding into a Vec cannot fail")
    }

    /// Reads what `snapshot_into` wrote; nothing after the machine is an empty record
    /// (the leader then records the members again), nothing after the record is no
    /// checkpointed session and no command of level 2 or above used (snapshots of
    /// builds before either, or of clusters that never used one), nothing after
    /// the command level is no lock-delay used, and nothing after the held-back grants
    /// is no tenant given a share.
    pub fn from_snapshot(bytes: &[u8]) -> Result<StateMachine, postcard::Error> {
        let (mut machine, mut rest) = postcard::take_from_bytes::<StateMachine>(bytes)?;
        if !rest.is_empty() {
            let (record, after) = postcard::take_from_bytes::<ClusterRecord>(rest)?;
            machine.cluster = record;
            rest = after;
        }
        if !rest.is_empty() {
            let (quiet, after) = postcard::take_from_bytes::<BTreeMap<SessionId, (u32, u64)>>(rest)?;
            let (level, mut after) = postcard::take_from_bytes::<u32>(after)?;
            if !after.is_empty() {
                let (claim_delays, rest) = postcard::take_from_bytes::<BTreeMap<ClaimKey, u32>>(after)?;
                let (held_back, rest) = postcard::take_from_bytes::<BTreeMap<DelayKey, HeldBack>>(rest)?;
                machine.claim_delays = claim_delays;
                machine.held_back = held_back;
                after = rest;
            }
            if !after.is_empty() {
                let (tenant_shares, rest) = postcard::take_from_bytes::<BTreeMap<TenantId, Shares>>(after)?;
                machine.tenant_shares = tenant_shares;
                after = rest;
            }
            if !after.is_empty() {
                return Err(postcard::Error::DeserializeBadEncoding);
            }
            machine.quiet = quiet;
            machine.command_level = level;
        }
        Ok(machine)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::{Caller, Command};

    fn record(machine: &mut StateMachine, index: u64, cluster_id: u128, node: NodeId, incarnation: u64) -> Response {
        machine.apply_as(index, 0, &Caller::Cluster, &Command::RecordMember { cluster_id, node, incarnation }).0
    }

    #[test]
    fn the_first_record_stands_until_the_member_is_removed() {
        let mut machine = StateMachine::new();
        assert_eq!(record(&mut machine, 1, 7, 2, 20), Response::MemberRecorded { cluster_id: 7, incarnation: 20 });
        assert_eq!(
            record(&mut machine, 2, 8, 2, 21),
            Response::MemberRecorded { cluster_id: 7, incarnation: 20 },
            "neither the cluster id nor a recorded incarnation changes"
        );
        record(&mut machine, 3, 8, 3, 30);
        machine.retain_members(|node| node != 2);
        assert_eq!(machine.cluster_record().incarnation(2), None, "a removed member is forgotten");
        assert_eq!(machine.cluster_record().incarnation(3), Some(30));
        assert_eq!(record(&mut machine, 4, 9, 2, 21), Response::MemberRecorded { cluster_id: 7, incarnation: 21 });
        assert_eq!(machine.cluster_record().recorded(2), Some(Recorded { incarnation: 21, index: 4 }));
        assert_eq!(machine.cluster_record().recorded(3), Some(Recorded { incarnation: 30, index: 3 }));
    }

    #[test]
    fn a_tenant_cannot_record_a_member() {
        let mut machine = StateMachine::new();
        let command = Command::RecordMember { cluster_id: 7, node: 2, incarnation: 20 };
        let (response, _) = machine.apply_as(1, 0, &Caller::Admin { secret: Default::default() }, &command);
        assert!(matches!(response, Response::Rejected(_)), "{response:?}");
        assert_eq!(machine.cluster_record(), &ClusterRecord::default());
    }

    #[test]
    fn snapshots_carry_the_record_and_older_ones_still_decode() {
        let mut machine = StateMachine::new();
        record(&mut machine, 1, 7, 2, 20);
        let restored = StateMachine::from_snapshot(&machine.snapshot_into(Vec::new())).unwrap();
        assert_eq!(restored, machine);
        assert_eq!(restored.cluster_record().incarnation(2), Some(20));

        // Written by a build without the record: the machine's fields alone.
        let older = postcard::to_stdvec(&machine).unwrap();
        let restored = StateMachine::from_snapshot(&older).unwrap();
        assert_eq!(restored.cluster_record(), &ClusterRecord::default());
        assert_eq!(restored.last_applied(), machine.last_applied());

        // Checkpointed sessions come after the record; a snapshot without any has none.
        let created = machine.apply_as(
            2,
            0,
            &Caller::Cluster,
            &Command::CreateSession {
                request: crate::machine::RequestId { client_id: 1, sequence: 1 },
                ttl_ms: 5_000,
                client_name: "worker".to_string(),
            },
        );
        assert!(matches!(created.0, Response::SessionCreated { session: 2, .. }), "{created:?}");
        let checkpoint = Command::CheckpointSessions { quiet: vec![(2, 1_500)], resumed: vec![] };
        machine.apply_as(3, 0, &Caller::Cluster, &checkpoint);
        let restored = StateMachine::from_snapshot(&machine.snapshot_into(Vec::new())).unwrap();
        assert_eq!(restored, machine);
        assert_eq!(restored.quiet_remaining_ms(2), Some(1_500));

        assert_eq!(restored.command_level(), COMMAND_LEVEL_CHECKPOINT, "a checkpoint was applied");
        let mut longer = machine.snapshot_into(Vec::new());
        longer.push(0);
        assert!(StateMachine::from_snapshot(&longer).is_err(), "bytes after the command level are refused");

        // A restored cluster starts with no session checkpointed, but keeps the level.
        let mut restored = StateMachine::from_snapshot(&machine.snapshot_into(Vec::new())).unwrap();
        restored.restore_at(100);
        assert_eq!(restored.quiet_remaining_ms(2), None);
        assert_eq!(restored.command_level(), COMMAND_LEVEL_CHECKPOINT);
    }
}
