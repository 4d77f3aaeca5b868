//! The fencing token as a type, and how the storage a lock protects should use it.
//!
//! A lease is not mutual exclusion. A holder can stall (GC, swap, SIGSTOP) past its
//! TTL, the lock passes to someone else, and the first holder wakes up still
//! believing it holds the lock. The lock service cannot stop that late write; only
//! the storage that receives it can, by comparing tokens. Every grant of a lock
//! carries a larger token than the grants before it (it is the Raft log index of the
//! granting entry), so the rule is: **keep the highest token you accepted per
//! resource and refuse a write that carries a lower one.**
//!
//! # Patterns
//!
//! **A fence column per resource, and a conditional update.** Give each row the
//! lock protects a `fence_token BIGINT NOT NULL DEFAULT 0` column and make every
//! write conditional on it, in the same statement:
//!
//! ```sql
//! UPDATE payments SET status = 'charged', fence_token = $2
//!  WHERE order_id = $1 AND fence_token < $2
//! ```
//!
//! One row updated: the write is accepted and the row now remembers the token. Zero
//! rows: a newer holder already wrote (or the row does not exist) — stop, do not
//! retry with the same token. The check and the write are one statement, so no
//! other writer can slip in between; a separate `SELECT` followed by an `UPDATE` would
//! reopen exactly the race the token closes. The column is per resource (per order,
//! per account, per file) and the lock name should name the same resource
//! (`orders/42` protects the row of order 42): a token of one lock means nothing to
//! a row guarded by another.
//!
//! Bind the token with [`FencingToken::to_sql_bigint`]: SQL has no unsigned 64-bit
//! type, and the conversion refuses (rather than wraps) a token above `i64::MAX`.
//!
//! **A header for services that keep the column themselves.** Send the token with the
//! request as [`FencingToken::HEADER_NAME`] (`Leasehold-Fencing-Token`); the service
//! parses it with [`FencingToken::from_header_value`] and applies the same rule to its
//! own storage.
//!
//! An object store with conditional writes (S3) can keep one too: the `s3` adapter
//! (feature `fence-s3`) keeps the token in the object and puts on its ETag.
//!
//! **Storage that cannot keep a column** (a legacy API) can ask the cluster with
//! [`Client::check_fence`](crate::Client::check_fence) (or
//! `leasehold fence check NAME TOKEN`) whether the token is still the current grant.
//! This is weaker: the answer can be stale by the time the write lands, so a check
//! immediately before the write narrows the window but does not close it. Prefer a
//! column wherever the storage can hold one.
//!
//! ```no_run
//! # async fn example(guard: leasehold::LockGuard, client: leasehold::Client) -> Result<(), Box<dyn std::error::Error>> {
//! let token = guard.fencing_token();
//! let bigint: i64 = token.to_sql_bigint()?;          // bind as $2 in the UPDATE above
//! let header = (leasehold::FencingToken::HEADER_NAME, token.header_value());
//! let current = client.check_fence(guard.name(), token.get()).await?.current;
//! # let _ = (bigint, header, current);
//! # Ok(())
//! # }
//! ```
//!
//! # Fenced writes in one call
//!
//! The submodules do the store's side for you, each with the store's own atomic check
//! (`docs/fenced-writes.md` in the repository gives the layout per store, what each
//! guarantees and what it costs). Each is behind a cargo feature:
//!
//! | feature | module | store |
//! |---|---|---|
//! | `fence-postgres` | `postgres` | PostgreSQL (tokio-postgres) |
//! | `fence-sqlite` | `sqlite` | SQLite (rusqlite, bundled) |
//! | `fence-mysql` | `mysql` | MySQL and MariaDB (mysql_async) |
//! | `fence-redis` | `redis` | Redis (a Lua script) |
//! | `fence-etcd` | `etcd` | etcd v3 (one transaction, over tonic) |
//! | `fence-http` | `http` | HTTP services: a tower layer for servers, a client |
//!
//! All of them implement [`FencedStore`]: [`write`](FencedStore::write) a value for
//! a resource under a token, [`advance`](FencedStore::advance) the fence alone, or
//! [`read`](FencedStore::read) what is there. A refused write is an
//! [`Outcome::Superseded`], not an error. Two [`Mode`]s: once per grant (a strictly
//! newer token is needed) and many per grant (the same grant may write again).
//!
//! What the lock alone guarantees: at most one session holds a grant at a time, in
//! the cluster's view, and grants are ordered by their tokens. What only the fence
//! guarantees: that a write from a holder whose grant was superseded is refused by
//! the storage, whatever pauses, partitions or crashes came between.

