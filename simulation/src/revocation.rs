//! A tenant whose token leaked: a holder with the tenant's token keeps a session and
//! a lock, and at a time the seed draws the admin rotates the tenant's token (or, one
//! seed in four, removes the tenant; one in four, ends the holder's session with
//! `leasehold session close`) while the holder's keepalive stream is open. The
//! holder never learns the new token, as the one who found a leaked token would not:
//! its stream must end within one keepalive interval, and its session expire as a
//! silent one does; an ended session answers no keepalive alive after it either
//! (the fault suite's `revocations` check).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold::proto as pb;
use leasehold_jepsen::checker::Revocation;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::host::{client_endpoint, ADMIN_TOKEN};
use crate::network;
use crate::workload::{last_answered_keepalive_ns, now_ns, SESSION_TTL_MS};

/// The tenant whose token leaks.
pub const TENANT: &str = "leaked";
/// The lock its holder keeps.
pub const LOCK: &str = "leaked/held";
/// How long one admin command or one client call waits at most.
const CALL_DEADLINE: Duration = Duration::from_secs(3);
/// The pause before a refused or unanswered command is sent again.
const RETRY: Duration = Duration::from_millis(300);

/// When and how the seed revokes the tenant's credential (or its holder's session).
#[derive(Clone, Copy, Debug)]
pub struct Plan {
    pub at: Duration,
    pub how: How,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum How {
    RotateToken,
    RemoveTenant,
    /// The admin ends the holder's session (`Admin.EndSession`).
    EndSession,
}

impl How {
    pub fn name(self) -> &'static str {
        match self {
            How::RotateToken => "rotate-token",
            How::RemoveTenant => "remove-tenant",
            How::EndSession => "end-session",
        }
    }
}

impl Plan {
    /// A time within the faulty phase, at least a second into it and a second before
    /// its end, so that the holder has a session and the revocation is seen out.
    pub fn draw(seed: u64, faulty: Duration) -> Plan {
        let mut random = StdRng::seed_from_u64(seed.rotate_left(41));
        let latest = faulty.as_millis().max(2_001) as u64 - 1_000;
        let at = Duration::from_millis(random.random_range(1_000..latest));
        let how = match random.random_range(0..4) {
            0 => How::RemoveTenant,
            1 => How::EndSession,
            _ => How::RotateToken,
        };
        Plan { at, how }
    }
}

/// The holder and the admin, on one host of their own, until `stop_at`: the
/// revocation observed is pushed to `observed`.
pub async fn run(nodes: u64, plan: Plan, stop_at: Duration, observed: Arc<Mutex<Vec<Revocation>>>) -> turmoil::Result {
    let endpoints: Vec<String> = (1..=nodes).map(client_endpoint).collect();
    let admin = leasehold::Client::lazy(&endpoints)?
        .with_dialer(network::dialer())
        .with_token(ADMIN_TOKEN)?
        .with_client_name("admin")
        .with_request_deadline(CALL_DEADLINE);
    let elapsed = || turmoil::sim_elapsed().unwrap_or_default();
    let Some(token) = tenant_token(&admin, plan.at).await else {
        return Ok(());
    };
    let holder = leasehold::Client::lazy(&endpoints)?
        .with_dialer(network::dialer())
        .with_token(&token)?
        .with_client_name("leaked-token-holder")
        .with_request_deadline(CALL_DEADLINE);
    // Until the revocation: a session that holds the lock (a new one if it was lost).
    let mut session: Option<leasehold::Session> = None;
    let mut guard: Option<leasehold::LockGuard> = None;
    while elapsed() < plan.at {
        if session.as_ref().is_none_or(|session| session.state() == leasehold::SessionState::Lost) {
            guard = None;
            session = tokio::time::timeout(CALL_DEADLINE, holder.session(Duration::from_millis(SESSION_TTL_MS)))
                .await
                .ok()
                .and_then(Result::ok);
        }
        if let (Some(current), None) = (&session, &guard) {
            let acquired = tokio::time::timeout(CALL_DEADLINE, current.acquire(LOCK, Duration::from_millis(400))).await;
            if let Ok(Ok(leasehold::Acquired::Granted(granted))) = acquired {
                guard = Some(granted);
            }
        }
        tokio::time::sleep(RETRY.min(plan.at.saturating_sub(elapsed()))).await;
    }
    let revoked_ns = loop {
        if elapsed() >= stop_at {
            return Ok(());
        }
        let done = match plan.how {
            How::RemoveTenant => {
                let removed = tokio::time::timeout(CALL_DEADLINE, admin.remove_tenant(TENANT)).await;
                matches!(removed, Ok(Ok(_)) | Ok(Err(leasehold::Error::NotFound(_))))
            }
            How::RotateToken => {
                matches!(tokio::time::timeout(CALL_DEADLINE, admin.rotate_tenant_token(TENANT)).await, Ok(Ok(_)))
            }
            // No session to end (it was never made): nothing to check.
            How::EndSession => match &session {
                None => return Ok(()),
                Some(session) => {
                    let ended = tokio::time::timeout(CALL_DEADLINE, admin.end_session(TENANT, session.id())).await;
                    // A retry after a lost answer finds the session gone: ended.
                    matches!(ended, Ok(Ok(())) | Ok(Err(leasehold::Error::NotFound(_))))
                }
            },
        };
        if done {
            break now_ns();
        }
        tokio::time::sleep(RETRY).await;
    };
    // The holder goes on as it was, with the old token, until the run ends.
    tokio::time::sleep(stop_at.saturating_sub(elapsed())).await;
    if let Some(session) = &session {
        let interval_ms = SESSION_TTL_MS / u64::from(leasehold::proto::lease::KEEPALIVES_PER_TTL);
        observed.lock().unwrap().push(Revocation {
            how: plan.how.name(),
            session: session.id(),
            revoked_ns,
            interval_ns: interval_ms * 1_000_000,
            last_renewal_sent_ns: last_answered_keepalive_ns(session),
        });
    }
    drop(guard);
    Ok(())
}

/// The tenant's token: added, or (an add whose answer was lost, retried as a new
/// request, finds the tenant there) rotated to learn one; None if it takes past
/// `until`.
async fn tenant_token(admin: &leasehold::Client, until: Duration) -> Option<String> {
    while turmoil::sim_elapsed().unwrap_or_default() < until {
        match tokio::time::timeout(CALL_DEADLINE, admin.add_tenant(TENANT, pb::Quotas::default())).await {
            Ok(Ok(added)) => return Some(added.token),
            Ok(Err(leasehold::Error::Refused(_))) => {
                if let Ok(Ok(token)) = tokio::time::timeout(CALL_DEADLINE, admin.rotate_tenant_token(TENANT)).await {
                    return Some(token);
                }
            }
            _ => {}
        }
        tokio::time::sleep(RETRY).await;
    }
    None
}
