"""SODA's core-count history in the master's journal (§V-B1): owner × category → cores.

N_start for a training job is the largest core count its owner's earlier jobs of the same
model category converged to. The history lives in the master's SQLite file, in its own table,
and is written by the journal's writer process like every other write, so it survives
restarts and is ordered with the job records. These functions run in the writer (through
``Journal.call``) or before the event loop starts.
"""

from __future__ import annotations

import logging
import sqlite3

from masterd.journal.store import Store, StoreError

log = logging.getLogger("trellis.store.cores")

SCHEMA = """
CREATE TABLE IF NOT EXISTS core_history (
    owner TEXT NOT NULL,
    category TEXT NOT NULL,
    cores INTEGER NOT NULL,
    updated REAL NOT NULL,
    PRIMARY KEY (owner, category)
);
"""


def ensure_schema(store: Store) -> None:
    try:
        store.db.executescript(SCHEMA)
    except sqlite3.Error as exc:
        raise StoreError(f"cannot create the core history table: {exc}") from exc


def load_history(store: Store) -> dict[tuple[str, str], int]:
    """Every (owner, category) with the largest count its jobs converged to."""
    ensure_schema(store)
    rows = store.db.execute("SELECT owner, category, cores FROM core_history").fetchall()
    return {(r["owner"], r["category"]): int(r["cores"]) for r in rows}


def remember_cores(store: Store, owner: str, category: str, cores: int, now: float) -> int:
    """Record a converged count; the row keeps the largest. Returns the stored value.

    One statement, so sqlite's autocommit makes it atomic without an explicit transaction.
    """
    if cores < 1:
        raise ValueError(f"a converged core count must be at least 1, got {cores}")
    try:
        store.db.execute(
            "INSERT INTO core_history (owner, category, cores, updated) VALUES (?,?,?,?) "
            "ON CONFLICT(owner, category) DO UPDATE SET "
            # CASE, not SQLite's two-argument MAX: the same SQL runs on PostgreSQL.
            "cores=CASE WHEN excluded.cores > core_history.cores THEN excluded.cores "
            "ELSE core_history.cores END, updated=excluded.updated",
            (owner, category, cores, now),
        )
        row = store.db.execute(
            "SELECT cores FROM core_history WHERE owner=? AND category=?", (owner, category)
        ).fetchone()
    except sqlite3.OperationalError as exc:
        if "full" in str(exc).lower():
            raise StoreError("the master's disk is full; the core history was not "
                             "recorded") from exc
        raise StoreError(f"the store could not record the core history: {exc}") from exc
    return int(row["cores"])
