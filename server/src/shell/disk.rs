//! The free space of the data directory's file system, watched so that the leader
//! refuses new state before the disk is full, instead of RocksDB failing a write
//! (which stops the node, `EXIT_RAFT_FATAL`); and how long the log's syncs take there.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// How often the free space is read.
pub const DISK_CHECK_INTERVAL_MS: u64 = 1_000;

/// Upper bounds of the log-sync histogram's buckets, in seconds.
pub const SYNC_BUCKETS_SECONDS: [f64; 11] = [0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0, 5.0];

/// How long the log's syncs take: each is one fsync of the write-ahead log covering
/// every append that queued meanwhile, the wait an entry has before it counts as
/// stored here. A disk that slows shows here first (`leasehold_log_sync_seconds`).
/// Written by the flusher alone, a few relaxed atomic adds per sync.
#[derive(Debug, Default)]
pub struct SyncTimes {
    /// Syncs that took up to each bound of `SYNC_BUCKETS_SECONDS` (cumulative).
    pub buckets: [AtomicU64; SYNC_BUCKETS_SECONDS.len()],
    pub count: AtomicU64,
    pub sum_us: AtomicU64,
}

impl SyncTimes {
    pub fn record(&self, took_us: u64) {
        let seconds = took_us as f64 / 1e6;
        for (bucket, bound) in self.buckets.iter().zip(SYNC_BUCKETS_SECONDS) {
            if seconds <= bound {
                bucket.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_us.fetch_add(took_us, Ordering::Relaxed);
    }
}

/// The data directory's free space as last read, and the reserve below which new
/// state is refused.
pub struct DiskSpace {
    reserve_bytes: u64,
    /// `u64::MAX` until the first reading.
    free_bytes: AtomicU64,
    /// How long the log's syncs take on this disk.
    pub log_syncs: Arc<SyncTimes>,
}

impl DiskSpace {
    pub fn new(reserve_bytes: u64, log_syncs: Arc<SyncTimes>) -> DiskSpace {
        DiskSpace { reserve_bytes, free_bytes: AtomicU64::new(u64::MAX), log_syncs }
    }

    pub fn reserve_bytes(&self) -> u64 {
        self.reserve_bytes
    }

    /// The free bytes as last read; None before the first reading.
    pub fn free_bytes(&self) -> Option<u64> {
        Some(self.free_bytes.load(Ordering::Relaxed)).filter(|free| *free != u64::MAX)
    }

    /// Whether the free space is below the reserve.
    pub fn is_low(&self) -> bool {
        self.free_bytes().is_some_and(|free| free < self.reserve_bytes)
    }

    /// Reads the free space of the file system holding `path` (what an unprivileged
    /// process may use). Returns whether it is below the reserve.
    pub fn refresh(&self, path: &Path) -> std::io::Result<bool> {
        let free = free_bytes(path)?;
        self.free_bytes.store(free.min(u64::MAX - 1), Ordering::Relaxed);
        Ok(free < self.reserve_bytes)
    }
}

/// The bytes an unprivileged process may still write on the file system of `path`.
pub fn free_bytes(path: &Path) -> std::io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(std::io::Error::other)?;
    let mut stats: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is a valid NUL-terminated string and `stats` a valid out pointer.
    if unsafe { libc::statvfs(path.as_ptr(), &mut stats) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((stats.f_bavail as u64).saturating_mul(stats.f_frsize as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sync_times_count_each_sync_in_every_bucket_at_or_above_it() {
        let times = SyncTimes::default();
        times.record(300);
        times.record(3_000);
        times.record(60_000_000);
        let buckets: Vec<u64> = times.buckets.iter().map(|bucket| bucket.load(Ordering::Relaxed)).collect();
        assert_eq!(buckets, vec![1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2], "a minute's sync is in no bucket, only the count");
        assert_eq!(times.count.load(Ordering::Relaxed), 3);
        assert_eq!(times.sum_us.load(Ordering::Relaxed), 60_003_300);
    }

    #[test]
    fn the_reserve_decides_and_nothing_is_low_before_a_reading() {
        let directory = tempfile::tempdir().unwrap();
        let roomy = DiskSpace::new(1, Arc::default());
        assert!(!roomy.is_low(), "no reading yet");
        assert!(!roomy.refresh(directory.path()).unwrap());
        assert!(roomy.free_bytes().unwrap() > 0);
        let greedy = DiskSpace::new(u64::MAX - 1, Arc::default());
        assert!(greedy.refresh(directory.path()).unwrap());
        assert!(greedy.is_low());
        assert!(free_bytes(Path::new("/no/such/directory")).is_err());
    }
}
