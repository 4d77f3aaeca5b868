//! `leasehold-bench run …` measures one workload against one system;
//! `leasehold-bench summarize FILE…` prints medians and ratios over rounds;
//! `leasehold-bench add-tenant …` makes the tenant a benchmark runs as.

use std::io::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use leasehold_bench::report::{self, Report};
use leasehold_bench::target::TargetKind;
use leasehold_bench::workload::{self, Settings, Workload};

#[derive(Parser)]
#[command(name = "leasehold-bench", about = "Lock workloads against Leasehold, etcd and Redis, side by side.")]
struct Arguments {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Runs one workload against one running system; prints a table and a JSON line.
    Run(RunArguments),
    /// Resident memory per idle session holding one lock (the nodes' VmRSS before and
    /// after creating --sessions sessions).
    ScaleSessions {
        #[arg(long, value_delimiter = ',', required = true)]
        endpoints: Vec<String>,
        #[arg(long, value_delimiter = ',', required = true)]
        pids: Vec<i32>,
        #[arg(long, default_value_t = 100_000)]
        sessions: usize,
        /// Keep the sessions (and their locks) this long after measuring, e.g. to
        /// measure the status page against them; a duration like `120s`.
        #[arg(long, value_parser = parse_duration)]
        hold: Option<Duration>,
    },
    /// Takes --locks locks, then runs --restart-command (which must kill and start
    /// again the node at --restart-endpoint) and measures until that node answers with
    /// every entry applied again.
    ScaleRestart {
        #[arg(long, value_delimiter = ',', required = true)]
        endpoints: Vec<String>,
        #[arg(long, default_value_t = 1_000_000)]
        locks: usize,
        #[arg(long, default_value_t = 1_000)]
        locks_per_session: usize,
        #[arg(long)]
        restart_endpoint: String,
        /// A shell command that kills and restarts the node (e.g. `./cluster.sh restart 3`).
        #[arg(long)]
        restart_command: String,
    },
    /// Failover at scale: --connections clients with --sessions-per-connection
    /// sessions each, every session holding a lock; kills the leader (SIGKILL to its
    /// pid) and reports the election, how soon after it each connection's keepalives
    /// were answered again, sessions lost, and elections after the first.
    ScaleFailover {
        #[arg(long, value_delimiter = ',', required = true)]
        endpoints: Vec<String>,
        /// The nodes' process ids, in --endpoints order.
        #[arg(long, value_delimiter = ',', required = true)]
        pids: Vec<i32>,
        #[arg(long, default_value_t = 200)]
        connections: usize,
        #[arg(long, default_value_t = 100)]
        sessions_per_connection: usize,
        #[arg(long, value_parser = parse_duration, default_value = "10s")]
        ttl: Duration,
    },
    /// What a fenced write costs against the plain write of the same layout, per
    /// store, in one run: sequential writes by one client to one resource, rounds
    /// alternating which goes first. The stores are `scripts/stores.sh`'s instances
    /// (started if needed; SQLite is a file in a temporary directory).
    FenceCost {
        #[arg(long, value_delimiter = ',', default_value = "postgres,sqlite,mariadb,redis,etcd,s3")]
        stores: Vec<String>,
        /// Writes per store, kind and round.
        #[arg(long, default_value_t = 2_000)]
        writes: usize,
        #[arg(long, default_value_t = 5)]
        rounds: usize,
        #[arg(long, default_value_t = 64)]
        value_bytes: usize,
    },
    /// Reads JSON lines of several runs and prints medians and ratios as Markdown.
    Summarize {
        /// Files of JSON lines written by `run --json-out`.
        files: Vec<PathBuf>,
    },
    /// Adds a tenant with the admin credential and writes its token to --token-file:
    /// Leasehold's clients act as a tenant, so a benchmark does too. TLS comes from
    /// the LEASEHOLD_* variables, like `run`'s.
    AddTenant {
        #[arg(long, value_delimiter = ',', required = true)]
        endpoints: Vec<String>,
        /// The tenant's name.
        #[arg(long, default_value = "bench")]
        name: String,
        /// The admin credential's file (the nodes' --admin-token-file).
        #[arg(long, env = leasehold::settings::ENV_ADMIN_TOKEN_FILE)]
        admin_token_file: PathBuf,
        /// Where to write the tenant's token (readable by its owner only).
        #[arg(long)]
        token_file: PathBuf,
        /// Quotas above what any workload takes (every client is a session; keepalive
        /// and scale-sessions hold a lock per session).
        #[arg(long, default_value_t = 1_000_000)]
        max_sessions: u32,
        #[arg(long, default_value_t = 10_000_000)]
        max_holds: u32,
        #[arg(long, default_value_t = 10_000_000)]
        max_waiters: u32,
        /// The tenant's rate quota, in commands a second (none by default).
        #[arg(long)]
        max_ops_per_second: Option<u32>,
    },
}

