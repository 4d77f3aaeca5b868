//! What the example's tests share: a database of their own on the test PostgreSQL,
//! and child processes followed line by line with deadlines.
//!
//! The tests need a running PostgreSQL: `./scripts/test.sh` starts one with
//! `scripts/postgres.sh` and exports its URL. Without it they fail, saying so.

#![allow(dead_code)] // Each test file uses a different part.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use leasehold_example_payments::{database, schema};
use leasehold_jepsen::cluster::{binary, TestCluster};
use leasehold_jepsen::wait::POLL_INTERVAL_MS;
use tokio_postgres::config::Host;
use tokio_postgres::Config;

/// The administrative URL of the test PostgreSQL (any database on it will do).
pub const DATABASE_URL_ENV: &str = "LEASEHOLD_TEST_DATABASE_URL";
/// `scripts/postgres.sh url`, used when the variable is not set.
pub const DATABASE_URL_DEFAULT: &str = "postgres://postgres@127.0.0.1:15432/postgres";
/// How long a child process may take to print its next line or to exit.
pub const PROCESS_DEADLINE: Duration = Duration::from_secs(30);
/// How long a cluster may take to elect its first leader.
pub const LEADER_DEADLINE: Duration = Duration::from_secs(20);

/// A database created for one test and dropped when the test ends (or fails).
pub struct TestDatabase {
    pub name: String,
    /// Key-value connection string for this database, for child processes.
    pub url: String,
    admin: Config,
}

fn admin_url() -> String {
    std::env::var(DATABASE_URL_ENV).unwrap_or_else(|_| DATABASE_URL_DEFAULT.to_string())
}

fn unreachable_message(url: &str, error: &anyhow::Error) -> String {
    format!(
        "the test PostgreSQL is unreachable at {url} ({DATABASE_URL_ENV}): {error:#}\n\
         These tests need a real PostgreSQL. ./scripts/test.sh starts one; by hand:\n  \
         ./scripts/postgres.sh start && export {DATABASE_URL_ENV}=$(./scripts/postgres.sh url)"
    )
}

/// The connection string of `config` with another database.
fn with_database(config: &Config, name: &str) -> String {
    let mut parts = Vec::new();
    for host in config.get_hosts() {
        match host {
            Host::Tcp(host) => parts.push(format!("host={host}")),
            Host::Unix(path) => parts.push(format!("host={}", path.display())),
        }
    }
    if let Some(port) = config.get_ports().first() {
        parts.push(format!("port={port}"));
    }
    if let Some(user) = config.get_user() {
        parts.push(format!("user={user}"));
    }
    if let Some(password) = config.get_password() {
        parts.push(format!("password={}", String::from_utf8_lossy(password)));
    }
    parts.push(format!("dbname={name}"));
    parts.join(" ")
}

impl TestDatabase {
    /// Creates an empty database with a unique name and the example's tables.
    pub async fn create(purpose: &str) -> TestDatabase {
        static SEQUENCE: AtomicU64 = AtomicU64::new(0);
        let url = admin_url();
        let admin = Config::from_str(&url)
            .unwrap_or_else(|error| panic!("{DATABASE_URL_ENV}={url:?} is not a database URL: {error}"));
        let client = database::connect_with(&admin)
            .await
            .unwrap_or_else(|error| panic!("{}", unreachable_message(&url, &error)));
        let nanos = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap().subsec_nanos();
        let name =
            format!("leasehold_{purpose}_{}_{}_{nanos}", std::process::id(), SEQUENCE.fetch_add(1, Ordering::Relaxed));
        assert!(name.len() <= 63, "database name {name:?} is longer than PostgreSQL allows");
        client
            .batch_execute(&format!("CREATE DATABASE \"{name}\""))
            .await
            .unwrap_or_else(|error| panic!("CREATE DATABASE {name}: {error}"));
        let database = TestDatabase { url: with_database(&admin, &name), name, admin };
        schema::create(&database.connect().await).await.expect("create the example's tables");
        database
    }

    pub async fn connect(&self) -> tokio_postgres::Client {
        database::connect(&self.url).await.expect("connect to the test database")
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        // Drop runs outside async code (or while a test panics): a thread with its own
        // runtime drops the database, closing any connection a child left behind.
        let admin = self.admin.clone();
        let name = self.name.clone();
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            runtime.block_on(async {
                let client = database::connect_with(&admin).await?;
                client.batch_execute(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)")).await?;
                anyhow::Ok(())
            })
        })
        .join();
        if let Ok(Err(error)) = dropped {
            eprintln!("could not drop test database {}: {error:#}", self.name);
        }
    }
}

/// A cluster of three real nodes with a leader.
pub async fn cluster() -> TestCluster {
    let leasehold_server = binary("leasehold-server");
    assert!(
        leasehold_server.exists(),
        "{} is missing: build the workspace first (source scripts/env.sh && leasehold_build)",
        leasehold_server.display()
    );
    let cluster = TestCluster::start(Default::default());
    cluster.wait_for_leader(LEADER_DEADLINE).await;
    cluster
}

