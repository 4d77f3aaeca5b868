//! Lock-delay on 3-node clusters of real processes: a `leasehold lock --lock-delay`
//! holder killed with SIGKILL keeps its lock from everyone for the delay after its
//! session expired, also when the Raft leader dies, or every node restarts, in the
//! middle of the delay (a restart runs it whole again); the first waiter gets it when
//! the delay ends; a clean exit hands the lock on at once; and a node's
//! `--lock-delay-default` gives a delay to acquires that ask for none.

use std::process::{Child, Command};
use std::time::{Duration, Instant};

use leasehold::proto::lease::{extension_bound_ms, KEEPALIVES_PER_TTL};
use leasehold::{Acquired, Client};
use leasehold_jepsen::cluster::{binary, ClusterOptions, TestCluster};
use leasehold_jepsen::lock_holder::{kill_holder, start_lock_holder};

const LEADER_DEADLINE: Duration = Duration::from_secs(20);
const TTL: Duration = Duration::from_secs(2);
const DELAY: Duration = Duration::from_secs(3);
/// One election with the default timings: four election timeouts of at most 300 ms
/// (the README's bound: openraft's leader lease, the follower's own timeout, and
/// the delay of a follower that saw a longer log).
const ELECTION_MS: u64 = 1_200;
/// The expiry's commit, the leader's scan for ended delays, the grant and its answer.
const HANDOVER_MS: u64 = 500;

/// `leasehold lock NAME --ttl 2s [--lock-delay 3s]` running `command` as the holder;
/// returns it once its command runs (the lock is held).
async fn start_holder(
    cluster: &TestCluster,
    name: &str,
    lock_delay: Option<Duration>,
    marker: &std::path::Path,
    command: &str,
) -> Child {
    let mut arguments = vec![name.to_string(), "--ttl".into(), format!("{}s", TTL.as_secs())];
    if let Some(delay) = lock_delay {
        arguments.extend(["--lock-delay".into(), format!("{}ms", delay.as_millis())]);
    }
    start_lock_holder(cluster, &arguments, marker, command).await
}

/// A session of its own waiting for `name`; resolves to when it was granted.
async fn start_waiter(client: &Client, name: &'static str) -> tokio::task::JoinHandle<(Instant, u64)> {
    let session = client.session(Duration::from_secs(10)).await.expect("the waiter's session");
    let waiter = tokio::spawn(async move {
        let guard = session.lock(name).await.expect("the waiter gets the lock");
        let granted = Instant::now();
        let token = guard.token();
        let _ = guard.release().await;
        (granted, token)
    });
    leasehold_jepsen::wait::until(Duration::from_secs(10), "the waiter to queue", || {
        let client = client.clone();
        async move { client.describe_lock(name, false).await.ok().filter(|lock| !lock.waiters.is_empty()) }
    })
    .await;
    waiter
}

/// The holder of `name` once its lock is in its lock-delay (describe shows it).
async fn wait_for_delay(client: &Client, name: &'static str) -> leasehold::proto::LockHolder {
    leasehold_jepsen::wait::until(Duration::from_secs(10), "the lock to enter its delay", || {
        let client = client.clone();
        async move {
            let lock = client.describe_lock(name, false).await.ok()?;
            lock.holder.filter(|holder| holder.delay_until_unix_ms > 0)
        }
    })
    .await
}

/// A `--lock-delay` holder of `name` with a waiter behind it, killed with SIGKILL;
/// returns once the lock is in its delay, with the moment of the death and the
/// waiter.
async fn kill_holder_into_its_delay(
    cluster: &TestCluster,
    name: &'static str,
) -> (Instant, tokio::task::JoinHandle<(Instant, u64)>) {
    let marker = tempfile::NamedTempFile::new().unwrap();
    let mut holder = start_holder(cluster, name, Some(DELAY), marker.path(), "exec sleep 600").await;
    let client = cluster.client();
    let waiter = start_waiter(&client, name).await;
    let died = kill_holder(&mut holder, marker.path());
    wait_for_delay(&client, name).await;
    (died, waiter)
}

/// The earliest a correct cluster may grant a killed holder's delayed lock, after
/// its death: its last keepalive was sent at most a keepalive interval before, its
/// session lives at least a TTL after that, then the delay runs.
fn earliest_grant() -> Duration {
    TTL - TTL / KEEPALIVES_PER_TTL + DELAY
}

