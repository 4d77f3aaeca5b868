//! What the status page shows, read from this node in one go and sent as JSON: the
//! members as this node sees them, one page of each table (locks, semaphores,
//! elections, sessions) filtered by the search, and the watched names.
//!
//! The tables are the applied state, the same on every member up to its applied
//! index. Replication progress (matched index, lag, last contact) is known to the
//! leader only: a follower asks the leader for it on each refresh. The round trip to
//! each member is this node's own measure (`raft::round_trips`). Time since a
//! session's last keepalive is the leader's only too (keepalives reach the leader
//! alone), and a follower's page does not show it.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::api::admin_service::state_name;
use crate::machine::{ElectionView, HolderView, LeaderView, Listing, Search, StateMachine, WaiterView, Walk};
use crate::raft::network::Network;
use crate::raft::replica::Replica;
use crate::raft::types::RaftMetrics;
use crate::shell::peer_contacts::PeerContacts;
use crate::shell::wait_histograms::WAIT_BUCKETS_SECONDS;

/// Rows of each table in one answer; the page asks for the next ones by offset.
pub const PAGE_ROWS: usize = 50;
/// Rows walked under one hold of the applied state's lock: a search walks every
/// row, about 65 ns each here (100,000 sessions and as many locks in 13 ms).
pub const ROWS_PER_STEP: usize = 10_000;
/// The longest search text taken.
pub const SEARCH_BYTES_MAX: usize = 256;

/// What the page asked for: a search, and where each table's page starts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Query {
    pub search: String,
    pub locks: usize,
    pub semaphores: usize,
    pub elections: usize,
    pub sessions: usize,
}

#[derive(Serialize)]
pub struct Report {
    node: NodeReport,
    members: Vec<MemberReport>,
    replication: ReplicationReport,
    locks: Table<LockRow>,
    semaphores: Table<SemaphoreRow>,
    elections: Table<ElectionRow>,
    sessions: Table<SessionReport>,
    /// Grants held back for their lock-delay after their holder's session expired.
    lock_delays: usize,
    /// Every tenant (the admin's namespace first): usage, quotas, share, and what this
    /// node did with its commands while it led.
    tenants: Vec<TenantRow>,
    watched: Vec<WatchedRow>,
    /// The upper bounds of the semaphores' wait histograms.
    wait_buckets_seconds: &'static [f64],
    /// This node's wall clock, for the page's "since" columns (the stamps are the
    /// leader's wall clock when it proposed the entry).
    now_unix_ms: u64,
}

#[derive(Serialize)]
struct NodeReport {
    id: u64,
    cluster_name: String,
    state: &'static str,
    term: u64,
    /// 0 when no leader is known.
    leader_id: u64,
    last_log_index: u64,
    commit_index: u64,
    applied_index: u64,
    snapshot_index: u64,
    /// On the leader: since a quorum last acknowledged it.
    millis_since_quorum_ack: Option<u64>,
    tls: bool,
}

/// Whose figures the members' matched index, lag and last contact are.
#[derive(Serialize)]
struct ReplicationReport {
    /// The leader that reported them (this node, when it leads).
    reported_by: Option<u64>,
    /// Why there are none: no leader known, or the leader did not answer.
    problem: Option<String>,
}

#[derive(Serialize)]
struct MemberReport {
    id: u64,
    /// "voter" or "learner".
    role: &'static str,
    client_addr: String,
    peer_addr: String,
    is_leader: bool,
    is_this_node: bool,
    /// The last index the member acknowledged to the leader, and how far behind the
    /// leader's last index that is.
    matched_index: Option<u64>,
    lag: Option<u64>,
    /// Since the leader last heard from the member (an answer to a Raft message);
    /// none for the leader itself and for members never heard.
    last_contact_ms: Option<u64>,
    /// The round trip from this node to the member, as this node measures it (not the
    /// leader's, on a follower's page); none for this node and members not measured.
    round_trip: Option<RoundTripReport>,
}

