//! The command line as clap parses it: global flags, one variant per command, and the
//! flags that `lock`, `sem` and `elect` share. Durations are parsed here, so a bad
//! one is a usage error (exit 64) before anything is sent.

use std::path::PathBuf;
use std::time::Duration;

use clap::parser::ValueSource;
use clap::{ArgMatches, Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use leasehold::duration;

use super::exit;

/// How long `lock` and `sem` wait for their turn when --wait is not given (`elect`
/// campaigns until elected).
pub const WAIT_MS_DEFAULT: u64 = 30_000;

#[derive(Parser, Debug)]
#[command(name = "leasehold", version, about = "Leasehold command-line client.", after_help = exit::help_table())]
pub struct Arguments {
    /// Client addresses of the cluster's nodes, comma-separated.
    #[arg(long, env = "LEASEHOLD_ENDPOINTS", default_value = leasehold::DEFAULT_ENDPOINTS, global = true)]
    pub endpoints: String,
    /// How long a request keeps retrying (other nodes, leader changes) before it
    /// gives up: exit 69 when no node took it, 74 when it was sent but not answered.
    #[arg(
        long,
        env = "LEASEHOLD_REQUEST_TIMEOUT",
        default_value = "10s",
        value_parser = duration::parse,
        value_name = "DURATION",
        global = true
    )]
    pub request_timeout: Duration,
    #[command(flatten)]
    pub credentials: CredentialArguments,
    #[command(subcommand)]
    pub command: Command,
}

impl Arguments {
    /// Parses this process's command line (see `from_matches`).
    pub fn parse_command_line() -> Result<Arguments, clap::Error> {
        Arguments::from_matches(Arguments::command().try_get_matches()?)
    }

    /// The arguments in `matches`. `tenant add`, `tenant rotate-token` and `cert
    /// tenant` keep their --token-file (where the new token is written; whose token
    /// a certificate is bound to) only when the command line gave it: clap hands a
    /// subcommand the global flag's value, LEASEHOLD_TOKEN_FILE included, and that
    /// file is the one the CLI's own tenant token is read from.
    pub fn from_matches(mut matches: ArgMatches) -> Result<Arguments, clap::Error> {
        let given = |command: &str, actions: &[&str]| {
            matches
                .subcommand_matches(command)
                .and_then(|matches| matches.subcommand())
                .filter(|(name, _)| actions.contains(name))
                .and_then(|(_, action)| action.value_source("token_file"))
                == Some(ValueSource::CommandLine)
        };
        let token_file_given = given("tenant", &["add", "rotate-token"]) || given("cert", &["tenant"]);
        let mut arguments = Arguments::from_arg_matches_mut(&mut matches)?;
        if let Command::Tenant {
            action: TenantAction::Add { token_file, .. } | TenantAction::RotateToken { token_file, .. },
        }
        | Command::Cert { action: CertAction::Tenant { token_file, .. } } = &mut arguments.command
        {
            if !token_file_given {
                *token_file = None;
            }
        }
        Ok(arguments)
    }
}

