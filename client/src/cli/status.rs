//! `status`: every endpoint's own view of the cluster, asked one by one, so a node
//! that does not answer is a row rather than an error.

use leasehold::{Client, Error};

use super::exit::{EXIT_SUCCESS, EXIT_UNAVAILABLE};
use super::render;

/// Exits 69 when no node answered.
pub async fn run(client: &Client, as_json: bool) -> Result<u8, Error> {
    let mut rows = Vec::new();
    for endpoint in client.endpoints() {
        rows.push((endpoint.clone(), client.status_of(endpoint).await));
    }
    print!("{}", render::status(&rows, as_json));
    Ok(if rows.iter().any(|(_, row)| row.is_ok()) { EXIT_SUCCESS } else { EXIT_UNAVAILABLE })
}