#[derive(Serialize)]
struct RoundTripReport {
    /// The median and the last of the recent round trips.
    median_us: u64,
    last_us: u64,
    samples: u32,
    measured_ms_ago: u64,
}

#[derive(Serialize)]
struct Table<T> {
    total: usize,
    matched: usize,
    offset: usize,
    page_rows: usize,
    rows: Vec<T>,
}

impl<T> Table<T> {
    fn of<V>(listing: Listing<V>, offset: usize, row: impl Fn(V) -> T) -> Table<T> {
        Table {
            total: listing.total,
            matched: listing.matched,
            offset,
            page_rows: PAGE_ROWS,
            rows: listing.rows.into_iter().map(row).collect(),
        }
    }
}

#[derive(Serialize)]
struct LockRow {
    tenant: String,
    name: String,
    holder: HolderView,
    /// The first waiters, first in line first, and how many wait in all.
    waiters: Vec<WaiterView>,
    waiter_count: usize,
}

#[derive(Serialize)]
struct SemaphoreRow {
    tenant: String,
    name: String,
    limit: u32,
    holders: Vec<HolderView>,
    holder_count: usize,
    waiters: Vec<WaiterView>,
    waiter_count: usize,
    /// Acquires of this semaphore that waited up to each bound, cumulative, and in
    /// all, as this node applied them; none before the first wait.
    waited: Option<Waited>,
}

#[derive(Serialize)]
struct Waited {
    cumulative: Vec<u64>,
    count: u64,
}

#[derive(Serialize)]
struct ElectionRow {
    tenant: String,
    name: String,
    leader: LeaderView,
    waiters: Vec<WaiterView>,
    waiter_count: usize,
}

#[derive(Serialize)]
struct SessionReport {
    id: u64,
    tenant: String,
    client_name: String,
    ttl_ms: u64,
    holds: usize,
    waits: usize,
    /// On the leader: the lease left before the session expires unless kept alive,
    /// and about how long ago its last keepalive arrived (TTL less the lease left).
    lease_left_ms: Option<u64>,
    since_keepalive_ms: Option<u64>,
}

#[derive(Serialize)]
struct TenantRow {
    name: String,
    sessions: u32,
    max_sessions: u32,
    holds: u32,
    max_holds: u32,
    weight: u32,
    /// 0: no rate quota.
    max_ops_per_second: u32,
    /// This node's counts as leader, since it started.
    admitted: u64,
    refused_early: u64,
    overloaded: u64,
    rate_limited: u64,
    queued: usize,
}

#[derive(Serialize)]
struct WatchedRow {
    watch: String,
    grants: u64,
    /// 0: none since this node started.
    last_grant_unix_ms: u64,
}

/// Every tenant's row: the applied state's usage, quotas and share, with this node's
/// admission counts as leader.
fn tenant_rows(replica: &Replica) -> Vec<TenantRow> {
    let mut rows: Vec<(u32, TenantRow)> = {
        let applied = replica.shared.applied.read().unwrap();
        let machine = &applied.machine;
        machine
            .tenants()
            .map(|(id, tenant)| {
                let shares = machine.tenant_shares(id);
                let row = TenantRow {
                    name: tenant.name.to_string(),
                    sessions: tenant.usage.sessions,
                    max_sessions: tenant.quotas.sessions,
                    holds: tenant.usage.holds,
                    max_holds: tenant.quotas.holds,
                    weight: shares.weight,
                    max_ops_per_second: shares.ops_per_s,
                    admitted: 0,
                    refused_early: 0,
                    overloaded: 0,
                    rate_limited: 0,
                    queued: 0,
                };
                (id, row)
            })
            .collect()
    };
    let live: std::collections::BTreeSet<u32> = rows.iter().map(|(id, _)| *id).collect();
    for (tenant, counts, queued) in replica.tenant_counts(|tenant| live.contains(&tenant)) {
        if let Some((_, row)) = rows.iter_mut().find(|(id, _)| *id == tenant) {
            row.admitted = counts.admitted;
            row.refused_early = counts.refused_early;
            row.overloaded = counts.overloaded;
            row.rate_limited = counts.rate_limited;
            row.queued = queued;
        }
    }
    rows.into_iter().map(|(_, row)| row).collect()
}

