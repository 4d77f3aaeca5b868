//! `member list | add | remove`: the cluster's membership.

use leasehold::{Client, Error};

use super::arguments::MemberAction;
use super::exit::EXIT_SUCCESS;
use super::render;

/// Prints the members (after the change, for `add` and `remove`).
pub async fn run(client: &Client, action: MemberAction) -> Result<u8, Error> {
    let members = match action {
        MemberAction::List { json } => {
            let status = client.status_any().await?;
            print!("{}", render::members(&status.members, json));
            return Ok(EXIT_SUCCESS);
        }
        MemberAction::Add { node_id, client_addr, peer_addr, learner } => {
            eprintln!(
                "adding node {node_id} as a learner{} (waits until it caught up)…",
                if learner { "" } else { ", then promoting it" }
            );
            client.add_member(node_id, &client_addr, &peer_addr, learner).await?
        }
        MemberAction::Remove { node_id } => client.remove_member(node_id).await?,
    };
    print!("{}", render::members(&members, false));
    Ok(EXIT_SUCCESS)
}