/// The example's binary.
pub fn payments_binary() -> &'static str {
    env!("CARGO_BIN_EXE_leasehold-payments")
}

/// The `leasehold` CLI, next to the test executable.
pub fn leasehold_binary() -> std::path::PathBuf {
    let path = binary("leasehold");
    assert!(
        path.exists(),
        "{} is missing: build the workspace first (source scripts/env.sh && leasehold_build)",
        path.display()
    );
    path
}

/// A child process whose stdout is read line by line, with its stdin kept open so
/// that a line can release a `--pause-at` / `--wait-for-go`.
pub struct Process {
    pub name: String,
    child: Child,
    lines: tokio::sync::mpsc::UnboundedReceiver<String>,
    stderr: Arc<Mutex<String>>,
    exit_code: Option<Option<i32>>,
}

impl Process {
    pub fn spawn(name: &str, mut command: Command) -> Process {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|error| panic!("start {name} ({command:?}): {error}"));
        let (sender, lines) = tokio::sync::mpsc::unbounded_channel();
        let stdout = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = sender.send(line);
            }
        });
        let stderr = Arc::new(Mutex::new(String::new()));
        let mut pipe = child.stderr.take().unwrap();
        let collected = stderr.clone();
        std::thread::spawn(move || {
            let mut buffer = [0u8; 4096];
            while let Ok(count) = pipe.read(&mut buffer) {
                if count == 0 {
                    break;
                }
                collected.lock().unwrap().push_str(&String::from_utf8_lossy(&buffer[..count]));
            }
        });
        Process { name: name.to_string(), child, lines, stderr, exit_code: None }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// The next line on stdout; panics after `PROCESS_DEADLINE` saying what it waited for.
    pub async fn next_line(&mut self, reason: &str) -> String {
        match tokio::time::timeout(PROCESS_DEADLINE, self.lines.recv()).await {
            Ok(Some(line)) => line,
            Ok(None) => panic!("{} exited while we waited for {reason}; stderr:\n{}", self.name, self.stderr()),
            Err(_) => panic!(
                "timed out after {PROCESS_DEADLINE:?} waiting for {reason} from {}; stderr:\n{}",
                self.name,
                self.stderr()
            ),
        }
    }

    /// A line already printed on stdout, if any, without waiting.
    pub fn try_line(&mut self) -> Option<String> {
        self.lines.try_recv().ok()
    }

    pub fn signal(&self, signal: i32) {
        if self.exit_code.is_some() {
            return;
        }
        // SAFETY: kill(2) on a child this test started and has not reaped.
        unsafe {
            libc::kill(self.pid(), signal);
        }
    }

    /// Writes a line on stdin (the go-ahead). A process that already exited is fine.
    pub fn go(&mut self) {
        if let Some(stdin) = self.child.stdin.as_mut() {
            let _ = stdin.write_all(b"go\n").and_then(|_| stdin.flush());
        }
    }

    /// The exit code if the process has exited (None inside: killed by a signal).
    pub fn try_exit_code(&mut self) -> Option<Option<i32>> {
        if self.exit_code.is_none() {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                self.exit_code = Some(status.code());
            }
        }
        self.exit_code
    }

    /// Waits for the process to exit; panics after `PROCESS_DEADLINE` with `reason`.
    pub async fn exit_code(&mut self, reason: &str) -> Option<i32> {
        let give_up = Instant::now() + PROCESS_DEADLINE;
        loop {
            if let Some(code) = self.try_exit_code() {
                return code;
            }
            if Instant::now() >= give_up {
                panic!(
                    "timed out after {PROCESS_DEADLINE:?} waiting for {} to exit ({reason}); stderr:\n{}",
                    self.name,
                    self.stderr()
                );
            }
            tokio::time::sleep(Duration::from_millis(POLL_INTERVAL_MS)).await;
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if self.exit_code.is_none() {
            self.signal(libc::SIGCONT);
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A payments worker for order `order_id`, named `name`, with extra arguments.
pub fn worker(cluster: &TestCluster, database: &TestDatabase, name: &str, order_id: i64, extra: &[&str]) -> Process {
    let mut command = Command::new(payments_binary());
    command
        .env(database::DATABASE_URL_ENV, &database.url)
        .envs(cluster.client_env())
        .args(["worker", "--order-id", &order_id.to_string(), "--name", name])
        .args(extra);
    Process::spawn(&format!("worker {name}"), command)
}

/// The token in a worker's `acquired <token>` line.
pub fn acquired_token(line: &str) -> i64 {
    line.strip_prefix("acquired ")
        .and_then(|token| token.parse().ok())
        .unwrap_or_else(|| panic!("expected `acquired <token>`, got {line:?}"))
}