use std::fmt;
use std::future::Future;
use std::str::FromStr;

/// The longest resource name, in bytes (a primary key in every SQL store).
pub const MAX_RESOURCE_BYTES: usize = 512;

/// The largest token a fenced store accepts: every store compares tokens as signed
/// 64-bit integers or as 20-digit strings, so 2^63 - 1 is the common limit.
pub const MAX_STORED_TOKEN: u64 = i64::MAX as u64;

/// When a write with a token equal to the stored one may land.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// The write needs a token strictly newer than every token that wrote the
    /// resource before (`stored < ours`): one write per grant. A retry with the same
    /// token is refused, and [`Outcome::is_ours`] says that the first attempt landed.
    OncePerGrant,
    /// An equal token may write again (`stored <= ours`): a holder updates the
    /// resource as often as it likes until the next grant's first write.
    ManyPerGrant,
}

impl Mode {
    /// `once` or `many`: the value of the `Leasehold-Fence-Mode` header.
    pub const fn as_str(self) -> &'static str {
        match self {
            Mode::OncePerGrant => "once",
            Mode::ManyPerGrant => "many",
        }
    }

    /// Whether a write with token `ours` may land over a stored `stored`.
    pub const fn admits(self, stored: u64, ours: u64) -> bool {
        match self {
            Mode::OncePerGrant => stored < ours,
            Mode::ManyPerGrant => stored <= ours,
        }
    }
}

impl FromStr for Mode {
    type Err = FenceError;

    fn from_str(text: &str) -> Result<Self, FenceError> {
        match text.trim() {
            "once" => Ok(Mode::OncePerGrant),
            "many" => Ok(Mode::ManyPerGrant),
            other => Err(FenceError::Invalid(format!("{other:?} is not a fence mode (once or many)"))),
        }
    }
}

/// What the store did with a fenced write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a superseded write did not land: the caller must stop"]
pub enum Outcome {
    /// The write landed; the store now holds our token for the resource.
    Accepted,
    /// The store refused the write and changed nothing: it holds `seen` (at least as
    /// new as the token that refused us), we sent `ours`.
    Superseded { seen: FencingToken, ours: FencingToken },
}

impl Outcome {
    pub const fn is_accepted(&self) -> bool {
        matches!(self, Outcome::Accepted)
    }

    /// A refusal by our own token: a retry (in [`Mode::OncePerGrant`]) of a write
    /// whose answer was lost and which did land. No other grant has our token.
    pub fn is_ours(&self) -> bool {
        matches!(self, Outcome::Superseded { seen, ours } if seen == ours)
    }
}

/// What a fenced store holds for a resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The newest token that wrote or advanced the resource.
    pub token: FencingToken,
    /// The value last written; `None` when the fence was only advanced.
    pub value: Option<Vec<u8>>,
}

