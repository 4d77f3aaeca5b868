"""Against a real cluster: TLS and credentials, leader following, typed errors from
the server, sessions kept alive past their TTL, and closing."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Callable, List

import grpc
import pytest

import leasehold
from leasehold.proto import messages

from cluster import LocalCluster
from waiting import until

pytestmark = pytest.mark.cluster


def test_a_client_connects_over_tls_with_the_tenants_token(cluster: LocalCluster) -> None:
    with leasehold.Client.connect(
        cluster.endpoints, ca_certificate=cluster.ca_file.read_bytes(), token=cluster.token_file.read_text().strip()
    ) as client:
        status = client.status()
        assert status.cluster_name == cluster.cluster_name and not status.insecure_plaintext
        with client.session(ttl=5) as session:
            assert session.id > 0 and session.ttl == 5.0 and len(session.secret) == 16


def test_an_unknown_token_is_refused_as_unauthenticated(cluster: LocalCluster) -> None:
    with leasehold.Client(
        cluster.endpoints, ca_certificate=cluster.ca_file.read_bytes(), token="tok_never_issued_0123456789"
    ) as client:
        with pytest.raises(leasehold.Unauthenticated) as raised:
            client.session(ttl=5)
        assert raised.value.reason == "UNAUTHENTICATED" and raised.value.definite


def test_a_client_that_trusts_another_ca_reaches_no_node(cluster: LocalCluster, tmp_path: Path) -> None:
    made = subprocess.run([str(cluster.cli), "cert", "ca", str(tmp_path)], capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    with leasehold.Client(
        cluster.endpoints,
        ca_certificate=(tmp_path / "ca.pem").read_bytes(),
        token=cluster.token_file.read_text().strip(),
        request_deadline=1.5,
    ) as client:
        with pytest.raises(leasehold.Unavailable) as raised:
            client.session(ttl=5)
        assert raised.value.definite, "a request that never got through a handshake was never applied"


def test_the_client_follows_the_leader_named_by_a_follower(cluster: LocalCluster) -> None:
    leader = cluster.wait_for_agreed_leader()
    followers = [node.client_addr for node in cluster.nodes.values() if node.id != leader]
    leader_addr = cluster.nodes[leader].client_addr
    with cluster.client(followers + [leader_addr]) as client:
        assert client._preferred_endpoint() == followers[0]
        with client.session(ttl=5):
            assert client._preferred_endpoint() == leader_addr


def test_a_follower_names_the_leader_in_its_typed_error(cluster: LocalCluster) -> None:
    leader = cluster.wait_for_agreed_leader()
    follower = next(node for node in cluster.nodes.values() if node.id != leader)
    with cluster.client([follower.client_addr]) as client:
        stub = client.raw_node(follower.client_addr).leasehold
        request = messages.CreateSessionRequest(request_id=client._next_request_id(), ttl_ms=5_000)
        with pytest.raises(grpc.RpcError) as raised:
            stub.CreateSession(request, timeout=5, metadata=client.metadata)
        error = leasehold.errors.error_from_status(raised.value)
        assert isinstance(error, leasehold.Unavailable) and error.reason == "NOT_LEADER"
        assert error.metadata["leader"] == cluster.nodes[leader].client_addr
        assert error.metadata["leader_id"] == str(leader)


def test_a_session_scoped_request_needs_the_sessions_secret(
    client: leasehold.Client, unique: Callable[[str], str]
) -> None:
    with client.session(ttl=5) as session:
        forged = messages.AcquireRequest(
            request_id=client._next_request_id(),
            session_id=session.id,
            name=unique("lock"),
            session_secret=b"\x00" * 16,
        )

        def call(node: leasehold.client.Node, timeout: float) -> messages.AcquireResponse:
            return node.leasehold.Acquire(forged, timeout=timeout, metadata=client.metadata)

        with pytest.raises(leasehold.PermissionDenied) as raised:
            client._with_leader("forged acquire", 5.0, call)
        assert raised.value.reason == "WRONG_SESSION_SECRET"
        assert client.describe_lock(unique("lock")).HasField("holder") is False, "nothing changed"


def test_keepalives_keep_a_session_alive_well_past_its_ttl(client: leasehold.Client) -> None:
    states: List[leasehold.SessionState] = []
    with client.session(ttl=2) as session:
        session.on_jeopardy(states.append)
        created_deadline = session.deadline
        until(
            20,
            "keepalives to carry the deadline three TTLs past the first one",
            lambda: session.deadline >= created_deadline + 3 * session.ttl,
        )
        assert session.state is leasehold.SessionState.ALIVE and session.is_valid()
        assert client.describe_session(session.id).session_id == session.id, "the server still knows it"
        assert 0 < session.time_left() <= session.ttl
        assert states == [], "a session whose keepalives are answered is never in jeopardy"


def test_a_closed_session_releases_its_locks_at_once(client: leasehold.Client, unique: Callable[[str], str]) -> None:
    name = unique("lock")
    first = client.session(ttl=30)
    guard = first.try_lock(name)
    assert guard is not None
    with client.session(ttl=30) as second:
        assert second.try_lock(name) is None
        first.close()
        assert first.state is leasehold.SessionState.LOST and first.lost.is_set() and not guard.is_valid()
        successor = second.try_lock(name)
        assert successor is not None and successor.token > guard.token, "released at once, not after the TTL"
    with pytest.raises(leasehold.NotFound):
        client.describe_session(first.id)


def test_closing_the_client_closes_its_sessions(cluster: LocalCluster, unique: Callable[[str], str]) -> None:
    name = unique("lock")
    with cluster.client() as owner:
        session = owner.session(ttl=30)
        assert session.try_lock(name) is not None
    with cluster.client() as other:
        with other.session(ttl=30) as taker:
            assert taker.try_lock(name) is not None
        with pytest.raises(leasehold.NotFound):
            other.describe_session(session.id)


def test_sessions_of_one_client_share_one_keepalive_thread_and_stream(client: leasehold.Client) -> None:
    sessions = [client.session(ttl=2) for _ in range(5)]
    keepalive = client._keepalive
    assert keepalive is not None
    try:
        first_deadlines = [session.deadline for session in sessions]
        until(
            10,
            "every session's deadline to move forward",
            lambda: all(session.deadline > first for session, first in zip(sessions, first_deadlines)),
        )
        # One stream at a time; it is opened again only to follow the leader.
        assert client._keepalive is keepalive and keepalive._streams <= len(client.endpoints)
    finally:
        for session in sessions:
            session.close()
    until(5, "the keepalive thread to stop with the last session", lambda: client._keepalive is None)
    keepalive._thread.join(5)
    assert not keepalive._thread.is_alive(), "an idle client holds no thread"
    with client.session(ttl=2) as again:
        assert again.is_valid() and client._keepalive is not None and client._keepalive is not keepalive
