//! Grants the cluster tests make and then check survived: lock names with the
//! tokens they were granted with.

use leasehold::{Client, Session};

/// Takes `count` free locks `prefix/0`, `prefix/1`, … on one session and keeps them;
/// returns (name, token) of each acknowledged grant.
pub async fn take_locks(session: &Session, prefix: &str, count: usize) -> Vec<(String, u64)> {
    let mut grants = Vec::new();
    for i in 0..count {
        let name = format!("{prefix}/{i}");
        let guard = session.try_lock(&name).await.expect("acquire").expect("the lock is free");
        grants.push((name, guard.detach()));
    }
    grants
}

/// Panics unless each lock of `grants` is held by `session_id` with its token.
pub async fn assert_held(client: &Client, session_id: u64, grants: &[(String, u64)]) {
    for (name, token) in grants {
        let lock = client.describe_lock(name, false).await.expect("describe lock");
        let holder = lock.holder.unwrap_or_else(|| panic!("acknowledged grant of {name} was lost"));
        assert_eq!((holder.session_id, holder.token), (session_id, *token), "grant of {name} changed");
    }
}
