//! The invariants of the state: checked by tests after every apply, and by a node on
//! every snapshot it loads (at start, or installed from the leader).

use std::collections::{BTreeMap, BTreeSet};

use super::error::validate_tenant_name;
use super::session::Answer;
use super::session::Role;
use super::{
    RequestId, ResourceKind, SessionId, Shares, StateMachine, TenantId, Usage, ADMIN_TENANT, COMMAND_LEVEL_LOCK_DELAY,
    COMMAND_LEVEL_SHARES,
};
use crate::machine::limits::TENANTS_MAX;
use crate::machine::limits::{
    CLIENT_NAME_BYTES_MAX, ELECTION_VALUE_BYTES_MAX, LOCKS_PER_SESSION_MAX, LOCK_DELAY_MS_MAX, LOCK_NAME_BYTES_MAX,
    REQUESTS_REMEMBERED_PER_SESSION_MAX, SEMAPHORE_LIMIT_MAX, SESSIONS_MAX, SESSION_TTL_MS_MAX, SESSION_TTL_MS_MIN,
    WAITERS_PER_LOCK_MAX,
};

impl StateMachine {
    /// Asserts every invariant of the state, one named check after another.
    ///
    /// # Panics
    ///
    /// Naming the broken invariant, unless the state is consistent.
    ///
    /// Some invariants hold by construction and need no check here: a lock or an
    /// election has a single `holder` or `leader` field, so it cannot have two, and a
    /// free lock or vacant election has no entry, so it cannot keep waiters (the first
    /// waiter is granted when the holder leaves). What can be checked is that no second
    /// session claims to hold it.
    ///
    /// Linear in the size of the state (quadratic in one session's list of locks, which is
    /// bounded): tests call it after every apply, and a node calls it on every snapshot it
    /// loads, before the state serves anything.
    pub fn check_invariants(&self) {
        self.check_sessions();
        self.check_client_names();
        self.check_remembered_answers();
        self.check_lock_table();
        self.check_semaphore_table();
        self.check_election_table();
        self.check_sessions_and_tables_agree();
        self.check_tenants();
        self.check_quiet_sessions();
        self.check_lock_delays();
    }

    /// Lock-delay (see `delay`): every held-back grant sits in its table under its
    /// expired session, which is gone, with a delay in range from an applied entry;
    /// every other holder is a live session; every claim delay belongs to a live
    /// session's hold or wait of that name; and the log used lock-delay if any exists.
    fn check_lock_delays(&self) {
        for (key, held) in &self.held_back {
            assert!(!self.sessions.contains_key(&key.session), "held-back grant {key:?} belongs to a live session");
            assert!(
                (1..=LOCK_DELAY_MS_MAX).contains(&u64::from(held.delay_ms)),
                "held-back grant {key:?} has a delay of {} ms, outside 1..=LOCK_DELAY_MS_MAX",
                held.delay_ms
            );
            assert!(
                self.last_applied.is_some_and(|applied| held.since_index <= applied && held.token < held.since_index),
                "held-back grant {key:?} (token {}) began at {} after the last applied index {:?}, or before its grant",
                held.token,
                held.since_index,
                self.last_applied
            );
            let namespace = self.namespace(key.tenant);
            let in_table = match key.kind {
                ResourceKind::Lock => namespace
                    .locks
                    .get(key.name.as_str())
                    .is_some_and(|lock| lock.holder.session == key.session && lock.holder.token == held.token),
                ResourceKind::Semaphore => namespace.semaphores.get(&key.name).is_some_and(|semaphore| {
                    semaphore.holder(key.session).is_some_and(|holder| holder.token == held.token)
                }),
                ResourceKind::Election => panic!("election grant {key:?} is held back; elections carry no delay"),
            };
            assert!(in_table, "held-back grant {key:?} is not in its table with its token {}", held.token);
        }
        let gone_holders = self
            .namespaces
            .values()
            .flat_map(|namespace| {
                let locks = namespace.locks.values().map(|lock| lock.holder.session);
                let permits =
                    namespace.semaphores.values().flat_map(|semaphore| semaphore.holders.iter()).map(|h| h.session);
                locks.chain(permits)
            })
            .filter(|session| !self.sessions.contains_key(session))
            .count();
        assert_eq!(
            gone_holders,
            self.held_back.len(),
            "{gone_holders} locks and permits are held by gone sessions; {} are held back",
            self.held_back.len()
        );
        for ((session, kind, name), delay_ms) in &self.claim_delays {
            assert!(
                (1..=LOCK_DELAY_MS_MAX).contains(&u64::from(*delay_ms)),
                "session {session}'s claim on {kind:?} {name:?} has a delay of {delay_ms} ms, outside range"
            );
            let live = self
                .sessions
                .get(session)
                .unwrap_or_else(|| panic!("a gone session {session} keeps a delay for {kind:?} {name:?}"));
            let claimed = match kind {
                ResourceKind::Lock => live.held.iter().chain(live.waiting.iter()).any(|listed| listed == name),
                ResourceKind::Semaphore => live
                    .claimed(*kind, Role::Holds)
                    .chain(live.claimed(*kind, Role::Waits))
                    .any(|listed| listed == name),
                ResourceKind::Election => panic!("session {session} keeps a delay for election {name:?}"),
            };
            assert!(
                claimed,
                "session {session} keeps a delay for {kind:?} {name:?}, which it neither holds nor waits on"
            );
        }
        if !self.held_back.is_empty() || !self.claim_delays.is_empty() {
            assert!(
                self.command_level >= COMMAND_LEVEL_LOCK_DELAY,
                "lock-delay is in use but the log's command level is {}",
                self.command_level
            );
        }
        for (tenant, shares) in &self.tenant_shares {
            assert!(self.tenants.contains_key(tenant), "tenant {tenant} has a share but does not exist");
            assert!(*shares != Shares::default(), "tenant {tenant}'s share is the default, kept anyway");
            assert!(self.command_level >= COMMAND_LEVEL_SHARES, "shares are in use below their command level");
        }
    }

