"""Semaphores: at most K holders of a name at once, cluster-wide ("at most K jobs of
this tenant at once"). The limit is enforced by the replicated state, and a dead
worker's permit comes back when its session expires."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Union

from leasehold._proto import leasehold_pb2 as pb
from leasehold.client import Node
from leasehold.errors import OtherError, SemaphoreNotAcquired, SessionLost
from leasehold.lease import SessionState
from leasehold.lock import Grant
from leasehold.session import WAIT_ROUND_MS, _Answer, _milliseconds

if TYPE_CHECKING:
    from leasehold.session import Session


@dataclass(frozen=True)
class SemaphoreFull:
    """Why a permit was not granted: the permits held and the limit."""

    holders: int
    limit: int
    #: True when the request waited and the wait ran out.
    timed_out: bool

    def __str__(self) -> str:
        return f"{self.holders} of {self.limit} permits held{', the wait ran out' if self.timed_out else ''}"


class Semaphore:
    """Semaphore `name` with at most `limit` holders, as seen from one session
    (`session.semaphore(name, limit)`)."""

    def __init__(self, session: "Session", name: str, limit: int, lock_delay: Optional[float] = None) -> None:
        self._session = session
        self._name = name
        self._limit = limit
        # None: the cluster's default for the name.
        self._lock_delay_ms = None if lock_delay is None else _milliseconds(lock_delay, "lock_delay")

    @property
    def name(self) -> str:
        return self._name

    @property
    def limit(self) -> int:
        return self._limit

    def acquire_within(self, wait: float) -> Union["PermitGuard", SemaphoreFull]:
        """Waits at most `wait` seconds for a permit (0: answer at once). Returns the
        permit, or the holders and limit. A retry after a lost answer returns the same
        permit, never a second one."""
        session = self._session

        def attempt(node: Node, request_id: pb.RequestId, wait_ms: int, timeout: float) -> _Answer:
            request = pb.SemAcquireRequest(
                request_id=request_id,
                session_id=session.id,
                name=self._name,
                limit=self._limit,
                wait_ms=wait_ms,
                session_secret=session.secret,
            )
            if self._lock_delay_ms is not None:
                request.lock_delay_ms = self._lock_delay_ms
            response = node.semaphores.Acquire(request, timeout=timeout, metadata=session.client.metadata)
            outcome = response.WhichOneof("outcome")
            if outcome == "granted":
                return _Answer(token=response.granted.token)
            if outcome == "not_acquired":
                full = response.not_acquired
                detail = SemaphoreFull(holders=full.holders, limit=full.limit, timed_out=full.timed_out)
                return _Answer(token=None, timed_out=full.timed_out, detail=detail)
            raise OtherError("semaphore acquire answered with no outcome")

        answer = session._wait_request("semaphore acquire", wait, attempt)
        if answer.token is not None:
            return PermitGuard(session, self._name, answer.token)
        assert isinstance(answer.detail, SemaphoreFull)
        return answer.detail

    def try_acquire(self) -> Optional["PermitGuard"]:
        """A permit if one is free now, else None."""
        outcome = self.acquire_within(0.0)
        return outcome if isinstance(outcome, PermitGuard) else None

    def acquire(self, wait: Optional[float] = None) -> "PermitGuard":
        """Waits in the FIFO queue for a permit, for at most `wait` seconds (None: until
        granted or the session is lost). Raises `SemaphoreNotAcquired` when the wait
        runs out. The permit is a context manager that releases it."""
        if wait is not None:
            outcome = self.acquire_within(wait)
            if isinstance(outcome, SemaphoreFull):
                raise SemaphoreNotAcquired(self._name, outcome)
            return outcome
        while True:
            outcome = self.acquire_within(WAIT_ROUND_MS / 1_000)
            if isinstance(outcome, PermitGuard):
                return outcome
            if self._session.state is SessionState.LOST:
                raise SessionLost(self._session.id)

    def set_limit(self, limit: int) -> int:
        """Changes the limit and returns the previous one. Lowering it revokes nobody;
        it only holds back new grants. Raising it grants waiters."""
        session = self._session
        client = session.client
        request = pb.SemSetLimitRequest(
            request_id=client._next_request_id(),
            session_id=session.id,
            name=self._name,
            limit=limit,
            session_secret=session.secret,
        )
        response = client._with_leader(
            "semaphore set limit",
            client.request_deadline,
            lambda node, timeout: node.semaphores.SetLimit(request, timeout=timeout, metadata=client.metadata),
        )
        self._limit = limit
        return response.previous_limit


class PermitGuard(Grant):
    """A held permit; its token fences writes like a lock's. A context manager that
    releases the permit; otherwise it is held until `release()` or the session ends."""

    _kind = "semaphore"

    def release(self) -> None:
        """Gives the permit back (by its token)."""
        if self._released:
            return
        self._released = True
        session = self._session
        client = session.client
        request = pb.SemReleaseRequest(
            request_id=client._next_request_id(),
            session_id=session.id,
            name=self._name,
            token=self._token,
            session_secret=session.secret,
        )
        client._with_leader(
            "semaphore release",
            client.request_deadline,
            lambda node, timeout: node.semaphores.Release(request, timeout=timeout, metadata=client.metadata),
        )

