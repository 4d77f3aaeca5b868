//! `leasehold-server restore`: makes one node's data directory of a new cluster from
//! a backup file (`leasehold snapshot save`). Run it for every node of the new
//! cluster with the same file, the same floor and the same initial members, then start
//! the nodes as usual: they elect a leader among those members and serve the state
//! as it was saved.
//!
//! Tokens are log indexes, and the old cluster may have granted more after the backup
//! was taken. The restored log starts at the floor (`--token-floor`, the old cluster's
//! last log index or more; by default the backup's index plus `TOKEN_JUMP_DEFAULT`), so
//! every token the new cluster grants is above every token the old one could have:
//! the storage a lock protects never sees its token go back.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use openraft::{CommittedLeaderId, Membership};

use crate::node::data_dir::{self, Claim};
use crate::node::StartError;
use crate::raft::backup;
use crate::raft::log_store;
use crate::raft::state_machine_store;
use crate::raft::storage;
use crate::raft::types::{LogId, Node, NodeId, SnapshotMeta, StoredMembership};
use crate::shell::entropy::Entropy;

/// How far above the backup's index a restored cluster starts when no floor is
/// given: 2^40 entries, more than five years of the fastest entry rate measured on
/// the 2-core machine (about 6,000 entries a second), and a million restores still
/// fit in a token.
pub const TOKEN_JUMP_DEFAULT: u64 = 1 << 40;

pub struct RestoreOptions {
    pub backup: PathBuf,
    pub data_dir: PathBuf,
    pub node_id: NodeId,
    pub cluster_name: String,
    pub members: BTreeMap<NodeId, Node>,
    pub token_floor: Option<u64>,
}

/// What a restore made.
#[derive(Debug)]
pub struct Restored {
    pub backup_index: u64,
    /// The restored state's index: every new token is above it.
    pub starts_at: u64,
    pub sessions: usize,
    pub locks: usize,
}

pub fn restore(options: &RestoreOptions) -> Result<Restored, StartError> {
    let refused = |message: String| StartError::DataDirectory(message);
    if !options.members.contains_key(&options.node_id) {
        return Err(StartError::Failed(format!(
            "node {} is not among the initial members {:?}",
            options.node_id,
            options.members.keys().collect::<Vec<_>>()
        )));
    }
    let file = std::fs::read(&options.backup)
        .map_err(|error| StartError::Failed(format!("cannot read {}: {error}", options.backup.display())))?;
    let backup::Backup { header, mut machine } =
        backup::decode(&file).map_err(|error| StartError::Failed(format!("{}: {error}", options.backup.display())))?;
    let floor = options.token_floor.unwrap_or(header.index.saturating_add(TOKEN_JUMP_DEFAULT));
    let starts_at = floor.max(header.index);

    match data_dir::inspect(&options.data_dir, &options.cluster_name, options.node_id)
        .map_err(|error| refused(error.to_string()))?
    {
        Claim::Fresh => {}
        Claim::Existing(_) => {
            return Err(refused(format!(
                "data directory {}: a restore makes a new node's directory, and this one holds node {}'s data",
                options.data_dir.display(),
                options.node_id
            )))
        }
    }
    data_dir::claim(&options.data_dir, &options.cluster_name, options.node_id, &Entropy::os())
        .map_err(|error| refused(error.to_string()))?;
    let disk = storage::open(&options.data_dir.join(data_dir::DATABASE_DIR), true)
        .map_err(|error| refused(format!("data directory {}: {error}", options.data_dir.display())))?;

    machine.restore_at(starts_at);
    let log_id = LogId::new(CommittedLeaderId::new(0, 0), starts_at);
    let voters: BTreeSet<NodeId> = options.members.keys().copied().collect();
    let membership = Membership::new(vec![voters], options.members.clone());
    let meta = SnapshotMeta {
        last_log_id: Some(log_id),
        last_membership: StoredMembership::new(Some(log_id), membership),
        snapshot_id: format!("restored-{}-at-{starts_at}", header.index),
    };
    state_machine_store::seed(&*disk, &machine, &meta).map_err(StartError::Failed)?;
    log_store::seed(&*disk, log_id).map_err(StartError::Failed)?;
    Ok(Restored {
        backup_index: header.index,
        starts_at,
        sessions: machine.session_count(),
        locks: machine.lock_count(),
    })
}
