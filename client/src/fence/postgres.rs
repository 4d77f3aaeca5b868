//! Fenced writes to PostgreSQL (feature `fence-postgres`, tokio-postgres).
//!
//! The fence is a table, `leasehold_fence (resource TEXT PRIMARY KEY, token BIGINT,
//! value BYTEA)` by default, and every write is one statement:
//!
//! ```sql
//! INSERT INTO leasehold_fence AS f (resource, token, value) VALUES ($1, $2, $3)
//! ON CONFLICT (resource) DO UPDATE SET token = EXCLUDED.token, value = EXCLUDED.value
//!  WHERE f.token < EXCLUDED.token          -- <= for Mode::ManyPerGrant
//! RETURNING f.token
//! ```
//!
//! No row back means a newer token holds the resource: nothing changed. Racing writers
//! serialize on the row, and the `WHERE` is evaluated against the row as the earlier
//! writer committed it. [`guard`] runs the same check (without the
//! value) inside the caller's transaction, so the caller's own statements in it are
//! fenced too: the row stays locked until the caller commits.
//!
//! ```no_run
//! # async fn example(mut orders: tokio_postgres::Client, token: leasehold::FencingToken)
//! #     -> Result<(), Box<dyn std::error::Error>> {
//! use leasehold::fence::{Mode, Outcome};
//! let tx = orders.transaction().await?;
//! match leasehold::fence::postgres::guard(&tx, "orders/42", token, Mode::OncePerGrant).await? {
//!     Outcome::Accepted => {
//!         tx.execute("UPDATE payments SET status = 'charged' WHERE order_id = 42", &[]).await?;
//!         tx.commit().await?;
//!     }
//!     Outcome::Superseded { seen, .. } => println!("order 42 belongs to grant {seen} now"),
//! }
//! # Ok(())
//! # }
//! ```

use std::sync::{Arc, Mutex, PoisonError};

use tokio_postgres::types::Type;
use tokio_postgres::{Client, GenericClient};

use super::{check_resource, check_table, check_write, FenceError, FencedStore, FencingToken, Mode, Outcome, Record};

const STORE: &str = "postgres";

/// The default fence table.
pub const DEFAULT_TABLE: &str = "leasehold_fence";

/// The fence table of one PostgreSQL database, through one connection. A fence made
/// with [`PostgresFence::connect`] opens a new connection when its connection closed
/// (a restarted server, a dropped link); the call that met the broken one fails, and
/// its retry, with the same token, goes over the new one.
pub struct PostgresFence {
    client: Mutex<Arc<Client>>,
    url: Option<String>,
    table: String,
}

impl PostgresFence {
    /// The caller's connection and the default table, [`DEFAULT_TABLE`].
    pub fn new(client: Client) -> Self {
        PostgresFence { client: Mutex::new(Arc::new(client)), url: None, table: DEFAULT_TABLE.to_string() }
    }

    /// Another table (`name` or `schema.name`).
    pub fn with_table(client: Client, table: &str) -> Result<Self, FenceError> {
        check_table(table)?;
        Ok(PostgresFence { table: table.to_string(), ..PostgresFence::new(client) })
    }

    /// Connects without TLS (`postgres://user@host:port/db`), drives the connection
    /// on a task of its own, and connects again when it closes.
    pub async fn connect(url: &str) -> Result<Self, FenceError> {
        let client = open(url).await?;
        Ok(PostgresFence { url: Some(url.to_string()), ..PostgresFence::new(client) })
    }

    /// The connection, for the caller's other statements.
    pub fn client(&self) -> Arc<Client> {
        self.client.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// The connection, opened again first if it closed and the URL is known.
    async fn current(&self) -> Result<Arc<Client>, FenceError> {
        let client = self.client();
        match &self.url {
            Some(url) if client.is_closed() => {
                let fresh = Arc::new(open(url).await?);
                *self.client.lock().unwrap_or_else(PoisonError::into_inner) = fresh.clone();
                Ok(fresh)
            }
            _ => Ok(client),
        }
    }

    /// Creates the table if it is missing.
    pub async fn create_table(&self) -> Result<(), FenceError> {
        create_table_in(&*self.current().await?, &self.table).await
    }

    /// [`guard`] with this fence's table.
    pub async fn guard(
        &self,
        tx: &impl GenericClient,
        resource: &str,
        token: FencingToken,
        mode: Mode,
    ) -> Result<Outcome, FenceError> {
        guard_in(tx, &self.table, resource, token, mode).await
    }

    fn upsert(&self, mode: Mode, with_value: bool) -> String {
        upsert(&self.table, mode, with_value)
    }

    async fn outcome(
        &self,
        client: &impl GenericClient,
        refused: bool,
        resource: &str,
        ours: FencingToken,
    ) -> Result<Outcome, FenceError> {
        outcome(client, &self.table, refused, resource, ours).await
    }
}

/// A connection without TLS, driven on a task of its own.
async fn open(url: &str) -> Result<Client, FenceError> {
    let (client, connection) =
        tokio_postgres::connect(url, tokio_postgres::NoTls).await.map_err(|error| FenceError::store(STORE, error))?;
    tokio::spawn(async move {
        if let Err(error) = connection.await {
            tracing::debug!(%error, "fence: the PostgreSQL connection ended");
        }
    });
    Ok(client)
}

/// Creates the fence table `table` if it is missing, through the caller's client.
pub async fn create_table_in(client: &impl GenericClient, table: &str) -> Result<(), FenceError> {
    check_table(table)?;
    let statement = format!(
        "CREATE TABLE IF NOT EXISTS {table} (
            resource TEXT PRIMARY KEY CHECK (octet_length(resource) BETWEEN 1 AND 512),
            token BIGINT NOT NULL CHECK (token > 0),
            value BYTEA)"
    );
    client.batch_execute(&statement).await.map_err(|error| FenceError::store(STORE, error))
}