    /// Checkpointed sessions: each is live, has no more left than its TTL, and was
    /// checkpointed by an applied entry.
    fn check_quiet_sessions(&self) {
        for (session, (remaining_ms, index)) in &self.quiet {
            assert!(
                self.last_applied.is_some_and(|applied| *index <= applied),
                "checkpointed session {session} names entry {index}, after the last applied {:?}",
                self.last_applied
            );
            let live = self.sessions.get(session).unwrap_or_else(|| panic!("checkpointed session {session} is gone"));
            assert!(
                *remaining_ms <= live.ttl_ms,
                "checkpointed session {session} has {remaining_ms} ms left, more than its TTL of {} ms",
                live.ttl_ms
            );
        }
    }

    /// Tenants: the admin namespace exists; names are valid and distinct; ids are below
    /// the next one; the token index maps exactly the tenants' tokens; every session's
    /// tenant exists; no namespace is empty or a removed tenant's; and each tenant's
    /// usage is what its sessions hold and wait for, each session counted as it is now.
    fn check_tenants(&self) {
        assert!(self.tenants.contains_key(&ADMIN_TENANT), "the admin namespace is missing");
        assert!(self.tenants.len() <= TENANTS_MAX, "{} tenants exceed TENANTS_MAX", self.tenants.len());
        let mut names = BTreeSet::new();
        let mut tokens = BTreeMap::new();
        for (id, tenant) in &self.tenants {
            assert!(*id < self.next_tenant_id, "tenant {id} is not below the next tenant id {}", self.next_tenant_id);
            assert!(names.insert(&*tenant.name), "tenant name {:?} is used twice", tenant.name);
            if *id == ADMIN_TENANT {
                assert!(tenant.token_hash.is_none(), "the admin namespace has a token");
            } else {
                assert!(validate_tenant_name(&tenant.name).is_ok(), "tenant name {:?} breaks the rules", tenant.name);
                let token = tenant.token_hash.unwrap_or_else(|| panic!("tenant {:?} has no token", tenant.name));
                assert!(tokens.insert(token, *id).is_none(), "two tenants share a token");
            }
        }
        assert_eq!(tokens, self.tenants_by_token, "the token index does not map exactly the tenants' tokens");
        for (id, namespace) in &self.namespaces {
            assert!(self.tenants.contains_key(id), "namespace {id} belongs to no tenant");
            assert!(!namespace.is_empty(), "namespace {id} is empty but keeps an entry");
        }
        let mut counted: BTreeMap<TenantId, Usage> = self.tenants.keys().map(|id| (*id, Usage::default())).collect();
        for session in self.sessions.values() {
            let now = session.counted_now();
            assert_eq!(session.counted, now, "session {} is counted for other than it has", session.id);
            let usage = counted.get_mut(&session.tenant).unwrap_or_else(|| {
                panic!("session {} belongs to tenant {}, which does not exist", session.id, session.tenant)
            });
            usage.sessions += 1;
            usage.holds += u32::from(now.holds);
            usage.waiters += u32::from(now.waiters);
            usage.bytes += u64::from(now.bytes);
        }
        for (id, tenant) in &self.tenants {
            assert_eq!(tenant.usage, counted[id], "tenant {:?}'s usage is not what its sessions have", tenant.name);
        }
        let total: u64 = self.tenants.values().map(|tenant| tenant.usage.bytes).sum();
        assert_eq!(self.bytes_total, total, "the state's total bytes are not the tenants' sum");
    }

