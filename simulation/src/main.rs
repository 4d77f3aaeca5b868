//! `leasehold-sim`: runs Leasehold's cluster under the seeded simulator, seed after
//! seed, and names every seed whose history fails a check.

use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use leasehold_simulation::run::{self, Bug, Options};

/// Wall time one seed may take before the run names it and stops. A seed takes
/// about half a second; one that takes this long has a host that never yields, and
/// the simulated clock does not move while a host runs, so it would never end.
const SEED_WALL_LIMIT: Duration = Duration::from_secs(120);

/// Names the seed that outran `SEED_WALL_LIMIT` and ends the process (the seed's
/// thread cannot be stopped): `running` holds the seed under way and its start.
fn watch_seeds(running: Arc<Mutex<Option<(u64, Instant)>>>) {
    std::thread::spawn(move || loop {
        std::thread::sleep(Duration::from_secs(1));
        let overdue = running.lock().unwrap().filter(|(_, started)| started.elapsed() > SEED_WALL_LIMIT);
        if let Some((seed, _)) = overdue {
            println!(
                "seed {seed}: did not end within {} s of wall time: a host kept running without yielding, so \
                 simulated time stood still (replay it with --seed {seed} under a debugger)",
                SEED_WALL_LIMIT.as_secs()
            );
            std::process::exit(1);
        }
    });
}

#[derive(Parser)]
#[command(name = "leasehold-sim", about = "Leasehold's cluster in one process under a seeded simulator")]
struct Arguments {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Runs seeds: `--seeds N` of them from `--first-seed`, or the one `--seed`.
    Run {
        /// How many seeds to run.
        #[arg(long, default_value_t = 1, conflicts_with = "seed")]
        seeds: u64,
        /// The first of the seeds (default: drawn at random and printed).
        #[arg(long)]
        first_seed: Option<u64>,
        /// Runs this one seed and prints its faults and checks.
        #[arg(long)]
        seed: Option<u64>,
        /// Nodes in the cluster: 3 or 5.
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(3..=5))]
        nodes: u64,
        /// Simulated seconds with faults, before the final healed phase.
        #[arg(long, default_value_t = 10)]
        seconds: u64,
        /// At most this many faults a seed (default: as many as its faulty phase holds).
        #[arg(long, value_parser = clap::value_parser!(u64).range(0..))]
        steps: Option<u64>,
        /// Every crash also loses the node's last synced write (a disk that lies about
        /// its flushes). Leasehold does not survive it yet: seeds fail.
        #[arg(long)]
        lying_disks: bool,
        /// Plants a known bug (a control): its seeds must fail.
        #[arg(long, value_enum)]
        bug: Option<Bug>,
        /// With --seed: writes the run's faults and history here, one JSON object a line.
        #[arg(long, requires = "seed")]
        trace: Option<std::path::PathBuf>,
    },
}

fn main() -> ExitCode {
    let Command::Run { seeds, first_seed, seed, nodes, seconds, steps, lying_disks, bug, trace } =
        Arguments::parse().command;
    if !cfg!(tokio_unstable) {
        // Without it tokio draws its runtimes' random choices (the branch order of
        // `select!`) from the operating system, and a seed does not replay.
        eprintln!(
            "leasehold-sim: built without `--cfg tokio_unstable`, so a seed would not replay; the workspace's \
             .cargo/config.toml sets it (a RUSTFLAGS in the environment replaces that setting)"
        );
        return ExitCode::from(2);
    }
    if nodes == 4 {
        eprintln!("leasehold-sim: --nodes is 3 or 5");
        return ExitCode::from(2);
    }
    let options =
        Options { nodes, faulty: Duration::from_secs(seconds), bug, steps, lying_disks, ..Options::default() };
    let (first, count, verbose) = match seed {
        Some(seed) => (seed, 1, true),
        None => (first_seed.unwrap_or_else(|| u64::from(rand::random::<u32>())), seeds, false),
    };
    if seed.is_none() {
        println!("seeds {first}..{} ({count}), {nodes} nodes, {seconds} s of faults each", first + count);
    }
    // RUST_LOG=... shows the nodes' logs of a replayed seed on stderr.
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
    let started = Instant::now();
    let running = Arc::new(Mutex::new(None));
    watch_seeds(running.clone());
    let (mut failed, mut operations, mut simulated) = (0u64, 0usize, Duration::ZERO);
    for seed in first..first + count {
        *running.lock().unwrap() = Some((seed, Instant::now()));
        let outcome = run::run(seed, &options);
        *running.lock().unwrap() = None;
        operations += outcome.operations;
        simulated += outcome.simulated;
        if verbose {
            for fault in &outcome.faults {
                println!("fault {fault}");
            }
            for check in &outcome.checks {
                println!("check {:?} {}: {}", check.verdict, check.name, check.detail);
                for anomaly in &check.anomalies {
                    println!("  {}", anomaly.what);
                    for operation in &anomaly.operations {
                        println!("    {operation}");
                    }
                }
            }
            if let Some(path) = &trace {
                if let Err(error) = std::fs::write(path, outcome.trace.join("\n") + "\n") {
                    eprintln!("leasehold-sim: cannot write {}: {error}", path.display());
                    return ExitCode::from(2);
                }
            }
        }
        if !outcome.valid() {
            failed += 1;
            println!("seed {seed}: {}", outcome.failure());
        }
    }
    let minutes = started.elapsed().as_secs_f64() / 60.0;
    println!(
        "{count} seeds run, {failed} failed, {operations} operations checked, {:.0} simulated s, {:.1} seeds per minute",
        simulated.as_secs_f64(),
        count as f64 / minutes.max(f64::EPSILON)
    );
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
