"""MySQL and MariaDB (PyMySQL, the extra `fence-mysql`): the fence is a row of

    leasehold_fence (resource VARBINARY(512) PRIMARY KEY,
                     token BIGINT NOT NULL, value LONGBLOB NULL, writes BIGINT UNSIGNED NOT NULL DEFAULT 0)

There is no `RETURNING` on an update, and the affected-row count depends on a
connection flag (`CLIENT_FOUND_ROWS`), so a write is::

    UPDATE leasehold_fence SET token = %s, value = %s, writes = writes + 1
     WHERE resource = %s AND token < %s                   -- <= many per grant

and, when it matched nothing (no row yet, or a newer token), an
`INSERT IGNORE INTO leasehold_fence (resource, token) VALUES (%s, 0)` (token 0:
never written, older than every grant) and the same `UPDATE` again. `writes`
changes on every accepted write, so the `UPDATE` affects one row exactly when its
token check matched. InnoDB locks the row for the `UPDATE`: racing writers
serialize on it. On a refusal a `SELECT` reads `seen`.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Dict, Optional, Union
from urllib.parse import parse_qsl, unquote, urlsplit

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

if TYPE_CHECKING:
    import pymysql
    import pymysql.cursors

#: The table of the fences (docs/fenced-writes.md).
DEFAULT_TABLE = "leasehold_fence"


def _driver() -> Any:
    try:
        import pymysql
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise FenceError("MysqlFence needs PyMySQL: pip install 'leasehold[fence-mysql]'") from error
    return pymysql


def connection_arguments(url: str) -> Dict[str, Any]:
    """`pymysql.connect` arguments of `mysql://user:password@host:port/database`
    (`mariadb://` too; the query may set `connect_timeout`)."""
    parts = urlsplit(url)
    if parts.scheme not in ("mysql", "mariadb") or not parts.hostname:
        raise FenceError(f"{url!r} is not a MySQL URL (mysql://user:password@host:port/database)")
    database = unquote(parts.path.lstrip("/"))
    if not database or "/" in database:
        raise FenceError(f"{url!r} names no database (mysql://user:password@host:port/database)")
    arguments: Dict[str, Any] = {
        "host": parts.hostname,
        "port": parts.port or 3306,
        "user": unquote(parts.username) if parts.username else "root",
        "password": unquote(parts.password) if parts.password else "",
        "database": database,
        "connect_timeout": 10,
    }
    for key, value in parse_qsl(parts.query):
        if key != "connect_timeout":
            raise FenceError(f"{url!r}: unknown parameter {key!r}")
        arguments[key] = float(value)
    return arguments


class MysqlFence(_Adapter):
    """Fenced writes to a MySQL or MariaDB (InnoDB) table.

    `connection_or_url` is a PyMySQL connection in autocommit mode, which `write`,
    `advance` and `read` use, or a URL (`mysql://user:password@host:port/database`),
    from which the adapter opens such a connection of its own (reopened after it
    broke, closed by `close`). Calls on one adapter are serialized (a PyMySQL
    connection is not thread-safe). `guard` runs on a cursor of the caller's open
    transaction instead. `table` is an identifier or `database.identifier`. Store
    failures raise `FenceError` (the driver's error is its `__cause__`).
    """

    def __init__(self, connection_or_url: Union["pymysql.connections.Connection", str], table: str = DEFAULT_TABLE):
        driver = _driver()
        self._table = ".".join(f"`{part}`" for part in _table_parts(table))
        self._lock = threading.Lock()
        self._arguments = connection_arguments(connection_or_url) if isinstance(connection_or_url, str) else None
        if self._arguments is not None:
            self._connection = self._connect()
        elif isinstance(connection_or_url, driver.connections.Connection):
            self._connection = connection_or_url
        else:
            raise FenceError(f"MysqlFence needs a PyMySQL connection or a URL, not {connection_or_url!r}")
        table = self._table
        self._ensure_row = f"INSERT IGNORE INTO {table} (resource, token) VALUES (%s, 0)"
        self._write = {
            mode: f"UPDATE {table} SET token = %s, value = %s, writes = writes + 1"
            f" WHERE resource = %s AND token {_older(mode)} %s"
            for mode in Mode
        }
        self._advance = {
            mode: f"UPDATE {table} SET token = %s, writes = writes + 1 WHERE resource = %s AND token {_older(mode)} %s"
            for mode in Mode
        }
        self._seen = f"SELECT token FROM {table} WHERE resource = %s"
        self._read = f"SELECT token, value FROM {table} WHERE resource = %s"

    def _connect(self) -> "pymysql.connections.Connection":
        driver = _driver()
        assert self._arguments is not None
        try:
            return driver.connect(**self._arguments, autocommit=True, charset="utf8mb4", binary_prefix=True)
        except driver.err.MySQLError as error:
            raise FenceError(f"could not connect to MySQL: {error}") from error

    def _autocommit_connection(self) -> "pymysql.connections.Connection":
        if self._arguments is not None and not self._connection.open:
            self._connection = self._connect()
        if not self._connection.get_autocommit():
            raise FenceError(
                "MysqlFence.write/advance/read need an autocommit connection; in a transaction, use guard()"
            )
        return self._connection

    def create_table(self) -> None:
        """Creates the table unless it exists."""
        driver = _driver()
        with self._lock:
            try:
                with self._autocommit_connection().cursor() as cursor:
                    cursor.execute(
                        f"CREATE TABLE IF NOT EXISTS {self._table} (resource VARBINARY(512) PRIMARY KEY, token BIGINT NOT NULL, value LONGBLOB NULL,"
                        " writes BIGINT UNSIGNED NOT NULL DEFAULT 0) ENGINE=InnoDB"
                    )
            except driver.err.MySQLError as error:
                raise FenceError(f"could not create the fence table: {error}") from error

    def _fence(self, resource: str, token: FencingToken, mode: Mode, value: Optional[bytes]) -> Outcome:
        driver = _driver()
        with self._lock:
            try:
                with self._autocommit_connection().cursor() as cursor:
                    return self._run(cursor, resource, token, mode, value)
            except driver.err.MySQLError as error:
                raise FenceError(f"fenced write to MySQL failed: {error}") from error

    def guard(
        self, cursor: "pymysql.cursors.Cursor", resource: str, token: Union[FencingToken, int], mode: Mode
    ) -> Outcome:
        """Advances the fence inside the caller's open transaction, on its cursor, and
        leaves the value alone. The row stays locked until the caller commits, so the
        transaction's other statements are fenced too; on `Superseded`, roll back.
        Refuses (FenceError) an autocommit connection outside a transaction, where the
        fence would commit on its own."""
        resource, token, mode = validate_resource(resource), validate_token(token), validate_mode(mode)
        driver = _driver()
        from pymysql.constants import SERVER_STATUS

        connection = cursor.connection
        if connection.get_autocommit() and not connection.server_status & SERVER_STATUS.SERVER_STATUS_IN_TRANS:
            raise FenceError("guard() runs inside the caller's transaction: open one (connection.begin())")
        try:
            return self._run(cursor, resource, token, mode, None, locking=True)
        except driver.err.MySQLError as error:
            raise FenceError(f"fence guard in MySQL failed: {error}") from error

    def _run(
        self,
        cursor: "pymysql.cursors.Cursor",
        resource: str,
        token: FencingToken,
        mode: Mode,
        value: Optional[bytes],
        locking: bool = False,
    ) -> Outcome:
        bigint = token.to_sql_bigint()

        def update() -> int:
            if value is None:
                return int(cursor.execute(self._advance[mode], (bigint, resource, bigint)))
            return int(cursor.execute(self._write[mode], (bigint, value, resource, bigint)))

        affected = update()
        if affected == 0:
            # No row, or a newer token: make sure there is a row, then check again.
            cursor.execute(self._ensure_row, (resource,))
            affected = update()
        if affected == 1:
            return Accepted()
        if affected != 0:
            raise FenceError(f"the fence update of {resource!r} affected {affected} rows")
        # In the caller's transaction (REPEATABLE READ) a plain SELECT would read its
        # snapshot; a locking read reads the row as the UPDATE saw it.
        cursor.execute(self._seen + (" FOR UPDATE" if locking else ""), (resource,))
        row = cursor.fetchone()
        if row is None:
            raise FenceError(f"the fence row of {resource!r} refused the write, then vanished")
        return Superseded(seen=FencingToken.from_sql_bigint(row[0]), ours=token)

    def read(self, resource: str) -> Optional[Record]:
        """The stored token and value, or None (a row of token 0 was never written)."""
        resource = validate_resource(resource)
        driver = _driver()
        with self._lock:
            try:
                with self._autocommit_connection().cursor() as cursor:
                    cursor.execute(self._read, (resource,))
                    row = cursor.fetchone()
            except driver.err.MySQLError as error:
                raise FenceError(f"fence read from MySQL failed: {error}") from error
        if row is None or row[0] == 0:
            return None
        return Record(FencingToken.from_sql_bigint(row[0]), None if row[1] is None else bytes(row[1]))

    def close(self) -> None:
        """Closes the connection if the adapter opened it (not one it was given)."""
        if self._arguments is not None:
            with self._lock:
                if self._connection.open:
                    self._connection.close()


def _older(mode: Mode) -> str:
    return "<" if mode is Mode.ONCE_PER_GRANT else "<="