    /// Sessions: at most `SESSIONS_MAX`, stored under their own id, created at or before
    /// the last applied index, TTL and client name within their limits, at most
    /// `LOCKS_PER_SESSION_MAX` locks, permits and elections; each lock, permit or
    /// leadership a session lists as held or waited on is held by it or has it in its
    /// queue, and none is listed twice.
    fn check_sessions(&self) {
        assert!(self.sessions.len() <= SESSIONS_MAX, "{} sessions exceed SESSIONS_MAX", self.sessions.len());
        let by_tenant: std::collections::BTreeSet<(TenantId, SessionId)> =
            self.sessions.values().map(|session| (session.tenant, session.id)).collect();
        assert_eq!(self.sessions_by_tenant, by_tenant, "the index of sessions by tenant is out of step");
        for (id, session) in &self.sessions {
            assert_eq!(*id, session.id, "session {id} is stored under another id");
            assert!(
                self.last_applied.is_some_and(|last_applied| *id <= last_applied),
                "session {id} was created after the last applied index {:?}",
                self.last_applied
            );
            assert!(
                (SESSION_TTL_MS_MIN..=SESSION_TTL_MS_MAX).contains(&session.ttl_ms()),
                "session {id} has a ttl of {} ms, outside the allowed range",
                session.ttl_ms()
            );
            assert!(
                session.client_name.len() <= CLIENT_NAME_BYTES_MAX,
                "session {id} has a client name over CLIENT_NAME_BYTES_MAX"
            );
            assert!(
                self.client_names
                    .get_key_value(&*session.client_name)
                    .is_some_and(|(shared, _)| shared.same_copy(&session.client_name)),
                "session {id} does not share its client name {:?}",
                session.client_name
            );
            assert!(
                session.resource_count() <= LOCKS_PER_SESSION_MAX,
                "session {id} holds or waits on {} locks, permits and elections, over \
                 LOCKS_PER_SESSION_MAX",
                session.resource_count()
            );
            check_listed_once(*id, &session.held, &session.waiting);
            for name in &session.held {
                let lock = self
                    .namespace(session.tenant)
                    .locks
                    .get(name.as_str())
                    .unwrap_or_else(|| panic!("session {id} lists lock {name:?} as held, but it is free"));
                assert_eq!(
                    lock.holder.session, *id,
                    "session {id} lists lock {name:?} as held, but another session holds it"
                );
            }
            for name in &session.waiting {
                let lock = self
                    .namespace(session.tenant)
                    .locks
                    .get(name.as_str())
                    .unwrap_or_else(|| panic!("session {id} waits on lock {name:?}, which is free"));
                assert!(
                    lock.waiters.contains(id),
                    "session {id} lists lock {name:?} as waited on, but is not in its queue"
                );
            }
            let mut claimed: Vec<(ResourceKind, &str)> =
                session.claims.iter().map(|claim| (claim.kind, claim.name.as_str())).collect();
            claimed.sort_unstable();
            if let Some(pair) = claimed.windows(2).find(|pair| pair[0] == pair[1]) {
                let (kind, name) = pair[0];
                panic!("session {id} lists {kind:?} {name:?} twice, or both holds and waits on it");
            }
            for claim in &session.claims {
                let (kind, name) = (claim.kind, &claim.name);
                match (kind, claim.role) {
                    (ResourceKind::Lock, _) => {
                        panic!("session {id} lists lock {name:?} among its claims")
                    }
                    (ResourceKind::Semaphore, Role::Holds) => {
                        let semaphore = self
                            .namespace(session.tenant)
                            .semaphores
                            .get(name)
                            .unwrap_or_else(|| panic!("session {id} holds a permit of semaphore {name:?}, unused"));
                        assert!(
                            semaphore.holder(*id).is_some(),
                            "session {id} lists a permit of semaphore {name:?} it does not hold"
                        );
                    }
                    (ResourceKind::Semaphore, Role::Waits) => {
                        let semaphore = self
                            .namespace(session.tenant)
                            .semaphores
                            .get(name)
                            .unwrap_or_else(|| panic!("session {id} waits on semaphore {name:?}, unused"));
                        assert!(
                            semaphore.waiter_position(*id).is_some(),
                            "session {id} lists semaphore {name:?} as waited on, but is not \
                             in its queue"
                        );
                    }
                    (ResourceKind::Election, Role::Holds) => {
                        let election =
                            self.namespace(session.tenant).elections.get(name).unwrap_or_else(|| {
                                panic!("session {id} lists election {name:?} as led, but it is vacant")
                            });
                        assert_eq!(
                            election.leader.session, *id,
                            "session {id} lists election {name:?} as led, but another session \
                             leads it"
                        );
                    }
                    (ResourceKind::Election, Role::Waits) => {
                        let election =
                            self.namespace(session.tenant).elections.get(name).unwrap_or_else(|| {
                                panic!("session {id} campaigns in election {name:?}, which is vacant")
                            });
                        assert!(
                            election.waiter_position(*id).is_some(),
                            "session {id} lists election {name:?} as campaigned in, but is \
                             not in its queue"
                        );
                    }
                }
            }
        }
    }

