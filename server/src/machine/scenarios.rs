//! Scenarios as scripts, in the manner of etcd-io/raft's datadriven `testdata/*.txt`:
//! each file in `testdata/` is a story told as commands, each followed by what the
//! state machine answered, so that a reader sees at once what the machine does.
//!
//! ```text
//! # Comments say which behaviour the scenario pins down.
//! reset
//! ----
//!
//! create a
//! ----
//! response: session-created a id=1 ttl_ms=10000
//!
//! acquire a orders
//! ----
//! response: acquire granted token=2
//! event: granted lock orders a token=2
//! ```
//!
//! A case is a command line, a line `----`, and the expected output up to the next blank
//! line. Lines starting with `#` are comments. Every command but `reset` and the queries
//! (`describe`, `fence`, `stats`) is applied at the next log index (the first at 1, after
//! openraft's membership entry at 0), stamped `index * 1000` ms: a token is the index of
//! the command that granted it, and its `since_ms` a thousand times that.
//!
//! Sessions are named in the script: `create a` makes session `a`, whose id is the index
//! of its entry, and the output prints ids back as names. Wherever a command takes a
//! session, a number stands for that raw id (an unknown session, say). Request ids are
//! fresh for every command.
//!
//! After every command the runner checks the invariants, and that a rejected command
//! changed nothing; a command that left the state as it was (but for the last applied
//! index) prints `state: unchanged`.
//!
//! Commands (`try` makes an acquire a try-lock; without it the session waits):
//!
//! - `reset`: a fresh machine; every scenario starts with it.
//! - `create a [ttl=10s|ttl=2500ms] [name=worker-a]`: the client name defaults to `a`.
//! - `close a`, `expire a b 999`
//! - `acquire a orders [try] [delay=5s]`, `cancel a orders`, `release a orders token=4`
//! - `end-delay lock orders a`: the leader's end of the lock-delay of the grant that
//!   expired session `a` held (`end-delay semaphore jobs a` for a permit)
//! - `sem-acquire a tenant limit=2 [try] [delay=5s]`, `sem-cancel a tenant`,
//!   `sem-release a tenant token=4`, `sem-set-limit a tenant limit=3`
//! - `describe lock orders`, `describe semaphore tenant`, `describe session a`
//! - `fence lock orders token=4`, `fence semaphore tenant token=4`
//! - `stats`: the counts and every semaphore in use.
//!
//! `REWRITE=1 cargo test ... machine::scenarios` writes the actual output into the
//! files, keeping commands and comments; review the diff before committing it.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::panic::{self, AssertUnwindSafe};
use std::path::PathBuf;

use super::*;

/// Every file in `testdata/`, each run by its own test below; a file missing here fails
/// `every_scenario_file_runs`.
const SCENARIO_FILES: &[&str] =
    &["cancel_wait.txt", "close_and_expiry.txt", "lock_delay.txt", "release.txt", "semaphores.txt"];

#[test]
fn cancel_wait() {
    run_file("cancel_wait.txt");
}

#[test]
fn close_and_expiry() {
    run_file("close_and_expiry.txt");
}

#[test]
fn lock_delay() {
    run_file("lock_delay.txt");
}

#[test]
fn release() {
    run_file("release.txt");
}

#[test]
fn semaphores() {
    run_file("semaphores.txt");
}

#[test]
fn every_scenario_file_runs() {
    let mut found: Vec<String> = std::fs::read_dir(testdata_dir())
        .expect("testdata/ is readable")
        .map(|entry| entry.expect("testdata/ is readable").file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".txt"))
        .collect();
    found.sort();
    assert_eq!(found, SCENARIO_FILES, "add a test for each scenario file, and list it in SCENARIO_FILES");
}

/// The client id of every request; sequence numbers are fresh per command.
const CLIENT_ID: u64 = 7;
/// The TTL of `create` without `ttl=`.
const TTL_MS_DEFAULT: u64 = 10_000;

fn stamp_ms(index: u64) -> u64 {
    index * 1000
}

fn testdata_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src/machine/testdata")
}

/// One part of a scenario file: a line kept as it is (comment or blank), or a case.
enum Piece {
    Verbatim(String),
    Case(Case),
}

struct Case {
    /// 1-based line of the command, for messages.
    line: usize,
    command: String,
    expected: Vec<String>,
}

