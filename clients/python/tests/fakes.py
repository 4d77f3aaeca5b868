"""Statuses as a Leasehold node sends them, for tests that need no cluster."""

from __future__ import annotations

from typing import Dict, Optional, Sequence, Tuple

import grpc

from leasehold._proto import rich_status_pb2
from leasehold.errors import ERROR_DOMAIN, ERROR_INFO_TYPE_URL, STATUS_DETAILS_KEY

#: The gRPC code the server always sends with each reason (proto/src/errors.rs).
CODE_OF_REASON: Dict[str, grpc.StatusCode] = {
    "INVALID_ARGUMENT": grpc.StatusCode.INVALID_ARGUMENT,
    "UNKNOWN_SESSION": grpc.StatusCode.NOT_FOUND,
    "UNKNOWN_MEMBER": grpc.StatusCode.NOT_FOUND,
    "UNKNOWN_TENANT": grpc.StatusCode.NOT_FOUND,
    "LIMIT_EXCEEDED": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "QUOTA_EXCEEDED": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "BUDGET_EXCEEDED": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "DISK_LOW": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "OVERLOADED": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "RATE_LIMITED": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "REQUEST_ID_REUSED": grpc.StatusCode.ALREADY_EXISTS,
    "ALREADY_MEMBER": grpc.StatusCode.ALREADY_EXISTS,
    "TENANT_EXISTS": grpc.StatusCode.ALREADY_EXISTS,
    "UNAUTHENTICATED": grpc.StatusCode.UNAUTHENTICATED,
    "PERMISSION_DENIED": grpc.StatusCode.PERMISSION_DENIED,
    "WRONG_SESSION_SECRET": grpc.StatusCode.PERMISSION_DENIED,
    "WRONG_PEER": grpc.StatusCode.PERMISSION_DENIED,
    "NOT_HOLDER": grpc.StatusCode.FAILED_PRECONDITION,
    "LIMIT_MISMATCH": grpc.StatusCode.FAILED_PRECONDITION,
    "NOT_ELECTION_LEADER": grpc.StatusCode.FAILED_PRECONDITION,
    "SESSION_ENDED": grpc.StatusCode.FAILED_PRECONDITION,
    "LAST_VOTER": grpc.StatusCode.FAILED_PRECONDITION,
    "MEMBERSHIP_REFUSED": grpc.StatusCode.FAILED_PRECONDITION,
    "CLOCK_KNOB_OFF": grpc.StatusCode.FAILED_PRECONDITION,
    "WRONG_CLUSTER": grpc.StatusCode.FAILED_PRECONDITION,
    "STALE_INCARNATION": grpc.StatusCode.FAILED_PRECONDITION,
    "MEMBERS_TOO_OLD": grpc.StatusCode.FAILED_PRECONDITION,
    "BUILD_TOO_OLD": grpc.StatusCode.FAILED_PRECONDITION,
    "NOT_LEADER": grpc.StatusCode.UNAVAILABLE,
    "SHUTTING_DOWN": grpc.StatusCode.UNAVAILABLE,
    "COMMIT_UNCERTAIN": grpc.StatusCode.UNAVAILABLE,
    "LEADERSHIP_UNCONFIRMED": grpc.StatusCode.UNAVAILABLE,
    "READ_NOT_APPLIED": grpc.StatusCode.UNAVAILABLE,
    "INTERNAL": grpc.StatusCode.INTERNAL,
}


class FakeRpcError(grpc.RpcError):
    """A failed call as grpcio raises it: code, details and trailing metadata."""

    def __init__(
        self,
        code: grpc.StatusCode,
        details: str,
        trailing: Sequence[Tuple[str, object]] = (),
        initial: Sequence[Tuple[str, object]] = (),
    ) -> None:
        super().__init__(details)
        self._code, self._details, self._trailing, self._initial = code, details, tuple(trailing), tuple(initial)

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> Tuple[Tuple[str, object], ...]:
        return self._trailing

    def initial_metadata(self) -> Tuple[Tuple[str, object], ...]:
        return self._initial


def status_details(reason: str, metadata: Optional[Dict[str, str]] = None, domain: str = ERROR_DOMAIN) -> bytes:
    """The `grpc-status-details-bin` bytes of a refusal, encoded as tonic-types does."""
    info = rich_status_pb2.ErrorInfo(reason=reason, domain=domain, metadata=metadata or {})
    status = rich_status_pb2.Status(code=CODE_OF_REASON.get(reason, grpc.StatusCode.INTERNAL).value[0], message="x")
    detail = status.details.add()
    detail.type_url = ERROR_INFO_TYPE_URL
    detail.value = info.SerializeToString()
    return status.SerializeToString()


def refusal(
    reason: str, message: str = "the server's own words", metadata: Optional[Dict[str, str]] = None
) -> FakeRpcError:
    """A status a Leasehold handler returns for `reason`."""
    return FakeRpcError(CODE_OF_REASON[reason], message, [(STATUS_DETAILS_KEY, status_details(reason, metadata))])
