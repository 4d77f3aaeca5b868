//! Grants of the names an operator watches (`--watch`), for the alert that a job
//! which must run did not: a singleton cron whose lock nobody took for a week is as
//! bad as one that ran three times.
//!
//! Each watch is a name, or a prefix written `PREFIX*`; the grants of every lock,
//! semaphore permit and election leadership it matches, in every tenant, add up
//! under the watch as written, so the metrics have one series per watch however
//! many names match. A grant's time is its entry's proposal time (the leader's
//! clock), so a node that replays its log after a restart counts the grants since
//! its last snapshot with their own times, not the time of the replay.

use std::sync::Mutex;

/// At most this many watches: the metrics stay a bounded handful of series.
pub const WATCHES_MAX: usize = 100;

/// What one watch has seen on this node since it started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Seen {
    /// Grants applied that the watch matches.
    pub grants: u64,
    /// The proposal time (ms since the Unix epoch) of the latest of them; 0: none.
    pub last_grant_unix_ms: u64,
}

#[derive(Debug)]
enum Pattern {
    Exact(String),
    Prefix(String),
}

impl Pattern {
    fn matches(&self, name: &str) -> bool {
        match self {
            Pattern::Exact(exact) => name == exact,
            Pattern::Prefix(prefix) => name.starts_with(prefix.as_str()),
        }
    }
}

/// The watches and what each has seen; empty when none is configured, and then
/// `granted` costs one check of the length.
#[derive(Debug, Default)]
pub struct WatchedGrants {
    /// (the watch as written, its pattern), in the configured order.
    watches: Vec<(String, Pattern)>,
    seen: Mutex<Vec<Seen>>,
}

impl WatchedGrants {
    /// Watches as the configuration wrote them: validated there (`parse`).
    pub fn new(watches: &[String]) -> WatchedGrants {
        let watches: Vec<(String, Pattern)> = watches
            .iter()
            .map(|watch| {
                let pattern = match watch.strip_suffix('*') {
                    Some(prefix) => Pattern::Prefix(prefix.to_owned()),
                    None => Pattern::Exact(watch.clone()),
                };
                (watch.clone(), pattern)
            })
            .collect();
        let seen = Mutex::new(vec![Seen::default(); watches.len()]);
        WatchedGrants { watches, seen }
    }

    pub fn is_empty(&self) -> bool {
        self.watches.is_empty()
    }

    /// A grant of `name` proposed at `stamp_ms`: counted under every watch it matches.
    pub fn granted(&self, name: &str, stamp_ms: u64) {
        if self.watches.is_empty() {
            return;
        }
        let mut seen = self.seen.lock().unwrap();
        for ((_, pattern), seen) in self.watches.iter().zip(seen.iter_mut()) {
            if pattern.matches(name) {
                seen.grants += 1;
                seen.last_grant_unix_ms = seen.last_grant_unix_ms.max(stamp_ms);
            }
        }
    }

    /// Every watch as written, with what it has seen.
    pub fn snapshot(&self) -> Vec<(String, Seen)> {
        let seen = self.seen.lock().unwrap();
        self.watches.iter().map(|(watch, _)| watch.clone()).zip(seen.iter().copied()).collect()
    }
}

/// Checks the configured watches: not empty, at most `name_bytes_max` bytes before
/// an optional final `*`, no `*` elsewhere, none twice, at most `WATCHES_MAX`.
pub fn parse(watches: &[String], name_bytes_max: usize) -> Result<Vec<String>, String> {
    if watches.len() > WATCHES_MAX {
        return Err(format!("--watch is given {} times; at most {WATCHES_MAX} (WATCHES_MAX)", watches.len()));
    }
    let mut parsed: Vec<String> = Vec::with_capacity(watches.len());
    for watch in watches {
        let body = watch.strip_suffix('*').unwrap_or(watch);
        if watch.is_empty() {
            return Err("--watch: an empty name (a prefix is written PREFIX*)".to_string());
        }
        if body.contains('*') {
            return Err(format!("--watch {watch:?}: '*' may only end a prefix, as in cron/*"));
        }
        if body.len() > name_bytes_max {
            return Err(format!("--watch: {} bytes is longer than any name ({name_bytes_max} bytes)", body.len()));
        }
        if parsed.contains(watch) {
            return Err(format!("--watch {watch:?} is given twice"));
        }
        parsed.push(watch.clone());
    }
    Ok(parsed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_prefixes_count_their_grants_with_the_latest_time() {
        let watched = WatchedGrants::new(&["weekly-report".to_string(), "cron/*".to_string(), "*".to_string()]);
        watched.granted("weekly-report", 2_000);
        watched.granted("weekly-report", 1_000);
        watched.granted("cron/a", 5_000);
        watched.granted("cron/b", 4_000);
        watched.granted("weekly-report-2", 9_000);
        let seen = watched.snapshot();
        assert_eq!(seen[0], ("weekly-report".to_string(), Seen { grants: 2, last_grant_unix_ms: 2_000 }));
        assert_eq!(seen[1], ("cron/*".to_string(), Seen { grants: 2, last_grant_unix_ms: 5_000 }));
        assert_eq!(seen[2], ("*".to_string(), Seen { grants: 5, last_grant_unix_ms: 9_000 }), "* matches all");
        assert!(WatchedGrants::new(&[]).is_empty());
    }

    #[test]
    fn bad_watches_are_refused_with_the_rule() {
        let parse = |watches: &[&str]| parse(&watches.iter().map(|watch| watch.to_string()).collect::<Vec<_>>(), 16);
        assert_eq!(parse(&["a", "b/*"]), Ok(vec!["a".to_string(), "b/*".to_string()]));
        assert!(parse(&[""]).unwrap_err().contains("empty"));
        assert!(parse(&["a*b"]).unwrap_err().contains("may only end"));
        assert!(parse(&["a", "a"]).unwrap_err().contains("twice"));
        assert!(parse(&[&"x".repeat(17)]).unwrap_err().contains("longer than any name"));
        let many: Vec<String> = (0..=WATCHES_MAX).map(|index| index.to_string()).collect();
        assert!(super::parse(&many, 16).unwrap_err().contains("at most"));
    }
}