/// The latest, by the published bound, with `elections` leader changes on top.
fn latest_grant(elections: u64) -> Duration {
    let extension_ms = extension_bound_ms(TTL.as_millis() as u64, ELECTION_MS);
    TTL + DELAY + Duration::from_millis(extension_ms + HANDOVER_MS + elections * ELECTION_MS * 2)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holders_lock_goes_to_nobody_for_its_delay_then_to_the_first_waiter() {
    let cluster = TestCluster::start(ClusterOptions::default());
    cluster.wait_for_leader(LEADER_DEADLINE).await;
    let name = "mail/weekly-report";
    let marker = tempfile::NamedTempFile::new().unwrap();
    let mut holder = start_holder(&cluster, name, Some(DELAY), marker.path(), "exec sleep 600").await;
    let client = cluster.client();
    let held = client.describe_lock(name, false).await.expect("describe the held lock");
    let holder_token = held.holder.as_ref().expect("held").token;
    assert_eq!(held.holder.as_ref().unwrap().lock_delay_ms, DELAY.as_millis() as u64, "describe shows the delay");
    let waiter = start_waiter(&client, name).await;

    let died = kill_holder(&mut holder, marker.path());
    let in_delay = wait_for_delay(&client, name).await;
    assert_eq!(in_delay.token, holder_token, "the expired grant is shown while its delay runs");
    let text = Command::new(binary("leasehold"))
        .envs(cluster.client_env())
        .args(["describe", "lock", name])
        .output()
        .expect("leasehold describe lock");
    let text = String::from_utf8_lossy(&text.stdout).into_owned();
    assert!(text.contains("in lock-delay until about"), "describe says the lock is in its delay: {text}");

    // Nobody else gets it during the delay, not even a try-lock of a fresh session.
    let other = client.session(Duration::from_secs(10)).await.expect("another session");
    let asked = Instant::now();
    match other.acquire(name, Duration::ZERO).await.expect("a try-lock is answered") {
        Acquired::Granted(guard) => {
            assert!(asked - died >= earliest_grant(), "granted to a try-lock during the delay: {guard:?}");
        }
        Acquired::NotAcquired(not_acquired) => {
            if asked - died < earliest_grant() {
                assert!(not_acquired.delay_until_unix_ms.is_some(), "the refusal says the lock is in its delay");
                assert_eq!(not_acquired.holder_token, holder_token, "the refusal names the expired grant");
            }
        }
    }

    let (granted, token) =
        tokio::time::timeout(Duration::from_secs(60), waiter).await.expect("the waiter is granted").expect("task");
    let after = granted - died;
    assert!(token > holder_token, "the waiter's token is above the dead holder's");
    assert!(after >= earliest_grant(), "granted {after:?} after the holder's death, before its delay could end");
    assert!(after <= latest_grant(0), "granted {after:?} after the death; the bound is {:?}", latest_grant(0));
    eprintln!("lock-delay: the waiter got the lock {} ms after the holder's death", after.as_millis());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_killed_in_the_middle_of_a_delay_does_not_shorten_it() {
    let mut cluster = TestCluster::start(ClusterOptions::default());
    cluster.wait_for_leader(LEADER_DEADLINE).await;
    let (died, waiter) = kill_holder_into_its_delay(&cluster, "mail/invoices").await;
    let leader = cluster.wait_for_leader(LEADER_DEADLINE).await;
    cluster.kill(leader);
    let (granted, _) =
        tokio::time::timeout(Duration::from_secs(60), waiter).await.expect("the waiter is granted").expect("task");
    cluster.restart(leader);
    let after = granted - died;
    assert!(after >= earliest_grant(), "granted {after:?} after the holder's death: the leader change shortened it");
    // A new leader restarts a delay it did not see begin at most whole: one more
    // delay and an election on top of the bound.
    let latest = latest_grant(1) + DELAY;
    assert!(after <= latest, "granted {after:?} after the death; the bound with a leader change is {latest:?}");
    eprintln!("lock-delay with a leader kill: granted {} ms after the holder's death", after.as_millis());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_node_restarted_in_the_middle_of_a_delay_runs_it_whole_again() {
    let mut cluster = TestCluster::start(ClusterOptions::default());
    cluster.wait_for_leader(LEADER_DEADLINE).await;
    let (died, waiter) = kill_holder_into_its_delay(&cluster, "mail/statements").await;
    let nodes: Vec<u64> = cluster.nodes.keys().copied().collect();
    for node in &nodes {
        cluster.kill(*node);
    }
    let restarted = Instant::now();
    for node in &nodes {
        cluster.restart(*node);
    }
    let (granted, _) =
        tokio::time::timeout(Duration::from_secs(60), waiter).await.expect("the waiter is granted").expect("task");
    let after = granted - died;
    assert!(after >= earliest_grant(), "granted {after:?} after the holder's death: the restart shortened the delay");
    // Every node armed the delay afresh when it applied the expiry again after its
    // restart: the whole delay from then, and no more than a start and an election
    // on top.
    let since_restart = granted - restarted;
    assert!(since_restart >= DELAY, "granted {since_restart:?} after the restart, before a whole delay");
    let latest = DELAY + Duration::from_millis(2 * ELECTION_MS + HANDOVER_MS) + LEADER_DEADLINE;
    assert!(since_restart <= latest, "granted {since_restart:?} after the restart; expected within {latest:?}");
    eprintln!(
        "lock-delay across a restart of every node: granted {} ms after the restart, {} ms after the death",
        since_restart.as_millis(),
        after.as_millis()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_exit_hands_a_delayed_lock_on_at_once_and_a_default_delays_plain_acquires() {
    let cluster = TestCluster::start(ClusterOptions {
        extra_arguments: vec!["--lock-delay-default".into(), format!("mail/={}", DELAY.as_millis())],
        ..ClusterOptions::default()
    });
    cluster.wait_for_leader(LEADER_DEADLINE).await;
    let client = cluster.client();

    // No --lock-delay: the node's default for "mail/" applies.
    let name = "mail/daily";
    let marker = tempfile::NamedTempFile::new().unwrap();
    let release = tempfile::NamedTempFile::new().unwrap();
    let wait_for_release = format!("while [ ! -s {} ]; do sleep 0.05; done", release.path().display());
    let mut holder = start_holder(&cluster, name, None, marker.path(), &wait_for_release).await;
    let held = client.describe_lock(name, false).await.expect("describe");
    assert_eq!(held.holder.as_ref().expect("held").lock_delay_ms, DELAY.as_millis() as u64, "the default applies");
    let waiter = start_waiter(&client, name).await;
    std::fs::write(release.path(), "done").unwrap();
    let exited = Instant::now();
    let status = holder.wait().expect("the holder exits");
    assert!(status.success(), "leasehold lock exits with its command's code");
    let (granted, _) =
        tokio::time::timeout(Duration::from_secs(30), waiter).await.expect("the waiter is granted").expect("task");
    assert!(granted - exited < DELAY, "a release ends no delay: granted {:?} after the exit", granted - exited);

    // Asking for no delay overrides the default; a name outside the prefix has none.
    let session = client.session(TTL).await.expect("a session");
    let guard = match session.acquire_with_delay("mail/none", Duration::ZERO, Some(Duration::ZERO)).await.unwrap() {
        Acquired::Granted(guard) => guard,
        Acquired::NotAcquired(not) => panic!("a free lock is granted: {not:?}"),
    };
    let described = client.describe_lock("mail/none", false).await.unwrap();
    assert_eq!(described.holder.unwrap().lock_delay_ms, 0);
    guard.release().await.unwrap();
    let guard = session.try_lock("orders/42").await.unwrap().expect("free");
    assert_eq!(client.describe_lock("orders/42", false).await.unwrap().holder.unwrap().lock_delay_ms, 0);
    guard.release().await.unwrap();

    // Over the limit: refused with a clear error, nothing acquired.
    let error = match session.acquire_with_delay("mail/long", Duration::ZERO, Some(Duration::from_secs(61))).await {
        Err(error) => error,
        Ok(_) => panic!("a delay over the limit is refused"),
    };
    assert!(error.to_string().contains("LOCK_DELAY_MS_MAX"), "{error}");
    assert!(client.describe_lock("mail/long", false).await.unwrap().holder.is_none(), "nothing was acquired");
}
