"""The connection to a cluster: endpoints, TLS and credentials, leader following,
and retries with the same request id.

Every request goes to the node the client believes leads. A follower answers
NOT_LEADER and names the leader in the ErrorInfo metadata `leader` (and the
`leasehold-leader` response metadata); the client goes there. A request that was
sent but not answered (a broken connection, a timeout, COMMIT_UNCERTAIN,
SHUTTING_DOWN) is retried, on another node if need be, with the same request id, so
that the server answers the original result instead of applying it again. When the
request's deadline passes, a request that was sent but never answered raises
`Indeterminate`; one that never reached a node raises `Unavailable`.
"""

from __future__ import annotations

import itertools
import os
import random
import secrets
import socket
import threading
import time
import weakref
from typing import TYPE_CHECKING, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, TypeVar, Union

import grpc

from leasehold._proto import leasehold_pb2 as pb
from leasehold._proto import leasehold_pb2_grpc as pb_grpc
from leasehold.errors import (
    LEADER_METADATA_KEY,
    METADATA_LEADER,
    METADATA_RETRY_AFTER_MS,
    METADATA_SESSION_ID,
    InvalidArgument,
    Indeterminate,
    LeaseholdError,
    NotFound,
    SessionLost,
    Unavailable,
    error_from_status,
    response_metadata,
    status_code,
    status_details,
    status_error_info,
)
from leasehold.fence import FenceCheck, FencingToken

if TYPE_CHECKING:
    from leasehold.election import Leader, Observation
    from leasehold.keepalive import Keepalive
    from leasehold.session import Session

T = TypeVar("T")

#: The endpoints of a cluster started by `cluster.sh`.
DEFAULT_ENDPOINTS = "127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103"
#: How long one request keeps retrying (leader changes, lost connections) by default.
REQUEST_DEADLINE_MS_DEFAULT = 10_000
#: How long one attempt may take before it is abandoned and retried.
ATTEMPT_TIMEOUT_MS = 2_000
#: The first pause between attempts when no leader is known or an attempt was lost
#: (see RetryPauses).
RETRY_PAUSE_MS = 50
#: The longest pause between two attempts of one request.
RETRY_PAUSE_MS_MAX = 800
#: The longest retry-after the client honours (a server asking for more is waited this).
RETRY_AFTER_MS_CAP = 5_000


def pause_after(retry_after_ms: int) -> float:
    """The pause, in seconds, before trying again after a server asked for
    `retry_after_ms`: drawn at random between that and half as long again (at most
    RETRY_AFTER_MS_CAP), so that the clients a leader refused at one moment come back
    spread out."""
    retry_after_ms = min(max(retry_after_ms, 1), RETRY_AFTER_MS_CAP)
    return random.uniform(retry_after_ms, retry_after_ms * 1.5) / 1_000


class RetryPauses:
    """The pauses between the attempts of one request, in seconds. Each is drawn at
    random between half and all of a step that doubles from RETRY_PAUSE_MS to
    RETRY_PAUSE_MS_MAX: clients that lost the same leader at the same moment come back
    spread out rather than in lock-step, and a cluster without a leader for a while is
    asked less and less often."""

    def __init__(self) -> None:
        self._step_ms = RETRY_PAUSE_MS

    def next(self) -> float:
        step_ms = self._step_ms
        self._step_ms = min(step_ms * 2, RETRY_PAUSE_MS_MAX)
        return random.uniform(step_ms / 2, step_ms) / 1_000


#: How long a connection attempt to one node may take.
CONNECT_TIMEOUT_MS = 500
#: The longest pause gRPC makes between attempts to reconnect to a node that was
#: down, so that a restarted node is used again soon.
RECONNECT_BACKOFF_MS_MAX = 1_000
#: HTTP/2 pings on every connection, so that a dead node's connection is noticed
#: (and an attempt on it fails) without waiting for TCP.
HTTP2_KEEPALIVE_INTERVAL_MS = 1_000
HTTP2_KEEPALIVE_TIMEOUT_MS = 2_000

# gRPC's own words for a call that failed because no connection could be made: the
# request never left this process. (A status from a Leasehold handler is decided on
# its ErrorReason; this is a failure of the transport library, which has no reason.)
_NEVER_CONNECTED_DETAILS = "failed to connect to all addresses"

