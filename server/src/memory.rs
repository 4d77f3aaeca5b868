//! How the node uses the C allocator, so that its resident memory follows its state.
//!
//! glibc's malloc serves a request of at least the mmap threshold with its own mapping,
//! which goes back to the system when freed. By default that threshold rises to the
//! size of any such block that is freed (up to 32 MiB), after which the large,
//! short-lived buffers of snapshots and RocksDB memtables come from the heap instead
//! and leave it fragmented. A fixed threshold keeps them mapped.

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
