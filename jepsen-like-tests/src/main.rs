//! `leasehold-jepsen`: Leasehold's fault-injection tool. `worker` runs one test
//! worker process.

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "leasehold-jepsen",
    version,
    about = "Leasehold's fault-injection suite."
)]
struct Arguments {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// One worker: lock, (wait), write through the fenced store with the token.
    Worker(leasehold_jepsen::worker::WorkerArguments),
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match Arguments::parse().command {
        Command::Worker(arguments) => leasehold_jepsen::worker::run(arguments).await,
    }
}
