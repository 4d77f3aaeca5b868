"""How statuses are read and classed: by their ErrorReason, never by their message
(mirrors the classification tests of the Rust client, client/src/client.rs)."""

from __future__ import annotations

import grpc
import pytest

import leasehold
from leasehold._proto import leasehold_pb2
from leasehold.client import _classify
from leasehold.errors import KNOWN_REASONS, STATUS_DETAILS_KEY, error_from_status, error_info

from fakes import CODE_OF_REASON, FakeRpcError, refusal, status_details

OWN_SESSION = 7
METADATA = {"session_id": str(OWN_SESSION), "leader": "127.0.0.1:7102", "leader_id": "2", "retry_after_ms": "40"}

REWORDINGS = [
    "",
    "reworded entirely",
    # Texts a client might once have matched on, now under reasons that mean otherwise.
    "node 1 is not the leader",
    "request id (client 1, sequence 2) was already used for a different command",
    'session 7 ended (expired or closed) while waiting for lock "a"',
    "session 7 does not exist",
]


def shape(outcome: tuple) -> str:
    kind, payload = outcome
    if kind == "redirect":
        return f"redirect to {payload!r}"
    if kind == "lost":
        return "lost"
    if kind == "later":
        return f"later: {type(payload[1]).__name__}"
    return f"{kind}: {type(payload).__name__}"


def test_every_reason_of_the_proto_has_a_code_and_a_meaning() -> None:
    names = {name for name in leasehold_pb2.ErrorReason.keys() if name != "ERROR_REASON_UNSPECIFIED"}
    assert names == KNOWN_REASONS == set(CODE_OF_REASON)


def test_a_reason_and_its_metadata_survive_the_status_bytes() -> None:
    error = refusal("NOT_LEADER", "node 2 is not the leader", {"leader": "a:1"})
    info = error_info(error.trailing_metadata())
    assert info is not None and info.reason == "NOT_LEADER" and info.metadata["leader"] == "a:1"
    assert error_info([]) is None, "no details, no reason"
    other_domain = [(STATUS_DETAILS_KEY, status_details("NOT_LEADER", domain="elsewhere"))]
    assert error_info(other_domain) is None, "an ErrorInfo of another domain is not Leasehold's"
    assert error_info([(STATUS_DETAILS_KEY, b"\xff\xff garbage")]) is None


def test_an_unknown_reason_is_no_reason_but_keeps_its_metadata() -> None:
    info = error_info([(STATUS_DETAILS_KEY, status_details("A_REASON_FROM_THE_FUTURE", {"k": "v"}))])
    assert info is not None and info.reason is None and info.metadata == {"k": "v"}


@pytest.mark.parametrize("reason", sorted(KNOWN_REASONS))
def test_classification_follows_the_reason_whatever_the_message_says(reason: str) -> None:
    original = shape(_classify(refusal(reason, metadata=METADATA), "n1", OWN_SESSION))
    original_error = type(error_from_status(refusal(reason, metadata=METADATA)))
    for reworded in REWORDINGS:
        again = shape(_classify(refusal(reason, reworded, METADATA), "n1", OWN_SESSION))
        assert again == original, f"{reason} with the message {reworded!r}"
        assert type(error_from_status(refusal(reason, reworded, METADATA))) is original_error


