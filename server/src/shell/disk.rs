//! The free space of the data directory's file system, watched so that the leader
//! refuses new state before the disk is full, instead of RocksDB failing a write
//! (which stops the node, `EXIT_RAFT_FATAL`).

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// How often the free space is read.
pub const DISK_CHECK_INTERVAL_MS: u64 = 1_000;

/// The data directory's free space as last read, and the reserve below which new
/// state is refused.
pub struct DiskSpace {
    reserve_bytes: u64,
    /// `u64::MAX` until the first reading.
    free_bytes: AtomicU64,
}

impl DiskSpace {
    pub fn new(reserve_bytes: u64) -> DiskSpace {
        DiskSpace { reserve_bytes, free_bytes: AtomicU64::new(u64::MAX) }
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
    fn the_reserve_decides_and_nothing_is_low_before_a_reading() {
        let directory = tempfile::tempdir().unwrap();
        let roomy = DiskSpace::new(1);
        assert!(!roomy.is_low(), "no reading yet");
        assert!(!roomy.refresh(directory.path()).unwrap());
        assert!(roomy.free_bytes().unwrap() > 0);
        let greedy = DiskSpace::new(u64::MAX - 1);
        assert!(greedy.refresh(directory.path()).unwrap());
        assert!(greedy.is_low());
        assert!(free_bytes(Path::new("/no/such/directory")).is_err());
    }
}
