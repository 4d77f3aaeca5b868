//! Fenced writes to a real PostgreSQL: the double-charge and the triple-email
//! stories, end to end, with Leasehold locks and the database's own rules.
//!
//! Two kinds of safety meet here, and the example keeps them apart on purpose:
//!
//! * The **lock** (`orders/<id>`, `weekly-report`) makes it unlikely that two
//!   workers do the same job at once, and orders them: every grant carries a larger
//!   fencing token than the one before.
//! * The **storage** is what makes the outcome correct when the lock is not enough —
//!   a worker paused past its lease still believes it holds the lock. The `payments`
//!   row keeps the highest token that wrote it and refuses lower ones; the provider's
//!   ledger keeps one charge per order and one answer per idempotency key; the
//!   `email_sends` table keeps one row per user and campaign.
//!
//! # Layout
//!
//! * `database` — connecting, and the database's error kinds the example reacts to.
//! * `schema` — the tables, created idempotently, and the seed rows.
//! * `provider` — the payment provider's side: a charge keyed by an Idempotency-Key,
//!   a replay for a retry with the same body, a refusal (HTTP 422) for a different one.
//! * `payments` — the worker's fenced charge of one order.
//! * `weekly_report` — the sender the report pods run under `leasehold lock --try`.
//! * `summary` — the numbers the demo prints: charges, rejected writes, emails.

pub mod database;
pub mod payments;
pub mod provider;
pub mod schema;
pub mod summary;
pub mod weekly_report;

/// Exit code of the worker when its fenced write was refused: a newer holder wrote.
pub const EXIT_SUPERSEDED: u8 = 3;
/// Exit code when the lock was not acquired in time (the same as `leasehold lock`).
pub const EXIT_NOT_ACQUIRED: u8 = 75;
/// Exit code of `charge` when the idempotency key was used with a different request
/// (what an HTTP service answers with 422 Unprocessable Content).
pub const EXIT_IDEMPOTENCY_KEY_REUSED: u8 = 22;