/// A fenced write that did not get an answer: bad input (nothing was sent) or a
/// store that failed. A refused write is not an error ([`Outcome::Superseded`]).
#[derive(Debug, thiserror::Error)]
pub enum FenceError {
    /// A resource name, token, mode or table name the store cannot take; the store
    /// was not touched.
    #[error("{0}")]
    Invalid(String),
    /// The store failed or could not be reached; the write may or may not have
    /// landed, so retry it with the same token and value.
    #[error("{store}: {source}")]
    Store {
        store: &'static str,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl FenceError {
    /// Wraps a store's own error.
    pub fn store(store: &'static str, source: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        FenceError::Store { store, source: source.into() }
    }
}

/// A store that keeps the newest token per resource and refuses older writes in the
/// same atomic step as the write. Every adapter in this module implements it, with
/// the same layout from Rust and Python.
pub trait FencedStore: Send + Sync {
    /// Writes `value` for `resource` if `token` is admitted by `mode`.
    fn write(
        &self,
        resource: &str,
        token: FencingToken,
        mode: Mode,
        value: &[u8],
    ) -> impl Future<Output = Result<Outcome, FenceError>> + Send;

    /// Moves the fence to `token` if `mode` admits it, leaving the value alone.
    fn advance(
        &self,
        resource: &str,
        token: FencingToken,
        mode: Mode,
    ) -> impl Future<Output = Result<Outcome, FenceError>> + Send;

    /// The token and value stored for `resource`, if any was ever written.
    fn read(&self, resource: &str) -> impl Future<Output = Result<Option<Record>, FenceError>> + Send;
}

/// Checks a resource name and a token before a store is touched, and returns the
/// token as the signed 64-bit integer every store compares.
pub fn check_write(resource: &str, token: FencingToken) -> Result<i64, FenceError> {
    check_resource(resource)?;
    if token.get() == 0 || token.get() > MAX_STORED_TOKEN {
        return Err(FenceError::Invalid(format!(
            "fencing token {token} is out of range for a fenced store (1 ..= {MAX_STORED_TOKEN})"
        )));
    }
    Ok(token.get() as i64)
}

/// A resource name: 1 to [`MAX_RESOURCE_BYTES`] bytes, without NUL (which
/// PostgreSQL's `TEXT` cannot hold).
pub fn check_resource(resource: &str) -> Result<(), FenceError> {
    if resource.contains('\0') {
        return Err(FenceError::Invalid("a fenced resource name may not contain NUL".to_string()));
    }
    if resource.is_empty() || resource.len() > MAX_RESOURCE_BYTES {
        return Err(FenceError::Invalid(format!(
            "a fenced resource name must be 1 to {MAX_RESOURCE_BYTES} bytes, not {}",
            resource.len()
        )));
    }
    Ok(())
}

/// A token as 20 zero-padded decimal digits: byte order is number order, for stores
/// that compare strings (Redis' Lua, etcd).
pub fn padded(token: u64) -> String {
    format!("{token:020}")
}

/// Reads a token stored by [`padded`] (or any decimal form).
pub fn parse_stored(store: &'static str, text: &[u8]) -> Result<FencingToken, FenceError> {
    std::str::from_utf8(text).ok().and_then(|text| text.trim().parse::<u64>().ok()).map(FencingToken::new).ok_or_else(
        || FenceError::store(store, format!("the stored token {:?} is not a number", String::from_utf8_lossy(text))),
    )
}

/// A table name an adapter will put into its statements: letters, digits and `_`,
/// optionally schema-qualified with one `.`, not starting with a digit.
pub fn check_table(table: &str) -> Result<(), FenceError> {
    let valid_part = |part: &str| {
        !part.is_empty()
            && part.len() <= 63
            && !part.as_bytes()[0].is_ascii_digit()
            && part.bytes().all(|byte| byte.is_ascii_alphanumeric() || byte == b'_')
    };
    let mut parts = table.split('.');
    let ok = match (parts.next(), parts.next(), parts.next()) {
        (Some(name), None, None) => valid_part(name),
        (Some(schema), Some(name), None) => valid_part(schema) && valid_part(name),
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(FenceError::Invalid(format!("{table:?} is not a table name (letters, digits, _; schema.table)")))
    }
}

#[cfg(feature = "fence-etcd")]
pub mod etcd;
#[cfg(feature = "fence-http")]
pub mod http;
#[cfg(feature = "fence-mysql")]
pub mod mysql;
#[cfg(feature = "fence-postgres")]
pub mod postgres;
#[cfg(feature = "fence-redis")]
pub mod redis;
#[cfg(feature = "fence-s3")]
pub mod s3;
#[cfg(feature = "fence-sqlite")]
pub mod sqlite;
#[cfg(any(feature = "fence-http", feature = "fence-s3"))]
mod wire;

/// A fencing token: the Raft log index of the entry that granted a lock. Tokens of
/// one lock strictly increase and are never reused; a grant's token is at least 1,
/// so a fence column that starts at 0 accepts the first holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(u64);

/// Why a value is not a fencing token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FencingTokenError {
    /// SQL's BIGINT is signed: tokens above `i64::MAX` do not fit, and negative
    /// bigints are not tokens.
    #[error("fencing token {0} does not fit in an SQL BIGINT (0 ..= {max})", max = i64::MAX)]
    OutOfSqlRange(i128),
    /// A header or environment value that is not a decimal unsigned integer.
    #[error("{0:?} is not a fencing token (a decimal unsigned integer)")]
    NotANumber(String),
}