/// How the CLI connects and who it is; each flag has its LEASEHOLD_* variable (see
/// `leasehold::settings`), which is how `./cluster.sh env` sets them.
#[derive(Args, Debug, Clone, Default)]
pub struct CredentialArguments {
    /// The CA (PEM) that signed the nodes' certificates; the CLI trusts no other.
    #[arg(long, env = "LEASEHOLD_CA_FILE", value_name = "FILE", global = true)]
    pub ca_file: Option<PathBuf>,
    /// A file whose first line is this tenant's bearer token.
    #[arg(long, env = "LEASEHOLD_TOKEN_FILE", value_name = "FILE", global = true)]
    pub token_file: Option<PathBuf>,
    /// A client certificate (PEM) naming `<tenant>.<tag>.tenant.leasehold` (`leasehold
    /// cert tenant`), instead of a token.
    #[arg(long, env = "LEASEHOLD_CERT_FILE", value_name = "FILE", global = true, requires = "key_file")]
    pub cert_file: Option<PathBuf>,
    /// The private key of --cert-file.
    #[arg(long, env = "LEASEHOLD_KEY_FILE", value_name = "FILE", global = true, requires = "cert_file")]
    pub key_file: Option<PathBuf>,
    /// The admin credential's file: `member`, `tenant` and `status --all` need it;
    /// `status` and `session list` use it, when given, instead of the tenant's
    /// credential.
    #[arg(long, env = "LEASEHOLD_ADMIN_TOKEN_FILE", value_name = "FILE", global = true)]
    pub admin_token_file: Option<PathBuf>,
    /// Speak plaintext, to a cluster started with --insecure-plaintext.
    #[arg(
        long,
        env = "LEASEHOLD_INSECURE_PLAINTEXT",
        global = true,
        action = clap::ArgAction::SetTrue,
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub insecure_plaintext: bool,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Members, leader, term, commit and applied index of each node.
    Status {
        #[arg(long)]
        json: bool,
        /// Also every tenant's usage against its quotas (admin credential).
        #[arg(long)]
        all: bool,
    },
    /// List, add or remove cluster members.
    Member {
        #[command(subcommand)]
        action: MemberAction,
    },
    /// Back up the whole replicated state (admin credential).
    Snapshot {
        #[command(subcommand)]
        action: SnapshotAction,
    },
    /// Run a command while holding a lock.
    ///
    /// The command sees LEASEHOLD_LOCK, LEASEHOLD_FENCING_TOKEN and LEASEHOLD_SESSION
    /// in its environment. Exit codes: the command's own; 75 when the lock was not
    /// acquired; 70 when the session went into jeopardy and the command was
    /// terminated (SIGTERM, then SIGKILL after a quarter of the TTL) before the lease
    /// ran out; the others as in `leasehold --help`.
    Lock {
        /// The lock's name.
        name: String,
        /// Lock-delay: if this session expires while holding the lock (the process
        /// was killed, paused or cut off; not on a clean exit), nobody gets the lock
        /// for this long after the expiry. For side effects a fencing token cannot
        /// guard. Default: the cluster's for the name (none unless configured with
        /// --lock-delay-default); 0s for none; at most 60s.
        #[arg(long, value_parser = duration::parse, value_name = "DURATION")]
        lock_delay: Option<Duration>,
        #[command(flatten)]
        hold: HoldArguments,
    },
    /// Run a command while holding a semaphore permit (at most LIMIT holders at once).
    ///
    /// Same supervision and exit codes as `lock`; the command sees LEASEHOLD_SEMAPHORE,
    /// LEASEHOLD_FENCING_TOKEN and LEASEHOLD_SESSION.
    Sem {
        /// The semaphore's name.
        name: String,
        /// At most this many holders; the first acquirer sets it, and an acquire with
        /// another limit is refused (exit 76).
        #[arg(long)]
        limit: u32,
        /// Lock-delay of the permit, as for `lock`: an expired holder's permit goes
        /// to nobody for this long and counts against the limit meanwhile.
        #[arg(long, value_parser = duration::parse, value_name = "DURATION")]
        lock_delay: Option<Duration>,
        #[command(flatten)]
        hold: HoldArguments,
    },
    /// Campaign to lead NAME with VALUE; print when elected; run the command while
    /// leader (or hold until interrupted). Losing leadership terminates the command
    /// as `lock` does (exit 70).
    ///
    /// The command sees LEASEHOLD_ELECTION, LEASEHOLD_LEADER_VALUE,
    /// LEASEHOLD_FENCING_TOKEN and LEASEHOLD_SESSION.
    Elect {
        /// The election's name.
        name: String,
        /// What the leader announces (`leasehold leader` shows it): a host name, an
        /// address.
        value: String,
        #[command(flatten)]
        hold: HoldArguments,
    },
    /// The current leader of an election.
    Leader {
        name: String,
        #[arg(long)]
        json: bool,
    },
    /// Print every change of an election's leader, one line each, until interrupted.
    Observe {
        name: String,
        #[arg(long)]
        json: bool,
    },
    /// Describe a lock, a semaphore or a session.
    Describe {
        #[command(subcommand)]
        what: DescribeWhat,
    },
    /// Fencing token checks.
    Fence {
        #[command(subcommand)]
        action: FenceAction,
    },
    /// Sessions.
    Session {
        #[command(subcommand)]
        action: SessionAction,
    },
    /// Tenants: add one, list them with their usage, rotate a token, set quotas,
    /// remove one. Admin credential only (--admin-token-file).
    Tenant {
        #[command(subcommand)]
        action: TenantAction,
    },
    /// Make certificates for a local or test cluster (a CA, nodes, tenants).
    Cert {
        #[command(subcommand)]
        action: CertAction,
    },
    /// Print a new random token (for the admin token file, say).
    NewToken {
        /// What the token is for, written before it ("admin" gives admin_…).
        #[arg(long, default_value = "token")]
        prefix: String,
    },
}

