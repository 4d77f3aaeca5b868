//! The probe task: pings the members this node has no fresh round trip to (see
//! `round_trips`), and warns when this node's timings are too short for the round
//! trips it measures.

use std::time::Duration;

use tokio::sync::watch;
use tokio::time::MissedTickBehavior;

use crate::raft::network::Network;
use crate::raft::round_trips::{
    suggested, too_short, Say, Timings, Warnings, ELECTION_TIMEOUT_ROUND_TRIPS_MIN, HEARTBEAT_ROUND_TRIPS_MIN,
    JUDGED_AGE_MS_MAX, PROBE_INTERVAL_MS, SAMPLES_TO_JUDGE_MIN,
};
use crate::raft::types::{NodeId, Raft};
use crate::shell::clock::Stopwatch;

/// Probes the members this node has no fresh round trip to, once per
/// `PROBE_INTERVAL_MS`, and judges every member's round trip against this node's
/// timings, until `stopped`.
pub async fn run(raft: Raft, network: Network, mut stopped: watch::Receiver<bool>) {
    let round_trips = network.round_trips().clone();
    let timings = Timings::of(&raft);
    let stopwatch = Stopwatch::start();
    let mut warnings = Warnings::default();
    let mut ticks = tokio::time::interval(Duration::from_millis(PROBE_INTERVAL_MS));
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            _ = stopped.wait_for(|stop| *stop) => return,
        }
        let members: Vec<(NodeId, String)> = {
            let metrics = raft.metrics();
            let metrics = metrics.borrow();
            let me = metrics.id;
            (metrics.membership_config.membership().nodes())
                .filter(|(id, _)| **id != me)
                .map(|(id, node)| (*id, node.peer_addr.clone()))
                .collect()
        };
        let stale = members.iter().filter(|(id, _)| {
            round_trips.of(*id).is_none_or(|round_trip| round_trip.since_ms >= PROBE_INTERVAL_MS / 2)
        });
        let probes = futures::future::join_all(stale.map(|(id, address)| network.probe(*id, address)));
        tokio::select! {
            _ = probes => {}
            _ = stopped.wait_for(|stop| *stop) => return,
        }
        for (member, _) in &members {
            let Some(round_trip) = round_trips.of(*member) else { continue };
            if round_trip.samples < SAMPLES_TO_JUDGE_MIN || round_trip.since_ms > JUDGED_AGE_MS_MAX {
                continue;
            }
            let too_long = too_short(timings, round_trip.median_us);
            match warnings.judge(*member, too_long.is_some(), stopwatch.elapsed_ms()) {
                Say::Nothing => {}
                Say::TooShort => {
                    let too_long = too_long.expect("judged too long");
                    let (heartbeat_ms, election_timeout_min_ms, election_timeout_max_ms) =
                        suggested(round_trip.median_us);
                    tracing::warn!(
                        peer = *member,
                        round_trip_us = round_trip.median_us,
                        samples = round_trip.samples,
                        heartbeat_ms = timings.heartbeat_ms,
                        election_timeout_min_ms = timings.election_timeout_min_ms,
                        heartbeat_too_short = too_long.heartbeat,
                        election_timeout_too_short = too_long.election_timeout,
                        suggested_heartbeat_ms = heartbeat_ms,
                        suggested_election_timeout_min_ms = election_timeout_min_ms,
                        suggested_election_timeout_max_ms = election_timeout_max_ms,
                        "the timings are too short for the round trip to this peer: heartbeat_ms should be at least \
                         {HEARTBEAT_ROUND_TRIPS_MIN} round trips and election_timeout_min_ms at least \
                         {ELECTION_TIMEOUT_ROUND_TRIPS_MIN}, or replication and leadership checks time out (logged \
                         again at most every 10 minutes)"
                    );
                }
                Say::Fits => tracing::info!(
                    peer = *member,
                    round_trip_us = round_trip.median_us,
                    heartbeat_ms = timings.heartbeat_ms,
                    election_timeout_min_ms = timings.election_timeout_min_ms,
                    "the round trip to this peer fits the timings again"
                ),
            }
        }
    }
}
