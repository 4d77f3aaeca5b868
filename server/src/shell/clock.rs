//! The only place where Leasehold reads a clock.
//!
//! Session deadlines use a monotonic `Clock`. For the fault-injection suite the clock
//! can be skewed through a test-only knob: a rate (how fast this node's time passes
//! relative to real time) and an offset (a forward jump). Everything else is handed
//! a `Clock` and never calls `Instant::now()` itself, so tests drive time instead of
//! sleeping. Where a clock's time comes from is its `TimeSource`: the machine's clocks
//! for a node that serves clients, a hand-driven one for unit tests, or one a
//! simulator drives. A `Stopwatch` reads the runtime's time for what must agree with
//! openraft's and tokio's timers (the takeover of `raft::peer_service`) or does not
//! matter to leases (the rate limit of log lines), and so must not follow the knob.
//! (tokio's own timers, `sleep` and `timeout`, run on the runtime's time too: real
//! time in a node, the simulator's in a simulation.)

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A point on a node's (possibly skewed) monotonic clock, in milliseconds since the
/// node started.
pub type MonotonicMs = u64;

/// The clock fault knob's unit: a rate of `RATE_PER_MILLE_NORMAL` is real time.
pub const RATE_PER_MILLE_NORMAL: u64 = 1_000;
/// A skewed clock runs at most this many times faster than real time.
pub const RATE_PER_MILLE_MAX: u64 = 10_000;

/// Where a `Clock` reads time: the machine's clocks (`Clock::system`) or time that a
/// simulator drives (`Clock::driven`). Every reading a node takes goes through one.
pub trait TimeSource: Send + Sync {
    /// Monotonic milliseconds since an origin fixed when the source was made.
    fn monotonic_ms(&self) -> u64;
    /// Wall-clock milliseconds since the Unix epoch.
    fn unix_ms(&self) -> u64;
    /// The machine's boot: an id that changes when it reboots (None when it cannot be
    /// read) and monotonic milliseconds since it booted, the same for every process
    /// of one boot. A restarted node uses them to tell how much of a deadline it
    /// recorded before is left (`raft::quiet_deadlines`).
    fn boot_id(&self) -> Option<String>;
    fn boot_ms(&self) -> u64;
}

/// The machine's clocks: `Instant`, `SystemTime`, CLOCK_MONOTONIC and the kernel's
/// boot id.
struct SystemClocks {
    origin: Instant,
}

impl TimeSource for SystemClocks {
    fn monotonic_ms(&self) -> u64 {
        self.origin.elapsed().as_millis() as u64
    }

    fn unix_ms(&self) -> u64 {
        SystemTime::now().duration_since(UNIX_EPOCH).map(|elapsed| elapsed.as_millis() as u64).unwrap_or(0)
    }

    fn boot_id(&self) -> Option<String> {
        std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok().map(|id| id.trim().to_string())
    }

    fn boot_ms(&self) -> u64 {
        boot_monotonic_ms()
    }
}

/// Unit tests' time: stands still until `Clock::advance`; one boot, starting with
/// the clock, and a wall clock that starts at the epoch.
struct ManualClocks {
    now_ms: AtomicU64,
}

impl TimeSource for ManualClocks {
    fn monotonic_ms(&self) -> u64 {
        self.now_ms.load(Ordering::SeqCst)
    }

    fn unix_ms(&self) -> u64 {
        self.monotonic_ms()
    }

    fn boot_id(&self) -> Option<String> {
        Some("manual".to_string())
    }

    fn boot_ms(&self) -> u64 {
        self.monotonic_ms()
    }
}

#[derive(Clone)]
pub struct Clock {
    inner: Arc<ClockInner>,
}

struct ClockInner {
    source: Arc<dyn TimeSource>,
    /// For tests that drive time by hand (`advance`); the same as `source`.
    manual: Option<Arc<ManualClocks>>,
    /// When the rate last changed (real milliseconds since origin) and the skewed time
    /// at that moment, so a rate change never makes time jump backwards.
    rate_per_mille: AtomicU64,
    anchor_real_ms: AtomicU64,
    anchor_skewed_ms: AtomicU64,
    /// Forward jumps added by the clock fault knob.
    offset_ms: AtomicI64,
}

impl Clock {
    /// The node's real clock.
    pub fn system() -> Self {
        Self::build(Arc::new(SystemClocks { origin: Instant::now() }), None)
    }

    /// A clock that stands still until `advance` is called (tests).
    pub fn manual() -> Self {
        let manual = Arc::new(ManualClocks { now_ms: AtomicU64::new(0) });
        Self::build(manual.clone(), Some(manual))
    }

    /// A clock on time that something else drives (a simulator's).
    pub fn driven(source: Arc<dyn TimeSource>) -> Self {
        Self::build(source, None)
    }

    fn build(source: Arc<dyn TimeSource>, manual: Option<Arc<ManualClocks>>) -> Self {
        Self {
            inner: Arc::new(ClockInner {
                source,
                manual,
                rate_per_mille: AtomicU64::new(RATE_PER_MILLE_NORMAL),
                anchor_real_ms: AtomicU64::new(0),
                anchor_skewed_ms: AtomicU64::new(0),
                offset_ms: AtomicI64::new(0),
            }),
        }
    }

    fn real_ms(&self) -> u64 {
        self.inner.source.monotonic_ms()
    }

