"""Maintenance windows in the master's journal (SQLite or PostgreSQL, one SQL).

``maintenance_windows``: one row per planned window not yet over. A window planned or
removed is one transaction with its ``maintenance_planned``/``maintenance_removed`` event;
a window that has passed is removed the same way (``maintenance_ended``).
"""

from __future__ import annotations

from typing import Any

from masterd.journal.store import Store, event_rows, insert_events
from shared.maintenance import Window

SCHEMA = """
CREATE TABLE IF NOT EXISTS maintenance_windows (
    name TEXT PRIMARY KEY,
    nodes TEXT NOT NULL,
    start_time REAL NOT NULL,
    end_time REAL NOT NULL,
    reason TEXT NOT NULL
);
"""


def ensure_schema(store: Store) -> None:
    store.db.executescript(SCHEMA)


def load_windows(store: Store) -> list[Window]:
    ensure_schema(store)
    rows = store.db.execute("SELECT name, nodes, start_time, end_time, reason FROM "
                            "maintenance_windows ORDER BY start_time, name").fetchall()
    return [Window(str(r[0]), str(r[1]), float(r[2]), float(r[3]), str(r[4])) for r in rows]


def save_window(store: Store, window: Window, event: tuple[Any, ...]) -> None:
    def run() -> None:
        store.db.execute(
            "INSERT INTO maintenance_windows (name, nodes, start_time, end_time, reason) "
            "VALUES (?,?,?,?,?)",
            (window.name, window.nodes, window.start, window.end, window.reason))
        insert_events(store.db, event_rows([event]))

    store.transaction(run)


def delete_window(store: Store, name: str, event: tuple[Any, ...]) -> None:
    def run() -> None:
        store.db.execute("DELETE FROM maintenance_windows WHERE name=?", (name,))
        insert_events(store.db, event_rows([event]))

    store.transaction(run)
