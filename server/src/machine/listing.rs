//! Bounded listings of the whole state for the status page: a page of locks,
//! semaphores, elections or sessions, filtered by a search text, with the counts that
//! say how many there are in all.
//!
//! A listing never copies more than one page: without a search it walks the tables
//! in their order from `offset` on and stops after `limit` rows; with one it walks the
//! whole table once to count the matches (10,000 locks or 100,000 sessions take a few
//! milliseconds) and copies only the page.

use super::session::Role;
use super::view::{ElectionView, LockView, SemaphoreView};
use super::{ResourceKind, SessionId, StateMachine};

/// What a search matches: a row whose name, tenant or client name contains `text`
/// (ASCII case ignored). Empty matches every row.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Search {
    lowercase: String,
}

impl Search {
    pub fn new(text: &str) -> Search {
        Search { lowercase: text.trim().to_ascii_lowercase() }
    }

    pub fn is_empty(&self) -> bool {
        self.lowercase.is_empty()
    }

    /// Whether any of `fields` contains the text.
    pub fn matches(&self, fields: &[&str]) -> bool {
        self.is_empty() || fields.iter().any(|field| contains_ignoring_case(field, &self.lowercase))
    }

    /// Whether the text is `id` in decimal (a session is searched for by its id).
    pub fn is_id(&self, id: u64) -> bool {
        self.lowercase.parse::<u64>() == Ok(id)
    }
}

fn contains_ignoring_case(haystack: &str, lowercase_needle: &str) -> bool {
    let needle = lowercase_needle.as_bytes();
    if needle.len() > haystack.len() {
        return false;
    }
    haystack.as_bytes().windows(needle.len()).any(|window| window.eq_ignore_ascii_case(needle))
}

/// One page of a table: its rows, and how many rows the table and the search have.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listing<T> {
    /// Rows in the table, searched or not.
    pub total: usize,
    /// Rows the search matches (`total` without a search).
    pub matched: usize,
    /// The matching rows from `offset` on, at most `limit`.
    pub rows: Vec<T>,
}

/// The most holders and waiters a listed row copies of each queue; the row counts
/// the rest.
pub const LISTED_PER_QUEUE_MAX: usize = 20;

/// A row of a listing that lives in a tenant's namespace. Its view lists at most
/// `LISTED_PER_QUEUE_MAX` holders and waiters, first first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InTenant<T> {
    pub tenant: String,
    pub view: T,
    /// Holders in all (1 for a lock and an election).
    pub holders: usize,
    /// Waiters in all.
    pub waiters: usize,
}

/// A live session, as the status page lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionRow {
    pub id: SessionId,
    pub tenant: String,
    pub client_name: String,
    pub ttl_ms: u64,
    /// Locks, permits and leaderships held.
    pub holds: usize,
    /// Locks, semaphores and elections waited on.
    pub waits: usize,
}

/// Walks `rows`, counting the ones `search` matches (by `matches`) and making the
/// ones on the page. Without a search, stops once the page is full.
fn page<Row, T>(
    rows: impl Iterator<Item = Row>,
    total: usize,
    search: &Search,
    (offset, limit): (usize, usize),
    matches: impl Fn(&Row) -> bool,
    make: impl Fn(Row) -> T,
) -> Listing<T> {
    let mut listing = Listing { total, matched: 0, rows: Vec::with_capacity(limit.min(total)) };
    for row in rows {
        if !search.is_empty() && !matches(&row) {
            continue;
        }
        if listing.matched >= offset && listing.rows.len() < limit {
            listing.rows.push(make(row));
        }
        listing.matched += 1;
        if search.is_empty() && listing.rows.len() == limit {
            break;
        }
    }
    if search.is_empty() {
        listing.matched = total;
    }
    listing
}

impl StateMachine {
    /// Held (or held-back) locks ordered by tenant and name.
    pub fn list_locks(&self, search: &Search, offset: usize, limit: usize) -> Listing<InTenant<LockView>> {
        let rows = self.namespaces.iter().flat_map(|(tenant, namespace)| {
            namespace.locks.keys().map(move |name| (*tenant, self.tenant_name(*tenant), &**name))
        });
        page(
            rows,
            self.lock_count(),
            search,
            (offset, limit),
            |(_, tenant, name)| search.matches(&[tenant, name]),
            |(tenant, tenant_name, name)| {
                let lock = &self.namespace(tenant).locks[name];
                let view = LockView {
                    name: name.to_owned(),
                    holder: self.holder_view(tenant, ResourceKind::Lock, name, &lock.holder),
                    waiters: self.waiter_views(lock.waiters.iter().copied().take(LISTED_PER_QUEUE_MAX)),
                };
                InTenant { tenant: tenant_name.to_owned(), view, holders: 1, waiters: lock.waiters.len() }
            },
        )
    }

