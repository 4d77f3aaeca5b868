"""Against a real cluster, with faults: a client cut off from the cluster goes into
jeopardy (and `is_valid()` turns False) before the server could expire its session;
a worker paused past its TTL wakes up and its fenced UPDATE to PostgreSQL is refused;
the Raft leader killed during lock cycles costs no second grant."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Tuple

import psycopg
import pytest

import leasehold
from leasehold import SessionState

from cluster import LocalCluster
from proxy import Proxy
from waiting import until

pytestmark = [pytest.mark.cluster]

WORKER = Path(__file__).resolve().parent / "workers" / "fenced_worker.py"


@pytest.fixture
def database(postgres_url: str, unique: Callable[[str], str]) -> Iterator[Tuple[psycopg.Connection, str]]:
    """A connection to the tests' PostgreSQL and a table name of this test's own."""
    table = "t_" + unique("x").replace("/", "_").replace("-", "_")[:50]
    with psycopg.connect(postgres_url, autocommit=True) as connection:
        connection.execute(f"DROP TABLE IF EXISTS {table}")
        yield connection, table
        connection.execute(f"DROP TABLE IF EXISTS {table}")


def monotonic_to_unix_ms(monotonic_s: float) -> float:
    """A `time.monotonic()` moment on the wall clock (both are this machine's)."""
    return (time.time() - time.monotonic() + monotonic_s) * 1_000


def test_a_cut_off_client_is_in_jeopardy_before_the_server_could_expire_its_session(
    cluster: LocalCluster, unique: Callable[[str], str]
) -> None:
    name = unique("lock")
    proxies = [Proxy(endpoint) for endpoint in cluster.endpoints]
    try:
        with cluster.client([proxy.address for proxy in proxies]) as cut_off, cluster.client() as other:
            session = cut_off.session(ttl=3)
            guard = session.lock(name, wait=10)
            created_deadline = session.deadline
            until(
                10, "a keepalive through the proxies to move the deadline", lambda: session.deadline > created_deadline
            )
            signals: List[Tuple[SessionState, float, bool]] = []
            session.on_jeopardy(lambda state: signals.append((state, time.monotonic(), guard.is_valid())))

            for proxy in proxies:
                proxy.cut()
            with other.session(ttl=10) as waiter:
                successor = waiter.lock(name, wait=30)  # Granted once the leader expired the cut-off session.
                grant = other.describe_lock(name).holder
                assert (grant.session_id, grant.token) == (waiter.id, successor.token)
                until(5, "the cut-off session to be published as lost", session.lost.is_set)

                assert [state for state, _, _ in signals] == [SessionState.JEOPARDY, SessionState.LOST]
                (_, jeopardy_at, valid_at_jeopardy), (_, lost_at, valid_at_loss) = signals
                assert not valid_at_jeopardy and not valid_at_loss, "is_valid() is False from the jeopardy on"
                deadline = session.deadline
                assert jeopardy_at < deadline <= lost_at
                # The server stamps a grant with its wall clock when it proposes it: the
                # grant to the waiter came after the cut-off client gave up its lease.
                assert monotonic_to_unix_ms(jeopardy_at) < grant.since_unix_ms
                assert monotonic_to_unix_ms(deadline) <= grant.since_unix_ms + 1
                assert successor.token > guard.token and not guard.is_valid()
                assert session.state is SessionState.LOST
            for proxy in proxies:
                proxy.heal()
    finally:
        for proxy in proxies:
            proxy.close()


class Worker:
    """The fenced worker script in a process of its own, read line by line."""

    def __init__(self, cluster: LocalCluster, arguments: List[str]) -> None:
        self.process = subprocess.Popen(
            [sys.executable, str(WORKER), *arguments],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=cluster.client_env(),
        )
        self._lines: "queue.Queue[str]" = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._lines.put(line)

    def said(self, deadline_s: float, what: str) -> Dict[str, object]:
        try:
            return json.loads(self._lines.get(timeout=deadline_s))
        except queue.Empty:
            stderr = self.process.stderr.read() if self.process.poll() is not None and self.process.stderr else ""
            raise AssertionError(f"the worker did not say {what} within {deadline_s} s {stderr}") from None

    def tell(self, line: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()

    def stop(self) -> None:
        """Ends the process this test started (by its pid), if it still runs."""
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGCONT)
            self.process.kill()
        self.process.wait(timeout=30)


@pytest.mark.postgres
def test_a_worker_paused_past_its_ttl_has_its_fenced_update_refused(
    cluster: LocalCluster,
    client: leasehold.Client,
    database: Tuple[psycopg.Connection, str],
    postgres_url: str,
    unique: Callable[[str], str],
) -> None:
    connection, table = database
    connection.execute(
        f"CREATE TABLE {table} (order_id INT PRIMARY KEY, status TEXT NOT NULL, fence_token BIGINT NOT NULL DEFAULT 0)"
    )
    connection.execute(f"INSERT INTO {table} (order_id, status) VALUES (42, 'pending')")
    name = unique("orders/42")
    worker = Worker(cluster, [name, postgres_url, table, "2"])
    try:
        first = worker.said(30, "its token")
        os.kill(worker.process.pid, signal.SIGSTOP)  # A pause longer than its lease: GC, swap, a stopped VM.

        with client.session(ttl=10) as session:
            with session.lock(name, wait=30) as guard:  # Granted once the paused worker's session expired.
                assert guard.token > first["token"]
                charged = connection.execute(
                    f"UPDATE {table} SET status = 'charged by the new holder', fence_token = %(token)s "
                    "WHERE order_id = 42 AND fence_token < %(token)s",
                    {"token": guard.fencing_token.to_sql_bigint()},
                ).rowcount
                assert charged == 1

                os.kill(worker.process.pid, signal.SIGCONT)
                worker.tell("write")
                late = worker.said(30, "how its write went")
                assert late["rows"] == 0, "the late, fenced write of the paused worker is refused"
                assert late["valid_before_write"] is False, "and its guard said so on waking"
                assert late["state"] == SessionState.LOST.value

                row = connection.execute(f"SELECT status, fence_token FROM {table} WHERE order_id = 42").fetchone()
                assert row == ("charged by the new holder", guard.token), "one charging write, the new holder's"
        worker.process.wait(timeout=30)
    finally:
        worker.stop()


@pytest.mark.postgres
def test_killing_the_leader_during_lock_cycles_costs_no_second_grant(
    cluster: LocalCluster,
    database: Tuple[psycopg.Connection, str],
    postgres_url: str,
    unique: Callable[[str], str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    connection, table = database
    # Counts the attempts that were sent and went unanswered (and so were retried with
    # their request id): the kill must have caught a request in flight.
    unanswered: List[str] = []
    classify = leasehold.client._classify

    def counting(error: object, endpoint: str, session_id: object) -> Tuple[str, object]:
        outcome = classify(error, endpoint, session_id)  # type: ignore[arg-type]
        if outcome[0] == "lost":
            unanswered.append(endpoint)
        return outcome

    monkeypatch.setattr(leasehold.client, "_classify", counting)
    connection.execute(f"CREATE TABLE {table} (id INT PRIMARY KEY, value BIGINT NOT NULL, fence_token BIGINT NOT NULL)")
    connection.execute(f"INSERT INTO {table} VALUES (1, 0, 0)")
    name = unique("cycle")
    stop = threading.Event()
    # The kill comes while one worker holds the lock (inside its cycle) and the other
    # waits for it at the leader: `hold` asks the next holder to stay inside its cycle,
    # `holding` says one does, `go_on` lets it finish.
    hold, holding, go_on = threading.Event(), threading.Event(), threading.Event()
    # (counter value after the write, token), one per cycle; and what went wrong.
    cycles: List[Tuple[int, int]] = []
    errors: List[BaseException] = []
    sessions: List[int] = []
    lock = threading.Lock()

    def work() -> None:
        try:
            with cluster.client() as client, psycopg.connect(postgres_url, autocommit=True) as store:
                with client.session(ttl=5) as session:
                    with lock:
                        sessions.append(session.id)
                    while not stop.is_set():
                        with session.lock(name, wait=20) as guard:
                            token = guard.fencing_token.to_sql_bigint()
                            written = store.execute(
                                f"UPDATE {table} SET value = value + 1, fence_token = %(token)s "
                                "WHERE id = 1 AND fence_token < %(token)s RETURNING value",
                                {"token": token},
                            ).fetchall()
                            assert len(written) == 1, f"the store refused token {token}: a grant out of order"
                            with lock:
                                cycles.append((written[0][0], token))
                                stay = hold.is_set() and not holding.is_set()
                                if stay:
                                    holding.set()
                            if stay:
                                assert go_on.wait(60), "the test never let the holder finish its cycle"
        except BaseException as error:
            with lock:
                errors.append(error)

    workers = [threading.Thread(target=work, daemon=True) for _ in range(2)]
    for thread in workers:
        thread.start()
    killed = None
    try:
        until(30, "five lock cycles before the kill", lambda: len(cycles) >= 5 or errors)
        hold.set()
        until(30, "a worker to hold the lock inside its cycle", lambda: holding.is_set() or errors)
        with cluster.client() as observer:
            until(10, "the other worker to wait for the lock", lambda: len(observer.describe_lock(name).waiters) == 1)
        killed = cluster.wait_for_leader()
        before = len(cycles)
        cluster.kill(killed)
        go_on.set()
        until(40, "five more lock cycles after the leader was killed", lambda: len(cycles) >= before + 5 or errors)
    finally:
        stop.set()
        go_on.set()
        for thread in workers:
            thread.join(60)
        if killed is not None:
            cluster.restart(killed)
            leader = cluster.wait_for_agreed_leader()
            cluster.wait_applied(killed, cluster.status(leader).commit_index)
    assert errors == [], f"a worker failed: {errors!r}"
    assert not any(thread.is_alive() for thread in workers)
    assert (
        killed is not None and cluster.nodes[killed].client_addr in unanswered
    ), "the kill caught the waiting worker's acquire in flight, and it was retried"
    values = [value for value, _ in sorted(cycles)]
    tokens = [token for _, token in sorted(cycles)]
    assert values == list(range(1, len(cycles) + 1)), "every cycle wrote exactly once"
    assert tokens == sorted(set(tokens)), "each grant's token is new and larger than the one before"
    assert connection.execute(f"SELECT value FROM {table}").fetchone() == (len(cycles),)
    with cluster.client() as observer:
        described = observer.describe_lock(name)
        assert not described.HasField("holder") and list(described.waiters) == [], "no grant was left behind"
        for session_id in sessions:
            with pytest.raises(leasehold.NotFound):
                observer.describe_session(session_id)
