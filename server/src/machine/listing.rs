//! Bounded listings of the whole state for the status page: a page of locks,
//! semaphores, elections or sessions, filtered by a search text, with the counts that
//! say how many there are in all.
//!
//! A listing never copies more than one page: without a search it walks the tables
//! in their order from `offset` on and stops after `limit` rows; with one it walks the
//! whole table once to count the matches and copies only the page. A walk goes in
//! steps of a bounded number of rows (`Walk`), so that its caller can let go of the
//! state's lock between them: the walk of 100,000 sessions takes milliseconds, and
//! the applier must not wait that long.

use std::cell::RefCell;

use std::borrow::Borrow;
use std::collections::BTreeMap;
use std::ops::Bound;

use super::caller::TenantId;
use super::session::Role;
use super::tenant::Namespace;
use super::view::{ElectionView, LockView, SemaphoreView};
use super::{ResourceKind, SessionId, StateMachine};

/// What a search matches: a row whose name, tenant or client name contains `text`
/// (ASCII case ignored), or a session whose id it is. Empty matches every row.
#[derive(Debug, Default)]
pub struct Search {
    lowercase: String,
    /// The text as a session id, when it is a number.
    id: Option<u64>,
    /// A field lowercased, reused from row to row: a search of 100,000 sessions
    /// allocates nothing per row.
    field: RefCell<String>,
}

impl Search {
    pub fn new(text: &str) -> Search {
        let lowercase = text.trim().to_ascii_lowercase();
        Search { id: lowercase.parse().ok(), lowercase, field: RefCell::default() }
    }

    pub fn is_empty(&self) -> bool {
        self.lowercase.is_empty()
    }

    /// Whether any of `fields` contains the text.
    pub fn matches(&self, fields: &[&str]) -> bool {
        if self.is_empty() {
            return true;
        }
        let mut lowered = self.field.borrow_mut();
        fields.iter().filter(|field| field.len() >= self.lowercase.len()).any(|field| {
            lowered.clear();
            lowered.push_str(field);
            lowered.make_ascii_lowercase();
            lowered.contains(self.lowercase.as_str())
        })
    }

    /// Whether the text is `id` in decimal (a session is searched for by its id).
    pub fn is_id(&self, id: u64) -> bool {
        self.id == Some(id)
    }
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

/// A listing in progress: a walk of one table that may stop after some rows and go
/// on later, so that the caller can let go of the state's lock in between (a search
/// walks every row).
#[derive(Debug)]
pub struct Walk<T> {
    listing: Listing<T>,
    offset: usize,
    limit: usize,
    resume: Resume,
}

/// Where a walk goes on.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Resume {
    Start,
    /// At this session (ids are the session table's order).
    Session(SessionId),
    /// At this tenant's row of this name (tenant, then name: the namespace tables'
    /// order).
    Name(TenantId, String),
    Done,
}

impl<T> Walk<T> {
    /// A walk for the matching rows from `offset` on, at most `limit`.
    pub fn new(offset: usize, limit: usize) -> Walk<T> {
        Walk { listing: Listing { total: 0, matched: 0, rows: Vec::new() }, offset, limit, resume: Resume::Start }
    }

    pub fn is_done(&self) -> bool {
        self.resume == Resume::Done
    }

    pub fn into_listing(self) -> Listing<T> {
        self.listing
    }

    /// Walks on over `rows` (from where the walk stopped), counting the ones `search`
    /// matches (by `matches`) and making the ones on the page, for at most `scan_max`
    /// rows. Without a search, the walk ends once the page is full.
    #[allow(clippy::too_many_arguments)]
    fn step<Row>(
        &mut self,
        rows: impl Iterator<Item = Row>,
        total: usize,
        search: &Search,
        scan_max: usize,
        resume_at: impl Fn(&Row) -> Resume,
        matches: impl Fn(&Row) -> bool,
        make: impl Fn(Row) -> T,
    ) {
        let listing = &mut self.listing;
        listing.total = total;
        let scan_max = scan_max.max(1);
        let mut scanned = 0;
        for row in rows {
            if scanned == scan_max {
                self.resume = resume_at(&row);
                return;
            }
            scanned += 1;
            if !search.is_empty() && !matches(&row) {
                continue;
            }
            if listing.matched >= self.offset && listing.rows.len() < self.limit {
                listing.rows.push(make(row));
            }
            listing.matched += 1;
            if search.is_empty() && listing.rows.len() == self.limit {
                break;
            }
        }
        if search.is_empty() {
            listing.matched = total;
        }
        self.resume = Resume::Done;
    }
}

/// A walk of a whole table in one step, for tests.
#[cfg(test)]
pub fn list_all<T>(offset: usize, limit: usize, step: impl Fn(&mut Walk<T>)) -> Listing<T> {
    let mut walk = Walk::new(offset, limit);
    while !walk.is_done() {
        step(&mut walk);
    }
    walk.into_listing()
}

