//! RocksDB as Leasehold's disk (`RocksDisk`): one database per node with a column
//! family for each `disk::Family`.
//!
//! * `logs`: Raft log entries, keyed by big-endian index so that key order is log order.
//! * `meta`: the vote, the committed log id, the last purged log id and the latest
//!   snapshot.
//!
//! Every value is a versioned postcard blob (see `codec`).

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use rocksdb::{
    BlockBasedOptions, Cache, ColumnFamily, ColumnFamilyDescriptor, DBCompressionType, DBRecoveryMode, Direction,
    IteratorMode, Options, WriteBatch, WriteOptions, DB,
};

use crate::raft::disk::{Batch, Change, Disk, DiskError, Durability, Family};

/// Memtable size of each column family. Log entries live only until the next
/// snapshot purges them, so a small memtable that is flushed often costs little disk
/// work and keeps the node's memory close to its state.
pub const WRITE_BUFFER_BYTES: usize = 2 * 1024 * 1024;

/// One block cache for both column families. The state lives in memory; RocksDB is
/// read for log entries a lagging follower needs, and for the snapshot when a node
/// starts or a follower needs it. Without a cache of its own each family gets
/// RocksDB's default of 32 MiB, which a single snapshot read can fill.
pub const BLOCK_CACHE_BYTES: usize = 4 * 1024 * 1024;

/// How RocksDB reads its write-ahead log back at start: any bad record refuses the
/// open (the error names the file, see `OpenError`).
///
/// RocksDB's default (point in time) stops at the first bad record and silently drops
/// everything after it, and "tolerate corrupted tail records" does the same whenever
/// the bad record looks torn: eight bytes flipped in the middle of a node's log made
/// a record's length point past the end of the file, and RocksDB dropped the 13 KB
/// after it, half the log, as a torn tail. The node then came back without entries it
/// had acknowledged, and the leader, whose bookkeeping said the node had them,
/// panicked in openraft. A Raft log must never forget an acknowledged entry, so any bad
/// record stops the node instead; the cluster has the entries, and the node is
/// replaced (README, "Replacing a node"). The price: a record torn by a power loss (a
/// process killed with kill -9 tears nothing, the page cache survives it) is refused
/// too, and that node is replaced the same way.
///
/// It also rules out recycling the log's files (RocksDB turns recycling off with it,
/// since a recycled file's old tail looks like a bad record), which saved about 0.035
/// ms per fdatasync on the 2-core machine; bench/README gives the cost in throughput.
pub const WAL_RECOVERY_MODE: DBRecoveryMode = DBRecoveryMode::AbsoluteConsistency;

#[derive(Debug, thiserror::Error)]
#[error("cannot open the database at {path}: {source}{}", file.as_ref().map(|file| format!(" (in {file})")).unwrap_or_default())]
pub struct OpenError {
    pub path: String,
    pub source: rocksdb::Error,
    /// The file RocksDB found corrupt, when its error does not name it (a bad
    /// write-ahead log record): read from the database's own LOG.
    pub file: Option<String>,
}

/// The file the last corruption RocksDB logged (in the `LOG` file of the database at
/// `path`) was found in: its lines read `... [source] /path/000004.log: dropping N
/// bytes; Corruption: ...`.
fn corrupt_file_logged(path: &Path) -> Option<String> {
    let log = std::fs::read_to_string(path.join("LOG")).ok()?;
    log.lines().rev().filter(|line| line.contains("Corruption")).find_map(|line| {
        let start = line.find(&*path.to_string_lossy())?;
        let rest = &line[start..];
        let end = rest.find(": ")?;
        Some(rest[..end].to_string())
    })
}

/// Opens (or, for a fresh data directory, creates) the node's database.
pub fn open(path: &Path, create: bool) -> Result<Arc<RocksDisk>, OpenError> {
    let mut options = Options::default();
    options.create_if_missing(create);
    options.create_missing_column_families(create);
    options.set_paranoid_checks(true);
    // Without an explicit choice RocksDB silently stores uncompressed when snappy is
    // not compiled in; lz4 is.
    options.set_compression_type(DBCompressionType::Lz4);
    options.set_keep_log_file_num(4);
    options.set_wal_recovery_mode(WAL_RECOVERY_MODE);
    let cache = Cache::new_lru_cache(BLOCK_CACHE_BYTES);
    let mut table_options = BlockBasedOptions::default();
    table_options.set_block_cache(&cache);
    let descriptors = Family::ALL.map(|family| {
        let mut cf_options = Options::default();
        cf_options.set_block_based_table_factory(&table_options);
        cf_options.set_compression_type(DBCompressionType::Lz4);
        // Log entries live until the next snapshot purges them, and the meta family
        // holds a handful of keys: small memtables keep a node's memory close to its
        // state instead of RocksDB's 64 MiB default per family.
        cf_options.set_write_buffer_size(WRITE_BUFFER_BYTES);
        ColumnFamilyDescriptor::new(family.name(), cf_options)
    });
    let db = DB::open_cf_descriptors(&options, path, descriptors).map_err(|source| {
        let file = match source.kind() {
            rocksdb::ErrorKind::Corruption if !source.to_string().contains(&*path.to_string_lossy()) => {
                corrupt_file_logged(path)
            }
            _ => None,
        };
        OpenError { path: path.display().to_string(), source, file }
    })?;
    Ok(Arc::new(RocksDisk { db, sync_delay_ms: AtomicU64::new(0) }))
}

