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


def open_store(location: str, epoch: int | None = None, *, migrate: bool = True,
               application_name: str = "trellis-master") -> Store:
    """The store at ``location``: ``postgresql://...`` (writing as leadership ``epoch``) or
    the path of a SQLite file."""
    if is_postgres(location):
        from masterd.journal.pgstore import PgStore

        return PgStore(location, epoch, migrate=migrate, application_name=application_name)
    return Store(Path(location))
