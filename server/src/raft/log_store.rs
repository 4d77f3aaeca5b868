//! openraft's log storage on the node's disk (RocksDB; see `disk`).
//!
//! Durability: an entry is acknowledged to openraft (the `LogFlushed` callback) only
//! after the write-ahead log that holds it was fsynced. Appends write to the disk at
//! once (so the entries are readable for replication) and hand the callback to a
//! flusher thread, which fsyncs once for every append that queued up meanwhile: a
//! group commit that keeps fsyncs off the Raft core task and amortizes them under
//! load. The vote, truncation and purge are made durable before the call returns.
//! Under a simulator (`Blocking::Inline`) the flusher is a task on the runtime.
//!
//! The newest entries are also kept in memory (`RecentEntries`): replication to each
//! follower and the state machine read every entry right after it is appended, and
//! would otherwise each open a RocksDB iterator and decode it again.

use std::collections::VecDeque;
use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{AnyError, EntryPayload, ErrorSubject, ErrorVerb, OptionalSend, RaftLogReader, StorageIOError};

use crate::raft::blocking::Blocking;
use crate::raft::codec;
use crate::raft::disk::{
    index_from_key, index_key, Batch, Disk, Durability, Family, KEY_COMMITTED, KEY_LAST_PURGED, KEY_VOTE,
};
use crate::raft::types::{Entry, LogId, StorageError, TypeConfig, Vote};
use crate::shell::clock::Stopwatch;
use crate::shell::disk::SyncTimes;

/// Appends waiting for the flusher at most; a full queue makes `append` wait, which
/// pushes back on the Raft core instead of growing memory.
pub const FLUSH_QUEUE_APPENDS_MAX: usize = 4_096;

/// Entries kept in memory at most (see `RecentEntries`).
pub const RECENT_ENTRIES_MAX: usize = 256;
/// Commands in the entries kept in memory at most: bounds the memory they hold
/// whatever the size of the entries.
pub const RECENT_COMMANDS_MAX: usize = 4_096;

#[derive(Clone)]
pub struct LogStore {
    disk: Arc<dyn Disk>,
    blocking: Blocking,
    flusher: Arc<Flusher>,
    /// Shared with the readers openraft gets from `get_log_reader`.
    recent: Arc<Mutex<RecentEntries>>,
}

/// The newest entries of the log, in memory: always a contiguous run that ends at the
/// last entry written, or nothing (after a start, until the first append). Every
/// append, truncation and purge updates it, so a range it covers reads the same from
/// here as from RocksDB. Cloning an entry shares its commands.
#[derive(Debug, Default)]
struct RecentEntries {
    entries: VecDeque<Entry>,
    /// Commands in `entries`, a blank or membership entry counting as one.
    commands: usize,
}

fn commands_in(entry: &Entry) -> usize {
    match &entry.payload {
        EntryPayload::Normal(proposal) => proposal.commands.len().max(1),
        _ => 1,
    }
}

impl RecentEntries {
    /// Remembers an entry just written. An entry at or below the last one replaces it
    /// and everything after it, as the write did in RocksDB; one that leaves a gap
    /// starts the run afresh.
    fn push(&mut self, entry: Entry) {
        let index = entry.log_id.index;
        match self.entries.back().map(|last| last.log_id.index) {
            Some(last) if index <= last => self.truncate_from(index),
            Some(last) if index > last + 1 => self.clear(),
            _ => {}
        }
        self.commands += commands_in(&entry);
        self.entries.push_back(entry);
        while self.entries.len() > RECENT_ENTRIES_MAX || (self.commands > RECENT_COMMANDS_MAX && self.entries.len() > 1)
        {
            self.pop_front();
        }
    }

    fn pop_front(&mut self) {
        if let Some(entry) = self.entries.pop_front() {
            self.commands -= commands_in(&entry);
        }
    }

    /// Forgets the entries from `index` on.
    fn truncate_from(&mut self, index: u64) {
        while self.entries.back().is_some_and(|last| last.log_id.index >= index) {
            let entry = self.entries.pop_back().expect("checked above");
            self.commands -= commands_in(&entry);
        }
    }

