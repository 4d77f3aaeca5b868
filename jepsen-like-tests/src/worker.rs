//! A worker process for the tests: takes a lock, optionally waits for a go-ahead on
//! stdin (so a test can pause it while it believes it holds the lock), then writes
//! through the fenced store with its token. Each step is one line on stdout:
//!
//! ```text
//! acquired <token>
//! write ACCEPTED | write REJECTED <highest>
//! ```

use std::io::{BufRead, Write};
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;

#[derive(Debug, clap::Args)]
pub struct WorkerArguments {
    /// Client addresses of the cluster, comma-separated.
    #[arg(long)]
    pub endpoints: String,
    /// The lock to take.
    #[arg(long)]
    pub lock: String,
    /// Session TTL in milliseconds.
    #[arg(long, default_value_t = 2_000)]
    pub ttl_ms: u64,
    /// The fenced store's address.
    #[arg(long)]
    pub store: SocketAddr,
    /// The resource to write in the store.
    #[arg(long)]
    pub resource: String,
    /// The value to write.
    #[arg(long)]
    pub value: String,
    /// Wait for a line on stdin between acquiring and writing.
    #[arg(long)]
    pub wait_for_go: bool,
}

pub async fn run(arguments: WorkerArguments) -> anyhow::Result<()> {
    let settings = leasehold::Settings {
        endpoints: leasehold::parse_endpoints(&arguments.endpoints),
        ..leasehold::Settings::from_env()
    };
    let client =
        settings.client().context("client settings")?.with_client_name(format!("worker-{}", std::process::id()));
    client.status_any().await.context("connect to the cluster")?;
    let session = client.session(Duration::from_millis(arguments.ttl_ms)).await.context("create a session")?;
    let guard = session.lock(&arguments.lock).await.context("acquire the lock")?;
    println!("acquired {}", guard.token());
    std::io::stdout().flush()?;
    if arguments.wait_for_go {
        let mut line = String::new();
        std::io::stdin().lock().read_line(&mut line)?;
    }
    let reply =
        crate::fenced_store::remote_write(arguments.store, &arguments.resource, guard.token(), &arguments.value)
            .await
            .context("write to the fenced store")?;
    println!("write {reply}");
    std::io::stdout().flush()?;
    let _ = guard.release().await;
    let _ = session.close().await;
    Ok(())
}