    /// The shared client names count exactly the live sessions using each, and every
    /// session holds the shared copy.
    fn check_client_names(&self) {
        let mut names_in_use: BTreeMap<&str, u32> = BTreeMap::new();
        for session in self.sessions.values() {
            *names_in_use.entry(&*session.client_name).or_default() += 1;
        }
        assert!(
            names_in_use
                .iter()
                .map(|(name, count)| (*name, *count))
                .eq(self.client_names.iter().map(|(name, count)| (&**name, *count))),
            "the client name table does not count the sessions using each name"
        );
    }

    /// Remembered answers: at most `REQUESTS_REMEMBERED_PER_SESSION_MAX` per session, one
    /// per request id, and the creation index maps exactly the remembered creations to
    /// their sessions.
    fn check_remembered_answers(&self) {
        let mut creations_total = 0;
        for (id, session) in &self.sessions {
            assert!(
                session.remembered.len() <= REQUESTS_REMEMBERED_PER_SESSION_MAX,
                "session {id} remembers {} answers, over REQUESTS_REMEMBERED_PER_SESSION_MAX",
                session.remembered.len()
            );
            let requests: BTreeSet<RequestId> =
                session.remembered.iter().map(|remembered| remembered.request).collect();
            assert_eq!(requests.len(), session.remembered.len(), "session {id} remembers a request id twice");
            for remembered in &session.remembered {
                if let Answer::SessionCreated { .. } = remembered.answer {
                    assert_eq!(
                        self.creations.get(&remembered.request),
                        Some(id),
                        "session {id} remembers its creation by {:?}, but the creation index disagrees",
                        remembered.request
                    );
                    creations_total += 1;
                }
            }
        }
        // Each remembered creation points back at its session, and the index maps a request
        // to one session, so equal counts make the index and the sessions agree exactly.
        assert_eq!(
            creations_total,
            self.creations.len(),
            "sessions remember {creations_total} creations, the creation index has {}",
            self.creations.len()
        );
    }

