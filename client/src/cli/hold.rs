//! `lock`, `sem` and `elect`: acquire a lock, a semaphore permit or leadership in a
//! new session, run the command under supervision (see `supervise`), then give it
//! back and close the session — whatever the command's outcome.

use std::time::Duration;

use leasehold::{Acquired, Client, Error, Session, SessionState};

use super::arguments::HoldArguments;
use super::exit::EXIT_NOT_ACQUIRED;
use super::supervise::{supervise, Hold};

/// `lock NAME`: exit 75 when the lock was not acquired.
pub async fn lock(
    client: &Client,
    name: &str,
    lock_delay: Option<Duration>,
    arguments: HoldArguments,
) -> Result<u8, Error> {
    let wait = arguments.wait_or_default();
    let session = client.session(arguments.ttl).await?;
    let guard = match session.acquire_with_delay(name, wait, lock_delay).await {
        Ok(Acquired::Granted(guard)) => guard,
        Ok(Acquired::NotAcquired(not_acquired)) => {
            let why = why_not(not_acquired.timed_out, wait);
            if let Some(until_ms) = not_acquired.delay_until_unix_ms {
                eprintln!(
                    "leasehold: lock {name:?} is in its lock-delay until about {} after session {} ({}) \
                     expired holding it with token {}; not acquired ({why})",
                    super::render::unix_ms_text(until_ms),
                    not_acquired.holder_session_id,
                    not_acquired.holder_client_name,
                    not_acquired.holder_token
                );
            } else if not_acquired.holder_session_id == 0 {
                eprintln!("leasehold: lock {name:?} not acquired ({why})");
            } else {
                eprintln!(
                    "leasehold: lock {name:?} is held by session {} ({}) with token {}; not acquired ({why})",
                    not_acquired.holder_session_id, not_acquired.holder_client_name, not_acquired.holder_token
                );
            }
            return close_with(session, Ok(EXIT_NOT_ACQUIRED)).await;
        }
        Err(error) => return close_with(session, Err(error)).await,
    };
    let token = guard.token();
    let hold = Hold {
        what: "lock",
        name: name.to_string(),
        token,
        env: vec![("LEASEHOLD_LOCK", name.to_string()), ("LEASEHOLD_FENCING_TOKEN", token.to_string())],
    };
    let outcome = supervise(&session, &hold, arguments.print_token, &arguments.command, session.jeopardy()).await;
    let _ = guard.release().await;
    close_with(session, outcome).await
}

/// `sem NAME --limit K`: exit 75 when the semaphore stayed full.
pub async fn semaphore(
    client: &Client,
    name: &str,
    limit: u32,
    lock_delay: Option<Duration>,
    arguments: HoldArguments,
) -> Result<u8, Error> {
    let wait = arguments.wait_or_default();
    let session = client.session(arguments.ttl).await?;
    let mut semaphore = session.semaphore(name, limit);
    if let Some(lock_delay) = lock_delay {
        semaphore = semaphore.with_lock_delay(lock_delay);
    }
    let permit = match semaphore.acquire_within(wait).await {
        Ok(Ok(permit)) => permit,
        Ok(Err(full)) => {
            let why = why_not(full.timed_out, wait);
            eprintln!(
                "leasehold: semaphore {name:?} is full ({} of {} permits held); not acquired ({why})",
                full.holders, full.limit
            );
            return close_with(session, Ok(EXIT_NOT_ACQUIRED)).await;
        }
        Err(error) => return close_with(session, Err(error)).await,
    };
    let token = permit.token();
    let hold = Hold {
        what: "semaphore",
        name: name.to_string(),
        token,
        env: vec![("LEASEHOLD_SEMAPHORE", name.to_string()), ("LEASEHOLD_FENCING_TOKEN", token.to_string())],
    };
    let outcome = supervise(&session, &hold, arguments.print_token, &arguments.command, session.jeopardy()).await;
    let _ = permit.release().await;
    close_with(session, outcome).await
}

/// `elect NAME VALUE`: prints `elected NAME token T` when elected; exit 75 when the
/// campaign gave up (--wait, --try) before that.
pub async fn elect(client: &Client, name: &str, value: &str, arguments: HoldArguments) -> Result<u8, Error> {
    let session = client.session(arguments.ttl).await?;
    eprintln!("leasehold: campaigning for {name:?} with value {value:?} (session {})", session.id());
    let campaign = match arguments.wait_max() {
        None => session.campaign(name, value).await.map(Ok),
        Some(wait) => session.campaign_within(name, value, wait).await,
    };
    let leadership = match campaign {
        Ok(Ok(leadership)) => leadership,
        Ok(Err(leader)) => {
            match leader {
                Some(leader) => eprintln!(
                    "leasehold: not elected; {name:?} is led by session {} ({}) with value {:?}, token {}",
                    leader.session_id, leader.client_name, leader.value, leader.token
                ),
                None => eprintln!("leasehold: not elected for {name:?}"),
            }
            return close_with(session, Ok(EXIT_NOT_ACQUIRED)).await;
        }
        Err(error) => return close_with(session, Err(error)).await,
    };
    let token = leadership.token();
    println!("elected {name} token {token}");
    let hold = Hold {
        what: "leadership of",
        name: name.to_string(),
        token,
        env: vec![
            ("LEASEHOLD_ELECTION", name.to_string()),
            ("LEASEHOLD_LEADER_VALUE", value.to_string()),
            ("LEASEHOLD_FENCING_TOKEN", token.to_string()),
        ],
    };
    let lost = async {
        leadership.lost().await;
        SessionState::Jeopardy
    };
    let outcome = supervise(&session, &hold, arguments.print_token, &arguments.command, lost).await;
    let _ = leadership.resign().await;
    close_with(session, outcome).await
}

/// Why an acquire gave up, for the message.
fn why_not(timed_out: bool, wait: Duration) -> String {
    if timed_out {
        format!("waited {wait:?}")
    } else {
        "--try".to_string()
    }
}

/// Closes the session and passes `outcome` on. Best effort, since the session
/// expires after its TTL anyway; and skipped when the cluster just failed to answer,
/// where a close would only wait out another request timeout.
async fn close_with(session: Session, outcome: Result<u8, Error>) -> Result<u8, Error> {
    if !matches!(outcome, Err(Error::Unavailable(_) | Error::Indeterminate(_))) {
        let _ = session.close().await;
    }
    outcome
}