    /// Semaphores with holders or waiters, ordered by tenant and name.
    pub fn list_semaphores(&self, search: &Search, offset: usize, limit: usize) -> Listing<InTenant<SemaphoreView>> {
        let rows = self.namespaces.iter().flat_map(|(tenant, namespace)| {
            namespace.semaphores.keys().map(move |name| (*tenant, self.tenant_name(*tenant), name.as_str()))
        });
        page(
            rows,
            self.semaphore_count(),
            search,
            (offset, limit),
            |(_, tenant, name)| search.matches(&[tenant, name]),
            |(tenant, tenant_name, name)| {
                let semaphore = &self.namespace(tenant).semaphores[name];
                let view = SemaphoreView {
                    name: name.to_owned(),
                    limit: semaphore.limit,
                    holders: (semaphore.holders.iter().take(LISTED_PER_QUEUE_MAX))
                        .map(|holder| self.holder_view(tenant, ResourceKind::Semaphore, name, holder))
                        .collect(),
                    waiters: self.waiter_views(semaphore.waiters.iter().copied().take(LISTED_PER_QUEUE_MAX)),
                };
                let (holders, waiters) = (semaphore.holders.len(), semaphore.waiters.len());
                InTenant { tenant: tenant_name.to_owned(), view, holders, waiters }
            },
        )
    }

    /// Elections with a leader, ordered by tenant and name.
    pub fn list_elections(&self, search: &Search, offset: usize, limit: usize) -> Listing<InTenant<ElectionView>> {
        let rows = self.namespaces.iter().flat_map(|(tenant, namespace)| {
            namespace.elections.keys().map(move |name| (*tenant, self.tenant_name(*tenant), name.as_str()))
        });
        page(
            rows,
            self.election_count(),
            search,
            (offset, limit),
            |(_, tenant, name)| search.matches(&[tenant, name]),
            |(tenant, tenant_name, name)| {
                let election = &self.namespace(tenant).elections[name];
                let view = ElectionView {
                    name: name.to_owned(),
                    leader: self.leader_view(tenant, name).expect("a stored election has a leader"),
                    waiters: self
                        .waiter_views(election.waiters.iter().map(|waiter| waiter.session).take(LISTED_PER_QUEUE_MAX)),
                };
                InTenant { tenant: tenant_name.to_owned(), view, holders: 1, waiters: election.waiters.len() }
            },
        )
    }

    /// Live sessions ordered by id (oldest first). A search matches the client name,
    /// the tenant or the id.
    pub fn list_sessions(&self, search: &Search, offset: usize, limit: usize) -> Listing<SessionRow> {
        let rows = self.sessions.values().map(|session| (session, self.tenant_name(session.tenant)));
        page(
            rows,
            self.session_count(),
            search,
            (offset, limit),
            |(session, tenant)| search.is_id(session.id) || search.matches(&[&session.client_name, tenant]),
            |(session, tenant)| SessionRow {
                id: session.id,
                tenant: tenant.to_owned(),
                client_name: session.client_name.to_string(),
                ttl_ms: session.ttl_ms(),
                holds: session.held.len() + session.claims.iter().filter(|claim| claim.role == Role::Holds).count(),
                waits: session.waiting.len() + session.claims.iter().filter(|claim| claim.role == Role::Waits).count(),
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_search_ignores_ascii_case_and_matches_any_field() {
        let search = Search::new("  Orders/4 ");
        assert!(search.matches(&["billing", "orders/42", ""]));
        assert!(search.matches(&["ORDERS/4", "", ""]));
        assert!(!search.matches(&["orders/", "tenant", "client"]));
        assert!(Search::new("").matches(&["", "", ""]));
    }

    #[test]
    fn a_page_counts_every_match_and_copies_only_its_rows() {
        let rows = ["a1", "b1", "a2", "b2", "a3", "a4"];
        let list = |text: &str, offset, limit| {
            let search = Search::new(text);
            page(rows.into_iter(), 6, &search, (offset, limit), |row| search.matches(&[row]), str::to_owned)
        };
        assert_eq!(list("a", 1, 2), Listing { total: 6, matched: 4, rows: vec!["a2".to_owned(), "a3".to_owned()] });
        assert_eq!(list("", 4, 10), Listing { total: 6, matched: 6, rows: vec!["a3".to_owned(), "a4".to_owned()] });
        assert_eq!(list("b", 5, 10), Listing { total: 6, matched: 2, rows: vec![] });
    }
}
