//! The weekly report's sender. Every pod runs it from its own cron, wrapped in
//! `leasehold lock --try weekly-report -- leasehold-payments send-report …`: the pod
//! that gets the lock sends, the others exit 75 and skip this week.
//!
//! The lock makes one pod do the work; it cannot make the work happen once (a pod
//! paused past its lease runs on). The table does that: `email_sends` is
//! `UNIQUE (user_id, campaign_id)` and the insert says `ON CONFLICT DO NOTHING`, so a
//! second sender, late or concurrent, inserts nothing that was already sent.

use leasehold::FencingToken;
use tokio_postgres::Client;

/// The lock every pod tries.
pub const LOCK_NAME: &str = "weekly-report";

/// What one sender run did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendReport {
    pub campaign_id: String,
    pub pod: String,
    /// Rows this run inserted; emails already sent for the campaign are skipped.
    pub emails_inserted: u64,
}

/// Sends `campaign_id` to every user who has not had it, and records the run.
pub async fn send(
    database: &mut Client,
    campaign_id: &str,
    pod: &str,
    token: Option<FencingToken>,
) -> anyhow::Result<SendReport> {
    let token = token.map(FencingToken::to_sql_bigint).transpose()?;
    let transaction = database.transaction().await?;
    // A real sender would hand each inserted row to the mail queue in this
    // transaction (an outbox): the row is the promise that the email goes out once.
    let emails_inserted = transaction
        .execute(
            "INSERT INTO email_sends (user_id, campaign_id, pod) \
             SELECT user_id, $1, $2 FROM users ORDER BY user_id \
             ON CONFLICT (user_id, campaign_id) DO NOTHING",
            &[&campaign_id, &pod],
        )
        .await?;
    transaction
        .execute(
            "INSERT INTO report_runs (campaign_id, pod, fence_token, emails_inserted) \
             VALUES ($1, $2, $3, $4)",
            &[&campaign_id, &pod, &token, &(emails_inserted as i64)],
        )
        .await?;
    transaction.commit().await?;
    Ok(SendReport { campaign_id: campaign_id.to_string(), pod: pod.to_string(), emails_inserted })
}
