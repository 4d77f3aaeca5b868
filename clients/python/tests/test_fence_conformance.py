"""The fenced-write contract (docs/fenced-writes.md), one body of cases run unchanged
against every adapter: PostgreSQL, SQLite, MariaDB, Redis, etcd and S3 (the tests'
stores, scripts/stores.sh; S3 is moto's server), and `HttpFence` against the fenced
key-value service served by wsgiref and by uvicorn. Each test names resources of its
own: the stores are shared by concurrent runs and keep their data."""

from __future__ import annotations

import re
import sqlite3
import subprocess
import sys
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterator, List, Union

import pytest

from fence_kits import KINDS, Kit, restartable_kit, shared_kit

from leasehold.fence import (
    Accepted,
    FenceError,
    FenceTokenError,
    FencedStore,
    FencingToken,
    FencingTokenError,
    Mode,
    Outcome,
    Record,
    Superseded,
    validate_resource,
    validate_token,
)
from leasehold.fence.sqlite import SqliteFence

ONCE, MANY = Mode.ONCE_PER_GRANT, Mode.MANY_PER_GRANT
TOP = 2**63 - 1
#: Rounds of two writers racing.
RACE_ROUNDS = 20


def T(value: int) -> FencingToken:
    return FencingToken(value)


@pytest.fixture(params=KINDS)
def kit(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Kit]:
    made = shared_kit(request.param, request.getfixturevalue, tmp_path)
    try:
        yield made
    finally:
        made.close()


@pytest.fixture(params=KINDS)
def restartable(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Kit]:
    made, stop = restartable_kit(request.param, request.getfixturevalue, tmp_path)
    try:
        yield made
    finally:
        try:
            made.close()
        finally:
            stop()


@pytest.fixture(params=[ONCE, MANY], ids=["once", "many"])
def mode(request: pytest.FixtureRequest) -> Mode:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def resource(request: pytest.FixtureRequest) -> Callable[[str], str]:
    """Resource names of this test's own, with characters every store and the HTTP path
    must carry unchanged."""
    prefix = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:80]
    run = uuid.uuid4().hex[:12]
    return lambda name: f"py/{prefix}/{run}/{name} ü🔒?#%2F+&="


# Without a store.


