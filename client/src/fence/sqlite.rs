//! Fenced writes to SQLite (feature `fence-sqlite`, rusqlite with SQLite bundled).
//!
//! The same table and the same single statement as PostgreSQL (`INSERT … ON CONFLICT
//! (resource) DO UPDATE … WHERE token < excluded.token RETURNING token`, SQLite 3.35
//! or newer). SQLite takes one writer at a time per database file, so racing writers
//! serialize on the file; the connection waits up to five seconds for the lock
//! (`busy_timeout`). rusqlite is synchronous: [`FencedStore`] runs each call on
//! tokio's blocking pool; [`SqliteFence::guard`] is synchronous, for the caller's own
//! transaction.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension};

use super::{check_resource, check_table, check_write, FenceError, FencedStore, FencingToken, Mode, Outcome, Record};

const STORE: &str = "sqlite";

/// The default fence table.
pub const DEFAULT_TABLE: &str = "leasehold_fence";

/// The fence table of one SQLite database.
#[derive(Clone)]
pub struct SqliteFence {
    connection: Arc<Mutex<Connection>>,
    table: Arc<str>,
}

fn store_error(error: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> FenceError {
    FenceError::store(STORE, error)
}

impl SqliteFence {
    /// Opens (or creates) the database file, in WAL mode, and creates the default
    /// table if it is missing.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, FenceError> {
        let connection = Connection::open(path).map_err(store_error)?;
        connection.pragma_update(None, "journal_mode", "WAL").map_err(store_error)?;
        let fence = SqliteFence::with_table(connection, DEFAULT_TABLE)?;
        fence.create_table()?;
        Ok(fence)
    }

    /// A connection the caller opened, and the table to use.
    pub fn with_table(connection: Connection, table: &str) -> Result<Self, FenceError> {
        check_table(table)?;
        let (major, minor) = (rusqlite::version_number() / 1_000_000, rusqlite::version_number() / 1_000 % 1_000);
        if (major, minor) < (3, 35) {
            return Err(FenceError::Invalid(format!(
                "SQLite {} has no RETURNING; 3.35 or newer is needed",
                rusqlite::version()
            )));
        }
        connection.busy_timeout(Duration::from_secs(5)).map_err(store_error)?;
        Ok(SqliteFence { connection: Arc::new(Mutex::new(connection)), table: table.into() })
    }

    /// Creates the table if it is missing.
    pub fn create_table(&self) -> Result<(), FenceError> {
        let statement = format!(
            "CREATE TABLE IF NOT EXISTS {} (
                resource TEXT PRIMARY KEY CHECK (length(CAST(resource AS BLOB)) BETWEEN 1 AND 512),
                token INTEGER NOT NULL CHECK (token > 0),
                value BLOB)",
            self.table
        );
        self.lock().execute_batch(&statement).map_err(store_error)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Connection> {
        // A panic while the connection was held leaves it usable: SQLite rolled back
        // whatever statement was running.
        self.connection.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Advances the fence inside the caller's transaction (opened with
    /// `BEGIN IMMEDIATE`, so that the write lock is taken before the check) and leaves
    /// the value alone; commit on [`Outcome::Accepted`], roll back otherwise.
    pub fn guard(
        &self,
        tx: &Connection,
        resource: &str,
        token: FencingToken,
        mode: Mode,
    ) -> Result<Outcome, FenceError> {
        let ours = check_write(resource, token)?;
        let accepted = tx
            .query_row(&self.upsert(mode, false), rusqlite::params![resource, ours], |_| Ok(()))
            .optional()
            .map_err(store_error)?
            .is_some();
        self.outcome(tx, accepted, resource, token)
    }

    fn upsert(&self, mode: Mode, with_value: bool) -> String {
        let admits = match mode {
            Mode::OncePerGrant => "<",
            Mode::ManyPerGrant => "<=",
        };
        let table = &self.table;
        if with_value {
            format!(
                "INSERT INTO {table} (resource, token, value) VALUES (?1, ?2, ?3) \
                 ON CONFLICT (resource) DO UPDATE SET token = excluded.token, value = excluded.value \
                 WHERE token {admits} excluded.token RETURNING token"
            )
        } else {
            format!(
                "INSERT INTO {table} (resource, token) VALUES (?1, ?2) \
                 ON CONFLICT (resource) DO UPDATE SET token = excluded.token \
                 WHERE token {admits} excluded.token RETURNING token"
            )
        }
    }

    fn outcome(
        &self,
        connection: &Connection,
        accepted: bool,
        resource: &str,
        ours: FencingToken,
    ) -> Result<Outcome, FenceError> {
        if accepted {
            return Ok(Outcome::Accepted);
        }
        let seen: i64 = connection
            .query_row(&format!("SELECT token FROM {} WHERE resource = ?1", self.table), [resource], |row| row.get(0))
            .map_err(store_error)?;
        Ok(Outcome::Superseded { seen: FencingToken::from_sql_bigint(seen).map_err(store_error)?, ours })
    }

    fn write_now(
        &self,
        resource: &str,
        token: FencingToken,
        mode: Mode,
        value: Option<&[u8]>,
    ) -> Result<Outcome, FenceError> {
        let ours = check_write(resource, token)?;
        let connection = self.lock();
        let accepted = match value {
            Some(value) => {
                connection.query_row(&self.upsert(mode, true), rusqlite::params![resource, ours, value], |_| Ok(()))
            }
            None => connection.query_row(&self.upsert(mode, false), rusqlite::params![resource, ours], |_| Ok(())),
        }
        .optional()
        .map_err(store_error)?
        .is_some();
        self.outcome(&connection, accepted, resource, token)
    }

    fn read_now(&self, resource: &str) -> Result<Option<Record>, FenceError> {
        check_resource(resource)?;
        let row: Option<(i64, Option<Vec<u8>>)> = self
            .lock()
            .query_row(&format!("SELECT token, value FROM {} WHERE resource = ?1", self.table), [resource], |row| {
                Ok((row.get(0)?, row.get(1)?))
            })
            .optional()
            .map_err(store_error)?;
        row.map(|(token, value)| {
            Ok(Record { token: FencingToken::from_sql_bigint(token).map_err(store_error)?, value })
        })
        .transpose()
    }
}

async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, FenceError> + Send + 'static,
) -> Result<T, FenceError> {
    tokio::task::spawn_blocking(work).await.map_err(store_error)?
}

impl FencedStore for SqliteFence {
    async fn write(
        &self,
        resource: &str,
        token: FencingToken,
        mode: Mode,
        value: &[u8],
    ) -> Result<Outcome, FenceError> {
        let (fence, resource, value) = (self.clone(), resource.to_string(), value.to_vec());
        blocking(move || fence.write_now(&resource, token, mode, Some(&value))).await
    }

    async fn advance(&self, resource: &str, token: FencingToken, mode: Mode) -> Result<Outcome, FenceError> {
        let (fence, resource) = (self.clone(), resource.to_string());
        blocking(move || fence.write_now(&resource, token, mode, None)).await
    }

    async fn read(&self, resource: &str) -> Result<Option<Record>, FenceError> {
        let (fence, resource) = (self.clone(), resource.to_string());
        blocking(move || fence.read_now(&resource)).await
    }
}
