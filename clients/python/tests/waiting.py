"""Tests wait on a condition with a deadline and a reason, never on a bare sleep."""

from __future__ import annotations

import time
from typing import Callable, Optional, TypeVar

T = TypeVar("T")

#: How often a condition is checked again.
POLL_INTERVAL_S = 0.05


def until(deadline_s: float, reason: str, check: Callable[[], Optional[T]]) -> T:
    """Calls `check` until it returns something other than None or False, and returns
    that; fails after `deadline_s` seconds, saying `reason`."""
    give_up = time.monotonic() + deadline_s
    while True:
        value = check()
        if value is not None and value is not False:
            return value
        if time.monotonic() >= give_up:
            raise AssertionError(f"timed out after {deadline_s} s waiting for: {reason}")
        time.sleep(POLL_INTERVAL_S)