def test_importing_the_fence_needs_no_driver() -> None:
    code = (
        "import sys, leasehold.fence, leasehold.fence.sqlite, leasehold.fence.etcd, leasehold.fence.http,"
        " leasehold.fence.s3;"
        "print(sorted(m for m in ('psycopg', 'pymysql', 'redis', 'uvicorn', 'boto3', 'botocore') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_the_outcome_is_a_value() -> None:
    assert Superseded(seen=T(7), ours=T(7)).is_ours and not Superseded(seen=T(8), ours=T(7)).is_ours
    assert Accepted() == Accepted() and Mode("once") is ONCE and Mode("many") is MANY
    assert Record(T(3), None) != Record(T(3), b"")
    from leasehold.fence.etcd import EtcdFence
    from leasehold.fence.http import HttpFence

    assert isinstance(EtcdFence("http://127.0.0.1:1"), FencedStore)
    assert isinstance(HttpFence("http://127.0.0.1:1"), FencedStore)


def test_tokens_and_resources_are_checked_by_the_rules_of_the_contract() -> None:
    assert validate_token(1) == T(1) and validate_token(T(TOP)) == T(TOP)
    for bad in [0, -1, TOP + 1, T(0), T(TOP + 1), True, 1.0, "5", None]:
        with pytest.raises(FenceTokenError) as raised:
            validate_token(bad)  # type: ignore[arg-type]
        assert isinstance(raised.value, FenceError) and isinstance(raised.value, FencingTokenError)
    assert validate_resource("é" * 256) == "é" * 256
    for bad_resource in ["", "é" * 256 + "x", "x" * 513, "\ud800", b"bytes", None]:
        with pytest.raises(FenceError):
            validate_resource(bad_resource)  # type: ignore[arg-type]


# The contract, against every store.


@pytest.mark.fence
def test_a_first_write_creates_the_record(kit: Kit, resource: Callable[[str], str]) -> None:
    store = kit.make()
    name = resource("first")
    assert store.read(name) is None
    assert store.write(name, 17, ONCE, b"first value") == Accepted()
    assert store.read(name) == Record(T(17), b"first value")


@pytest.mark.fence
def test_values_are_bytes_and_an_empty_one_is_a_value(kit: Kit, resource: Callable[[str], str]) -> None:
    store = kit.make()
    every_byte, empty = resource("every byte"), resource("empty")
    assert store.write(every_byte, 5, MANY, bytes(range(256)) * 4) == Accepted()
    assert store.read(every_byte) == Record(T(5), bytes(range(256)) * 4)
    assert store.write(empty, 5, MANY, bytearray()) == Accepted()  # type: ignore[arg-type]
    assert store.read(empty) == Record(T(5), b"")


@pytest.mark.fence
def test_an_older_token_is_refused_and_changes_nothing(kit: Kit, mode: Mode, resource: Callable[[str], str]) -> None:
    store = kit.make()
    name = resource("older")
    assert store.write(name, 20, mode, b"newer") == Accepted()
    refused = store.write(name, 19, mode, b"older")
    assert refused == Superseded(seen=T(20), ours=T(19)) and not refused.is_ours  # type: ignore[union-attr]
    assert store.advance(name, 1, mode) == Superseded(seen=T(20), ours=T(1))
    assert store.read(name) == Record(T(20), b"newer")


@pytest.mark.fence
def test_the_same_token_writes_once_or_many_times_by_mode(kit: Kit, resource: Callable[[str], str]) -> None:
    store = kit.make()
    name = resource("same")
    assert store.write(name, 30, ONCE, b"one") == Accepted()
    again = store.write(name, 30, ONCE, b"two")
    assert again == Superseded(seen=T(30), ours=T(30)) and again.is_ours  # type: ignore[union-attr]
    assert store.read(name) == Record(T(30), b"one")
    assert store.write(name, 30, MANY, b"three") == Accepted()
    assert store.write(name, 30, MANY, b"four") == Accepted()
    assert store.read(name) == Record(T(30), b"four")
    assert store.write(name, 31, ONCE, b"next grant") == Accepted()
    assert store.write(name, 30, MANY, b"shut out") == Superseded(seen=T(31), ours=T(30))
    assert store.read(name) == Record(T(31), b"next grant")


@pytest.mark.fence
def test_advance_moves_the_fence_and_leaves_the_value(kit: Kit, resource: Callable[[str], str]) -> None:
    store = kit.make()
    fresh, written = resource("fresh"), resource("written")
    assert store.advance(fresh, 40, ONCE) == Accepted()
    assert store.read(fresh) == Record(T(40), None), "a resource first advanced has no value"
    assert store.advance(fresh, 40, ONCE) == Superseded(seen=T(40), ours=T(40))
    assert store.advance(fresh, 40, MANY) == Accepted()
    assert store.write(fresh, 40, ONCE, b"x") == Superseded(seen=T(40), ours=T(40))
    assert store.write(fresh, 40, MANY, b"value after advance") == Accepted()
    assert store.read(fresh) == Record(T(40), b"value after advance")

    assert store.write(written, 41, ONCE, b"kept") == Accepted()
    assert store.advance(written, 45, ONCE) == Accepted()
    assert store.read(written) == Record(T(45), b"kept")
    assert store.write(written, 44, MANY, b"stale") == Superseded(seen=T(45), ours=T(44))
    assert store.write(written, 43, ONCE, b"stale") == Superseded(seen=T(45), ours=T(43))
    assert store.read(written) == Record(T(45), b"kept")


@pytest.mark.fence
def test_two_writers_in_sequence_in_both_orders(kit: Kit, mode: Mode, resource: Callable[[str], str]) -> None:
    first, second = kit.make(), kit.make()
    ordered, reversed_ = resource("t1 then t2"), resource("t2 then t1")
    assert first.write(ordered, 50, mode, b"t1") == Accepted()
    assert second.write(ordered, 51, mode, b"t2") == Accepted()
    assert first.read(ordered) == Record(T(51), b"t2")

    assert second.write(reversed_, 51, mode, b"t2") == Accepted()
    assert first.write(reversed_, 50, mode, b"t1") == Superseded(seen=T(51), ours=T(50))
    assert first.read(reversed_) == Record(T(51), b"t2")


@pytest.mark.fence
def test_two_writers_racing_leave_the_newer_token(kit: Kit, mode: Mode, resource: Callable[[str], str]) -> None:
    """Each round, two writers on connections of their own start together on a fresh
    resource, t1 < t2 (which writer has t1 alternates). t2 always lands and its value
    remains; t1 lands only if it came first, and is refused with t2 otherwise."""
    writers = [kit.make(), kit.make()]
    refused_t1 = 0
    with ThreadPoolExecutor(max_workers=2) as pool:
        for round_ in range(RACE_ROUNDS):
            name = resource(f"race {round_}")
            t1, t2 = 1000 + 2 * round_, 1001 + 2 * round_
            older, newer = writers[round_ % 2], writers[1 - round_ % 2]
            start = threading.Barrier(2, timeout=30)

            def write(store: FencedStore, token: int, value: bytes) -> Outcome:
                start.wait()
                return store.write(name, token, mode, value)

            first = pool.submit(write, older, t1, b"t1")
            second = pool.submit(write, newer, t2, b"t2")
            outcome_t1, outcome_t2 = first.result(timeout=60), second.result(timeout=60)
            assert outcome_t2 == Accepted(), f"round {round_}"
            assert outcome_t1 in (Accepted(), Superseded(seen=T(t2), ours=T(t1))), f"round {round_}: {outcome_t1}"
            refused_t1 += outcome_t1 != Accepted()
            assert older.read(name) == Record(T(t2), b"t2"), f"round {round_}"
    print(f"{kit.kind}: t1 was refused in {refused_t1} of {RACE_ROUNDS} rounds")


@pytest.mark.fence
def test_the_largest_token_and_tokens_out_of_range(kit: Kit, resource: Callable[[str], str]) -> None:
    store = kit.make()
    name = resource("range")
    assert store.write(name, TOP, ONCE, b"top") == Accepted()
    assert store.read(name) == Record(T(TOP), b"top")
    assert store.write(name, TOP - 1, MANY, b"below") == Superseded(seen=T(TOP), ours=T(TOP - 1))
    assert store.write(name, T(TOP), MANY, b"top again") == Accepted()
    for bad in [TOP + 1, 0, -1, T(TOP + 1), T(0), 2**64, True]:
        with pytest.raises(FenceTokenError):
            store.write(name, bad, MANY, b"out of range")  # type: ignore[arg-type]
        with pytest.raises(FenceTokenError):
            store.advance(name, bad, MANY)  # type: ignore[arg-type]
    assert store.read(name) == Record(T(TOP), b"top again")


@pytest.mark.fence
def test_tokens_beyond_two_to_the_53_compare_exactly(kit: Kit, resource: Callable[[str], str]) -> None:
    """Equal as doubles, different as tokens: a store comparing floats fails here."""
    store = kit.make()
    down, up = resource("down"), resource("up")
    assert store.write(down, 2**53 + 1, ONCE, b"2^53+1") == Accepted()
    assert store.write(down, 2**53, MANY, b"2^53") == Superseded(seen=T(2**53 + 1), ours=T(2**53))
    assert store.read(down) == Record(T(2**53 + 1), b"2^53+1")
    assert store.write(up, 2**53, ONCE, b"2^53") == Accepted()
    assert store.write(up, 2**53 + 1, ONCE, b"2^53+1") == Accepted()
    assert store.read(up) == Record(T(2**53 + 1), b"2^53+1")
    assert store.write(up, 10**18, ONCE, b"10^18") == Accepted()
    assert store.write(up, 9 * 10**17, MANY, b"9*10^17") == Superseded(seen=T(10**18), ours=T(9 * 10**17))


@pytest.mark.fence
def test_resource_names_of_1_to_512_bytes(kit: Kit, resource: Callable[[str], str]) -> None:
    store = kit.make()
    base = resource("long")
    longest = base + "é" * ((512 - len(base.encode())) // 2) + "x" * ((512 - len(base.encode())) % 2)
    assert len(longest.encode()) == 512
    assert store.write(longest, 3, ONCE, b"512 bytes") == Accepted()
    assert store.read(longest) == Record(T(3), b"512 bytes")
    for bad in ["", longest + "x", "x" * 513]:
        with pytest.raises(FenceError):
            store.write(bad, 4, ONCE, b"bad name")
        with pytest.raises(FenceError):
            store.advance(bad, 4, ONCE)
        with pytest.raises(FenceError):
            store.read(bad)
    assert store.read(longest) == Record(T(3), b"512 bytes")


@pytest.mark.fence
def test_a_trailing_space_names_another_resource(kit: Kit, resource: Callable[[str], str]) -> None:
    """Resource names compare as bytes in every store (MySQL's VARBINARY: a
    `utf8mb4_bin` VARCHAR would pad spaces, so that 'a' and 'a ' shared a fence)."""
    store = kit.make()
    name = resource("spaced")
    assert store.write(name, 60, ONCE, b"no space") == Accepted()
    assert store.write(name + " ", 50, ONCE, b"trailing space") == Accepted()
    assert store.read(name) == Record(T(60), b"no space")
    assert store.read(name + " ") == Record(T(50), b"trailing space")


@pytest.mark.fence
def test_bad_input_is_refused_before_the_store_is_touched(kit: Kit, resource: Callable[[str], str]) -> None:
    """Against a store that cannot be reached, bad input fails validation (it never
    got as far as the store); good input fails as the store failure it is."""
    dead = kit.unreachable()
    name = resource("dead")
    tokens: List[Union[int, FencingToken]] = [0, -1, TOP + 1, T(TOP + 1)]
    for token in tokens:
        with pytest.raises(FenceTokenError):
            dead.write(name, token, ONCE, b"x")
        with pytest.raises(FenceTokenError):
            dead.advance(name, token, MANY)
    for bad_resource in ["", "x" * 513]:
        with pytest.raises(FenceError, match="bytes of UTF-8"):
            dead.write(bad_resource, 1, ONCE, b"x")
    with pytest.raises(FenceError, match="is bytes"):
        dead.write(name, 1, ONCE, "not bytes")  # type: ignore[arg-type]
    with pytest.raises(FenceError, match="not a fence mode"):
        dead.write(name, 1, "sometimes", b"x")  # type: ignore[arg-type]
    for call in (
        lambda: dead.write(name, 1, ONCE, b"x"),
        lambda: dead.advance(name, 1, MANY),
        lambda: dead.read(name),
    ):
        with pytest.raises(FenceError) as raised:
            call()
        assert not isinstance(raised.value, FenceTokenError)
    assert kit.make().read(name) is None


@pytest.mark.fence
def test_a_write_whose_answer_was_lost_is_retried_with_the_same_token(
    kit: Kit, mode: Mode, resource: Callable[[str], str]
) -> None:
    name = resource("lost answer")
    kit.write_losing_answer(name, 70, mode, b"lost answer")
    retried = kit.make().write(name, 70, mode, b"lost answer")
    if mode is ONCE:
        assert retried == Superseded(seen=T(70), ours=T(70)) and retried.is_ours  # type: ignore[union-attr]
    else:
        assert retried == Accepted()
    assert kit.make().read(name) == Record(T(70), b"lost answer")


@pytest.mark.fence
def test_the_fence_survives_a_restart_of_the_store(restartable: Kit, resource: Callable[[str], str]) -> None:
    name, advanced = resource("restart"), resource("restart advanced")
    before = restartable.make()
    assert before.write(name, 80, ONCE, b"before the restart") == Accepted()
    assert before.advance(advanced, 90, ONCE) == Accepted()
    restartable.restart()
    after = restartable.make()
    assert after.read(name) == Record(T(80), b"before the restart")
    assert after.read(advanced) == Record(T(90), None)
    assert after.write(name, 79, MANY, b"stale") == Superseded(seen=T(80), ours=T(79))
    assert after.write(name, 80, ONCE, b"retry") == Superseded(seen=T(80), ours=T(80))
    assert after.write(name, 81, ONCE, b"after the restart") == Accepted()
    assert after.read(name) == Record(T(81), b"after the restart")


# guard: the fence inside the caller's own transaction (the SQL stores).


class _Transactions:
    """The caller's side of `guard` in one SQL store: its own connection, on which
    `run(statements)` opens a transaction, runs them on one cursor and commits, or
    rolls back when they return False."""

    def __init__(self, kind: str, request: pytest.FixtureRequest, path: Path) -> None:
        self.kind = kind
        if kind == "postgres":
            import psycopg

            from leasehold.fence.postgres import PostgresFence

            url = request.getfixturevalue("postgres_url")
            self.fence: Any = PostgresFence(url)
            self.connection: Any = psycopg.connect(url)
            self.autocommit: Any = psycopg.connect(url, autocommit=True)
            self.insert = "INSERT INTO leasehold_fence (resource, token, value) VALUES (%s, %s, %s)"
        elif kind == "mysql":
            import pymysql

            from leasehold.fence.mysql import MysqlFence, connection_arguments

            url = request.getfixturevalue("mariadb_url")
            self.fence = MysqlFence(url)
            self.connection = pymysql.connect(**connection_arguments(url), autocommit=False)
            self.autocommit = pymysql.connect(**connection_arguments(url), autocommit=True)
            self.insert = "INSERT INTO leasehold_fence (resource, token, value) VALUES (%s, %s, %s)"
        else:
            self.fence = SqliteFence(path / "guarded.sqlite3")
            self.connection = sqlite3.connect(path / "guarded.sqlite3", isolation_level=None)
            self.autocommit = self.connection
            self.insert = "INSERT INTO leasehold_fence (resource, token, value) VALUES (?, ?, ?)"
        self.fence.create_table()

    def run(self, statements: Callable[[Any], bool]) -> None:
        if self.kind == "postgres":
            import psycopg

            with self.connection.transaction():
                with self.connection.cursor() as cursor:
                    if not statements(cursor):
                        raise psycopg.Rollback()
        elif self.kind == "mysql":
            self.connection.begin()
            with self.connection.cursor() as cursor:
                commit = statements(cursor)
            self.connection.commit() if commit else self.connection.rollback()
        else:
            self.connection.execute("BEGIN IMMEDIATE")
            commit = statements(self.connection.cursor())
            self.connection.execute("COMMIT" if commit else "ROLLBACK")

    def outside_a_transaction(self) -> Any:
        """A cursor on which a statement commits on its own."""
        return self.autocommit.cursor()

    def close(self) -> None:
        for closing in (self.fence, self.connection, self.autocommit):
            closing.close()


@pytest.fixture(params=["postgres", "sqlite", "mysql"])
def transactions(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[_Transactions]:
    made = _Transactions(request.param, request, tmp_path)
    try:
        yield made
    finally:
        made.close()


@pytest.mark.fence
def test_guard_fences_the_callers_transaction(transactions: _Transactions, resource: Callable[[str], str]) -> None:
    fence = transactions.fence
    name, paid, stale_payment = resource("guarded"), resource("payment"), resource("stale payment")
    assert fence.write(name, 10, ONCE, b"kept value") == Accepted()
    outcomes: List[Outcome] = []

    def fenced_payment(cursor: Any) -> bool:
        outcomes.append(fence.guard(cursor, name, 11, ONCE))
        cursor.execute(transactions.insert, (paid, 1, b"paid"))
        return outcomes[-1] == Accepted()

    transactions.run(fenced_payment)
    assert outcomes == [Accepted()]
    assert fence.read(name) == Record(T(11), b"kept value"), "guard moves the fence and leaves the value"
    assert fence.read(paid) == Record(T(1), b"paid")

    def stale(cursor: Any) -> bool:
        cursor.execute(transactions.insert, (stale_payment, 1, b"must not stay"))
        outcomes.append(fence.guard(cursor, name, 10, MANY))
        return outcomes[-1] == Accepted()

    transactions.run(stale)
    assert outcomes[-1] == Superseded(seen=T(11), ours=T(10))
    assert fence.read(stale_payment) is None, "the caller rolled its transaction back"
    assert fence.read(name) == Record(T(11), b"kept value")

    with pytest.raises(FenceError, match="caller's transaction"):
        fence.guard(transactions.outside_a_transaction(), name, 12, ONCE)
    assert fence.read(name) == Record(T(11), b"kept value")


@pytest.mark.fence
@pytest.mark.parametrize("kind", ["postgres", "mysql"])
def test_guard_reports_the_token_that_refused_it_not_its_snapshot(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path, resource: Callable[[str], str]
) -> None:
    """The caller's transaction read the row before a newer grant wrote it (MariaDB's
    REPEATABLE READ keeps that snapshot): `seen` is still the token that refused us."""
    transactions = _Transactions(kind, request, tmp_path)
    try:
        fence = transactions.fence
        name = resource("snapshot")
        assert fence.write(name, 3, ONCE, b"old") == Accepted()
        outcomes: List[Outcome] = []

        def late(cursor: Any) -> bool:
            cursor.execute("SELECT token FROM leasehold_fence WHERE resource = %s", (name,))
            assert [tuple(row) for row in cursor.fetchall()] == [(3,)]  # the transaction's snapshot
            assert fence.write(name, 20, ONCE, b"newer grant") == Accepted()  # another connection
            outcomes.append(fence.guard(cursor, name, 15, ONCE))
            return False

        transactions.run(late)
        assert outcomes == [Superseded(seen=T(20), ours=T(15))]
        assert fence.read(name) == Record(T(20), b"newer grant")
    finally:
        transactions.close()


# S3: the object layout shared with the Rust adapter, and what only S3 has.


def _s3_client(url: str) -> Any:
    """A boto3 client of the tests' S3 that bypasses the adapter (path-style)."""
    import boto3  # type: ignore[import-untyped,unused-ignore]
    from botocore.config import Config  # type: ignore[import-untyped,unused-ignore]

    from leasehold.fence.s3 import client_arguments

    arguments = client_arguments(url)
    arguments.pop("bucket")
    return boto3.session.Session().client("s3", config=Config(s3={"addressing_style": "path"}), **arguments)


def test_s3_urls_are_checked() -> None:
    from leasehold.fence.s3 import S3Fence, client_arguments

    assert client_arguments("https://AK%2F1:s%2Bcr%40t@s3.example:9000/fences?region=eu-west-3") == {
        "bucket": "fences",
        "endpoint_url": "https://s3.example:9000",
        "region_name": "eu-west-3",
        "aws_access_key_id": "AK/1",
        "aws_secret_access_key": "s+cr@t",
    }
    assert client_arguments("http://k:s@[::1]:19000/b")["endpoint_url"] == "http://[::1]:19000"
    assert client_arguments("http://k:s@127.0.0.1:19000/b")["region_name"] == "us-east-1"
    for bad in [
        "s3://k:s@127.0.0.1:19000/b",
        "http://127.0.0.1:19000/b",
        "http://k@127.0.0.1:19000/b",
        "http://k:s@127.0.0.1:19000/",
        "http://k:s@127.0.0.1:19000/b/c",
        "http://k:s@127.0.0.1:19000/b?region=",
        "http://k:s@127.0.0.1:19000/b?endpoint=x",
        "http://k:s@127.0.0.1:19000/b#x",
        "http://k:s@127.0.0.1:port/b",
    ]:
        with pytest.raises(FenceError):
            S3Fence.from_url(bad)
    with pytest.raises(FenceError, match="boto3 S3 client"):
        S3Fence(object(), "b")


@pytest.mark.fence
def test_s3_objects_have_the_shared_layout(s3_url: str, resource: Callable[[str], str]) -> None:
    """Key `leasehold/fence/<resource>`; body `LHF1`, 20 digits, `v` or `-`, a newline,
    the value: what the Rust adapter writes and reads too."""
    from leasehold.fence.s3 import S3Fence

    raw = _s3_client(s3_url)
    written, advanced, by_hand = resource("written"), resource("advanced"), resource("by hand")

    def body(name: str) -> bytes:
        return bytes(raw.get_object(Bucket="leasehold", Key="leasehold/fence/" + name)["Body"].read())

    with S3Fence(raw, "leasehold") as store:
        assert store.key(written) == "leasehold/fence/" + written
        assert store.write(written, 12345, ONCE, b"v\n-") == Accepted()
        assert body(written) == b"LHF100000000000000012345v\nv\n-"
        assert store.advance(written, TOP, ONCE) == Accepted()
        assert body(written) == b"LHF1" + str(TOP).zfill(20).encode() + b"v\nv\n-"
        assert store.advance(advanced, 7, ONCE) == Accepted()
        assert body(advanced) == b"LHF100000000000000000007-\n"
        assert store.advance(advanced, 8, MANY) == Accepted()
        assert body(advanced) == b"LHF100000000000000000008-\n"
        raw.put_object(Bucket="leasehold", Key="leasehold/fence/" + by_hand, Body=b"LHF100000000000000000042v\n")
        assert store.read(by_hand) == Record(T(42), b"")
        assert store.write(by_hand, 41, MANY, b"stale") == Superseded(seen=T(42), ours=T(41))
    with S3Fence(raw, "leasehold", prefix="elsewhere/") as other:
        assert other.key(written) == "elsewhere/" + written and other.read(written) is None


@pytest.mark.fence
def test_s3_objects_that_are_not_fences_are_store_errors(s3_url: str, resource: Callable[[str], str]) -> None:
    from leasehold.fence.s3 import S3Fence

    raw = _s3_client(s3_url)
    store = S3Fence(raw, "leasehold")
    bodies = [
        b"",
        b"hello",
        b"LHF100000000000000000042v",  # no newline
        b"LHF2" + b"0" * 19 + b"1v\n",
        b"LHF1" + b"0" * 19 + b"1x\n",
        b"LHF1" + b"0" * 18 + b"-1v\n",
        b"LHF1" + b"9" * 20 + b"v\n",  # beyond 2**64 - 1
        b"LHF1" + b"0" * 19 + b"1-\nvalue after -",
    ]
    for number, garbage in enumerate(bodies):
        name = resource(f"garbage {number}")
        raw.put_object(Bucket="leasehold", Key=store.key(name), Body=garbage)
        for call in (
            lambda: store.read(name),
            lambda: store.write(name, 5, MANY, b"x"),
            lambda: store.advance(name, 5, ONCE),
        ):
            with pytest.raises(FenceError, match="not a Leasehold fence object"):
                call()
        assert raw.get_object(Bucket="leasehold", Key=store.key(name))["Body"].read() == garbage
    missing_bucket = S3Fence(raw, "leasehold-no-such-bucket")
    with pytest.raises(FenceError, match="NoSuchBucket"):
        missing_bucket.read(resource("no bucket"))
    with pytest.raises(FenceError, match="NoSuchBucket"):
        missing_bucket.write(resource("no bucket"), 5, ONCE, b"x")


@pytest.mark.fence
def test_s3_botocores_retry_of_a_put_that_landed_finds_our_token(
    s3_url: str, mode: Mode, resource: Callable[[str], str]
) -> None:
    """The proxy drops the answer to the conditional PUT and keeps listening: botocore
    resends the PUT, which answers 412 (the object changed: our first attempt landed),
    and the adapter's next round reads our own token."""
    from fence_kits import AnswerDropper, S3Kit, port_of, with_port

    from leasehold.fence.s3 import S3Fence

    name = resource("retried by botocore")
    proxy = AnswerDropper(port_of(s3_url), S3Kit.requests_per_write, keep_listening=True)
    try:
        with S3Fence.from_url(with_port(s3_url, proxy.port)) as store:
            assert store.write(name + " (warm-up)", 1, MANY, b"warm-up") == Accepted()
            proxy.arm()
            outcome = store.write(name, 70, mode, b"landed once")
            assert proxy.lost.is_set()
            if mode is ONCE:
                assert isinstance(outcome, Superseded) and outcome.is_ours
            else:
                assert outcome == Accepted()
            assert store.read(name) == Record(T(70), b"landed once")
    finally:
        proxy.close()


@pytest.mark.fence
def test_s3_many_writers_racing_leave_the_newest_token(s3_url: str, resource: Callable[[str], str]) -> None:
    """Eight writers with tokens 1..8 on one new resource, many times per grant: every
    lost race is a 412 (or 409) and another round, and the newest token remains."""
    from leasehold.fence.s3 import S3Fence

    name = resource("crowd")
    stores = [S3Fence.from_url(s3_url) for _ in range(8)]
    start = threading.Barrier(len(stores), timeout=30)

    def write(token: int) -> List[Outcome]:
        start.wait()
        return [stores[token - 1].write(name, token, MANY, f"t{token} #{n}".encode()) for n in range(5)]

    try:
        with ThreadPoolExecutor(max_workers=len(stores)) as pool:
            outcomes = list(pool.map(write, range(1, len(stores) + 1)))
        assert outcomes[-1] == [Accepted()] * 5
        for token, answers in enumerate(outcomes[:-1], start=1):
            for answer in answers:
                assert answer == Accepted() or (isinstance(answer, Superseded) and answer.seen > T(token)), answer
        assert stores[0].read(name) == Record(T(8), b"t8 #4")
    finally:
        for store in stores:
            store.close()
