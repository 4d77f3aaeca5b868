"""One keepalive stream per client serves every session of that client.

A thread owns the stream and a schedule of the client's sessions: each is sent a
keepalive `KEEPALIVES_PER_TTL` times per TTL, and its state is re-evaluated exactly
when it could change (its next send, its jeopardy point, its deadline) — no polling
over all sessions. The deadline is conservative: the send time of the last answered
keepalive plus the TTL the leader granted, less the clock-drift allowance and margin
of `lease.client_lease_ms`, so that it passes before the leader could expire the
session. A keepalive unanswered for a whole interval, or a stream that does not open
within `ATTEMPT_TIMEOUT_MS`, moves the stream to another node.

The thread starts with the first session and ends with the last, so an idle client
holds no thread and no stream. A second, short-lived thread per stream reads its
answers (gRPC's blocking iterator) and hands them to the first through its inbox.
"""

from __future__ import annotations

import heapq
import logging
import queue
import threading
import time
from typing import TYPE_CHECKING, Dict, Iterator, List, Optional, Tuple

import grpc

from leasehold._proto import leasehold_pb2 as pb
from leasehold.client import ATTEMPT_TIMEOUT_MS, RETRY_PAUSE_MS
from leasehold.errors import Unavailable
from leasehold.lease import KEEPALIVES_PER_TTL, Lease, SessionState, counted_on_s

if TYPE_CHECKING:
    from leasehold.client import Client

_log = logging.getLogger("leasehold")

#: Keepalive requests buffered for the stream before sends are retried later.
KEEPALIVE_REQUESTS_QUEUED_MAX = 4_096
#: The schedule is rebuilt when it holds this many entries per session (stale ones
#: accumulate as sessions are rescheduled), so its memory stays bounded.
SCHEDULE_ENTRIES_PER_SESSION_MAX = 4
#: Never wake sooner than this after handling a session: an overdue session must not
#: make the thread spin before it reconnects.
WAKE_GAP_S = 0.001

_PAUSE_S = RETRY_PAUSE_MS / 1_000
_OPEN_TIMEOUT_S = ATTEMPT_TIMEOUT_MS / 1_000


class _Register:
    __slots__ = ("session_id", "secret", "ttl_ms", "lease")

    def __init__(self, session_id: int, secret: bytes, ttl_ms: int, lease: Lease) -> None:
        self.session_id, self.secret, self.ttl_ms, self.lease = session_id, secret, ttl_ms, lease


class _Deregister:
    __slots__ = ("session_id",)

    def __init__(self, session_id: int) -> None:
        self.session_id = session_id


class _Opened:
    """The stream's response headers arrived: a node took it."""

    __slots__ = ("stream_id",)

    def __init__(self, stream_id: int) -> None:
        self.stream_id = stream_id


class _Answer:
    __slots__ = ("stream_id", "answer")

    def __init__(self, stream_id: int, answer: pb.KeepAliveResponse) -> None:
        self.stream_id, self.answer = stream_id, answer


class _Ended:
    """The stream ended: with a status (`error`), or cleanly (None)."""

    __slots__ = ("stream_id", "error")

    def __init__(self, stream_id: int, error: Optional[grpc.RpcError]) -> None:
        self.stream_id, self.error = stream_id, error


class _Stop:
    __slots__ = ()


class _Tracked:
    """One session in the schedule."""

    __slots__ = ("lease", "request", "ttl_ms", "interval", "next_send", "sent_at", "wake")

    def __init__(self, session_id: int, secret: bytes, ttl_ms: int, lease: Lease, now: float) -> None:
        self.lease = lease
        # Built once and sent as it is: every keepalive of the session is the same.
        self.request = pb.KeepAliveRequest(session_id=session_id, session_secret=secret)
        self.ttl_ms = ttl_ms
        self.interval = ttl_ms / 1_000 / KEEPALIVES_PER_TTL
        self.next_send = now + self.interval
        #: When the keepalive now in flight was sent.
        self.sent_at: Optional[float] = None
        #: When this session is scheduled to be looked at again.
        self.wake = now

    def next_wake(self, now: float) -> float:
        """The next moment anything about this session can change."""
        deadline = self.lease.deadline
        wake = min(self.next_send, deadline)
        jeopardy_at = self.lease.jeopardy_at
        if jeopardy_at > now:
            wake = min(wake, jeopardy_at)
        if self.sent_at is not None:
            # Unanswered for a whole interval: time to try another node.
            wake = min(wake, self.sent_at + self.interval)
        return max(wake, now)


