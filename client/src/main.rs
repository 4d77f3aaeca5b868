//! `leasehold`: the command-line client.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use leasehold::proto as pb;
use leasehold::{duration, Acquired, Client, Error, SessionState};
use serde_json::json;

/// Exit code when the lock was not acquired (busy with --try, or the wait ran out).
pub const EXIT_NOT_ACQUIRED: u8 = 75;
/// Exit code when the lock was lost while the command ran (it was terminated).
pub const EXIT_LOCK_LOST: u8 = 70;
/// Exit code for a usage or request error.
pub const EXIT_ERROR: u8 = 1;
/// Exit code of `fence check` for a superseded token.
pub const EXIT_SUPERSEDED: u8 = 1;

#[derive(Parser)]
#[command(name = "leasehold", version, about = "Leasehold command-line client.")]
struct Arguments {
    /// Client addresses of the cluster's nodes, comma-separated.
    #[arg(long, env = "LEASEHOLD_ENDPOINTS", default_value = leasehold::DEFAULT_ENDPOINTS, global = true)]
    endpoints: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Members, leader, term, commit and applied index of each node.
    Status {
        #[arg(long)]
        json: bool,
    },
    /// List, add or remove cluster members.
    Member {
        #[command(subcommand)]
        action: MemberAction,
    },
    /// Run a command while holding a lock.
    ///
    /// The command sees LEASEHOLD_LOCK, LEASEHOLD_FENCING_TOKEN and LEASEHOLD_SESSION
    /// in its environment. Exit codes: the command's own; 75 when the lock was not
    /// acquired; 70 when the session went into jeopardy and the command was
    /// terminated (SIGTERM, then SIGKILL after a grace period) before the lease ran out.
    Lock {
        name: String,
        /// Session TTL.
        #[arg(long, default_value = "10s")]
        ttl: String,
        /// How long to wait in the queue.
        #[arg(long, default_value = "30s", conflicts_with = "try_only")]
        wait: String,
        /// Do not wait: exit 75 at once if the lock is held.
        #[arg(long = "try")]
        try_only: bool,
        /// Print the fencing token on stdout before running the command.
        #[arg(long)]
        print_token: bool,
        /// The command and its arguments (after `--`). Without one, print the token
        /// and hold the lock until interrupted.
        #[arg(last = true)]
        command: Vec<String>,
    },
    /// Run a command while holding a semaphore permit (at most LIMIT holders at once).
    ///
    /// Same supervision and exit codes as `lock`; the command sees LEASEHOLD_SEMAPHORE,
    /// LEASEHOLD_FENCING_TOKEN and LEASEHOLD_SESSION.
    Sem {
        name: String,
        /// At most this many holders; the first acquirer sets it.
        #[arg(long)]
        limit: u32,
        #[arg(long, default_value = "10s")]
        ttl: String,
        #[arg(long, default_value = "30s", conflicts_with = "try_only")]
        wait: String,
        #[arg(long = "try")]
        try_only: bool,
        #[arg(long)]
        print_token: bool,
        #[arg(last = true)]
        command: Vec<String>,
    },
    /// Campaign to lead NAME with VALUE; print when elected; run the command while
    /// leader (or hold until interrupted). Losing leadership terminates the command
    /// as `lock` does (exit 70).
    Elect {
        name: String,
        value: String,
        #[arg(long, default_value = "10s")]
        ttl: String,
        /// Give up after this long (exit 75); by default campaign until elected.
        #[arg(long)]
        wait: Option<String>,
        #[arg(last = true)]
        command: Vec<String>,
    },
    /// The current leader of an election.
    Leader {
        name: String,
        #[arg(long)]
        json: bool,
    },
    /// Print every change of an election's leader, one line each, until interrupted.
    Observe {
        name: String,
        #[arg(long)]
        json: bool,
    },
    /// Describe a lock, a semaphore or a session.
    Describe {
        #[command(subcommand)]
        what: DescribeWhat,
    },
    /// Fencing token checks.
    Fence {
        #[command(subcommand)]
        action: FenceAction,
    },
    /// Sessions.
    Session {
        #[command(subcommand)]
        action: SessionAction,
    },
}

