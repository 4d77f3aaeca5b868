//! The payment provider's side of a charge, as a library function instead of an
//! HTTP endpoint: `POST /charges` with an `Idempotency-Key` header.
//!
//! * The first request with a key charges (at most once per order: the ledger's
//!   `UNIQUE (order_id)`) and stores the response under the key, in one transaction.
//! * A retry with the same key and the same body gets the stored response, and
//!   nothing is charged again — whether the first request's answer was lost, or a
//!   second worker asks for the same order after the first one crashed.
//! * The same key with a different body is refused ([`ProviderError::KeyReused`],
//!   what an HTTP service answers with 422 Unprocessable Content): a key names one
//!   request, and silently answering a different one with it would hide a bug.
//!
//! Two concurrent requests with the same new key serialize on the key's primary key:
//! the second waits for the first to commit, then reads its response.

use serde::{Deserialize, Serialize};
use tokio_postgres::Client;

/// Longest idempotency key accepted, in bytes (providers commonly allow 255).
pub const IDEMPOTENCY_KEY_BYTES_MAX: usize = 255;

/// The body of a charge request. Serialized with its fields in this order, which
/// makes the serialization canonical: the same request always hashes the same.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChargeRequest {
    pub order_id: i64,
    pub amount_cents: i64,
}

/// What the provider answers, and stores for retries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChargeResponse {
    pub charge_id: i64,
    pub order_id: i64,
    pub amount_cents: i64,
    /// "charged" for a new charge; "already_charged" when the order had been charged
    /// under another key (the ledger's one-charge-per-order rule).
    pub status: String,
}

/// The answer to one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChargeOutcome {
    pub response: ChargeResponse,
    /// True when the response is the one stored for an earlier request with the
    /// same key: this request charged nothing.
    pub replayed: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    /// HTTP 400: the request breaks a rule; nothing was stored.
    #[error("invalid charge request: {0}")]
    Invalid(String),
    /// HTTP 422: the key was first used with a different request body.
    #[error("idempotency key {key:?} was already used with a different request; refusing (HTTP 422)")]
    KeyReused { key: String },
    #[error("database: {0}")]
    Database(#[from] tokio_postgres::Error),
    #[error("stored response for key {key:?} is unreadable: {reason}")]
    Corrupt { key: String, reason: String },
}

/// sha256 of the body, computed by PostgreSQL so that no hashing crate is needed
/// and the stored value is the one the comparison uses.
const REQUEST_HASH_SQL: &str = "encode(sha256(convert_to($2::text, 'UTF8')), 'hex')";

/// Charges `request` under `key`; see the module documentation for the rules.
pub async fn charge(database: &mut Client, key: &str, request: &ChargeRequest) -> Result<ChargeOutcome, ProviderError> {
    if key.is_empty() || key.len() > IDEMPOTENCY_KEY_BYTES_MAX {
        return Err(ProviderError::Invalid(format!(
            "the idempotency key must be 1 to {IDEMPOTENCY_KEY_BYTES_MAX} bytes, got {}",
            key.len()
        )));
    }
    if request.amount_cents <= 0 {
        return Err(ProviderError::Invalid(format!("amount_cents must be positive, got {}", request.amount_cents)));
    }
    let body = serde_json::to_string(request).expect("a request always serializes");

    let transaction = database.transaction().await?;
    let claimed = transaction
        .execute(
            &format!(
                "INSERT INTO idempotency_keys (key, request_hash) VALUES ($1, {REQUEST_HASH_SQL}) \
                 ON CONFLICT (key) DO NOTHING"
            ),
            &[&key, &body],
        )
        .await?;
    if claimed == 0 {
        // The key was committed by an earlier request (ON CONFLICT waited for it).
        let row = transaction
            .query_one(
                &format!(
                    "SELECT request_hash = {REQUEST_HASH_SQL}, response \
                     FROM idempotency_keys WHERE key = $1"
                ),
                &[&key, &body],
            )
            .await?;
        let same_request: bool = row.get(0);
        let stored: Option<String> = row.get(1);
        transaction.rollback().await?;
        if !same_request {
            return Err(ProviderError::KeyReused { key: key.to_string() });
        }
        let stored = stored.ok_or_else(|| ProviderError::Corrupt {
            key: key.to_string(),
            reason: "no response stored with the key".into(),
        })?;
        let response = serde_json::from_str(&stored)
            .map_err(|error| ProviderError::Corrupt { key: key.to_string(), reason: error.to_string() })?;
        return Ok(ChargeOutcome { response, replayed: true });
    }

    let inserted = transaction
        .query_opt(
            "INSERT INTO charges (order_id, amount_cents, idempotency_key) VALUES ($1, $2, $3) \
             ON CONFLICT (order_id) DO NOTHING RETURNING charge_id",
            &[&request.order_id, &request.amount_cents, &key],
        )
        .await?;
    let response = match inserted {
        Some(row) => ChargeResponse {
            charge_id: row.get(0),
            order_id: request.order_id,
            amount_cents: request.amount_cents,
            status: "charged".into(),
        },
        None => {
            let row = transaction
                .query_one("SELECT charge_id, amount_cents FROM charges WHERE order_id = $1", &[&request.order_id])
                .await?;
            ChargeResponse {
                charge_id: row.get(0),
                order_id: request.order_id,
                amount_cents: row.get(1),
                status: "already_charged".into(),
            }
        }
    };
    let stored = serde_json::to_string(&response).expect("a response always serializes");
    transaction.execute("UPDATE idempotency_keys SET response = $2 WHERE key = $1", &[&key, &stored]).await?;
    transaction.commit().await?;
    Ok(ChargeOutcome { response, replayed: false })
}
