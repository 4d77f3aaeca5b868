//! Which incarnation of a member each peer message comes from, and the checks that
//! keep a node whose data directory was wiped from counting as the member it was.
//!
//! Every Raft message and every answer carries its sender's node id and incarnation
//! (`MEMBER_HEADER`), and a message also carries what the sender's applied record says
//! of its recipient (`RECORD_HEADER`). The record is the log's (`machine::members`):
//!
//! - A node refuses a message from a member whose recorded incarnation is another:
//!   a wiped node's votes, appends and snapshots go nowhere.
//! - A node does not count an answer from a member whose recorded incarnation is
//!   another: a wiped node's granted votes and acknowledgements are not counted, so
//!   it cannot help elect a leader or commit an entry with the log it lost.
//! - A node that learns, from a record at least as new as its own log, that the
//!   cluster knows it as another incarnation stops (`EXIT_STALE_INCARNATION`) with a
//!   message that says how to bring it back. A record from a peer whose log is behind
//!   this node's may predate this node's own (re-)addition, and is not believed.
//!
//! Records are compared by the index of the entry that made them: a member removed
//! and added again is recorded anew by a later entry, and a node still applying the
//! log's older entries holds the older record for a while. A sender whose own record
//! of itself is later than the receiver's record of it is not refused (the receiver
//! is behind), and a node that holds a later record of itself does not stop. A wiped
//! node holds no record of itself, so it always loses the comparison.
//!
//! A member the log has not recorded yet (the first moments of a new cluster or of an
//! added node, or a cluster upgraded from a build without incarnations) is believed,
//! and the leader records it as soon as it hears from it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use leasehold_proto::errors::{error_metadata, error_reason, error_status};
use leasehold_proto::ErrorReason;
use tokio::sync::{watch, Notify};
use tonic::metadata::{Ascii, MetadataMap, MetadataValue};
use tonic::Status;

use crate::machine::ClusterRecord;
use crate::raft::types::{NodeId, Raft};
use crate::shell::clock::LogLimiter;
use crate::shell::fail_stop::Exit;

/// `<node>.<incarnation>.<index>` of the node that sent a message or an answer:
/// `index` is the entry that recorded this incarnation as the sender's own applied
/// record has it, 0 when that record does not hold it (yet).
pub const MEMBER_HEADER: &str = "leasehold-member";
/// `<node>.<incarnation>.<index>.<applied index>`: the recipient as the sender's
/// applied record has it (recorded by the entry at `index`), and how far the sender
/// had applied.
pub const RECORD_HEADER: &str = "leasehold-record";
/// The cluster's id (32 hex digits) once the sender's log recorded it.
pub const CLUSTER_ID_HEADER: &str = "leasehold-cluster-id";
/// The newest set of commands the sender's build can apply (`COMMAND_LEVEL`).
pub const COMMAND_LEVEL_HEADER: &str = "leasehold-command-level";
/// The highest command level the sender's applied log used: a node whose build is
/// below it cannot apply that log, and stops (`EXIT_BUILD_TOO_OLD`) instead of
/// failing on the first entry it cannot read.
pub const LOG_COMMAND_LEVEL_HEADER: &str = "leasehold-log-command-level";

pub use crate::machine::{
    COMMAND_LEVEL, COMMAND_LEVEL_CHECKPOINT, COMMAND_LEVEL_LOCK_DELAY, COMMAND_LEVEL_RECORD_MEMBER,
};

/// Who sent a Raft message, as far as believing what it says of the receiver goes.
///
/// A message's headers can stop its receiver: a record that knows the receiver as
/// another incarnation (exit 4), a log that used commands the receiver's build cannot
/// apply (exit 6). They are believed only from a member acting within Raft's rules
/// towards this node: the leader it would follow (the message's vote is at least the
/// receiver's), or a candidate it could vote for (its vote is at least the receiver's
/// and its log at least as long). From anyone else (a leader of an older term, a
/// candidate this node would refuse, a replayed or forged message) the claim is
/// refused and logged, and the receiver goes on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Authority {
    /// The leader this node would follow, or a candidate it could vote for.
    Current,
    /// Any other sender.
    Other,
}

/// The exit code of a node that found the cluster knows it as another incarnation.
pub const EXIT_STALE_INCARNATION: i32 = 4;
/// The exit code of a node whose build is older than what the cluster's log used.
pub const EXIT_BUILD_TOO_OLD: i32 = 6;

/// This node's incarnation and the applied record, shared by the network (answers it
/// receives), the peer service (messages it receives) and the recorder task.
pub struct Incarnations {
    node_id: NodeId,
    incarnation: u64,
    record: watch::Receiver<Arc<ClusterRecord>>,
    applied_index: watch::Receiver<u64>,
    /// The highest command level this node's applied log used.
    log_level: watch::Receiver<u32>,
    /// The command level of this node's build: `COMMAND_LEVEL`, or lower with
    /// --test-command-level.
    level: u32,
    /// Set once Raft is running: this node's last log index decides whether a peer's
    /// record may be newer than what this node knows.
    raft: OnceLock<Raft>,
    /// Members heard from whose incarnation the record does not hold yet.
    heard: Mutex<BTreeMap<NodeId, u64>>,
    /// How many times each node was forgotten (`forget`): an answer to a message
    /// sent before may come from the incarnation the operator replaced.
    forgotten: Mutex<BTreeMap<NodeId, u64>>,
    /// Wakes the recorder when `heard` gains a member.
    pub heard_changed: Notify,
    /// The command level of each peer's last message or answer (see `COMMAND_LEVEL`):
    /// a build without `MEMBER_HEADER` does not know `Command::RecordMember` either, and
    /// would fail on the entry. The leader records nothing until every member speaks it
    /// (a rolling upgrade from such a build records the members once the last node runs
    /// this one), and proposes no checkpoint until every member is at level 2.
    speaks: Mutex<BTreeMap<NodeId, u32>>,
    refusals: LogLimiter,
    /// False only with --test-accept-any-incarnation: nothing is refused or stopped.
    checked: bool,
    /// Started with --new-incarnation: until the log records this incarnation, a
    /// peer's record of another one is the learner this node replaces, and does not
    /// stop it (its messages are refused meanwhile; `member add` records it).
    joining: bool,
    /// True only with --test-believe-latest-incarnation (a planted bug): before the
    /// record, the latest incarnation heard of a member is believed, not the first,
    /// and a peer is not told which one was heard first.
    believe_latest: bool,
    /// Set once this node is stopping: it refused a log it cannot apply, or learned
    /// that the cluster knows it as another incarnation.
    stopping: std::sync::atomic::AtomicBool,
    /// How this node stops (exit codes 4 and 6).
    exit: Exit,
}

