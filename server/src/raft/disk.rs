//! What the log and state machine stores need of a disk, as one trait: RocksDB in a
//! node (`storage::RocksDisk`), an in-memory disk in tests and the simulator
//! (`memory_disk::MemoryDisk`).
//!
//! The trait keeps the one distinction durability rests on: a write is *written*
//! (readable at once) before it is *synced* (survives a crash). A synced write, or a
//! `sync`, makes every write before it durable too, as one write-ahead log does.

use std::fmt;

/// The two key spaces of a node's disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Family {
    /// Raft log entries, keyed by big-endian index so that key order is log order.
    Logs,
    /// The vote, the committed log id, the last purged log id, the latest snapshot
    /// and the quiet sessions' recorded deadlines.
    Meta,
}

impl Family {
    pub const ALL: [Family; 2] = [Family::Logs, Family::Meta];

    pub fn name(self) -> &'static str {
        match self {
            Family::Logs => "logs",
            Family::Meta => "meta",
        }
    }
}

/// The keys of `Family::Meta` (and, under `raft::quiet_deadlines`'s prefix, the quiet
/// sessions' deadlines).
pub const KEY_VOTE: &[u8] = b"vote";
pub const KEY_COMMITTED: &[u8] = b"committed";
pub const KEY_LAST_PURGED: &[u8] = b"last_purged";
pub const KEY_SNAPSHOT: &[u8] = b"snapshot";

/// One change of a `Batch`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    Put {
        family: Family,
        key: Vec<u8>,
        value: Vec<u8>,
    },
    Delete {
        family: Family,
        key: Vec<u8>,
    },
    /// Deletes the keys in `from..to`.
    DeleteRange {
        family: Family,
        from: Vec<u8>,
        to: Vec<u8>,
    },
}

/// Changes written together: all of them or none reach the disk.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Batch {
    pub changes: Vec<Change>,
}

impl Batch {
    pub fn put(&mut self, family: Family, key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) {
        self.changes.push(Change::Put { family, key: key.into(), value: value.into() });
    }

    pub fn delete(&mut self, family: Family, key: impl Into<Vec<u8>>) {
        self.changes.push(Change::Delete { family, key: key.into() });
    }

    pub fn delete_range(&mut self, family: Family, from: impl Into<Vec<u8>>, to: impl Into<Vec<u8>>) {
        self.changes.push(Change::DeleteRange { family, from: from.into(), to: to.into() });
    }
}

/// Whether a write returns once it is written or once it is on disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    /// Readable at once; durable with the next synced write or `sync`.
    Written,
    /// Durable, with every write before it, when the call returns.
    Synced,
}

/// A disk that failed a read or a write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskError(pub String);

impl fmt::Display for DiskError {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(&self.0)
    }
}

impl std::error::Error for DiskError {}

/// A node's disk. Calls block: the stores make them off the async runtime where they
/// may wait on the device (a sync).
pub trait Disk: Send + Sync + 'static {
    fn get(&self, family: Family, key: &[u8]) -> Result<Option<Vec<u8>>, DiskError>;

    /// Visits the entries of `family` from `from` on in key order, while `visit`
    /// answers true.
    fn scan_from(
        &self,
        family: Family,
        from: &[u8],
        visit: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<(), DiskError>;

    /// The entry of `family` with the greatest key.
    fn last(&self, family: Family) -> Result<Option<(Vec<u8>, Vec<u8>)>, DiskError>;

    fn write(&self, batch: Batch, durability: Durability) -> Result<(), DiskError>;

    /// Makes every write so far durable.
    fn sync(&self) -> Result<(), DiskError>;

    /// How long the log's next sync takes beyond the call itself: zero for a real
    /// disk, whose syncs take their own time; a simulated slow disk sets it, and the
    /// flusher task (`Blocking::Inline`) waits that long on the runtime's clock before
    /// it syncs, while appends queue behind it.
    fn sync_latency(&self) -> std::time::Duration {
        std::time::Duration::ZERO
    }

    /// The disk fault knob of the fault suite (`--test-disk-knob`): from now on every
    /// sync, and every synced write, takes `delay` longer, as on a disk whose fsyncs
    /// are slow. Answers false where the disk has no such knob (the simulator's disk
    /// slows its syncs through `sync_latency`).
    fn slow_syncs(&self, _delay: std::time::Duration) -> bool {
        false
    }

    /// Puts one value.
    fn put(&self, family: Family, key: &[u8], value: Vec<u8>, durability: Durability) -> Result<(), DiskError> {
        let mut batch = Batch::default();
        batch.put(family, key, value);
        self.write(batch, durability)
    }
}

/// The key of the log entry at `index`: big-endian, so that key order is log order.
pub fn index_key(index: u64) -> [u8; 8] {
    index.to_be_bytes()
}

pub fn index_from_key(key: &[u8]) -> u64 {
    u64::from_be_bytes(key.try_into().expect("log keys are 8 bytes"))
}