/// Advances the fence for `resource` in [`DEFAULT_TABLE`] inside the caller's
/// transaction `tx` and leaves its value alone. On [`Outcome::Accepted`] the fence row
/// stays locked until `tx` ends, so the caller's other writes in `tx` are fenced by
/// it; on [`Outcome::Superseded`] roll `tx` back (or commit only what records the
/// refusal).
pub async fn guard(
    tx: &impl GenericClient,
    resource: &str,
    token: FencingToken,
    mode: Mode,
) -> Result<Outcome, FenceError> {
    guard_in(tx, DEFAULT_TABLE, resource, token, mode).await
}

/// [`guard`] with another table.
pub async fn guard_in(
    tx: &impl GenericClient,
    table: &str,
    resource: &str,
    token: FencingToken,
    mode: Mode,
) -> Result<Outcome, FenceError> {
    check_table(table)?;
    let ours = check_write(resource, token)?;
    let rows = tx
        .query_typed(&upsert(table, mode, false), &[(&resource, Type::TEXT), (&ours, Type::INT8)])
        .await
        .map_err(|error| FenceError::store(STORE, error))?;
    outcome(tx, table, rows.is_empty(), resource, token).await
}

fn upsert(table: &str, mode: Mode, with_value: bool) -> String {
    let admits = match mode {
        Mode::OncePerGrant => "<",
        Mode::ManyPerGrant => "<=",
    };
    if with_value {
        format!(
            "INSERT INTO {table} AS f (resource, token, value) VALUES ($1, $2, $3) \
                 ON CONFLICT (resource) DO UPDATE SET token = EXCLUDED.token, value = EXCLUDED.value \
                 WHERE f.token {admits} EXCLUDED.token RETURNING f.token"
        )
    } else {
        format!(
            "INSERT INTO {table} AS f (resource, token) VALUES ($1, $2) \
                 ON CONFLICT (resource) DO UPDATE SET token = EXCLUDED.token \
                 WHERE f.token {admits} EXCLUDED.token RETURNING f.token"
        )
    }
}

/// Accepted when the statement returned the row; else reads what refused us.
async fn outcome(
    client: &impl GenericClient,
    table: &str,
    refused: bool,
    resource: &str,
    ours: FencingToken,
) -> Result<Outcome, FenceError> {
    if !refused {
        return Ok(Outcome::Accepted);
    }
    let row = client
        .query_typed(&format!("SELECT token FROM {table} WHERE resource = $1"), &[(&resource, Type::TEXT)])
        .await
        .map_err(|error| FenceError::store(STORE, error))?
        .into_iter()
        .next()
        .ok_or_else(|| FenceError::store(STORE, format!("the fence row of {resource:?} vanished after a refusal")))?;
    let seen: i64 = row.get(0);
    let seen = FencingToken::from_sql_bigint(seen).map_err(|error| FenceError::store(STORE, error))?;
    Ok(Outcome::Superseded { seen, ours })
}

impl FencedStore for PostgresFence {
    async fn write(
        &self,
        resource: &str,
        token: FencingToken,
        mode: Mode,
        value: &[u8],
    ) -> Result<Outcome, FenceError> {
        let ours = check_write(resource, token)?;
        let statement = self.upsert(mode, true);
        let client = self.current().await?;
        let rows = client
            .query_typed(&statement, &[(&resource, Type::TEXT), (&ours, Type::INT8), (&value, Type::BYTEA)])
            .await
            .map_err(|error| FenceError::store(STORE, error))?;
        self.outcome(&*client, rows.is_empty(), resource, token).await
    }

    async fn advance(&self, resource: &str, token: FencingToken, mode: Mode) -> Result<Outcome, FenceError> {
        self.guard(&*self.current().await?, resource, token, mode).await
    }

    async fn read(&self, resource: &str) -> Result<Option<Record>, FenceError> {
        check_resource(resource)?;
        let statement = format!("SELECT token, value FROM {} WHERE resource = $1", self.table);
        let rows = self
            .current()
            .await?
            .query_typed(&statement, &[(&resource, Type::TEXT)])
            .await
            .map_err(|error| FenceError::store(STORE, error))?;
        let Some(row) = rows.into_iter().next() else { return Ok(None) };
        let token: i64 = row.get(0);
        let token = FencingToken::from_sql_bigint(token).map_err(|error| FenceError::store(STORE, error))?;
        Ok(Some(Record { token, value: row.get(1) }))
    }
}