impl Incarnations {
    pub fn new(
        node_id: NodeId,
        incarnation: u64,
        record: watch::Receiver<Arc<ClusterRecord>>,
        applied_index: watch::Receiver<u64>,
        log_level: watch::Receiver<u32>,
        exit: Exit,
    ) -> Arc<Incarnations> {
        Arc::new(Incarnations {
            node_id,
            incarnation,
            record,
            applied_index,
            log_level,
            level: COMMAND_LEVEL,
            raft: OnceLock::new(),
            heard: Mutex::new(BTreeMap::new()),
            forgotten: Mutex::new(BTreeMap::new()),
            heard_changed: Notify::new(),
            speaks: Mutex::new(BTreeMap::new()),
            refusals: LogLimiter::new(Duration::from_secs(1)),
            checked: true,
            believe_latest: false,
            joining: false,
            stopping: std::sync::atomic::AtomicBool::new(false),
            exit,
        })
    }

    /// The same, checking nothing (--test-accept-any-incarnation): the control that
    /// shows what the checks prevent.
    pub fn unchecked(self: Arc<Incarnations>) -> Arc<Incarnations> {
        let mut incarnations = Arc::into_inner(self).expect("not shared yet");
        incarnations.checked = false;
        Arc::new(incarnations)
    }

    /// The same, for a node started with --new-incarnation (see `joining`).
    pub fn joining(self: Arc<Incarnations>) -> Arc<Incarnations> {
        let mut incarnations = Arc::into_inner(self).expect("not shared yet");
        incarnations.joining = true;
        Arc::new(incarnations)
    }

    /// The same, believing the latest incarnation heard of an unrecorded member
    /// (--test-believe-latest-incarnation): the window the first-heard rule closes,
    /// reopened for the simulator's control.
    pub fn believing_latest(self: Arc<Incarnations>) -> Arc<Incarnations> {
        let mut incarnations = Arc::into_inner(self).expect("not shared yet");
        incarnations.believe_latest = true;
        Arc::new(incarnations)
    }

    /// The same, speaking for a build at command `level` (--test-command-level): what
    /// an older build does, for the tests of the refusal.
    pub fn at_level(self: Arc<Incarnations>, level: u32) -> Arc<Incarnations> {
        let mut incarnations = Arc::into_inner(self).expect("not shared yet");
        incarnations.level = level;
        Arc::new(incarnations)
    }

    pub fn level(&self) -> u32 {
        self.level
    }

    pub fn set_raft(&self, raft: Raft) {
        let _ = self.raft.set(raft);
    }

    pub fn incarnation(&self) -> u64 {
        self.incarnation
    }

    pub fn record(&self) -> Arc<ClusterRecord> {
        self.record.borrow().clone()
    }

    pub fn record_changes(&self) -> watch::Receiver<Arc<ClusterRecord>> {
        self.record.clone()
    }

    fn last_log_index(&self) -> u64 {
        self.raft.get().and_then(|raft| raft.metrics().borrow().last_log_index).unwrap_or(0)
    }

    /// The index of the entry that recorded this node's incarnation, as this node's
    /// applied record has it; 0 when it holds none, or another incarnation's.
    fn own_record_index(&self, record: &ClusterRecord) -> u64 {
        match record.recorded(self.node_id) {
            Some(recorded) if recorded.incarnation == self.incarnation => recorded.index,
            _ => 0,
        }
    }

    fn member_header(&self, record: &ClusterRecord) -> MetadataValue<Ascii> {
        header(format!("{}.{}.{}", self.node_id, self.incarnation, self.own_record_index(record)))
    }

    /// The headers of a Raft message to `target`.
    pub fn stamp_request(&self, target: NodeId, metadata: &mut MetadataMap) {
        let record = self.record.borrow();
        metadata.insert(MEMBER_HEADER, self.member_header(&record));
        metadata.insert(COMMAND_LEVEL_HEADER, MetadataValue::from(self.level));
        metadata.insert(LOG_COMMAND_LEVEL_HEADER, MetadataValue::from(*self.log_level.borrow()));
        if let Some(cluster_id) = record.cluster_id {
            metadata.insert(CLUSTER_ID_HEADER, header(format!("{cluster_id:032x}")));
        }
        let applied = *self.applied_index.borrow();
        if let Some(recorded) = record.recorded(target) {
            metadata.insert(
                RECORD_HEADER,
                header(format!("{target}.{}.{}.{applied}", recorded.incarnation, recorded.index)),
            );
        } else if let Some(first) = self.first_heard(target).filter(|_| !self.believe_latest) {
            // Not recorded yet: what this node heard first, as a record of index 0, so
            // that a target wiped since stops as it would once recorded.
            metadata.insert(RECORD_HEADER, header(format!("{target}.{first}.0.{applied}")));
        }
    }

    /// The header of an answer to a Raft message.
    pub fn stamp_answer(&self, metadata: &mut MetadataMap) {
        let record = self.record.borrow();
        metadata.insert(MEMBER_HEADER, self.member_header(&record));
        metadata.insert(COMMAND_LEVEL_HEADER, MetadataValue::from(self.level));
    }

