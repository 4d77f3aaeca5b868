"""The lease contract, and one session's lease as this process counts on it.

The numbers mirror `proto/src/lease.rs`, which the nodes and the Rust client read:
a client sends `KEEPALIVES_PER_TTL` keepalives per TTL, and counts on a lease from
the moment it *sent* the keepalive that got it, for the time granted less the clock
drift allowance (`CLOCK_DRIFT_PPM`) and a margin (`CLIENT_DEADLINE_MARGIN_MS`). The
leader never expires a session sooner than a TTL after it *received* the last
keepalive it answered, so the client's deadline always passes first.

A lease is not mutual exclusion: a process paused past its deadline wakes up still
holding its guards. The deadline, the jeopardy signal and `is_valid()` say when to stop;
only the fencing token, checked by the storage, makes a late write harmless.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from typing import Callable, List

_log = logging.getLogger("leasehold")

#: Keepalives a client sends per TTL: more often than the leader's quiet threshold
#: (TTL / 5 + 100 ms), so that a live session never costs a log write.
KEEPALIVES_PER_TTL = 6
#: The largest rate difference assumed between a node's monotonic clock and a
#: client's, in parts per million (NTP slews by at most 500 ppm; this allows twice that).
CLOCK_DRIFT_PPM = 1_000
#: What a client takes off every deadline besides the drift, for timer and scheduling
#: slack on its side.
CLIENT_DEADLINE_MARGIN_MS = 20
#: A session is in jeopardy when less than TTL / this is left before its deadline.
JEOPARDY_TTL_DIVISOR = 2


def client_lease_ms(granted_ms: int) -> int:
    """The part of a lease `granted_ms` long (as the leader measures it, from when it
    received the keepalive) that a client may count on, measured from when it sent
    the keepalive: less the drift (rounded up) and the margin."""
    drift_ms = -(-granted_ms * CLOCK_DRIFT_PPM // 1_000_000)
    return max(granted_ms - (drift_ms + CLIENT_DEADLINE_MARGIN_MS), 0)


def counted_on_s(granted_ms: int, ttl_ms: int) -> float:
    """Seconds of a lease of `granted_ms` (at most the session's TTL) that the client
    counts on from the moment it sent the request that got it."""
    return client_lease_ms(min(granted_ms, ttl_ms)) / 1_000


class SessionState(enum.Enum):
    """What a session's holder may assume."""

    #: Keepalives are answered; the deadline is comfortably ahead.
    ALIVE = "alive"
    #: No answer lately and less than half a TTL left: stop work that needs the locks.
    JEOPARDY = "jeopardy"
    #: The deadline passed, the server said the session is gone, or it was closed:
    #: every lock, permit and leadership it held is lost. Final.
    LOST = "lost"


#: Called with the new state when a session goes into jeopardy or is lost.
JeopardyListener = Callable[[SessionState], None]


class Lease:
    """One session's lease as this process counts on it: the conservative deadline
    (`time.monotonic()` seconds) and the state it implies at any moment.

    The keepalive thread moves the deadline forward and publishes state changes (the
    events and listeners); any thread may read the state, which is computed from the
    clock when asked, so a process that wakes from a pause sees LOST at once, before
    the keepalive thread has run. LOST is final.
    """

    def __init__(self, ttl_ms: int, deadline: float) -> None:
        self.ttl_ms = ttl_ms
        self._jeopardy_s = ttl_ms / 1_000 / JEOPARDY_TTL_DIVISOR
        self._lock = threading.Lock()
        self._deadline = deadline
        # Set once LOST is seen (by the clock, the server or a close): never undone.
        self._ended = False
        self._published = SessionState.ALIVE
        self._listeners: List[JeopardyListener] = []
        #: Set while the session is in jeopardy or lost; cleared if a keepalive is
        #: answered in time again.
        self.jeopardy = threading.Event()
        #: Set once the session is lost.
        self.lost = threading.Event()

    @property
    def deadline(self) -> float:
        """The conservative deadline, in `time.monotonic()` seconds."""
        with self._lock:
            return self._deadline

    @property
    def jeopardy_at(self) -> float:
        """When the session goes into jeopardy unless a keepalive is answered first."""
        with self._lock:
            return self._deadline - self._jeopardy_s

    def state(self, now: float) -> SessionState:
        """The state at `now` (monotonic seconds)."""
        with self._lock:
            return self._evaluate(now)

    def _evaluate(self, now: float) -> SessionState:
        if self._ended or now >= self._deadline:
            self._ended = True
            return SessionState.LOST
        if self._deadline - now < self._jeopardy_s:
            return SessionState.JEOPARDY
        return SessionState.ALIVE

    def extend(self, deadline: float) -> None:
        """Moves the deadline to `deadline` if that is later (a keepalive was
        answered). Does nothing once the session is lost."""
        with self._lock:
            if not self._ended and deadline > self._deadline:
                self._deadline = deadline

    def end(self) -> None:
        """The session is gone (the server said so, or it was closed)."""
        with self._lock:
            self._ended = True
        self.publish(time.monotonic())

    def add_listener(self, listener: JeopardyListener) -> None:
        """Calls `listener` (from the keepalive thread) with JEOPARDY or LOST each time
        the session goes into one of them; at once if it is in one already."""
        with self._lock:
            self._listeners.append(listener)
            current = self._published
        if current is not SessionState.ALIVE:
            self._call(listener, current)

    def remove_listener(self, listener: JeopardyListener) -> None:
        """Stops calling `listener` (if it was added)."""
        with self._lock:
            if listener in self._listeners:
                self._listeners.remove(listener)

    def publish(self, now: float) -> SessionState:
        """Publishes the state at `now` if it changed (events, listeners); returns it."""
        with self._lock:
            state = self._evaluate(now)
            changed = state is not self._published
            self._published = state
            listeners = list(self._listeners) if changed and state is not SessionState.ALIVE else []
        if changed:
            if state is SessionState.ALIVE:
                self.jeopardy.clear()
            else:
                self.jeopardy.set()
            if state is SessionState.LOST:
                self.lost.set()
        for listener in listeners:
            self._call(listener, state)
        return state

    @staticmethod
    def _call(listener: JeopardyListener, state: SessionState) -> None:
        try:
            listener(state)
        except Exception:  # A listener's bug must not stop the keepalives.
            _log.exception("a session state listener raised")
