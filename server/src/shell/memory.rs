//! How the node uses the C allocator, so that its resident memory follows its state.
//!
//! glibc's malloc serves a request of at least the mmap threshold with its own mapping,
//! which goes back to the system when freed. By default that threshold rises to the
//! size of any such block that is freed (up to 32 MiB), after which the large,
//! short-lived buffers of snapshots and RocksDB memtables come from the heap instead
//! and leave it fragmented. A fixed threshold keeps them mapped.
//!
//! Smaller blocks freed by the tokio workers after a burst of requests stay in their
//! arenas, resident, until `malloc_trim`: on a leader that created 100k sessions that
//! was about 80 MB of free heap. The state itself is built on the applier thread (see
//! `applier`), so those pages hold little else and trimming gives them back; the
//! trimmer does so once enough was freed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// How often the trimmer looks at the free heap.
pub const TRIM_CHECK_INTERVAL: Duration = Duration::from_secs(1);
/// Heap freed since the last trim that makes the trimmer trim again.
pub const TRIM_AFTER_FREED_BYTES: usize = 1024 * 1024;

/// Large blocks are mapped from this size on.
pub const MMAP_THRESHOLD_BYTES: i32 = 256 * 1024;

/// Fixes the mmap threshold. Call once at start, before other threads exist.
pub fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes malloc's parameters; called before any other thread.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES);
    }
}

/// Hands free heap pages back to the system, after a burst of allocations (a snapshot)
/// was dropped.
pub fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free heap pages to the kernel.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Trims the trimmer made, for the metrics page.
static TRIMS: AtomicU64 = AtomicU64::new(0);

pub fn trims() -> u64 {
    TRIMS.load(Ordering::Relaxed)
}

/// Bytes of free heap in malloc's arenas (resident or already given back).
pub fn free_heap_bytes() -> usize {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallinfo2 only reads malloc's statistics.
    unsafe {
        libc::mallinfo2().fordblks
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    0
}

/// Starts a thread that trims the heap whenever `TRIM_AFTER_FREED_BYTES` more of it
/// was freed since the last trim. Looking costs microseconds; a trim, a few
/// milliseconds of walking the free blocks. For the server process only.
pub fn start_trimmer() -> std::io::Result<()> {
    std::thread::Builder::new().name("heap-trimmer".into()).spawn(|| {
        let mut free_after_last_trim = free_heap_bytes();
        loop {
            std::thread::sleep(TRIM_CHECK_INTERVAL);
            let free = free_heap_bytes();
            // Free blocks that were reused and freed again are resident again.
            free_after_last_trim = free_after_last_trim.min(free);
            if free - free_after_last_trim >= TRIM_AFTER_FREED_BYTES {
                release_freed_memory();
                TRIMS.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(free_heap_bytes = free, "trimmed the heap");
                free_after_last_trim = free_heap_bytes();
            }
        }
    })?;
    Ok(())
}
