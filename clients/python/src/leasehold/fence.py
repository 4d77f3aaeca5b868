"""The fencing token as a type, and how the storage a lock protects should use it.

A lease is not mutual exclusion. A holder can stall (GC, swap, SIGSTOP) past its TTL,
the lock passes to someone else, and the first holder wakes up still believing it
holds the lock. The lock service cannot stop that late write; only the storage that
receives it can, by comparing tokens. Every grant of a lock carries a larger token
than the grants before it (it is the Raft log index of the granting entry), so the
rule is: **keep the highest token you accepted per resource and refuse a write that
carries a lower one.**

A fence column per resource and a conditional update, in one statement::

    UPDATE payments SET status = 'charged', fence_token = %(token)s
     WHERE order_id = %(order)s AND fence_token < %(token)s

One row updated: the write is accepted and the row remembers the token. Zero rows: a
newer holder already wrote (or the row does not exist) — stop, do not retry with the
same token. A separate SELECT then UPDATE would reopen the race the token closes.
Bind the token with `FencingToken.to_sql_bigint()` (SQL has no unsigned 64-bit type;
the conversion refuses, rather than wraps, a token above 2**63 - 1).

A service that keeps the column itself gets the token in the `Leasehold-Fencing-Token`
header (`FencingToken.HEADER_NAME`, `header_value()`, `from_header_value()`).

Storage that cannot keep a column can ask the cluster with `Client.check_fence`
whether the token is still the current grant. That is weaker: the answer can be stale
by the time the write lands.
"""

from __future__ import annotations

from dataclasses import dataclass

#: The largest value of an SQL BIGINT.
SQL_BIGINT_MAX = 2**63 - 1
#: The largest fencing token (an unsigned 64-bit log index).
TOKEN_MAX = 2**64 - 1


class FencingTokenError(ValueError):
    """A value that is not a fencing token, or a token that does not fit SQL's BIGINT."""


@dataclass(frozen=True, order=True)
class FencingToken:
    """A fencing token: the Raft log index of the entry that granted a lock, permit or
    leadership. Tokens of one name strictly increase and are never reused; a grant's
    token is at least 1, so a fence column that starts at 0 accepts the first holder."""

    value: int

    #: The HTTP header that carries a token to a service that fences its writes.
    HEADER_NAME = "Leasehold-Fencing-Token"

    def __post_init__(self) -> None:
        if isinstance(self.value, bool) or not isinstance(self.value, int) or not 0 <= self.value <= TOKEN_MAX:
            raise FencingTokenError(f"{self.value!r} is not a fencing token (an integer 0 ..= {TOKEN_MAX})")

    def __int__(self) -> int:
        return self.value

    def __index__(self) -> int:
        return self.value

    def __str__(self) -> str:
        return str(self.value)

    def to_sql_bigint(self) -> int:
        """The token as an SQL BIGINT, for `… AND fence_token < %s`. Refuses a token
        that does not fit instead of wrapping it into a negative number (which every
        stored token would compare greater than)."""
        if self.value > SQL_BIGINT_MAX:
            raise FencingTokenError(
                f"fencing token {self.value} does not fit in an SQL BIGINT (0 ..= {SQL_BIGINT_MAX})"
            )
        return self.value

    @classmethod
    def from_sql_bigint(cls, value: int) -> "FencingToken":
        """A token read back from an SQL BIGINT column."""
        if value < 0 or value > SQL_BIGINT_MAX:
            raise FencingTokenError(f"fencing token {value} does not fit in an SQL BIGINT (0 ..= {SQL_BIGINT_MAX})")
        return cls(value)

    def header_value(self) -> str:
        """The value of the `HEADER_NAME` header: the token in decimal."""
        return str(self.value)

    @classmethod
    def parse(cls, text: str) -> "FencingToken":
        """Decimal digits only: no sign, no spaces."""
        if not text or not text.isascii() or not text.isdigit():
            raise FencingTokenError(f"{text!r} is not a fencing token (a decimal unsigned integer)")
        value = int(text)
        if value > TOKEN_MAX:
            raise FencingTokenError(f"{text!r} is not a fencing token (a decimal unsigned integer)")
        return cls(value)

    @classmethod
    def from_header_value(cls, value: str) -> "FencingToken":
        """Parses a header value (surrounding whitespace allowed, as HTTP allows it)."""
        return cls.parse(value.strip())


@dataclass(frozen=True)
class FenceCheck:
    """The answer of `Client.check_fence` (a linearizable read)."""

    #: True when the token is the lock's current grant.
    current: bool
    #: The current grant's token, 0 when the lock is free.
    current_token: int
