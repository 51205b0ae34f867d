"""The journal in PostgreSQL (``[master] store = "postgresql://..."``), for a highly available
master; SQLite (masterd.journal.store) stays the embedded default.

:class:`PgStore` is the SQLite :class:`~masterd.journal.store.Store` with another connection
underneath: every query of the store and of the feature tables (cores, services, models,
profiles) is shared, written in the SQL both engines speak, and :class:`PgConnection` makes
psycopg look like the ``sqlite3`` connection those queries were written against
(``execute``/``executescript``/rows by index and by name), rewriting the few differences
through masterd.journal.dialect. Semantics are today's: the journal writer commits each group
in one transaction and acknowledges a submission only after its COMMIT returned
(``synchronous_commit`` is the server's; keep it ``on``).

Every write carries the epoch of the leadership that made it (``SET trellis.epoch`` on each
connection) and the fence trigger refuses one from an older epoch: see
masterd.journal.lease for the design. Errors come back as the store's own types:
:class:`~masterd.journal.store.DuplicateKey` for a taken unique key,
:class:`~masterd.journal.store.Fenced` for a refused epoch and
:class:`~masterd.journal.store.StoreError` for everything else (the connection lost
included; the next transaction reconnects).

The schema creates and migrates itself: ``MIGRATIONS`` are applied in order, each in one
transaction under an advisory lock, and ``meta.schema_version`` records the last one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import psycopg
from psycopg import conninfo

from masterd.journal import lease
from masterd.journal.dialect import pg_query, pg_schema
from masterd.journal.store import SCHEMA, DuplicateKey, Fenced, Store, StoreError

log = logging.getLogger("trellis.store")
T = TypeVar("T")

# (version, script in the common SQL): applied once each, in order.
MIGRATIONS: tuple[tuple[int, str], ...] = (
    (1, SCHEMA + "CREATE INDEX IF NOT EXISTS events_job_seq ON events(job_seq);"),
)
# psycopg's limit of parameters in one statement.
_MAX_PARAMS = 65535


def connection_options(url: str, application_name: str, timeout_s: float) -> dict[str, Any]:
    """libpq options that make a dead link fail in about ``timeout_s`` rather than after
    TCP's default retransmissions (minutes), unless the URL sets them itself."""
    given = conninfo.conninfo_to_dict(url)
    wanted: dict[str, Any] = {
        "application_name": application_name,
        "connect_timeout": max(2, int(timeout_s)),
        "keepalives": 1,
        "keepalives_idle": max(1, int(timeout_s / 3)),
        "keepalives_interval": 1,
        "keepalives_count": 3,
        "tcp_user_timeout": int(timeout_s * 1000),
    }
    return {k: v for k, v in wanted.items() if k not in given}


def connect(url: str, application_name: str = "trellis-master", timeout_s: float = 10.0,
            row_factory: Any = None) -> psycopg.Connection[Any]:
    """An autocommit connection; StoreError naming the server when it cannot be opened."""
    try:
        return psycopg.connect(url, autocommit=True, row_factory=row_factory,
                               **connection_options(url, application_name, timeout_s))
    except psycopg.Error as exc:
        raise StoreError(f"cannot connect to the PostgreSQL journal: {_first_line(exc)}") \
            from None


class Row:
    """A result row readable by index and by column name, like ``sqlite3.Row``."""

    __slots__ = ("_names", "_values")

    def __init__(self, values: Sequence[Any], names: dict[str, int]) -> None:
        self._values = values
        self._names = names

    def __getitem__(self, key: int | str) -> Any:
        if isinstance(key, str):
            return self._values[self._names[key]]
        return self._values[key]

    def keys(self) -> list[str]:
        return list(self._names)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)


def _rows(cursor: Any) -> Callable[[Sequence[Any]], Row]:
    names = {c.name: i for i, c in enumerate(cursor.description or ())}
    return lambda values: Row(values, names)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def translate(exc: psycopg.Error) -> Exception:
    """A psycopg error as the store's own error (picklable, for the writer's pipe)."""
    if isinstance(exc, psycopg.errors.UniqueViolation):
        return DuplicateKey(f"UNIQUE constraint failed: {_first_line(exc)}")
    if getattr(exc, "sqlstate", None) == lease.FENCED_SQLSTATE:
        return Fenced(_first_line(exc))
    if isinstance(exc, psycopg.errors.DiskFull):
        return StoreError("the database's disk is full; nothing was recorded")
    if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
        return StoreError(f"the PostgreSQL journal is unreachable: {_first_line(exc)}")
    return StoreError(f"the PostgreSQL journal refused the change: {_first_line(exc)}")