#[derive(Subcommand, Debug)]
pub enum CertAction {
    /// A new CA in DIR: ca.pem and ca.key (refuses to overwrite an existing one).
    Ca { directory: PathBuf },
    /// A node certificate signed by DIR's CA: node-ID.pem and node-ID.key, naming
    /// node-ID.leasehold and every --host (DNS names or IP addresses clients dial).
    Node {
        directory: PathBuf,
        #[arg(long)]
        id: u64,
        #[arg(long = "host", value_name = "HOST")]
        hosts: Vec<String>,
    },
    /// A tenant's client certificate signed by DIR's CA: tenant-NAME.pem and .key,
    /// naming NAME.TAG.tenant.leasehold, where TAG is bound to the tenant's token:
    /// once the token is rotated or the tenant removed, the certificate stops working.
    Tenant {
        directory: PathBuf,
        name: String,
        /// The file holding the tenant's current token (as `tenant add --token-file`
        /// or `tenant rotate-token --token-file` wrote it). Taken from the command
        /// line only, never from LEASEHOLD_TOKEN_FILE.
        #[arg(long, value_name = "FILE")]
        token_file: Option<PathBuf>,
    },
}

/// The flags of the commands that hold something (a lock, a permit, leadership)
/// while they run a command: `lock`, `sem` and `elect`.
#[derive(Args, Debug)]
pub struct HoldArguments {
    /// Session TTL: how long the cluster keeps the session, and so what it holds,
    /// after the last keepalive it answered.
    #[arg(long, default_value = "10s", value_parser = duration::parse, value_name = "DURATION")]
    pub ttl: Duration,
    /// How long to wait for the lock, the permit or leadership before giving up
    /// (exit 75). Default: 30s for `lock` and `sem`; `elect` campaigns until elected.
    #[arg(long, value_parser = duration::parse, value_name = "DURATION", conflicts_with = "try_only")]
    pub wait: Option<Duration>,
    /// Do not wait: exit 75 at once if it is held (or the semaphore is full).
    #[arg(long = "try")]
    pub try_only: bool,
    /// Print the fencing token on stdout before running the command.
    #[arg(long)]
    pub print_token: bool,
    /// The command and its arguments (after `--`). Without one, print the token and
    /// hold until interrupted.
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

impl HoldArguments {
    /// How long `lock` and `sem` wait: not at all with --try, else --wait, else
    /// `WAIT_MS_DEFAULT`.
    pub fn wait_or_default(&self) -> Duration {
        self.wait_max().unwrap_or(Duration::from_millis(WAIT_MS_DEFAULT))
    }