    /// Checks a Raft message from `sender` (the node it says it comes from, which the
    /// peer's certificate was checked against, and which is a member): the sender's
    /// cluster id, what it says of this node (which may stop this node, if it comes
    /// from the leader: see `Authority`), and the sender's incarnation.
    ///
    /// Every message of a build that knows incarnations carries `MEMBER_HEADER`, and
    /// once a cluster id is recorded, `CLUSTER_ID_HEADER`: a message without them is
    /// refused, not let through unchecked. `RECORD_HEADER` is sent only when the
    /// sender's record holds this node, so its absence tells nothing.
    pub fn check_request(
        &self,
        metadata: &MetadataMap,
        rpc: &str,
        sender: NodeId,
        authority: Authority,
    ) -> Result<(), Status> {
        let Some((node, incarnation, their_index)) = text(metadata, MEMBER_HEADER).and_then(parse_member) else {
            return Err(self.refuse_unsaid(rpc, sender, MEMBER_HEADER));
        };
        if node != sender {
            return Err(error_status(
                ErrorReason::WrongPeer,
                format!("{rpc} refused: it comes from node {sender}, but its {MEMBER_HEADER} header names node {node}"),
                &[],
            ));
        }
        let log_level = number_header(metadata, LOG_COMMAND_LEVEL_HEADER).unwrap_or(0);
        if log_level > self.level {
            return Err(match authority {
                Authority::Current => self.refuse_too_old(sender, log_level, rpc),
                Authority::Other => self.refuse_unbelieved(
                    rpc,
                    sender,
                    ErrorReason::BuildTooOld,
                    format!("it says its log used command level {log_level}, above this build's {}", self.level),
                ),
            });
        }
        let record = self.record();
        if !self.checked {
            self.note_speaker(sender, metadata);
            let _ = self.heard(node, incarnation);
            return Ok(());
        }
        if let Some(ours) = record.cluster_id {
            let Some(theirs) = text(metadata, CLUSTER_ID_HEADER) else {
                // A member without the cluster's id: its data directory is new. If it
                // is another incarnation than the one recorded (or heard first), it was
                // wiped, and is told so, which stops it; a bootstrapping member wiped
                // in the first moments would otherwise campaign, refused, for ever.
                self.check_sender_incarnation(rpc, node, incarnation, their_index, &record)?;
                return Err(self.refuse_unsaid(rpc, sender, CLUSTER_ID_HEADER));
            };
            if u128::from_str_radix(theirs, 16).ok() != Some(ours) {
                return Err(error_status(
                    ErrorReason::WrongCluster,
                    format!("{rpc} refused: this node belongs to the cluster with id {ours:032x}, not {theirs}"),
                    &[],
                ));
            }
        }
        if let Some((about, recorded, index, applied)) = text(metadata, RECORD_HEADER).and_then(parse_record) {
            if about == self.node_id && recorded != self.incarnation {
                if authority == Authority::Current {
                    self.learned_recorded(&record, recorded, index, applied, "a peer's message");
                }
                return Err(error_status(
                    ErrorReason::StaleIncarnation,
                    format!(
                        "{rpc} refused: the sender knows this node as incarnation {recorded}, but it is incarnation {}",
                        self.incarnation
                    ),
                    &[],
                ));
            }
        }
        self.check_sender_incarnation(rpc, node, incarnation, their_index, &record)?;
        // Only a message taken says which build its sender runs.
        self.note_speaker(sender, metadata);
        Ok(())
    }

    /// Refuses a message from another incarnation of `node` than the recorded one (or,
    /// before the record, the one heard first).
    fn check_sender_incarnation(
        &self,
        rpc: &str,
        node: NodeId,
        incarnation: u64,
        their_index: u64,
        record: &ClusterRecord,
    ) -> Result<(), Status> {
        match record.recorded(node) {
            Some(recorded) if recorded.incarnation != incarnation && their_index <= recorded.index => {
                Err(self.refuse_stale_sender(rpc, node, incarnation, recorded.incarnation, recorded.index))
            }
            Some(_) => Ok(()),
            None => self
                .heard(node, incarnation)
                .map_err(|first| self.refuse_stale_sender(rpc, node, incarnation, first, 0)),
        }
    }

    /// The refusal of a message from incarnation `incarnation` of `node`, which the log
    /// recorded as `known` by the entry at `known_index`, or (index 0) which this node
    /// heard first as `known`, before the record. Its metadata is what the sender
    /// needs to decide whether it is the stale one (`on_refusal`).
    fn refuse_stale_sender(&self, rpc: &str, node: NodeId, incarnation: u64, known: u64, known_index: u64) -> Status {
        let how = if known_index == 0 { "heard first, before the log recorded it," } else { "recorded" };
        if self.refusals.allow() {
            tracing::warn!(
                target: "audit",
                rpc,
                node,
                incarnation,
                known,
                known_index,
                "refused a Raft message from a member whose data directory is not the one {how}"
            );
        }
        let applied = *self.applied_index.borrow();
        error_status(
            ErrorReason::StaleIncarnation,
            format!(
                "{rpc} refused: node {node} is {how} as incarnation {known}, and this message comes from incarnation \
                 {incarnation}: its data directory was wiped or replaced"
            ),
            &[
                ("node", node.to_string()),
                ("recorded_incarnation", known.to_string()),
                ("recorded_index", known_index.to_string()),
                ("incarnation", incarnation.to_string()),
                ("applied_index", applied.to_string()),
            ],
        )
    }

    /// Checks the answer `target` gave: an answer from another incarnation than the
    /// recorded one is not counted (the caller treats it as unreachable).
    pub fn check_answer(&self, target: NodeId, metadata: &MetadataMap) -> Result<(), String> {
        self.note_speaker(target, metadata);
        let Some((node, incarnation, their_index)) = text(metadata, MEMBER_HEADER).and_then(parse_member) else {
            return Ok(());
        };
        if node != target {
            return Err(format!("node {target}'s address answered as node {node}"));
        }
        let recorded = self.record.borrow().recorded(node);
        match recorded {
            Some(recorded) if recorded.incarnation != incarnation && their_index <= recorded.index && self.checked => {
                Err(format!(
                    "node {node} answered as incarnation {incarnation}, but the cluster recorded incarnation {}: its \
                     data directory was wiped or replaced, so its answer is not counted",
                    recorded.incarnation
                ))
            }
            Some(_) => Ok(()),
            None => self.heard(node, incarnation).map_err(|first| {
                format!(
                    "node {node} answered as incarnation {incarnation}, but it was heard as incarnation {first} before \
                     the log recorded it: its data directory was wiped or replaced, so its answer is not counted"
                )
            }),
        }
    }

