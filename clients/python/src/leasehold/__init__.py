"""The Leasehold client: sessions kept alive in the background, FIFO locks whose
grants carry a fencing token, semaphores, elections, and retries that are safe
because every mutating request carries a request id::

    import leasehold

    client = leasehold.Client.from_env()           # LEASEHOLD_ENDPOINTS, _CA_FILE, _TOKEN_FILE
    with client.session(ttl=10) as session:        # keepalives run in the background
        with session.lock("orders/42", wait=30) as guard:
            # The storage refuses a write with an older token:
            # UPDATE payments SET …, fence_token = %(t)s WHERE order_id = 42 AND fence_token < %(t)s
            charge(42, fence_token=guard.token)

A lease is not mutual exclusion: a process paused past its TTL wakes up still holding
a guard. The fencing token, checked by the storage, is what makes the late write
harmless; `guard.is_valid()` and the session's jeopardy signal say when to stop,
before the server could hand the lock to someone else.

A request that was sent but not answered in time raises `Indeterminate` (it may have
taken effect; the client retried it with the same request id, so it took effect at
most once). A wait whose session ended raises `SessionLost`.

Layout
------

* `client` — endpoints, TLS and credentials, leader following, retries with the same
  request id; reads (`check_fence`, `describe_*`, `leader`, `observe`).
* `session` — the session and what is taken under it: locks, and the waiting
  requests behind locks, semaphores and elections.
* `keepalive` — one keepalive stream per client for all of its sessions.
* `lease` — the lease contract (`client_lease_ms`) and one session's lease: its
  conservative deadline, jeopardy and loss.
* `lock` — lock guards.
* `semaphore` — at most K holders per name; permit guards.
* `election` — campaigns, leadership handles, observing changes.
* `fence` — `FencingToken` for SQL and HTTP, and how storage checks it.
* `errors` — the error types, and how a status's ErrorReason is read.
* `settings` — the `LEASEHOLD_*` variables turned into a `Client`.
* `proto` — the generated messages and stubs, for calling the API directly.
"""

from leasehold import proto
from leasehold.client import DEFAULT_ENDPOINTS, Client, parse_endpoints
from leasehold.election import Leader, Leadership, Observation
from leasehold.errors import (
    Indeterminate,
    InvalidArgument,
    LeaseholdError,
    LimitReached,
    LockNotAcquired,
    NotElected,
    NotFound,
    OtherError,
    PermissionDenied,
    Refused,
    SemaphoreNotAcquired,
    SessionLost,
    Unauthenticated,
    Overloaded,
    Unavailable,
)
from leasehold.fence import FenceCheck, FencingToken, FencingTokenError
from leasehold.lease import SessionState
from leasehold.lock import LockGuard, NotAcquired
from leasehold.semaphore import PermitGuard, Semaphore, SemaphoreFull
from leasehold.session import Session
from leasehold.settings import Settings

__all__ = [
    "DEFAULT_ENDPOINTS",
    "Client",
    "FenceCheck",
    "FencingToken",
    "FencingTokenError",
    "Indeterminate",
    "InvalidArgument",
    "Leader",
    "Leadership",
    "LeaseholdError",
    "LimitReached",
    "LockGuard",
    "LockNotAcquired",
    "NotAcquired",
    "NotElected",
    "NotFound",
    "Observation",
    "OtherError",
    "PermissionDenied",
    "PermitGuard",
    "Refused",
    "Semaphore",
    "SemaphoreFull",
    "SemaphoreNotAcquired",
    "Session",
    "SessionLost",
    "SessionState",
    "Settings",
    "Unauthenticated",
    "Overloaded",
    "Unavailable",
    "parse_endpoints",
    "proto",
]
