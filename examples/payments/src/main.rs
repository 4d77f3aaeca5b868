//! `leasehold-payments`: the worker, the provider's charge endpoint, the weekly
//! report's sender and the demo's report, against PostgreSQL and a Leasehold cluster.
//!
//! ```text
//! leasehold-payments setup   --order-ids 42 --users 20 [--fresh]
//! leasehold-payments worker  --order-id 42 [--ttl 2s] [--wait 30s] [--no-fencing] [--pause-at acquired|provider-charged]
//! leasehold-payments charge  --key KEY --order-id 42 --amount-cents 4200
//! leasehold lock --try weekly-report -- leasehold-payments send-report --campaign 2025-W01 --pod pod-1
//! leasehold-payments summary
//! ```
//!
//! The worker prints one line per step on stdout, so a test can follow it:
//!
//! ```text
//! acquired <token>
//! paused at <point>                        (with --pause-at; continues after a line on stdin)
//! charged order <id> token <t> charge <c> [replayed]
//! superseded order <id> token <t> by token <h>
//! ```

use std::io::Write as _;
use std::process::ExitCode;
use std::str::FromStr;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use leasehold::FencingToken;
use leasehold_example_payments::payments::{self, ChargeOrder, ChargeOrderOutcome};
use leasehold_example_payments::provider::{self, ChargeRequest, ProviderError};
use leasehold_example_payments::{database, schema, summary, weekly_report};
use leasehold_example_payments::{EXIT_IDEMPOTENCY_KEY_REUSED, EXIT_NOT_ACQUIRED, EXIT_SUPERSEDED};

#[derive(Parser)]
#[command(name = "leasehold-payments", about = "Fenced writes to PostgreSQL with Leasehold.")]
struct Arguments {
    /// The PostgreSQL database, as a URL (postgres://user@host:port/database).
    #[arg(long, env = database::DATABASE_URL_ENV, global = true, default_value = "")]
    database_url: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Create the tables (if missing), pending payments and users.
    Setup {
        /// Orders to add as pending payments.
        #[arg(long, value_delimiter = ',')]
        order_ids: Vec<i64>,
        /// The amount of each added order.
        #[arg(long, default_value_t = 4_200)]
        amount_cents: i64,
        /// Users 1..=N, the weekly report's audience.
        #[arg(long, default_value_t = 0)]
        users: i64,
        /// Drop the example's tables first.
        #[arg(long)]
        fresh: bool,
    },
    /// Take `orders/<id>` and charge the order through the fenced update.
    Worker {
        #[arg(long)]
        order_id: i64,
        /// Client addresses of the Leasehold cluster, comma-separated.
        #[arg(long, env = "LEASEHOLD_ENDPOINTS", default_value = leasehold::DEFAULT_ENDPOINTS)]
        endpoints: String,
        /// Session TTL: how long the lock outlives a worker that stopped answering.
        #[arg(long, default_value = "10s")]
        ttl: String,
        /// How long to wait for the lock; exit 75 when it runs out.
        #[arg(long, default_value = "30s")]
        wait: String,
        /// Skip the fence (`leasehold::fence::postgres::guard`): the control that
        /// shows the double write the fence prevents.
        #[arg(long)]
        no_fencing: bool,
        /// Stop at this point and wait for a line on stdin (so a test can pause or
        /// kill the worker there).
        #[arg(long, value_enum)]
        pause_at: Option<PausePoint>,
        /// The worker's name in the tables and the lock's holder description.
        #[arg(long)]
        name: Option<String>,
    },
    /// The provider's charge endpoint: POST /charges with an Idempotency-Key.
    /// Prints the response as JSON; exits 22 (HTTP 422) when the key was used with a
    /// different request.
    Charge {
        /// The Idempotency-Key header.
        #[arg(long)]
        key: String,
        #[arg(long)]
        order_id: i64,
        #[arg(long)]
        amount_cents: i64,
    },
    /// Send the weekly report (run it under `leasehold lock --try weekly-report`).
    SendReport {
        #[arg(long)]
        campaign: String,
        /// This pod's name.
        #[arg(long, env = "POD_NAME")]
        pod: String,
        /// After sending, wait for a line on stdin before exiting (holding the lock).
        #[arg(long)]
        wait_for_go: bool,
        /// After sending, keep running (and holding the lock) this long: a report
        /// that takes a while.
        #[arg(long, default_value_t = 0)]
        hold_ms: u64,
    },
    /// Print charges per order, rejected stale writes and emails per user.
    Summary,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum PausePoint {
    /// Holding the lock, before any write.
    Acquired,
    /// The provider charged; the payments write is not committed yet.
    ProviderCharged,
}

impl PausePoint {
    fn label(self) -> &'static str {
        match self {
            PausePoint::Acquired => "acquired",
            PausePoint::ProviderCharged => "provider-charged",
        }
    }
}

