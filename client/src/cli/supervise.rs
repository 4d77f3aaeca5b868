//! Running the command while something is held: its environment, its process group,
//! forwarding SIGTERM and SIGINT, and stopping it while the lease still holds when
//! the hold is in danger (SIGTERM, then SIGKILL after a quarter of the TTL).

use std::future::Future;
use std::io::ErrorKind;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;

use leasehold::{Error, Session, SessionState};
use tokio::signal::unix::{signal, SignalKind};

use super::exit::{
    EXIT_COMMAND_NOT_FOUND, EXIT_COMMAND_NOT_RUNNABLE, EXIT_INTERNAL, EXIT_LOCK_LOST, EXIT_SIGNAL_BASE, EXIT_SUCCESS,
};

/// What the command runs under, for its environment and the messages.
pub struct Hold {
    /// "lock", "semaphore" or "leadership of": what the messages say is held.
    pub what: &'static str,
    pub name: String,
    pub token: u64,
    /// What the command finds in its environment besides LEASEHOLD_SESSION.
    pub env: Vec<(&'static str, String)>,
}

/// Runs `command` while `hold` lasts, or holds until interrupted when there is no
/// command. When `lost` fires (session jeopardy or lost leadership), the command's
/// process group gets SIGTERM, then SIGKILL after a quarter of the TTL — while the
/// lease still holds — and the exit code is 70. A command that cannot be started
/// exits 127 (not found) or 126 (anything else), as env(1) does.
pub async fn supervise(
    session: &Session,
    hold: &Hold,
    print_token: bool,
    command: &[String],
    lost: impl Future<Output = SessionState>,
) -> Result<u8, Error> {
    let (what, name, token) = (hold.what, &hold.name, hold.token);
    if print_token || command.is_empty() {
        println!("{token}");
    }
    eprintln!("leasehold: holding {what} {name:?} with fencing token {token} (session {})", session.id());
    let mut terminate = signal(SignalKind::terminate()).map_err(|error| Error::Other(error.to_string()))?;
    let mut interrupt = signal(SignalKind::interrupt()).map_err(|error| Error::Other(error.to_string()))?;
    tokio::pin!(lost);

    let Some((program, arguments)) = command.split_first() else {
        tokio::select! {
            _ = terminate.recv() => return Ok(EXIT_SUCCESS),
            _ = interrupt.recv() => return Ok(EXIT_SUCCESS),
            state = &mut lost => {
                eprintln!("leasehold: session is {state:?}; the {what} {name:?} may be lost");
                return Ok(EXIT_LOCK_LOST);
            }
        }
    };

    let mut child = tokio::process::Command::new(program);
    child.args(arguments).env("LEASEHOLD_SESSION", session.id().to_string()).process_group(0).kill_on_drop(true);
    for (key, value) in &hold.env {
        child.env(key, value);
    }
    let mut child = match child.spawn() {
        Ok(child) => child,
        Err(error) => {
            eprintln!("leasehold: cannot run {program:?}: {error}");
            return Ok(if error.kind() == ErrorKind::NotFound {
                EXIT_COMMAND_NOT_FOUND
            } else {
                EXIT_COMMAND_NOT_RUNNABLE
            });
        }
    };
    let process_group = child.id().map(|id| id as i32).unwrap_or(0);

    let outcome = tokio::select! {
        status = child.wait() => Some(status),
        _ = terminate.recv() => { signal_group(process_group, libc::SIGTERM); None }
        _ = interrupt.recv() => { signal_group(process_group, libc::SIGTERM); None }
        state = &mut lost => {
            // Stop the command while the lease still holds, so its writes end before
            // another holder can be granted.
            let grace = session.ttl() / 4;
            eprintln!("leasehold: {state:?}: the {what} {name:?} is in danger; terminating the command (SIGTERM, SIGKILL after {grace:?})");
            signal_group(process_group, libc::SIGTERM);
            if tokio::time::timeout(grace, child.wait()).await.is_err() {
                signal_group(process_group, libc::SIGKILL);
                let _ = child.wait().await;
            }
            return Ok(EXIT_LOCK_LOST);
        }
    };
    let status = match outcome {
        Some(status) => status,
        None => child.wait().await,
    }
    .map_err(|error| Error::Other(format!("waiting for the command: {error}")))?;
    if session.state() == SessionState::Lost {
        return Ok(EXIT_LOCK_LOST);
    }
    Ok(exit_code(status))
}

/// Signals a whole process group.
fn signal_group(process_group: i32, signal: i32) {
    // A group id of 0 would signal our own group: the child's id was unknown.
    if process_group <= 0 {
        return;
    }
    // SAFETY: kill(2) with a negative pid signals the group we created for the child.
    unsafe {
        libc::kill(-process_group, signal);
    }
}

/// The command's exit code as the shell reports it: its own, or 128+N when signal N
/// killed it.
fn exit_code(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => code as u8,
        (None, Some(signal)) => EXIT_SIGNAL_BASE.wrapping_add(signal as u8),
        _ => EXIT_INTERNAL,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_killed_by_a_signal_exits_128_plus_the_signal() {
        // A raw wait status: the low 7 bits are the signal that ended the process, the
        // next byte its exit code.
        assert_eq!(exit_code(ExitStatus::from_raw(libc::SIGKILL)), 137);
        assert_eq!(exit_code(ExitStatus::from_raw(libc::SIGTERM)), 143);
        assert_eq!(exit_code(ExitStatus::from_raw(3 << 8)), 3);
        assert_eq!(exit_code(ExitStatus::from_raw(0)), EXIT_SUCCESS);
    }
}
