//! `fence check NAME TOKEN`: whether a fencing token is still the current grant —
//! the one command that exits 1, and only for a superseded token.

use leasehold::{Client, Error};

use super::exit::{EXIT_SUCCESS, EXIT_SUPERSEDED};
use super::render;

/// Exits 0 when `token` is current, 1 when it was superseded; a check that could not
/// be made is an error with its own code.
pub async fn check(client: &Client, name: &str, token: u64) -> Result<u8, Error> {
    let answer = client.check_fence(name, token).await?;
    print!("{}", render::fence_check(name, token, &answer));
    Ok(if answer.current { EXIT_SUCCESS } else { EXIT_SUPERSEDED })
}
