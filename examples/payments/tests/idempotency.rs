//! The provider's Idempotency-Key: a retry with the same key and body gets the first
//! response and charges nothing; the same key with a different body is refused (the
//! HTTP 422 case).

mod support;

use std::process::Command;

use leasehold_example_payments::provider::{self, ChargeRequest, ProviderError};
use leasehold_example_payments::{database, EXIT_IDEMPOTENCY_KEY_REUSED};
use support::{payments_binary, TestDatabase};

fn charge(database: &TestDatabase, key: &str, order_id: i64, amount_cents: i64) -> std::process::Output {
    Command::new(payments_binary())
        .env(database::DATABASE_URL_ENV, &database.url)
        .args([
            "charge",
            "--key",
            key,
            "--order-id",
            &order_id.to_string(),
            "--amount-cents",
            &amount_cents.to_string(),
        ])
        .output()
        .expect("run leasehold-payments charge")
}

async fn charges_of(database: &TestDatabase, order_id: i64) -> Vec<(i64, i64)> {
    database
        .connect()
        .await
        .query("SELECT charge_id, amount_cents FROM charges WHERE order_id = $1", &[&order_id])
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_with_the_same_key_gets_the_first_response_and_a_different_body_is_refused() {
    let database = TestDatabase::create("idempotency").await;
    let first = charge(&database, "checkout-7f3a", 7, 1_999);
    assert!(first.status.success(), "{first:?}");
    let retry = charge(&database, "checkout-7f3a", 7, 1_999);
    assert!(retry.status.success(), "{retry:?}");
    assert_eq!(retry.stdout, first.stdout, "the retry gets the first response, byte for byte");
    assert!(String::from_utf8_lossy(&retry.stderr).contains("nothing charged"), "{retry:?}");
    let charges = charges_of(&database, 7).await;
    assert_eq!(charges.len(), 1, "charged once: {charges:?}");

    let different = charge(&database, "checkout-7f3a", 7, 2_999);
    assert_eq!(different.status.code(), Some(i32::from(EXIT_IDEMPOTENCY_KEY_REUSED)), "{different:?}");
    assert!(String::from_utf8_lossy(&different.stderr).contains("422"), "{different:?}");
    assert!(different.stdout.is_empty(), "a refusal answers nothing: {different:?}");
    assert_eq!(charges_of(&database, 7).await, charges, "the refused request changed nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_retries_with_one_key_charge_once_and_agree_on_the_answer() {
    const RETRIES: usize = 8;
    let database = TestDatabase::create("idempotency_race").await;
    let request = ChargeRequest { order_id: 8, amount_cents: 500 };
    let mut tasks = Vec::new();
    for _ in 0..RETRIES {
        let mut connection = database.connect().await;
        let request = request.clone();
        tasks.push(tokio::spawn(async move { provider::charge(&mut connection, "retry-storm", &request).await }));
    }
    let mut outcomes = Vec::new();
    for task in tasks {
        outcomes.push(task.await.unwrap().expect("every retry is answered"));
    }
    assert_eq!(outcomes.iter().filter(|outcome| !outcome.replayed).count(), 1, "{outcomes:?}");
    assert!(outcomes.iter().all(|outcome| outcome.response == outcomes[0].response), "{outcomes:?}");
    assert_eq!(charges_of(&database, 8).await.len(), 1);

    let mut connection = database.connect().await;
    let changed = ChargeRequest { amount_cents: 501, ..request };
    let refused = provider::charge(&mut connection, "retry-storm", &changed).await;
    assert!(matches!(refused, Err(ProviderError::KeyReused { .. })), "{refused:?}");
}
