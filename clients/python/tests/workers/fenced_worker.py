"""A payments worker for the fencing test: takes lock NAME, says its token on stdout,
and when a line arrives on stdin charges order 42 in TABLE with a fenced UPDATE —
whatever `guard.is_valid()` says, as a worker that woke from a pause would — and says
how many rows the update changed.

    python fenced_worker.py NAME DATABASE_URL TABLE TTL_SECONDS

The cluster comes from the LEASEHOLD_* variables.
"""

from __future__ import annotations

import json
import sys

import psycopg

import leasehold


def main() -> int:
    name, database_url, table, ttl = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
    client = leasehold.Client.from_env()
    session = client.session(ttl=ttl)
    guard = session.lock(name, wait=30)
    print(json.dumps({"token": guard.token, "session": session.id}), flush=True)
    sys.stdin.readline()
    valid = guard.is_valid()
    with psycopg.connect(database_url, autocommit=True) as database:
        updated = database.execute(
            f"UPDATE {table} SET status = 'charged by the paused worker', fence_token = %(token)s "
            "WHERE order_id = 42 AND fence_token < %(token)s",
            {"token": guard.fencing_token.to_sql_bigint()},
        ).rowcount
    print(json.dumps({"valid_before_write": valid, "rows": updated, "state": session.state.value}), flush=True)
    client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