class _Schedule:
    """The sessions and when each is due, in a heap; an entry whose time is no longer
    its session's `wake` is stale and skipped."""

    def __init__(self) -> None:
        self.sessions: Dict[int, _Tracked] = {}
        self._due: List[Tuple[float, int]] = []

    def reschedule(self, session_id: int, now: float, earliest: float = 0.0) -> None:
        tracked = self.sessions.get(session_id)
        if tracked is None:
            return
        tracked.wake = max(tracked.next_wake(now), earliest)
        heapq.heappush(self._due, (tracked.wake, session_id))
        if len(self._due) > SCHEDULE_ENTRIES_PER_SESSION_MAX * len(self.sessions) + 16:
            self._due = [(tracked.wake, sid) for sid, tracked in self.sessions.items()]
            heapq.heapify(self._due)

    def remove(self, session_id: int) -> None:
        self.sessions.pop(session_id, None)

    def next_due(self) -> Optional[float]:
        while self._due:
            when, session_id = self._due[0]
            tracked = self.sessions.get(session_id)
            if tracked is not None and tracked.wake == when:
                return when
            heapq.heappop(self._due)
        return None

    def take_due(self, now: float) -> List[int]:
        """The sessions due at `now`, each once, removed from the heap."""
        due: List[int] = []
        while self._due and self._due[0][0] <= now:
            when, session_id = heapq.heappop(self._due)
            tracked = self.sessions.get(session_id)
            if tracked is not None and tracked.wake == when and session_id not in due:
                due.append(session_id)
        return due

    def handle(self, command: object) -> None:
        now = time.monotonic()
        if isinstance(command, _Register):
            self.sessions[command.session_id] = _Tracked(
                command.session_id, command.secret, command.ttl_ms, command.lease, now
            )
            self.reschedule(command.session_id, now)
        elif isinstance(command, _Deregister):
            self.remove(command.session_id)

    def forget_in_flight(self) -> None:
        """Every keepalive in flight is lost with the stream; the deadlines stay."""
        now = time.monotonic()
        for session_id, tracked in self.sessions.items():
            if tracked.sent_at is not None:
                tracked.sent_at = None
                tracked.next_send = now
        for session_id in list(self.sessions):
            self.reschedule(session_id, now)


_CLOSE = object()


class _Stream:
    """One KeepAlive call: requests go through a bounded queue that the call's
    request iterator drains; a reader thread hands the answers to the inbox."""

    def __init__(self, stream_id: int, client: "Client", inbox: "queue.SimpleQueue[object]") -> None:
        self.stream_id = stream_id
        self.endpoint = client._preferred_endpoint()
        self.opened = False
        self.answered = False
        self.open_deadline = time.monotonic() + _OPEN_TIMEOUT_S
        self._requests: "queue.Queue[object]" = queue.Queue(maxsize=KEEPALIVE_REQUESTS_QUEUED_MAX)
        self._closed = False
        self._call = client._node(self.endpoint).leasehold.KeepAlive(self._outgoing(), metadata=client.metadata)
        self._reader = threading.Thread(
            target=self._read, args=(inbox,), name="leasehold-keepalive-reader", daemon=True
        )
        self._reader.start()

    def _outgoing(self) -> Iterator[pb.KeepAliveRequest]:
        while True:
            item = self._requests.get()
            if item is _CLOSE:
                return
            yield item  # type: ignore[misc]

    def _read(self, inbox: "queue.SimpleQueue[object]") -> None:
        try:
            self._call.initial_metadata()
            inbox.put(_Opened(self.stream_id))
            for answer in self._call:
                inbox.put(_Answer(self.stream_id, answer))
        except grpc.RpcError as error:
            inbox.put(_Ended(self.stream_id, error))
        else:
            inbox.put(_Ended(self.stream_id, None))

    def try_send(self, request: pb.KeepAliveRequest) -> Optional[bool]:
        """True when queued, False when the queue is full, None when closed."""
        if self._closed:
            return None
        try:
            self._requests.put_nowait(request)
        except queue.Full:
            return False
        return True

    def close(self) -> None:
        """Ends the call; its reader and request iterator end with it."""
        if self._closed:
            return
        self._closed = True
        while True:  # Make room for the end marker: nothing queued matters any more.
            try:
                self._requests.get_nowait()
            except queue.Empty:
                break
        self._requests.put_nowait(_CLOSE)
        self._call.cancel()


