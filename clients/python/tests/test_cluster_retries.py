"""Against a real cluster: a retry after a lost answer carries the same request id
and gets the original grant, never a second one; the server answers a repeated
request id with its stored result and refuses it for another command; a request
the cluster could not answer in time is Indeterminate and took effect at most once."""

from __future__ import annotations

from typing import Any, Callable, Dict, List

import grpc
import pytest

import leasehold
from leasehold.proto import messages

from cluster import LocalCluster
from fakes import FakeRpcError
from waiting import until

pytestmark = pytest.mark.cluster


class LoseFirstAnswer:
    """Wraps a stub method: the first call reaches the server, and its answer is then
    lost (the client sees a deadline, as if the response never came back)."""

    def __init__(self, method: Callable[..., Any], record: List[Dict[str, Any]]) -> None:
        self._method = method
        self._record = record

    def __call__(self, request: Any, **options: Any) -> Any:
        answer = self._method(request, **options)
        self._record.append(
            {"request_id": (request.request_id.client_id, request.request_id.sequence), "answer": answer}
        )
        if len(self._record) == 1:
            raise FakeRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
        return answer


def lose_first_answer(client: leasehold.Client, service: str, method: str) -> List[Dict[str, Any]]:
    """Makes the first `service.method` call of `client` lose its answer, on every
    node; returns the record of the calls that reached a server."""
    record: List[Dict[str, Any]] = []
    for endpoint in client.endpoints:
        stubs = getattr(client.raw_node(endpoint), service)
        setattr(stubs, method, LoseFirstAnswer(getattr(stubs, method), record))
    return record


def test_a_lost_acquire_answer_is_retried_and_gets_the_original_grant(
    cluster: LocalCluster, unique: Callable[[str], str]
) -> None:
    name = unique("lock")
    with cluster.client() as client, cluster.client() as observer:
        with client.session(ttl=10) as session:
            record = lose_first_answer(client, "leasehold", "Acquire")
            guard = session.lock(name, wait=10)
            assert len(record) == 2, "the first answer was lost, the retry answered"
            assert record[0]["request_id"] == record[1]["request_id"], "the retry carries the same request id"
            assert guard.token == record[0]["answer"].granted.token == record[1]["answer"].granted.token
            holder = observer.describe_lock(name).holder
            assert (holder.session_id, holder.token) == (session.id, guard.token), "one grant, the original"
            guard.release()
            assert observer.check_fence(name, guard.token) == leasehold.FenceCheck(False, 0)


def test_a_lost_semaphore_answer_is_retried_and_gets_one_permit(
    cluster: LocalCluster, unique: Callable[[str], str]
) -> None:
    name = unique("sem")
    with cluster.client() as client:
        with client.session(ttl=10) as session:
            record = lose_first_answer(client, "semaphores", "Acquire")
            permit = session.semaphore(name, 3).acquire(wait=10)
            assert len(record) == 2 and record[0]["request_id"] == record[1]["request_id"]
            holders = client.describe_semaphore(name).holders
            assert [(holder.session_id, holder.token) for holder in holders] == [(session.id, permit.token)]


def test_a_lost_release_answer_is_retried_without_an_error(cluster: LocalCluster, unique: Callable[[str], str]) -> None:
    name = unique("lock")
    with cluster.client() as client:
        with client.session(ttl=10) as session:
            guard = session.lock(name, wait=10)
            record = lose_first_answer(client, "leasehold", "Release")
            guard.release()  # The retry gets the stored answer, not NOT_HOLDER.
            assert len(record) == 2 and record[0]["request_id"] == record[1]["request_id"]
            assert not client.describe_lock(name).HasField("holder")


def test_the_server_answers_a_repeated_request_id_with_the_original_result(
    client: leasehold.Client, unique: Callable[[str], str]
) -> None:
    name = unique("lock")
    with client.session(ttl=10) as session:
        acquire = messages.AcquireRequest(
            request_id=client._next_request_id(), session_id=session.id, name=name, session_secret=session.secret
        )

        def send(request: messages.AcquireRequest) -> messages.AcquireResponse:
            return client._with_leader(
                "acquire",
                5.0,
                lambda node, timeout: node.leasehold.Acquire(request, timeout=timeout, metadata=client.metadata),
            )

        first = send(acquire)
        assert first.WhichOneof("outcome") == "granted"
        leasehold.lock.LockGuard(session, name, first.granted.token).release()
        again = send(acquire)
        assert again == first, "the stored answer, not a new grant"
        assert not client.describe_lock(name).HasField("holder"), "the repeat granted nothing"

        other = messages.AcquireRequest()
        other.CopyFrom(acquire)
        other.name = unique("another-lock")
        with pytest.raises(leasehold.Refused) as raised:
            send(other)
        assert raised.value.reason == "REQUEST_ID_REUSED"
        assert not client.describe_lock(other.name).HasField("holder")


def test_a_request_the_cluster_cannot_answer_is_indeterminate_and_takes_effect_at_most_once(
    cluster: LocalCluster, unique: Callable[[str], str]
) -> None:
    name = unique("lock")
    with cluster.client(request_deadline=2.5) as client:
        with client.session(ttl=30) as session:
            for node_id in cluster.nodes:
                cluster.pause(node_id)
            try:
                with pytest.raises(leasehold.Indeterminate) as raised:
                    session.try_lock(name)
                assert not raised.value.definite
            finally:
                for node_id in cluster.nodes:
                    cluster.resume(node_id)
            cluster.wait_for_agreed_leader()
            # Whatever the lost attempts did, acquiring again yields one grant.
            client.request_deadline = 10.0
            guard = until(15, "the lock to be granted once the cluster answers", lambda: session.try_lock(name))
            holder = client.describe_lock(name).holder
            assert (holder.session_id, holder.token) == (session.id, guard.token)
            assert client.describe_lock(name).waiters == []
            assert session.is_valid(), "the session outlived the pause"
