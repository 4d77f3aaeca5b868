//! Raft messages made by hand for the peer port's tests and the intruder: real
//! openraft requests of Leasehold's own types, encoded with the peer codec, sent with
//! whatever certificate and headers the attack needs.
//!
//! What a forged message must show is that the node refuses it for who sent it, not
//! that it happens to be malformed: so the messages are well formed, carry a term far
//! above the cluster's, and an entry that would rotate a tenant's token as the admin.

use std::time::Duration;

use leasehold::proto::{self as pb};
use leasehold_server::machine::{Caller, Command, RequestId, Submission, COMMAND_LEVEL};
use leasehold_server::raft::codec;
use leasehold_server::raft::types::{Entry, LogId, NodeId, Proposal, TypeConfig, Vote};
use leasehold_server::shell::credentials::secret_hash;
use openraft::raft::{AppendEntriesRequest, VoteRequest};
use openraft::{CommittedLeaderId, EntryPayload};
use tonic::metadata::MetadataValue;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

/// How long a forged message may take to be answered.
pub const PEER_CALL_TIMEOUT_MS: u64 = 3_000;
/// Added to the cluster's term by the forged messages: a term no election reaches.
pub const FORGED_TERM_AHEAD: u64 = 1_000;

/// The request headers every current build puts on a Raft message (see the server's
/// `raft::incarnations`).
pub const CLUSTER_HEADER: &str = "leasehold-cluster";
pub const CLUSTER_ID_HEADER: &str = "leasehold-cluster-id";
pub const MEMBER_HEADER: &str = "leasehold-member";
pub const RECORD_HEADER: &str = "leasehold-record";
pub const COMMAND_LEVEL_HEADER: &str = "leasehold-command-level";
pub const LOG_COMMAND_LEVEL_HEADER: &str = "leasehold-log-command-level";

/// A mutual-TLS channel to a peer port presenting `identity` (PEM certificate and key).
pub fn peer_channel(endpoint: &str, ca_pem: &[u8], identity: (&str, &str)) -> Channel {
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca_pem))
        .identity(Identity::from_pem(identity.0, identity.1));
    Endpoint::from_shared(format!("https://{endpoint}"))
        .expect("a peer address")
        .connect_timeout(Duration::from_millis(PEER_CALL_TIMEOUT_MS))
        .timeout(Duration::from_millis(PEER_CALL_TIMEOUT_MS))
        .tls_config(tls)
        .expect("a TLS configuration")
        .connect_lazy()
}

/// What a forged message says of its sender, beyond its certificate.
#[derive(Debug, Clone, Default)]
pub struct Headers {
    pub cluster_name: Option<String>,
    /// 32 hex digits.
    pub cluster_id: Option<String>,
    /// `<node>.<incarnation>.<index>`.
    pub member: Option<String>,
    /// `<node>.<incarnation>.<index>.<applied>`: what the sender says of the receiver.
    pub record: Option<String>,
    pub log_command_level: Option<u32>,
    /// The command level of the sender's build.
    pub command_level: Option<u32>,
}

impl Headers {
    /// Every header a current build sends, as node `sender` of the cluster `status`
    /// describes would (an incarnation nobody recorded).
    pub fn complete(status: &pb::StatusResponse, sender: NodeId) -> Headers {
        Headers {
            cluster_name: Some(status.cluster_name.clone()),
            cluster_id: (!status.cluster_id.is_empty()).then(|| status.cluster_id.clone()),
            member: Some(format!("{sender}.{}.0", 0x5eed_u64)),
            record: None,
            log_command_level: None,
            command_level: Some(COMMAND_LEVEL),
        }
    }

