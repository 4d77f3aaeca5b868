"""The lease contract's numbers (mirroring proto/src/lease.rs) and the states a
session's lease goes through."""

from __future__ import annotations

import math
from typing import List

from leasehold.lease import (
    CLOCK_DRIFT_PPM,
    KEEPALIVES_PER_TTL,
    Lease,
    SessionState,
    client_lease_ms,
    counted_on_s,
)


def with_drift_ms(ms: int) -> int:
    """`ms` on one clock, lengthened to be at least that long on a clock running up to
    CLOCK_DRIFT_PPM faster (lease.rs)."""
    return ms + math.ceil(ms * CLOCK_DRIFT_PPM / 1_000_000)


def test_the_client_always_gives_up_before_the_leader_could_expire() -> None:
    for ttl_ms in [1_000, 8_000, 60_000, 3_600_000]:
        client_ms = client_lease_ms(ttl_ms)
        assert with_drift_ms(client_ms) < ttl_ms, f"TTL {ttl_ms} ms: client {client_ms} ms"
        assert client_ms > ttl_ms / 2, f"TTL {ttl_ms} ms: the margins take most of the lease"
    assert client_lease_ms(3_600_000) == 3_600_000 - 3_600 - 20
    assert client_lease_ms(10_000) == 10_000 - 10 - 20
    assert client_lease_ms(1_001) == 1_001 - 2 - 20, "the drift is rounded up"
    assert client_lease_ms(5) == 0, "never negative"


def test_a_lease_is_counted_at_most_for_the_sessions_ttl() -> None:
    assert counted_on_s(20_000, 10_000) == client_lease_ms(10_000) / 1_000
    assert counted_on_s(4_000, 10_000) == client_lease_ms(4_000) / 1_000


def test_keepalives_come_more_often_than_the_leaders_quiet_threshold() -> None:
    for ttl_ms in [1_000, 8_000, 3_600_000]:
        quiet_after_ms = ttl_ms // 5 + 100
        assert quiet_after_ms >= ttl_ms / KEEPALIVES_PER_TTL + 100


def test_a_lease_goes_into_jeopardy_at_half_a_ttl_left_and_is_lost_at_its_deadline() -> None:
    lease = Lease(ttl_ms=2_000, deadline=100.0)
    assert lease.state(98.9) is SessionState.ALIVE
    assert lease.state(99.1) is SessionState.JEOPARDY
    lease.extend(101.0)
    assert lease.state(99.1) is SessionState.ALIVE, "an answered keepalive brings it back"
    assert lease.state(101.0) is SessionState.LOST
    lease.extend(200.0)
    assert lease.state(101.0) is SessionState.LOST and lease.deadline == 101.0, "lost is final"


def test_state_changes_are_published_to_events_and_listeners() -> None:
    seen: List[SessionState] = []
    lease = Lease(ttl_ms=2_000, deadline=100.0)
    lease.add_listener(seen.append)
    assert lease.publish(98.0) is SessionState.ALIVE and not lease.jeopardy.is_set()
    assert lease.publish(99.5) is SessionState.JEOPARDY and lease.jeopardy.is_set() and not lease.lost.is_set()
    lease.extend(102.0)
    assert lease.publish(99.5) is SessionState.ALIVE and not lease.jeopardy.is_set()
    assert lease.publish(101.5) is SessionState.JEOPARDY
    assert lease.publish(102.0) is SessionState.LOST and lease.lost.is_set() and lease.jeopardy.is_set()
    assert seen == [SessionState.JEOPARDY, SessionState.JEOPARDY, SessionState.LOST]
    late: List[SessionState] = []
    lease.add_listener(late.append)
    assert late == [SessionState.LOST], "a listener added late hears the state at once"


def test_a_failing_listener_does_not_stop_the_others() -> None:
    seen: List[SessionState] = []

    def broken(state: SessionState) -> None:
        raise RuntimeError("a bug in the caller's listener")

    lease = Lease(ttl_ms=1_000, deadline=10.0)
    lease.add_listener(broken)
    lease.add_listener(seen.append)
    lease.end()
    assert seen == [SessionState.LOST]
