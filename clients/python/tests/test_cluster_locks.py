"""Against a real cluster: try-lock, blocking locks in FIFO order with increasing
tokens, waits that run out, the `with` block, fences, and a waiter whose session ends."""

from __future__ import annotations

import queue
import threading
from typing import Callable, List, Union

import pytest

import leasehold
from leasehold.lock import LockGuard

from waiting import until

pytestmark = pytest.mark.cluster


def waiting_sessions(client: leasehold.Client, name: str) -> List[int]:
    return [waiter.session_id for waiter in client.describe_lock(name).waiters]


def lock_in_thread(
    session: leasehold.Session, name: str, wait: float
) -> "queue.Queue[Union[LockGuard, BaseException]]":
    """`session.lock(name, wait)` on a thread of its own; its outcome arrives in the queue."""
    outcome: "queue.Queue[Union[LockGuard, BaseException]]" = queue.Queue()

    def run() -> None:
        try:
            outcome.put(session.lock(name, wait=wait))
        except BaseException as error:  # Handed to the test, which raises it.
            outcome.put(error)

    threading.Thread(target=run, daemon=True).start()
    return outcome


def test_try_lock_grants_one_session_and_tells_another_who_holds_it(
    client: leasehold.Client, unique: Callable[[str], str]
) -> None:
    name = unique("lock")
    with client.session(ttl=10) as first, client.session(ttl=10) as second:
        guard = first.try_lock(name)
        assert guard is not None and guard.token > 0 and guard.is_valid()
        assert second.try_lock(name) is None
        busy = second.acquire(name)
        assert isinstance(busy, leasehold.NotAcquired)
        assert busy.holder_session_id == first.id and busy.holder_token == guard.token and not busy.timed_out
        again = first.try_lock(name)
        assert again is not None and again.token == guard.token, "a held lock is answered with its grant"
        holder = client.describe_lock(name).holder
        assert holder.session_id == first.id and holder.token == guard.token


def test_waiters_are_granted_in_fifo_order_with_increasing_tokens(
    client: leasehold.Client, unique: Callable[[str], str]
) -> None:
    name = unique("lock")
    with client.session(ttl=10) as a, client.session(ttl=10) as b, client.session(ttl=10) as c:
        first = a.lock(name, wait=5)
        b_outcome = lock_in_thread(b, name, wait=30)
        until(10, "b to wait in the queue", lambda: waiting_sessions(client, name) == [b.id])
        c_outcome = lock_in_thread(c, name, wait=30)
        until(10, "c to wait behind b", lambda: waiting_sessions(client, name) == [b.id, c.id])
        first.release()
        second = b_outcome.get(timeout=10)
        assert isinstance(second, LockGuard) and second.session is b
        assert c_outcome.empty(), "c waits while b holds the lock"
        second.release()
        third = c_outcome.get(timeout=10)
        assert isinstance(third, LockGuard) and third.session is c
        assert first.token < second.token < third.token
        third.release()
        assert not client.describe_lock(name).HasField("holder")


def test_a_wait_that_runs_out_says_who_holds_the_lock(client: leasehold.Client, unique: Callable[[str], str]) -> None:
    name = unique("lock")
    with client.session(ttl=10) as holder, client.session(ttl=10) as waiter:
        guard = holder.lock(name, wait=5)
        with pytest.raises(leasehold.LockNotAcquired) as raised:
            waiter.lock(name, wait=1)
        detail = raised.value.detail
        assert detail.timed_out and detail.holder_session_id == holder.id and detail.holder_token == guard.token
        assert waiting_sessions(client, name) == [], "a wait that ran out leaves the queue"


def test_the_with_block_releases_the_lock_and_the_guard_carries_the_fence(
    client: leasehold.Client, unique: Callable[[str], str]
) -> None:
    name = unique("lock")
    with client.session(ttl=10) as session:
        with session.lock(name, wait=30) as guard:
            assert guard.fencing_token == leasehold.FencingToken(guard.token)
            assert guard.fencing_token.to_sql_bigint() == guard.token
            assert guard.deadline == session.deadline and guard.is_valid()
            assert client.check_fence(name, guard.token) == leasehold.FenceCheck(True, guard.token)
        assert not guard.is_valid()
        assert not client.describe_lock(name).HasField("holder")
        check = client.check_fence(name, guard.token)
        assert check == leasehold.FenceCheck(current=False, current_token=0)


def test_a_superseded_token_fences_nothing_and_cannot_release(
    client: leasehold.Client, unique: Callable[[str], str]
) -> None:
    name = unique("lock")
    with client.session(ttl=10) as first, client.session(ttl=10) as second:
        old = first.lock(name, wait=5)
        old_token = old.token
        old.release()
        new = second.lock(name, wait=5)
        assert client.check_fence(name, old_token) == leasehold.FenceCheck(False, new.token)
        assert client.check_fence(name, leasehold.FencingToken(new.token)).current
        with pytest.raises(leasehold.Refused) as raised:
            LockGuard(first, name, old_token).release()
        assert raised.value.reason == "NOT_HOLDER"
        assert client.describe_lock(name).holder.token == new.token, "the refused release changed nothing"


def test_a_waiter_whose_session_ends_gets_session_lost(client: leasehold.Client, unique: Callable[[str], str]) -> None:
    name = unique("lock")
    with client.session(ttl=10) as holder:
        holder.lock(name, wait=5)
        waiter = client.session(ttl=10)
        outcome = lock_in_thread(waiter, name, wait=30)
        until(10, "the waiter to queue", lambda: waiting_sessions(client, name) == [waiter.id])
        waiter.close()
        error = outcome.get(timeout=15)
        assert isinstance(error, leasehold.SessionLost) and error.session_id == waiter.id
        assert waiting_sessions(client, name) == []


def test_a_lock_delay_is_asked_per_acquire(client: leasehold.Client, unique: Callable[[str], str]) -> None:
    name = unique("lock")
    with client.session(ttl=10) as session:
        guard = session.lock(name, wait=5, lock_delay=0)
        assert client.describe_lock(name).holder.lock_delay_ms == 0
        guard.release()
        delayed = session.lock(name, wait=5, lock_delay=2.5)
        assert client.describe_lock(name).holder.lock_delay_ms == 2_500
        delayed.release()
        with pytest.raises(leasehold.InvalidArgument):
            session.lock(name, wait=5, lock_delay=3_600)