# The outcomes of one attempt, as the retry loop sees them.
_DONE = "done"
#: Not applied; try another node (the payload names the leader, if known).
_REDIRECT = "redirect"
#: Sent but unanswered: may have been applied.
_LOST = "lost"
#: Refused as a reuse of its request id: definite, unless an earlier attempt of this
#: request went unanswered (then that one may have been applied).
_REUSED = "reused"
#: Refused before any work with a time to wait (OVERLOADED): not applied; try the same
#: node again after the pause (the payload: seconds, and the error).
_LATER = "later"
_FAILED = "failed"

#: What an attempt is given: the node, and the seconds it may take.
Call = Callable[["Node", float], T]


def parse_endpoints(text: Union[str, Iterable[str]]) -> List[str]:
    """Parses "a:1,b:2" (or a list of addresses) into endpoints, without a scheme."""
    items = text.split(",") if isinstance(text, str) else list(text)
    endpoints = []
    for item in items:
        endpoint = item.strip()
        for scheme in ("http://", "https://"):
            if endpoint.startswith(scheme):
                endpoint = endpoint[len(scheme) :]
        if endpoint:
            endpoints.append(endpoint)
    return endpoints


def _default_client_name() -> str:
    """This machine's host name and this process's id ("host:pid")."""
    return f"{socket.gethostname() or 'unknown-host'}:{os.getpid()}"


def _bearer(token: str) -> str:
    if not token or any(not 0x20 <= ord(character) <= 0x7E for character in token):
        raise InvalidArgument("a token is printable ASCII")
    return f"Bearer {token}"


class Node:
    """The connection to one node: its channel and a stub of each service, made once
    and shared by every request to it."""

    __slots__ = ("endpoint", "channel", "leasehold", "semaphores", "elections", "admin")

    def __init__(self, endpoint: str, channel: grpc.Channel) -> None:
        self.endpoint = endpoint
        self.channel = channel
        self.leasehold = pb_grpc.LeaseholdStub(channel)
        self.semaphores = pb_grpc.SemaphoresStub(channel)
        self.elections = pb_grpc.ElectionsStub(channel)
        self.admin = pb_grpc.AdminStub(channel)


def _classify(error: grpc.RpcError, endpoint: str, session_id: Optional[int]) -> Tuple[str, object]:
    """What one attempt's failure means for the retry loop, decided on the status's
    ErrorReason and never on its message. `session_id` is the session a waiting
    request belongs to: its end is `SessionLost`."""
    code = status_code(error)
    details = status_details(error)
    info = status_error_info(error)
    lost = f"{endpoint}: {details or (code.name if code else 'no answer')}"
    if info is None or info.reason is None:
        # Not from a Leasehold handler. A connection that could not be made never
        # carried the request: try the next node. A broken connection or a deadline
        # may or may not have reached the node.
        if code is grpc.StatusCode.UNAVAILABLE and _NEVER_CONNECTED_DETAILS in details:
            return _REDIRECT, None
        if code in (
            grpc.StatusCode.UNAVAILABLE,
            grpc.StatusCode.DEADLINE_EXCEEDED,
            grpc.StatusCode.CANCELLED,
            grpc.StatusCode.UNKNOWN,
            grpc.StatusCode.INTERNAL,
        ):
            return _LOST, lost
        return _FAILED, error_from_status(error)
    reason = info.reason
    if reason == "NOT_LEADER":
        return _REDIRECT, _leader_named(error)
    if reason in ("SHUTTING_DOWN", "COMMIT_UNCERTAIN", "LEADERSHIP_UNCONFIRMED", "READ_NOT_APPLIED", "INTERNAL"):
        return _LOST, lost
    if reason == "REQUEST_ID_REUSED":
        return _REUSED, error_from_status(error)
    if reason in ("OVERLOADED", "RATE_LIMITED"):
        try:
            retry_after_ms = int(info.metadata.get(METADATA_RETRY_AFTER_MS, RETRY_PAUSE_MS))
        except ValueError:
            retry_after_ms = RETRY_PAUSE_MS
        return _LATER, (pause_after(retry_after_ms), error_from_status(error))
    if (
        reason in ("UNKNOWN_SESSION", "SESSION_ENDED")
        and session_id is not None
        and info.metadata.get(METADATA_SESSION_ID) == str(session_id)
    ):
        return _FAILED, SessionLost(session_id, reason=reason, code=code, metadata=info.metadata)
    return _FAILED, error_from_status(error)


