//! `describe lock | sem | session`: one object's state as the leader sees it.

use leasehold::{Client, Error};

use super::arguments::DescribeWhat;
use super::exit::EXIT_SUCCESS;
use super::render;

/// An unknown session is refused by the server (exit 76); an unknown lock or
/// semaphore is simply free.
pub async fn run(client: &Client, what: DescribeWhat) -> Result<u8, Error> {
    let text = match what {
        DescribeWhat::Lock { name, json } => render::lock(&name, &client.describe_lock(&name, false).await?, json),
        DescribeWhat::Sem { name, json } => render::semaphore(&name, &client.describe_semaphore(&name).await?, json),
        DescribeWhat::Session { session_id, json } => {
            render::sessions(&[client.describe_session(session_id).await?], json)
        }
    };
    print!("{text}");
    Ok(EXIT_SUCCESS)
}
