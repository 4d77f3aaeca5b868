//! The round trip to each member, as this node measures it, and whether this node's
//! timings leave room for it.
//!
//! What is timed: the empty AppendEntries a leader sends (heartbeats, and the rounds
//! that confirm its leadership), and a `Ping` probe to every member this node has no
//! fresh round trip to (a follower sends no Raft messages, so it probes the leader and
//! the other followers once a second; a leader's heartbeats leave nothing to probe).
//! Not timed: AppendEntries that carry entries, InstallSnapshot and Vote, whose answers
//! wait for the receiver's fsync and so measure its disk as much as the network.
//!
//! Recording is on the commit path (every heartbeat answer), so it is a few atomic
//! stores into a slot the connection looked up once (`slot`): no lock, no allocation.
//! Readers (the status page, the metrics, `leasehold status`, the probe task) take the
//! median of the last `SAMPLES_KEPT` round trips.
//!
//! openraft 0.9 gives every AppendEntries `heartbeat_ms` to be answered (replication,
//! heartbeats, and the leadership round behind each keepalive and linearizable read),
//! and a Vote `election_timeout_min_ms`. `too_short` says when a measured round trip
//! leaves too little of either; the probe task logs it (`Warnings`) and the metrics
//! show it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use crate::raft::types::{NodeId, Raft};
use crate::shell::clock::Stopwatch;

/// Round trips kept per member; the median is of these.
pub const SAMPLES_KEPT: usize = 16;
/// How often the probe task looks at the members; a member whose last round trip is
/// older than half of it is probed.
pub const PROBE_INTERVAL_MS: u64 = 1_000;
/// A probe not answered within this long is dropped (and not counted).
pub const PROBE_TIMEOUT_MS: u64 = 1_000;
/// Round trips measured before a member's are judged against the timings: the first
/// ones include a connection's set-up (TCP, TLS).
pub const SAMPLES_TO_JUDGE_MIN: u32 = 5;
/// A median older than this is not judged (the member is down or cut off; its old
/// figure says nothing of the network now).
pub const JUDGED_AGE_MS_MAX: u64 = 5 * PROBE_INTERVAL_MS;
/// `heartbeat_ms` should be at least this many round trips: openraft 0.9 gives each
/// AppendEntries `heartbeat_ms` to be answered; one that carries entries also waits
/// for their transfer and the follower's fsync, and the latency has a tail a few
/// times its median. A round trip above a quarter of it leaves too little of the rest:
/// replication and leadership rounds start to time out, and keepalives and
/// linearizable reads with them.
pub const HEARTBEAT_ROUND_TRIPS_MIN: u64 = 4;
/// `election_timeout_min_ms` should be at least this many round trips: a follower must
/// hear the leader within its election timeout (a heartbeat interval, a one-way delay,
/// and room for one late heartbeat), and a Vote gets that long to be answered, the
/// voter's fsync included. With the rule above and an election timeout of three
/// heartbeats (the defaults' ratio) this holds at twelve; it is broken when the two
/// were set close together.
pub const ELECTION_TIMEOUT_ROUND_TRIPS_MIN: u64 = 10;
/// A member whose round trip stays too long for the timings is warned about again at
/// most this often; one that recovers and falls back within it is not warned again.
pub const WARNING_INTERVAL_MS: u64 = 10 * 60 * 1_000;

const _: () = assert!(SAMPLES_TO_JUDGE_MIN as usize <= SAMPLES_KEPT);
const _: () = assert!(HEARTBEAT_ROUND_TRIPS_MIN * 3 >= ELECTION_TIMEOUT_ROUND_TRIPS_MIN);
const _: () = assert!(JUDGED_AGE_MS_MAX > PROBE_INTERVAL_MS + PROBE_TIMEOUT_MS);

/// The round trips to one member. Written by every connection to it (a replication
/// stream, leadership rounds, the probe), read by whoever shows them.
#[derive(Debug, Default)]
pub struct RoundTripSlot {
    /// Round trips in microseconds plus one (0: none yet), written in turn.
    samples_us: [AtomicU32; SAMPLES_KEPT],
    /// Round trips recorded; the next goes to `recorded % SAMPLES_KEPT`.
    recorded: AtomicU64,
    /// When the last was measured, in microseconds on `RoundTrips::started` plus one
    /// (0: never).
    measured_us: AtomicU64,
}

