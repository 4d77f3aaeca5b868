//! `leasehold-server`: runs one Leasehold node.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use leasehold_server::node;
use leasehold_server::node::config::{Config, RawConfig};
use leasehold_server::shell::clock::Clock;
use tokio::signal::unix::{signal, SignalKind};

/// The exit codes, as the README's "Operations" section explains them.
const EXIT_CODES: &str = "\
Exit codes:
  0    stopped by SIGTERM/SIGINT, or removed from the cluster
  1    could not start (a port in use, a file it cannot read, Raft did not start)
  2    invalid configuration
  3    the data directory is refused, untouched (another cluster's or node's, not
       Leasehold's, another format, corrupt, or not empty with --new-incarnation)
  4    the cluster knows this node as another incarnation: its data directory was
       wiped or replaced; replace the node (README, \"Replacing a node\")
  5    Raft stopped on a fatal error (a failed write or fsync: a full or failing disk)
  134  a panic: a broken invariant stopped the process";

#[derive(Parser, Debug)]
#[command(name = "leasehold-server", version, about = "Runs one Leasehold node.", after_help = EXIT_CODES)]
struct Arguments {
    /// A TOML file with any of the settings below (flags override it).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Log format: text or json. The level comes from RUST_LOG (default info).
    #[arg(long, default_value = "text")]
    log_format: String,
    #[command(flatten)]
    settings: RawConfig,
}

fn main() -> ExitCode {
    let arguments = Arguments::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,openraft=warn"));
    match arguments.log_format.as_str() {
        "json" => tracing_subscriber::fmt().json().with_env_filter(filter).init(),
        "text" => tracing_subscriber::fmt().with_env_filter(filter).init(),
        other => {
            eprintln!("leasehold-server: invalid configuration: --log-format {other:?} is neither text nor json");
            return ExitCode::from(2);
        }
    }
    leasehold_server::shell::fail_stop::install();
    let raw = match &arguments.config {
        Some(path) => match RawConfig::from_toml_file(path) {
            Ok(file) => arguments.settings.merged_over(file),
            Err(error) => {
                eprintln!("leasehold-server: {error}");
                return ExitCode::from(2);
            }
        },
        None => arguments.settings,
    };
    let config = match Config::validate(raw) {
        Ok(config) => config,
        Err(error) => {
            eprintln!("leasehold-server: {error}");
            return ExitCode::from(2);
        }
    };
    leasehold_server::shell::memory::tune_allocator();
    if let Err(error) = leasehold_server::shell::memory::start_trimmer() {
        eprintln!("leasehold-server: cannot start the heap trimmer thread: {error}");
        return ExitCode::from(1);
    }
    let runtime =
        match tokio::runtime::Builder::new_multi_thread().worker_threads(config.worker_threads).enable_all().build() {
            Ok(runtime) => runtime,
            Err(error) => {
                eprintln!("leasehold-server: cannot start {} worker threads: {error}", config.worker_threads);
                return ExitCode::from(1);
            }
        };
    runtime.block_on(run(config))
}

async fn run(config: Config) -> ExitCode {
    let mut running = match node::start(config, Clock::system()).await {
        Ok(running) => running,
        Err(error) => {
            eprintln!("leasehold-server: cannot start: {error}");
            return ExitCode::from(error.exit_code());
        }
    };
    let mut terminate = signal(SignalKind::terminate()).expect("install SIGTERM handler");
    let mut interrupt = signal(SignalKind::interrupt()).expect("install SIGINT handler");
    tokio::select! {
        _ = terminate.recv() => tracing::info!("SIGTERM: shutting down"),
        _ = interrupt.recv() => tracing::info!("SIGINT: shutting down"),
        _ = running.retired() => tracing::warn!("removed from the cluster: shutting down"),
    }
    running.shutdown().await;
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use leasehold_server::node::running_node::{EXIT_DATA_DIRECTORY_REFUSED, EXIT_RAFT_FATAL};
    use leasehold_server::raft::incarnations::EXIT_STALE_INCARNATION;

    use super::EXIT_CODES;

    #[test]
    fn the_help_lists_every_exit_code_the_node_uses() {
        for code in [i32::from(EXIT_DATA_DIRECTORY_REFUSED), EXIT_STALE_INCARNATION, EXIT_RAFT_FATAL] {
            assert!(EXIT_CODES.contains(&format!("\n  {code}    ")), "exit code {code} is missing:\n{EXIT_CODES}");
        }
    }
}
