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
//! **Storage that cannot keep a column** (an object store, a legacy API) can ask the
//! cluster with [`Client::check_fence`](crate::Client::check_fence) (or
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
//! What the lock alone guarantees: at most one session holds a grant at a time, in
//! the cluster's view, and grants are ordered by their tokens. What only the fence
//! guarantees: that a write from a holder whose grant was superseded is refused by
//! the storage, whatever pauses, partitions or crashes came between.

use std::fmt;
use std::str::FromStr;

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
}