def test_each_reason_gets_the_treatment_it_documents() -> None:
    def classify(reason: str, session: object) -> str:
        return shape(_classify(refusal(reason, metadata=METADATA), "n1", session))  # type: ignore[arg-type]

    assert classify("NOT_LEADER", None) == "redirect to '127.0.0.1:7102'"
    for maybe_applied in ["SHUTTING_DOWN", "COMMIT_UNCERTAIN", "LEADERSHIP_UNCONFIRMED", "READ_NOT_APPLIED"]:
        assert classify(maybe_applied, None) == "lost", f"{maybe_applied} is retried with the same id"
    assert classify("REQUEST_ID_REUSED", None) == "reused: Refused"
    assert classify("OVERLOADED", None) == "later: Overloaded", "tried again after a pause"
    assert classify("RATE_LIMITED", None) == "later: Overloaded", "tried again after a pause"
    assert classify("UNKNOWN_SESSION", OWN_SESSION) == "failed: SessionLost"
    assert classify("SESSION_ENDED", OWN_SESSION) == "failed: SessionLost"
    assert classify("UNKNOWN_SESSION", 8) == "failed: NotFound", "another session"
    assert classify("UNKNOWN_SESSION", None) == "failed: NotFound"
    assert classify("NOT_HOLDER", None) == "failed: Refused"
    assert classify("LIMIT_EXCEEDED", None) == "failed: LimitReached"
    assert classify("QUOTA_EXCEEDED", None) == "failed: LimitReached"
    assert classify("INVALID_ARGUMENT", None) == "failed: InvalidArgument"
    assert classify("WRONG_SESSION_SECRET", None) == "failed: PermissionDenied"
    assert classify("UNAUTHENTICATED", None) == "failed: Unauthenticated"


def test_an_overloaded_refusal_is_tried_again_after_its_retry_after_with_jitter() -> None:
    waits = set()
    for _ in range(200):
        kind, (wait, error) = _classify(refusal("OVERLOADED", "queue full", METADATA), "n1", None)
        assert kind == "later" and isinstance(error, leasehold.Overloaded)
        assert 0.040 <= wait <= 0.060, f"the server asked for 40 ms, the client waits {wait} s"
        waits.add(round(wait, 3))
    assert len(waits) > 5, f"clients refused together come back spread out: {sorted(waits)}"
    assert leasehold.client.pause_after(60_000) <= leasehold.client.RETRY_AFTER_MS_CAP * 1.5 / 1_000


def test_a_status_without_a_reason_is_classed_by_its_code_not_its_message() -> None:
    # A broken connection is UNAVAILABLE too; saying "is not the leader" does not make
    # it a definite refusal.
    transport = FakeRpcError(grpc.StatusCode.UNAVAILABLE, "node 1 is not the leader")
    assert shape(_classify(transport, "n1", None)) == "lost"
    assert shape(_classify(FakeRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"), "n1", None)) == "lost"
    refused = FakeRpcError(grpc.StatusCode.FAILED_PRECONDITION, "was already used for a different command")
    assert shape(_classify(refused, "n1", None)) == "failed: Refused"
    never_sent = FakeRpcError(
        grpc.StatusCode.UNAVAILABLE,
        "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:9: Connection refused",
    )
    assert shape(_classify(never_sent, "n1", None)) == "redirect to None"


def test_a_follower_header_names_the_leader_when_the_details_do_not() -> None:
    error = FakeRpcError(
        grpc.StatusCode.UNAVAILABLE,
        "x",
        [(STATUS_DETAILS_KEY, status_details("NOT_LEADER", {})), ("leasehold-leader", "127.0.0.1:7103")],
    )
    assert shape(_classify(error, "n1", None)) == "redirect to '127.0.0.1:7103'"


def test_errors_say_what_they_are_and_whether_they_may_have_taken_effect() -> None:
    error = error_from_status(refusal("NOT_HOLDER", "token 5 is not the current grant"))
    assert isinstance(error, leasehold.Refused) and error.reason == "NOT_HOLDER" and error.definite
    assert str(error) == "refused: token 5 is not the current grant"
    assert error.code is grpc.StatusCode.FAILED_PRECONDITION
    indeterminate = leasehold.Indeterminate("acquire: n1: Deadline Exceeded")
    assert not indeterminate.definite and "may have taken effect" in str(indeterminate)
    lost = leasehold.SessionLost(9)
    assert lost.session_id == 9 and lost.definite and "session 9 is lost" in str(lost)
    assert not error_from_status(refusal("INTERNAL")).definite
