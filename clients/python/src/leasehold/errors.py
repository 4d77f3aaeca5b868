"""What can go wrong, said honestly, and how a server's refusal is read.

Every status a Leasehold handler returns carries a `google.rpc.ErrorInfo` in its
details (the `grpc-status-details-bin` trailer, a serialized `google.rpc.Status`)
whose `domain` is "leasehold" and whose `reason` names an `ErrorReason` of
`proto/leasehold.proto`. The client decides on the reason, never on the message,
which may be reworded in any release. A status without one did not come from a
handler (a broken connection, a deadline) and is classed by its code.

A request that was sent but not answered in time is `Indeterminate`: it may have
taken effect. A wait whose session ended is `SessionLost`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, Mapping, Optional, Tuple, Type

import grpc
from google.protobuf.message import DecodeError

from leasehold._proto import leasehold_pb2, rich_status_pb2

#: The `domain` of every Leasehold ErrorInfo.
ERROR_DOMAIN = "leasehold"
#: The trailer that carries the serialized google.rpc.Status.
STATUS_DETAILS_KEY = "grpc-status-details-bin"
#: The type URL of a google.rpc.ErrorInfo packed in an Any.
ERROR_INFO_TYPE_URL = "type.googleapis.com/google.rpc.ErrorInfo"
#: ErrorInfo metadata: the session a refusal is about (UNKNOWN_SESSION, SESSION_ENDED).
METADATA_SESSION_ID = "session_id"
#: ErrorInfo metadata of NOT_LEADER: the leader's client address, empty when unknown.
METADATA_LEADER = "leader"
#: ErrorInfo metadata of NOT_LEADER: the leader's node id, "0" when unknown.
METADATA_LEADER_ID = "leader_id"
#: ErrorInfo metadata: the tenant a refusal is about.
METADATA_TENANT = "tenant"
#: ErrorInfo metadata of OVERLOADED: how long to wait before trying again, in ms.
METADATA_RETRY_AFTER_MS = "retry_after_ms"
#: The response metadata key in which a follower also names the leader's address.
LEADER_METADATA_KEY = "leasehold-leader"

#: Every reason this build knows, by name (from the generated enum: one source).
KNOWN_REASONS = frozenset(name for name in leasehold_pb2.ErrorReason.keys() if name != "ERROR_REASON_UNSPECIFIED")


@dataclass(frozen=True)
class ErrorInfo:
    """A Leasehold ErrorInfo as received: its reason (None when this build does not
    know it) and its metadata."""

    reason: Optional[str]
    metadata: Mapping[str, str] = field(default_factory=dict)


def error_info(trailing_metadata: Optional[Iterable[Tuple[str, Any]]]) -> Optional[ErrorInfo]:
    """The Leasehold ErrorInfo in a status's trailers; None when there is none (the
    status came from the transport, not a handler) or it is of another domain."""
    for key, value in trailing_metadata or ():
        if key != STATUS_DETAILS_KEY:
            continue
        try:
            status = rich_status_pb2.Status.FromString(value)
            for detail in status.details:
                if detail.type_url != ERROR_INFO_TYPE_URL:
                    continue
                info = rich_status_pb2.ErrorInfo.FromString(detail.value)
                if info.domain != ERROR_DOMAIN:
                    return None
                reason = info.reason if info.reason in KNOWN_REASONS else None
                return ErrorInfo(reason=reason, metadata=dict(info.metadata))
        except DecodeError:
            return None
    return None


def response_metadata(error: grpc.RpcError, key: str) -> Optional[str]:
    """A text value of the failed call's response metadata (trailers, then headers)."""
    for source in ("trailing_metadata", "initial_metadata"):
        getter = getattr(error, source, None)
        try:
            pairs = getter() if getter is not None else None
        except Exception:  # A call that never got metadata.
            pairs = None
        for name, value in pairs or ():
            if name == key and isinstance(value, str):
                return value
    return None