#[derive(Subcommand)]
enum MemberAction {
    List {
        #[arg(long)]
        json: bool,
    },
    /// Add a node (started without --initial-member): learner first, then voter.
    Add {
        node_id: u64,
        client_addr: String,
        peer_addr: String,
        /// Leave it a non-voting learner.
        #[arg(long)]
        learner: bool,
    },
    Remove {
        node_id: u64,
    },
}

#[derive(Subcommand)]
enum DescribeWhat {
    Lock {
        name: String,
        #[arg(long)]
        json: bool,
    },
    Sem {
        name: String,
        #[arg(long)]
        json: bool,
    },
    Session {
        session_id: u64,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum FenceAction {
    /// Exit 0 if TOKEN is the current grant of NAME, 1 if it was superseded.
    Check { name: String, token: u64 },
}

#[derive(Subcommand)]
enum SessionAction {
    List {
        #[arg(long)]
        json: bool,
    },
}

fn main() -> ExitCode {
    // Like other command-line tools, end quietly when the reader of our output goes
    // away (`leasehold session list | head`) instead of panicking on EPIPE.
    // SAFETY: restoring the default disposition of SIGPIPE before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let arguments = Arguments::parse();
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("tokio runtime");
    match runtime.block_on(run(arguments)) {
        Ok(code) => ExitCode::from(code),
        Err(error) => {
            eprintln!("leasehold: {error}");
            ExitCode::from(EXIT_ERROR)
        }
    }
}

async fn run(arguments: Arguments) -> Result<u8, Error> {
    let endpoints = leasehold::parse_endpoints(&arguments.endpoints);
    let client = Client::lazy(&endpoints)?;
    match arguments.command {
        Command::Status { json } => status(&client, json).await,
        Command::Member { action } => member(&client, action).await,
        Command::Lock { name, ttl, wait, try_only, print_token, command } => {
            let ttl = duration::parse(&ttl).map_err(Error::InvalidArgument)?;
            let wait =
                if try_only { Duration::ZERO } else { duration::parse(&wait).map_err(Error::InvalidArgument)? };
            lock(&client, &name, ttl, wait, print_token, command).await
        }
        Command::Describe { what: DescribeWhat::Lock { name, json } } => describe_lock(&client, &name, json).await,
        Command::Describe { what: DescribeWhat::Sem { name, json } } => describe_semaphore(&client, &name, json).await,
        Command::Sem { name, limit, ttl, wait, try_only, print_token, command } => {
            let ttl = duration::parse(&ttl).map_err(Error::InvalidArgument)?;
            let wait =
                if try_only { Duration::ZERO } else { duration::parse(&wait).map_err(Error::InvalidArgument)? };
            semaphore(&client, &name, limit, ttl, wait, print_token, command).await
        }
        Command::Elect { name, value, ttl, wait, command } => {
            let ttl = duration::parse(&ttl).map_err(Error::InvalidArgument)?;
            let wait = wait.map(|wait| duration::parse(&wait)).transpose().map_err(Error::InvalidArgument)?;
            elect(&client, &name, &value, ttl, wait, command).await
        }
        Command::Leader { name, json } => {
            let leader = client.leader(&name).await?;
            print_leader(&name, leader.as_ref(), json);
            Ok(0)
        }
        Command::Observe { name, json } => {
            let mut changes = client.observe(&name);
            while let Some(change) = futures::StreamExt::next(&mut changes).await {
                print_leader(&name, change?.as_ref(), json);
            }
            Ok(0)
        }
        Command::Describe { what: DescribeWhat::Session { session_id, json } } => {
            let session = client.describe_session(session_id).await?;
            print_sessions(&[session], json);
            Ok(0)
        }
        Command::Fence { action: FenceAction::Check { name, token } } => {
            let answer = client.check_fence(&name, token).await?;
            if answer.current {
                println!("current: token {token} is the current grant of {name:?}");
                Ok(0)
            } else if answer.current_token == 0 {
                println!("superseded: {name:?} is free now; token {token} is no longer valid");
                Ok(EXIT_SUPERSEDED)
            } else {
                println!("superseded: the current grant of {name:?} is token {}", answer.current_token);
                Ok(EXIT_SUPERSEDED)
            }
        }
        Command::Session { action: SessionAction::List { json } } => {
            let sessions = client.list_sessions().await?;
            print_sessions(&sessions, json);
            Ok(0)
        }
    }
}

fn member_json(member: &pb::Member) -> serde_json::Value {
    json!({"node_id": member.node_id, "client_addr": member.client_addr, "peer_addr": member.peer_addr, "role": member.role})
}

fn print_members(members: &[pb::Member], as_json: bool) {
    if as_json {
        println!("{}", serde_json::Value::Array(members.iter().map(member_json).collect()));
        return;
    }
    println!("{:<6} {:<8} {:<22} {:<22}", "NODE", "ROLE", "CLIENT ADDRESS", "PEER ADDRESS");
    for member in members {
        println!("{:<6} {:<8} {:<22} {:<22}", member.node_id, member.role, member.client_addr, member.peer_addr);
    }
}

async fn status(client: &Client, as_json: bool) -> Result<u8, Error> {
    let mut rows = Vec::new();
    for endpoint in client.endpoints() {
        rows.push((endpoint.clone(), client.status_of(endpoint).await));
    }
    let members = rows.iter().find_map(|(_, row)| row.as_ref().ok().map(|status| status.members.clone()));
    if as_json {
        let nodes: Vec<serde_json::Value> = rows
            .iter()
            .map(|(endpoint, row)| match row {
                Ok(status) => json!({
                    "endpoint": endpoint, "reachable": true, "node_id": status.node_id, "state": status.state,
                    "term": status.term, "leader_id": status.leader_id, "leader_client_addr": status.leader_client_addr,
                    "last_log_index": status.last_log_index, "commit_index": status.commit_index,
                    "applied_index": status.applied_index, "snapshot_index": status.snapshot_index,
                    "cluster_name": status.cluster_name, "sessions": status.sessions, "locks": status.locks,
                }),
                Err(error) => json!({"endpoint": endpoint, "reachable": false, "error": error.to_string()}),
            })
            .collect();
        let members: Vec<serde_json::Value> = members.iter().flatten().map(member_json).collect();
        println!("{}", json!({"nodes": nodes, "members": members}));
    } else {
        println!(
            "{:<22} {:>4} {:<10} {:>5} {:>6} {:>9} {:>9} {:>9} {:>9} {:>8}",
            "ENDPOINT", "NODE", "STATE", "TERM", "LEADER", "LAST LOG", "COMMIT", "APPLIED", "SNAPSHOT", "SESSIONS"
        );
        for (endpoint, row) in &rows {
            match row {
                Ok(status) => println!(
                    "{:<22} {:>4} {:<10} {:>5} {:>6} {:>9} {:>9} {:>9} {:>9} {:>8}",
                    endpoint,
                    status.node_id,
                    status.state,
                    status.term,
                    status.leader_id,
                    status.last_log_index,
                    status.commit_index,
                    status.applied_index,
                    status.snapshot_index,
                    status.sessions
                ),
                Err(error) => println!("{endpoint:<22} unreachable: {error}"),
            }
        }
        if let Some(members) = &members {
            println!();
            print_members(members, false);
        }
    }
    Ok(if rows.iter().any(|(_, row)| row.is_ok()) { 0 } else { EXIT_ERROR })
}

async fn member(client: &Client, action: MemberAction) -> Result<u8, Error> {
    let members = match action {
        MemberAction::List { json } => {
            let status = client.status_any().await?;
            print_members(&status.members, json);
            return Ok(0);
        }
        MemberAction::Add { node_id, client_addr, peer_addr, learner } => {
            eprintln!(
                "adding node {node_id} as a learner{} (waits until it caught up)…",
                if learner { "" } else { ", then promoting it" }
            );
            client.add_member(node_id, &client_addr, &peer_addr, learner).await?
        }
        MemberAction::Remove { node_id } => client.remove_member(node_id).await?,
    };
    print_members(&members, false);
    Ok(0)
}

async fn describe_lock(client: &Client, name: &str, as_json: bool) -> Result<u8, Error> {
    let lock = client.describe_lock(name, false).await?;
    if as_json {
        let holder = lock.holder.as_ref().map(|holder| {
            json!({"session_id": holder.session_id, "client_name": holder.client_name, "token": holder.token, "since_unix_ms": holder.since_unix_ms})
        });
        let waiters: Vec<serde_json::Value> = lock
            .waiters
            .iter()
            .map(|waiter| json!({"session_id": waiter.session_id, "client_name": waiter.client_name}))
            .collect();
        println!("{}", json!({"name": name, "holder": holder, "waiters": waiters}));
        return Ok(0);
    }
    match &lock.holder {
        None => println!("{name}: free"),
        Some(holder) => println!(
            "{name}: held by session {} ({}) with fencing token {}",
            holder.session_id, holder.client_name, holder.token
        ),
    }
    for (position, waiter) in lock.waiters.iter().enumerate() {
        println!("  waiter {}: session {} ({})", position + 1, waiter.session_id, waiter.client_name);
    }
    Ok(0)
}

fn print_leader(name: &str, leader: Option<&leasehold::Leader>, as_json: bool) {
    use std::io::Write;
    match (leader, as_json) {
        (Some(leader), true) => println!(
            "{}",
            json!({"name": name, "leader": {"session_id": leader.session_id, "client_name": leader.client_name, "token": leader.token, "value": leader.value}})
        ),
        (None, true) => println!("{}", json!({"name": name, "leader": null})),
        (Some(leader), false) => println!(
            "{name}: leader {:?} (session {}, {}), token {}",
            leader.value, leader.session_id, leader.client_name, leader.token
        ),
        (None, false) => println!("{name}: vacant"),
    }
    let _ = std::io::stdout().flush();
}

async fn describe_semaphore(client: &Client, name: &str, as_json: bool) -> Result<u8, Error> {
    let semaphore = client.describe_semaphore(name).await?;
    if as_json {
        let holders: Vec<serde_json::Value> = semaphore
            .holders
            .iter()
            .map(|holder| json!({"session_id": holder.session_id, "client_name": holder.client_name, "token": holder.token, "since_unix_ms": holder.since_unix_ms}))
            .collect();
        let waiters: Vec<serde_json::Value> = semaphore
            .waiters
            .iter()
            .map(|waiter| json!({"session_id": waiter.session_id, "client_name": waiter.client_name}))
            .collect();
        println!("{}", json!({"name": name, "limit": semaphore.limit, "holders": holders, "waiters": waiters}));
        return Ok(0);
    }
    if semaphore.limit == 0 {
        println!("{name}: no holders, no waiters");
        return Ok(0);
    }
    println!("{name}: {} of {} permits held", semaphore.holders.len(), semaphore.limit);
    for holder in &semaphore.holders {
        println!("  holder: session {} ({}) token {}", holder.session_id, holder.client_name, holder.token);
    }
    for (position, waiter) in semaphore.waiters.iter().enumerate() {
        println!("  waiter {}: session {} ({})", position + 1, waiter.session_id, waiter.client_name);
    }
    Ok(0)
}

fn print_sessions(sessions: &[pb::SessionInfo], as_json: bool) {
    if as_json {
        let rows: Vec<serde_json::Value> = sessions
            .iter()
            .map(|session| {
                let held: Vec<serde_json::Value> =
                    session.held.iter().map(|held| json!({"name": held.name, "token": held.token})).collect();
                let permits: Vec<serde_json::Value> =
                    session.permits.iter().map(|held| json!({"name": held.name, "token": held.token})).collect();
                let leading: Vec<serde_json::Value> =
                    session.leading.iter().map(|held| json!({"name": held.name, "token": held.token})).collect();
                json!({"session_id": session.session_id, "ttl_ms": session.ttl_ms, "client_name": session.client_name, "held": held, "waiting": session.waiting,
                       "permits": permits, "waiting_semaphores": session.waiting_semaphores, "leading": leading, "campaigning": session.campaigning})
            })
            .collect();
        println!("{}", serde_json::Value::Array(rows));
        return;
    }
    println!("{:<10} {:>8} {:<24} HOLDS (token) / WAITS", "SESSION", "TTL", "CLIENT");
    for session in sessions {
        let mut holds: Vec<String> =
            session.held.iter().map(|held| format!("{} ({})", held.name, held.token)).collect();
        holds.extend(session.waiting.iter().map(|name| format!("waits {name}")));
        println!(
            "{:<10} {:>7}s {:<24} {}",
            session.session_id,
            session.ttl_ms / 1_000,
            session.client_name,
            holds.join(", ")
        );
    }
}

/// Signals a whole process group.
fn signal_group(process_group: i32, signal: i32) {
    // SAFETY: kill(2) with a negative pid signals the group we created for the child.
    unsafe {
        libc::kill(-process_group, signal);
    }
}

fn exit_code(status: std::process::ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => code as u8,
        (None, Some(signal)) => 128 + signal as u8,
        _ => EXIT_ERROR,
    }
}

/// What the command runs under, for its environment and the messages.
struct Hold {
    what: &'static str,
    name: String,
    token: u64,
    env: Vec<(&'static str, String)>,
}

async fn lock(
    client: &Client,
    name: &str,
    ttl: Duration,
    wait: Duration,
    print_token: bool,
    command: Vec<String>,
) -> Result<u8, Error> {
    let session = client.session(ttl).await?;
    let guard = match session.acquire(name, wait).await? {
        Acquired::Granted(guard) => guard,
        Acquired::NotAcquired(not_acquired) => {
            let why = if not_acquired.timed_out { format!("waited {wait:?}") } else { "--try".to_string() };
            if not_acquired.holder_session_id == 0 {
                eprintln!("leasehold: lock {name:?} not acquired ({why})");
            } else {
                eprintln!(
                    "leasehold: lock {name:?} is held by session {} ({}) with token {}; not acquired ({why})",
                    not_acquired.holder_session_id, not_acquired.holder_client_name, not_acquired.holder_token
                );
            }
            let _ = session.close().await;
            return Ok(EXIT_NOT_ACQUIRED);
        }
    };
    let token = guard.token();
    let hold = Hold {
        what: "lock",
        name: name.to_string(),
        token,
        env: vec![("LEASEHOLD_LOCK", name.to_string()), ("LEASEHOLD_FENCING_TOKEN", token.to_string())],
    };
    let code = supervise(&session, ttl, &hold, print_token, command, session.jeopardy()).await?;
    let _ = guard.release().await;
    let _ = session.close().await;
    Ok(code)
}

async fn semaphore(
    client: &Client,
    name: &str,
    limit: u32,
    ttl: Duration,
    wait: Duration,
    print_token: bool,
    command: Vec<String>,
) -> Result<u8, Error> {
    let session = client.session(ttl).await?;
    let permit = match session.semaphore(name, limit).acquire_within(wait).await? {
        Ok(permit) => permit,
        Err(full) => {
            let why = if full.timed_out { format!("waited {wait:?}") } else { "--try".to_string() };
            eprintln!(
                "leasehold: semaphore {name:?} is full ({} of {} permits held); not acquired ({why})",
                full.holders, full.limit
            );
            let _ = session.close().await;
            return Ok(EXIT_NOT_ACQUIRED);
        }
    };
    let token = permit.token();
    let hold = Hold {
        what: "semaphore",
        name: name.to_string(),
        token,
        env: vec![("LEASEHOLD_SEMAPHORE", name.to_string()), ("LEASEHOLD_FENCING_TOKEN", token.to_string())],
    };
    let code = supervise(&session, ttl, &hold, print_token, command, session.jeopardy()).await?;
    let _ = permit.release().await;
    let _ = session.close().await;
    Ok(code)
}

async fn elect(
    client: &Client,
    name: &str,
    value: &str,
    ttl: Duration,
    wait: Option<Duration>,
    command: Vec<String>,
) -> Result<u8, Error> {
    let session = client.session(ttl).await?;
    eprintln!("leasehold: campaigning for {name:?} with value {value:?} (session {})", session.id());
    let leadership = match wait {
        None => session.campaign(name, value).await?,
        Some(wait) => match session.campaign_within(name, value, wait).await? {
            Ok(leadership) => leadership,
            Err(leader) => {
                match leader {
                    Some(leader) => eprintln!(
                        "leasehold: not elected; {name:?} is led by session {} ({}) with value {:?}, token {}",
                        leader.session_id, leader.client_name, leader.value, leader.token
                    ),
                    None => eprintln!("leasehold: not elected for {name:?}"),
                }
                let _ = session.close().await;
                return Ok(EXIT_NOT_ACQUIRED);
            }
        },
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
    let code = supervise(&session, ttl, &hold, false, command, async {
        leadership.lost().await;
        SessionState::Jeopardy
    })
    .await?;
    let _ = leadership.resign().await;
    let _ = session.close().await;
    Ok(code)
}

/// Runs `command` while `hold` lasts, or holds until interrupted when there is no
/// command. When `lost` fires (session jeopardy or lost leadership), the command's
/// process group gets SIGTERM, then SIGKILL after a quarter of the TTL — while the
/// lease still holds — and the exit code is 70.
async fn supervise(
    session: &leasehold::Session,
    ttl: Duration,
    hold: &Hold,
    print_token: bool,
    command: Vec<String>,
    lost: impl std::future::Future<Output = SessionState>,
) -> Result<u8, Error> {
    let (what, name, token) = (hold.what, &hold.name, hold.token);
    if print_token || command.is_empty() {
        println!("{token}");
    }
    eprintln!("leasehold: holding {what} {name:?} with fencing token {token} (session {})", session.id());
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|error| Error::Other(error.to_string()))?;
    let mut interrupt = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
        .map_err(|error| Error::Other(error.to_string()))?;
    tokio::pin!(lost);

    if command.is_empty() {
        tokio::select! {
            _ = terminate.recv() => return Ok(0),
            _ = interrupt.recv() => return Ok(0),
            state = &mut lost => {
                eprintln!("leasehold: session is {state:?}; the {what} {name:?} may be lost");
                return Ok(EXIT_LOCK_LOST);
            }
        }
    }

    let mut child = tokio::process::Command::new(&command[0]);
    child.args(&command[1..]).env("LEASEHOLD_SESSION", session.id().to_string()).process_group(0).kill_on_drop(true);
    for (key, value) in &hold.env {
        child.env(key, value);
    }
    let mut child =
        child.spawn().map_err(|error| Error::InvalidArgument(format!("cannot run {:?}: {error}", command[0])))?;
    let process_group = child.id().map(|id| id as i32).unwrap_or(0);

    let outcome = tokio::select! {
        status = child.wait() => Some(status),
        _ = terminate.recv() => { signal_group(process_group, libc::SIGTERM); None }
        _ = interrupt.recv() => { signal_group(process_group, libc::SIGTERM); None }
        state = &mut lost => {
            // Stop the command while the lease still holds, so its writes end before
            // another holder can be granted.
            let grace = ttl / 4;
            eprintln!("leasehold: {state:?}: the {what} {name:?} is in danger; terminating the command (SIGTERM, SIGKILL after {grace:?})");
            signal_group(process_group, libc::SIGTERM);
            if tokio::time::timeout(grace, child.wait()).await.is_err() {
                signal_group(process_group, libc::SIGKILL);
                let _ = child.wait().await;
            }
            return Ok(EXIT_LOCK_LOST);
        }
    };
    let status = match outcome {
        Some(status) => status,
        None => child.wait().await,
    }
    .map_err(|error| Error::Other(format!("waiting for the command: {error}")))?;
    if session.state() == SessionState::Lost {
        return Ok(EXIT_LOCK_LOST);
    }
    Ok(exit_code(status))
}
