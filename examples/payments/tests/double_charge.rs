//! The double-charge story against a real PostgreSQL, with real worker processes.
//!
//! Worker A takes `orders/42` with a 2 s TTL and is paused (SIGSTOP) for 5 s while
//! it believes it holds the lock. Its session expires, worker B is granted the lock
//! and charges. A wakes up and charges too. With the fence, A's conditional update
//! matches no row: one charging write. Without it (the control), A's write lands on
//! top of B's — two charging writes, and the row ends up carrying A's older token.
//!
//! The crash variant: A is SIGKILLed after the provider charged but before its own
//! write committed. B gets the lock once A's session expires and completes the
//! order; the provider answers B's request (same idempotency key, same body) with
//! the stored response, so the card is charged once.

mod support;

use std::time::{Duration, Instant};

use leasehold_example_payments::summary::{self, OrderSummary};
use support::{acquired_token, worker, TestDatabase};

const ORDER_ID: i64 = 42;
const AMOUNT_CENTS: i64 = 4_200;
const TTL: Duration = Duration::from_secs(2);
/// How long A stays stopped: well past its TTL.
const PAUSE: Duration = Duration::from_secs(5);

struct Story {
    token_a: i64,
    token_b: i64,
    /// A's line after it woke up and tried to charge.
    late_line: String,
    late_exit_code: Option<i32>,
    order: OrderSummary,
}

fn ttl_argument() -> String {
    format!("{}ms", TTL.as_millis())
}

