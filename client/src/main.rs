//! `leasehold`: the command-line client. Parse the command line, run the command
//! (one module per family under `cli/`), and exit with a code a script can trust
//! (the table is in `cli/exit.rs` and `leasehold --help`).

mod cli;

use std::process::ExitCode;

use leasehold::Error;

use cli::arguments::{Arguments, Command, FenceAction, SessionAction};
use cli::connect::Role;
use cli::exit;

fn main() -> ExitCode {
    // Like other command-line tools, end quietly when the reader of our output goes
    // away (`leasehold session list | head`) instead of panicking on EPIPE.
    // SAFETY: restoring the default disposition of SIGPIPE before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    // clap exits 2 on its own; a wrong command line is EX_USAGE (64) here.
    let arguments = match Arguments::parse_command_line() {
        Ok(arguments) => arguments,
        Err(error) => {
            let _ = error.print();
            return ExitCode::from(exit::code_of_parse(&error));
        }
    };
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("tokio runtime");
    match runtime.block_on(run(arguments)) {
        Ok(code) => ExitCode::from(code),
        Err(error) => {
            eprintln!("leasehold: {error}");
            ExitCode::from(exit::code_of(&error))
        }
    }
}

/// Runs one command; its exit code, or the error that stopped it.
async fn run(arguments: Arguments) -> Result<u8, Error> {
    let client =
        |role| cli::connect::client(&arguments.endpoints, arguments.request_timeout, &arguments.credentials, role);
    match arguments.command {
        Command::Cert { action } => cli::cert::run(action),
        Command::NewToken { prefix } => cli::cert::new_token(&prefix),
        Command::Status { json, all } => {
            let role = if all { Role::Admin } else { Role::AdminIfGiven };
            cli::status::run(&client(role)?, json, all).await
        }
        Command::Member { action } => cli::member::run(&client(Role::Admin)?, action).await,
        Command::Snapshot { action } => cli::snapshot::run(&client(Role::Admin)?, action).await,
        Command::Tenant { action } => cli::tenant::run(&client(Role::Admin)?, action).await,
        Command::Lock { name, lock_delay, hold } => {
            cli::hold::lock(&client(Role::Tenant)?, &name, lock_delay, hold).await
        }
        Command::Sem { name, limit, lock_delay, hold } => {
            cli::hold::semaphore(&client(Role::Tenant)?, &name, limit, lock_delay, hold).await
        }
        Command::Elect { name, value, hold } => cli::hold::elect(&client(Role::Tenant)?, &name, &value, hold).await,
        Command::Leader { name, json } => cli::leader::leader(&client(Role::Tenant)?, &name, json).await,
        Command::Observe { name, json } => cli::leader::observe(&client(Role::Tenant)?, &name, json).await,
        Command::Describe { what } => cli::describe::run(&client(Role::Tenant)?, what).await,
        Command::Fence { action: FenceAction::Check { name, token } } => {
            cli::fence::check(&client(Role::Tenant)?, &name, token).await
        }
        Command::Session { action: SessionAction::List { json } } => {
            cli::session::list(&client(Role::AdminIfGiven)?, json).await
        }
        Command::Session { action: SessionAction::Close { session_id, tenant } } => {
            cli::session::close(&client(Role::Admin)?, session_id, &tenant).await
        }
    }
}