fn main() -> ExitCode {
    let arguments = Arguments::parse();
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("tokio runtime");
    match runtime.block_on(run(arguments)) {
        Ok(code) => ExitCode::from(code),
        Err(error) => {
            eprintln!("leasehold-payments: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn say(line: &str) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{line}")?;
    stdout.flush()?;
    Ok(())
}

/// Waits for a line, or end of input, on stdin — on a blocking thread, so the
/// session's keepalives go on meanwhile (tokio's own stdin needs a feature the
/// workspace does not enable).
async fn wait_for_line() -> anyhow::Result<()> {
    tokio::task::spawn_blocking(|| {
        let mut line = String::new();
        std::io::stdin().read_line(&mut line).map(|_| ())
    })
    .await
    .context("the stdin reader")?
    .context("read stdin")
}

async fn run(arguments: Arguments) -> anyhow::Result<u8> {
    anyhow::ensure!(
        !arguments.database_url.is_empty(),
        "no database: pass --database-url or set {}",
        database::DATABASE_URL_ENV
    );
    let url = arguments.database_url.as_str();
    match arguments.command {
        Command::Setup { order_ids, amount_cents, users, fresh } => {
            let database = database::connect(url).await?;
            if fresh {
                schema::drop_all(&database).await?;
            }
            schema::create(&database).await?;
            for order_id in order_ids {
                schema::add_order(&database, order_id, amount_cents).await?;
            }
            schema::add_users(&database, users).await?;
            Ok(0)
        }
        Command::Worker { order_id, endpoints, ttl, wait, no_fencing, pause_at, name } => {
            let ttl = leasehold::duration::parse(&ttl).map_err(anyhow::Error::msg)?;
            let wait = leasehold::duration::parse(&wait).map_err(anyhow::Error::msg)?;
            let name = name.unwrap_or_else(|| format!("worker-{}", std::process::id()));
            worker(url, order_id, &endpoints, ttl, wait, !no_fencing, pause_at, name).await
        }
        Command::Charge { key, order_id, amount_cents } => {
            let mut database = database::connect(url).await?;
            let request = ChargeRequest { order_id, amount_cents };
            match provider::charge(&mut database, &key, &request).await {
                Ok(outcome) => {
                    say(&serde_json::to_string(&outcome.response)?)?;
                    eprintln!(
                        "leasehold-payments: {}",
                        if outcome.replayed {
                            "a retry: the stored response, nothing charged"
                        } else {
                            "a new request under this key"
                        }
                    );
                    Ok(0)
                }
                Err(error @ ProviderError::KeyReused { .. }) => {
                    eprintln!("leasehold-payments: 422 Unprocessable Content: {error}");
                    Ok(EXIT_IDEMPOTENCY_KEY_REUSED)
                }
                Err(error) => Err(error.into()),
            }
        }
        Command::SendReport { campaign, pod, wait_for_go, hold_ms } => {
            // Set by `leasehold lock`; absent when the sender runs without the lock.
            let token = match std::env::var("LEASEHOLD_FENCING_TOKEN") {
                Ok(text) => Some(FencingToken::from_str(&text).context("LEASEHOLD_FENCING_TOKEN")?),
                Err(_) => None,
            };
            let mut database = database::connect(url).await?;
            let report = weekly_report::send(&mut database, &campaign, &pod, token).await?;
            say(&format!(
                "{} sent {} email(s) for campaign {} (fencing token {})",
                report.pod,
                report.emails_inserted,
                report.campaign_id,
                token.map_or_else(|| "none".to_string(), |token| token.to_string())
            ))?;
            if wait_for_go {
                wait_for_line().await?;
            }
            if hold_ms > 0 {
                tokio::time::sleep(Duration::from_millis(hold_ms)).await;
            }
            Ok(0)
        }
        Command::Summary => {
            let database = database::connect(url).await?;
            print!("{}", summary::render(&database).await?);
            Ok(0)
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn worker(
    url: &str,
    order_id: i64,
    endpoints: &str,
    ttl: Duration,
    wait: Duration,
    fencing: bool,
    pause_at: Option<PausePoint>,
    name: String,
) -> anyhow::Result<u8> {
    // Connect to everything before taking the lock, so the lock is held for the
    // charge only.
    let mut payments_database = database::connect(url).await?;
    let mut provider_database = database::connect(url).await?;
    // TLS and the tenant's credential come from the LEASEHOLD_* variables.
    let settings =
        leasehold::Settings { endpoints: leasehold::parse_endpoints(endpoints), ..leasehold::Settings::from_env() };
    let client = settings.client().context("Leasehold client settings")?.with_client_name(name.clone());
    client.status_any().await.context("connect to the Leasehold cluster")?;
    let session = client.session(ttl).await.context("create a session")?;
    let lock = payments::lock_name(order_id);
    let Some(guard) = session.lock_with_timeout(&lock, wait).await.with_context(|| format!("acquire {lock}"))? else {
        eprintln!("leasehold-payments: {lock} not acquired within {wait:?}");
        let _ = session.close().await;
        return Ok(EXIT_NOT_ACQUIRED);
    };
    let token = guard.fencing_token();
    say(&format!("acquired {token}"))?;
    let pause = |point: PausePoint| async move {
        if pause_at == Some(point) {
            say(&format!("paused at {}", point.label()))?;
            wait_for_line().await?;
        }
        anyhow::Ok(())
    };
    pause(PausePoint::Acquired).await?;

    let order = ChargeOrder { order_id, token, worker: name, fencing };
    let outcome = payments::charge_order(&mut payments_database, &mut provider_database, &order, || {
        pause(PausePoint::ProviderCharged)
    })
    .await?;
    let code = match outcome {
        ChargeOrderOutcome::Charged(charged) => {
            say(&format!(
                "charged order {order_id} token {token} charge {}{}",
                charged.response.charge_id,
                if charged.replayed { " replayed" } else { "" }
            ))?;
            0
        }
        ChargeOrderOutcome::Superseded { highest_token } => {
            say(&format!("superseded order {order_id} token {token} by token {highest_token}"))?;
            EXIT_SUPERSEDED
        }
    };
    if let Err(error) = guard.release().await {
        // Expected for a worker that was paused past its lease.
        eprintln!("leasehold-payments: release {lock}: {error}");
    }
    let _ = session.close().await;
    Ok(code)
}