    /// How long `elect` campaigns: not at all with --try, else --wait; None (until
    /// elected) without either.
    pub fn wait_max(&self) -> Option<Duration> {
        if self.try_only {
            Some(Duration::ZERO)
        } else {
            self.wait
        }
    }
}

#[derive(Subcommand, Debug)]
pub enum MemberAction {
    List {
        #[arg(long)]
        json: bool,
    },
    /// Add a node (started without --initial-member, or with --new-incarnation to
    /// replace a node that lost its data): learner first, then voter.
    Add {
        node_id: u64,
        client_addr: String,
        peer_addr: String,
        /// Leave it a non-voting learner.
        #[arg(long)]
        learner: bool,
    },
    /// Remove a node; it stops serving. The first step of replacing a node whose
    /// data directory was lost.
    Remove { node_id: u64 },
}

#[derive(Subcommand, Debug)]
pub enum SnapshotAction {
    /// Save the state, read by the leader at a linearizable point, to FILE (a backup
    /// file with its index, cluster id and SHA-256); `leasehold-server restore` makes
    /// a new cluster from it.
    Save { file: std::path::PathBuf },
}

#[derive(Subcommand, Debug)]
pub enum TenantAction {
    /// Add a tenant and print its bearer token. The token is shown only this once
    /// (the cluster keeps a hash of it): keep it, or give --token-file.
    Add {
        /// The tenant's name: 1 to 63 lowercase letters, digits and inner '-' (its
        /// client certificates name `<NAME>.<TAG>.tenant.leasehold`); "admin" is reserved.
        name: String,
        #[command(flatten)]
        quotas: QuotaArguments,
        /// Write the token to FILE (mode 0600, replacing it) and print only the path,
        /// instead of printing the token. Taken from the command line only, never
        /// from LEASEHOLD_TOKEN_FILE.
        #[arg(long, value_name = "FILE")]
        token_file: Option<PathBuf>,
    },
    /// Every tenant with its usage against its quotas and the replicated state it
    /// takes (the admin namespace first, without quotas).
    List {
        /// One JSON array instead of the table.
        #[arg(long)]
        json: bool,
    },
    /// Give a tenant a new token and print it; the old one stops working at once.
    /// The new token is shown only this once: keep it, or give --token-file.
    RotateToken {
        /// The tenant's name.
        name: String,
        /// Write the new token to FILE (mode 0600, replacing it) and print only the
        /// path, instead of printing the token. Taken from the command line only,
        /// never from LEASEHOLD_TOKEN_FILE.
        #[arg(long, value_name = "FILE")]
        token_file: Option<PathBuf>,
    },
    /// Change some of a tenant's quotas; those not given keep their values. Lowering
    /// one takes nothing away: it refuses new sessions, holds or waits until the
    /// usage is below it.
    #[command(group(
        clap::ArgGroup::new("some_quota").required(true).multiple(true).args(["max_sessions", "max_holds", "max_waiters", "weight", "max_ops_per_second"])
    ))]
    SetQuotas {
        /// The tenant's name.
        name: String,
        #[command(flatten)]
        quotas: QuotaArguments,
    },
    /// Remove a tenant: its token stops working, its sessions end (what they held is
    /// released) and the number ended is printed.
    Remove {
        /// The tenant's name.
        name: String,
    },
}

/// A tenant's quotas on the command line; each one not given is the cluster's
/// default (`tenant add`) or stays as it is (`tenant set-quotas`).
#[derive(Args, Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QuotaArguments {
    /// The most sessions the tenant may have at once (the cluster's default: 10000).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_sessions: Option<u32>,
    /// The most locks, semaphore permits and leaderships it may hold at once (the
    /// cluster's default: 100000).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_holds: Option<u32>,
    /// The most waits in lock, semaphore and election queues it may have at once (the
    /// cluster's default: 100000).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_waiters: Option<u32>,
    /// Its share of each log entry while other tenants wait too, against their
    /// weights (default 1, at most 1000).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1_000))]
    pub weight: Option<u32>,
    /// The commands a second the leader takes from it; past it they are refused with
    /// RATE_LIMITED and a retry-after, which the clients wait out (0: no quota, the
    /// default).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(0..=10_000_000))]
    pub max_ops_per_second: Option<u32>,
}

#[derive(Subcommand, Debug)]
pub enum DescribeWhat {
    Lock {
        name: String,
        #[arg(long)]
        json: bool,
    },
    Sem {
        /// The semaphore's name.
        name: String,
        #[arg(long)]
        json: bool,
    },
    Session {
        session_id: u64,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand, Debug)]
