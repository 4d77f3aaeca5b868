//! The worker's charge of one order, fenced by the token of `orders/<id>`.
//!
//! In one transaction of the payments database:
//!
//! 1. `leasehold::fence::postgres::guard` advances the fence of `orders/<id>` to the
//!    worker's token in the same transaction — one statement, `… WHERE token < $token`
//!    — or refuses because a newer holder already wrote: then stop. On success the
//!    fence row stays locked until this transaction ends, so the updates below are
//!    fenced with it;
//! 2. the provider is asked to charge, with the idempotency key `order-<id>` (the
//!    provider commits on its own: it is another system);
//! 3. the charge id is recorded and the transaction commits.
//!
//! A worker killed between 2 and 3 leaves the provider's charge and no payments
//! write. The next holder's guard succeeds (the killed worker's never committed),
//! and the provider answers its request with the stored response instead of
//! charging again. A worker paused past its lease before step 1 finds, when it
//! wakes, a fence carrying a newer token: its guard is refused.
//!
//! The worker does not ask whether its session is still alive before writing: such
//! a check is stale the moment it returns (the pause can fall right after it). The
//! conditional update is the check that cannot go stale.

use std::future::Future;

use anyhow::Context;
use leasehold::fence::{postgres, Mode, Outcome};
use leasehold::FencingToken;
use tokio_postgres::Client;

use crate::provider::{self, ChargeOutcome, ChargeRequest};

/// The charging write, run after the fence admitted the worker (or without it for
/// `--no-fencing`: what a worker that trusts its lock does, where a stale holder
/// overwrites the row of a newer one). `fence_token` and `charged_by` feed the report.
pub const CHARGE_SQL: &str = "UPDATE payments SET status = 'charged', fence_token = $2, \
     charged_by = $3 WHERE order_id = $1 RETURNING amount_cents";

/// One worker's request to charge an order.
#[derive(Debug, Clone)]
pub struct ChargeOrder {
    pub order_id: i64,
    /// The token of the worker's grant of `orders/<order_id>`.
    pub token: FencingToken,
    /// Shown in the report as the writer.
    pub worker: String,
    /// False for the `--no-fencing` control.
    pub fencing: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChargeOrderOutcome {
    /// The fenced update took the row and the provider answered.
    Charged(ChargeOutcome),
    /// The fence refused the worker: `highest_token` is the newer holder's token
    /// that wrote the order. Nothing was charged.
    Superseded { highest_token: i64 },
}

/// The lock that protects an order's payment row.
pub fn lock_name(order_id: i64) -> String {
    format!("orders/{order_id}")
}

/// The idempotency key the payments service sends the provider for an order: the
/// same for every worker and every retry, so a crash between charging and recording
/// cannot become a second charge.
pub fn idempotency_key(order_id: i64) -> String {
    format!("order-{order_id}")
}

/// Charges `order` as described in the module documentation. `after_provider`
/// runs after the provider committed and before the payments write commits — the
/// point where the crash test kills the worker.
pub async fn charge_order<F, Fut>(
    payments: &mut Client,
    provider_database: &mut Client,
    order: &ChargeOrder,
    after_provider: F,
) -> anyhow::Result<ChargeOrderOutcome>
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = anyhow::Result<()>>,
{
    let token = order.token.to_sql_bigint().context("bind the fencing token")?;
    let transaction = payments.transaction().await?;
    if order.fencing {
        let fence = postgres::guard(&transaction, &lock_name(order.order_id), order.token, Mode::OncePerGrant)
            .await
            .context("the fence")?;
        if let Outcome::Superseded { seen, .. } = fence {
            let highest_token = seen.to_sql_bigint().context("the fence's token")?;
            record_attempt(&transaction, order, token, "superseded").await?;
            transaction.commit().await?;
            return Ok(ChargeOrderOutcome::Superseded { highest_token });
        }
    }
    let row = transaction
        .query_opt(CHARGE_SQL, &[&order.order_id, &token, &order.worker])
        .await
        .context("the charging update")?
        .with_context(|| format!("order {} has no payment row", order.order_id))?;
    let request = ChargeRequest { order_id: order.order_id, amount_cents: row.get(0) };
    let outcome = provider::charge(provider_database, &idempotency_key(order.order_id), &request)
        .await
        .context("the provider's charge")?;
    after_provider().await?;
    transaction
        .execute(
            "UPDATE payments SET charge_id = $2 WHERE order_id = $1",
            &[&order.order_id, &outcome.response.charge_id],
        )
        .await?;
    record_attempt(&transaction, order, token, "charged").await?;
    transaction.commit().await?;
    Ok(ChargeOrderOutcome::Charged(outcome))
}

async fn record_attempt(
    transaction: &tokio_postgres::Transaction<'_>,
    order: &ChargeOrder,
    token: i64,
    outcome: &str,
) -> Result<(), tokio_postgres::Error> {
    transaction
        .execute(
            "INSERT INTO charge_attempts (order_id, worker, fence_token, outcome) \
             VALUES ($1, $2, $3, $4)",
            &[&order.order_id, &order.worker, &token, &outcome],
        )
        .await
        .map(|_| ())
}
