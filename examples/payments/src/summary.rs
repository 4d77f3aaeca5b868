//! The numbers the demo prints and the tests check, read back from the tables.

use std::fmt::Write as _;

use tokio_postgres::Client;

/// One order, as the payments table and the provider's ledger see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrderSummary {
    pub order_id: i64,
    pub status: String,
    /// The token of the last accepted write.
    pub fence_token: i64,
    pub charged_by: Option<String>,
    /// Money movements in the provider's ledger (at most 1: its UNIQUE key).
    pub provider_charges: i64,
    /// Charging writes the payments table accepted, and the tokens they carried,
    /// in the order they committed.
    pub accepted_tokens: Vec<i64>,
    /// Charging writes the fence refused.
    pub rejected_tokens: Vec<i64>,
}

impl OrderSummary {
    /// True when a write with a lower token landed after one with a higher token:
    /// the row was overwritten by a holder that had been superseded.
    pub fn stale_write_landed(&self) -> bool {
        self.accepted_tokens.windows(2).any(|pair| pair[1] < pair[0])
    }
}

pub async fn order(database: &Client, order_id: i64) -> anyhow::Result<OrderSummary> {
    let row = database
        .query_opt(
            "SELECT status, fence_token, charged_by, \
               (SELECT count(*) FROM charges c WHERE c.order_id = p.order_id) \
             FROM payments p WHERE order_id = $1",
            &[&order_id],
        )
        .await?
        .ok_or_else(|| anyhow::anyhow!("order {order_id} has no payment row"))?;
    let tokens = |outcome: &'static str| async move {
        database
            .query(
                "SELECT fence_token FROM charge_attempts WHERE order_id = $1 AND outcome = $2 \
                 ORDER BY attempt_id",
                &[&order_id, &outcome],
            )
            .await
            .map(|rows| rows.iter().map(|row| row.get::<_, i64>(0)).collect())
    };
    Ok(OrderSummary {
        order_id,
        status: row.get(0),
        fence_token: row.get(1),
        charged_by: row.get(2),
        provider_charges: row.get(3),
        accepted_tokens: tokens("charged").await?,
        rejected_tokens: tokens("superseded").await?,
    })
}

/// Emails per (user, campaign): how many pairs had 0, 1 or more rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmailSummary {
    pub users: i64,
    pub campaigns: Vec<String>,
    /// (user, campaign) pairs with no email row.
    pub missing: i64,
    /// Pairs with exactly one row.
    pub exactly_once: i64,
    /// Pairs with more than one row (impossible while the UNIQUE key stands).
    pub duplicated: i64,
    /// The fewest and the most email rows any user has, over all campaigns.
    pub per_user: (i64, i64),
    /// Sender runs per campaign: (campaign, pods that ran), in campaign order.
    pub runs: Vec<(String, Vec<String>)>,
}

pub async fn emails(database: &Client) -> anyhow::Result<EmailSummary> {
    let users: i64 = database.query_one("SELECT count(*) FROM users", &[]).await?.get(0);
    let campaigns: Vec<String> = database
        .query("SELECT DISTINCT campaign_id FROM report_runs ORDER BY campaign_id", &[])
        .await?
        .iter()
        .map(|row| row.get(0))
        .collect();
    let counts = database
        .query_one(
            "SELECT count(*) FILTER (WHERE n = 0), count(*) FILTER (WHERE n = 1), \
                    count(*) FILTER (WHERE n > 1) \
             FROM (SELECT u.user_id, c.campaign_id, \
                     (SELECT count(*) FROM email_sends e \
                       WHERE e.user_id = u.user_id AND e.campaign_id = c.campaign_id) AS n \
                   FROM users u CROSS JOIN unnest($1::text[]) AS c (campaign_id)) AS pairs",
            &[&campaigns],
        )
        .await?;
    let per_user = database
        .query_one(
            "SELECT coalesce(min(n), 0), coalesce(max(n), 0) FROM \
               (SELECT count(e.user_id) AS n FROM users u \
                  LEFT JOIN email_sends e ON e.user_id = u.user_id GROUP BY u.user_id) AS counts",
            &[],
        )
        .await?;
    let mut runs = Vec::new();
    for campaign in &campaigns {
        let pods = database
            .query("SELECT pod FROM report_runs WHERE campaign_id = $1 ORDER BY run_id", &[campaign])
            .await?
            .iter()
            .map(|row| row.get(0))
            .collect();
        runs.push((campaign.clone(), pods));
    }
    Ok(EmailSummary {
        users,
        campaigns,
        missing: counts.get(0),
        exactly_once: counts.get(1),
        duplicated: counts.get(2),
        per_user: (per_user.get(0), per_user.get(1)),
        runs,
    })
}

/// The report `leasehold-payments summary` prints.
pub async fn render(database: &Client) -> anyhow::Result<String> {
    let mut text = String::new();
    let order_ids: Vec<i64> = database
        .query("SELECT order_id FROM payments ORDER BY order_id", &[])
        .await?
        .iter()
        .map(|row| row.get(0))
        .collect();
    for order_id in order_ids {
        let order = order(database, order_id).await?;
        let list = |tokens: &[i64]| {
            if tokens.is_empty() {
                String::new()
            } else {
                let tokens: Vec<String> = tokens.iter().map(i64::to_string).collect();
                format!(" (token {})", tokens.join(", "))
            }
        };
        writeln!(
            text,
            "order {}: {} charge(s) at the provider; {} charging write(s) accepted{}; \
             {} stale write(s) rejected by the fence{}; the row says {} by {} with token {}{}",
            order.order_id,
            order.provider_charges,
            order.accepted_tokens.len(),
            list(&order.accepted_tokens),
            order.rejected_tokens.len(),
            list(&order.rejected_tokens),
            order.status,
            order.charged_by.as_deref().unwrap_or("nobody"),
            order.fence_token,
            if order.stale_write_landed() { "  <- OVERWRITTEN BY A SUPERSEDED HOLDER" } else { "" },
        )?;
    }
    let emails = emails(database).await?;
    if !emails.campaigns.is_empty() {
        writeln!(
            text,
            "emails: {} users x {} campaign(s): {} pair(s) with exactly one email, {} missing, {} duplicated",
            emails.users,
            emails.campaigns.len(),
            emails.exactly_once,
            emails.missing,
            emails.duplicated
        )?;
        let (fewest, most) = emails.per_user;
        writeln!(
            text,
            "emails per user: between {fewest} and {most} (one per campaign is {})",
            emails.campaigns.len()
        )?;
        for (campaign, pods) in &emails.runs {
            writeln!(text, "campaign {campaign}: sender ran in {} pod(s): {}", pods.len(), pods.join(", "))?;
        }
    }
    Ok(text)
}