/// The leader's replication progress: its last log index, and per member the index
/// it acknowledged and since when the leader has not heard from it.
struct Progress {
    leader_id: u64,
    last_log_index: u64,
    members: BTreeMap<u64, (Option<u64>, Option<u64>)>,
}

/// The progress as this node knows it when it leads; else as the leader reports it
/// over the peer port (a request per page refresh, on the peer connection the node
/// has anyway). An error says why there is none.
async fn progress(metrics: &RaftMetrics, contacts: &PeerContacts, network: &Network) -> Result<Progress, String> {
    if let Some(replication) = &metrics.replication {
        let members = (metrics.membership_config.membership().nodes())
            .map(|(id, _)| {
                let matched = replication.get(id).copied().flatten().map(|matched| matched.index);
                (*id, (matched, if *id == metrics.id { None } else { contacts.since_ms(*id) }))
            })
            .collect();
        return Ok(Progress { leader_id: metrics.id, last_log_index: metrics.last_log_index.unwrap_or(0), members });
    }
    let Some(leader) = metrics.current_leader else {
        return Err("no leader is known, so no replication progress either".to_string());
    };
    let Some(address) = metrics.membership_config.membership().get_node(&leader).map(|node| node.peer_addr.clone())
    else {
        return Err(format!("the leader, node {leader}, is not in this node's membership"));
    };
    let answer = network.replication(leader, &address).await.map_err(|status| {
        format!("the leader, node {leader}, did not report its replication progress: {}", status.message())
    })?;
    let members =
        answer.members.iter().map(|member| (member.node_id, (member.matched_index, member.last_contact_ms))).collect();
    Ok(Progress { leader_id: answer.leader_id, last_log_index: answer.last_log_index, members })
}

/// One page of a table from `offset` on, walked in steps of at most `ROWS_PER_STEP`
/// rows, each under the applied state's lock: the applier waits for one step at most.
/// A listing walked in several steps may see entries applied between them.
fn walk<T>(replica: &Replica, offset: usize, step: impl Fn(&StateMachine, &mut Walk<T>)) -> Listing<T> {
    let mut walk = Walk::new(offset, PAGE_ROWS);
    while !walk.is_done() {
        step(&replica.shared.applied.read().unwrap().machine, &mut walk);
    }
    walk.into_listing()
}