    /// Held locks: a valid name, held by a live session that lists it, with a token of
    /// an applied entry after the session's creation; at most `WAITERS_PER_LOCK_MAX`
    /// distinct waiters, none the holder, each a live session that lists the wait.
    fn check_lock_table(&self) {
        let last_applied = self.last_applied;
        // `check_sessions` found every listed hold and wait in the tables, each once; so
        // when the totals agree, every hold and wait in the tables is listed, and the
        // scans of the sessions' lists below (linear in a list each) are needed only to
        // name what is not.
        let held_total: usize = self.sessions.values().map(|session| session.held.len()).sum();
        let waiting_total: usize = self.sessions.values().map(|session| session.waiting.len()).sum();
        let locks_total: usize = self.namespaces.values().map(|namespace| namespace.locks.len()).sum();
        let waiters_total: usize = self
            .namespaces
            .values()
            .flat_map(|namespace| namespace.locks.values())
            .map(|lock| lock.waiters.len())
            .sum();
        let scan_lists = held_total != locks_total || waiting_total != waiters_total;
        let locks = self
            .namespaces
            .iter()
            .flat_map(|(tenant, namespace)| namespace.locks.iter().map(move |(name, lock)| (*tenant, name, lock)));
        for (tenant, name, lock) in locks {
            assert!(!name.is_empty() && name.len() <= LOCK_NAME_BYTES_MAX, "lock name {name:?} breaks the name rules");
            let holder = lock.holder.session;
            // A gone holder's grant is held back for its lock-delay (see
            // `check_lock_delays`); any other holder is a live session that lists it.
            if let Some(holder_session) = self.sessions.get(&holder) {
                assert_eq!(
                    holder_session.tenant, tenant,
                    "lock {name:?} of tenant {tenant} is held by another tenant's session"
                );
                assert!(
                    !scan_lists || holder_session.held.iter().any(|held| **held == **name),
                    "lock {name:?} is held by session {holder}, which does not list it"
                );
            } else {
                assert!(
                    self.held_back_grant(tenant, ResourceKind::Lock, name, holder).is_some(),
                    "lock {name:?} is held by session {holder}, which does not exist"
                );
            }
            assert!(
                last_applied.is_some_and(|last_applied| lock.holder.token <= last_applied),
                "lock {name:?} has token {} after the last applied index {last_applied:?}",
                lock.holder.token
            );
            assert!(
                lock.holder.token > holder,
                "lock {name:?} was granted at {} to session {holder}, created no earlier",
                lock.holder.token
            );
            assert!(
                lock.waiters.len() <= WAITERS_PER_LOCK_MAX,
                "lock {name:?} has {} waiters, over WAITERS_PER_LOCK_MAX",
                lock.waiters.len()
            );
            for (position, waiter) in lock.waiters.iter().enumerate() {
                assert!(
                    !lock.waiters[..position].contains(waiter),
                    "session {waiter} is queued twice on lock {name:?}"
                );
                assert_ne!(*waiter, holder, "session {holder} both holds and waits on lock {name:?}");
                let waiter_session = self
                    .sessions
                    .get(waiter)
                    .unwrap_or_else(|| panic!("session {waiter} waits on lock {name:?} but does not exist"));
                assert_eq!(waiter_session.tenant, tenant, "another tenant's session waits on lock {name:?}");
                assert!(
                    !scan_lists || waiter_session.waiting.iter().any(|waiting| **waiting == **name),
                    "session {waiter} is queued on lock {name:?} but does not list it"
                );
            }
        }
    }

