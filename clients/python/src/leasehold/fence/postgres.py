"""PostgreSQL: the fence is a row of `leasehold_fence (resource TEXT PRIMARY KEY, token
BIGINT NOT NULL, value BYTEA)`, checked and written by one statement (psycopg 3, the
extra `fence-postgres`)::

    INSERT INTO leasehold_fence (resource, token, value) VALUES (%s, %s, %s)
        ON CONFLICT (resource) DO UPDATE SET token = EXCLUDED.token, value = EXCLUDED.value
        WHERE leasehold_fence.token < EXCLUDED.token      -- <= many per grant
        RETURNING token

A row returned: accepted. None: refused, and a `SELECT token` reads what the store
holds (`Superseded.seen`). Two writers racing on one resource serialize on its row:
the later statement re-evaluates the `WHERE` against the row the earlier one wrote.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Union

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
    import psycopg
    from psycopg import sql

#: The table of the fences (docs/fenced-writes.md).
DEFAULT_TABLE = "leasehold_fence"


def _driver() -> Any:
    try:
        import psycopg
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise FenceError("PostgresFence needs psycopg 3: pip install 'leasehold[fence-postgres]'") from error
    return psycopg


class PostgresFence(_Adapter):
    """Fenced writes to a PostgreSQL table.

    `connection` is a psycopg 3 connection in autocommit mode, which `write`, `advance`
    and `read` use (each is one statement, its own transaction; the connection may be
    shared by threads), or a connection string, from which the adapter opens such a
    connection of its own (reopened after it broke, closed by `close`). `guard` runs on
    a cursor of the caller's open transaction instead. `table` is an identifier or
    `schema.identifier`. Store failures raise `FenceError` (the driver's error is its
    `__cause__`).
    """

    def __init__(self, connection: Union["psycopg.Connection[Any]", str], table: str = DEFAULT_TABLE) -> None:
        driver = _driver()
        from psycopg import sql

        self._table = sql.Identifier(*_table_parts(table))
        self._conninfo: Optional[str] = connection if isinstance(connection, str) else None
        self._connection: "psycopg.Connection[Any]" = self._connect() if isinstance(connection, str) else connection
        if not isinstance(self._connection, driver.Connection):
            raise FenceError(f"PostgresFence needs a psycopg 3 connection or a connection string, not {connection!r}")
        self._write = {mode: self._upsert(mode, with_value=True) for mode in Mode}
        self._advance = {mode: self._upsert(mode, with_value=False) for mode in Mode}
        self._seen = sql.SQL("SELECT token FROM {table} WHERE resource = %s").format(table=self._table)
        self._read = sql.SQL("SELECT token, value FROM {table} WHERE resource = %s").format(table=self._table)

    def _upsert(self, mode: Mode, with_value: bool) -> "sql.Composed":
        from psycopg import sql

        older = sql.SQL("<" if mode is Mode.ONCE_PER_GRANT else "<=")
        if with_value:
            text = (
                "INSERT INTO {table} (resource, token, value) VALUES (%s, %s, %s) ON CONFLICT (resource) DO UPDATE"
                " SET token = EXCLUDED.token, value = EXCLUDED.value WHERE {table}.token {older} EXCLUDED.token"
                " RETURNING token"
            )
        else:
            text = (
                "INSERT INTO {table} (resource, token) VALUES (%s, %s) ON CONFLICT (resource) DO UPDATE"
                " SET token = EXCLUDED.token WHERE {table}.token {older} EXCLUDED.token RETURNING token"
            )
        return sql.SQL(text).format(table=self._table, older=older)

    def _connect(self) -> "psycopg.Connection[Any]":
        driver = _driver()
        assert self._conninfo is not None
        try:
            return driver.connect(self._conninfo, autocommit=True)  # type: ignore[no-any-return]
        except driver.Error as error:
            raise FenceError(f"could not connect to PostgreSQL: {error}") from error

    def _autocommit_connection(self) -> "psycopg.Connection[Any]":
        if self._conninfo is not None and self._connection.closed:
            self._connection = self._connect()
        if not self._connection.autocommit:
            raise FenceError(
                "PostgresFence.write/advance/read need an autocommit connection; in a transaction, use guard()"
            )
        return self._connection

    def create_table(self) -> None:
        """Creates the table unless it exists."""
        driver = _driver()
        from psycopg import sql

        statement = sql.SQL(
            "CREATE TABLE IF NOT EXISTS {table} (resource TEXT PRIMARY KEY, token BIGINT NOT NULL, value BYTEA)"
        ).format(table=self._table)
        connection = self._autocommit_connection()
        try:
            connection.execute(statement)
        except (driver.errors.UniqueViolation, driver.errors.DuplicateTable) as error:
            # Two sessions creating the table at once: one of them fails on the catalog's
            # unique index even with IF NOT EXISTS. The other one made it.
            try:
                exists = connection.execute(
                    "SELECT to_regclass(%s) IS NOT NULL", [self._table.as_string(connection)]
                ).fetchone()
            except driver.Error as second:
                raise FenceError(f"could not create the fence table: {second}") from second
            if not exists or not exists[0]:
                raise FenceError(f"could not create the fence table: {error}") from error
        except driver.Error as error:
            raise FenceError(f"could not create the fence table: {error}") from error

    def _fence(self, resource: str, token: FencingToken, mode: Mode, value: Optional[bytes]) -> Outcome:
        driver = _driver()
        connection = self._autocommit_connection()
        try:
            with connection.cursor() as cursor:
                if value is None:
                    return self._run(cursor, resource, token, mode)
                cursor.execute(self._write[mode], (resource, token.to_sql_bigint(), value))
                if cursor.fetchone() is not None:
                    return Accepted()
                return self._superseded(cursor, resource, token)
        except driver.Error as error:
            raise FenceError(f"fenced write to PostgreSQL failed: {error}") from error

    def guard(
        self, cursor: "psycopg.Cursor[Any]", resource: str, token: Union[FencingToken, int], mode: Mode
    ) -> Outcome:
        """Advances the fence inside the caller's open transaction, on its cursor, and
        leaves the value alone. The row stays locked until the caller commits, so the
        transaction's other statements are fenced too; on `Superseded`, roll back.
        Refuses (FenceError) an autocommit connection outside a transaction block,
        where the fence would commit on its own."""
        resource, token, mode = validate_resource(resource), validate_token(token), validate_mode(mode)
        driver = _driver()
        connection = cursor.connection
        if connection.autocommit and connection.info.transaction_status == driver.pq.TransactionStatus.IDLE:
            raise FenceError("guard() runs inside the caller's transaction: open one (connection.transaction())")
        try:
            return self._run(cursor, resource, token, mode)
        except driver.Error as error:
            raise FenceError(f"fence guard in PostgreSQL failed: {error}") from error

    def _run(self, cursor: "psycopg.Cursor[Any]", resource: str, token: FencingToken, mode: Mode) -> Outcome:
        cursor.execute(self._advance[mode], (resource, token.to_sql_bigint()))
        if cursor.fetchone() is not None:
            return Accepted()
        return self._superseded(cursor, resource, token)

    def _superseded(self, cursor: "psycopg.Cursor[Any]", resource: str, token: FencingToken) -> Superseded:
        cursor.execute(self._seen, (resource,))
        row = cursor.fetchone()
        if row is None:
            raise FenceError(f"the fence row of {resource!r} refused the write, then vanished")
        return Superseded(seen=FencingToken.from_sql_bigint(row[0]), ours=token)

    def read(self, resource: str) -> Optional[Record]:
        """The stored token and value, or None."""
        resource = validate_resource(resource)
        driver = _driver()
        connection = self._autocommit_connection()
        try:
            row = connection.execute(self._read, (resource,)).fetchone()
        except driver.Error as error:
            raise FenceError(f"fence read from PostgreSQL failed: {error}") from error
        if row is None:
            return None
        return Record(FencingToken.from_sql_bigint(row[0]), None if row[1] is None else bytes(row[1]))

    def close(self) -> None:
        """Closes the connection if the adapter opened it (not one it was given)."""
        if self._conninfo is not None:
            self._connection.close()
