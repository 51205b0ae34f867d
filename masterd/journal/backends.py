"""Which store a location names: a PostgreSQL URL, else a SQLite file.

psycopg is imported only for a PostgreSQL store, so the embedded default needs nothing
beyond the standard library's sqlite3.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from masterd.journal.store import Store

POSTGRES_SCHEMES = ("postgresql://", "postgres://")


def is_postgres(location: str) -> bool:
    return location.startswith(POSTGRES_SCHEMES)


def check_location(location: str) -> None:
    """ValueError naming what is wrong with a PostgreSQL URL (never echoing the URL, which
    may hold a password); a SQLite path is checked when it is opened."""
    if not is_postgres(location):
        return
    from psycopg import ProgrammingError, conninfo

    try:
        conninfo.conninfo_to_dict(location)
    except ProgrammingError as exc:
        reason = str(exc).split(" in URI", 1)[0].split(': "', 1)[0].strip()
        raise ValueError(f"store is not a valid PostgreSQL URL: {reason}") from None


def open_reader(location: str, application_name: str = "trellis-worker") -> Any:
    """A connection for reading the journal beside its writer (a worker process training on
    the history): SQLite read-only (WAL lets it read while the writer writes), or a
    PostgreSQL session that carries no epoch (the fence refuses any write from it). Both run
    the journal's ``?``-placeholder queries; close it when done."""
    if is_postgres(location):
        from masterd.journal.pgstore import PgConnection

        return PgConnection(location, None, application_name, timeout_s=10.0)
    db = sqlite3.connect(f"file:{location}?mode=ro", uri=True)
    db.execute("PRAGMA busy_timeout=5000")
    return db


def open_store(location: str, epoch: int | None = None, *, migrate: bool = True,
               application_name: str = "trellis-master") -> Store:
    """The store at ``location``: ``postgresql://...`` (writing as leadership ``epoch``) or
    the path of a SQLite file."""
    if is_postgres(location):
        from masterd.journal.pgstore import PgStore

        return PgStore(location, epoch, migrate=migrate, application_name=application_name)
    return Store(Path(location))