    /// Semaphores in use: a valid name and limit, not empty, more holders than the limit
    /// only after a lowering that granted nothing since, no free permit while sessions
    /// wait, holders in grant order and each a live session that lists its permit,
    /// waiters distinct and listing their wait.
    fn check_semaphore_table(&self) {
        let last_applied = self.last_applied;
        let semaphores = self.namespaces.iter().flat_map(|(tenant, namespace)| {
            namespace.semaphores.iter().map(move |(name, semaphore)| (*tenant, name, semaphore))
        });
        for (tenant, name, semaphore) in semaphores {
            assert!(
                !name.is_empty() && name.len() <= LOCK_NAME_BYTES_MAX,
                "semaphore name {name:?} breaks the name rules"
            );
            assert!(
                (1..=SEMAPHORE_LIMIT_MAX).contains(&semaphore.limit),
                "semaphore {name:?} has limit {}, outside 1..=SEMAPHORE_LIMIT_MAX",
                semaphore.limit
            );
            assert!(
                !semaphore.holders.is_empty() || !semaphore.waiters.is_empty(),
                "semaphore {name:?} is unused but keeps an entry"
            );
            assert!(
                last_applied.is_some_and(|last_applied| semaphore.limit_set_index <= last_applied),
                "semaphore {name:?} had its limit set after the last applied index"
            );
            let holders = semaphore.holders.len();
            let limit = semaphore.limit_usize();
            if holders > limit {
                // Only a lowering of the limit leaves more holders than the limit, and then
                // no one may be granted until enough have left.
                let latest = semaphore.holders.iter().map(|holder| holder.token).max();
                assert!(
                    latest.is_some_and(|latest| latest <= semaphore.limit_set_index),
                    "semaphore {name:?} has {holders} holders, which exceeds its limit \
                     {limit}, and granted a permit at {latest:?}, after its limit was set at \
                     {}",
                    semaphore.limit_set_index
                );
            }
            assert!(
                semaphore.waiters.is_empty() || holders >= limit,
                "semaphore {name:?} has {holders} holders under its limit {limit} while \
                 sessions wait"
            );
            assert!(
                semaphore.waiters.len() <= WAITERS_PER_LOCK_MAX,
                "semaphore {name:?} has {} waiters, over WAITERS_PER_LOCK_MAX",
                semaphore.waiters.len()
            );
            let mut previous_token = 0;
            for (position, holder) in semaphore.holders.iter().enumerate() {
                let session = holder.session;
                assert!(
                    !semaphore.holders[..position].iter().any(|earlier| earlier.session == session),
                    "session {session} holds two permits of semaphore {name:?}"
                );
                assert!(holder.token >= previous_token, "semaphore {name:?} lists its holders out of grant order");
                previous_token = holder.token;
                if !self.sessions.contains_key(&session)
                    && self.held_back_grant(tenant, ResourceKind::Semaphore, name, session).is_some()
                {
                    continue;
                }
                self.check_claimant(tenant, ResourceKind::Semaphore, Role::Holds, name, session);
                self.check_token(ResourceKind::Semaphore, name, session, holder.token);
            }
            let holder_sessions: BTreeSet<SessionId> = semaphore.holders.iter().map(|holder| holder.session).collect();
            self.check_queue(tenant, ResourceKind::Semaphore, name, &semaphore.waiters, &holder_sessions);
        }
    }

    /// Elections with a leader: a valid name and value, a live leader that lists its
    /// leadership with a token of an applied entry, campaigners distinct and listing
    /// their campaign.
    fn check_election_table(&self) {
        let elections = self.namespaces.iter().flat_map(|(tenant, namespace)| {
            namespace.elections.iter().map(move |(name, election)| (*tenant, name, election))
        });
        for (tenant, name, election) in elections {
            assert!(
                !name.is_empty() && name.len() <= LOCK_NAME_BYTES_MAX,
                "election name {name:?} breaks the name rules"
            );
            let leader = election.leader.session;
            self.check_claimant(tenant, ResourceKind::Election, Role::Holds, name, leader);
            self.check_token(ResourceKind::Election, name, leader, election.leader.token);
            assert!(
                election.value.len() <= ELECTION_VALUE_BYTES_MAX,
                "election {name:?} has a value over ELECTION_VALUE_BYTES_MAX"
            );
            assert!(
                election.waiters.len() <= WAITERS_PER_LOCK_MAX,
                "election {name:?} has {} waiters, over WAITERS_PER_LOCK_MAX",
                election.waiters.len()
            );
            for waiter in &election.waiters {
                assert!(
                    waiter.value.len() <= ELECTION_VALUE_BYTES_MAX,
                    "session {} campaigns in election {name:?} with a value over \
                     ELECTION_VALUE_BYTES_MAX",
                    waiter.session
                );
            }
            let waiters: Vec<SessionId> = election.waiters.iter().map(|waiter| waiter.session).collect();
            self.check_queue(tenant, ResourceKind::Election, name, &waiters, &BTreeSet::from([leader]));
        }
    }

