"""The keepalive schedule: when each session is looked at again, and that its memory
stays bounded however often sessions are rescheduled."""

from __future__ import annotations

import time

from leasehold.keepalive import SCHEDULE_ENTRIES_PER_SESSION_MAX, _Register, _Schedule
from leasehold.lease import Lease


def schedule_with(ttl_ms: int, sessions: int) -> _Schedule:
    schedule = _Schedule()
    now = time.monotonic()
    for session_id in range(1, sessions + 1):
        lease = Lease(ttl_ms, now + ttl_ms / 1_000)
        schedule.handle(_Register(session_id, b"secret", ttl_ms, lease))
    return schedule


def test_a_session_wakes_for_its_next_keepalive_before_its_jeopardy() -> None:
    schedule = schedule_with(6_000, 1)
    tracked = schedule.sessions[1]
    now = time.monotonic()
    wake = tracked.next_wake(now)
    assert abs((wake - now) - 1.0) < 0.05, "a keepalive every TTL / 6"
    tracked.sent_at = now
    tracked.next_send = now + tracked.interval
    assert tracked.next_wake(now) <= now + tracked.interval, "an unanswered keepalive is checked after an interval"


def test_a_session_past_its_sends_wakes_at_its_jeopardy_and_deadline() -> None:
    now = time.monotonic()
    lease = Lease(2_000, now + 0.5)  # already in jeopardy: 0.5 s left of a 2 s TTL
    schedule = _Schedule()
    schedule.handle(_Register(1, b"s", 2_000, lease))
    tracked = schedule.sessions[1]
    tracked.next_send = now + 10
    assert abs(tracked.next_wake(now) - (now + 0.5)) < 0.01, "the deadline is the next change"


def test_due_sessions_are_taken_once_and_stale_entries_skipped() -> None:
    schedule = schedule_with(6_000, 3)
    now = time.monotonic()
    for _ in range(3):
        schedule.reschedule(2, now)  # duplicates of the same wake
    due = schedule.take_due(now + 10)
    assert sorted(due) == [1, 2, 3]
    assert schedule.next_due() is None


def test_the_schedule_stays_bounded_however_often_sessions_are_rescheduled() -> None:
    schedule = schedule_with(6_000, 10)
    now = time.monotonic()
    for turn in range(10_000):
        schedule.reschedule(1 + turn % 10, now + turn * 1e-6)
    assert len(schedule._due) <= SCHEDULE_ENTRIES_PER_SESSION_MAX * 10 + 16
    assert schedule.next_due() is not None
    schedule.remove(1)
    assert 1 not in schedule.take_due(now + 100)