pub enum FenceAction {
    /// Exit 0 if TOKEN is the current grant of NAME, 1 if it was superseded; any
    /// other code means the check could not be made (see `leasehold --help`).
    Check { name: String, token: u64 },
}

#[derive(Subcommand, Debug)]
pub enum SessionAction {
    /// Every session: its locks, permits and leaderships with their tokens, and what
    /// it waits or campaigns for.
    List {
        #[arg(long)]
        json: bool,
    },
    /// End a tenant's session (admin credential), as if it had expired: what it
    /// holds goes to the next waiters, after the lock-delays its grants asked for,
    /// and its holder's next keepalive learns that the session is lost. For a holder
    /// that must stop now (a leaked credential, a stuck worker). Exits 0 when it
    /// ended, 76 (refused) when that tenant has no live session with the id.
    Close {
        /// The session's id (`session list` shows it).
        session_id: u64,
        /// The tenant whose session it is ("admin" for the admin's own sessions):
        /// checked, so that a mistyped id ends nothing.
        #[arg(long, value_name = "NAME")]
        tenant: String,
    },
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    fn parse(line: &[&str]) -> Result<Arguments, clap::Error> {
        Arguments::try_parse_from(std::iter::once("leasehold").chain(line.iter().copied()))
    }

    fn hold_of(arguments: Arguments) -> HoldArguments {
        match arguments.command {
            Command::Lock { hold, .. } | Command::Sem { hold, .. } | Command::Elect { hold, .. } => hold,
            other => panic!("not a hold command: {other:?}"),
        }
    }

    #[test]
    fn the_definition_is_consistent() {
        Arguments::command().debug_assert();
    }

    #[test]
    fn the_default_request_timeout_is_the_client_default() {
        let arguments = parse(&["status"]).unwrap();
        let default = Duration::from_millis(leasehold::client::REQUEST_DEADLINE_MS_DEFAULT);
        assert_eq!(arguments.request_timeout, default);
        let arguments = parse(&["--request-timeout", "1500ms", "status"]).unwrap();
        assert_eq!(arguments.request_timeout, Duration::from_millis(1_500));
        let arguments = parse(&["status", "--request-timeout", "2s"]).unwrap();
        assert_eq!(arguments.request_timeout, Duration::from_secs(2), "a global flag, after the command too");
    }

    #[test]
    fn durations_are_parsed_by_clap() {
        let hold = hold_of(parse(&["lock", "a", "--ttl", "2s", "--wait", "1m", "--", "true"]).unwrap());
        assert_eq!(hold.ttl, Duration::from_secs(2));
        assert_eq!(hold.wait_or_default(), Duration::from_secs(60));
        assert_eq!(hold.command, vec!["true".to_string()]);
        for bad in [
            &["lock", "a", "--ttl", "10x"][..],
            &["sem", "a", "--limit", "2", "--wait", "soon"],
            &["elect", "a", "v", "--ttl=-1s"],
        ] {
            let error = parse(bad).unwrap_err();
            assert_eq!(error.kind(), clap::error::ErrorKind::ValueValidation, "{bad:?}");
            assert_eq!(exit::code_of_parse(&error), exit::EXIT_USAGE, "{bad:?}");
        }
    }

    #[test]
    fn lock_and_sem_wait_30s_by_default_and_elect_until_elected() {
        let lock = hold_of(parse(&["lock", "a"]).unwrap());
        assert_eq!(lock.wait_or_default(), Duration::from_millis(WAIT_MS_DEFAULT));
        let sem = hold_of(parse(&["sem", "a", "--limit", "2", "--try"]).unwrap());
        assert_eq!(sem.wait_or_default(), Duration::ZERO);
        let elect = hold_of(parse(&["elect", "a", "value"]).unwrap());
        assert_eq!(elect.wait_max(), None);
        let elect = hold_of(parse(&["elect", "a", "value", "--wait", "5s"]).unwrap());
        assert_eq!(elect.wait_max(), Some(Duration::from_secs(5)));
        assert!(parse(&["lock", "a", "--try", "--wait", "1s"]).is_err(), "--try and --wait conflict");
    }