    /// Forgets the entries up to `index`, included.
    fn purge_upto(&mut self, index: u64) {
        while self.entries.front().is_some_and(|first| first.log_id.index <= index) {
            self.pop_front();
        }
    }

    fn clear(&mut self) {
        self.entries.clear();
        self.commands = 0;
    }

    /// The entries `start..end` when all of them are here.
    fn get(&self, start: u64, end: u64) -> Option<Vec<Entry>> {
        let first = self.entries.front()?.log_id.index;
        let last = self.entries.back()?.log_id.index;
        if start < first || end > last + 1 || start > end {
            return None;
        }
        let from = (start - first) as usize;
        let to = (end - first) as usize;
        Some(self.entries.range(from..to).cloned().collect())
    }
}

fn io_error(subject: ErrorSubject<u64>, verb: ErrorVerb, error: impl std::error::Error + 'static) -> StorageError {
    StorageIOError::new(subject, verb, AnyError::new(&error)).into()
}

fn read_error(error: impl std::error::Error + 'static) -> StorageError {
    io_error(ErrorSubject::Logs, ErrorVerb::Read, error)
}

fn write_error(error: impl std::error::Error + 'static) -> StorageError {
    io_error(ErrorSubject::Logs, ErrorVerb::Write, error)
}

/// The queue to the flusher, shared by the clones of the log store. When the last
/// clone goes, the queue closes and the thread's end is awaited: the thread holds
/// the disk, and a RocksDB database left for it to close could still be closing while the
/// process exits, which aborts in RocksDB's destructors ("pthread lock: Invalid
/// argument"). So the database is closed by whoever drops it last, in order.
enum Flusher {
    Thread {
        queue: Option<mpsc::SyncSender<LogFlushed<TypeConfig>>>,
        thread: Option<JoinHandle<()>>,
    },
    /// Under `Blocking::Inline`: a task, which ends when the queue closes.
    Task {
        queue: tokio::sync::mpsc::Sender<LogFlushed<TypeConfig>>,
    },
}

impl Flusher {
    fn start(disk: Arc<dyn Disk>, blocking: Blocking, times: Arc<SyncTimes>) -> Self {
        match blocking {
            Blocking::Threads => {
                let (queue, appends) = mpsc::sync_channel::<LogFlushed<TypeConfig>>(FLUSH_QUEUE_APPENDS_MAX);
                let thread = std::thread::Builder::new()
                    .name("log-flusher".into())
                    .spawn(move || run_flusher(disk, appends, &times))
                    .expect("spawn the log flusher thread");
                Flusher::Thread { queue: Some(queue), thread: Some(thread) }
            }
            Blocking::Inline => {
                let (queue, appends) = tokio::sync::mpsc::channel(FLUSH_QUEUE_APPENDS_MAX);
                tokio::spawn(run_flusher_task(disk, appends, times));
                Flusher::Task { queue }
            }
        }
    }

    /// Hands `callback` to the flusher, waiting while its queue is full.
    async fn queue(&self, callback: LogFlushed<TypeConfig>) -> Result<(), StorageError> {
        let stopped = || write_error(std::io::Error::other("the log flusher stopped"));
        match self {
            Flusher::Thread { queue, .. } => {
                let queue = queue.as_ref().expect("the queue is open until the flusher is dropped");
                match queue.try_send(callback) {
                    Ok(()) => Ok(()),
                    Err(mpsc::TrySendError::Disconnected(_)) => Err(stopped()),
                    Err(mpsc::TrySendError::Full(callback)) => {
                        let queue = queue.clone();
                        tokio::task::spawn_blocking(move || queue.send(callback))
                            .await
                            .expect("queueing to the flusher does not panic")
                            .map_err(|_| stopped())
                    }
                }
            }
            Flusher::Task { queue } => queue.send(callback).await.map_err(|_| stopped()),
        }
    }
}

impl Drop for Flusher {
    fn drop(&mut self) {
        let Flusher::Thread { queue, thread } = self else { return };
        drop(queue.take());
        if let Some(thread) = thread.take() {
            // Appends already queued are fsynced and answered first; then the thread ends.
            if thread.join().is_err() {
                tracing::error!("the log flusher thread panicked");
            }
        }
    }
}

