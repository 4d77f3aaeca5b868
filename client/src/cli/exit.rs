//! Exit codes a script can trust: each failure has its own code (from sysexits.h
//! where one fits), `fence check` alone uses 1, and `leasehold --help` prints them
//! all from the one table here.

use leasehold::Error;

/// Success; for `fence check`: the token is the current grant.
pub const EXIT_SUCCESS: u8 = 0;
/// `fence check` only: the token was superseded.
pub const EXIT_SUPERSEDED: u8 = 1;
/// EX_USAGE: the command line is wrong, or the server refused the request as
/// malformed (`Error::InvalidArgument`).
pub const EXIT_USAGE: u8 = 64;
/// EX_UNAVAILABLE: no node could be reached or none leads (`Error::Unavailable`).
pub const EXIT_UNAVAILABLE: u8 = 69;
/// The session went into jeopardy (or the leadership was lost) while the command
/// ran, and the command was stopped.
pub const EXIT_LOCK_LOST: u8 = 70;
/// EX_OSERR: an internal error (`Error::Other`).
pub const EXIT_INTERNAL: u8 = 71;
/// EX_IOERR: the request was sent but not answered in time; it may have taken effect
/// (`Error::Indeterminate`).
pub const EXIT_INDETERMINATE: u8 = 74;
/// Not acquired: busy with --try, or the wait ran out.
pub const EXIT_NOT_ACQUIRED: u8 = 75;
/// EX_PROTOCOL: the server refused the request (`NotFound`, `Refused`,
/// `LimitReached`, `SessionLost`).
pub const EXIT_REFUSED: u8 = 76;
/// EX_NOPERM: no credential or an unknown one (`Error::Unauthenticated`), or a known
/// one acting outside its rights (`Error::PermissionDenied`).
pub const EXIT_NOT_PERMITTED: u8 = 77;
/// The command after `--` exists but could not be run (as env(1) and timeout(1)).
pub const EXIT_COMMAND_NOT_RUNNABLE: u8 = 126;
/// The command after `--` was not found (as env(1) and timeout(1)).
pub const EXIT_COMMAND_NOT_FOUND: u8 = 127;
/// A command killed by signal N exits 128 + N, as in the shell.
pub const EXIT_SIGNAL_BASE: u8 = 128;

/// Every code leasehold itself exits with, and what it means: the one table that
/// `leasehold --help` prints. Each entry is one or more lines.
pub const EXIT_CODES: [(u8, &[&str]); 12] = [
    (EXIT_SUCCESS, &["success; `fence check`: the token is current"]),
    (EXIT_SUPERSEDED, &["`fence check`: the token was superseded (no other command exits 1)"]),
    (EXIT_USAGE, &["usage: a wrong command line, or a request the server found malformed"]),
    (EXIT_UNAVAILABLE, &["unavailable: no node could be reached, or none leads", "(`status`: no node answered)"]),
    (
        EXIT_LOCK_LOST,
        &[
            "lock lost: the session went into jeopardy (or the leadership was lost)",
            "while the command ran, and the command was stopped",
        ],
    ),
    (EXIT_INTERNAL, &["internal error (e.g. a signal handler could not be installed)"]),
    (
        EXIT_INDETERMINATE,
        &["indeterminate: the request was sent but not answered in time; it may", "have taken effect"],
    ),
    (EXIT_NOT_ACQUIRED, &["not acquired: busy with --try, or the wait ran out"]),
    (
        EXIT_REFUSED,
        &[
            "refused by the server: not found, refused, a limit reached, or the",
            "session lost (e.g. a semaphore acquired with another limit than its",
            "current one, an unknown session in `describe session`)",
        ],
    ),
    (
        EXIT_NOT_PERMITTED,
        &[
            "not permitted: no credential or an unknown one, or one that may not do",
            "this (an admin command without the admin token, a wrong session secret)",
        ],
    ),
    (EXIT_COMMAND_NOT_RUNNABLE, &["the command after `--` exists but could not be run"]),
    (EXIT_COMMAND_NOT_FOUND, &["the command after `--` was not found"]),
];

