//! `session list`: every session with what it holds and waits for; `session close`:
//! the admin ends a tenant's session.

use leasehold::{Client, Error};

use super::exit::EXIT_SUCCESS;
use super::render;

pub async fn list(client: &Client, as_json: bool) -> Result<u8, Error> {
    let sessions = client.list_sessions().await?;
    print!("{}", render::sessions(&sessions, as_json));
    Ok(EXIT_SUCCESS)
}

pub async fn close(client: &Client, session_id: u64, tenant: &str) -> Result<u8, Error> {
    client.end_session(tenant, session_id).await?;
    println!(
        "session {session_id} of tenant {tenant:?} ended: what it held goes to the next waiters after its \
         lock-delays; its holder learns it at its next keepalive"
    );
    Ok(EXIT_SUCCESS)
}