async fn paused_holder_story(fencing: bool) -> Story {
    let cluster = support::cluster().await;
    let database = TestDatabase::create(if fencing { "pause" } else { "pause_control" }).await;
    leasehold_example_payments::schema::add_order(&database.connect().await, ORDER_ID, AMOUNT_CENTS).await.unwrap();
    let ttl = ttl_argument();
    let mut common = vec!["--ttl", ttl.as_str(), "--wait", "30s"];
    if !fencing {
        common.push("--no-fencing");
    }

    let mut a = worker(&cluster, &database, "A", ORDER_ID, &[&common[..], &["--pause-at", "acquired"]].concat());
    let token_a = acquired_token(&a.next_line("A to acquire orders/42").await);
    assert_eq!(a.next_line("A to stop before charging").await, "paused at acquired");
    // A stalls (a GC pause, swap) while it believes it holds the lock.
    a.signal(libc::SIGSTOP);
    let stopped_at = Instant::now();

    let mut b = worker(&cluster, &database, "B", ORDER_ID, &common);
    let token_b = acquired_token(&b.next_line("B to acquire orders/42 once A's session expired").await);
    assert!(token_b > token_a, "B's token {token_b} must exceed A's {token_a}");
    let charged_b = b.next_line("B's charge").await;
    assert!(
        charged_b.starts_with(&format!("charged order {ORDER_ID} token {token_b} charge ")),
        "B charges first: {charged_b:?}"
    );
    assert_eq!(b.exit_code("B finished").await, Some(0));

    // The pause is the scenario, not a synchronisation: B is done; A stays stopped
    // for PAUSE in all, then resumes and is told to go on.
    tokio::time::sleep_until((stopped_at + PAUSE).into()).await;
    a.signal(libc::SIGCONT);
    a.go();
    let late_line = a.next_line("A's charge after it woke up").await;
    let late_exit_code = a.exit_code("A finished").await;
    let order = summary::order(&database.connect().await, ORDER_ID).await.unwrap();
    Story { token_a, token_b, late_line, late_exit_code, order }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_paused_past_its_lease_cannot_charge_again_through_the_fence() {
    let story = paused_holder_story(true).await;
    let (token_a, token_b) = (story.token_a, story.token_b);
    assert_eq!(
        story.late_line,
        format!("superseded order {ORDER_ID} token {token_a} by token {token_b}"),
        "A's UPDATE must affect 0 rows"
    );
    assert_eq!(story.late_exit_code, Some(i32::from(leasehold_example_payments::EXIT_SUPERSEDED)));
    let order = &story.order;
    assert_eq!(order.accepted_tokens, vec![token_b], "exactly one charging write, B's: {order:?}");
    assert_eq!(order.rejected_tokens, vec![token_a], "A's stale write was refused: {order:?}");
    assert_eq!(order.provider_charges, 1, "one charge at the provider: {order:?}");
    assert_eq!((order.status.as_str(), order.fence_token), ("charged", token_b), "{order:?}");
    assert_eq!(order.charged_by.as_deref(), Some("B"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_without_the_fence_check_the_stale_worker_charges_a_second_time() {
    let story = paused_holder_story(false).await;
    let (token_a, token_b) = (story.token_a, story.token_b);
    assert!(
        story.late_line.starts_with(&format!("charged order {ORDER_ID} token {token_a} charge ")),
        "without the check A's UPDATE goes through: {:?}",
        story.late_line
    );
    assert_eq!(story.late_exit_code, Some(0));
    let order = &story.order;
    assert_eq!(
        order.accepted_tokens,
        vec![token_b, token_a],
        "two charging writes, the second from the superseded holder: {order:?}"
    );
    assert!(order.rejected_tokens.is_empty(), "{order:?}");
    assert!(order.stale_write_landed(), "{order:?}");
    assert_eq!(order.fence_token, token_a, "the row now carries A's older token: {order:?}");
    assert_eq!(order.charged_by.as_deref(), Some("A"));
    // The money moved once only because the provider keeps one charge per order and
    // A's request matched B's (same key, same body): the provider's idempotency,
    // not the lock, caught it.
    assert!(story.late_line.ends_with(" replayed"), "{:?}", story.late_line);
    assert_eq!(order.provider_charges, 1, "{order:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_mid_charge_is_completed_by_the_next_holder_without_a_second_charge() {
    let cluster = support::cluster().await;
    let database = TestDatabase::create("crash").await;
    let connection = database.connect().await;
    leasehold_example_payments::schema::add_order(&connection, ORDER_ID, AMOUNT_CENTS).await.unwrap();
    let ttl = ttl_argument();

    let mut a = worker(&cluster, &database, "A", ORDER_ID, &["--ttl", &ttl, "--pause-at", "provider-charged"]);
    let token_a = acquired_token(&a.next_line("A to acquire orders/42").await);
    assert_eq!(
        a.next_line("A to stop between the provider's charge and its own commit").await,
        "paused at provider-charged"
    );
    let mid_charge = summary::order(&connection, ORDER_ID).await.unwrap();
    assert_eq!(
        (mid_charge.provider_charges, mid_charge.status.as_str(), mid_charge.fence_token),
        (1, "pending", 0),
        "mid-charge: the provider charged, the payments write is not committed: {mid_charge:?}"
    );

    // B queues for the lock while A holds it; A dies without releasing anything.
    let mut b = worker(&cluster, &database, "B", ORDER_ID, &["--ttl", &ttl, "--wait", "30s"]);
    a.signal(libc::SIGKILL);
    let killed_at = Instant::now();
    assert_eq!(a.exit_code("A to die").await, None, "A was killed by a signal");

    let token_b = acquired_token(&b.next_line("B to acquire orders/42 after A's session expired").await);
    let waited = killed_at.elapsed();
    assert!(token_b > token_a, "B's token {token_b} must exceed A's {token_a}");
    // A's last keepalive was at most TTL / KEEPALIVES_PER_TTL before the kill, and a
    // lease is never shortened: the grant passes on only once the TTL has run out.
    let earliest = TTL - TTL / leasehold::keepalive::KEEPALIVES_PER_TTL;
    assert!(waited >= earliest, "B was granted {waited:?} after the kill, before A's lease could expire");
    let charged_b = b.next_line("B's charge").await;
    assert!(
        charged_b.starts_with(&format!("charged order {ORDER_ID} token {token_b} charge "))
            && charged_b.ends_with(" replayed"),
        "B completes the order with the provider's stored response: {charged_b:?}"
    );
    assert_eq!(b.exit_code("B finished").await, Some(0));

    let order = summary::order(&connection, ORDER_ID).await.unwrap();
    assert_eq!(order.provider_charges, 1, "no double charge: {order:?}");
    assert_eq!(order.accepted_tokens, vec![token_b], "A's write died with it; B's landed: {order:?}");
    assert_eq!((order.status.as_str(), order.fence_token), ("charged", token_b), "{order:?}");
    assert_eq!(order.charged_by.as_deref(), Some("B"));
}
