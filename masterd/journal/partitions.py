"""Partition states an admin set at run time (``trellisctl partition update``), in the
master's journal (SQLite or PostgreSQL, one SQL): ``partition_states``, one row per
partition whose state an admin set, written in one transaction with its
``partition_state`` event. They outlive restarts and reloads of the configuration."""

from __future__ import annotations

from typing import Any

from masterd.journal.store import Store, event_rows, insert_events

SCHEMA = """
CREATE TABLE IF NOT EXISTS partition_states (
    name TEXT PRIMARY KEY,
    state TEXT NOT NULL,
    reason TEXT NOT NULL,
    since REAL NOT NULL
);
"""


def load_states(store: Store) -> dict[str, tuple[str, str, float]]:
    """Per partition: (state, reason, since)."""
    store.db.executescript(SCHEMA)
    rows = store.db.execute("SELECT name, state, reason, since FROM partition_states"
                            ).fetchall()
    return {str(r[0]): (str(r[1]), str(r[2]), float(r[3])) for r in rows}


def save_state(store: Store, name: str, state: str, reason: str, since: float,
               event: tuple[Any, ...]) -> None:
    def run() -> None:
        store.db.execute("DELETE FROM partition_states WHERE name=?", (name,))
        store.db.execute("INSERT INTO partition_states (name, state, reason, since) "
                         "VALUES (?,?,?,?)", (name, state, reason, since))
        insert_events(store.db, event_rows([event]))

    store.transaction(run)