    /// Monotonic milliseconds on this node's clock, with any injected skew.
    pub fn now_ms(&self) -> MonotonicMs {
        let real = self.real_ms();
        let anchor_real = self.inner.anchor_real_ms.load(Ordering::SeqCst);
        let anchor_skewed = self.inner.anchor_skewed_ms.load(Ordering::SeqCst);
        let rate = self.inner.rate_per_mille.load(Ordering::SeqCst);
        let skewed = anchor_skewed + real.saturating_sub(anchor_real) * rate / RATE_PER_MILLE_NORMAL;
        let offset = self.inner.offset_ms.load(Ordering::SeqCst);
        (skewed as i64 + offset).max(0) as u64
    }

    /// Wall-clock milliseconds since the Unix epoch: the stamp a leader puts on an
    /// entry, and what is displayed. Not skewed by the knob.
    pub fn unix_ms(&self) -> u64 {
        self.inner.source.unix_ms()
    }

    /// The machine's boot id (None when it cannot be read); see `TimeSource::boot_id`.
    pub fn boot_id(&self) -> Option<String> {
        self.inner.source.boot_id()
    }

    /// Milliseconds since the machine booted; see `TimeSource::boot_ms`. Never skewed.
    pub fn boot_ms(&self) -> u64 {
        self.inner.source.boot_ms()
    }

    /// Advances a manual clock (tests only).
    pub fn advance(&self, by: Duration) {
        let manual = self.inner.manual.as_ref().expect("advance is for manual clocks");
        manual.now_ms.fetch_add(by.as_millis() as u64, Ordering::SeqCst);
    }

    /// The clock fault knob: from now on this node's time passes at `rate_per_mille`
    /// thousandths of real time, after jumping forward by `jump_ms`.
    pub fn skew(&self, rate_per_mille: u64, jump_ms: u64) {
        assert!(rate_per_mille > 0 && rate_per_mille <= RATE_PER_MILLE_MAX);
        let now_skewed = self.now_ms() as i64 - self.inner.offset_ms.load(Ordering::SeqCst);
        self.inner.anchor_real_ms.store(self.real_ms(), Ordering::SeqCst);
        self.inner.anchor_skewed_ms.store(now_skewed.max(0) as u64, Ordering::SeqCst);
        self.inner.rate_per_mille.store(rate_per_mille, Ordering::SeqCst);
        self.inner.offset_ms.fetch_add(jump_ms as i64, Ordering::SeqCst);
    }
}

/// This machine's CLOCK_MONOTONIC in milliseconds: unlike `Instant`, the same for every
/// process of one boot.
fn boot_monotonic_ms() -> u64 {
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes the timespec it is given; CLOCK_MONOTONIC exists on Linux.
    let result = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    assert_eq!(result, 0, "CLOCK_MONOTONIC is readable");
    now.tv_sec as u64 * 1_000 + now.tv_nsec as u64 / 1_000_000
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_advanced() {
        let clock = Clock::manual();
        assert_eq!(clock.now_ms(), 0);
        clock.advance(Duration::from_millis(1_500));
        assert_eq!(clock.now_ms(), 1_500);
    }

    #[test]
    fn skew_scales_and_jumps_without_going_back() {
        let clock = Clock::manual();
        clock.advance(Duration::from_millis(1_000));
        clock.skew(2 * RATE_PER_MILLE_NORMAL, 500);
        assert_eq!(clock.now_ms(), 1_500);
        clock.advance(Duration::from_millis(100));
        assert_eq!(clock.now_ms(), 1_700);
        clock.skew(RATE_PER_MILLE_NORMAL / 2, 0);
        assert_eq!(clock.now_ms(), 1_700);
        clock.advance(Duration::from_millis(100));
        assert_eq!(clock.now_ms(), 1_750);
    }
}

/// The runtime's monotonic time since the stopwatch was made, in milliseconds: real
/// time in a node, simulated time under a simulator that drives tokio's clock (the
/// time its timers run on); the clock knob does not touch it.
#[derive(Debug, Clone, Copy)]
pub struct Stopwatch {
    started: tokio::time::Instant,
}

impl Stopwatch {
    pub fn start() -> Stopwatch {
        Stopwatch { started: tokio::time::Instant::now() }
    }

    pub fn elapsed_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// The same in microseconds, for what takes less than a millisecond (a round trip
    /// on a local network).
    pub fn elapsed_us(&self) -> u64 {
        self.started.elapsed().as_micros() as u64
    }
}

/// Lets one log line through per interval: refusals are logged, but a client that
/// retries a refused request without end cannot flood the log.
pub struct LogLimiter {
    interval_ms: u64,
    /// When a line was let through last, in ms on `stopwatch` plus `interval_ms` (so
    /// that 0 means never).
    last_ms: AtomicU64,
    stopwatch: Stopwatch,
}

impl LogLimiter {
    pub fn new(interval: Duration) -> LogLimiter {
        LogLimiter {
            interval_ms: interval.as_millis() as u64,
            last_ms: AtomicU64::new(0),
            stopwatch: Stopwatch::start(),
        }
    }

    /// Whether a line may be logged now.
    pub fn allow(&self) -> bool {
        let now_ms = self.stopwatch.elapsed_ms() + self.interval_ms;
        let last = self.last_ms.load(Ordering::Relaxed);
        now_ms >= last + self.interval_ms
            && self.last_ms.compare_exchange(last, now_ms, Ordering::Relaxed, Ordering::Relaxed).is_ok()
    }
}