#[derive(clap::Args)]
struct RunArguments {
    #[arg(long, value_enum, default_value = "leasehold")]
    target: TargetKind,
    #[arg(long, value_enum)]
    workload: Workload,
    /// Client addresses, comma-separated (Leasehold: client ports; etcd: client
    /// URLs without scheme; Redis: one host:port).
    #[arg(long, value_delimiter = ',', required = true)]
    endpoints: Vec<String>,
    /// Server process ids in the order of --endpoints: their CPU is measured, and
    /// failover kills the leader's. Without them CPU is not reported.
    #[arg(long, value_delimiter = ',')]
    pids: Vec<i32>,
    #[arg(long, default_value_t = 16)]
    clients: usize,
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    duration: Duration,
    #[arg(long, value_parser = parse_duration, default_value = "2s")]
    warmup: Duration,
    /// Session (lease) TTL of every client.
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    ttl: Duration,
    /// Longest wait for a contended lock or a permit.
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    wait: Duration,
    /// An operation that takes longer counts as an error.
    #[arg(long, value_parser = parse_duration, default_value = "15s")]
    operation_timeout: Duration,
    /// The shared semaphore's limit.
    #[arg(long, default_value_t = 4)]
    limit: u32,
    /// Leasehold only: acquire every lock and permit with this lock-delay, to measure
    /// its cost (a delay matters only when a session expires, which no workload here
    /// lets happen).
    #[arg(long, value_parser = parse_duration)]
    lock_delay: Option<Duration>,
    /// When, after the warm-up, failover kills the leader (default: a third of --duration).
    #[arg(long, value_parser = parse_duration)]
    kill_after: Option<Duration>,
    /// Free text stored with the result (e.g. the round).
    #[arg(long, default_value = "")]
    label: String,
    /// The first part of every lock and semaphore name the run uses, so that two runs
    /// at once against one system use names of their own (e.g. two teams on etcd).
    #[arg(long, default_value = "bench")]
    name_prefix: String,
    /// Appends the JSON line to this file too.
    #[arg(long)]
    json_out: Option<PathBuf>,
    /// etcd over TLS: the CA (PEM) that signed the members' client-port certificates
    /// (https, trusting that CA only). Without it etcd is reached in plaintext.
    /// Leasehold's TLS and credential come from the LEASEHOLD_* variables instead.
    #[arg(long, value_name = "FILE")]
    etcd_ca_file: Option<PathBuf>,
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    leasehold::duration::parse(text)
}