fn parse(file: &str, text: &str) -> Vec<Piece> {
    let lines: Vec<&str> = text.lines().collect();
    let mut pieces = Vec::new();
    let mut at = 0;
    while at < lines.len() {
        let line = lines[at];
        if line.trim().is_empty() || line.starts_with('#') {
            pieces.push(Piece::Verbatim(line.to_owned()));
            at += 1;
            continue;
        }
        assert_eq!(
            lines.get(at + 1).copied(),
            Some("----"),
            "{file}:{}: the command `{line}` must be followed by a line `----`",
            at + 1
        );
        let mut end = at + 2;
        while end < lines.len() && !lines[end].trim().is_empty() {
            end += 1;
        }
        let expected = lines[at + 2..end].iter().map(|line| line.to_string()).collect();
        pieces.push(Piece::Case(Case { line: at + 1, command: line.to_owned(), expected }));
        at = end;
    }
    pieces
}

/// Runs every case of `file`, then fails naming the first case whose output differs,
/// or, under `REWRITE=1`, writes the actual outputs into the file.
fn run_file(file: &str) {
    let path = testdata_dir().join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|error| panic!("cannot read {}: {error}", path.display()));
    let pieces = parse(file, &text);
    let rewrite = std::env::var("REWRITE").is_ok_and(|value| !value.is_empty() && value != "0");

    let mut scenario = Scenario::new();
    let mut rewritten = String::new();
    let mut mismatches = Vec::new();
    for piece in &pieces {
        let case = match piece {
            Piece::Verbatim(line) => {
                writeln!(rewritten, "{line}").unwrap();
                continue;
            }
            Piece::Case(case) => case,
        };
        let output = panic::catch_unwind(AssertUnwindSafe(|| scenario.run(&case.command)));
        let actual: Vec<String> = match output {
            Ok(output) => output.lines().map(str::to_owned).collect(),
            Err(payload) => {
                let message = payload
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| payload.downcast_ref::<&str>().map(|message| message.to_string()))
                    .unwrap_or_default();
                panic!("{file}:{}: `{}` panicked: {message}", case.line, case.command);
            }
        };
        writeln!(rewritten, "{}\n----", case.command).unwrap();
        for line in &actual {
            writeln!(rewritten, "{line}").unwrap();
        }
        if actual != case.expected {
            mismatches.push((case, actual));
        }
    }

    if rewrite {
        if rewritten != text {
            std::fs::write(&path, rewritten).unwrap_or_else(|error| panic!("cannot write {}: {error}", path.display()));
            eprintln!("rewrote {}", path.display());
        }
        return;
    }
    if let Some((case, actual)) = mismatches.first() {
        let others: Vec<String> = mismatches[1..].iter().map(|(case, _)| case.line.to_string()).collect();
        let others = if others.is_empty() {
            String::new()
        } else {
            format!("\n(the output differs at lines {} too)", others.join(", "))
        };
        panic!(
            "{file}:{}: the output of `{}` differs from the expected block (- expected, + actual):\n{}\
             run with REWRITE=1 to accept the actual output{others}",
            case.line,
            case.command,
            diff(&case.expected, actual),
        );
    }
}

/// A line diff by longest common subsequence: the blocks are a few lines long.
fn diff(expected: &[String], actual: &[String]) -> String {
    let (rows, columns) = (expected.len(), actual.len());
    // common[i][j]: the longest common subsequence of expected[i..] and actual[j..].
    let mut common = vec![vec![0usize; columns + 1]; rows + 1];
    for i in (0..rows).rev() {
        for j in (0..columns).rev() {
            common[i][j] = if expected[i] == actual[j] {
                common[i + 1][j + 1] + 1
            } else {
                common[i + 1][j].max(common[i][j + 1])
            };
        }
    }
    let mut out = String::new();
    let (mut i, mut j) = (0, 0);
    while i < rows || j < columns {
        if i < rows && j < columns && expected[i] == actual[j] {
            writeln!(out, "  {}", expected[i]).unwrap();
            i += 1;
            j += 1;
        } else if i < rows && (j == columns || common[i + 1][j] >= common[i][j + 1]) {
            writeln!(out, "- {}", expected[i]).unwrap();
            i += 1;
        } else {
            writeln!(out, "+ {}", actual[j]).unwrap();
            j += 1;
        }
    }
    out
}