    #[test]
    fn every_hold_flag_is_documented() {
        let mut command = Arguments::command();
        for name in ["lock", "sem", "elect"] {
            let subcommand = command.find_subcommand_mut(name).unwrap();
            for argument in subcommand.get_arguments() {
                let id = argument.get_id().as_str();
                if id == "help" {
                    continue;
                }
                let documented = argument.get_help().is_some();
                assert!(documented, "`{name}`'s {id} has no help text");
            }
        }
    }

    fn tenant_action_of(line: &[&str]) -> Result<TenantAction, clap::Error> {
        let command = Arguments::command();
        let matches = command.try_get_matches_from(std::iter::once("leasehold").chain(line.iter().copied()))?;
        match Arguments::from_matches(matches)?.command {
            Command::Tenant { action } => Ok(action),
            other => panic!("not a tenant command: {other:?}"),
        }
    }

    #[test]
    fn tenant_commands_take_quotas_and_a_token_file_to_write() {
        let action = tenant_action_of(&["tenant", "add", "payments", "--max-holds", "9", "--token-file", "p.token"]);
        match action.unwrap() {
            TenantAction::Add { name, quotas, token_file } => {
                assert_eq!(name, "payments");
                assert_eq!(quotas, QuotaArguments { max_holds: Some(9), ..QuotaArguments::default() });
                assert_eq!(token_file, Some(PathBuf::from("p.token")));
            }
            other => panic!("{other:?}"),
        }
        // Given before the subcommand, it is still given on the command line.
        match tenant_action_of(&["--token-file", "q.token", "tenant", "rotate-token", "payments"]).unwrap() {
            TenantAction::RotateToken { token_file, .. } => assert_eq!(token_file, Some(PathBuf::from("q.token"))),
            other => panic!("{other:?}"),
        }
        let error = tenant_action_of(&["tenant", "set-quotas", "payments"]).unwrap_err();
        assert_eq!(error.kind(), clap::error::ErrorKind::MissingRequiredArgument, "set-quotas sets at least one");
        let error = tenant_action_of(&["tenant", "add", "payments", "--max-sessions", "0"]).unwrap_err();
        assert_eq!(error.kind(), clap::error::ErrorKind::ValueValidation, "0 is no quota");
        assert_eq!(exit::code_of_parse(&error), exit::EXIT_USAGE);
    }

    #[test]
    fn every_tenant_flag_is_documented() {
        let mut command = Arguments::command();
        let tenant = command.find_subcommand_mut("tenant").unwrap();
        for action in tenant.get_subcommands().filter(|action| action.get_name() != "help") {
            assert!(action.get_about().is_some(), "`tenant {}` has no help text", action.get_name());
            for argument in action.get_arguments() {
                let id = argument.get_id().as_str();
                assert!(
                    id == "help" || argument.get_help().is_some(),
                    "`tenant {}`'s {id} has no help",
                    action.get_name()
                );
            }
        }
    }

    #[test]
    fn help_and_version_exit_0_and_help_shows_the_exit_codes() {
        for line in [&["--help"][..], &["-h"], &["--version"]] {
            let error = parse(line).unwrap_err();
            assert_eq!(exit::code_of_parse(&error), exit::EXIT_SUCCESS, "{line:?}");
        }
        let help = parse(&["--help"]).unwrap_err().to_string();
        assert!(help.contains("Exit codes:"), "{help}");
        assert!(help.contains(exit::help_table().trim_end()), "{help}");
        for line in [&["--bogus"][..], &[], &["lock"], &["fence", "check", "a", "not-a-number"]] {
            let error = parse(line).unwrap_err();
            assert_eq!(exit::code_of_parse(&error), exit::EXIT_USAGE, "{line:?}");
        }
    }
}
