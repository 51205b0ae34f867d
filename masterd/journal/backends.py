"""Which store a location names: a PostgreSQL URL, else a SQLite file.

psycopg is imported only for a PostgreSQL store, so the embedded default needs nothing
beyond the standard library's sqlite3.
"""

from __future__ import annotations

from pathlib import Path

from masterd.journal.store import Store

POSTGRES_SCHEMES = ("postgresql://", "postgres://")


def is_postgres(location: str) -> bool:
    return location.startswith(POSTGRES_SCHEMES)


def open_store(location: str, epoch: int | None = None, *, migrate: bool = True,
               application_name: str = "trellis-master") -> Store:
    """The store at ``location``: ``postgresql://...`` (writing as leadership ``epoch``) or
    the path of a SQLite file."""
    if is_postgres(location):
        from masterd.journal.pgstore import PgStore

        return PgStore(location, epoch, migrate=migrate, application_name=application_name)
    return Store(Path(location))