    /// A peer refused this node's message: if for this node's incarnation, and the
    /// peer's record is at least as new as this node's, this node stops.
    pub fn on_refusal(&self, status: &Status) {
        if error_reason(status) == Some(ErrorReason::BuildTooOld) && self.refusals.allow() {
            tracing::warn!(refusal = status.message(), "a member runs a build too old for this log");
        }
        if !self.checked || error_reason(status) != Some(ErrorReason::StaleIncarnation) {
            return;
        }
        let number = |key: &str| error_metadata(status, key).and_then(|value| value.parse::<u64>().ok());
        if let (Some(node), Some(recorded), Some(index), Some(applied)) =
            (number("node"), number("recorded_incarnation"), number("recorded_index"), number("applied_index"))
        {
            if node == self.node_id {
                self.learned_recorded(&self.record(), recorded, index, applied, "a peer's refusal");
            }
        }
    }

    /// A peer's record (made by the entry at `index`, as of its applied index
    /// `peer_applied`) knows this node as incarnation `recorded`. This node stops
    /// unless it holds a later record of itself, or the peer's log is behind its own.
    fn learned_recorded(&self, record: &ClusterRecord, recorded: u64, index: u64, peer_applied: u64, source: &str) {
        let own_index = self.own_record_index(record);
        let last_log = self.last_log_index();
        if own_index <= index && peer_applied >= last_log {
            if self.joining && own_index == 0 {
                // A learner left by a refused add, of an incarnation this one replaces:
                // the operator's `member add` takes it out and records this one.
                if self.refusals.allow() {
                    tracing::warn!(
                        recorded,
                        incarnation = self.incarnation,
                        source,
                        "the cluster records this node as another incarnation (a learner this new incarnation \
                         replaces): waiting for `leasehold member add` to record this one; if the node is still a \
                         voter, `leasehold member remove` it first"
                    );
                }
                return;
            }
            self.stop_stale(recorded, source);
            return;
        }
        if self.refusals.allow() {
            tracing::warn!(
                recorded,
                incarnation = self.incarnation,
                own_index,
                index,
                peer_applied,
                last_log,
                "a peer whose record or log is behind this node's knows it as another incarnation; not believed"
            );
        }
    }

    fn note_speaker(&self, node: NodeId, metadata: &MetadataMap) {
        let level = command_level(metadata);
        let mut speakers = self.speaks.lock().unwrap();
        let before = speakers.insert(node, level);
        if before.is_none_or(|before| level > before) {
            drop(speakers);
            self.heard_changed.notify_one();
        }
    }

    /// Notes a member heard from whose incarnation the record does not hold. The
    /// first incarnation heard is the one to record: another one heard later (until
    /// an operator adds the node again, see `forget`) is a data directory wiped in
    /// the moments before the record was made, and is refused with the first one's
    /// incarnation (`Err`), as a recorded one would be.
    fn heard(&self, node: NodeId, incarnation: u64) -> Result<(), u64> {
        let mut heard = self.heard.lock().unwrap();
        match heard.get(&node) {
            Some(first) if *first == incarnation => Ok(()),
            Some(first) if self.checked && !self.believe_latest => Err(*first),
            _ => {
                heard.insert(node, incarnation);
                drop(heard);
                self.heard_changed.notify_one();
                Ok(())
            }
        }
    }

    /// The incarnation first heard of `node`, which the log does not record yet.
    fn first_heard(&self, node: NodeId) -> Option<u64> {
        self.heard.lock().unwrap().get(&node).copied()
    }

    /// Forgets what was heard of `node`: it is being added (again) by an operator, and
    /// the incarnation to record is the one that answers now.
    pub fn forget(&self, node: NodeId) {
        *self.forgotten.lock().unwrap().entry(node).or_default() += 1;
        self.heard.lock().unwrap().remove(&node);
        self.speaks.lock().unwrap().remove(&node);
    }

    /// How many times `node` was forgotten so far. The network reads it before it
    /// sends a message and again when the answer comes: an answer to a message sent
    /// before `member add` forgot the node may come from the incarnation it replaced
    /// (a late packet of a process that died), and is not heard (`answered_since`).
    pub fn forgotten(&self, node: NodeId) -> u64 {
        self.forgotten.lock().unwrap().get(&node).copied().unwrap_or(0)
    }

    /// Whether an answer from `node` to a message sent when `forgotten(node)` was
    /// `before` may be heard: the node was not forgotten since.
    pub fn answered_since(&self, node: NodeId, before: u64) -> bool {
        self.forgotten(node) == before
    }

    /// Forgets what was heard of nodes that are not among `members`: an answer that
    /// arrived after a node's removal was applied would otherwise be recorded (and
    /// its build level believed) when a node of that id is added again.
    pub fn prune(&self, members: &[NodeId]) {
        self.heard.lock().unwrap().retain(|node, _| members.contains(node));
        self.speaks.lock().unwrap().retain(|node, _| *node == self.node_id || members.contains(node));
    }

    /// The members (of `members`) whose incarnation the leader should record: heard
    /// from, or this node itself, and not in the record yet. None while a member was
    /// heard from a build that does not speak incarnations (it cannot apply the
    /// record). A member not heard at all does not hold the others back: a new cluster
    /// with one member down records the others at once.
    pub fn to_record(&self, members: &[NodeId]) -> Vec<(NodeId, u64)> {
        if self.heard_below(COMMAND_LEVEL_RECORD_MEMBER, members) {
            return Vec::new();
        }
        let record = self.record();
        let mut heard = self.heard.lock().unwrap();
        heard.retain(|node, _| record.incarnation(*node).is_none());
        let mut unrecorded: Vec<(NodeId, u64)> = heard
            .iter()
            .filter(|(node, _)| members.contains(node))
            .map(|(node, incarnation)| (*node, *incarnation))
            .collect();
        if members.contains(&self.node_id) && record.incarnation(self.node_id).is_none() {
            unrecorded.push((self.node_id, self.incarnation));
        }
        unrecorded
    }
}