/// Reads everything the page shows from `replica`.
pub async fn report(replica: &Replica, contacts: &PeerContacts, network: &Network, query: &Query, tls: bool) -> Report {
    let commit_index = replica
        .raft
        .with_raft_state(|state| state.committed.map(|log_id| log_id.index).unwrap_or(0))
        .await
        .unwrap_or(0);
    let metrics = replica.raft.metrics().borrow().clone();
    let is_leader = metrics.state == openraft::ServerState::Leader;
    let last_log_index = metrics.last_log_index.unwrap_or(0);
    let index = |log_id: Option<crate::raft::types::LogId>| log_id.map(|log_id| log_id.index).unwrap_or(0);
    let node = NodeReport {
        id: metrics.id,
        cluster_name: replica.cluster_name.clone(),
        state: state_name(metrics.state),
        term: metrics.current_term,
        leader_id: metrics.current_leader.unwrap_or(0),
        last_log_index,
        commit_index,
        applied_index: index(metrics.last_applied),
        snapshot_index: index(metrics.snapshot),
        millis_since_quorum_ack: if is_leader { metrics.millis_since_quorum_ack } else { None },
        tls,
    };
    let progress = progress(&metrics, contacts, network).await;
    let membership = metrics.membership_config.membership();
    let voters: std::collections::BTreeSet<u64> = membership.voter_ids().collect();
    let members = membership
        .nodes()
        .map(|(id, member)| {
            let known = progress.as_ref().ok().and_then(|progress| progress.members.get(id));
            let matched_index = known.and_then(|known| known.0);
            MemberReport {
                id: *id,
                role: if voters.contains(id) { "voter" } else { "learner" },
                client_addr: member.client_addr.clone(),
                peer_addr: member.peer_addr.clone(),
                is_leader: metrics.current_leader == Some(*id),
                is_this_node: *id == metrics.id,
                matched_index,
                lag: progress
                    .as_ref()
                    .ok()
                    .and_then(|progress| matched_index.map(|matched| progress.last_log_index.saturating_sub(matched))),
                last_contact_ms: known.and_then(|known| known.1),
                round_trip: (*id != metrics.id).then(|| network.round_trips().of(*id)).flatten().map(|round_trip| {
                    RoundTripReport {
                        median_us: round_trip.median_us,
                        last_us: round_trip.last_us,
                        samples: round_trip.samples,
                        measured_ms_ago: round_trip.since_ms,
                    }
                }),
            }
        })
        .collect();
    let replication = match progress {
        Ok(progress) => ReplicationReport { reported_by: Some(progress.leader_id), problem: None },
        Err(problem) => ReplicationReport { reported_by: None, problem: Some(problem) },
    };

    let search = Search::new(&query.search);
    let locks = walk(replica, query.locks, |machine, walk| machine.list_locks(&search, walk, ROWS_PER_STEP));
    let semaphores =
        walk(replica, query.semaphores, |machine, walk| machine.list_semaphores(&search, walk, ROWS_PER_STEP));
    let elections =
        walk(replica, query.elections, |machine, walk| machine.list_elections(&search, walk, ROWS_PER_STEP));
    let sessions = walk(replica, query.sessions, |machine, walk| machine.list_sessions(&search, walk, ROWS_PER_STEP));
    let deadlines = &replica.shared.deadlines;
    let waits = &replica.shared.semaphore_waits;
    let tenants = tenant_rows(replica);
    Report {
        node,
        members,
        replication,
        locks: Table::of(locks, query.locks, |row| LockRow {
            tenant: row.tenant,
            name: row.view.name,
            holder: row.view.holder,
            waiters: row.view.waiters,
            waiter_count: row.waiters,
        }),
        semaphores: Table::of(semaphores, query.semaphores, |row| SemaphoreRow {
            waited: waits
                .buckets(&row.tenant, &row.view.name)
                .map(|(cumulative, count)| Waited { cumulative: cumulative.to_vec(), count }),
            tenant: row.tenant,
            name: row.view.name,
            limit: row.view.limit,
            holders: row.view.holders,
            holder_count: row.holders,
            waiters: row.view.waiters,
            waiter_count: row.waiters,
        }),
        elections: Table::of(elections, query.elections, |row| {
            let ElectionView { name, leader, waiters } = row.view;
            ElectionRow { tenant: row.tenant, name, leader, waiters, waiter_count: row.waiters }
        }),
        sessions: Table::of(sessions, query.sessions, |row| {
            let lease_left_ms = if is_leader { deadlines.remaining_ms(row.id) } else { None };
            SessionReport {
                id: row.id,
                tenant: row.tenant,
                client_name: row.client_name,
                ttl_ms: row.ttl_ms,
                holds: row.holds,
                waits: row.waits,
                lease_left_ms,
                since_keepalive_ms: lease_left_ms.map(|left_ms| row.ttl_ms.saturating_sub(left_ms)),
            }
        }),
        lock_delays: replica.shared.lock_delays.len(),
        tenants,
        watched: match replica.shared.watched.get() {
            Some(watched) => watched
                .snapshot()
                .into_iter()
                .map(|(watch, seen)| WatchedRow {
                    watch,
                    grants: seen.grants,
                    last_grant_unix_ms: seen.last_grant_unix_ms,
                })
                .collect(),
            None => Vec::new(),
        },
        wait_buckets_seconds: &WAIT_BUCKETS_SECONDS,
        now_unix_ms: replica.clock.unix_ms(),
    }
}