class PgConnection:
    """A psycopg connection with the face of the ``sqlite3`` connection the journal's queries
    were written for. Reconnects, outside a transaction, when the link was lost."""

    def __init__(self, url: str, epoch: int | None, application_name: str,
                 timeout_s: float) -> None:
        self._url = url
        self._epoch = epoch
        self._name = application_name
        self._timeout_s = timeout_s
        self.in_transaction = False
        self._conn = self._open()

    def _open(self) -> psycopg.Connection[Any]:
        conn = connect(self._url, self._name, self._timeout_s, row_factory=_rows)
        if self._epoch is not None:
            conn.execute(f"SET trellis.epoch = {int(self._epoch)}")
        return conn

    def set_epoch(self, epoch: int) -> None:
        self._epoch = epoch
        self.execute(f"SET trellis.epoch = {int(epoch)}")

    @property
    def raw(self) -> psycopg.Connection[Any]:
        """The psycopg connection, reopened first if the last one broke."""
        if (self._conn.closed or self._conn.broken) and not self.in_transaction:
            log.warning("journal: reconnecting to PostgreSQL")
            self._conn.close()
            self._conn = self._open()
        return self._conn

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        try:
            if params:
                return self.raw.execute(pg_query(sql), params)
            return self.raw.execute(sql)
        except psycopg.Error as exc:
            raise translate(exc) from None

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        try:
            with self.raw.cursor() as cur:
                cur.executemany(pg_query(sql), rows)
        except psycopg.Error as exc:
            raise translate(exc) from None

    def executescript(self, script: str) -> None:
        """A schema script in SQLite's types: run in PostgreSQL's, then fence every table."""
        try:
            conn = self.raw
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (lease.SCHEMA_LOCK_KEY,))
                conn.execute(pg_schema(script))
                lease.fence_tables(conn)
        except psycopg.Error as exc:
            raise translate(exc) from None

    def getlimit(self, _category: int) -> int:
        return _MAX_PARAMS

    def close(self) -> None:
        self._conn.close()


class PgStore(Store):
    """The journal in PostgreSQL; see the module's docstring."""

    backend = "postgresql"

    def __init__(self, url: str, epoch: int | None = None, *, migrate: bool = True,
                 application_name: str = "trellis-master", timeout_s: float = 10.0) -> None:
        self.url = url
        self.epoch = epoch
        self.path = None  # type: ignore[assignment]  # no file: see location
        self.db = PgConnection(url, epoch, application_name, timeout_s)  # type: ignore[assignment]
        if migrate:
            self.migrate()

    @property
    def location(self) -> str:
        return self.url

    def set_epoch(self, epoch: int) -> None:
        """Write from now on as the leadership of ``epoch``."""
        self.epoch = epoch
        self.db.set_epoch(epoch)  # type: ignore[attr-defined]

    def migrate(self) -> int:
        """Create the schema or bring it up to date; the version it is at."""
        conn = self.db.raw  # type: ignore[attr-defined]
        try:
            lease.ensure_schema(conn)
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (lease.SCHEMA_LOCK_KEY,))
                conn.execute(pg_schema(
                    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, "
                    "value TEXT NOT NULL)"))
                row = conn.execute(
                    "SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
                version = int(row[0]) if row else 0
                for number, script in MIGRATIONS:
                    if number > version:
                        conn.execute(pg_schema(script))
                        version = number
                        log.info("journal: PostgreSQL schema at version %d", version)
                lease.fence_tables(conn)
                # The version row is written with the fence down for this one statement:
                # migrations run before any leader may write (the lease row may not exist).
                conn.execute("ALTER TABLE meta DISABLE TRIGGER trellis_fence")
                conn.execute(
                    "INSERT INTO meta (key, value) VALUES ('schema_version', %s) "
                    "ON CONFLICT (key) DO UPDATE SET value = excluded.value", (str(version),))
                conn.execute("ALTER TABLE meta ENABLE TRIGGER trellis_fence")
        except psycopg.Error as exc:
            raise translate(exc) from None
        return version

    def close(self) -> None:
        self.db.close()

    def _tx(self, fn, *args):  # type: ignore[no-untyped-def]
        db: PgConnection = self.db  # type: ignore[assignment]
        conn = db.raw
        try:
            with conn.transaction():
                db.in_transaction = True
                try:
                    return fn(*args)
                finally:
                    db.in_transaction = False
        except psycopg.Error as exc:
            raise translate(exc) from None
