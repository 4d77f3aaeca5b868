"""The retry loop without a cluster: leader following, lost answers retried with the
same request, Indeterminate versus Unavailable at the deadline."""

from __future__ import annotations

from typing import Iterator, List

import grpc
import pytest

import leasehold
from leasehold.client import Node

from fakes import FakeRpcError, refusal

ENDPOINTS = ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]
NEVER_CONNECTED = "failed to connect to all addresses; last error: UNKNOWN: Connection refused"


@pytest.fixture
def client() -> Iterator[leasehold.Client]:
    # Plaintext and unreachable: the calls below are fakes, no connection is made.
    client = leasehold.Client(ENDPOINTS, insecure_plaintext=True, request_deadline=0.5)
    yield client
    client.close()


def test_a_follower_sends_the_request_to_the_leader_it_names(client: leasehold.Client) -> None:
    tried: List[str] = []

    def call(node: Node, timeout: float) -> str:
        tried.append(node.endpoint)
        if node.endpoint != "127.0.0.1:3":
            raise refusal("NOT_LEADER", metadata={"leader": "127.0.0.1:3", "leader_id": "3"})
        return "answered"

    assert client._with_leader("test", 1.0, call) == "answered"
    assert tried == ["127.0.0.1:1", "127.0.0.1:3"]
    assert client._preferred_endpoint() == "127.0.0.1:3", "the next request goes to the leader at once"


def test_a_failed_attempt_keeps_the_leader_another_user_of_the_client_learned(client: leasehold.Client) -> None:
    tried: List[str] = []

    def call(node: Node, timeout: float) -> str:
        tried.append(node.endpoint)
        if node.endpoint == "127.0.0.1:1":
            # While this attempt hangs on a dead node, the client's observer (or its
            # keepalive thread) hears from node 2 that node 3 leads.
            client._follow_hint("127.0.0.1:2", refusal("NOT_LEADER", metadata={"leader": "127.0.0.1:3"}))
            raise FakeRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
        if node.endpoint == "127.0.0.1:3":
            return "answered"
        raise AssertionError(f"sent to {node.endpoint}")

    assert client._with_leader("test", 2.0, call) == "answered"
    assert tried == ["127.0.0.1:1", "127.0.0.1:3"], "the failure on node 1 did not move the client off node 3"
    client._rotate("127.0.0.1:3")
    assert client._preferred_endpoint() == "127.0.0.1:1", "a failure on the preferred node itself moves on"


def test_a_lost_answer_is_retried_with_the_same_request(client: leasehold.Client) -> None:
    request_id = client._next_request_id()
    sent: List[object] = []

    def call(node: Node, timeout: float) -> str:
        sent.append(request_id)
        if len(sent) == 1:
            raise FakeRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
        return "the original answer"

    assert client._with_leader("test", 1.0, call) == "the original answer"
    assert len(sent) == 2 and sent[0] is sent[1]
    assert client._next_request_id().sequence == request_id.sequence + 1, "a new command gets a new sequence"


def test_a_request_sent_but_never_answered_is_indeterminate(client: leasehold.Client) -> None:
    def call(node: Node, timeout: float) -> str:
        assert timeout <= 2.0
        raise FakeRpcError(grpc.StatusCode.UNAVAILABLE, "Socket closed")

    with pytest.raises(leasehold.Indeterminate) as raised:
        client._with_leader("acquire", 0.3, call)
    assert not raised.value.definite


def test_a_request_that_reached_no_node_is_unavailable(client: leasehold.Client) -> None:
    def call(node: Node, timeout: float) -> str:
        raise FakeRpcError(grpc.StatusCode.UNAVAILABLE, NEVER_CONNECTED)

    with pytest.raises(leasehold.Unavailable) as raised:
        client._with_leader("acquire", 0.3, call)
    assert raised.value.definite


def test_a_reused_request_id_after_a_lost_answer_is_indeterminate(client: leasehold.Client) -> None:
    attempts: List[int] = []

    def call(node: Node, timeout: float) -> str:
        attempts.append(1)
        if len(attempts) == 1:
            raise FakeRpcError(grpc.StatusCode.UNAVAILABLE, "Connection reset by peer")
        raise refusal("REQUEST_ID_REUSED")

    with pytest.raises(leasehold.Indeterminate):
        client._with_leader("test", 1.0, call)

    def reused_at_once(node: Node, timeout: float) -> str:
        raise refusal("REQUEST_ID_REUSED")

    with pytest.raises(leasehold.Refused):
        client._with_leader("test", 1.0, reused_at_once)


def test_a_definite_refusal_is_not_retried(client: leasehold.Client) -> None:
    attempts: List[int] = []

    def call(node: Node, timeout: float) -> str:
        attempts.append(1)
        raise refusal("NOT_HOLDER")

    with pytest.raises(leasehold.Refused):
        client._with_leader("release", 1.0, call)
    assert len(attempts) == 1


def test_the_end_of_the_waiting_session_is_session_lost(client: leasehold.Client) -> None:
    def call(node: Node, timeout: float) -> str:
        raise refusal("SESSION_ENDED", metadata={"session_id": "41"})

    with pytest.raises(leasehold.SessionLost) as raised:
        client._with_leader("acquire", 1.0, call, session_id=41)
    assert raised.value.session_id == 41
    with pytest.raises(leasehold.Refused):
        client._with_leader("acquire", 1.0, call, session_id=42)


def test_retry_pauses_grow_to_their_bound_and_are_spread_at_random() -> None:
    from leasehold.client import RETRY_PAUSE_MS, RETRY_PAUSE_MS_MAX, RetryPauses

    pauses = RetryPauses()
    step_ms = RETRY_PAUSE_MS
    for _ in range(12):
        pause_ms = pauses.next() * 1_000
        assert step_ms / 2 <= pause_ms <= step_ms, f"{pause_ms} ms from a step of {step_ms} ms"
        step_ms = min(step_ms * 2, RETRY_PAUSE_MS_MAX)
    # Clients that start retrying together do not all wait the same.
    firsts = {round(RetryPauses().next() * 1_000, 3) for _ in range(200)}
    assert len(firsts) > 5, firsts