class LeaseholdError(Exception):
    """Every error the client raises. `reason` is the server's ErrorReason name (None
    for a failure of the transport or the client), `code` the gRPC status code."""

    #: What the error says in front of its message.
    kind = "error"

    def __init__(
        self,
        message: str,
        *,
        reason: Optional[str] = None,
        code: Optional[grpc.StatusCode] = None,
        metadata: Optional[Mapping[str, str]] = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason
        self.code = code
        self.metadata: Mapping[str, str] = dict(metadata or {})

    def __str__(self) -> str:
        return f"{self.kind}: {self.message}"

    @property
    def definite(self) -> bool:
        """Whether the request certainly had no effect."""
        return True


class InvalidArgument(LeaseholdError):
    """The request broke a rule (an empty name, a TTL out of range, …); nothing changed."""

    kind = "invalid request"


class NotFound(LeaseholdError):
    """The session, lock, tenant or member does not exist (any more)."""

    kind = "not found"


class Refused(LeaseholdError):
    """Well-formed, but the state refuses it (a token that is not the current grant,
    a semaphore limit other than its own, a reused request id, …); nothing changed."""

    kind = "refused"


class LimitReached(LeaseholdError):
    """A limit of the server, a quota of the tenant, the cluster's state budget, or
    its disk reserve was reached."""

    kind = "limit reached"


class Unauthenticated(LeaseholdError):
    """No credential, or one the cluster does not know (never issued, rotated,
    revoked); nothing changed."""

    kind = "unauthenticated"


class PermissionDenied(LeaseholdError):
    """A known credential that may not do this (another tenant's resource, a wrong
    session secret, an admin request without the admin token); nothing changed."""

    kind = "permission denied"


class Unavailable(LeaseholdError):
    """No node could be reached, or none leads: the request was never applied."""

    kind = "unavailable"


class Overloaded(LeaseholdError):
    """The leader had as many of this tenant's requests waiting for the log as it
    queues for one tenant, or the tenant was past its rate quota: the request was
    never applied. The client waited the
    retry-after the leader gave (with jitter) and tried again until the request's
    deadline; this is the last refusal."""

    kind = "overloaded"


class Indeterminate(LeaseholdError):
    """The request was sent, but no answer came before the deadline: it may or may not
    have taken effect. The client already retried it with the same request id until
    its deadline, so a retry could not have taken effect twice."""

    kind = "indeterminate"

    def __str__(self) -> str:
        return (
            f"indeterminate: the request was sent but not answered in time ({self.message}); "
            "it may have taken effect"
        )

    @property
    def definite(self) -> bool:
        return False


class SessionLost(LeaseholdError):
    """The session expired or was closed: every lock, permit and leadership it held is
    lost. A wait (acquire, semaphore acquire, campaign) whose session ended raises
    this too: it may have been granted just before the end, and whatever it got was
    released with the session."""

    kind = "session lost"

    def __init__(self, session_id: int, **kwargs: Any) -> None:
        super().__init__(f"session {session_id} is lost (expired or closed); its locks are released", **kwargs)
        self.session_id = session_id

    def __str__(self) -> str:
        return self.message


class OtherError(LeaseholdError):
    """Anything else: an internal error of a node, an answer the client did not
    expect. It may or may not have taken effect."""

    kind = "error"

    @property
    def definite(self) -> bool:
        return False


# What each reason means to a caller (the Rust client's `Error::from_reason`).
_ERROR_OF_REASON: Dict[str, Type[LeaseholdError]] = {
    "INVALID_ARGUMENT": InvalidArgument,
    "UNKNOWN_SESSION": NotFound,
    "UNKNOWN_MEMBER": NotFound,
    "UNKNOWN_TENANT": NotFound,
    "LIMIT_EXCEEDED": LimitReached,
    "QUOTA_EXCEEDED": LimitReached,
    "BUDGET_EXCEEDED": LimitReached,
    "DISK_LOW": LimitReached,
    "OVERLOADED": Overloaded,
    "RATE_LIMITED": Overloaded,
    "UNAUTHENTICATED": Unauthenticated,
    "PERMISSION_DENIED": PermissionDenied,
    "WRONG_SESSION_SECRET": PermissionDenied,
    "WRONG_PEER": PermissionDenied,
    "TENANT_EXISTS": Refused,
    "REQUEST_ID_REUSED": Refused,
    "NOT_HOLDER": Refused,
    "LIMIT_MISMATCH": Refused,
    "NOT_ELECTION_LEADER": Refused,
    "SESSION_ENDED": Refused,
    "ALREADY_MEMBER": Refused,
    "LAST_VOTER": Refused,
    "MEMBERSHIP_REFUSED": Refused,
    "CLOCK_KNOB_OFF": Refused,
    "WRONG_CLUSTER": Refused,
    "STALE_INCARNATION": Refused,
    "MEMBERS_TOO_OLD": Refused,
    "BUILD_TOO_OLD": Refused,
    "NOT_LEADER": Unavailable,
    "SHUTTING_DOWN": Unavailable,
    "COMMIT_UNCERTAIN": Unavailable,
    "LEADERSHIP_UNCONFIRMED": Unavailable,
    "READ_NOT_APPLIED": Unavailable,
    "INTERNAL": OtherError,
}
assert set(_ERROR_OF_REASON) == KNOWN_REASONS, (
    "every ErrorReason of leasehold.proto needs a meaning here: "
    f"{sorted(KNOWN_REASONS.symmetric_difference(_ERROR_OF_REASON))}"
)

# A status without a Leasehold reason, by its code.
_ERROR_OF_CODE: Dict[grpc.StatusCode, Type[LeaseholdError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.FAILED_PRECONDITION: Refused,
    grpc.StatusCode.ALREADY_EXISTS: Refused,
    grpc.StatusCode.RESOURCE_EXHAUSTED: LimitReached,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
}


def status_code(error: grpc.RpcError) -> Optional[grpc.StatusCode]:
    code = getattr(error, "code", None)
    return code() if callable(code) else None


def status_details(error: grpc.RpcError) -> str:
    details = getattr(error, "details", None)
    text = details() if callable(details) else None
    return text or ""


def status_error_info(error: grpc.RpcError) -> Optional[ErrorInfo]:
    trailers = getattr(error, "trailing_metadata", None)
    try:
        return error_info(trailers() if callable(trailers) else None)
    except Exception:
        return None


def error_from_status(error: grpc.RpcError) -> LeaseholdError:
    """The error a failed call stands for: by its ErrorReason, else by its code."""
    code = status_code(error)
    message = status_details(error)
    info = status_error_info(error)
    if info is not None and info.reason is not None:
        kind = _ERROR_OF_REASON[info.reason]
        if kind is OtherError:
            message = f"internal: {message}"
        return kind(message, reason=info.reason, code=code, metadata=info.metadata)
    metadata = info.metadata if info is not None else None
    by_code = _ERROR_OF_CODE.get(code) if code is not None else None
    if by_code is None:
        name = code.name if code is not None else "UNKNOWN"
        return OtherError(f"{name}: {message}", code=code, metadata=metadata)
    return by_code(message, code=code, metadata=metadata)


class LockNotAcquired(LeaseholdError):
    """`Session.lock` with a `wait` that ran out (or 0, and the lock was busy).
    `detail` says who held the lock."""

    kind = "not acquired"

    def __init__(self, name: str, detail: Any) -> None:
        super().__init__(f"lock {name!r} was not acquired: {detail}")
        self.name = name
        self.detail = detail


class SemaphoreNotAcquired(LeaseholdError):
    """`Semaphore.acquire` with a `wait` that ran out. `detail` (a `SemaphoreFull`)
    gives the holders and the limit."""

    kind = "not acquired"

    def __init__(self, name: str, detail: Any) -> None:
        super().__init__(f"semaphore {name!r}: no permit was granted: {detail}")
        self.name = name
        self.detail = detail


class NotElected(LeaseholdError):
    """`Session.campaign` with a `wait` that ran out. `leader` is who leads (None:
    vacant, as far as the answer knew)."""

    kind = "not elected"

    def __init__(self, name: str, leader: Any) -> None:
        super().__init__(f"election {name!r} was not won; the leader is {leader}")
        self.name = name
        self.leader = leader