impl RoundTripSlot {
    fn record(&self, round_trip_us: u64, now_us: u64) {
        let sample = round_trip_us.saturating_add(1).min(u64::from(u32::MAX)) as u32;
        let at = self.recorded.fetch_add(1, Ordering::Relaxed) as usize % SAMPLES_KEPT;
        self.samples_us[at].store(sample, Ordering::Relaxed);
        self.measured_us.store(now_us + 1, Ordering::Relaxed);
    }

    /// The recent round trips as of `now_us`; None before the first.
    fn read(&self, now_us: u64) -> Option<RoundTrip> {
        let measured = self.measured_us.load(Ordering::Relaxed);
        let recorded = self.recorded.load(Ordering::Relaxed);
        if measured == 0 || recorded == 0 {
            return None;
        }
        let mut samples = [0u32; SAMPLES_KEPT];
        let mut filled = 0;
        for sample in &self.samples_us {
            let sample = sample.load(Ordering::Relaxed);
            if sample != 0 {
                samples[filled] = sample - 1;
                filled += 1;
            }
        }
        if filled == 0 {
            // The first record is between its count and its store.
            return None;
        }
        let last = self.samples_us[(recorded - 1) as usize % SAMPLES_KEPT].load(Ordering::Relaxed);
        let samples = &mut samples[..filled];
        samples.sort_unstable();
        let median_us = if filled % 2 == 1 {
            u64::from(samples[filled / 2])
        } else {
            (u64::from(samples[filled / 2 - 1]) + u64::from(samples[filled / 2])) / 2
        };
        Some(RoundTrip {
            median_us,
            last_us: if last == 0 { median_us } else { u64::from(last - 1) },
            samples: filled as u32,
            since_ms: now_us.saturating_sub(measured - 1) / 1_000,
        })
    }
}

/// A member's slot, kept by a connection to it.
pub type Slot = Arc<RoundTripSlot>;

/// The round trips to one member as of a moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RoundTrip {
    /// The median of the recent round trips, and the last one.
    pub median_us: u64,
    pub last_us: u64,
    /// How many the median is of (at most `SAMPLES_KEPT`).
    pub samples: u32,
    /// Milliseconds since the last was measured.
    pub since_ms: u64,
}

/// The round trips to every member this node measured.
#[derive(Debug)]
pub struct RoundTrips {
    /// The runtime's time (a simulator's under one), not the clock knob's: a skewed
    /// clock must not make the network look slow.
    started: Stopwatch,
    /// Read-locked when a connection is made (openraft asks for one per leadership
    /// round) and by readers; write-locked only to add a member's slot.
    slots: RwLock<BTreeMap<NodeId, Slot>>,
}

impl Default for RoundTrips {
    fn default() -> RoundTrips {
        RoundTrips { started: Stopwatch::start(), slots: RwLock::default() }
    }
}

impl RoundTrips {
    /// The slot of `node`, for a connection to keep and `record` to write.
    pub fn slot(&self, node: NodeId) -> Slot {
        if let Some(slot) = self.slots.read().unwrap().get(&node) {
            return slot.clone();
        }
        self.slots.write().unwrap().entry(node).or_default().clone()
    }

    /// Now, in microseconds: when a timed message is sent.
    pub fn now_us(&self) -> u64 {
        self.started.elapsed_us()
    }

    /// A timed message sent at `sent_us` (`now_us`) was answered now.
    pub fn record(&self, slot: &RoundTripSlot, sent_us: u64) {
        let now_us = self.now_us();
        slot.record(now_us.saturating_sub(sent_us), now_us);
    }

    /// The round trips to `node`; None if never measured.
    pub fn of(&self, node: NodeId) -> Option<RoundTrip> {
        let slot = self.slots.read().unwrap().get(&node)?.clone();
        slot.read(self.now_us())
    }
}

/// The timings a round trip is judged against (openraft's configuration).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timings {
    pub heartbeat_ms: u64,
    pub election_timeout_min_ms: u64,
}

impl Timings {
    pub fn of(raft: &Raft) -> Timings {
        let config = raft.config();
        Timings { heartbeat_ms: config.heartbeat_interval, election_timeout_min_ms: config.election_timeout_min }
    }
}

/// Which timing a round trip is too long for; at least one is true.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TooShort {
    /// `heartbeat_ms` is under `HEARTBEAT_ROUND_TRIPS_MIN` round trips.
    pub heartbeat: bool,
    /// `election_timeout_min_ms` is under `ELECTION_TIMEOUT_ROUND_TRIPS_MIN` round trips.
    pub election_timeout: bool,
}