impl FencingToken {
    /// The HTTP header that carries a token to a service that fences its writes.
    pub const HEADER_NAME: &'static str = "Leasehold-Fencing-Token";

    pub const fn new(value: u64) -> Self {
        FencingToken(value)
    }

    pub const fn get(self) -> u64 {
        self.0
    }

    /// The token as an SQL BIGINT, for `… AND fence_token < $token`. Refuses a token
    /// that does not fit instead of wrapping it into a negative number (which every
    /// stored token would compare greater than).
    pub fn to_sql_bigint(self) -> Result<i64, FencingTokenError> {
        i64::try_from(self.0).map_err(|_| FencingTokenError::OutOfSqlRange(i128::from(self.0)))
    }

    /// A token read back from an SQL BIGINT column.
    pub fn from_sql_bigint(value: i64) -> Result<Self, FencingTokenError> {
        u64::try_from(value).map(FencingToken).map_err(|_| FencingTokenError::OutOfSqlRange(i128::from(value)))
    }

    /// The value of the [`HEADER_NAME`](Self::HEADER_NAME) header: the token in
    /// decimal (ASCII digits only, so always a valid header value).
    pub fn header_value(self) -> String {
        self.0.to_string()
    }

    /// Parses a header value (surrounding whitespace allowed, as HTTP allows it).
    pub fn from_header_value(value: &str) -> Result<Self, FencingTokenError> {
        value.trim().parse()
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "{}", self.0)
    }
}

impl FromStr for FencingToken {
    type Err = FencingTokenError;

    /// Decimal digits only: no sign, no spaces (`from_header_value` trims).
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if text.is_empty() || !text.bytes().all(|byte| byte.is_ascii_digit()) {
            return Err(FencingTokenError::NotANumber(text.to_string()));
        }
        text.parse::<u64>().map(FencingToken).map_err(|_| FencingTokenError::NotANumber(text.to_string()))
    }
}

impl From<u64> for FencingToken {
    fn from(value: u64) -> Self {
        FencingToken(value)
    }
}

impl From<FencingToken> for u64 {
    fn from(token: FencingToken) -> u64 {
        token.0
    }
}

impl TryFrom<FencingToken> for i64 {
    type Error = FencingTokenError;

    fn try_from(token: FencingToken) -> Result<i64, FencingTokenError> {
        token.to_sql_bigint()
    }
}

impl TryFrom<i64> for FencingToken {
    type Error = FencingTokenError;

