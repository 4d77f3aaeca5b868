//! The lease contract between the client library and the nodes: how often a client
//! sends keepalives, when the leader checkpoints a session as quiet, and the clock
//! allowances on both sides. Both sides read these from here, so that they cannot
//! drift apart; the README's bound on a dead holder is computed from them.
//!
//! A session whose last keepalive the leader received at `t` (by its monotonic clock)
//! is never expired before `t + TTL`. Across leader changes it is expired by
//! `t + TTL + X`, with `X = quiet_after_ms(TTL) + CHECKPOINT_SCAN_MS + TTL ×
//! CLOCK_DRIFT_PPM / 10⁶ + one election + one commit`: a session that went quiet is
//! checkpointed with its remaining time within `quiet_after_ms(TTL) +
//! CHECKPOINT_SCAN_MS` of `t`, and a new leader starts it from that remaining time;
//! one not checkpointed yet is started afresh from the new leader's first moment.

/// Keepalives a client sends per TTL.
pub const KEEPALIVES_PER_TTL: u32 = 6;

/// The leader checkpoints a session that sent no keepalive for this long (more than
/// one keepalive interval, `TTL / KEEPALIVES_PER_TTL`, with room for a late one), so
/// live sessions cost no log write.
pub const fn quiet_after_ms(ttl_ms: u64) -> u64 {
    ttl_ms / QUIET_TTL_DIVISOR + QUIET_SLACK_MS
}
pub const QUIET_TTL_DIVISOR: u64 = 5;
pub const QUIET_SLACK_MS: u64 = 100;
const _: () = assert!(QUIET_TTL_DIVISOR < KEEPALIVES_PER_TTL as u64);

/// How often the leader looks for quiet and expired sessions.
pub const CHECKPOINT_SCAN_MS: u64 = 50;

/// The largest rate difference assumed between two nodes' monotonic clocks, or a
/// node's and a client's, in parts per million. NTP slews a clock by at most 500 ppm;
/// this allows twice that.
pub const CLOCK_DRIFT_PPM: u64 = 1_000;

/// What a client takes off every deadline besides the drift, for timer and scheduling
/// slack on its side.
pub const CLIENT_DEADLINE_MARGIN_MS: u64 = 20;

/// X in the bound above, for a TTL and the time one election takes (from the old
/// leader's loss to the new one's first applied entry): how long past `t + TTL` a
/// session whose last keepalive was received at `t` may live on, whatever leaders
/// change. The commit of the expiry itself comes on top.
pub const fn extension_bound_ms(ttl_ms: u64, election_ms: u64) -> u64 {
    quiet_after_ms(ttl_ms) + CHECKPOINT_SCAN_MS + (with_drift_ms(ttl_ms) - ttl_ms) + election_ms
}

/// `ms` measured on one clock, lengthened so that it is at least that long on another
/// running up to `CLOCK_DRIFT_PPM` faster.
pub const fn with_drift_ms(ms: u64) -> u64 {
    ms + (ms * CLOCK_DRIFT_PPM).div_ceil(1_000_000)
}

/// The part of a lease `granted_ms` long (as the leader measures it, from the moment
/// it received the keepalive) that a client may count on, measured from the moment it
/// sent the keepalive: shortened by the drift and the margin, so that the client gives
/// up before the leader could expire the session.
pub const fn client_lease_ms(granted_ms: u64) -> u64 {
    let drift_ms = (granted_ms * CLOCK_DRIFT_PPM).div_ceil(1_000_000);
    granted_ms.saturating_sub(drift_ms + CLIENT_DEADLINE_MARGIN_MS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_client_always_gives_up_before_the_leader_could_expire() {
        for ttl_ms in [1_000, 8_000, 60_000, 3_600_000] {
            let client_ms = client_lease_ms(ttl_ms);
            // The client's clock may run slow by the drift: its lease, seen on the
            // leader's clock, must still end before the leader's.
            assert!(with_drift_ms(client_ms) < ttl_ms, "TTL {ttl_ms} ms: client {client_ms} ms");
            assert!(client_ms > ttl_ms / 2, "TTL {ttl_ms} ms: the margins take most of the lease");
        }
        assert_eq!(client_lease_ms(3_600_000), 3_600_000 - 3_600 - 20);
    }

    #[test]
    fn the_extension_is_at_most_a_quarter_of_the_ttl_plus_the_election_from_3_1_seconds_up() {
        // Below that the fixed 152 ms (slack, scan) outweigh the twentieth of the TTL
        // between TTL / 5 and TTL / 4.
        assert!(extension_bound_ms(3_000, 600) > 3_000 / 4 + 600);
        for ttl_ms in [3_100, 8_000, 60_000, 3_600_000] {
            assert!(extension_bound_ms(ttl_ms, 600) <= ttl_ms / 4 + 600, "TTL {ttl_ms} ms");
        }
        assert_eq!(extension_bound_ms(8_000, 600), 1_600 + 100 + 50 + 8 + 600);
    }

    #[test]
    fn a_live_session_is_never_quiet() {
        for ttl_ms in [1_000, 8_000, 3_600_000] {
            let interval_ms = ttl_ms / u64::from(KEEPALIVES_PER_TTL);
            assert!(quiet_after_ms(ttl_ms) >= interval_ms + QUIET_SLACK_MS, "TTL {ttl_ms} ms");
        }
    }
}