/// What follows the table: the codes of the command that `lock`, `sem` and `elect` run.
const EXIT_CODES_FOOTER: [&str; 5] = [
    "Otherwise `lock`, `sem` and `elect` exit with their command's own code",
    "(128+N when it was killed by signal N). A command's own code can be any",
    "number, these included: a script that must tell leasehold's codes from its",
    "command's should use --print-token (the token is printed before the command",
    "runs) or read leasehold's messages on stderr.",
];

/// The exit-code table for `leasehold --help`.
pub fn help_table() -> String {
    let mut text = String::from("Exit codes:\n");
    for (code, lines) in EXIT_CODES {
        for (index, line) in lines.iter().enumerate() {
            let number = if index == 0 { code.to_string() } else { String::new() };
            text.push_str(&format!("  {number:<5}{line}\n"));
        }
    }
    text.push('\n');
    for line in EXIT_CODES_FOOTER {
        text.push_str(line);
        text.push('\n');
    }
    text
}

/// The code for a request that failed. Every variant is named, so a new one must be
/// given its code here.
pub fn code_of(error: &Error) -> u8 {
    match error {
        Error::InvalidArgument(_) => EXIT_USAGE,
        Error::Unavailable(_) | Error::Overloaded(_) => EXIT_UNAVAILABLE,
        Error::Indeterminate(_) => EXIT_INDETERMINATE,
        Error::NotFound(_) | Error::Refused(_) | Error::LimitReached(_) | Error::SessionLost(_) => EXIT_REFUSED,
        Error::Unauthenticated(_) | Error::PermissionDenied(_) => EXIT_NOT_PERMITTED,
        Error::Other(_) => EXIT_INTERNAL,
    }
}

/// The code for a command line clap did not accept: 0 for `--help` and `--version`
/// (clap reports those as errors too), 64 for everything else (clap's own is 2).
pub fn code_of_parse(error: &clap::Error) -> u8 {
    if error.use_stderr() {
        EXIT_USAGE
    } else {
        EXIT_SUCCESS
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_error_has_its_code() {
        let cases = [
            (Error::InvalidArgument("name too long".into()), EXIT_USAGE),
            (Error::Unavailable("no leader".into()), EXIT_UNAVAILABLE),
            (Error::Overloaded("tenant queue full".into()), EXIT_UNAVAILABLE),
            (Error::Indeterminate("no answer".into()), EXIT_INDETERMINATE),
            (Error::NotFound("session 7".into()), EXIT_REFUSED),
            (Error::Refused("limit 2, not 3".into()), EXIT_REFUSED),
            (Error::LimitReached("sessions".into()), EXIT_REFUSED),
            (Error::SessionLost(7), EXIT_REFUSED),
            (Error::Other("signal handler".into()), EXIT_INTERNAL),
            (Error::Unauthenticated("no credential".into()), EXIT_NOT_PERMITTED),
            (Error::PermissionDenied("tenant b".into()), EXIT_NOT_PERMITTED),
        ];
        for (error, code) in cases {
            assert_eq!(code_of(&error), code, "{error:?}");
        }
    }

    #[test]
    fn no_error_exits_like_a_superseded_token_or_a_lost_lock() {
        let errors = [
            Error::InvalidArgument(String::new()),
            Error::Unavailable(String::new()),
            Error::Overloaded(String::new()),
            Error::Indeterminate(String::new()),
            Error::NotFound(String::new()),
            Error::Refused(String::new()),
            Error::LimitReached(String::new()),
            Error::SessionLost(0),
            Error::Other(String::new()),
            Error::Unauthenticated(String::new()),
            Error::PermissionDenied(String::new()),
        ];
        for error in errors {
            let code = code_of(&error);
            assert!(
                ![EXIT_SUCCESS, EXIT_SUPERSEDED, EXIT_LOCK_LOST, EXIT_NOT_ACQUIRED].contains(&code),
                "{error:?} exits {code}, which means something else"
            );
        }
    }

    #[test]
    fn the_table_lists_each_code_once_in_order() {
        let codes: Vec<u8> = EXIT_CODES.iter().map(|(code, _)| *code).collect();
        assert!(codes.windows(2).all(|pair| pair[0] < pair[1]), "{codes:?}");
        let table = help_table();
        for code in codes {
            let rows = table.lines().filter(|line| line.split_whitespace().next() == Some(&code.to_string())).count();
            assert_eq!(rows, 1, "code {code} in:\n{table}");
        }
    }
}