    fn try_from(value: i64) -> Result<Self, FencingTokenError> {
        FencingToken::from_sql_bigint(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn converts_to_and_from_an_sql_bigint_without_wrapping() {
        assert_eq!(FencingToken::new(42).to_sql_bigint(), Ok(42));
        assert_eq!(FencingToken::new(i64::MAX as u64).to_sql_bigint(), Ok(i64::MAX));
        assert_eq!(
            FencingToken::new(i64::MAX as u64 + 1).to_sql_bigint(),
            Err(FencingTokenError::OutOfSqlRange(i64::MAX as i128 + 1))
        );
        assert_eq!(FencingToken::from_sql_bigint(7), Ok(FencingToken::new(7)));
        assert_eq!(FencingToken::from_sql_bigint(-1), Err(FencingTokenError::OutOfSqlRange(-1)));
    }

    #[test]
    fn round_trips_through_a_header_value() {
        let token = FencingToken::new(123_456);
        assert_eq!(token.header_value(), "123456");
        assert_eq!(FencingToken::from_header_value(" 123456 "), Ok(token));
        for bad in ["", "-1", "+1", "1 2", "0x10", "18446744073709551616"] {
            assert!(FencingToken::from_header_value(bad).is_err(), "{bad:?} must be refused");
        }
    }

    #[test]
    fn orders_like_the_grants_it_comes_from() {
        assert!(FencingToken::new(9) < FencingToken::new(10));
        assert_eq!(u64::from(FencingToken::from(5)), 5);
    }

    #[test]
    fn the_modes_differ_only_for_an_equal_token() {
        for mode in [Mode::OncePerGrant, Mode::ManyPerGrant] {
            assert!(mode.admits(0, 1) && mode.admits(4, 5), "{mode:?}: a newer token lands");
            assert!(!mode.admits(6, 5), "{mode:?}: an older token is refused");
            assert_eq!(mode.as_str().parse::<Mode>().unwrap(), mode);
        }
        assert!(!Mode::OncePerGrant.admits(5, 5));
        assert!(Mode::ManyPerGrant.admits(5, 5));
        assert!("sometimes".parse::<Mode>().is_err());
    }

    #[test]
    fn a_write_is_checked_before_a_store_is_touched() {
        assert_eq!(check_write("orders/42", FencingToken::new(7)).unwrap(), 7);
        assert_eq!(check_write("r", FencingToken::new(MAX_STORED_TOKEN)).unwrap(), i64::MAX);
        for bad_token in [0, MAX_STORED_TOKEN + 1, u64::MAX] {
            assert!(matches!(check_write("r", FencingToken::new(bad_token)), Err(FenceError::Invalid(_))));
        }
        let longest = "r".repeat(MAX_RESOURCE_BYTES);
        assert!(check_write(&longest, FencingToken::new(1)).is_ok());
        for bad_name in [String::new(), "r".repeat(MAX_RESOURCE_BYTES + 1), "orders\0/42".to_string()] {
            assert!(matches!(check_write(&bad_name, FencingToken::new(1)), Err(FenceError::Invalid(_))));
        }
    }

    #[test]
    fn padded_tokens_sort_as_numbers() {
        let tokens = [1u64, 9, 10, 1 << 53, (1 << 53) + 1, MAX_STORED_TOKEN - 1, MAX_STORED_TOKEN];
        for pair in tokens.windows(2) {
            assert!(padded(pair[0]) < padded(pair[1]), "{pair:?}");
        }
        assert_eq!(padded(MAX_STORED_TOKEN).len(), 20);
        assert_eq!(parse_stored("test", padded(42).as_bytes()).unwrap(), FencingToken::new(42));
        assert!(parse_stored("test", b"forty-two").is_err());
    }

    #[test]
    fn only_identifiers_become_table_names() {
        for good in ["leasehold_fence", "app.fence_2", "_private"] {
            assert!(check_table(good).is_ok(), "{good}");
        }
        for bad in ["", "1fence", "fence; DROP TABLE payments", "a.b.c", "fence-table", "\"quoted\""] {
            assert!(check_table(bad).is_err(), "{bad}");
        }
    }
}
