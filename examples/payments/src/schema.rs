//! The example's tables. Each constraint is one of the guarantees the stories rely
//! on; the comments say which.

use tokio_postgres::Client;

/// Created with `IF NOT EXISTS`, so `setup` can run again on the same database.
pub const SCHEMA_SQL: &str = r#"
-- The payments service's own table: one row per order, protected by the lock
-- `orders/<order_id>` and, whatever the lock says, by its fence column.
CREATE TABLE IF NOT EXISTS payments (
    payment_id   BIGSERIAL PRIMARY KEY,
    order_id     BIGINT NOT NULL UNIQUE,
    amount_cents BIGINT NOT NULL CHECK (amount_cents > 0),
    status       TEXT   NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'charged')),
    -- The highest fencing token that wrote this row; 0 until the first write (every
    -- grant's token is at least 1). A write carrying a lower token is refused.
    fence_token  BIGINT NOT NULL DEFAULT 0 CHECK (fence_token >= 0),
    -- Who wrote last, and the provider's charge it recorded: for the report.
    charged_by   TEXT,
    charge_id    BIGINT
);

-- What each worker's charging write did, for the report: 'charged' rows commit with
-- the fenced update (a worker killed mid-charge leaves none); 'superseded' rows
-- record a fenced update that matched no row because a newer holder had written.
CREATE TABLE IF NOT EXISTS charge_attempts (
    attempt_id  BIGSERIAL PRIMARY KEY,
    order_id    BIGINT NOT NULL,
    worker      TEXT   NOT NULL,
    fence_token BIGINT NOT NULL,
    outcome     TEXT   NOT NULL CHECK (outcome IN ('charged', 'superseded')),
    at          TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- The payment provider's ledger: money that moved. UNIQUE (order_id) is the
-- idempotency key a provider keeps: one charge per order, whoever asks.
CREATE TABLE IF NOT EXISTS charges (
    charge_id       BIGSERIAL PRIMARY KEY,
    order_id        BIGINT NOT NULL UNIQUE,
    amount_cents    BIGINT NOT NULL CHECK (amount_cents > 0),
    idempotency_key TEXT   NOT NULL,
    created_at      TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- The provider's Idempotency-Key store: a retry with the same key and body gets the
-- stored response; the same key with another body is refused (HTTP 422).
CREATE TABLE IF NOT EXISTS idempotency_keys (
    key          TEXT PRIMARY KEY,
    -- sha256 of the canonical request body, hex.
    request_hash TEXT NOT NULL,
    -- Set in the transaction that claims the key, so no other transaction ever sees
    -- it NULL.
    response     TEXT,
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- The weekly report's audience.
CREATE TABLE IF NOT EXISTS users (
    user_id BIGINT PRIMARY KEY,
    email   TEXT NOT NULL UNIQUE
);

-- One row per email sent. UNIQUE (user_id, campaign_id) with ON CONFLICT DO NOTHING
-- is what keeps it to one email per user and campaign, lock or no lock.
CREATE TABLE IF NOT EXISTS email_sends (
    user_id     BIGINT NOT NULL REFERENCES users (user_id),
    campaign_id TEXT   NOT NULL,
    pod         TEXT   NOT NULL,
    sent_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    UNIQUE (user_id, campaign_id)
);

-- One row per sender run: which pod ran, under which token, how many emails it
-- inserted. The lock's job shows here (one run per campaign); the emails' safety
-- does not depend on it.
CREATE TABLE IF NOT EXISTS report_runs (
    run_id          BIGSERIAL PRIMARY KEY,
    campaign_id     TEXT   NOT NULL,
    pod             TEXT   NOT NULL,
    fence_token     BIGINT,
    emails_inserted BIGINT NOT NULL,
    at              TIMESTAMPTZ NOT NULL DEFAULT now()
);
"#;

/// Drops the example's tables (for `setup --fresh`).
pub const DROP_SQL: &str = "DROP TABLE IF EXISTS payments, charge_attempts, charges, \
    idempotency_keys, email_sends, report_runs, users, leasehold_fence";

/// The example's tables, and the fence table of `leasehold::fence::postgres`
/// (`leasehold_fence`: the newest token per resource, `orders/<id>` here).
pub async fn create(client: &Client) -> anyhow::Result<()> {
    client.batch_execute(SCHEMA_SQL).await?;
    leasehold::fence::postgres::create_table_in(client, leasehold::fence::postgres::DEFAULT_TABLE).await?;
    Ok(())
}

pub async fn drop_all(client: &Client) -> Result<(), tokio_postgres::Error> {
    client.batch_execute(DROP_SQL).await
}

/// Adds a pending payment for `order_id` unless the order exists.
pub async fn add_order(client: &Client, order_id: i64, amount_cents: i64) -> Result<(), tokio_postgres::Error> {
    client
        .execute(
            "INSERT INTO payments (order_id, amount_cents) VALUES ($1, $2) \
             ON CONFLICT (order_id) DO NOTHING",
            &[&order_id, &amount_cents],
        )
        .await
        .map(|_| ())
}

/// Makes sure users 1 ..= `count` exist.
pub async fn add_users(client: &Client, count: i64) -> Result<(), tokio_postgres::Error> {
    client
        .execute(
            "INSERT INTO users (user_id, email) \
             SELECT id, 'user' || id || '@example.com' FROM generate_series(1, $1::bigint) AS id \
             ON CONFLICT (user_id) DO NOTHING",
            &[&count],
        )
        .await
        .map(|_| ())
}