class Keepalive:
    """The keepalive thread of one client (see the module)."""

    def __init__(self, client: "Client") -> None:
        self._client = client
        self._inbox: "queue.SimpleQueue[object]" = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="leasehold-keepalive", daemon=True)
        self._streams = 0

    def start(self) -> None:
        self._thread.start()

    def post(self, command: object) -> None:
        self._inbox.put(command)

    def stop(self) -> None:
        self._inbox.put(_Stop())

    def _run(self) -> None:
        try:
            self._loop()
        except Exception:  # A bug here must be loud: the sessions will run out.
            _log.exception("the keepalive thread failed; its sessions will expire")
            with self._client._keepalive_lock:
                if self._client._keepalive is self:
                    self._client._keepalive = None

    def _open(self) -> _Stream:
        self._streams += 1
        return _Stream(self._streams, self._client, self._inbox)

    def _loop(self) -> None:
        client = self._client
        schedule = _Schedule()
        stream: Optional[_Stream] = None
        reopen_at = 0.0
        while True:
            if not schedule.sessions:
                if stream is not None:
                    stream.close()
                    stream = None
                # Exit only if no registration is racing in: decide under the lock
                # under which `register` looks for a running thread.
                with client._keepalive_lock:
                    try:
                        command = self._inbox.get_nowait()
                    except queue.Empty:
                        if client._keepalive is self:
                            client._keepalive = None
                        return
                if isinstance(command, _Stop):
                    return
                schedule.handle(command)
                continue
            now = time.monotonic()
            if stream is None and now >= reopen_at:
                try:
                    stream = self._open()
                except Unavailable:  # The client was closed under this thread.
                    return
            if stream is None:
                # Keep publishing states (a session may run out meanwhile).
                self._expire_due(schedule, now)
            wake = schedule.next_due()
            if wake is None:
                wake = now + 1.0
            if stream is None:
                wake = min(wake, reopen_at)
            elif not stream.opened:
                wake = min(wake, stream.open_deadline)
            try:
                message: Optional[object] = self._inbox.get(timeout=max(wake - time.monotonic(), 0.0))
            except queue.Empty:
                message = None
            if isinstance(message, _Stop):
                if stream is not None:
                    stream.close()
                return
            if message is not None:
                stream, reopen_at = self._handle(message, schedule, stream, reopen_at)
            if stream is None:
                continue
            now = time.monotonic()
            if not stream.opened and now >= stream.open_deadline:
                _log.debug("%s did not open a keepalive stream in time", stream.endpoint)
                client._rotate(stream.endpoint)
                stream = self._drop(stream, schedule)
                reopen_at = now + _PAUSE_S
                continue
            due = schedule.next_due()
            if due is not None and due <= now and not self._process_due(schedule, stream):
                # A keepalive went unanswered for a whole interval: another node.
                client._rotate(stream.endpoint)
                stream = self._drop(stream, schedule)

    @staticmethod
    def _drop(stream: _Stream, schedule: _Schedule) -> None:
        stream.close()
        schedule.forget_in_flight()
        return None

    def _handle(
        self, message: object, schedule: _Schedule, stream: Optional[_Stream], reopen_at: float
    ) -> Tuple[Optional[_Stream], float]:
        """Handles one inbox message; returns the stream and when to reopen it."""
        current = stream is not None and getattr(message, "stream_id", None) == stream.stream_id
        if isinstance(message, (_Register, _Deregister)):
            schedule.handle(message)
        elif isinstance(message, _Opened) and current:
            assert stream is not None
            stream.opened = True
        elif isinstance(message, _Answer) and current:
            assert stream is not None
            stream.answered = True
            self._answer(schedule, message.answer)
        elif isinstance(message, _Ended) and current:
            assert stream is not None
            if message.error is None:
                self._client._rotate(stream.endpoint)
            else:
                self._client._follow_hint(stream.endpoint, message.error)
            # A stream that never answered (the node is down or not the leader) is
            # not reopened at once, so that a cluster without a leader is not spun on.
            reopen_at = time.monotonic() + (0.0 if stream.answered else _PAUSE_S)
            stream = self._drop(stream, schedule)
        return stream, reopen_at

    @staticmethod
    def _answer(schedule: _Schedule, answer: pb.KeepAliveResponse) -> None:
        now = time.monotonic()
        tracked = schedule.sessions.get(answer.session_id)
        if tracked is None:
            return
        if not answer.alive:
            tracked.lease.end()
            schedule.remove(answer.session_id)
            return
        if tracked.sent_at is not None:
            tracked.lease.extend(tracked.sent_at + counted_on_s(answer.ttl_ms, tracked.ttl_ms))
            tracked.sent_at = None
        tracked.lease.publish(now)
        schedule.reschedule(answer.session_id, now)

    @staticmethod
    def _expire_due(schedule: _Schedule, now: float) -> None:
        """Publishes states that changed while there is no stream; drops lost sessions."""
        for session_id, tracked in list(schedule.sessions.items()):
            if tracked.lease.publish(now) is SessionState.LOST:
                schedule.remove(session_id)

    @staticmethod
    def _process_due(schedule: _Schedule, stream: _Stream) -> bool:
        """Handles every session whose time came. Returns False when the stream looks
        dead. Only the entries due when it starts are handled, so it always ends."""
        now = time.monotonic()
        healthy = True
        for session_id in schedule.take_due(now):
            tracked = schedule.sessions.get(session_id)
            if tracked is None:
                continue
            if tracked.lease.publish(now) is SessionState.LOST:
                schedule.remove(session_id)
                continue
            if tracked.sent_at is not None:
                if now - tracked.sent_at >= tracked.interval:
                    healthy = False
            elif now >= tracked.next_send:
                sent = stream.try_send(tracked.request)
                if sent:
                    tracked.sent_at = now
                    tracked.next_send = now + tracked.interval
                elif sent is False:
                    tracked.next_send = now + _PAUSE_S
                else:
                    healthy = False
            schedule.reschedule(session_id, now, earliest=now + WAKE_GAP_S)
        return healthy


def register(client: "Client", session_id: int, secret: bytes, ttl_ms: int, lease: Lease) -> None:
    """Hands a new session to the client's keepalive thread, starting it if needed."""
    command = _Register(session_id, secret, ttl_ms, lease)
    with client._keepalive_lock:
        if client._closed:
            raise RuntimeError("the client is closed")
        keepalive = client._keepalive
        if keepalive is None:
            keepalive = Keepalive(client)
            client._keepalive = keepalive
            keepalive.post(command)
            keepalive.start()
        else:
            keepalive.post(command)


def deregister(client: "Client", session_id: int) -> None:
    """Stops keeping a session alive (it was closed or dropped)."""
    with client._keepalive_lock:
        keepalive = client._keepalive
        if keepalive is not None:
            keepalive.post(_Deregister(session_id))
