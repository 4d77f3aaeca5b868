//! `leasehold-jepsen`: Leasehold's fault-injection tool. `run` runs the suite (a
//! cluster, workers, a nemesis, the checks); `workload-worker` is one worker process
//! of a run; `worker` runs one test worker process.

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "leasehold-jepsen", version, about = "Leasehold's fault-injection suite.")]
struct Arguments {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Runs the fault-injection suite; exits 0 when valid, 1 when a check failed,
    /// 2 when a check could not decide.
    Run(leasehold_jepsen::harness::RunArguments),
    /// One worker process of a run (started by `run`).
    WorkloadWorker(leasehold_jepsen::workload::WorkloadWorkerArguments),
    /// Re-checks a run's history.jsonl with the history-only checks (a), (c), (d),
    /// (f), and the attacks check when the run had the attack workload.
    Check {
        history: std::path::PathBuf,
        #[arg(long, default_value_t = 30)]
        linearizability_budget_s: u64,
        /// K of check (c); a lower one shows the check can fail on a real history.
        #[arg(long, default_value_t = leasehold_jepsen::workload::SEMAPHORE_LIMIT as usize)]
        semaphore_limit: usize,
    },
    /// One worker: lock, (wait), write through the fenced store with the token.
    Worker(leasehold_jepsen::worker::WorkerArguments),
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match Arguments::parse().command {
        Command::Run(arguments) => {
            let code = leasehold_jepsen::harness::run(arguments).await?;
            std::process::exit(code);
        }
        Command::WorkloadWorker(arguments) if arguments.workload == leasehold_jepsen::workload::Workload::Attack => {
            leasehold_jepsen::attack::run(arguments).await
        }
        Command::WorkloadWorker(arguments) if arguments.workload == leasehold_jepsen::workload::Workload::Flood => {
            leasehold_jepsen::flood::run(arguments).await
        }
        Command::WorkloadWorker(arguments) => leasehold_jepsen::workload::run(arguments).await,
        Command::Check { history, linearizability_budget_s, semaphore_limit } => {
            use leasehold_jepsen::{checker, history as records};
            let operations = records::operations(&records::read_records(&history)?);
            let budget = std::time::Duration::from_secs(linearizability_budget_s);
            let mut valid = true;
            let mut checks = vec![
                checker::tokens(&operations),
                checker::semaphore_holders(&operations, semaphore_limit),
                checker::elections(&operations),
                checker::linearizability(&operations, budget),
            ];
            // A run with the attack workload: no attack may have succeeded.
            if operations.iter().any(|operation| operation.function == records::Function::Attack) {
                checks.push(checker::attacks(&operations, &checker::expected_attacks(&operations)));
            }
            for check in checks {
                println!("{} {} {}", check.name, check.verdict.name(), check.detail);
                for anomaly in &check.anomalies {
                    println!("  {}", anomaly.what);
                    for operation in &anomaly.operations {
                        println!("      {operation}");
                    }
                }
                valid &= matches!(check.verdict, checker::Verdict::Pass | checker::Verdict::Skipped);
            }
            std::process::exit(if valid { 0 } else { 1 });
        }
        Command::Worker(arguments) => leasehold_jepsen::worker::run(arguments).await,
    }
}