    /// The sessions' lists and the tables describe the same grants and waits: with the
    /// checks in both directions above, equal totals make them agree exactly.
    fn check_sessions_and_tables_agree(&self) {
        let held_total: usize = self.sessions.values().map(|session| session.held.len()).sum();
        let waiting_total: usize = self.sessions.values().map(|session| session.waiting.len()).sum();
        let claims_total: usize = self.sessions.values().map(|session| session.claims.len()).sum();
        let namespaces = || self.namespaces.values();
        let locks_total: usize = namespaces().map(|namespace| namespace.locks.len()).sum();
        let waiters_total: usize =
            namespaces().flat_map(|namespace| namespace.locks.values()).map(|lock| lock.waiters.len()).sum();
        let claimants_total: usize = namespaces()
            .flat_map(|namespace| namespace.semaphores.values())
            .map(|semaphore| semaphore.holders.len() + semaphore.waiters.len())
            .chain(
                namespaces()
                    .flat_map(|namespace| namespace.elections.values())
                    .map(|election| 1 + election.waiters.len()),
            )
            .sum();
        // Held-back grants are in the tables and no session lists them.
        let held_back_locks = self.held_back.keys().filter(|key| key.kind == ResourceKind::Lock).count();
        let held_back_permits = self.held_back.len() - held_back_locks;
        let locks_total = locks_total - held_back_locks;
        let claimants_total = claimants_total - held_back_permits;
        assert_eq!(held_total, locks_total, "sessions list {held_total} held locks, the tables have {locks_total}");
        assert_eq!(
            waiting_total, waiters_total,
            "sessions list {waiting_total} waits, the queues have {waiters_total}"
        );
        assert_eq!(
            claims_total, claimants_total,
            "sessions list {claims_total} permits, leaderships and their waits; the \
             semaphore and election tables have {claimants_total}"
        );
    }

    /// A holder (or leader) of a semaphore (or election) of `tenant`'s namespace is a
    /// live session of that tenant that lists it.
    fn check_claimant(&self, tenant: TenantId, kind: ResourceKind, role: Role, name: &str, session: SessionId) {
        let claimant = self
            .sessions
            .get(&session)
            .unwrap_or_else(|| panic!("{kind:?} {name:?} is held by session {session}, which does not exist"));
        assert_eq!(claimant.tenant, tenant, "{kind:?} {name:?} of tenant {tenant} is held by another tenant's session");
        let listed = claimant.claimed(kind, role).any(|claimed| claimed == name);
        assert!(listed, "{kind:?} {name:?} is held by session {session}, which does not list it");
    }

    /// A token is the index of an applied entry after the one that created its session.
    fn check_token(&self, kind: ResourceKind, name: &str, session: SessionId, token: u64) {
        let last_applied = self.last_applied;
        assert!(
            last_applied.is_some_and(|last_applied| token <= last_applied),
            "{kind:?} {name:?} has token {token} after the last applied index {last_applied:?}"
        );
        assert!(token > session, "{kind:?} {name:?} was granted at {token} to session {session}, created no earlier");
    }

    /// Waiters are distinct live sessions that list the wait and hold nothing of it.
    fn check_queue(
        &self,
        tenant: TenantId,
        kind: ResourceKind,
        name: &str,
        waiters: &[SessionId],
        holders: &BTreeSet<SessionId>,
    ) {
        for (position, waiter) in waiters.iter().enumerate() {
            assert!(!waiters[..position].contains(waiter), "session {waiter} is queued twice on {kind:?} {name:?}");
            assert!(!holders.contains(waiter), "session {waiter} both holds and waits on {kind:?} {name:?}");
            let waiting = self
                .sessions
                .get(waiter)
                .unwrap_or_else(|| panic!("session {waiter} waits on {kind:?} {name:?} but does not exist"));
            assert_eq!(waiting.tenant, tenant, "another tenant's session waits on {kind:?} {name:?}");
            let listed = waiting.claimed(kind, Role::Waits).any(|claimed| claimed == name);
            assert!(listed, "session {waiter} is queued on {kind:?} {name:?} but does not list it");
        }
    }
}

/// Asserts that a session lists each lock once, as held or as waited on: sorted, so
/// that a session with `LOCKS_PER_SESSION_MAX` locks costs k log k, not k².
fn check_listed_once<Name: AsRef<str>>(session: SessionId, held: &[Name], waiting: &[Name]) {
    let mut listed: Vec<(&str, bool)> = held
        .iter()
        .map(|name| (name.as_ref(), true))
        .chain(waiting.iter().map(|name| (name.as_ref(), false)))
        .collect();
    listed.sort_unstable();
    for pair in listed.windows(2) {
        let ((name, first_held), (other, second_held)) = (pair[0], pair[1]);
        if name != other {
            continue;
        }
        match (first_held, second_held) {
            (true, true) => panic!("session {session} lists lock {name:?} as held twice"),
            (false, false) => panic!("session {session} lists lock {name:?} as waited on twice"),
            _ => panic!("session {session} both holds and waits on lock {name:?}"),
        }
    }
}