/// What one applied command did.
struct Applied {
    response: Response,
    events: Vec<Event>,
    /// The state is as it was before, but for the last applied index.
    unchanged: bool,
}

/// The machine of one scenario, fed like the openraft store feeds it.
struct Scenario {
    machine: StateMachine,
    index: u64,
    sequence: u64,
    /// Script names of the sessions created since the last `reset`.
    sessions: BTreeMap<String, SessionId>,
}

impl Scenario {
    fn new() -> Self {
        let mut machine = StateMachine::new();
        // Openraft's initial membership entry sits at index 0.
        machine.apply_empty(0);
        Scenario { machine, index: 0, sequence: 0, sessions: BTreeMap::new() }
    }

    fn request(&mut self) -> RequestId {
        self.sequence += 1;
        RequestId { client_id: CLIENT_ID, sequence: self.sequence }
    }

    /// Runs one command line and returns its output.
    fn run(&mut self, line: &str) -> String {
        let mut args = Args::parse(line);
        let verb = args.word("a command");
        let output = match verb {
            "reset" => {
                *self = Scenario::new();
                String::new()
            }
            "create" => {
                let name = args.word("a session name");
                assert!(!self.sessions.contains_key(name), "session {name} was created before; name each session once");
                assert!(name.parse::<u64>().is_err(), "a session name is not a number: numbers are raw session ids");
                let ttl_ms = args.key("ttl").map_or(TTL_MS_DEFAULT, duration_ms);
                let client_name = args.key("name").unwrap_or(name).to_owned();
                let command = Command::CreateSession { request: self.request(), ttl_ms, client_name };
                let applied = self.apply(&command);
                if let Response::SessionCreated { session, .. } = applied.response {
                    self.sessions.insert(name.to_owned(), session);
                }
                self.print(&applied)
            }
            "close" => {
                let session = self.session(args.word("a session"));
                let command = Command::CloseSession { request: self.request(), session };
                self.apply_and_print(&command)
            }
            "expire" => {
                let sessions = args.rest().into_iter().map(|word| self.session(word)).collect();
                self.apply_and_print(&Command::ExpireSessions { sessions })
            }
            "acquire" => {
                let session = self.session(args.word("a session"));
                let name = args.word("a lock name").to_owned();
                let wait = !args.flag("try");
                let request = self.request();
                let command = match args.key("delay").map(duration_ms) {
                    Some(delay_ms) => Command::AcquireWithDelay { request, session, name, wait, delay_ms },
                    None => Command::Acquire { request, session, name, wait },
                };
                self.apply_and_print(&command)
            }
            "end-delay" => {
                let kind = match args.word("lock or semaphore") {
                    "lock" => ResourceKind::Lock,
                    "semaphore" => ResourceKind::Semaphore,
                    other => panic!("cannot end the delay of {other:?}: end-delay lock or semaphore"),
                };
                let name = args.word("a name").to_owned();
                let session = self.session(args.word("the expired holder"));
                let key = DelayKey { tenant: ADMIN_TENANT, kind, name, session };
                self.apply_and_print(&Command::EndLockDelays { ended: vec![key] })
            }
            "cancel" => {
                let session = self.session(args.word("a session"));
                let name = args.word("a lock name").to_owned();
                let command = Command::CancelWait { request: self.request(), session, name };
                self.apply_and_print(&command)
            }
            "release" => {
                let session = self.session(args.word("a session"));
                let name = args.word("a lock name").to_owned();
                let token = args.number("token");
                let command = Command::Release { request: self.request(), session, name, token };
                self.apply_and_print(&command)
            }
            "sem-acquire" => {
                let session = self.session(args.word("a session"));
                let name = args.word("a semaphore name").to_owned();
                let limit = limit(args.number("limit"));
                let wait = !args.flag("try");
                let request = self.request();
                let command = match args.key("delay").map(duration_ms) {
                    Some(delay_ms) => Command::SemAcquireWithDelay { request, session, name, limit, wait, delay_ms },
                    None => Command::SemAcquire { request, session, name, limit, wait },
                };
                self.apply_and_print(&command)
            }
            "sem-cancel" => {
                let session = self.session(args.word("a session"));
                let name = args.word("a semaphore name").to_owned();
                let command = Command::SemCancelWait { request: self.request(), session, name };
                self.apply_and_print(&command)
            }
            "sem-release" => {
                let session = self.session(args.word("a session"));
                let name = args.word("a semaphore name").to_owned();
                let token = args.number("token");
                let command = Command::SemRelease { request: self.request(), session, name, token };
                self.apply_and_print(&command)
            }
            "sem-set-limit" => {
                let session = self.session(args.word("a session"));
                let name = args.word("a semaphore name").to_owned();
                let limit = limit(args.number("limit"));
                let command = Command::SemSetLimit { request: self.request(), session, name, limit, tenant: None };
                self.apply_and_print(&command)
            }
            "describe" => match args.word("lock, semaphore or session") {
                "lock" => self.describe_lock(args.word("a lock name")),
                "semaphore" => self.describe_semaphore(args.word("a semaphore name")),
                "session" => self.describe_session(args.word("a session")),
                other => panic!("cannot describe {other:?}: describe lock, semaphore or session"),
            },
            "fence" => {
                let kind = match args.word("lock or semaphore") {
                    "lock" => ResourceKind::Lock,
                    "semaphore" => ResourceKind::Semaphore,
                    other => panic!("cannot check the fence of {other:?}: fence lock or semaphore"),
                };
                let name = args.word("a name");
                let token = args.number("token");
                let status = match kind {
                    ResourceKind::Lock => self.machine.check_fence(ADMIN_TENANT, name, token),
                    _ => self.machine.check_fence_of(kind, ADMIN_TENANT, name, token),
                };
                match status {
                    FenceStatus::Current => format!("{} {name} token={token}: current", kind.noun()),
                    FenceStatus::Superseded => format!("{} {name} token={token}: superseded", kind.noun()),
                }
            }
            "stats" => self.stats(),
            other => panic!("unknown command {other:?}; see the list at the top of scenarios.rs"),
        };
        args.finish();
        output
    }

