//! The triple-email story: three report "pods" start their cron job at the same
//! moment, each as `leasehold lock --try weekly-report -- leasehold-payments
//! send-report …`. One sends; the other two exit 75 and skip. Every user gets one
//! email per campaign.
//!
//! With `leasehold elect`, only the leader runs the schedule; the others campaign. A
//! leader paused past its TTL loses to the next campaigner, whose run finds every
//! email already sent, and is stopped (exit 70) when it wakes.
//!
//! The control runs the three senders without the lock: all three run, and the
//! `UNIQUE (user_id, campaign_id)` key alone still keeps one email per user — the
//! lock saves the work, the table guarantees the outcome.

mod support;

use std::process::Command;

use leasehold_example_payments::{database, schema, summary, weekly_report};
use support::{leasehold_binary, payments_binary, Process, TestDatabase};

const USERS: i64 = 25;
const RUNS: usize = 5;
const PODS: usize = 3;

fn sender(database: &TestDatabase, campaign: &str, pod: &str) -> Command {
    let mut command = Command::new(payments_binary());
    command.env(database::DATABASE_URL_ENV, &database.url).args([
        "send-report",
        "--campaign",
        campaign,
        "--pod",
        pod,
        "--wait-for-go",
    ]);
    command
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_pods_started_together_send_one_email_per_user_five_times_over() {
    let cluster = support::cluster().await;
    let database = TestDatabase::create("report").await;
    schema::add_users(&database.connect().await, USERS).await.unwrap();

    for run in 1..=RUNS {
        let campaign = format!("2025-W{run:02}");
        let mut pods: Vec<Process> = (1..=PODS)
            .map(|pod| {
                let pod = format!("pod-{pod}");
                let wrapped = sender(&database, &campaign, &pod);
                let mut command = Command::new(leasehold_binary());
                command
                    .envs(cluster.client_env())
                    .env(database::DATABASE_URL_ENV, &database.url)
                    .args(["lock", weekly_report::LOCK_NAME, "--try", "--ttl", "10s", "--"])
                    .arg(wrapped.get_program())
                    .args(wrapped.get_args());
                Process::spawn(&format!("run {run} {pod}"), command)
            })
            .collect();

        // The pod that got the lock sends and then holds it until told to go, so the
        // other two try while it is held, however the processes are scheduled.
        let skipped = leasehold_jepsen::wait::until(
            support::PROCESS_DEADLINE,
            &format!("run {run}: two of the three pods to give up"),
            || {
                let exited: Vec<usize> = (0..PODS).filter(|&index| pods[index].try_exit_code().is_some()).collect();
                std::future::ready((exited.len() >= PODS - 1).then_some(exited))
            },
        )
        .await;
        assert_eq!(skipped.len(), PODS - 1, "run {run}: only one pod may be left running");
        for &index in &skipped {
            let pod = &mut pods[index];
            assert_eq!(
                pod.try_exit_code(),
                Some(Some(75)),
                "run {run}: {} must skip with exit 75; stderr:\n{}",
                pod.name,
                pod.stderr()
            );
            assert!(pod.stderr().contains("not acquired"), "run {run}: {}", pod.stderr());
        }
        let ran = (0..PODS).find(|index| !skipped.contains(index)).unwrap();
        let holder = &mut pods[ran];
        let sent = holder.next_line(&format!("run {run}: the holder's report")).await;
        assert!(
            sent.starts_with(&format!("pod-{} sent {USERS} email(s) for campaign {campaign} (fencing token ", ran + 1)),
            "run {run}: {sent:?}"
        );
        holder.go();
        assert_eq!(holder.exit_code(&format!("run {run}: the holder to finish")).await, Some(0));
    }

    let emails = summary::emails(&database.connect().await).await.unwrap();
    assert_eq!(emails.campaigns.len(), RUNS, "{emails:?}");
    assert_eq!(
        (emails.exactly_once, emails.missing, emails.duplicated),
        (USERS * RUNS as i64, 0, 0),
        "every user has exactly one email row per campaign: {emails:?}"
    );
    for (campaign, pods) in &emails.runs {
        assert_eq!(pods.len(), 1, "campaign {campaign}: one sender ran: {emails:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_without_the_lock_all_three_send_and_the_unique_key_still_keeps_one_email_each() {
    let database = TestDatabase::create("report_control").await;
    schema::add_users(&database.connect().await, USERS).await.unwrap();
    let campaign = "2025-W01";
    let mut pods: Vec<Process> = (1..=PODS)
        .map(|pod| Process::spawn(&format!("pod-{pod}"), sender(&database, campaign, &format!("pod-{pod}"))))
        .collect();
    let mut inserted = 0;
    for pod in &mut pods {
        let line = pod.next_line("the pod's report").await;
        let count: i64 = line
            .split(" sent ")
            .nth(1)
            .and_then(|rest| rest.split(' ').next())
            .and_then(|count| count.parse().ok())
            .unwrap_or_else(|| panic!("unexpected report line {line:?}"));
        inserted += count;
    }
    for pod in &mut pods {
        pod.go();
        assert_eq!(pod.exit_code("the pod to finish").await, Some(0));
    }
    assert_eq!(inserted, USERS, "the three senders together inserted one row per user");
    let emails = summary::emails(&database.connect().await).await.unwrap();
    assert_eq!((emails.exactly_once, emails.missing, emails.duplicated), (USERS, 0, 0), "{emails:?}");
    assert_eq!(emails.runs[0].1.len(), PODS, "without the lock every pod ran: {emails:?}");
}

const SCHEDULER: &str = "weekly-report-scheduler";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_elect_only_the_leader_runs_the_schedule_and_its_successor_sends_nothing_twice() {
    let cluster = support::cluster().await;
    let database = TestDatabase::create("report_elect").await;
    schema::add_users(&database.connect().await, USERS).await.unwrap();
    let campaign = "2025-W10";
    let client = cluster.client();
    let mut pods: Vec<Process> = (1..=PODS)
        .map(|pod| {
            let pod = format!("pod-{pod}");
            let wrapped = sender(&database, campaign, &pod);
            let mut command = Command::new(leasehold_binary());
            command
                .envs(cluster.client_env())
                .env(database::DATABASE_URL_ENV, &database.url)
                .args(["elect", SCHEDULER, &pod, "--ttl", "2s", "--"])
                .arg(wrapped.get_program())
                .args(wrapped.get_args());
            Process::spawn(&format!("elect {pod}"), command)
        })
        .collect();

    // Whoever the election names runs the schedule; the others wait in the queue.
    let campaigners = |expected: usize| {
        let client = client.clone();
        move || {
            let client = client.clone();
            async move {
                let sessions = client.list_sessions().await.ok()?;
                let waiting =
                    sessions.iter().filter(|session| session.campaigning.iter().any(|name| name == SCHEDULER)).count();
                let leader = client.leader(SCHEDULER).await.ok()??;
                (waiting == expected).then_some(leader)
            }
        }
    };
    let leader = leasehold_jepsen::wait::until(
        support::PROCESS_DEADLINE,
        "one leader and two campaigners",
        campaigners(PODS - 1),
    )
    .await;
    let first: usize = leader.value["pod-".len()..].parse::<usize>().unwrap() - 1;
    assert!(pods[first].next_line("the leader's election").await.starts_with("elected "));
    let sent = pods[first].next_line("the leader's report").await;
    assert!(sent.contains(&format!("sent {USERS} email(s)")), "{sent:?}");
    for (index, pod) in pods.iter_mut().enumerate().filter(|(index, _)| *index != first) {
        assert_eq!(pod.try_exit_code(), None, "pod {} still campaigns", index + 1);
        assert_eq!(pod.try_line(), None, "pod {} ran nothing while not leader", index + 1);
    }

    // The leader stalls past its TTL (a GC pause): the next campaigner leads.
    pods[first].signal(libc::SIGSTOP);
    let successor = leasehold_jepsen::wait::until(support::PROCESS_DEADLINE, "the next campaigner to lead", || {
        let client = client.clone();
        let old = leader.token;
        async move { client.leader(SCHEDULER).await.ok()?.filter(|next| next.token > old) }
    })
    .await;
    let second: usize = successor.value["pod-".len()..].parse::<usize>().unwrap() - 1;
    assert_ne!(second, first);
    assert!(pods[second].next_line("the successor's election").await.starts_with("elected "));
    let resent = pods[second].next_line("the successor's report").await;
    assert!(resent.contains("sent 0 email(s)"), "every email was already sent: {resent:?}");

    // The stalled leader wakes, sees its leadership gone, stops its job: exit 70.
    pods[first].signal(libc::SIGCONT);
    assert_eq!(pods[first].exit_code("the stalled leader to give up").await, Some(70));
    for pod in &mut pods {
        pod.go();
        pod.signal(libc::SIGTERM);
    }
    let emails = summary::emails(&database.connect().await).await.unwrap();
    assert_eq!((emails.exactly_once, emails.missing, emails.duplicated), (USERS, 0, 0), "{emails:?}");
}
