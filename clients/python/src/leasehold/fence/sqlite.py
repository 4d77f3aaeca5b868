"""SQLite: the same table and statement as PostgreSQL (`value BLOB`), through the
standard library's sqlite3. Needs SQLite 3.35 or newer (`RETURNING`).

`write` and `advance` run in a transaction of their own opened with `BEGIN IMMEDIATE`:
the write lock is taken before the check, so the `SELECT` that reads `seen` after a
refusal sees the row that refused us, and two connections never deadlock upgrading a
read lock.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from typing import Optional, Union

from leasehold.fence import (
    _Adapter,
    Accepted,
    FenceError,
    FencingToken,
    Mode,
    Outcome,
    Record,
    Superseded,
    _table_parts,
    validate_mode,
    validate_resource,
    validate_token,
)

#: The table of the fences (docs/fenced-writes.md).
DEFAULT_TABLE = "leasehold_fence"
#: The oldest SQLite with `RETURNING`.
MINIMUM_SQLITE = (3, 35, 0)


def _quoted(table: str) -> str:
    return ".".join(f'"{part}"' for part in _table_parts(table))


def _would_autocommit(connection: sqlite3.Connection) -> bool:
    """Whether a statement on `connection` would commit on its own."""
    if connection.in_transaction:
        return False
    autocommit = getattr(connection, "autocommit", None)  # Python 3.12's attribute
    if autocommit is True:
        return True
    return connection.isolation_level is None


class SqliteFence(_Adapter):
    """Fenced writes to a table of an SQLite database.

    `path_or_connection` is the database's path, which the adapter opens itself (in
    autocommit mode, usable from any thread, closed by `close`), or an sqlite3
    connection with no open transaction while `write`, `advance` and `read` run. Calls
    on one adapter are serialized; give each writer an adapter (a connection) of its
    own. `guard` runs inside the caller's transaction instead. Store failures (a busy
    database after `timeout` seconds among them) raise `FenceError`.
    """

    def __init__(
        self,
        path_or_connection: Union[str, "os.PathLike[str]", sqlite3.Connection],
        table: str = DEFAULT_TABLE,
        timeout: float = 10.0,
    ) -> None:
        if sqlite3.sqlite_version_info < MINIMUM_SQLITE:
            raise FenceError(f"SqliteFence needs SQLite 3.35 or newer (RETURNING); this is {sqlite3.sqlite_version}")
        table = _quoted(table)
        self._table = table
        self._lock = threading.Lock()
        self._owned = not isinstance(path_or_connection, sqlite3.Connection)
        if isinstance(path_or_connection, sqlite3.Connection):
            self._connection = path_or_connection
        else:
            try:
                self._connection = sqlite3.connect(
                    os.fspath(path_or_connection), timeout=timeout, isolation_level=None, check_same_thread=False
                )
            except sqlite3.Error as error:
                raise FenceError(f"could not open SQLite database {path_or_connection!r}: {error}") from error
        self._write = {
            mode: (
                f"INSERT INTO {table} (resource, token, value) VALUES (?, ?, ?) ON CONFLICT (resource) DO UPDATE"
                f" SET token = excluded.token, value = excluded.value WHERE {table}.token {_older(mode)} excluded.token"
                " RETURNING token"
            )
            for mode in Mode
        }
        self._advance = {
            mode: (
                f"INSERT INTO {table} (resource, token) VALUES (?, ?) ON CONFLICT (resource) DO UPDATE"
                f" SET token = excluded.token WHERE {table}.token {_older(mode)} excluded.token RETURNING token"
            )
            for mode in Mode
        }
        self._seen = f"SELECT token FROM {table} WHERE resource = ?"
        self._read = f"SELECT token, value FROM {table} WHERE resource = ?"

    def create_table(self) -> None:
        """Creates the table unless it exists."""
        with self._lock:
            try:
                self._connection.execute(
                    f"CREATE TABLE IF NOT EXISTS {self._table}"
                    " (resource TEXT PRIMARY KEY, token BIGINT NOT NULL, value BLOB)"
                )
            except sqlite3.Error as error:
                raise FenceError(f"could not create the fence table: {error}") from error

    def _fence(self, resource: str, token: FencingToken, mode: Mode, value: Optional[bytes]) -> Outcome:
        with self._lock:
            connection = self._connection
            try:
                if connection.in_transaction:
                    raise FenceError(
                        "SqliteFence.write/advance need a connection without an open transaction; in one, use guard()"
                    )
                connection.execute("BEGIN IMMEDIATE")
                try:
                    outcome = self._run(connection, resource, token, mode, value)
                    connection.execute("COMMIT")
                except BaseException:
                    if connection.in_transaction:
                        connection.execute("ROLLBACK")
                    raise
                return outcome
            except sqlite3.Error as error:
                raise FenceError(f"fenced write to SQLite failed: {error}") from error

    def guard(
        self,
        cursor: Union[sqlite3.Cursor, sqlite3.Connection],
        resource: str,
        token: Union[FencingToken, int],
        mode: Mode,
    ) -> Outcome:
        """Advances the fence inside the caller's transaction (open it with `BEGIN
        IMMEDIATE`), on its cursor or connection, and leaves the value alone; the
        caller's other statements commit or roll back with it. Refuses (FenceError) a
        connection on which the statement would commit on its own."""
        resource, token, mode = validate_resource(resource), validate_token(token), validate_mode(mode)
        connection = cursor.connection if isinstance(cursor, sqlite3.Cursor) else cursor
        if _would_autocommit(connection):
            raise FenceError("guard() runs inside the caller's transaction: BEGIN IMMEDIATE first")
        try:
            return self._run(cursor, resource, token, mode, None)
        except sqlite3.Error as error:
            raise FenceError(f"fence guard in SQLite failed: {error}") from error

    def _run(
        self,
        on: Union[sqlite3.Cursor, sqlite3.Connection],
        resource: str,
        token: FencingToken,
        mode: Mode,
        value: Optional[bytes],
    ) -> Outcome:
        bigint = token.to_sql_bigint()
        if value is None:
            rows = on.execute(self._advance[mode], (resource, bigint)).fetchall()
        else:
            rows = on.execute(self._write[mode], (resource, bigint, value)).fetchall()
        if rows:
            return Accepted()
        row = on.execute(self._seen, (resource,)).fetchone()
        if row is None:
            raise FenceError(f"the fence row of {resource!r} refused the write, then vanished")
        return Superseded(seen=FencingToken.from_sql_bigint(row[0]), ours=token)

    def read(self, resource: str) -> Optional[Record]:
        """The stored token and value, or None."""
        resource = validate_resource(resource)
        with self._lock:
            try:
                row = self._connection.execute(self._read, (resource,)).fetchone()
            except sqlite3.Error as error:
                raise FenceError(f"fence read from SQLite failed: {error}") from error
        if row is None:
            return None
        return Record(FencingToken.from_sql_bigint(row[0]), None if row[1] is None else bytes(row[1]))

    def close(self) -> None:
        """Closes the connection if the adapter opened it (not one it was given)."""
        if self._owned:
            with self._lock:
                self._connection.close()


def _older(mode: Mode) -> str:
    return "<" if mode is Mode.ONCE_PER_GRANT else "<="