    /// Applies `command` at the next index and checks the invariants, and that a
    /// rejected command changed nothing.
    fn apply(&mut self, command: &Command) -> Applied {
        self.index += 1;
        let before = self.machine.clone();
        let (response, events) = self.machine.apply(self.index, stamp_ms(self.index), command);
        self.machine.check_invariants();
        let mut unchanged = before;
        unchanged.last_applied = self.machine.last_applied;
        let unchanged = unchanged == self.machine;
        if let Response::Rejected(error) = &response {
            assert!(unchanged, "the rejected command {command:?} ({error}) changed the state");
        }
        Applied { response, events, unchanged }
    }

    fn apply_and_print(&mut self, command: &Command) -> String {
        let applied = self.apply(command);
        self.print(&applied)
    }

    /// The response, the events one per line, and whether the state stayed as it was.
    fn print(&self, applied: &Applied) -> String {
        let mut out = format!("response: {}\n", self.response(&applied.response));
        for event in &applied.events {
            writeln!(out, "event: {}", self.event(event)).unwrap();
        }
        if applied.unchanged {
            out.push_str("state: unchanged\n");
        }
        out
    }

    /// The session a script word names: a name given by `create`, or a raw id.
    fn session(&self, word: &str) -> SessionId {
        if let Ok(id) = word.parse() {
            return id;
        }
        *self.sessions.get(word).unwrap_or_else(|| panic!("no session is named {word:?}; create it first"))
    }

    /// The script name of a session, or its id if it has none.
    fn name(&self, session: SessionId) -> String {
        self.sessions
            .iter()
            .find(|(_, id)| **id == session)
            .map_or_else(|| session.to_string(), |(name, _)| name.clone())
    }

    fn names(&self, sessions: &[SessionId]) -> String {
        if sessions.is_empty() {
            return "none".to_owned();
        }
        sessions.iter().map(|session| self.name(*session)).collect::<Vec<_>>().join(" ")
    }

