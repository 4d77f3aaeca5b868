"""Against a real cluster: at most K permits, FIFO waiters, the limit's rules."""

from __future__ import annotations

import queue
import threading
from typing import Callable, Union

import pytest

import leasehold

from waiting import until

pytestmark = pytest.mark.cluster


def test_at_most_limit_sessions_hold_a_permit(client: leasehold.Client, unique: Callable[[str], str]) -> None:
    name = unique("sem")
    with client.session(ttl=10) as a, client.session(ttl=10) as b, client.session(ttl=10) as c:
        first = a.semaphore(name, 2).try_acquire()
        second = b.semaphore(name, 2).try_acquire()
        assert first is not None and second is not None and first.token < second.token
        full = c.semaphore(name, 2).acquire_within(0)
        assert full == leasehold.SemaphoreFull(holders=2, limit=2, timed_out=False)
        described = client.describe_semaphore(name)
        assert described.limit == 2 and {holder.session_id for holder in described.holders} == {a.id, b.id}

        outcome: "queue.Queue[Union[leasehold.PermitGuard, BaseException]]" = queue.Queue()

        def wait_for_permit() -> None:
            try:
                outcome.put(c.semaphore(name, 2).acquire(wait=30))
            except BaseException as error:
                outcome.put(error)

        threading.Thread(target=wait_for_permit, daemon=True).start()
        until(
            10,
            "c to wait for a permit",
            lambda: [w.session_id for w in client.describe_semaphore(name).waiters] == [c.id],
        )
        first.release()
        third = outcome.get(timeout=10)
        assert isinstance(third, leasehold.PermitGuard) and third.token > second.token and third.is_valid()
        with third:
            assert len(client.describe_semaphore(name).holders) == 2
        assert not third.is_valid()
        assert [holder.session_id for holder in client.describe_semaphore(name).holders] == [b.id]


def test_the_first_acquirer_sets_the_limit_and_another_limit_is_refused(
    client: leasehold.Client, unique: Callable[[str], str]
) -> None:
    name = unique("sem")
    with client.session(ttl=10) as a, client.session(ttl=10) as b:
        permit = a.semaphore(name, 1).acquire(wait=5)
        with pytest.raises(leasehold.Refused) as raised:
            b.semaphore(name, 3).try_acquire()
        assert raised.value.reason == "LIMIT_MISMATCH" and raised.value.definite
        with pytest.raises(leasehold.SemaphoreNotAcquired) as timed_out:
            b.semaphore(name, 1).acquire(wait=0.5)
        assert timed_out.value.detail == leasehold.SemaphoreFull(holders=1, limit=1, timed_out=True)
        assert a.semaphore(name, 1).set_limit(2) == 1, "raising the limit returns the previous one"
        extra = b.semaphore(name, 2).try_acquire()
        assert extra is not None and extra.token > permit.token