def _leader_named(error: grpc.RpcError) -> Optional[str]:
    """The leader's client address a not-leader answer names, if it names one."""
    info = status_error_info(error)
    leader = info.metadata.get(METADATA_LEADER) if info is not None else None
    if leader is None:
        leader = response_metadata(error, LEADER_METADATA_KEY)
    return leader or None


class Client:
    """A client of one Leasehold cluster. Thread-safe: share one per process (its
    sessions share one keepalive stream and one request id sequence).

    `endpoints`: the nodes' client addresses ("host:port", a list or comma-separated).
    `ca_certificate`: the PEM of the CA that signed the nodes' client-port
    certificates; the client trusts no other. `insecure_plaintext=True` instead, for a
    cluster started with --insecure-plaintext. `token`: a tenant's (or the admin's)
    bearer token, sent as `authorization: Bearer …` on every request.
    `client_certificate`: (certificate PEM, key PEM) naming
    `<tenant>.tenant.leasehold`, instead of a token. `client_name` is shown in
    describe output ("host:pid" by default). `request_deadline`: seconds one request
    keeps retrying across leader changes.

    The client connects on first use; `connect()` also checks that a node answers.
    """

    def __init__(
        self,
        endpoints: Union[str, Sequence[str]],
        *,
        ca_certificate: Optional[Union[bytes, str]] = None,
        token: Optional[str] = None,
        client_certificate: Optional[Tuple[bytes, bytes]] = None,
        insecure_plaintext: bool = False,
        client_name: Optional[str] = None,
        request_deadline: float = REQUEST_DEADLINE_MS_DEFAULT / 1_000,
    ) -> None:
        self._endpoints: Tuple[str, ...] = tuple(parse_endpoints(endpoints))
        if not self._endpoints:
            raise InvalidArgument("no endpoints given")
        if ca_certificate is not None and insecure_plaintext:
            raise InvalidArgument(
                "a CA certificate and insecure_plaintext contradict each other: choose TLS or plaintext"
            )
        if ca_certificate is None and not insecure_plaintext:
            raise InvalidArgument(
                "no CA to verify the cluster with: give ca_certificate (the CA that signed the nodes' "
                "certificates), or insecure_plaintext=True for a cluster started with --insecure-plaintext"
            )
        if client_certificate is not None and insecure_plaintext:
            raise InvalidArgument("a client certificate needs TLS")
        if request_deadline <= 0:
            raise InvalidArgument("request_deadline must be positive")
        if isinstance(ca_certificate, str):
            ca_certificate = ca_certificate.encode()
        if insecure_plaintext:
            self._credentials: Optional[grpc.ChannelCredentials] = None
        else:
            key, chain = (client_certificate[1], client_certificate[0]) if client_certificate else (None, None)
            self._credentials = grpc.ssl_channel_credentials(
                root_certificates=ca_certificate, private_key=key, certificate_chain=chain
            )
        #: Sent with every request: the bearer credential, if any.
        self._metadata: Tuple[Tuple[str, str], ...] = (("authorization", _bearer(token)),) if token is not None else ()
        self.client_name = client_name if client_name is not None else _default_client_name()
        self.request_deadline = float(request_deadline)
        # Random per client, so request ids of two processes never collide.
        self._client_id = 0
        while self._client_id == 0:
            self._client_id = secrets.randbits(64)
        self._sequence = itertools.count(1)
        self._sequence_lock = threading.Lock()
        self._nodes: Dict[str, Node] = {}
        self._nodes_lock = threading.Lock()
        # The endpoint that answered last, or that a follower named as leader.
        self._preferred = 0
        self._preferred_lock = threading.Lock()
        # The keepalive thread, while it runs (see `keepalive`); guarded by its lock.
        self._keepalive: Optional["Keepalive"] = None
        self._keepalive_lock = threading.Lock()
        # Open sessions, so that `close()` can close them.
        self._sessions: "weakref.WeakValueDictionary[int, Session]" = weakref.WeakValueDictionary()
        self._closed = False

    # ------------------------------------------------------------------ lifecycle

    @classmethod
    def connect(cls, endpoints: Union[str, Sequence[str]], **options: object) -> "Client":
        """A client (see the class) that has checked that some node answers."""
        client = cls(endpoints, **options)  # type: ignore[arg-type]
        try:
            client.status()
        except BaseException:
            client.close()
            raise
        return client

    @classmethod
    def from_env(cls) -> "Client":
        """A client configured by the `LEASEHOLD_*` variables (see `leasehold.settings`)."""
        from leasehold.settings import Settings

        return Settings.from_env().client()

    def close(self) -> None:
        """Closes every open session of this client (their locks are released at once),
        stops the keepalive thread and closes the connections."""
        for session in list(self._sessions.values()):
            try:
                session.close()
            except LeaseholdError:
                pass  # Best effort: it ends with its TTL otherwise.
        with self._keepalive_lock:
            keepalive, self._keepalive = self._keepalive, None
            self._closed = True
        if keepalive is not None:
            keepalive.stop()
        with self._nodes_lock:
            nodes, self._nodes = list(self._nodes.values()), {}
        for node in nodes:
            node.channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def endpoints(self) -> Tuple[str, ...]:
        return self._endpoints

    @property
    def client_id(self) -> int:
        """The random id that, with a sequence number, makes this client's request ids."""
        return self._client_id

    # ------------------------------------------------------------------ connections

    def _next_request_id(self) -> pb.RequestId:
        with self._sequence_lock:
            sequence = next(self._sequence)
        return pb.RequestId(client_id=self._client_id, sequence=sequence)

    def _node(self, endpoint: str) -> Node:
        """The connection to `endpoint`, made on first use and shared afterwards."""
        with self._nodes_lock:
            node = self._nodes.get(endpoint)
            if node is not None:
                return node
            if self._closed:
                raise Unavailable("the client is closed")
            options = [
                ("grpc.enable_retries", 0),  # The client retries itself, with request ids.
                ("grpc.min_reconnect_backoff_ms", CONNECT_TIMEOUT_MS),  # also the connect timeout
                ("grpc.initial_reconnect_backoff_ms", RETRY_PAUSE_MS * 2),
                ("grpc.max_reconnect_backoff_ms", RECONNECT_BACKOFF_MS_MAX),
                ("grpc.keepalive_time_ms", HTTP2_KEEPALIVE_INTERVAL_MS),
                ("grpc.keepalive_timeout_ms", HTTP2_KEEPALIVE_TIMEOUT_MS),
                ("grpc.keepalive_permit_without_calls", 1),
                ("grpc.http2.max_pings_without_data", 0),
            ]
            if self._credentials is None:
                channel = grpc.insecure_channel(endpoint, options=options)
            else:
                channel = grpc.secure_channel(endpoint, self._credentials, options=options)
            node = Node(endpoint, channel)
            self._nodes[endpoint] = node
            return node

    def raw_node(self, endpoint: str) -> Node:
        """The connection to one node (its channel and service stubs), for calling the
        generated stubs directly: no leader following, no retries. Pass
        `metadata=client.metadata` for the credential."""
        return self._node(endpoint)

    @property
    def metadata(self) -> Tuple[Tuple[str, str], ...]:
        """The metadata every request carries (the bearer credential)."""
        return self._metadata

    def _preferred_endpoint(self) -> str:
        with self._preferred_lock:
            return self._endpoints[self._preferred % len(self._endpoints)]

    def _prefer(self, endpoint: str) -> None:
        with self._preferred_lock:
            if endpoint in self._endpoints:
                self._preferred = self._endpoints.index(endpoint)

    def _move_off(self, failed: str) -> None:
        """After an attempt on `failed` that named no leader: points the next attempt
        at the node after it, unless the preference moved off `failed` meanwhile. The
        preference is shared by every user of the client (requests, the keepalive
        thread, observers); one that moved it (to a leader a node named, or on from
        another failure) knows something newer than this failure, which began earlier."""
        with self._preferred_lock:
            count = len(self._endpoints)
            if self._endpoints[self._preferred % count] == failed:
                self._preferred = (self._preferred % count + 1) % count

    def _learn_endpoint(self, endpoint: Optional[str]) -> Optional[str]:
        """A leader named by a follower, if it is among the configured endpoints."""
        return endpoint if endpoint is not None and endpoint in self._endpoints else None

    def _follow_hint(self, failed: str, error: Optional[grpc.RpcError]) -> None:
        """After a failure on `failed`: points the next attempt at the leader the
        status names, or off `failed` (`_move_off`)."""
        leader = self._learn_endpoint(_leader_named(error)) if error is not None else None
        if leader is not None and leader != failed:
            self._prefer(leader)
        else:
            self._move_off(failed)

    def _rotate(self, failed: str) -> None:
        """Points the next attempt off `failed` (`_move_off`)."""
        self._move_off(failed)

    # ------------------------------------------------------------------ the retry loop

    def _with_leader(
        self,
        what: str,
        deadline: float,
        call: Call[T],
        *,
        attempt_timeout: float = ATTEMPT_TIMEOUT_MS / 1_000,
        session_id: Optional[int] = None,
    ) -> T:
        """Runs `call` against the leader, following redirects and retrying lost
        attempts until `deadline` seconds have passed. `call` must be safe to repeat:
        a mutating call carries the same request id on every attempt. Each attempt
        may take up to `attempt_timeout` seconds. `session_id` is the session a
        waiting request belongs to: when the server says it ended, `SessionLost`."""
        give_up = time.monotonic() + deadline
        sent_unanswered: Optional[str] = None
        last_error = "no attempt was made"
        redirect: Optional[str] = None
        pauses = RetryPauses()
        while True:
            endpoint = redirect if redirect is not None else self._preferred_endpoint()
            redirect = None
            node = self._node(endpoint)
            left = max(give_up - time.monotonic(), 0.0)
            limit = max(min(left, attempt_timeout), 0.001)
            try:
                value = call(node, limit)
            except grpc.RpcError as error:
                outcome, payload = _classify(error, endpoint, session_id)
            else:
                self._prefer(endpoint)
                return value
            if outcome == _REUSED and sent_unanswered is not None:
                # An earlier attempt may have been applied with a different body.
                raise Indeterminate(f"{what}: {payload}")
            if outcome in (_REUSED, _FAILED):
                assert isinstance(payload, LeaseholdError)
                raise payload
            if outcome == _LATER:
                # The leader refused it before any work: wait what it asked, or
                # longer as refusals repeat (many clients of one tenant refused at
                # once then come back spread over a growing time), if the deadline
                # allows, and try the same node again.
                asked, refusal = payload  # type: ignore[misc]
                wait = max(asked, pauses.next())
                if time.monotonic() + wait >= give_up:
                    if sent_unanswered is not None:
                        raise Indeterminate(f"{what}: {sent_unanswered}")
                    raise refusal
                last_error = str(refusal)
                redirect = endpoint
                time.sleep(wait)
                continue
            if outcome == _REDIRECT:
                last_error = f"{endpoint} is not the leader" if payload else f"{endpoint}: no connection"
                leader = self._learn_endpoint(payload)  # type: ignore[arg-type]
                if leader is not None and leader != endpoint:
                    self._prefer(leader)
                    redirect = leader
                else:
                    # No leader named, or a stale hint that names the node itself:
                    # another node, after a pause for a new leader.
                    self._move_off(endpoint)
                    time.sleep(pauses.next())
            else:
                assert outcome == _LOST
                last_error = sent_unanswered = str(payload)
                self._move_off(endpoint)
                time.sleep(pauses.next())
            if time.monotonic() >= give_up:
                if sent_unanswered is not None:
                    raise Indeterminate(f"{what}: {sent_unanswered}")
                raise Unavailable(f"{what}: {last_error}")

    # ------------------------------------------------------------------ sessions

    def session(self, ttl: float = 10.0) -> "Session":
        """Creates a session whose lease is `ttl` seconds and keeps it alive in the
        background (one keepalive stream per client) until it is closed."""
        from leasehold.session import Session

        session = Session._create(self, ttl)
        self._sessions[session.id] = session
        return session

    # ------------------------------------------------------------------ reads

    def status(self, endpoint: Optional[str] = None) -> pb.StatusResponse:
        """One node's view of the cluster: `endpoint`'s, or the first that answers."""
        if endpoint is not None:
            return self._status_of(endpoint)
        last = ""
        for candidate in self._endpoints:
            try:
                return self._status_of(candidate)
            except Unavailable as error:
                last = error.message
        raise Unavailable(f"no node answered ({last})")

    def _status_of(self, endpoint: str) -> pb.StatusResponse:
        try:
            return self._node(endpoint).admin.Status(
                pb.StatusRequest(), timeout=ATTEMPT_TIMEOUT_MS / 1_000, metadata=self._metadata
            )
        except grpc.RpcError as error:
            raise Unavailable(f"{endpoint}: {status_details(error) or 'no answer'}") from None

    def check_fence(self, name: str, token: Union[int, FencingToken]) -> FenceCheck:
        """Whether `token` is still the current grant of lock `name` (linearizable).
        Weaker than a fence column: the answer may be stale when the write lands."""
        request = pb.CheckFenceRequest(name=name, token=int(token))
        response = self._with_leader(
            "check fence",
            self.request_deadline,
            lambda node, timeout: node.leasehold.CheckFence(request, timeout=timeout, metadata=self._metadata),
        )
        return FenceCheck(current=response.current, current_token=response.current_token)

    def describe_lock(self, name: str, stale: bool = False) -> pb.DescribeLockResponse:
        """The lock's holder (absent when free) and its waiters in order."""
        request = pb.DescribeLockRequest(name=name, stale=stale)
        return self._with_leader(
            "describe lock",
            self.request_deadline,
            lambda node, timeout: node.leasehold.DescribeLock(request, timeout=timeout, metadata=self._metadata),
        )

    def describe_session(self, session_id: int) -> pb.SessionInfo:
        """What a session holds and waits for."""
        request = pb.DescribeSessionRequest(session_id=session_id)
        response = self._with_leader(
            "describe session",
            self.request_deadline,
            lambda node, timeout: node.leasehold.DescribeSession(request, timeout=timeout, metadata=self._metadata),
        )
        if not response.HasField("session"):
            raise NotFound(f"session {session_id}")
        return response.session

    def list_sessions(self) -> List[pb.SessionInfo]:
        """Every session this credential may see, in order of id, a page at a time."""
        sessions: List[pb.SessionInfo] = []
        page_token = 0
        while True:
            request = pb.ListSessionsRequest(page_token=page_token)
            page = self._with_leader(
                "list sessions",
                self.request_deadline,
                lambda node, timeout: node.leasehold.ListSessions(request, timeout=timeout, metadata=self._metadata),
            )
            sessions.extend(page.sessions)
            if page.next_page_token == 0:
                return sessions
            page_token = page.next_page_token

    def describe_semaphore(self, name: str) -> pb.DescribeSemaphoreResponse:
        """The semaphore's limit (0: nobody uses it), holders and waiters."""
        request = pb.DescribeSemaphoreRequest(name=name)
        return self._with_leader(
            "describe semaphore",
            self.request_deadline,
            lambda node, timeout: node.semaphores.Describe(request, timeout=timeout, metadata=self._metadata),
        )

    def leader(self, name: str) -> Optional["Leader"]:
        """The current leader of election `name`, or None when vacant (linearizable)."""
        from leasehold.election import Leader

        request = pb.LeaderRequest(name=name)
        response = self._with_leader(
            "leader",
            self.request_deadline,
            lambda node, timeout: node.elections.Leader(request, timeout=timeout, metadata=self._metadata),
        )
        return Leader.from_pb(response.leader) if response.HasField("leader") else None

    def observe(self, name: str) -> "Observation":
        """Every change of election `name`'s leadership in commit order, starting with
        the current state, as an iterator of `Leader` (None: vacant). It reconnects by
        itself and skips a repeat of the last state it delivered. Close it when done."""
        from leasehold.election import Observation

        return Observation(self, name)