impl LogStore {
    /// A log on `disk`; each sync's time goes to `sync_times`.
    pub fn new(disk: Arc<dyn Disk>, blocking: Blocking, sync_times: Arc<SyncTimes>) -> Self {
        let flusher = Arc::new(Flusher::start(disk.clone(), blocking, sync_times.clone()));
        Self { disk, blocking, flusher, recent: Arc::new(Mutex::new(RecentEntries::default())) }
    }

    fn recent(&self) -> std::sync::MutexGuard<'_, RecentEntries> {
        self.recent.lock().expect("no thread panics while holding the recent entries")
    }

    fn get_meta<T: serde::de::DeserializeOwned>(&self, key: &[u8]) -> Result<Option<T>, StorageError> {
        match self.disk.get(Family::Meta, key).map_err(read_error)? {
            None => Ok(None),
            Some(bytes) => codec::decode(&bytes).map(Some).map_err(read_error),
        }
    }

    /// Puts a meta value and makes it durable before returning, off the async runtime.
    async fn put_meta_durable<T: serde::Serialize>(&self, key: &'static [u8], value: &T) -> Result<(), StorageError> {
        let bytes = codec::encode(value);
        let disk = self.disk.clone();
        self.blocking.run(move || disk.put(Family::Meta, key, bytes, Durability::Synced)).await.map_err(write_error)
    }

    fn last_log_id(&self) -> Result<Option<LogId>, StorageError> {
        match self.disk.last(Family::Logs).map_err(read_error)? {
            None => Ok(None),
            Some((_, value)) => {
                let entry: Entry = codec::decode(&value).map_err(read_error)?;
                Ok(Some(entry.log_id))
            }
        }
    }
}

/// Fsyncs the write-ahead log once for every batch of appends that queued up, then
/// tells openraft that those appends are durable.
fn run_flusher(disk: Arc<dyn Disk>, queue: mpsc::Receiver<LogFlushed<TypeConfig>>, times: &SyncTimes) {
    while let Ok(first) = queue.recv() {
        let mut callbacks = vec![first];
        while let Ok(more) = queue.try_recv() {
            callbacks.push(more);
        }
        let stopwatch = Stopwatch::start();
        let result = disk.sync().map_err(std::io::Error::other);
        times.record(stopwatch.elapsed_us());
        for callback in callbacks {
            callback.log_io_completed(
                result.as_ref().map(|_| ()).map_err(|error| std::io::Error::other(error.to_string())),
            );
        }
    }
}

/// `run_flusher` as a task (`Blocking::Inline`): the appends that queued up while it
/// waited are synced together, as on the thread.
async fn run_flusher_task(
    disk: Arc<dyn Disk>,
    mut queue: tokio::sync::mpsc::Receiver<LogFlushed<TypeConfig>>,
    times: Arc<SyncTimes>,
) {
    while let Some(first) = queue.recv().await {
        let stopwatch = Stopwatch::start();
        let latency = disk.sync_latency();
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        let mut callbacks = vec![first];
        while let Ok(more) = queue.try_recv() {
            callbacks.push(more);
        }
        let result = disk.sync().map_err(std::io::Error::other);
        times.record(stopwatch.elapsed_us());
        for callback in callbacks {
            callback.log_io_completed(
                result.as_ref().map(|_| ()).map_err(|error| std::io::Error::other(error.to_string())),
            );
        }
    }
}

