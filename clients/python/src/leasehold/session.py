"""A session: the client's lease, kept alive in the background, and the locks,
semaphores and elections taken under it.

A lease is not mutual exclusion. A process can pause (GC, swap, SIGSTOP) past its
lease and wake up still believing it holds a lock. The session's `deadline` is
conservative — counted from when the last answered keepalive was *sent* — and the
jeopardy signal (`jeopardy`, `on_jeopardy`, `is_valid()`) comes while there is still
time to stop work, before the server could expire the session; but only the fencing
token checked by the storage makes a late write harmless.
"""

from __future__ import annotations

import threading
import time
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Generic, Optional, TypeVar, Union

from leasehold._proto import leasehold_pb2 as pb
from leasehold.client import ATTEMPT_TIMEOUT_MS, RETRY_PAUSE_MS, Node
from leasehold.errors import InvalidArgument, LockNotAcquired, NotElected, NotFound, OtherError, SessionLost
from leasehold import keepalive
from leasehold.lease import JeopardyListener, Lease, SessionState, counted_on_s
from leasehold.lock import LockGuard, NotAcquired

if TYPE_CHECKING:
    from leasehold.client import Client
    from leasehold.election import Leadership
    from leasehold.semaphore import Semaphore

Detail = TypeVar("Detail")

#: How long one blocking wait of `lock()`, `Semaphore.acquire()` and `campaign()`
#: without a `wait` lasts before it is sent again (the server bounds every wait).
WAIT_ROUND_MS = 60_000


def _milliseconds(seconds: float, what: str) -> int:
    if seconds < 0:
        raise InvalidArgument(f"{what} must not be negative, got {seconds}")
    return int(round(seconds * 1_000))


@dataclass(frozen=True)
class _Answer(Generic[Detail]):
    """One answer of a request that may wait: granted with a token, or not (yet)."""

    token: Optional[int]
    timed_out: bool = False
    detail: Optional[Detail] = None


#: One attempt of a waiting request: (node, request id, wait_ms, timeout) -> answer.
_Attempt = Callable[[Node, pb.RequestId, int, float], _Answer]