type NamedRow<'a> = (TenantId, &'a str, &'a str);

impl StateMachine {
    /// The rows of one of the namespace tables (`table` picks it) from `resume` on:
    /// tenant id, tenant name, name.
    fn named_rows<'a, K, V: 'a>(
        &'a self,
        resume: &'a Resume,
        table: impl Fn(&'a Namespace) -> &'a BTreeMap<K, V> + 'a,
    ) -> impl Iterator<Item = NamedRow<'a>> + 'a
    where
        K: Borrow<str> + Ord + 'a,
    {
        let (first_tenant, first_name) = match resume {
            Resume::Name(tenant, name) => (Bound::Included(*tenant), Some((*tenant, name.as_str()))),
            _ => (Bound::Unbounded, None),
        };
        self.namespaces.range((first_tenant, Bound::Unbounded)).flat_map(move |(tenant, namespace)| {
            let from = match first_name {
                Some((first, name)) if first == *tenant => Bound::Included(name),
                _ => Bound::Unbounded,
            };
            let tenant_name = self.tenant_name(*tenant);
            table(namespace)
                .range::<str, _>((from, Bound::Unbounded))
                .map(move |(name, _)| (*tenant, tenant_name, name.borrow()))
        })
    }

    /// Held (or held-back) locks ordered by tenant and name: one step of `walk`.
    pub fn list_locks(&self, search: &Search, walk: &mut Walk<InTenant<LockView>>, scan_max: usize) {
        let resume = walk.resume.clone();
        walk.step(
            self.named_rows(&resume, |namespace| &namespace.locks),
            self.lock_count(),
            search,
            scan_max,
            |(tenant, _, name)| Resume::Name(*tenant, name.to_string()),
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

    /// Semaphores with holders or waiters, ordered by tenant and name: one step of
    /// `walk`.
    pub fn list_semaphores(&self, search: &Search, walk: &mut Walk<InTenant<SemaphoreView>>, scan_max: usize) {
        let resume = walk.resume.clone();
        walk.step(
            self.named_rows(&resume, |namespace| &namespace.semaphores),
            self.semaphore_count(),
            search,
            scan_max,
            |(tenant, _, name)| Resume::Name(*tenant, name.to_string()),
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

    /// Elections with a leader, ordered by tenant and name: one step of `walk`.
    pub fn list_elections(&self, search: &Search, walk: &mut Walk<InTenant<ElectionView>>, scan_max: usize) {
        let resume = walk.resume.clone();
        walk.step(
            self.named_rows(&resume, |namespace| &namespace.elections),
            self.election_count(),
            search,
            scan_max,
            |(tenant, _, name)| Resume::Name(*tenant, name.to_string()),
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

    /// Live sessions ordered by id (oldest first): one step of `walk`. A search
    /// matches the client name, the tenant or the id.
    pub fn list_sessions(&self, search: &Search, walk: &mut Walk<SessionRow>, scan_max: usize) {
        let first = match walk.resume {
            Resume::Session(first) => first,
            _ => SessionId::MIN,
        };
        let rows = self.sessions.range(first..).map(|(_, session)| (session, self.tenant_name(session.tenant)));
        walk.step(
            rows,
            self.session_count(),
            search,
            scan_max,
            |(session, _)| Resume::Session(session.id),
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
    fn a_page_counts_every_match_and_copies_only_its_rows_in_any_steps() {
        let rows = ["a1", "b1", "a2", "b2", "a3", "a4"];
        let walk_in_steps = |text: &str, offset, limit, scan_max: usize| {
            let search = Search::new(text);
            list_all(offset, limit, |walk: &mut Walk<String>| {
                let from = match walk.resume {
                    Resume::Start => 0,
                    Resume::Session(at) => at as usize,
                    _ => unreachable!("a test walk resumes at a row number"),
                };
                let numbered = rows.iter().enumerate().skip(from);
                walk.step(
                    numbered,
                    6,
                    &search,
                    scan_max,
                    |(at, _)| Resume::Session(*at as u64),
                    |(_, row)| search.matches(&[row]),
                    |(_, row)| row.to_string(),
                )
            })
        };
        for scan_max in 1..=7 {
            let list = |text: &str, offset, limit| walk_in_steps(text, offset, limit, scan_max);
            assert_eq!(list("a", 1, 2), Listing { total: 6, matched: 4, rows: vec!["a2".to_owned(), "a3".to_owned()] });
            assert_eq!(list("", 4, 10), Listing { total: 6, matched: 6, rows: vec!["a3".to_owned(), "a4".to_owned()] });
            assert_eq!(list("b", 5, 10), Listing { total: 6, matched: 2, rows: vec![] });
        }
    }
}
