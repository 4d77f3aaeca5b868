//! `leader` and `observe`: who leads an election, now or at every change.

use std::io::Write;

use leasehold::{Client, Error, Leader};

use super::exit::EXIT_SUCCESS;
use super::render;

/// The current leader, or vacant.
pub async fn leader(client: &Client, name: &str, as_json: bool) -> Result<u8, Error> {
    let leader = client.leader(name).await?;
    print_now(name, leader.as_ref(), as_json);
    Ok(EXIT_SUCCESS)
}

/// One line per change of leader (vacancies included) until interrupted or the
/// stream ends.
pub async fn observe(client: &Client, name: &str, as_json: bool) -> Result<u8, Error> {
    let mut changes = client.observe(name);
    while let Some(change) = futures::StreamExt::next(&mut changes).await {
        print_now(name, change?.as_ref(), as_json);
    }
    Ok(EXIT_SUCCESS)
}

/// Prints a line and flushes it, so a reader of a pipe sees each change when it
/// happens.
fn print_now(name: &str, leader: Option<&Leader>, as_json: bool) {
    print!("{}", render::leader(name, leader, as_json));
    let _ = std::io::stdout().flush();
}