/// A node's RocksDB database. Dropping the last reference closes it.
pub struct RocksDisk {
    db: DB,
    /// The disk fault knob's added fsync time, in milliseconds (0: none).
    sync_delay_ms: AtomicU64,
}

fn disk_error(error: rocksdb::Error) -> DiskError {
    DiskError(error.to_string())
}

impl RocksDisk {
    /// Waits out the disk fault knob's delay before a sync (on the thread that syncs,
    /// never the async runtime's: the flusher thread or a blocking task).
    fn slow_sync(&self) {
        let delay_ms = self.sync_delay_ms.load(Ordering::Relaxed);
        if delay_ms > 0 {
            std::thread::sleep(std::time::Duration::from_millis(delay_ms));
        }
    }

    fn family(&self, family: Family) -> &ColumnFamily {
        self.db.cf_handle(family.name()).expect("every family's column family exists")
    }
}

impl Disk for RocksDisk {
    fn get(&self, family: Family, key: &[u8]) -> Result<Option<Vec<u8>>, DiskError> {
        self.db.get_cf(self.family(family), key).map_err(disk_error)
    }

    fn scan_from(
        &self,
        family: Family,
        from: &[u8],
        visit: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<(), DiskError> {
        for item in self.db.iterator_cf(self.family(family), IteratorMode::From(from, Direction::Forward)) {
            let (key, value) = item.map_err(disk_error)?;
            if !visit(&key, &value) {
                break;
            }
        }
        Ok(())
    }

    fn last(&self, family: Family) -> Result<Option<(Vec<u8>, Vec<u8>)>, DiskError> {
        match self.db.iterator_cf(self.family(family), IteratorMode::End).next() {
            None => Ok(None),
            Some(item) => item.map(|(key, value)| Some((key.into_vec(), value.into_vec()))).map_err(disk_error),
        }
    }

    fn write(&self, batch: Batch, durability: Durability) -> Result<(), DiskError> {
        let mut rocks = WriteBatch::default();
        for change in batch.changes {
            match change {
                Change::Put { family, key, value } => rocks.put_cf(self.family(family), key, value),
                Change::Delete { family, key } => rocks.delete_cf(self.family(family), key),
                Change::DeleteRange { family, from, to } => rocks.delete_range_cf(self.family(family), from, to),
            }
        }
        let mut options = WriteOptions::default();
        if durability == Durability::Synced {
            self.slow_sync();
        }
        options.set_sync(durability == Durability::Synced);
        self.db.write_opt(rocks, &options).map_err(disk_error)
    }

    fn sync(&self) -> Result<(), DiskError> {
        self.slow_sync();
        self.db.flush_wal(true).map_err(disk_error)
    }

    fn slow_syncs(&self, delay: std::time::Duration) -> bool {
        self.sync_delay_ms.store(delay.as_millis() as u64, Ordering::Relaxed);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::raft::disk::index_key;

    /// The write-ahead log files of the database at `path`, oldest first.
    fn wal_files(path: &Path) -> Vec<std::path::PathBuf> {
        let mut files: Vec<_> = std::fs::read_dir(path)
            .unwrap()
            .map(|entry| entry.unwrap().path())
            .filter(|file| file.extension().is_some_and(|extension| extension == "log"))
            .collect();
        files.sort();
        files
    }

    #[test]
    fn a_bad_record_in_the_middle_of_the_log_is_refused_naming_the_file() {
        let root = tempfile::tempdir().unwrap();
        let path = root.path().join("db");
        {
            let disk = open(&path, true).unwrap();
            for index in 0..200u64 {
                disk.put(Family::Logs, &index_key(index), vec![index as u8; 100], Durability::Synced).unwrap();
            }
        }
        let wal = wal_files(&path).pop().expect("a write-ahead log file");
        let mut bytes = std::fs::read(&wal).unwrap();
        assert!(bytes.len() > 10_000, "{} bytes", bytes.len());
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0xff;
        std::fs::write(&wal, &bytes).unwrap();

        let error = open(&path, false).err().expect("a log with a bad record in its middle is refused").to_string();
        let name = wal.file_name().unwrap().to_string_lossy().into_owned();
        assert!(error.contains("Corruption"), "{error}");
        assert!(error.contains(&name), "the message names the file {name}: {error}");
    }

    #[test]
    fn a_torn_last_record_is_refused_too() {
        let root = tempfile::tempdir().unwrap();
        let path = root.path().join("db");
        {
            let disk = open(&path, true).unwrap();
            for index in 0..50u64 {
                disk.put(Family::Logs, &index_key(index), vec![index as u8; 100], Durability::Synced).unwrap();
            }
        }
        let wal = wal_files(&path).pop().unwrap();
        let bytes = std::fs::read(&wal).unwrap();
        // A crash in the middle of the last write: half of its record reached the disk.
        std::fs::write(&wal, &bytes[..bytes.len() - 60]).unwrap();

        // It cannot be told from a length field flipped in the middle of the log.
        let error = open(&path, false).err().expect("a torn record is refused").to_string();
        assert!(error.contains("Corruption"), "{error}");
    }
}
