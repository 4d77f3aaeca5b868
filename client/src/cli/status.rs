//! `status`: every endpoint's own view of the cluster, asked one by one, so a node
//! that does not answer is a row rather than an error. `--all` (admin) adds every
//! tenant's usage against its quotas.

use leasehold::{Client, Error};
use serde_json::{json, Value};

use super::exit::{EXIT_SUCCESS, EXIT_UNAVAILABLE};
use super::render;

/// Exits 69 when no node answered.
pub async fn run(client: &Client, as_json: bool, all: bool) -> Result<u8, Error> {
    let mut rows = Vec::new();
    for endpoint in client.endpoints() {
        rows.push((endpoint.clone(), client.status_of(endpoint).await));
    }
    let answered = rows.iter().any(|(_, row)| row.is_ok());
    let nodes = render::status(&rows, as_json);
    if !all || !answered {
        print!("{nodes}");
    } else {
        let tenants = client.list_tenants().await?;
        if as_json {
            let mut view: Value = serde_json::from_str(&nodes).expect("status renders JSON");
            view["tenants"] = serde_json::from_str(&render::tenants(&tenants, true)).expect("tenants render JSON");
            println!("{}", json!(view));
        } else {
            print!("{nodes}\n{}", render::tenants(&tenants, false));
        }
    }
    Ok(if answered { EXIT_SUCCESS } else { EXIT_UNAVAILABLE })
}
