"""Lock guards and the fencing token they carry."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Type, TypeVar

from leasehold._proto import leasehold_pb2 as pb
from leasehold.errors import LeaseholdError
from leasehold.fence import FencingToken

if TYPE_CHECKING:
    from types import TracebackType

    from leasehold.session import Session

_log = logging.getLogger("leasehold")


@dataclass(frozen=True)
class NotAcquired:
    """Who held the lock when an acquire gave up."""

    #: 0 when the lock was free by the time the answer was made.
    holder_session_id: int
    holder_client_name: str
    holder_token: int
    #: True when the request waited and the wait ran out; False for a busy try-lock.
    timed_out: bool
    #: Set when the lock is in the lock-delay of a holder whose session expired (the
    #: holder fields name that grant): about when the delay ends, by the leader's wall
    #: clock, in milliseconds since the Unix epoch.
    delay_until_unix_ms: Optional[int] = None

    @classmethod
    def from_pb(cls, message: pb.NotAcquired) -> "NotAcquired":
        return cls(
            holder_session_id=message.holder_session_id,
            holder_client_name=message.holder_client_name,
            holder_token=message.holder_token,
            timed_out=message.timed_out,
            delay_until_unix_ms=message.delay_until_unix_ms or None,
        )

    def __str__(self) -> str:
        held = (
            f"held by session {self.holder_session_id} ({self.holder_client_name}) with token {self.holder_token}"
            if self.holder_session_id
            else "free when the answer was made"
        )
        return f"{held}{', the wait ran out' if self.timed_out else ''}"


def release_request(session: "Session", name: str, token: int) -> pb.ReleaseRequest:
    return pb.ReleaseRequest(
        request_id=session.client._next_request_id(),
        session_id=session.id,
        name=name,
        token=token,
        session_secret=session.secret,
    )


class Grant:
    """What a lock guard and a permit guard share: a fencing token granted to a
    session under a name, given back by `release()` and when a `with` block ends."""

    #: What the grant is, for the log line of a failed release.
    _kind = "grant"

    def __init__(self, session: "Session", name: str, token: int) -> None:
        self._session = session
        self._name = name
        self._token = token
        self._released = False

    @property
    def token(self) -> int:
        """The fencing token: the Raft log index of the entry that granted it."""
        return self._token

    @property
    def fencing_token(self) -> FencingToken:
        """The token as a `FencingToken` (SQL BIGINT and header conversions)."""
        return FencingToken(self._token)

    @property
    def name(self) -> str:
        return self._name

    @property
    def session(self) -> "Session":
        return self._session

    def is_valid(self) -> bool:
        """True while the grant is not released and its session is alive. Check it
        before an action the fence cannot guard; it is False from the moment the
        session goes into jeopardy (half a TTL before the conservative deadline)."""
        return not self._released and self._session.is_valid()

    def release(self) -> None:
        raise NotImplementedError

    def __enter__(self: "_Self") -> "_Self":
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        traceback: Optional["TracebackType"],
    ) -> None:
        release_on_exit(self.release, exc, f"{self._kind} {self._name!r}")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self._name!r}, token={self._token}, session={self._session.id})"


_Self = TypeVar("_Self", bound=Grant)


class LockGuard(Grant):
    """A held lock. Its `token` is the fencing token: pass it to the storage you write
    to, which must refuse writes with a token lower than one it has seen
    (`UPDATE … WHERE fence_token < %s`). Holding the guard does NOT prove the lock is
    still yours: a paused process can outlive its lease. `is_valid()` turns False when
    the session goes into jeopardy, before the server could hand the lock on.

    A context manager: leaving the block releases the lock (compare-and-release on
    the token). A guard that is neither released nor used in a `with` block keeps the
    lock until its session ends.
    """

    _kind = "lock"

    @property
    def deadline(self) -> float:
        """The session's conservative deadline (`time.monotonic()` seconds); past it,
        assume the lock is someone else's."""
        return self._session.deadline

    def release(self) -> None:
        """Releases the lock. An error says it was no longer this grant's (the session
        expired and the lock passed on: `Refused`, or `NotFound` for the session)."""
        if self._released:
            return
        self._released = True
        session = self._session
        client = session.client
        request = release_request(session, self._name, self._token)
        client._with_leader(
            "release",
            client.request_deadline,
            lambda node, timeout: node.leasehold.Release(request, timeout=timeout, metadata=client.metadata),
        )

    def detach(self) -> int:
        """Gives up the guard but keeps the lock (held until released by token or the
        session ends); returns the token."""
        self._released = True
        return self._token


def release_on_exit(release: "object", exc: Optional[BaseException], what: str) -> None:
    """Gives a grant back when its `with` block ends. If the block raised, that error
    is what the caller sees (a failed release is logged); otherwise a failed release
    raises, because it says the grant ended before the block did."""
    try:
        release()  # type: ignore[operator]
    except LeaseholdError:
        if exc is None:
            raise
        _log.warning("releasing %s after an error failed", what, exc_info=True)