/// Whether `timings` leave too little room for a round trip of `round_trip_us`
/// (the median of recent ones: a single late answer is no reason to warn).
pub fn too_short(timings: Timings, round_trip_us: u64) -> Option<TooShort> {
    let too_short = TooShort {
        heartbeat: timings.heartbeat_ms * 1_000 < HEARTBEAT_ROUND_TRIPS_MIN * round_trip_us,
        election_timeout: timings.election_timeout_min_ms * 1_000 < ELECTION_TIMEOUT_ROUND_TRIPS_MIN * round_trip_us,
    };
    (too_short.heartbeat || too_short.election_timeout).then_some(too_short)
}

/// Timings that leave room for a round trip of `round_trip_us`, as the README's
/// "Timings for real networks" gives them: a heartbeat of `HEARTBEAT_ROUND_TRIPS_MIN`
/// round trips, an election timeout of three heartbeats to six, in whole 10 ms; never
/// below the defaults' ratio to each other.
pub fn suggested(round_trip_us: u64) -> (u64, u64, u64) {
    let heartbeat_ms = (HEARTBEAT_ROUND_TRIPS_MIN * round_trip_us).div_ceil(10_000) * 10;
    let election_timeout_min_ms =
        (3 * heartbeat_ms).max((ELECTION_TIMEOUT_ROUND_TRIPS_MIN * round_trip_us).div_ceil(1_000));
    (heartbeat_ms, election_timeout_min_ms, 2 * election_timeout_min_ms)
}

/// What the probe task says about one member after a judgement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Say {
    Nothing,
    /// The timings are too short for its round trip: a warning.
    TooShort,
    /// Its round trip fits the timings again after a warning.
    Fits,
}

/// Per member: whether its round trip was too long at the last judgement, and when
/// that was last warned about. Only the probe task holds it.
#[derive(Debug, Default)]
pub struct Warnings {
    members: BTreeMap<NodeId, Warned>,
}

#[derive(Debug, Default)]
struct Warned {
    /// A warning was logged and no recovery since.
    warned: bool,
    /// When the last warning was logged (milliseconds on the task's stopwatch).
    warned_at_ms: Option<u64>,
}

