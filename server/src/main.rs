//! `leasehold-server`: runs one Leasehold node.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use leasehold_server::node;
use leasehold_server::node::config::{Config, RawConfig};
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
  6    this build is older than what the cluster's log (or the data directory's) uses:
       upgrade this node (README, \"Upgrading\")
  7    a task the node needs (a server, the expiry loop, a watch) ended while it ran
  134  a panic: a broken invariant stopped the process (a panic while applying names
       the log entry)";

#[derive(Parser, Debug)]
#[command(
    name = "leasehold-server",
    version,
    about = "Runs one Leasehold node.",
    after_help = EXIT_CODES,
    args_conflicts_with_subcommands = true
)]
struct Arguments {
    /// A TOML file with any of the settings below (flags override it).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Log format: text or json. The level comes from RUST_LOG (default info).
    #[arg(long, default_value = "text")]
    log_format: String,
    #[command(flatten)]
    settings: RawConfig,
    #[command(subcommand)]
    command: Option<ServerCommand>,
}

#[derive(clap::Subcommand, Debug)]
enum ServerCommand {
    /// Makes a new cluster's data directory for one node from a backup file
    /// (`leasehold snapshot save`), then exits. Run it for every node of the new
    /// cluster with the same file, floor and members, then start the nodes as usual.
    Restore(RestoreArguments),
}

#[derive(clap::Args, Debug)]
struct RestoreArguments {
    /// The backup file.
    #[arg(long)]
    from: PathBuf,
    /// The new node's data directory: absent or empty.
    #[arg(long)]
    data_dir: PathBuf,
    #[arg(long)]
    node_id: u64,
    #[arg(long, default_value = leasehold_server::node::config::CLUSTER_NAME_DEFAULT)]
    cluster_name: String,
    /// The new cluster's members, `ID=CLIENT_ADDR,PEER_ADDR`, repeated: the same list
    /// for every node, given again as --initial-member when the nodes start.
    #[arg(long = "initial-member", value_name = "ID=CLIENT_ADDR,PEER_ADDR", required = true)]
    initial_members: Vec<String>,
    /// Every token the new cluster grants is above this: give the old cluster's last
    /// log index or more (`leasehold status`, or the metric
    /// leasehold_raft_last_log_index), so that tokens granted after the backup was
    /// taken are below it too. Default: the backup's index + 2^40.
    #[arg(long)]
    token_floor: Option<u64>,
}

fn restore(arguments: RestoreArguments) -> ExitCode {
    let mut members = std::collections::BTreeMap::new();
    for text in &arguments.initial_members {
        match leasehold_server::node::config::parse_member(text) {
            Ok((id, node)) => {
                members.insert(id, node);
            }
            Err(error) => {
                eprintln!("leasehold-server restore: {error}");
                return ExitCode::from(2);
            }
        }
    }
    let options = leasehold_server::node::restore::RestoreOptions {
        backup: arguments.from,
        data_dir: arguments.data_dir,
        node_id: arguments.node_id,
        cluster_name: arguments.cluster_name,
        members,
        token_floor: arguments.token_floor,
    };
    match leasehold_server::node::restore::restore(&options) {
        Ok(restored) => {
            println!(
                "restored node {} into {}: the state saved at index {} ({} sessions, {} locks), starting at index {}; \
                 every new token is above it",
                options.node_id,
                options.data_dir.display(),
                restored.backup_index,
                restored.sessions,
                restored.locks,
                restored.starts_at
            );
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("leasehold-server restore: {error}");
            ExitCode::from(error.exit_code())
        }
    }
}

fn main() -> ExitCode {
    // Everything the node writes (the database, its identity, a restored directory)
    // is its owner's only: it holds token and secret hashes and every tenant's names.
    // SAFETY: umask only sets the process's file mode mask, before any thread starts.
    unsafe { libc::umask(0o077) };
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
    if let Some(ServerCommand::Restore(restore_arguments)) = arguments.command {
        return restore(restore_arguments);
    }
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
    let mut running = match node::start(config, node::Environment::os()).await {
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
    use leasehold_server::raft::incarnations::{EXIT_BUILD_TOO_OLD, EXIT_STALE_INCARNATION};
    use leasehold_server::shell::fail_stop::EXIT_TASK_ENDED;

    use super::EXIT_CODES;

    #[test]
    fn the_help_lists_every_exit_code_the_node_uses() {
        for code in [
            i32::from(EXIT_DATA_DIRECTORY_REFUSED),
            EXIT_STALE_INCARNATION,
            EXIT_RAFT_FATAL,
            EXIT_BUILD_TOO_OLD,
            EXIT_TASK_ENDED,
        ] {
            assert!(EXIT_CODES.contains(&format!("\n  {code}    ")), "exit code {code} is missing:\n{EXIT_CODES}");
        }
    }
}
