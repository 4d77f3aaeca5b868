//! Fenced writes to MySQL and MariaDB (feature `fence-mysql`, mysql_async).
//!
//! MySQL has no `RETURNING` on updates, and its affected-row count depends on a
//! connection flag. The fence table has a `writes` counter that every accepted write
//! bumps, so the `UPDATE`'s affected rows are 1 exactly when its `WHERE` (the token
//! check) matched, whatever the flag:
//!
//! ```sql
//! UPDATE leasehold_fence SET token = ?, value = ?, writes = writes + 1
//!  WHERE resource = ? AND token < ?;                                    -- <= for many
//! ```
//!
//! When it matched nothing (no row yet, or a newer token), an `INSERT IGNORE` adds a
//! row with token 0 if there is none, and the `UPDATE` runs again. Token 0 is older
//! than every grant, so that row changes nothing a reader sees ([`FencedStore::read`] treats it as absent). InnoDB locks the
//! row for the `UPDATE`, so racing writers serialize on it. The resource column is
//! `VARBINARY(512)`: names compare as bytes (a `utf8mb4_bin` `VARCHAR` pads spaces,
//! so `a` and `a ` would share one fence).

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Pool};

use super::{check_resource, check_table, check_write, FenceError, FencedStore, FencingToken, Mode, Outcome, Record};

const STORE: &str = "mysql";

/// The default fence table.
pub const DEFAULT_TABLE: &str = "leasehold_fence";

fn store_error(error: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> FenceError {
    FenceError::store(STORE, error)
}

/// The fence table of one MySQL or MariaDB database, through a connection pool.
pub struct MysqlFence {
    pool: Pool,
    table: String,
}

impl MysqlFence {
    /// A pool for `mysql://user:password@host:port/database`, and the default table.
    pub fn connect(url: &str) -> Result<Self, FenceError> {
        let pool = Pool::from_url(url).map_err(store_error)?;
        Ok(MysqlFence { pool, table: DEFAULT_TABLE.to_string() })
    }

    /// The caller's pool and the table to use.
    pub fn with_table(pool: Pool, table: &str) -> Result<Self, FenceError> {
        check_table(table)?;
        Ok(MysqlFence { pool, table: table.to_string() })
    }

    /// The pool, for the caller's other statements.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// Creates the table if it is missing.
    pub async fn create_table(&self) -> Result<(), FenceError> {
        let statement = format!(
            "CREATE TABLE IF NOT EXISTS {} (
                resource VARBINARY(512) NOT NULL PRIMARY KEY,
                token BIGINT NOT NULL,
                value LONGBLOB NULL,
                writes BIGINT UNSIGNED NOT NULL DEFAULT 0) ENGINE = InnoDB",
            self.table
        );
        let mut connection = self.pool.get_conn().await.map_err(store_error)?;
        connection.query_drop(statement).await.map_err(store_error)
    }

    /// Advances the fence on the caller's connection, inside the caller's transaction
    /// (`conn.start_transaction`, or a connection in a transaction it began), leaving
    /// the value alone. On [`Outcome::Accepted`] the row stays locked until the
    /// transaction ends; roll back on [`Outcome::Superseded`].
    pub async fn guard(
        &self,
        connection: &mut impl Queryable,
        resource: &str,
        token: FencingToken,
        mode: Mode,
    ) -> Result<Outcome, FenceError> {
        self.fenced_update(connection, resource, token, mode, None).await
    }

    async fn fenced_update(
        &self,
        connection: &mut impl Queryable,
        resource: &str,
        token: FencingToken,
        mode: Mode,
        value: Option<&[u8]>,
    ) -> Result<Outcome, FenceError> {
        let ours = check_write(resource, token)?;
        let table = &self.table;
        let admits = match mode {
            Mode::OncePerGrant => "<",
            Mode::ManyPerGrant => "<=",
        };
        let update = match value {
            Some(_) => {
                format!("UPDATE {table} SET token = ?, value = ?, writes = writes + 1 WHERE resource = ? AND token {admits} ?")
            }
            None => {
                format!("UPDATE {table} SET token = ?, writes = writes + 1 WHERE resource = ? AND token {admits} ?")
            }
        };
        for attempt in 0..2 {
            if attempt == 1 {
                // The UPDATE matched nothing: no row yet, or a newer token. Make sure
                // there is a row (token 0 is older than every grant), then check again.
                connection
                    .exec_drop(format!("INSERT IGNORE INTO {table} (resource, token) VALUES (?, 0)"), (resource,))
                    .await
                    .map_err(store_error)?;
            }
            let result = match value {
                Some(value) => connection.exec_iter(update.as_str(), (ours, value, resource, ours)),
                None => connection.exec_iter(update.as_str(), (ours, resource, ours)),
            }
            .await
            .map_err(store_error)?;
            let updated = result.affected_rows();
            result.drop_result().await.map_err(store_error)?;
            if updated == 1 {
                return Ok(Outcome::Accepted);
            }
        }
        let seen: Option<i64> = connection
            // A locking read sees the newest committed row, not the snapshot of the
            // caller's REPEATABLE READ transaction (`guard`).
            .exec_first(format!("SELECT token FROM {table} WHERE resource = ? FOR UPDATE"), (resource,))
            .await
            .map_err(store_error)?;
        let seen =
            seen.ok_or_else(|| store_error(format!("the fence row of {resource:?} vanished after a refusal")))?;
        Ok(Outcome::Superseded { seen: FencingToken::from_sql_bigint(seen).map_err(store_error)?, ours: token })
    }

    async fn connection(&self) -> Result<Conn, FenceError> {
        self.pool.get_conn().await.map_err(store_error)
    }
}

impl FencedStore for MysqlFence {
    async fn write(
        &self,
        resource: &str,
        token: FencingToken,
        mode: Mode,
        value: &[u8],
    ) -> Result<Outcome, FenceError> {
        let mut connection = self.connection().await?;
        self.fenced_update(&mut connection, resource, token, mode, Some(value)).await
    }

    async fn advance(&self, resource: &str, token: FencingToken, mode: Mode) -> Result<Outcome, FenceError> {
        let mut connection = self.connection().await?;
        self.fenced_update(&mut connection, resource, token, mode, None).await
    }

    async fn read(&self, resource: &str) -> Result<Option<Record>, FenceError> {
        check_resource(resource)?;
        let mut connection = self.connection().await?;
        let row: Option<(i64, Option<Vec<u8>>)> = connection
            .exec_first(format!("SELECT token, value FROM {} WHERE resource = ?", self.table), (resource,))
            .await
            .map_err(store_error)?;
        match row {
            None | Some((0, _)) => Ok(None),
            Some((token, value)) => {
                Ok(Some(Record { token: FencingToken::from_sql_bigint(token).map_err(store_error)?, value }))
            }
        }
    }
}