impl Warnings {
    /// The judgement of `member` at `now_ms`: whether its round trip is too long for
    /// the timings. The first time it is, a warning; while it stays so, again once per
    /// `WARNING_INTERVAL_MS`; after a recovery, a warning again only once
    /// `WARNING_INTERVAL_MS` passed since the last one (a flapping link is not a flood
    /// of lines).
    pub fn judge(&mut self, member: NodeId, too_long: bool, now_ms: u64) -> Say {
        let warned = self.members.entry(member).or_default();
        let may_warn = warned.warned_at_ms.is_none_or(|at_ms| now_ms >= at_ms + WARNING_INTERVAL_MS);
        match (too_long, warned.warned) {
            (true, _) if may_warn => {
                warned.warned = true;
                warned.warned_at_ms = Some(now_ms);
                Say::TooShort
            }
            (false, true) => {
                warned.warned = false;
                Say::Fits
            }
            _ => Say::Nothing,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEFAULTS: Timings = Timings { heartbeat_ms: 50, election_timeout_min_ms: 150 };

    #[test]
    fn a_slot_gives_the_median_and_the_last_of_its_recent_round_trips() {
        let slot = RoundTripSlot::default();
        assert_eq!(slot.read(0), None, "never measured");
        slot.record(300, 1_000);
        assert_eq!(slot.read(3_000), Some(RoundTrip { median_us: 300, last_us: 300, samples: 1, since_ms: 2 }));
        slot.record(100, 2_000);
        let two = slot.read(2_000).unwrap();
        assert_eq!((two.median_us, two.last_us, two.samples, two.since_ms), (200, 100, 2, 0));
        slot.record(5_000, 2_500);
        let three = slot.read(2_500).unwrap();
        assert_eq!((three.median_us, three.last_us, three.samples), (300, 5_000, 3), "one late answer moves no median");
    }

    #[test]
    fn a_slot_keeps_only_the_last_round_trips() {
        let slot = RoundTripSlot::default();
        for round_trip_us in 0..SAMPLES_KEPT as u64 {
            slot.record(10_000 + round_trip_us, round_trip_us);
        }
        for round_trip_us in 0..SAMPLES_KEPT as u64 / 2 + 1 {
            slot.record(round_trip_us, 100);
        }
        let read = slot.read(100).unwrap();
        assert_eq!(read.samples, SAMPLES_KEPT as u32);
        assert_eq!(read.last_us, SAMPLES_KEPT as u64 / 2);
        assert!(read.median_us <= SAMPLES_KEPT as u64 / 2, "the new half and one are the median: {read:?}");
    }

    #[test]
    fn a_round_trip_of_zero_and_one_too_long_for_32_bits_are_kept() {
        let slot = RoundTripSlot::default();
        slot.record(0, 0);
        assert_eq!(slot.read(0).unwrap().median_us, 0, "a round trip under a microsecond is not 'none'");
        slot.record(u64::MAX, 0);
        assert_eq!(slot.read(0).unwrap().last_us, u64::from(u32::MAX) - 1);
    }

    #[test]
    fn members_have_slots_of_their_own() {
        let round_trips = RoundTrips::default();
        assert_eq!(round_trips.of(2), None);
        let slot = round_trips.slot(2);
        assert_eq!(round_trips.of(2), None, "a slot alone is no round trip");
        round_trips.record(&slot, round_trips.now_us());
        assert!(Arc::ptr_eq(&slot, &round_trips.slot(2)), "one slot per member");
        assert_eq!(round_trips.of(2).map(|round_trip| round_trip.samples), Some(1));
        assert_eq!(round_trips.of(3), None);
    }

    #[test]
    fn the_default_timings_fit_a_local_network_and_not_a_continent() {
        assert_eq!(too_short(DEFAULTS, 500), None, "0.5 ms: a data centre");
        assert_eq!(too_short(DEFAULTS, 12_500), None, "12.5 ms: a quarter of the heartbeat, just");
        assert_eq!(too_short(DEFAULTS, 12_501), Some(TooShort { heartbeat: true, election_timeout: false }));
        assert_eq!(too_short(DEFAULTS, 80_000), Some(TooShort { heartbeat: true, election_timeout: true }));
    }

    #[test]
    fn an_election_timeout_close_to_the_heartbeat_is_too_short_on_its_own() {
        let close = Timings { heartbeat_ms: 100, election_timeout_min_ms: 110 };
        assert_eq!(too_short(close, 10_000), None);
        assert_eq!(too_short(close, 11_001), Some(TooShort { heartbeat: false, election_timeout: true }));
    }

    #[test]
    fn the_suggested_timings_pass_the_rule_for_their_round_trip() {
        for round_trip_us in [1, 300, 12_501, 30_000, 80_000, 250_000] {
            let (heartbeat_ms, election_timeout_min_ms, election_timeout_max_ms) = suggested(round_trip_us);
            let timings = Timings { heartbeat_ms, election_timeout_min_ms };
            assert_eq!(too_short(timings, round_trip_us), None, "{round_trip_us} us: {timings:?}");
            assert!(heartbeat_ms < election_timeout_min_ms && election_timeout_min_ms < election_timeout_max_ms);
        }
        assert_eq!(suggested(30_000), (120, 360, 720), "30 ms across a continent");
    }

    #[test]
    fn a_warning_comes_at_once_then_at_most_once_per_interval() {
        let mut warnings = Warnings::default();
        assert_eq!(warnings.judge(2, false, 0), Say::Nothing, "fits from the start: nothing to say");
        assert_eq!(warnings.judge(2, true, 1_000), Say::TooShort, "the first time: at once");
        assert_eq!(warnings.judge(3, true, 1_000), Say::TooShort, "each member on its own");
        assert_eq!(warnings.judge(2, true, 2_000), Say::Nothing, "still too long: not every second");
        assert_eq!(warnings.judge(2, true, 1_000 + WARNING_INTERVAL_MS), Say::TooShort, "still too long, later");
        assert_eq!(warnings.judge(2, false, 2_000 + WARNING_INTERVAL_MS), Say::Fits);
        assert_eq!(warnings.judge(2, false, 3_000 + WARNING_INTERVAL_MS), Say::Nothing);
        assert_eq!(warnings.judge(2, true, 4_000 + WARNING_INTERVAL_MS), Say::Nothing, "flapping: rate-limited");
        assert_eq!(warnings.judge(2, false, 5_000 + WARNING_INTERVAL_MS), Say::Nothing, "no warning, no recovery");
        assert_eq!(warnings.judge(2, true, 1_000 + 2 * WARNING_INTERVAL_MS), Say::TooShort);
    }
}
