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

Fenced writes (docs/fenced-writes.md): one call per store that the store itself
refuses when a newer token already wrote the resource. The adapters share the
`FencedStore` protocol and the same layout as the Rust client's `leasehold::fence`;
each lives in a module of its own and imports its driver only there:

* `leasehold.fence.postgres.PostgresFence` (psycopg 3, extra `fence-postgres`),
* `leasehold.fence.sqlite.SqliteFence` (the standard library's sqlite3),
* `leasehold.fence.mysql.MysqlFence` (PyMySQL, extra `fence-mysql`),
* `leasehold.fence.redis.RedisFence` (redis-py, extra `fence-redis`),
* `leasehold.fence.etcd.EtcdFence` (etcd's JSON gateway, through urllib),
* `leasehold.fence.s3.S3Fence` (boto3, extra `fence-s3`): S3 and S3-compatible
  stores with conditional writes,
* `leasehold.fence.http`: the header layer for WSGI and ASGI services, the fenced
  key-value service built from it, and `HttpFence`, its client.

A write answers `Accepted` or `Superseded(seen, ours)`; store failures and bad input
raise `FenceError`, and a resource or token out of range is refused before the store
is touched.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import Optional, Protocol, Tuple, TypeVar, Union, runtime_checkable

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


#: The longest resource name, in bytes of UTF-8.
RESOURCE_MAX_BYTES = 512
#: The width of a token stored as text (Redis, etcd): 20 decimal digits, zero-padded,
#: so that comparing the strings byte by byte orders them like the numbers.
TOKEN_DIGITS = 20


class FenceError(Exception):
    """A fenced write that could not be made: the store failed or is unreachable, or
    the input (resource, token, mode, value, table name) is not acceptable. Never a
    refusal by the fence: that is a `Superseded` outcome."""


class FenceTokenError(FenceError, FencingTokenError):
    """A token outside 1 ..= 2**63 - 1 (or not an integer), refused before the store is
    touched. Both a `FenceError` and a `FencingTokenError`."""


class Mode(enum.Enum):
    """How a token compares with the token that last wrote the resource."""

    #: The write needs a token strictly newer than every earlier one (`<`): a grant
    #: writes once, and a retry with the same token is refused (`Superseded.is_ours`).
    ONCE_PER_GRANT = "once"
    #: An equal token may write again (`<=`): a holder updates the resource as often as
    #: it likes while it holds the grant; the next grant's first write shuts it out.
    MANY_PER_GRANT = "many"


@dataclass(frozen=True)
class Accepted:
    """The store took the write: the fence now holds our token."""


@dataclass(frozen=True)
class Superseded:
    """The store refused the write and changed nothing."""

    #: The token the store holds for the resource, at least as new as the one that
    #: refused us.
    seen: FencingToken
    #: The token we sent.
    ours: FencingToken

    @property
    def is_ours(self) -> bool:
        """True when the store holds our own token: no other grant has it, so an
        earlier attempt of this write landed (a retry after a lost answer, once per
        grant)."""
        return self.seen == self.ours


#: What a fenced write answers.
Outcome = Union[Accepted, Superseded]


@dataclass(frozen=True)
class Record:
    """What the store holds for a resource."""

    #: The newest token that wrote or advanced the resource.
    token: FencingToken
    #: The stored value; None when the resource was only advanced, never written.
    value: Optional[bytes]


@runtime_checkable
class FencedStore(Protocol):
    """A store that refuses, by its own atomic check, a write with a token older than
    the one that last wrote the resource (docs/fenced-writes.md). Every adapter of
    `leasehold.fence` implements it; its methods block."""

    def write(self, resource: str, token: Union[FencingToken, int], mode: Mode, value: bytes) -> Outcome:
        """Stores `value` and `token` for `resource` unless a newer token (or, once per
        grant, an equal one) wrote it before."""
        ...

    def advance(self, resource: str, token: Union[FencingToken, int], mode: Mode) -> Outcome:
        """Moves the fence to `token` like `write`, and leaves the stored value alone."""
        ...

    def read(self, resource: str) -> Optional[Record]:
        """The stored token and value, or None when the resource was never fenced."""
        ...


def validate_resource(resource: str) -> str:
    """`resource` itself when it is a str of 1 ..= 512 bytes of UTF-8 without NUL; else FenceError."""
    if not isinstance(resource, str):
        raise FenceError(f"a resource is a str, not {type(resource).__name__}")
    try:
        size = len(resource.encode("utf-8"))
    except UnicodeEncodeError as error:
        raise FenceError(f"resource {resource[:40]!r}… is not valid UTF-8 ({error.reason})") from None
    if not 1 <= size <= RESOURCE_MAX_BYTES:
        raise FenceError(f"a resource is 1 ..= {RESOURCE_MAX_BYTES} bytes of UTF-8, not {size}")
    if "\x00" in resource:
        raise FenceError("a resource name may not contain NUL (PostgreSQL's TEXT cannot hold it)")
    return resource


def validate_token(token: Union[FencingToken, int]) -> FencingToken:
    """The token as a `FencingToken` when it is 1 ..= 2**63 - 1 (a FencingToken or an
    int, not a bool); else `FenceTokenError`."""
    value = token.value if isinstance(token, FencingToken) else token
    if isinstance(value, bool) or not isinstance(value, int):
        raise FenceTokenError(f"{token!r} is not a fencing token (an integer 1 ..= {SQL_BIGINT_MAX})")
    if not 1 <= value <= SQL_BIGINT_MAX:
        raise FenceTokenError(f"fencing token {value} is out of range for a fenced write (1 ..= {SQL_BIGINT_MAX})")
    return token if isinstance(token, FencingToken) else FencingToken(value)


def validate_mode(mode: Union[Mode, str]) -> Mode:
    """`mode` as a `Mode` (its value, "once" or "many", is accepted too); else FenceError."""
    if isinstance(mode, Mode):
        return mode
    try:
        return Mode(mode)
    except ValueError:
        raise FenceError(f"{mode!r} is not a fence mode (Mode.ONCE_PER_GRANT or Mode.MANY_PER_GRANT)") from None


def validate_value(value: bytes) -> bytes:
    """`value` as bytes (bytes, bytearray or memoryview); else FenceError."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    raise FenceError(f"a value is bytes, not {type(value).__name__}")


class _Adapter:
    """What every adapter shares: `write` and `advance` check their input before the
    store is touched, then hand it to the adapter's `_fence` (`value` None: advance)."""

    def write(self, resource: str, token: Union[FencingToken, int], mode: Mode, value: bytes) -> Outcome:
        """Stores `value` with `token` unless the fence refuses it."""
        return self._fence(
            validate_resource(resource), validate_token(token), validate_mode(mode), validate_value(value)
        )

    def advance(self, resource: str, token: Union[FencingToken, int], mode: Mode) -> Outcome:
        """Moves the fence to `token` and leaves the value alone (a new resource has none)."""
        return self._fence(validate_resource(resource), validate_token(token), validate_mode(mode), None)

    def _fence(self, resource: str, token: FencingToken, mode: Mode, value: Optional[bytes]) -> Outcome:
        raise NotImplementedError

    def close(self) -> None:
        """Closes what the adapter opened itself (not a connection it was given)."""

    def __enter__(self: _SelfAdapter) -> _SelfAdapter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


_SelfAdapter = TypeVar("_SelfAdapter", bound=_Adapter)


_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")


def _table_parts(table: str) -> Tuple[str, ...]:
    """A table name, `table` or `schema.table`, as its parts; each a plain identifier
    (letters, digits, underscores; not starting with a digit; at most 63 characters).
    The adapters still quote them; FenceError for anything else."""
    parts = tuple(table.split(".")) if isinstance(table, str) else ()
    if not 1 <= len(parts) <= 2 or not all(_IDENTIFIER.fullmatch(part) for part in parts):
        raise FenceError(f"{table!r} is not a table name (an identifier, or schema.identifier)")
    return parts


def _padded(token: FencingToken) -> str:
    """A token as TOKEN_DIGITS zero-padded decimal digits (Redis, etcd)."""
    return str(token.value).zfill(TOKEN_DIGITS)


def _unpadded(text: Union[str, bytes], where: str) -> FencingToken:
    """A token stored as TOKEN_DIGITS decimal digits; FenceError for anything else."""
    if isinstance(text, bytes):
        text = text.decode("ascii", "replace")
    if len(text) != TOKEN_DIGITS or not text.isascii() or not text.isdigit():
        raise FenceError(f"{where} holds {text!r}, not a token of {TOKEN_DIGITS} decimal digits")
    return FencingToken(int(text))


__all__ = [
    "Accepted",
    "FenceCheck",
    "FenceError",
    "FenceTokenError",
    "FencedStore",
    "FencingToken",
    "FencingTokenError",
    "Mode",
    "Outcome",
    "RESOURCE_MAX_BYTES",
    "Record",
    "SQL_BIGINT_MAX",
    "Superseded",
    "TOKEN_DIGITS",
    "TOKEN_MAX",
    "validate_mode",
    "validate_resource",
    "validate_token",
    "validate_value",
]
