//! openraft's log storage on RocksDB.
//!
//! Durability: an entry is acknowledged to openraft (the `LogFlushed` callback) only
//! after the write-ahead log that holds it was fsynced. Appends write to RocksDB at
//! once (so the entries are readable for replication) and hand the callback to a
//! flusher thread, which fsyncs once for every append that queued up meanwhile: a
//! group commit that keeps fsyncs off the Raft core task and amortizes them under
//! load. The vote, truncation and purge are made durable before the call returns.

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::sync::mpsc;
use std::sync::Arc;

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{AnyError, ErrorSubject, ErrorVerb, OptionalSend, RaftLogReader, StorageIOError};
use rocksdb::{Direction, IteratorMode, WriteBatch, DB};

use crate::codec;
use crate::raft_types::{Entry, LogId, StorageError, TypeConfig, Vote};
use crate::storage::{self, COLUMN_FAMILY_LOGS, COLUMN_FAMILY_META, KEY_COMMITTED, KEY_LAST_PURGED, KEY_VOTE};

/// Appends waiting for the flusher at most; a full queue makes `append` wait, which
/// pushes back on the Raft core instead of growing memory.
pub const FLUSH_QUEUE_APPENDS_MAX: usize = 4_096;

#[derive(Clone)]
pub struct LogStore {
    db: Arc<DB>,
    flusher: mpsc::SyncSender<LogFlushed<TypeConfig>>,
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

impl LogStore {
    pub fn new(db: Arc<DB>) -> Self {
        let (flusher, queue) = mpsc::sync_channel::<LogFlushed<TypeConfig>>(FLUSH_QUEUE_APPENDS_MAX);
        let flusher_db = db.clone();
        std::thread::Builder::new()
            .name("log-flusher".into())
            .spawn(move || run_flusher(flusher_db, queue))
            .expect("spawn the log flusher thread");
        Self { db, flusher }
    }

    fn logs(&self) -> &rocksdb::ColumnFamily {
        self.db.cf_handle(COLUMN_FAMILY_LOGS).expect("logs column family exists")
    }

    fn meta(&self) -> &rocksdb::ColumnFamily {
        self.db.cf_handle(COLUMN_FAMILY_META).expect("meta column family exists")
    }

    fn get_meta<T: serde::de::DeserializeOwned>(&self, key: &[u8]) -> Result<Option<T>, StorageError> {
        match self.db.get_cf(self.meta(), key).map_err(read_error)? {
            None => Ok(None),
            Some(bytes) => codec::decode(&bytes).map(Some).map_err(read_error),
        }
    }

    /// Puts a meta value and makes it durable before returning, off the async runtime.
    async fn put_meta_durable<T: serde::Serialize>(&self, key: &'static [u8], value: &T) -> Result<(), StorageError> {
        let bytes = codec::encode(value);
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || {
            let meta = db.cf_handle(COLUMN_FAMILY_META).expect("meta column family exists");
            db.put_cf_opt(meta, key, bytes, &storage::synced())
        })
        .await
        .expect("blocking write task does not panic")
        .map_err(write_error)
    }

    fn last_log_id(&self) -> Result<Option<LogId>, StorageError> {
        let mut iterator = self.db.iterator_cf(self.logs(), IteratorMode::End);
        match iterator.next() {
            None => Ok(None),
            Some(item) => {
                let (_, value) = item.map_err(read_error)?;
                let entry: Entry = codec::decode(&value).map_err(read_error)?;
                Ok(Some(entry.log_id))
            }
        }
    }
}

/// Fsyncs the write-ahead log once for every batch of appends that queued up, then
/// tells openraft that those appends are durable.
fn run_flusher(db: Arc<DB>, queue: mpsc::Receiver<LogFlushed<TypeConfig>>) {
    while let Ok(first) = queue.recv() {
        let mut callbacks = vec![first];
        while let Ok(more) = queue.try_recv() {
            callbacks.push(more);
        }
        let result = db.flush_wal(true).map_err(|error| std::io::Error::other(error.to_string()));
        for callback in callbacks {
            callback.log_io_completed(
                result.as_ref().map(|_| ()).map_err(|error| std::io::Error::other(error.to_string())),
            );
        }
    }
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
        let mut entries = Vec::new();
        let from = storage::index_key(start);
        for item in self.db.iterator_cf(self.logs(), IteratorMode::From(&from, Direction::Forward)) {
            let (key, value) = item.map_err(read_error)?;
            let index = storage::index_from_key(&key);
            if !range.contains(&index) {
                break;
            }
            entries.push(codec::decode::<Entry>(&value).map_err(read_error)?);
        }
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

    async fn read_vote(&mut self) -> Result<Option<Vote>, StorageError> {
        self.get_meta(KEY_VOTE)
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        // Not synced: after a crash openraft recovers the committed index from the
        // quorum; this only saves re-applying entries that were applied before.
        let meta = self.meta();
        self.db.put_cf(meta, KEY_COMMITTED, codec::encode(&committed)).map_err(write_error)
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        Ok(self.get_meta::<Option<LogId>>(KEY_COMMITTED)?.flatten())
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut batch = WriteBatch::default();
        let logs = self.logs();
        for entry in entries {
            batch.put_cf(logs, storage::index_key(entry.log_id.index), codec::encode(&entry));
        }
        // Written at once so that replication can read the entries; made durable by
        // the flusher before openraft counts them.
        self.db.write(batch).map_err(write_error)?;
        let stopped = || write_error(std::io::Error::other("the log flusher thread stopped"));
        match self.flusher.try_send(callback) {
            Ok(()) => Ok(()),
            Err(mpsc::TrySendError::Disconnected(_)) => Err(stopped()),
            Err(mpsc::TrySendError::Full(callback)) => {
                let flusher = self.flusher.clone();
                tokio::task::spawn_blocking(move || flusher.send(callback))
                    .await
                    .expect("queueing to the flusher does not panic")
                    .map_err(|_| stopped())
            }
        }
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || {
            let logs = db.cf_handle(COLUMN_FAMILY_LOGS).expect("logs column family exists");
            let mut batch = WriteBatch::default();
            batch.delete_range_cf(logs, storage::index_key(log_id.index), storage::index_key(u64::MAX));
            db.write_opt(batch, &storage::synced())
        })
        .await
        .expect("blocking write task does not panic")
        .map_err(write_error)
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || {
            let logs = db.cf_handle(COLUMN_FAMILY_LOGS).expect("logs column family exists");
            let meta = db.cf_handle(COLUMN_FAMILY_META).expect("meta column family exists");
            let mut batch = WriteBatch::default();
            batch.put_cf(meta, KEY_LAST_PURGED, codec::encode(&log_id));
            batch.delete_range_cf(logs, storage::index_key(0), storage::index_key(log_id.index + 1));
            db.write_opt(batch, &storage::synced())
        })
        .await
        .expect("blocking write task does not panic")
        .map_err(write_error)
    }
}