impl Incarnations {
    /// Whether the leader may let clients' commands into the log: every member it
    /// heard from (and itself) is recorded. Until then an acknowledgement could come
    /// from a member whose data directory is wiped the next moment and taken back by a
    /// later leader that never heard the first incarnation; with nothing of a client's
    /// in the log, such a wipe loses nothing anyone was told about. When a member runs
    /// a build that cannot apply the record, nothing is recorded, and clients are not
    /// held back (as before incarnations existed).
    pub fn clients_may_commit(&self, members: &[NodeId]) -> bool {
        self.heard_below(COMMAND_LEVEL_RECORD_MEMBER, members) || self.to_record(members).is_empty()
    }

    /// Whether one of `members` other than this node was last heard below `level`.
    fn heard_below(&self, level: u32, members: &[NodeId]) -> bool {
        if members.contains(&self.node_id) && self.level < level {
            return true;
        }
        let speakers = self.speaks.lock().unwrap();
        members.iter().any(|member| *member != self.node_id && speakers.get(member).is_some_and(|heard| *heard < level))
    }

    /// Whether every one of `members` other than this node was last heard at command
    /// `level` or above: only then may the leader propose a command of that level.
    /// A member other than this node not heard at `level` or above, if any.
    pub fn member_below(&self, level: u32, members: &[NodeId]) -> Option<NodeId> {
        members.iter().copied().find(|member| !self.member_at(level, *member))
    }

    pub fn every_member_at(&self, level: u32, members: &[NodeId]) -> bool {
        members.iter().all(|member| self.member_at(level, *member))
    }

    fn member_at(&self, level: u32, member: NodeId) -> bool {
        if member == self.node_id {
            return self.level >= level;
        }
        self.speaks.lock().unwrap().get(&member).is_some_and(|heard| *heard >= level)
    }
}

/// The command level a message or answer says its sender's build has (see
/// `COMMAND_LEVEL`).
fn command_level(metadata: &MetadataMap) -> u32 {
    if metadata.get(MEMBER_HEADER).is_none() {
        return 0;
    }
    number_header(metadata, COMMAND_LEVEL_HEADER).unwrap_or(COMMAND_LEVEL_RECORD_MEMBER)
}

fn number_header(metadata: &MetadataMap, key: &str) -> Option<u32> {
    text(metadata, key).and_then(|value| value.parse().ok())
}

/// What a node whose build is at command `level` says when its log, or a peer's,
/// used `log_level`: it cannot apply that log, so it stops.
pub fn too_old_message(log_level: u32, level: u32, whose: &str) -> String {
    format!(
        "{whose} already uses command level {log_level}, and this build of leasehold-server ({}) knows command \
         levels up to {level}: it cannot apply that log. Upgrade this node to a build at least as new as the rest \
         of the cluster and start it again on the same data directory, which is as it was (README, \"Upgrading\")",
        env!("CARGO_PKG_VERSION")
    )
}

impl Incarnations {
    /// A message without a header every current build sends: refused and logged.
    fn refuse_unsaid(&self, rpc: &str, sender: NodeId, header: &str) -> Status {
        if self.refusals.allow() {
            tracing::warn!(target: "audit", rpc, sender, header, "refused a Raft message without a required header");
        }
        error_status(ErrorReason::WrongPeer, format!("{rpc} refused: a Raft message without the {header} header"), &[])
    }

    /// A claim about this node from a sender that is neither the leader it follows nor
    /// a candidate it could vote for:
    /// refused and logged, and this node goes on (see `Authority`).
    fn refuse_unbelieved(&self, rpc: &str, sender: NodeId, reason: ErrorReason, claim: String) -> Status {
        if self.refusals.allow() {
            tracing::warn!(
                target: "audit",
                rpc,
                sender,
                %claim,
                "refused a Raft message whose claim about this node comes from a member that is neither its leader nor \
                 a candidate it could vote for"
            );
        }
        error_status(
            reason,
            format!("{rpc} refused: {claim}, but node {sender} is neither this node's leader nor a candidate it could vote for"),
            &[],
        )
    }

    /// A peer's log used commands this build cannot apply: the message is refused
    /// with `BUILD_TOO_OLD`, and the process stops once the refusal had a moment to
    /// reach the sender (whose log then says which node is too old).
    fn refuse_too_old(&self, sender: NodeId, log_level: u32, rpc: &str) -> Status {
        let message = too_old_message(log_level, self.level, &format!("the log of node {sender} ({rpc})"));
        if !self.stopping.swap(true, std::sync::atomic::Ordering::SeqCst) {
            tracing::error!(sender, log_level, level = self.level, "build too old for the cluster's log: stopping");
            self.exit.stop_after(
                Duration::from_millis(200),
                EXIT_BUILD_TOO_OLD,
                format!("{message} (exit code {EXIT_BUILD_TOO_OLD})"),
            );
        }
        error_status(
            ErrorReason::BuildTooOld,
            format!("{rpc} refused by node {}: {message}", self.node_id),
            &[("log_command_level", log_level.to_string()), ("command_level", self.level.to_string())],
        )
    }
}

impl Incarnations {
    /// Stops the node: the cluster knows it as incarnation `recorded`.
    fn stop_stale(&self, recorded: u64, source: &str) {
        let (node, incarnation) = (self.node_id, self.incarnation);
        if self.stopping.swap(true, std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        let message = format!(
            "the cluster knows node {node} as incarnation {recorded} ({source} says so), but this data directory is \
             incarnation {incarnation}: the node's data was wiped or replaced, and it stops so that it never votes or \
             acknowledges with a log it does not have. To bring it back: `leasehold member remove {node}`, empty its \
             data directory, start it with --new-incarnation, then `leasehold member add {node} CLIENT_ADDR PEER_ADDR` \
             (README, \"Replacing a node\")"
        );
        tracing::error!(node, incarnation, recorded, source, "stale incarnation: stopping the node");
        self.exit.stop(EXIT_STALE_INCARNATION, &message);
    }
}

fn header(value: String) -> MetadataValue<Ascii> {
    MetadataValue::try_from(value).expect("digits, hex digits and dots")
}

fn text<'a>(metadata: &'a MetadataMap, key: &str) -> Option<&'a str> {
    metadata.get(key).and_then(|value| value.to_str().ok())
}