    fn response(&self, response: &Response) -> String {
        match response {
            Response::SessionCreated { session, ttl_ms } => {
                format!("session-created {} id={session} ttl_ms={ttl_ms}", self.name(*session))
            }
            Response::SessionClosed => "session-closed".to_owned(),
            Response::SessionsExpired { expired } => format!("sessions-expired {}", self.names(expired)),
            Response::Acquire(outcome) => format!("acquire {}", self.outcome(outcome)),
            Response::WaitCancelled(outcome) => {
                let outcome = match outcome {
                    CancelOutcome::Cancelled => "cancelled".to_owned(),
                    CancelOutcome::AlreadyGranted { token } => format!("already-granted token={token}"),
                    CancelOutcome::NotWaiting => "not-waiting".to_owned(),
                };
                format!("wait-cancelled {outcome}")
            }
            Response::Released { token } => format!("released token={token}"),
            Response::SemAcquire(outcome) => format!("sem-acquire {}", self.outcome(outcome)),
            Response::SemReleased { token } => format!("sem-released token={token}"),
            Response::SemLimitSet { limit, previous } => format!("sem-limit-set limit={limit} previous={previous}"),
            Response::Campaign(outcome) => format!("campaign {}", self.outcome(outcome)),
            Response::Proclaimed { token } => format!("proclaimed token={token}"),
            Response::Resigned { token } => format!("resigned token={token}"),
            Response::LockDelaysEnded { ended } => format!("lock-delays-ended ended={ended}"),
            Response::Rejected(CommandError { kind, message, metadata }) => {
                let session = metadata.iter().find(|(key, _)| key == "session_id").map(|(_, id)| id.parse().unwrap());
                match session {
                    Some(session) => format!("rejected {kind:?} (session {}): {message}", self.name(session)),
                    None => format!("rejected {kind:?}: {message}"),
                }
            }
            other => format!("{other:?}"),
        }
    }

    fn outcome(&self, outcome: &AcquireOutcome) -> String {
        match outcome {
            AcquireOutcome::Granted { token } => format!("granted token={token}"),
            AcquireOutcome::Queued { position } => format!("queued position={position}"),
            AcquireOutcome::Busy { holder, token } => format!("busy holder={} token={token}", self.name(*holder)),
            AcquireOutcome::TimedOut => "timed-out".to_owned(),
        }
    }

    fn event(&self, event: &Event) -> String {
        match event {
            Event::Granted { kind, name, session, token } => {
                format!("granted {} {name} {} token={token}", kind.noun(), self.name(*session))
            }
            Event::Released { kind, name, session, token } => {
                format!("released {} {name} {} token={token}", kind.noun(), self.name(*session))
            }
            Event::WaitFailed { kind, name, session, reason } => {
                let reason = match reason {
                    WaitFailure::SessionEnded => "session-ended",
                    WaitFailure::Cancelled => "cancelled",
                };
                format!("wait-failed {} {name} {} {reason}", kind.noun(), self.name(*session))
            }
            Event::SessionEnded { session, expired } => {
                format!("session-ended {} {}", self.name(*session), if *expired { "expired" } else { "closed" })
            }
            Event::LeaderChanged { tenant: _, name, leader: None } => format!("leader-changed {name} vacant"),
            Event::LeaderChanged { tenant: _, name, leader: Some(leader) } => format!(
                "leader-changed {name} {} token={} since_ms={} client_name={} value={:?}",
                self.name(leader.session),
                leader.token,
                leader.since_ms,
                leader.client_name,
                leader.value
            ),
            Event::DelayStarted { key, delay_ms } => {
                format!("delay-started {} {} {} delay_ms={delay_ms}", key.kind.noun(), key.name, self.name(key.session))
            }
            Event::DelayEnded { key } => {
                format!("delay-ended {} {} {}", key.kind.noun(), key.name, self.name(key.session))
            }
        }
    }

    fn holder(&self, holder: &HolderView) -> String {
        let delay = match (holder.lock_delay_ms, holder.held_back_until_ms) {
            (0, _) => String::new(),
            (delay_ms, None) => format!(" lock_delay_ms={delay_ms}"),
            (delay_ms, Some(until_ms)) => format!(" lock_delay_ms={delay_ms} in-delay until_ms={until_ms}"),
        };
        format!(
            "  holder {} token={} since_ms={} client_name={}{delay}\n",
            self.name(holder.session),
            holder.token,
            holder.since_ms,
            holder.client_name
        )
    }

    fn waiters(&self, waiters: &[WaiterView]) -> String {
        waiters
            .iter()
            .map(|waiter| format!("  waiter {} client_name={}\n", self.name(waiter.session), waiter.client_name))
            .collect()
    }

    fn describe_lock(&self, name: &str) -> String {
        let Some(view) = self.machine.describe_lock(ADMIN_TENANT, name) else {
            return format!("lock {name}: free, no entry");
        };
        format!("lock {}\n{}{}", view.name, self.holder(&view.holder), self.waiters(&view.waiters))
    }