class Session:
    """A session of a `Client` (`client.session(ttl)`). Keepalives run on the client's
    keepalive thread until `close()`; use it as a context manager to close it.

    Thread-safe: locks of one session may be taken from several threads.
    """

    def __init__(self, client: "Client", session_id: int, secret: bytes, ttl_ms: int, lease: Lease) -> None:
        self._client = client
        self._id = session_id
        self._secret = secret
        self._ttl_ms = ttl_ms
        self._lease = lease
        self._closed = False
        # A session that is garbage collected without a close stops being kept alive;
        # it then expires after its TTL, releasing what it held.
        self._finalizer = weakref.finalize(self, keepalive.deregister, client, session_id)

    @classmethod
    def _create(cls, client: "Client", ttl: float) -> "Session":
        request = pb.CreateSessionRequest(
            request_id=client._next_request_id(),
            ttl_ms=_milliseconds(ttl, "ttl"),
            client_name=client.client_name,
        )
        sent_at = time.monotonic()
        created = client._with_leader(
            "create session",
            client.request_deadline,
            lambda node, timeout: node.leasehold.CreateSession(request, timeout=timeout, metadata=client.metadata),
        )
        lease = Lease(created.ttl_ms, sent_at + counted_on_s(created.ttl_ms, created.ttl_ms))
        keepalive.register(client, created.session_id, created.session_secret, created.ttl_ms, lease)
        return cls(client, created.session_id, created.session_secret, created.ttl_ms, lease)

    # ------------------------------------------------------------------ the lease

    @property
    def id(self) -> int:
        """The session id: the log index of the entry that created it."""
        return self._id

    @property
    def secret(self) -> bytes:
        """The secret every request on the session presents (the library does so
        itself; this is for calling the generated stubs directly). Keep it to this
        process: with the id, it acts for the session."""
        return self._secret

    @property
    def ttl(self) -> float:
        """The TTL the server granted, in seconds."""
        return self._ttl_ms / 1_000

    @property
    def client(self) -> "Client":
        return self._client

    @property
    def deadline(self) -> float:
        """The conservative deadline, in `time.monotonic()` seconds: the send time of
        the last answered keepalive plus the TTL, less the clock-drift allowance and
        margin. Past it, assume the locks are held by someone else."""
        return self._lease.deadline

    def time_left(self) -> float:
        """Seconds until the deadline (negative once it passed)."""
        return self._lease.deadline - time.monotonic()

    @property
    def state(self) -> SessionState:
        """ALIVE, JEOPARDY (less than half a TTL left: stop work that needs the locks)
        or LOST (final), as of now."""
        return self._lease.state(time.monotonic())

    def is_valid(self) -> bool:
        """True while the session is ALIVE. It turns False when the session goes into
        jeopardy, half a TTL before the conservative deadline, and so before the server
        could expire the session; it may turn True again if a keepalive is answered in
        time, and stays False once the session is lost."""
        return self.state is SessionState.ALIVE

    @property
    def jeopardy(self) -> threading.Event:
        """Set while the session is in jeopardy or lost (cleared if it recovers)."""
        return self._lease.jeopardy

    @property
    def lost(self) -> threading.Event:
        """Set once the session is lost."""
        return self._lease.lost

    def on_jeopardy(self, listener: JeopardyListener) -> None:
        """Calls `listener(state)` from the keepalive thread each time the session goes
        into JEOPARDY or LOST (at once if it is in one now). Keep it short: stop the
        work, set a flag; do not make requests from it."""
        self._lease.add_listener(listener)

    def remove_jeopardy_listener(self, listener: JeopardyListener) -> None:
        """Stops calling a listener given to `on_jeopardy`."""
        self._lease.remove_listener(listener)

    def wait_jeopardy(self, timeout: Optional[float] = None) -> bool:
        """Blocks until the session is in jeopardy or lost; False if `timeout` seconds
        passed first."""
        return self._lease.jeopardy.wait(timeout)

    # ------------------------------------------------------------------ closing

    def close(self) -> None:
        """Closes the session: every lock, permit and leadership it holds is released
        in one committed entry. A retried close whose first attempt took effect
        finds the session gone, which is success."""
        if self._closed:
            return
        self._closed = True
        self._finalizer.detach()
        keepalive.deregister(self._client, self._id)
        self._lease.end()
        client = self._client
        request = pb.CloseSessionRequest(
            request_id=client._next_request_id(), session_id=self._id, session_secret=self._secret
        )
        try:
            client._with_leader(
                "close session",
                client.request_deadline,
                lambda node, timeout: node.leasehold.CloseSession(request, timeout=timeout, metadata=client.metadata),
            )
        except NotFound:
            pass

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Session(id={self._id}, ttl={self.ttl}, state={self.state.value})"

    # ------------------------------------------------------------------ waiting requests

    def _wait_request(self, what: str, wait: float, attempt: _Attempt) -> _Answer:
        """Sends a request that may wait on the server (acquire, semaphore acquire,
        campaign) until it is granted or `wait` seconds run out. Each attempt tells the
        server the time that is left; a lost answer is retried with the same request
        id; a wait the server ended early (timed out with time left: it lost the
        waiting RPC) is sent again as a new request for the time that is left. A wait
        whose session ended raises `SessionLost`."""
        client = self._client
        wait_ms = _milliseconds(wait, "wait")
        give_up = time.monotonic() + wait_ms / 1_000
        while True:
            request_id = client._next_request_id()

            def call(node: Node, timeout: float, request_id: pb.RequestId = request_id) -> _Answer:
                # A retry carries the same request id, so it must be the same command:
                # a waiting request stays a waiting one (at least 1 ms) even when its
                # time has nearly run out.
                left_ms = int(max(give_up - time.monotonic(), 0.0) * 1_000)
                return attempt(node, request_id, 0 if wait_ms == 0 else max(left_ms, 1), timeout)

            answer = client._with_leader(
                what,
                wait_ms / 1_000 + client.request_deadline,
                call,
                attempt_timeout=(wait_ms + ATTEMPT_TIMEOUT_MS) / 1_000,
                session_id=self._id,
            )
            if answer.token is not None:
                return answer
            left = give_up - time.monotonic()
            if answer.timed_out and left > RETRY_PAUSE_MS / 1_000:
                continue
            return answer

    # ------------------------------------------------------------------ locks

    def acquire(
        self, name: str, wait: float = 0.0, lock_delay: Optional[float] = None
    ) -> Union[LockGuard, NotAcquired]:
        """Acquires lock `name`, waiting in its FIFO queue for at most `wait` seconds
        (0: answer at once). Returns the guard, or who held the lock. A lock this
        session already holds is answered with its existing grant; a retry after a
        lost answer returns the same grant, never a second one.

        `lock_delay` (seconds): if this session expires while it holds the lock (not on
        a release or close), nobody gets the lock for that long after the expiry — for
        side effects no fencing token can guard. None takes the cluster's default for
        the name, 0 asks for none; at most 60 s.
        """
        delay_ms = None if lock_delay is None else _milliseconds(lock_delay, "lock_delay")

        def attempt(node: Node, request_id: pb.RequestId, wait_ms: int, timeout: float) -> _Answer:
            request = pb.AcquireRequest(
                request_id=request_id,
                session_id=self._id,
                name=name,
                wait_ms=wait_ms,
                session_secret=self._secret,
            )
            if delay_ms is not None:
                request.lock_delay_ms = delay_ms
            response = node.leasehold.Acquire(request, timeout=timeout, metadata=self._client.metadata)
            outcome = response.WhichOneof("outcome")
            if outcome == "granted":
                return _Answer(token=response.granted.token)
            if outcome == "not_acquired":
                busy = response.not_acquired
                return _Answer(token=None, timed_out=busy.timed_out, detail=NotAcquired.from_pb(busy))
            raise OtherError("acquire answered with no outcome")

        answer = self._wait_request("acquire", wait, attempt)
        if answer.token is not None:
            return LockGuard(self, name, answer.token)
        assert isinstance(answer.detail, NotAcquired)
        return answer.detail

    def try_lock(self, name: str, lock_delay: Optional[float] = None) -> Optional[LockGuard]:
        """The guard if lock `name` was free (or already held by this session), else None."""
        outcome = self.acquire(name, 0.0, lock_delay)
        return outcome if isinstance(outcome, LockGuard) else None

    def lock(self, name: str, wait: Optional[float] = None, lock_delay: Optional[float] = None) -> LockGuard:
        """Waits in lock `name`'s FIFO queue until granted, for at most `wait` seconds
        (None: until granted or the session is lost). Raises `LockNotAcquired` when the
        wait runs out and `SessionLost` when the session ended. The guard is a context
        manager that releases the lock::

            with session.lock("orders/42", wait=30) as guard:
                store.charge(42, fence_token=guard.token)
        """
        if wait is not None:
            outcome = self.acquire(name, wait, lock_delay)
            if isinstance(outcome, NotAcquired):
                raise LockNotAcquired(name, outcome)
            return outcome
        while True:
            outcome = self.acquire(name, WAIT_ROUND_MS / 1_000, lock_delay)
            if isinstance(outcome, LockGuard):
                return outcome
            if self.state is SessionState.LOST:
                raise SessionLost(self._id)

    # ------------------------------------------------------------------ semaphores and elections

    def semaphore(self, name: str, limit: int, lock_delay: Optional[float] = None) -> "Semaphore":
        """Semaphore `name` with at most `limit` holders, as seen from this session. The
        first acquirer sets the limit; acquiring with a different one is refused."""
        from leasehold.semaphore import Semaphore

        return Semaphore(self, name, limit, lock_delay)

    def campaign(self, name: str, value: str, wait: Optional[float] = None) -> "Leadership":
        """Campaigns to lead election `name`, announcing `value` (an address, say), and
        waits until this session leads — for at most `wait` seconds (None: until
        elected or the session is lost). Raises `NotElected` (naming the leader) when
        the wait runs out, `SessionLost` when the session ended."""
        from leasehold.election import Leader, Leadership

        def attempt(node: Node, request_id: pb.RequestId, wait_ms: int, timeout: float) -> _Answer:
            request = pb.CampaignRequest(
                request_id=request_id,
                session_id=self._id,
                name=name,
                value=value,
                wait_ms=wait_ms,
                session_secret=self._secret,
            )
            response = node.elections.Campaign(request, timeout=timeout, metadata=self._client.metadata)
            outcome = response.WhichOneof("outcome")
            if outcome == "elected":
                return _Answer(token=response.elected.token)
            if outcome == "not_elected":
                leader = response.not_elected
                detail = Leader.from_pb(leader) if leader.session_id != 0 else None
                return _Answer(token=None, timed_out=wait_ms > 0, detail=detail)
            raise OtherError("campaign answered with no outcome")

        round_s = WAIT_ROUND_MS / 1_000
        while True:
            answer = self._wait_request("campaign", round_s if wait is None else wait, attempt)
            if answer.token is not None:
                return Leadership(self, name, value, answer.token)
            if wait is not None:
                raise NotElected(name, answer.detail)
            if self.state is SessionState.LOST:
                raise SessionLost(self._id)