/// Dot-separated numbers, exactly `N` of them.
fn numbers<const N: usize>(text: &str) -> Option<[u64; N]> {
    let mut numbers = [0; N];
    let mut parts = text.split('.');
    for number in &mut numbers {
        *number = parts.next()?.parse().ok()?;
    }
    parts.next().is_none().then_some(numbers)
}

fn parse_member(text: &str) -> Option<(NodeId, u64, u64)> {
    numbers::<3>(text).map(|[node, incarnation, index]| (node, incarnation, index))
}

fn parse_record(text: &str) -> Option<(NodeId, u64, u64, u64)> {
    numbers::<4>(text).map(|[node, incarnation, index, applied]| (node, incarnation, index, applied))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::Recorded;

    /// Node 1, incarnation 11, recorded (as its own record says) by entry 5, applied
    /// up to 40.
    fn incarnations(record: ClusterRecord) -> Arc<Incarnations> {
        let (_, record) = watch::channel(Arc::new(record));
        let (_, applied) = watch::channel(40);
        Incarnations::new(1, 11, record, applied, watch::channel(COMMAND_LEVEL).1, Exit::Process)
    }

    /// The headers of a message from `node` of the cluster with id 7.
    fn member(node: NodeId, incarnation: u64, index: u64) -> MetadataMap {
        let mut metadata = MetadataMap::new();
        metadata.insert(MEMBER_HEADER, header(format!("{node}.{incarnation}.{index}")));
        metadata.insert(CLUSTER_ID_HEADER, header(format!("{:032x}", 7)));
        metadata
    }

    /// (node, incarnation, recorded by entry).
    fn recorded(members: &[(NodeId, u64, u64)]) -> ClusterRecord {
        ClusterRecord {
            cluster_id: Some(7),
            incarnations: members
                .iter()
                .map(|(node, incarnation, index)| (*node, Recorded { incarnation: *incarnation, index: *index }))
                .collect(),
        }
    }

    #[test]
    fn another_incarnation_of_a_recorded_member_is_refused_and_not_counted() {
        let checks = incarnations(recorded(&[(1, 11, 5), (2, 22, 6)]));
        assert!(checks.check_request(&member(2, 22, 6), "Vote", 2, Authority::Other).is_ok());
        // A wiped node holds no record of itself: index 0.
        let refused = checks.check_request(&member(2, 23, 0), "Vote", 2, Authority::Other).unwrap_err();
        assert_eq!(error_reason(&refused), Some(ErrorReason::StaleIncarnation));
        assert_eq!(error_metadata(&refused, "recorded_incarnation").as_deref(), Some("22"));
        assert_eq!(error_metadata(&refused, "recorded_index").as_deref(), Some("6"));
        assert_eq!(error_metadata(&refused, "applied_index").as_deref(), Some("40"));
        assert!(checks.check_answer(2, &member(2, 22, 6)).is_ok());
        let not_counted = checks.check_answer(2, &member(2, 23, 0)).unwrap_err();
        assert!(not_counted.contains("not counted"), "{not_counted}");
        assert!(checks.check_answer(2, &member(2, 23, 6)).is_err(), "a record as old is no better");
        assert!(checks.check_answer(2, &member(3, 22, 6)).is_err(), "another node on the address");
        assert!(checks.check_answer(2, &MetadataMap::new()).is_ok(), "a build without incarnations");
    }

    #[test]
    fn a_member_recorded_again_later_is_believed_by_a_node_still_behind() {
        // This node applied only the old record of node 2; node 2 was removed and
        // added again, and recorded anew by entry 30.
        let checks = incarnations(recorded(&[(1, 11, 5), (2, 22, 6)]));
        assert!(checks.check_request(&member(2, 23, 30), "AppendEntries", 2, Authority::Current).is_ok());
        assert!(checks.check_answer(2, &member(2, 23, 30)).is_ok());
    }

    #[test]
    fn an_unrecorded_member_is_believed_and_queued_for_the_record() {
        let checks = incarnations(recorded(&[(1, 11, 5)]));
        assert!(checks.check_answer(3, &member(3, 33, 0)).is_ok());
        assert!(checks.check_request(&member(4, 44, 0), "AppendEntries", 4, Authority::Current).is_ok());
        assert_eq!(checks.to_record(&[1, 3]), vec![(3, 33)], "a non-member is not recorded");
        let fresh = incarnations(ClusterRecord::default());
        assert!(fresh.check_answer(2, &member(2, 22, 0)).is_ok());
        assert_eq!(fresh.to_record(&[1, 2]), vec![(2, 22), (1, 11)], "the leader records itself too");
    }

    #[test]
    fn nothing_is_recorded_while_a_member_runs_a_build_without_incarnations() {
        let checks = incarnations(ClusterRecord::default());
        assert!(checks.check_answer(2, &member(2, 22, 0)).is_ok());
        assert_eq!(checks.to_record(&[1, 2, 3]), vec![(2, 22), (1, 11)], "node 3, not heard yet, holds nobody back");
        assert!(!checks.clients_may_commit(&[1, 2, 3]), "clients wait for the record");
        assert!(checks.check_answer(3, &MetadataMap::new()).is_ok(), "an older build answers");
        assert!(checks.clients_may_commit(&[1, 2, 3]), "nothing can be recorded: clients are not held back");
        assert!(checks.to_record(&[1, 2, 3]).is_empty(), "node 3 cannot apply a record");
        assert!(checks.check_answer(3, &member(3, 33, 0)).is_ok(), "node 3 was upgraded");
        assert_eq!(checks.to_record(&[1, 2, 3]), vec![(2, 22), (3, 33), (1, 11)]);
    }

    #[test]
    fn another_cluster_id_or_another_node_is_refused() {
        let checks = incarnations(recorded(&[]));
        let mut metadata = member(2, 22, 0);
        metadata.insert(CLUSTER_ID_HEADER, header(format!("{:032x}", 8)));
        let refused = checks.check_request(&metadata, "Vote", 2, Authority::Other).unwrap_err();
        assert_eq!(error_reason(&refused), Some(ErrorReason::WrongCluster));
        metadata.insert(CLUSTER_ID_HEADER, header(format!("{:032x}", 7)));
        assert!(checks.check_request(&metadata, "Vote", 2, Authority::Other).is_ok());
        let lying = checks.check_request(&metadata, "Vote", 3, Authority::Other).unwrap_err();
        assert_eq!(error_reason(&lying), Some(ErrorReason::WrongPeer), "the header names another node");
    }

    #[test]
    fn a_record_of_this_node_from_a_node_behind_it_is_not_believed() {
        // This node (1, incarnation 11) was recorded by entry 5. A peer whose record
        // says incarnation 10 from entry 3 is behind: refused, and this node goes on.
        let checks = incarnations(recorded(&[(1, 11, 5)]));
        let mut metadata = member(2, 22, 0);
        metadata.insert(RECORD_HEADER, header("1.10.3.90".to_string()));
        let refused = checks.check_request(&metadata, "AppendEntries", 2, Authority::Current).unwrap_err();
        assert_eq!(error_reason(&refused), Some(ErrorReason::StaleIncarnation));
    }

    #[test]
    fn a_member_wiped_before_it_was_recorded_is_refused_until_added_again() {
        let checks = incarnations(recorded(&[(1, 11, 5)]));
        assert!(checks.check_answer(3, &member(3, 33, 0)).is_ok(), "first heard as 33");
        let not_counted = checks.check_answer(3, &member(3, 34, 0)).unwrap_err();
        assert!(not_counted.contains("heard as incarnation 33"), "{not_counted}");
        let refused = checks.check_request(&member(3, 34, 0), "Vote", 3, Authority::Other).unwrap_err();
        assert_eq!(error_reason(&refused), Some(ErrorReason::StaleIncarnation));
        assert_eq!(error_metadata(&refused, "recorded_incarnation").as_deref(), Some("33"));
        assert_eq!(checks.to_record(&[1, 3]), vec![(3, 33)], "the first incarnation is the one recorded");
        let mut to_wiped = MetadataMap::new();
        checks.stamp_request(3, &mut to_wiped);
        assert_eq!(text(&to_wiped, RECORD_HEADER), Some("3.33.0.40"), "a wiped node learns it, and stops");
        checks.forget(3);
        assert!(checks.check_answer(3, &member(3, 34, 0)).is_ok(), "the operator added it again");
        checks.prune(&[1]);
        assert!(checks.to_record(&[1, 3]).is_empty(), "a node no longer a member is forgotten");
    }

    #[test]
    fn a_message_without_the_member_or_cluster_id_header_is_refused() {
        let checks = incarnations(recorded(&[(1, 11, 5), (2, 22, 6)]));
        let refused = checks.check_request(&MetadataMap::new(), "AppendEntries", 2, Authority::Current).unwrap_err();
        assert_eq!(error_reason(&refused), Some(ErrorReason::WrongPeer));
        assert!(refused.message().contains(MEMBER_HEADER), "{}", refused.message());
        let mut no_cluster_id = member(2, 22, 6);
        no_cluster_id.remove(CLUSTER_ID_HEADER);
        let refused = checks.check_request(&no_cluster_id, "AppendEntries", 2, Authority::Current).unwrap_err();
        assert!(refused.message().contains(CLUSTER_ID_HEADER), "{}", refused.message());
        let unrecorded = incarnations(ClusterRecord::default());
        assert!(
            unrecorded.check_request(&no_cluster_id, "AppendEntries", 2, Authority::Current).is_ok(),
            "no cluster id recorded yet: none is asked for"
        );
    }

    /// From the leader, the same claim stops the node, once; under a simulator the
    /// code is reported and the message is refused.
    #[test]
    fn the_leaders_record_of_another_incarnation_stops_this_node_once() {
        let reported = Arc::new(Mutex::new(Vec::new()));
        let sink = reported.clone();
        let exit =
            Exit::Report(Arc::new(move |code, message: &str| sink.lock().unwrap().push((code, message.to_string()))));
        let (_, record) = watch::channel(Arc::new(recorded(&[(1, 11, 5), (2, 22, 6)])));
        let (_, applied) = watch::channel(40);
        let checks = Incarnations::new(1, 11, record, applied, watch::channel(COMMAND_LEVEL).1, exit);
        let mut other_incarnation = member(2, 22, 6);
        other_incarnation.insert(RECORD_HEADER, header("1.10.90.90".to_string()));
        for _ in 0..2 {
            let refused = checks.check_request(&other_incarnation, "AppendEntries", 2, Authority::Current).unwrap_err();
            assert_eq!(error_reason(&refused), Some(ErrorReason::StaleIncarnation));
        }
        let reported = reported.lock().unwrap();
        assert_eq!(reported.len(), 1, "{reported:?}");
        assert_eq!(reported[0].0, EXIT_STALE_INCARNATION);
        assert!(reported[0].1.contains("knows node 1 as incarnation 10"), "{}", reported[0].1);
    }

    /// A wiped member that bootstraps again campaigns without the cluster's id: it is
    /// told it is another incarnation (which stops it), not only that a header is
    /// missing; the recorded incarnation without the header is refused as before.
    #[test]
    fn a_wiped_member_without_the_cluster_id_is_told_it_is_stale() {
        let checks = incarnations(recorded(&[(1, 11, 5), (2, 22, 6)]));
        let mut wiped = member(2, 23, 0);
        wiped.remove(CLUSTER_ID_HEADER);
        let refused = checks.check_request(&wiped, "Vote", 2, Authority::Other).unwrap_err();
        assert_eq!(error_reason(&refused), Some(ErrorReason::StaleIncarnation), "{refused:?}");
        assert_eq!(error_metadata(&refused, "recorded_incarnation").as_deref(), Some("22"));
        let mut recorded_one = member(2, 22, 6);
        recorded_one.remove(CLUSTER_ID_HEADER);
        let refused = checks.check_request(&recorded_one, "Vote", 2, Authority::Other).unwrap_err();
        assert_eq!(error_reason(&refused), Some(ErrorReason::WrongPeer), "{refused:?}");
    }

    /// An answer to a message sent before `member add` forgot the node is not heard:
    /// it may be a late packet of the incarnation the add replaces.
    #[test]
    fn an_answer_to_a_message_from_before_a_re_add_is_not_heard() {
        let checks = incarnations(recorded(&[(1, 11, 5)]));
        let before = checks.forgotten(3);
        assert!(checks.answered_since(3, before));
        checks.forget(3);
        assert!(!checks.answered_since(3, before), "sent before the add forgot node 3");
        assert!(checks.answered_since(3, checks.forgotten(3)), "sent after");
        assert!(checks.answered_since(2, checks.forgotten(2)), "another node is not affected");
    }

    /// A node started with --new-incarnation, not recorded yet, is not stopped by the
    /// leader's record of the learner it replaces; the same claim stops a node that
    /// was not started to join.
    #[test]
    fn a_joining_incarnation_waits_for_its_add_instead_of_stopping() {
        let reported = Arc::new(Mutex::new(Vec::new()));
        let sink = reported.clone();
        let exit = Exit::Report(Arc::new(move |code, _: &str| sink.lock().unwrap().push(code)));
        let (_, record) = watch::channel(Arc::new(recorded(&[(2, 22, 6), (1, 10, 7)])));
        let (_, applied) = watch::channel(40);
        let joining =
            Incarnations::new(1, 11, record.clone(), applied.clone(), watch::channel(COMMAND_LEVEL).1, exit.clone())
                .joining();
        let mut learner_record = member(2, 22, 6);
        learner_record.insert(RECORD_HEADER, header("1.10.7.90".to_string()));
        let refused = joining.check_request(&learner_record, "AppendEntries", 2, Authority::Current).unwrap_err();
        assert_eq!(error_reason(&refused), Some(ErrorReason::StaleIncarnation));
        assert!(reported.lock().unwrap().is_empty(), "a joining incarnation does not stop");
        let wiped = Incarnations::new(1, 11, record, applied, watch::channel(COMMAND_LEVEL).1, exit);
        let _ = wiped.check_request(&learner_record, "AppendEntries", 2, Authority::Current);
        assert_eq!(*reported.lock().unwrap(), vec![EXIT_STALE_INCARNATION], "a wiped node without the flag stops");
    }

    #[test]
    fn claims_that_would_stop_this_node_are_refused_but_not_believed_from_a_non_leader() {
        // Each would stop the process if believed; the test goes on only if neither is.
        let checks = incarnations(recorded(&[(1, 11, 5), (2, 22, 6)]));
        let mut too_new = member(2, 22, 6);
        too_new.insert(LOG_COMMAND_LEVEL_HEADER, MetadataValue::from(999u32));
        let refused = checks.check_request(&too_new, "Vote", 2, Authority::Other).unwrap_err();
        assert_eq!(error_reason(&refused), Some(ErrorReason::BuildTooOld));
        assert!(!checks.stopping.load(std::sync::atomic::Ordering::SeqCst), "not stopping");
        let mut other_incarnation = member(2, 22, 6);
        other_incarnation.insert(RECORD_HEADER, header("1.10.90.90".to_string()));
        let refused = checks.check_request(&other_incarnation, "AppendEntries", 2, Authority::Other).unwrap_err();
        assert_eq!(error_reason(&refused), Some(ErrorReason::StaleIncarnation));
    }

    #[test]
    fn a_member_heard_below_a_level_holds_the_level_back() {
        let checks = incarnations(recorded(&[(1, 11, 5), (2, 22, 6), (3, 33, 7)]));
        let members = [1, 2, 3];
        assert_eq!(checks.member_below(COMMAND_LEVEL_LOCK_DELAY, &members), Some(2), "nobody heard yet");
        let mut current = member(2, 22, 6);
        current.insert(COMMAND_LEVEL_HEADER, MetadataValue::from(COMMAND_LEVEL));
        assert!(checks.check_answer(2, &current).is_ok());
        let mut older = member(3, 33, 7);
        older.insert(COMMAND_LEVEL_HEADER, MetadataValue::from(COMMAND_LEVEL_CHECKPOINT));
        assert!(checks.check_answer(3, &older).is_ok());
        assert_eq!(checks.member_below(COMMAND_LEVEL_LOCK_DELAY, &members), Some(3), "node 3 runs an older build");
        assert!(checks.every_member_at(COMMAND_LEVEL_CHECKPOINT, &members));
        assert!(!checks.every_member_at(COMMAND_LEVEL_LOCK_DELAY, &members));
        older.insert(COMMAND_LEVEL_HEADER, MetadataValue::from(COMMAND_LEVEL));
        assert!(checks.check_answer(3, &older).is_ok());
        assert_eq!(checks.member_below(COMMAND_LEVEL_LOCK_DELAY, &members), None, "node 3 was upgraded");
    }

    #[test]
    fn headers_parse_as_written() {
        let checks = incarnations(recorded(&[(1, 11, 5), (2, 22, 6)]));
        let mut metadata = MetadataMap::new();
        checks.stamp_request(2, &mut metadata);
        assert_eq!(text(&metadata, MEMBER_HEADER).and_then(parse_member), Some((1, 11, 5)));
        assert_eq!(text(&metadata, RECORD_HEADER).and_then(parse_record), Some((2, 22, 6, 40)));
        assert_eq!(text(&metadata, CLUSTER_ID_HEADER), Some("00000000000000000000000000000007"));
        let mut unrecorded = MetadataMap::new();
        checks.stamp_request(3, &mut unrecorded);
        assert!(unrecorded.get(RECORD_HEADER).is_none());
        let wiped = incarnations(recorded(&[(1, 10, 5)]));
        let mut answer = MetadataMap::new();
        wiped.stamp_answer(&mut answer);
        assert_eq!(text(&answer, MEMBER_HEADER), Some("1.11.0"), "no record of this incarnation: index 0");
        assert_eq!(parse_member("x.1.2"), None);
        assert_eq!(parse_member("1.2"), None);
        assert_eq!(parse_record("1.2.3.4.5"), None);
    }
}
