//! Grants of the names an operator watches (`--watch`), for the alert that a job
//! which must run did not: a singleton cron whose lock nobody took for a week is as
//! bad as one that ran three times.
//!
//! Each watch names a tenant and a name, or a prefix written `PREFIX*`:
//! `TENANT:NAME` (`admin:NAME` for the admin's namespace). The grants of every lock,
//! semaphore permit and election leadership of that tenant it matches add up under
//! the watch as written, so the metrics have one series per watch however many names
//! match. Another tenant's grant of the same name is not counted: it must not keep
//! the alert of a job that did not run silent. A grant's time is its entry's proposal time (the leader's
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
    /// (the watch as written, its tenant's name, its pattern), in the configured order.
    watches: Vec<(String, String, Pattern)>,
    seen: Mutex<Vec<Seen>>,
}

impl WatchedGrants {
    /// Watches as the configuration wrote them: validated there (`parse`).
    pub fn new(watches: &[String]) -> WatchedGrants {
        let watches: Vec<(String, String, Pattern)> = watches
            .iter()
            .map(|watch| {
                let (tenant, name) = watch.split_once(':').expect("`parse` checked that a watch names its tenant");
                let pattern = match name.strip_suffix('*') {
                    Some(prefix) => Pattern::Prefix(prefix.to_owned()),
                    None => Pattern::Exact(name.to_owned()),
                };
                (watch.clone(), tenant.to_owned(), pattern)
            })
            .collect();
        let seen = Mutex::new(vec![Seen::default(); watches.len()]);
        WatchedGrants { watches, seen }
    }

    pub fn is_empty(&self) -> bool {
        self.watches.is_empty()
    }

    /// A grant of `name` in the namespace of the tenant named `tenant`, proposed at
    /// `stamp_ms`: counted under every watch it matches.
    pub fn granted(&self, tenant: &str, name: &str, stamp_ms: u64) {
        if self.watches.is_empty() {
            return;
        }
        let mut seen = self.seen.lock().unwrap();
        for ((_, watched_tenant, pattern), seen) in self.watches.iter().zip(seen.iter_mut()) {
            if watched_tenant == tenant && pattern.matches(name) {
                seen.grants += 1;
                seen.last_grant_unix_ms = seen.last_grant_unix_ms.max(stamp_ms);
            }
        }
    }

    /// Every watch as written, with what it has seen.
    pub fn snapshot(&self) -> Vec<(String, Seen)> {
        let seen = self.seen.lock().unwrap();
        self.watches.iter().map(|(watch, _, _)| watch.clone()).zip(seen.iter().copied()).collect()
    }
}

/// Checks the configured watches: `TENANT:NAME`, the tenant a valid tenant name
/// (`valid_tenant`) or `admin`, the name not empty, at most `name_bytes_max` bytes
/// before an optional final `*`, no `*` elsewhere, none twice, at most `WATCHES_MAX`.
pub fn parse(
    watches: &[String],
    name_bytes_max: usize,
    valid_tenant: impl Fn(&str) -> bool,
) -> Result<Vec<String>, String> {
    if watches.len() > WATCHES_MAX {
        return Err(format!("--watch is given {} times; at most {WATCHES_MAX} (WATCHES_MAX)", watches.len()));
    }
    let mut parsed: Vec<String> = Vec::with_capacity(watches.len());
    for watch in watches {
        let Some((tenant, name)) = watch.split_once(':') else {
            return Err(format!(
                "--watch {watch:?} names no tenant: write TENANT:NAME (e.g. payments:{watch}, or admin:{watch} for \
                 the admin's namespace), so that another tenant's lock of the name does not count"
            ));
        };
        if !valid_tenant(tenant) {
            return Err(format!("--watch {watch:?}: {tenant:?} is not a tenant name"));
        }
        let body = name.strip_suffix('*').unwrap_or(name);
        if name.is_empty() {
            return Err(format!("--watch {watch:?}: an empty name (a prefix is written PREFIX*)"));
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
    fn names_and_prefixes_count_their_tenants_grants_with_the_latest_time() {
        let watches = ["ops:weekly-report", "ops:cron/*", "ops:*", "admin:weekly-report"].map(String::from);
        let watched = WatchedGrants::new(&watches);
        watched.granted("ops", "weekly-report", 2_000);
        watched.granted("ops", "weekly-report", 1_000);
        watched.granted("ops", "cron/a", 5_000);
        watched.granted("ops", "cron/b", 4_000);
        watched.granted("ops", "weekly-report-2", 9_000);
        watched.granted("other", "weekly-report", 10_000);
        let seen = watched.snapshot();
        assert_eq!(seen[0], ("ops:weekly-report".to_string(), Seen { grants: 2, last_grant_unix_ms: 2_000 }));
        assert_eq!(seen[1], ("ops:cron/*".to_string(), Seen { grants: 2, last_grant_unix_ms: 5_000 }));
        assert_eq!(seen[2], ("ops:*".to_string(), Seen { grants: 5, last_grant_unix_ms: 9_000 }), "* matches all");
        assert_eq!(seen[3], ("admin:weekly-report".to_string(), Seen::default()), "another tenant's grant");
        assert!(WatchedGrants::new(&[]).is_empty());
    }

    #[test]
    fn bad_watches_are_refused_with_the_rule() {
        let tenant = |name: &str| name == "ops" || name == "admin";
        let parse =
            |watches: &[&str]| parse(&watches.iter().map(|watch| watch.to_string()).collect::<Vec<_>>(), 16, tenant);
        assert_eq!(parse(&["ops:a", "admin:b/*"]), Ok(vec!["ops:a".to_string(), "admin:b/*".to_string()]));
        assert!(parse(&["weekly"]).unwrap_err().contains("names no tenant"));
        assert!(parse(&["Ops:a"]).unwrap_err().contains("not a tenant name"));
        assert!(parse(&["ops:"]).unwrap_err().contains("empty"));
        assert!(parse(&["ops:a*b"]).unwrap_err().contains("may only end"));
        assert!(parse(&["ops:a", "ops:a"]).unwrap_err().contains("twice"));
        assert!(parse(&[&format!("ops:{}", "x".repeat(17))]).unwrap_err().contains("longer than any name"));
        let many: Vec<String> = (0..=WATCHES_MAX).map(|index| format!("ops:{index}")).collect();
        assert!(super::parse(&many, 16, tenant).unwrap_err().contains("at most"));
    }
}
