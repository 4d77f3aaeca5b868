//! How long semaphore acquires waited before they were granted, per semaphore: kept
//! by the node that answered the acquire, rendered by the metrics endpoint.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::Duration;

/// Upper bounds of the semaphore wait-time histogram buckets, in seconds.
pub const WAIT_BUCKETS_SECONDS: [f64; 12] = [0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 60.0];
/// Semaphores with their own wait histogram at most; waits on others are counted
/// under the name "_other", so a flood of names cannot grow memory without bound.
pub const WAIT_HISTOGRAM_NAMES_MAX: usize = 1_000;

#[derive(Default, Clone)]
struct Histogram {
    buckets: [u64; WAIT_BUCKETS_SECONDS.len()],
    count: u64,
    sum_seconds: f64,
}

/// How long semaphore acquires waited before they were granted, per semaphore: the
/// figure to alert on when one tenant waits too long.
/// A semaphore: its tenant's name and its own.
type Key = (String, String);

#[derive(Default)]
pub struct WaitHistograms {
    by_name: Mutex<BTreeMap<Key, Histogram>>,
}

impl WaitHistograms {
    pub fn record(&self, tenant: &str, name: &str, waited: Duration) {
        let mut by_name = self.by_name.lock().unwrap();
        let mut key = (tenant.to_string(), name.to_string());
        if !by_name.contains_key(&key) && by_name.len() >= WAIT_HISTOGRAM_NAMES_MAX {
            key = (String::new(), "_other".to_string());
        }
        let histogram = by_name.entry(key).or_default();
        let seconds = waited.as_secs_f64();
        for (bucket, bound) in histogram.buckets.iter_mut().zip(WAIT_BUCKETS_SECONDS) {
            if seconds <= bound {
                *bucket += 1;
            }
        }
        histogram.count += 1;
        histogram.sum_seconds += seconds;
    }

    /// How many of `tenant`'s semaphore `name`'s acquires waited up to each bound of
    /// `WAIT_BUCKETS_SECONDS` (cumulative, as Prometheus counts), and in all.
    pub fn buckets(&self, tenant: &str, name: &str) -> Option<([u64; WAIT_BUCKETS_SECONDS.len()], u64)> {
        let by_name = self.by_name.lock().unwrap();
        let histogram = by_name.get(&(tenant.to_string(), name.to_string()))?;
        Some((histogram.buckets, histogram.count))
    }

    /// Appends the histograms in Prometheus' text format.
    pub fn render(&self, text: &mut String) {
        let name = "leasehold_semaphore_wait_seconds";
        let _ = writeln!(
            text,
            "# HELP {name} Time semaphore acquires waited before they were granted.\n# TYPE {name} histogram"
        );
        for ((tenant, semaphore), histogram) in self.by_name.lock().unwrap().iter() {
            let labels = format!("tenant=\"{}\",semaphore=\"{}\"", escape_label(tenant), escape_label(semaphore));
            for (count, bound) in histogram.buckets.iter().zip(WAIT_BUCKETS_SECONDS) {
                let _ = writeln!(text, "{name}_bucket{{{labels},le=\"{bound}\"}} {count}");
            }
            let _ = writeln!(text, "{name}_bucket{{{labels},le=\"+Inf\"}} {}", histogram.count);
            let _ = writeln!(text, "{name}_sum{{{labels}}} {}", histogram.sum_seconds);
            let _ = writeln!(text, "{name}_count{{{labels}}} {}", histogram.count);
        }
    }
}

/// A Prometheus label value with its quotes, backslashes and newlines escaped.
pub fn escape_label(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}
