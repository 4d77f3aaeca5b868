//! What the leader lets each tenant do per second, on its own clock: a tenant's rate
//! quota (`limits::Shares::ops_per_s`, replicated with the tenant) as a token bucket,
//! and the pace of the refusals it answers early.
//!
//! Both are the leader's alone and start afresh with each leader: a new leader lets a
//! tenant have a second's worth of commands at once (the bucket starts full), which a
//! failover cannot turn into more than one extra second's worth.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::raft::tenant_queues::QueueKey;
use crate::shell::clock::MonotonicMs;

/// Commands of one tenant a second the leader refuses early (see
/// `Replica::certain_refusal`) and answers at once; past it, in that second, each
/// such refusal is answered after `EARLY_REFUSAL_PAUSE_MS`. A client that loops on a
/// mistake (closing a session that is gone, releasing with an old token) then loops
/// slower, and leaves the leader's cores to the other tenants; a correct client seldom
/// meets a refusal and never this many.
pub const EARLY_REFUSALS_PER_S_UNPAUSED: u32 = 1_000;
pub const EARLY_REFUSAL_PAUSE_MS: u64 = 250;
/// Tenants counted at once, before those idle for a second are dropped.
const TENANTS_TRACKED_MAX: usize = 1_024;
/// A token of a bucket, in thousandths.
const MILLI: u64 = 1_000;

/// A tenant's token bucket: it holds up to a second's worth of commands and refills
/// at the quota's rate.
#[derive(Debug)]
struct Bucket {
    milli_tokens: u64,
    refilled_at: MonotonicMs,
}

#[derive(Default)]
pub struct TenantRates {
    buckets: Mutex<HashMap<QueueKey, Bucket>>,
    /// Early refusals per tenant in the current second, and when that second began.
    refusals: Mutex<HashMap<QueueKey, (MonotonicMs, u32)>>,
}

impl TenantRates {
    /// Takes one command of `key` at `now` against a quota of `ops_per_s` (0: none):
    /// Ok, or the milliseconds until the bucket has a command again.
    pub fn take(&self, key: QueueKey, ops_per_s: u32, now: MonotonicMs) -> Result<(), u64> {
        if ops_per_s == 0 {
            return Ok(());
        }
        let rate = u64::from(ops_per_s);
        let full = rate * MILLI;
        let mut buckets = self.buckets.lock().unwrap();
        if buckets.len() > TENANTS_TRACKED_MAX {
            buckets.retain(|_, bucket| now.saturating_sub(bucket.refilled_at) < 1_000);
        }
        let bucket = buckets.entry(key).or_insert(Bucket { milli_tokens: full, refilled_at: now });
        // `rate` tokens a second is `rate` thousandths a millisecond.
        let refill = now.saturating_sub(bucket.refilled_at).saturating_mul(rate);
        bucket.milli_tokens = bucket.milli_tokens.saturating_add(refill).min(full);
        bucket.refilled_at = now;
        if bucket.milli_tokens >= MILLI {
            bucket.milli_tokens -= MILLI;
            return Ok(());
        }
        Err((MILLI - bucket.milli_tokens).div_ceil(rate))
    }

    /// Counts an early refusal of `key`'s at `now` and says whether its answer waits
    /// `EARLY_REFUSAL_PAUSE_MS` (the tenant is past `EARLY_REFUSALS_PER_S_UNPAUSED`
    /// this second).
    pub fn refusal_paced(&self, key: QueueKey, now: MonotonicMs) -> bool {
        let mut refusals = self.refusals.lock().unwrap();
        if refusals.len() > TENANTS_TRACKED_MAX {
            refusals.retain(|_, (since, _)| now.saturating_sub(*since) < 1_000);
        }
        let (since, count) = refusals.entry(key).or_insert((now, 0));
        if now.saturating_sub(*since) >= 1_000 {
            *since = now;
            *count = 0;
        }
        *count = count.saturating_add(1);
        *count > EARLY_REFUSALS_PER_S_UNPAUSED
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rate_quota_lets_a_second_s_worth_through_then_its_rate() {
        let rates = TenantRates::default();
        let tenant = Some(7);
        assert!((0..100).all(|_| rates.take(tenant, 100, 0).is_ok()), "a full bucket: a second's worth at once");
        let wait = rates.take(tenant, 100, 0).unwrap_err();
        assert_eq!(wait, 10, "at 100 a second, the next in 10 ms");
        assert!(rates.take(tenant, 100, 9).is_err());
        assert!(rates.take(tenant, 100, 10).is_ok());
        // Over a long run, the rate and not more.
        let taken = (11..=10_010).filter(|ms| rates.take(tenant, 100, *ms).is_ok()).count();
        assert!((999..=1_001).contains(&taken), "{taken} in 10 s at 100 a second");
        assert!(rates.take(Some(8), 100, 10_010).is_ok(), "another tenant has a bucket of its own");
        assert!((0..10_000).all(|_| rates.take(tenant, 0, 10_010).is_ok()), "0 is no quota");
    }

    #[test]
    fn a_slow_rate_asks_for_a_long_wait() {
        let rates = TenantRates::default();
        assert!(rates.take(None, 1, 0).is_ok());
        assert_eq!(rates.take(None, 1, 0), Err(1_000));
        assert_eq!(rates.take(None, 1, 400), Err(600));
    }

    #[test]
    fn early_refusals_past_the_free_ones_of_a_second_are_paced() {
        let rates = TenantRates::default();
        let free = EARLY_REFUSALS_PER_S_UNPAUSED as usize;
        assert!((0..free).all(|_| !rates.refusal_paced(Some(1), 0)));
        assert!(rates.refusal_paced(Some(1), 999));
        assert!(!rates.refusal_paced(Some(2), 999), "another tenant's count is its own");
        assert!(!rates.refusal_paced(Some(1), 1_000), "a new second");
    }
}
