//! The worker's charge of one order, fenced by the token of `orders/<id>`.
//!
//! In one transaction of the payments database:
//!
//! 1. the conditional update takes the order's row — `fence_token < $token` — or
//!    matches nothing because a newer holder already wrote: then stop;
//! 2. the provider is asked to charge, with the idempotency key `order-<id>` (the
//!    provider commits on its own: it is another system);
//! 3. the charge id is recorded and the transaction commits.
//!
//! A worker killed between 2 and 3 leaves the provider's charge and no payments
//! write. The next holder's update succeeds (the killed worker's never committed),
//! and the provider answers its request with the stored response instead of
//! charging again. A worker paused past its lease before step 1 finds, when it
//! wakes, a row carrying a newer token: its update matches no row.
//!
//! The worker does not ask whether its session is still alive before writing: such
//! a check is stale the moment it returns (the pause can fall right after it). The
//! conditional update is the check that cannot go stale.

use std::future::Future;

use anyhow::Context;
use leasehold::FencingToken;
use tokio_postgres::Client;

use crate::provider::{self, ChargeOutcome, ChargeRequest};

/// The fenced write. `charged_by` only feeds the report; the `WHERE` clause is the
/// whole safety argument.
pub const FENCED_UPDATE_SQL: &str = "UPDATE payments SET status = 'charged', fence_token = $2, \
     charged_by = $3 WHERE order_id = $1 AND fence_token < $2 RETURNING amount_cents";

/// The same write without the check (`--no-fencing`): what a worker that trusts its
/// lock does. A stale holder overwrites the row of a newer one.
pub const UNFENCED_UPDATE_SQL: &str = "UPDATE payments SET status = 'charged', fence_token = $2, \
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
    /// The update matched no row: the row carries `highest_token`, written by a
    /// newer holder. Nothing was charged.
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
    let update = if order.fencing { FENCED_UPDATE_SQL } else { UNFENCED_UPDATE_SQL };
    let taken = transaction
        .query_opt(update, &[&order.order_id, &token, &order.worker])
        .await
        .context("the charging update")?;
    let Some(row) = taken else {
        let highest: Option<i64> = transaction
            .query_opt("SELECT fence_token FROM payments WHERE order_id = $1", &[&order.order_id])
            .await?
            .map(|row| row.get(0));
        let Some(highest_token) = highest else {
            anyhow::bail!("order {} has no payment row", order.order_id);
        };
        record_attempt(&transaction, order, token, "superseded").await?;
        transaction.commit().await?;
        return Ok(ChargeOrderOutcome::Superseded { highest_token });
    };
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
