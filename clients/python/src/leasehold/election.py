"""Leader elections: one leader per name, with a value (its address, say) and a
fencing token; observers see every change in commit order, vacancies included."""

from __future__ import annotations

import collections
import logging
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Deque, Iterator, Optional

import grpc

from leasehold._proto import leasehold_pb2 as pb
from leasehold.client import RETRY_PAUSE_MS
from leasehold.lease import SessionState
from leasehold.lock import Grant

if TYPE_CHECKING:
    from leasehold.client import Client
    from leasehold.session import Session

_log = logging.getLogger("leasehold")

#: Observed states buffered before the observer must catch up.
OBSERVATIONS_QUEUED_MAX = 256


@dataclass(frozen=True)
class Leader:
    """The leader of an election as observed."""

    session_id: int
    client_name: str
    token: int
    value: str
    #: Leader wall-clock time of the grant, milliseconds since the Unix epoch (not
    #: part of what makes two observations the same state).
    since_unix_ms: int = field(default=0, compare=False)

    @classmethod
    def from_pb(cls, info: pb.LeaderInfo) -> "Leader":
        return cls(
            session_id=info.session_id,
            client_name=info.client_name,
            token=info.token,
            value=info.value,
            since_unix_ms=info.since_unix_ms,
        )


class _Unset:
    """Nothing delivered yet (distinct from a vacancy, None)."""


_UNSET = _Unset()


class Observation(Iterator[Optional[Leader]]):
    """An election's states, in commit order: `Leader`, or None when vacant. The first
    is the state when the observation opened. A background thread follows the leader
    and reconnects (then starts again from the current state, skipping a repeat of the
    last one delivered, so the latest state is never missed). At most
    `OBSERVATIONS_QUEUED_MAX` states wait for the reader; then the thread waits too.

    Iterate it, or call `get(timeout)`; `close()` it (or use `with`) when done.
    """

    def __init__(self, client: "Client", name: str) -> None:
        self._client = client
        self._name = name
        self._condition = threading.Condition()
        self._buffer: Deque[Optional[Leader]] = collections.deque()
        self._closed = False
        self._call: Optional[grpc.Call] = None
        self._thread = threading.Thread(target=self._run, name=f"leasehold-observe-{name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        client = self._client
        last: object = _UNSET
        request = pb.ObserveRequest(name=self._name)
        while not self._closed:
            endpoint = client._preferred_endpoint()
            try:
                call = client._node(endpoint).elections.Observe(request, metadata=client.metadata)
                with self._condition:
                    if self._closed:
                        call.cancel()
                        return
                    self._call = call
                for change in call:
                    state = Leader.from_pb(change.leader) if change.HasField("leader") else None
                    if last is _UNSET or last != state:
                        last = state
                        if not self._deliver(state):
                            return
            except grpc.RpcError as error:
                if self._closed:
                    return
                client._follow_hint(endpoint, error)
            except Exception:  # The client was closed under it, say.
                if not self._closed:
                    _log.exception("observing election %r failed", self._name)
                self.close()
                return
            with self._condition:
                self._call = None
                # Pause before reconnecting; a close ends the pause at once.
                self._condition.wait_for(lambda: self._closed, timeout=RETRY_PAUSE_MS / 1_000)

    def _deliver(self, state: Optional[Leader]) -> bool:
        """Queues `state` for the reader, waiting for room; False once closed."""
        with self._condition:
            self._condition.wait_for(lambda: self._closed or len(self._buffer) < OBSERVATIONS_QUEUED_MAX)
            if self._closed:
                return False
            self._buffer.append(state)
            self._condition.notify_all()
            return True

    def get(self, timeout: Optional[float] = None) -> Optional[Leader]:
        """The next state; raises TimeoutError after `timeout` seconds without one, and
        StopIteration once closed."""
        with self._condition:
            arrived = self._condition.wait_for(lambda: self._buffer or self._closed, timeout=timeout)
            if self._buffer:
                state = self._buffer.popleft()
                self._condition.notify_all()
                return state
            if self._closed:
                raise StopIteration
            assert not arrived
            raise TimeoutError(f"no change of election {self._name!r} within {timeout} s")

    def __iter__(self) -> "Observation":
        return self

    def __next__(self) -> Optional[Leader]:
        return self.get()

    def close(self) -> None:
        """Ends the observation; the server forgets it."""
        with self._condition:
            self._closed = True
            call, self._call = self._call, None
            self._buffer.clear()
            self._condition.notify_all()
        if call is not None:
            call.cancel()

    def __enter__(self) -> "Observation":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class Leadership(Grant):
    """Leadership won by `Session.campaign`, with the token, name, session and `with`
    block of every grant (`Grant`). `lost` is set when it ends: the session went into
    jeopardy or was lost, or an observer saw another leader or a vacancy — the time
    to stop acting as leader. Leaving the block resigns."""

    _kind = "leadership"

    def __init__(self, session: "Session", name: str, value: str, token: int) -> None:
        super().__init__(session, name, token)
        self._value = value
        #: Set when the leadership ended or is in doubt (see the class).
        self.lost = threading.Event()
        self._observation = session.client.observe(name)
        session.on_jeopardy(self._on_jeopardy)
        self._watcher = threading.Thread(target=self._watch, name=f"leasehold-leadership-{name}", daemon=True)
        self._watcher.start()

    def _on_jeopardy(self, state: SessionState) -> None:
        self.lost.set()
        if state is SessionState.LOST:
            self._observation.close()

    def _watch(self) -> None:
        try:
            for state in self._observation:
                if state is not None and state.token == self._token:
                    continue
                break
        finally:
            self.lost.set()
            self._observation.close()
            self._session.remove_jeopardy_listener(self._on_jeopardy)

    @property
    def value(self) -> str:
        """The value this leader last announced."""
        return self._value

    def is_valid(self) -> bool:
        """True while the leadership has not ended and the session is alive."""
        return not self.lost.is_set() and super().is_valid()

    def wait_lost(self, timeout: Optional[float] = None) -> bool:
        """Blocks until the leadership ended (see `lost`); False if `timeout` passed."""
        return self.lost.wait(timeout)

    def proclaim(self, value: str) -> None:
        """Announces a new value; only the current leader (this token) may."""
        session = self._session
        client = session.client
        request = pb.ProclaimRequest(
            request_id=client._next_request_id(),
            session_id=session.id,
            name=self._name,
            token=self._token,
            value=value,
            session_secret=session.secret,
        )
        client._with_leader(
            "proclaim",
            client.request_deadline,
            lambda node, timeout: node.elections.Proclaim(request, timeout=timeout, metadata=client.metadata),
        )
        self._value = value

    def resign(self) -> None:
        """Gives up the leadership; the next campaigner (FIFO) leads."""
        if self._released:
            return
        self._released = True
        self._observation.close()
        session = self._session
        client = session.client
        request = pb.ResignRequest(
            request_id=client._next_request_id(),
            session_id=session.id,
            name=self._name,
            token=self._token,
            session_secret=session.secret,
        )
        client._with_leader(
            "resign",
            client.request_deadline,
            lambda node, timeout: node.elections.Resign(request, timeout=timeout, metadata=client.metadata),
        )

    def release(self) -> None:
        """The same as `resign()`, for code that handles every grant alike."""
        self.resign()