    fn describe_semaphore(&self, name: &str) -> String {
        let Some(view) = self.machine.describe_semaphore(ADMIN_TENANT, name) else {
            return format!("semaphore {name}: unused, no entry");
        };
        let holders: String = view.holders.iter().map(|holder| self.holder(holder)).collect();
        format!("semaphore {} limit={}\n{holders}{}", view.name, view.limit, self.waiters(&view.waiters))
    }

    fn describe_session(&self, word: &str) -> String {
        let session = self.session(word);
        let Some(view) = self.machine.describe_session(session) else {
            return format!("session {word} (id {session}): does not exist");
        };
        let mut out = format!(
            "session {} id={} ttl_ms={} client_name={} created_index={}\n",
            self.name(view.id),
            view.id,
            view.ttl_ms,
            view.client_name,
            view.created_index
        );
        let held = [("holds lock", &view.held), ("holds semaphore", &view.permits), ("leads election", &view.leading)];
        for (what, held) in held {
            for held in held {
                writeln!(out, "  {what} {} token={} since_ms={}", held.name, held.token, held.since_ms).unwrap();
            }
        }
        let waiting = [
            ("waits lock", &view.waiting),
            ("waits semaphore", &view.waiting_semaphores),
            ("campaigns election", &view.campaigning),
        ];
        for (what, names) in waiting {
            for name in names {
                writeln!(out, "  {what} {name}").unwrap();
            }
        }
        out
    }

    fn stats(&self) -> String {
        let mut out = format!(
            "last_applied={} sessions={} locks={} semaphores={} elections={}\n",
            self.machine.last_applied_index(),
            self.machine.session_count(),
            self.machine.lock_count(),
            self.machine.semaphore_count(),
            self.machine.election_count()
        );
        for (_, name, limit, holders, waiters) in self.machine.semaphore_stats() {
            writeln!(out, "  semaphore {name} limit={limit} holders={holders} waiters={waiters}").unwrap();
        }
        out
    }
}

fn limit(value: u64) -> u32 {
    u32::try_from(value).unwrap_or_else(|_| panic!("limit={value} does not fit a u32"))
}

/// `10s` or `2500ms`.
fn duration_ms(value: &str) -> u64 {
    let parsed = match value.strip_suffix("ms") {
        Some(ms) => ms.parse::<u64>().ok(),
        None => value.strip_suffix('s').and_then(|s| s.parse::<u64>().ok()).map(|s| s * 1000),
    };
    parsed.unwrap_or_else(|| panic!("{value:?} is not a duration such as 10s or 2500ms"))
}

/// The words of a command line: positional words in order, then `key=value` pairs.
/// Everything must be used, so a misspelt argument fails instead of being ignored.
struct Args<'a> {
    words: Vec<&'a str>,
    keys: BTreeMap<&'a str, &'a str>,
}

impl<'a> Args<'a> {
    fn parse(line: &'a str) -> Self {
        let mut words = Vec::new();
        let mut keys = BTreeMap::new();
        for word in line.split_whitespace() {
            match word.split_once('=') {
                Some((key, value)) => assert!(keys.insert(key, value).is_none(), "{key}= is given twice"),
                None => words.push(word),
            }
        }
        Args { words, keys }
    }

    fn word(&mut self, what: &str) -> &'a str {
        assert!(!self.words.is_empty(), "missing {what}");
        self.words.remove(0)
    }

    fn flag(&mut self, flag: &str) -> bool {
        let position = self.words.iter().position(|word| *word == flag);
        position.map(|position| self.words.remove(position)).is_some()
    }

    fn rest(&mut self) -> Vec<&'a str> {
        std::mem::take(&mut self.words)
    }

    fn key(&mut self, key: &str) -> Option<&'a str> {
        self.keys.remove(key)
    }

    fn number(&mut self, key: &str) -> u64 {
        let value = self.key(key).unwrap_or_else(|| panic!("missing {key}="));
        value.parse().unwrap_or_else(|_| panic!("{key}={value} is not a number"))
    }

    fn finish(self) {
        assert!(self.words.is_empty() && self.keys.is_empty(), "unexpected arguments {:?} {:?}", self.words, self.keys);
    }
}
