//! Connecting to PostgreSQL.

use std::str::FromStr;

use anyhow::Context;
use tokio_postgres::{Client, Config, NoTls};

/// The environment variable the binary reads its database URL from.
pub const DATABASE_URL_ENV: &str = "LEASEHOLD_PAYMENTS_DATABASE_URL";

/// Connects to `url` (`postgres://user@host:port/database` or `key=value` form) and
/// drives the connection in the background.
pub async fn connect(url: &str) -> anyhow::Result<Client> {
    let config = Config::from_str(url).with_context(|| format!("parse database URL {url:?}"))?;
    connect_with(&config).await
}

pub async fn connect_with(config: &Config) -> anyhow::Result<Client> {
    let (client, connection) = config.connect(NoTls).await.with_context(|| {
        format!(
            "connect to PostgreSQL at {:?}:{:?} database {:?}",
            config.get_hosts(),
            config.get_ports(),
            config.get_dbname().unwrap_or("(default)")
        )
    })?;
    tokio::spawn(async move {
        // The connection ends when the client is dropped; an error here is a lost
        // server, which the next query on the client reports.
        let _ = connection.await;
    });
    Ok(client)
}