fn main() -> anyhow::Result<()> {
    let arguments = Arguments::parse();
    match arguments.command {
        Command::Run(run) => {
            let etcd_ca = match &run.etcd_ca_file {
                Some(path) => Some(tonic::transport::Certificate::from_pem(
                    std::fs::read(path).with_context(|| format!("read the etcd CA {}", path.display()))?,
                )),
                None => None,
            };
            let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
            let report = runtime.block_on(workload::run(&Settings {
                target: run.target,
                workload: run.workload,
                endpoints: run.endpoints,
                pids: run.pids,
                clients: run.clients,
                warmup: run.warmup,
                duration: run.duration,
                ttl: run.ttl,
                wait: run.wait,
                operation_timeout: run.operation_timeout,
                semaphore_limit: run.limit,
                lock_delay: run.lock_delay,
                kill_after: run.kill_after.unwrap_or(run.duration / 3),
                label: run.label,
                name_prefix: run.name_prefix,
                etcd_ca,
            }))?;
            // Clients still closing in the background are not waited for.
            runtime.shutdown_timeout(Duration::from_millis(workload::CLOSE_TIMEOUT_MS));
            print!("{}", report.table());
            let line = serde_json::to_string(&report)?;
            println!("{line}");
            if let Some(path) = run.json_out {
                let mut file = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&path)
                    .with_context(|| format!("open {}", path.display()))?;
                writeln!(file, "{line}")?;
            }
        }
        Command::ScaleSessions { endpoints, pids, sessions, hold } => {
            let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
            runtime.block_on(async {
                let client = leasehold_bench::leasehold_target::client(&endpoints)?;
                client.status_any().await?;
                let (figure, sessions) = leasehold_bench::scale::sessions_with_a_lock(&client, &pids, sessions).await?;
                println!(
                    "{} sessions with one lock each, created in {:.1} s; resident bytes per session by node: {}",
                    figure.sessions,
                    figure.fill_seconds,
                    figure.bytes_per_session.iter().map(|bytes| format!("{bytes:.0}")).collect::<Vec<_>>().join(", ")
                );
                println!(
                    "{}",
                    serde_json::json!({"scale": "sessions", "sessions": figure.sessions, "bytes_per_session": figure.bytes_per_session, "fill_s": figure.fill_seconds})
                );
                if let Some(hold) = hold {
                    eprintln!("scale: holding the sessions for {} s", hold.as_secs());
                    tokio::time::sleep(hold).await;
                }
                drop(sessions);
                anyhow::Ok(())
            })?;
            runtime.shutdown_timeout(Duration::from_secs(5));
        }
        Command::ScaleRestart { endpoints, locks, locks_per_session, restart_endpoint, restart_command } => {
            let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
            runtime.block_on(async {
                let client = leasehold_bench::leasehold_target::client(&endpoints)?;
                client.status_any().await?;
                let started = std::time::Instant::now();
                let sessions = leasehold_bench::scale::fill_locks(&client, locks, locks_per_session).await?;
                let fill_seconds = started.elapsed().as_secs_f64();
                let status = client.status_any().await?;
                let index = status.commit_index;
                let restarted = std::time::Instant::now();
                let exit = std::process::Command::new("sh").arg("-c").arg(&restart_command).status()?;
                anyhow::ensure!(exit.success(), "the restart command failed: {exit}");
                let serving =
                    leasehold_bench::scale::wait_serving(&client, &restart_endpoint, index, Duration::from_secs(300)).await?;
                let total = restarted.elapsed();
                println!(
                    "{locks} locks taken in {fill_seconds:.1} s; {restart_endpoint} restarted and served with every entry applied after {:.2} s (command included)",
                    total.as_secs_f64()
                );
                println!(
                    "{}",
                    serde_json::json!({"scale": "restart", "locks": locks, "fill_s": fill_seconds, "restart_to_serving_s": total.as_secs_f64(), "after_command_s": serving.as_secs_f64()})
                );
                drop(sessions);
                anyhow::Ok(())
            })?;
            runtime.shutdown_timeout(Duration::from_secs(5));
        }
        Command::ScaleFailover { endpoints, pids, connections, sessions_per_connection, ttl } => {
            let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
            let figure = runtime.block_on(leasehold_bench::scale_failover::run(
                &endpoints,
                &pids,
                connections,
                sessions_per_connection,
                ttl,
            ))?;
            let mut back: Vec<f64> = figure.back_after_election_ms.iter().flatten().copied().collect();
            back.sort_by(f64::total_cmp);
            let never = figure.back_after_election_ms.iter().filter(|back| back.is_none()).count();
            let quantile =
                |q: f64| back.get(((back.len() as f64 * q) as usize).min(back.len().saturating_sub(1))).copied();
            let median = quantile(0.5).unwrap_or(f64::NAN);
            let p90 = quantile(0.9).unwrap_or(f64::NAN);
            let slowest = back.last().copied().unwrap_or(f64::NAN);
            let over_1s = back.iter().filter(|back| **back > 1_000.0).count();
            let mut buckets = std::collections::BTreeMap::<u64, usize>::new();
            for back in &back {
                *buckets.entry((*back / 100.0) as u64 * 100).or_default() += 1;
            }
            eprintln!(
                "scale-failover: connections back after the election, by 100 ms: {}",
                buckets.iter().map(|(from, count)| format!("{from}+ {count}")).collect::<Vec<_>>().join(", ")
            );
            println!(
                "{} sessions with a lock each on {} connections (filled in {:.1} s), TTL {} s: leader killed, new leader \
                 after {:.0} ms; keepalives answered again after the election: median {median:.0} ms, p90 \
                 {p90:.0} ms, slowest {slowest:.0} ms, {over_1s} connections over 1 s, {never} never; sessions lost {} (client) / gone {} \
                 (cluster); elections after the first: {}",
                figure.sessions,
                figure.connections,
                figure.fill_seconds,
                ttl.as_secs(),
                figure.elected_ms,
                figure.sessions_lost,
                figure.sessions_gone,
                figure.later_elections
            );
            println!(
                "{}",
                serde_json::json!({"scale": "failover", "sessions": figure.sessions, "connections": figure.connections,
                    "ttl_s": ttl.as_secs(), "elected_ms": figure.elected_ms, "back_median_ms": median, "back_p90_ms": p90,
                    "back_slowest_ms": slowest, "connections_over_1s": over_1s, "connections_never_back": never,
                    "sessions_lost": figure.sessions_lost, "sessions_gone": figure.sessions_gone,
                    "later_elections": figure.later_elections})
            );
            runtime.shutdown_timeout(Duration::from_secs(5));
        }
        Command::AddTenant {
            endpoints,
            name,
            admin_token_file,
            token_file,
            max_sessions,
            max_holds,
            max_waiters,
            max_ops_per_second,
        } => {
            let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
            let quotas =
                leasehold::proto::Quotas { max_sessions, max_holds, max_waiters, max_ops_per_second, weight: 0 };
            let token = runtime.block_on(leasehold_bench::leasehold_target::add_tenant(
                &endpoints,
                &admin_token_file,
                &name,
                quotas,
            ))?;
            leasehold::certs::write_file(&token_file, &token, true)
                .with_context(|| format!("write {}", token_file.display()))?;
            println!("tenant {name}: token in {}", token_file.display());
            runtime.shutdown_timeout(Duration::from_secs(5));
        }
        Command::FenceCost { stores, writes, rounds, value_bytes } => {
            let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
            runtime.block_on(fence_cost(&stores, writes, rounds, value_bytes))?;
        }
        Command::Summarize { files } => {
            let mut reports = Vec::new();
            for path in files {
                let text = std::fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))?;
                for line in text.lines().filter(|line| line.starts_with('{')) {
                    reports.push(serde_json::from_str::<Report>(line).with_context(|| format!("parse {line}"))?);
                }
            }
            print!("{}", report::summarize(&reports));
        }
    }
    Ok(())
}

