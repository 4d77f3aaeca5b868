//! openraft's type configuration for Leasehold, and the payload of a log entry.

use std::fmt;
use std::io::Cursor;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::machine::{Response, Submission};

/// A cluster member as Raft's membership records it. Both addresses travel with the
/// membership so that every node can tell a client where the leader is and reach
/// every peer, wherever the nodes run.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct Node {
    /// Where clients reach the node (`Leasehold` and `Admin` services).
    pub client_addr: String,
    /// Where peers reach the node (`Peer` service). Never given to clients.
    pub peer_addr: String,
}

impl fmt::Display for Node {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "client={} peer={}", self.client_addr, self.peer_addr)
    }
}

/// The application payload of a normal log entry: one command, or several that each
/// touch one resource (see `Command::batch_key`), batched by the leader so that one
/// fsync and one replication round commit them all.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Proposal {
    /// The leader's wall clock when it proposed the entry, milliseconds since the Unix
    /// epoch. Informational only ("since" in describe output); no decision uses it.
    pub stamp_ms: u64,
    /// Shared, so that the log store's recent entries are handed out without copying
    /// the commands. Encoded like a `Vec`: the stored format does not depend on it.
    /// Each command comes with its caller, which the machine checks as it applies.
    pub commands: Arc<[Submission]>,
}

impl fmt::Display for Proposal {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "{} command(s)", self.commands.len())
    }
}

pub type NodeId = u64;

/// Voters and learners in a cluster at most: the configuration's initial members and
/// `AddMember` are both held to it.
pub const MEMBERS_MAX: usize = 7;

openraft::declare_raft_types!(
    /// Leasehold's Raft types.
    pub TypeConfig:
        D = Proposal,
        // One response per command of the entry; none for blank and membership entries.
        R = Vec<Response>,
        NodeId = NodeId,
        Node = Node,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = crate::raft::runtime::RaftRuntime,
);

pub type Raft = openraft::Raft<TypeConfig>;
pub type Entry = openraft::Entry<TypeConfig>;
pub type LogId = openraft::LogId<NodeId>;
pub type Vote = openraft::Vote<NodeId>;
pub type StoredMembership = openraft::StoredMembership<NodeId, Node>;
pub type SnapshotMeta = openraft::SnapshotMeta<NodeId, Node>;
pub type Snapshot = openraft::Snapshot<TypeConfig>;
pub type StorageError = openraft::StorageError<NodeId>;
pub type RaftMetrics = openraft::RaftMetrics<NodeId, Node>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::{Caller, Command};
    use crate::raft::codec;

    /// The layout entries would have with `commands` a `Vec`.
    #[derive(Serialize)]
    struct VecProposal {
        stamp_ms: u64,
        commands: Vec<Submission>,
    }

    #[test]
    fn shared_commands_are_stored_exactly_as_a_vec_was() {
        let commands = vec![
            Submission { caller: Caller::Cluster, command: Command::ExpireSessions { sessions: vec![3, 4] } },
            Submission {
                caller: Caller::Tenant { tenant: 3, secret: [7; 16] },
                command: Command::CloseSession {
                    request: crate::machine::RequestId { client_id: 7, sequence: 9 },
                    session: 3,
                },
            },
        ];
        let proposal = Proposal { stamp_ms: 1_700_000_000_000, commands: commands.clone().into() };
        let bytes = codec::encode(&proposal);
        assert_eq!(bytes, codec::encode(&VecProposal { stamp_ms: proposal.stamp_ms, commands }));
        assert_eq!(codec::decode::<Proposal>(&bytes).unwrap(), proposal);
    }
}
