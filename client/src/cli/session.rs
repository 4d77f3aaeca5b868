//! `session list`: every session with what it holds and waits for.

use leasehold::{Client, Error};

use super::exit::EXIT_SUCCESS;
use super::render;

pub async fn list(client: &Client, as_json: bool) -> Result<u8, Error> {
    let sessions = client.list_sessions().await?;
    print!("{}", render::sessions(&sessions, as_json));
    Ok(EXIT_SUCCESS)
}