/// `scripts/stores.sh start NAME` then its URL (the repository is the current directory
/// or the one this binary was built from).
fn store_url(name: &str) -> anyhow::Result<String> {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/stores.sh");
    for command in ["start", "url"] {
        let output = std::process::Command::new("bash").arg(&script).args([command, name]).output()?;
        anyhow::ensure!(
            output.status.success(),
            "stores.sh {command} {name}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        if command == "url" {
            return Ok(String::from_utf8_lossy(&output.stdout).trim().lines().last().unwrap_or_default().to_string());
        }
    }
    unreachable!()
}

async fn fence_cost(stores: &[String], writes: usize, rounds: usize, value_bytes: usize) -> anyhow::Result<()> {
    use leasehold_bench::fence_cost::{Pair, Round};
    let directory = tempfile::tempdir()?;
    let value = vec![b'v'; value_bytes];
    let median = |mut values: Vec<f64>| {
        values.sort_by(|a, b| a.total_cmp(b));
        values[values.len() / 2]
    };
    println!("| store | plain writes/s | fenced writes/s | fenced/plain | plain p50 / p99 | fenced p50 / p99 |");
    println!("|---|---|---|---|---|---|");
    for store in stores {
        let url = match store.as_str() {
            "sqlite" => directory.path().join("fence.db").display().to_string(),
            other => store_url(other)?,
        };
        let pair = Pair::open(store, &url).await.with_context(|| format!("open {store} at {url}"))?;
        let resource = format!("bench/fence-cost/{}-{}", std::process::id(), leasehold_bench::fence_cost::nanos());
        let (mut plain, mut fenced): (Vec<Round>, Vec<Round>) = (Vec::new(), Vec::new());
        // Warm both paths (connections, prepared plans) before the measured rounds.
        pair.plain(&resource, 1, writes / 10 + 1, &value).await?;
        pair.fenced(&resource, writes as u64 + 1, writes / 10 + 1, &value).await?;
        let mut token = 1_000_000u64;
        for round in 0..rounds {
            // Tokens keep growing across rounds so that every fenced write is admitted
            // after the plain writes (which set the token too).
            token += 10 * writes as u64;
            if round % 2 == 0 {
                plain.push(pair.plain(&resource, token, writes, &value).await?);
                fenced.push(pair.fenced(&resource, token + 2 * writes as u64, writes, &value).await?);
            } else {
                fenced.push(pair.fenced(&resource, token, writes, &value).await?);
                plain.push(pair.plain(&resource, token + 2 * writes as u64, writes, &value).await?);
            }
        }
        let rate = |rounds: &[Round]| median(rounds.iter().map(|round| round.writes_per_second).collect());
        let ms = |rounds: &[Round], pick: fn(&Round) -> Duration| {
            median(rounds.iter().map(|round| pick(round).as_secs_f64() * 1e3).collect())
        };
        let ratio = median(plain.iter().zip(&fenced).map(|(p, f)| f.writes_per_second / p.writes_per_second).collect());
        println!(
            "| {store} | {:.0} | {:.0} | {ratio:.2} | {:.2} / {:.2} ms | {:.2} / {:.2} ms |",
            rate(&plain),
            rate(&fenced),
            ms(&plain, |round| round.p50),
            ms(&plain, |round| round.p99),
            ms(&fenced, |round| round.p50),
            ms(&fenced, |round| round.p99),
        );
    }
    Ok(())
}