    /// `message` with these headers.
    pub fn on<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        request.set_timeout(Duration::from_millis(PEER_CALL_TIMEOUT_MS));
        let metadata = request.metadata_mut();
        let mut put = |key: &'static str, value: &str| {
            metadata.insert(key, MetadataValue::try_from(value).expect("an ASCII header value"));
        };
        if let Some(value) = &self.cluster_name {
            put(CLUSTER_HEADER, value);
        }
        if let Some(value) = &self.cluster_id {
            put(CLUSTER_ID_HEADER, value);
        }
        if let Some(value) = &self.member {
            put(MEMBER_HEADER, value);
        }
        if let Some(value) = &self.record {
            put(RECORD_HEADER, value);
        }
        if let Some(level) = self.log_command_level {
            put(LOG_COMMAND_LEVEL_HEADER, &level.to_string());
        }
        if let Some(level) = self.command_level {
            put(COMMAND_LEVEL_HEADER, &level.to_string());
        }
        request
    }
}

/// The last entry of the leader's log as `status` (the leader's) describes it: the
/// entry a forged append must follow to be taken.
pub fn leaders_last_log(status: &pb::StatusResponse) -> Option<LogId> {
    (status.last_log_index > 0)
        .then(|| LogId::new(CommittedLeaderId::new(status.term, status.leader_id), status.last_log_index))
}

/// An AppendEntries from `sender` at `term` holding one entry that rotates `tenant`'s
/// token to `token` with the admin as its caller; committed at once if taken.
pub fn admin_append(sender: NodeId, term: u64, prev: Option<LogId>, tenant: &str, token: &str) -> pb::RaftMessage {
    let index = prev.map(|log_id| log_id.index).unwrap_or(0) + 1;
    let log_id = LogId::new(CommittedLeaderId::new(term, sender), index);
    let command = Command::RotateTenantToken {
        request: RequestId { client_id: 0x5eed, sequence: 1 },
        name: tenant.to_string(),
        token_hash: secret_hash(token.as_bytes()),
    };
    let proposal = Proposal {
        stamp_ms: 0,
        commands: vec![Submission { caller: Caller::Admin { secret: [0; 16] }, command }].into(),
    };
    let entry = Entry { log_id, payload: EntryPayload::Normal(proposal) };
    let request: AppendEntriesRequest<TypeConfig> = AppendEntriesRequest {
        vote: Vote::new_committed(term, sender),
        prev_log_id: prev,
        entries: vec![entry],
        leader_commit: Some(log_id),
    };
    pb::RaftMessage { payload: codec::encode(&request) }
}

/// An empty AppendEntries (a heartbeat) from `sender` as the leader of `term`.
pub fn heartbeat(sender: NodeId, term: u64) -> pb::RaftMessage {
    let request: AppendEntriesRequest<TypeConfig> = AppendEntriesRequest {
        vote: Vote::new_committed(term, sender),
        prev_log_id: None,
        entries: Vec::new(),
        leader_commit: None,
    };
    pb::RaftMessage { payload: codec::encode(&request) }
}

/// A Vote request from `sender` as a candidate of `term` with an empty log.
pub fn vote(sender: NodeId, term: u64) -> pb::RaftMessage {
    let request: VoteRequest<NodeId> = VoteRequest::new(Vote::new(term, sender), None);
    pb::RaftMessage { payload: codec::encode(&request) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forged_messages_decode_as_the_server_reads_them() {
        let prev = LogId::new(CommittedLeaderId::new(3, 1), 40);
        let append: AppendEntriesRequest<TypeConfig> =
            codec::decode(&admin_append(9, 1_003, Some(prev), "test", "t0ken").payload).expect("decodes");
        assert_eq!(append.vote, Vote::new_committed(1_003, 9));
        assert_eq!(append.entries[0].log_id.index, 41);
        let heartbeat: AppendEntriesRequest<TypeConfig> = codec::decode(&heartbeat(9, 7).payload).expect("decodes");
        assert!(heartbeat.entries.is_empty());
        let vote: VoteRequest<NodeId> = codec::decode(&vote(9, 7).payload).expect("decodes");
        assert_eq!(vote.vote, Vote::new(7, 9));
    }
}