/// Makes a fresh database's log start after `log_id`, as if every entry up to it
/// had been purged behind a snapshot (`state_machine_store::seed`): a restored node
/// starts there.
pub fn seed(disk: &dyn Disk, log_id: LogId) -> Result<(), String> {
    let mut batch = Batch::default();
    batch.put(Family::Meta, KEY_LAST_PURGED, codec::encode(&log_id));
    batch.put(Family::Meta, KEY_COMMITTED, codec::encode(&Some(log_id)));
    disk.write(batch, Durability::Synced).map_err(|error| format!("cannot write the log's start: {error}"))
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        let start = match range.start_bound() {
            Bound::Included(index) => *index,
            Bound::Excluded(index) => index + 1,
            Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            Bound::Included(index) => Some(index + 1),
            Bound::Excluded(index) => Some(*index),
            Bound::Unbounded => None,
        };
        if let Some(end) = end {
            if let Some(entries) = self.recent().get(start, end) {
                return Ok(entries);
            }
        }
        let mut entries = Vec::new();
        let mut decoded = Ok(());
        self.disk
            .scan_from(Family::Logs, &index_key(start), &mut |key, value| {
                if !range.contains(&index_from_key(key)) {
                    return false;
                }
                match codec::decode::<Entry>(value) {
                    Ok(entry) => entries.push(entry),
                    Err(error) => decoded = Err(error),
                }
                decoded.is_ok()
            })
            .map_err(read_error)?;
        decoded.map_err(read_error)?;
        Ok(entries)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let last_purged_log_id: Option<LogId> = self.get_meta(KEY_LAST_PURGED)?;
        let last_log_id = self.last_log_id()?.or(last_purged_log_id);
        Ok(LogState { last_purged_log_id, last_log_id })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), StorageError> {
        self.put_meta_durable(KEY_VOTE, vote)
            .await
            .map_err(|error| io_error(ErrorSubject::Vote, ErrorVerb::Write, error))
    }

    /// The vote as saved, but never as a committed one: openraft 0.9 restores a node
    /// whose saved vote is its own committed leadership as the leader of that term at
    /// once, without an election. If its disk lost writes it had acknowledged (a
    /// flush the device claimed and did not make), it would then write other entries
    /// under log ids its followers already hold, and each side would apply its own.
    /// Read as not committed, the vote still binds the node to its term's candidate,
    /// and a restarted leader campaigns for a new term like any node, which a
    /// follower holding a longer log refuses (simulation/README.md, "What it found").
    async fn read_vote(&mut self) -> Result<Option<Vote>, StorageError> {
        let vote: Option<Vote> = self.get_meta(KEY_VOTE)?;
        Ok(vote.map(|vote| Vote { committed: false, ..vote }))
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        // Not synced: after a crash openraft recovers the committed index from the
        // quorum; this only saves re-applying entries that were applied before.
        self.disk.put(Family::Meta, KEY_COMMITTED, codec::encode(&committed), Durability::Written).map_err(write_error)
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        Ok(self.get_meta::<Option<LogId>>(KEY_COMMITTED)?.flatten())
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut batch = Batch::default();
        let entries: Vec<Entry> = entries.into_iter().collect();
        for entry in &entries {
            batch.put(Family::Logs, index_key(entry.log_id.index), codec::encode(entry));
        }
        // Written at once so that replication can read the entries; made durable by
        // the flusher before openraft counts them.
        self.disk.write(batch, Durability::Written).map_err(write_error)?;
        {
            let mut recent = self.recent();
            for entry in entries {
                recent.push(entry);
            }
        }
        self.flusher.queue(callback).await
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.recent().truncate_from(log_id.index);
        let disk = self.disk.clone();
        self.blocking
            .run(move || {
                let mut batch = Batch::default();
                batch.delete_range(Family::Logs, index_key(log_id.index), index_key(u64::MAX));
                disk.write(batch, Durability::Synced)
            })
            .await
            .map_err(write_error)
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.recent().purge_upto(log_id.index);
        let disk = self.disk.clone();
        self.blocking
            .run(move || {
                let mut batch = Batch::default();
                batch.put(Family::Meta, KEY_LAST_PURGED, codec::encode(&log_id));
                batch.delete_range(Family::Logs, index_key(0), index_key(log_id.index + 1));
                disk.write(batch, Durability::Synced)
            })
            .await
            .map_err(write_error)
    }
}

#[cfg(test)]
mod tests {
    use openraft::CommittedLeaderId;

    use super::*;
    use crate::machine::{Caller, Command, Submission};
    use crate::raft::types::Proposal;

    /// An entry at `index` carrying `commands` commands.
    fn entry(index: u64, commands: usize) -> Entry {
        let commands: Vec<Submission> = (0..commands)
            .map(|_| Submission { caller: Caller::Cluster, command: Command::ExpireSessions { sessions: vec![index] } })
            .collect();
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
            payload: EntryPayload::Normal(Proposal { stamp_ms: 0, commands: commands.into() }),
        }
    }

    fn indexes(entries: &[Entry]) -> Vec<u64> {
        entries.iter().map(|entry| entry.log_id.index).collect()
    }

    fn run(range: std::ops::RangeInclusive<u64>) -> RecentEntries {
        let mut recent = RecentEntries::default();
        for index in range {
            recent.push(entry(index, 1));
        }
        recent
    }

    #[test]
    fn a_range_is_served_only_when_every_entry_of_it_is_held() {
        let recent = run(5..=9);
        assert_eq!(indexes(&recent.get(5, 10).unwrap()), vec![5, 6, 7, 8, 9]);
        assert_eq!(indexes(&recent.get(7, 8).unwrap()), vec![7]);
        assert!(recent.get(6, 6).unwrap().is_empty());
        assert!(recent.get(4, 6).is_none(), "index 4 is only in RocksDB");
        assert!(recent.get(8, 11).is_none(), "index 10 is not known here");
        assert!(RecentEntries::default().get(1, 2).is_none());
    }

    #[test]
    fn cached_entries_share_the_commands_of_the_appended_ones() {
        let mut recent = RecentEntries::default();
        let appended = entry(1, 3);
        recent.push(appended.clone());
        let read = recent.get(1, 2).unwrap().remove(0);
        let (EntryPayload::Normal(appended), EntryPayload::Normal(read)) = (appended.payload, read.payload) else {
            panic!("normal entries");
        };
        assert!(Arc::ptr_eq(&appended.commands, &read.commands));
    }

    #[test]
    fn the_run_is_bounded_in_entries_and_in_commands() {
        let recent = run(1..=(RECENT_ENTRIES_MAX as u64 + 10));
        assert_eq!(recent.entries.len(), RECENT_ENTRIES_MAX);
        assert_eq!(recent.entries.front().unwrap().log_id.index, 11);
        assert_eq!(recent.commands, RECENT_ENTRIES_MAX);

        let mut recent = RecentEntries::default();
        let per_entry = RECENT_COMMANDS_MAX / 4;
        for index in 1..=6 {
            recent.push(entry(index, per_entry));
        }
        assert_eq!(indexes(&recent.get(3, 7).unwrap()), vec![3, 4, 5, 6]);
        assert_eq!(recent.commands, RECENT_COMMANDS_MAX);
        // One entry larger than the whole bound is still kept: it is the newest.
        recent.push(entry(7, RECENT_COMMANDS_MAX + 1));
        assert_eq!(indexes(&recent.get(7, 8).unwrap()), vec![7]);
        assert_eq!(recent.entries.len(), 1);
    }

    #[test]
    fn truncation_and_purge_forget_what_rocksdb_deletes() {
        let mut recent = run(1..=10);
        recent.truncate_from(8);
        assert_eq!(indexes(&recent.get(1, 8).unwrap()), vec![1, 2, 3, 4, 5, 6, 7]);
        assert!(recent.get(7, 9).is_none());
        recent.purge_upto(3);
        assert!(recent.get(3, 5).is_none());
        assert_eq!(indexes(&recent.get(4, 8).unwrap()), vec![4, 5, 6, 7]);
        recent.purge_upto(20);
        assert!(recent.entries.is_empty());
        assert_eq!(recent.commands, 0);
    }

    #[test]
    fn an_overwrite_replaces_the_tail_and_a_gap_starts_afresh() {
        let mut recent = run(1..=5);
        let overwrite = Entry { log_id: LogId::new(CommittedLeaderId::new(2, 2), 4), ..entry(4, 2) };
        recent.push(overwrite);
        let held = recent.get(1, 5).unwrap();
        assert_eq!(indexes(&held), vec![1, 2, 3, 4]);
        assert_eq!(held[3].log_id.leader_id.term, 2);
        assert_eq!(recent.commands, 3 + 2);
        assert!(recent.get(5, 6).is_none(), "the old entry 5 is gone");

        recent.push(entry(9, 1));
        assert!(recent.get(1, 2).is_none());
        assert_eq!(indexes(&recent.get(9, 10).unwrap()), vec![9]);
        assert_eq!(recent.commands, 1);
    }
}
