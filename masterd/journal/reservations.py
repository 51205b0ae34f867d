"""Reservations in the master's journal (SQLite or PostgreSQL, one SQL).

``node_reservations``: one row per reservation not yet over. A reservation created, updated
or deleted is one transaction with its ``reservation_created``/``_updated``/``_deleted``
event; one that has passed is removed the same way (``reservation_ended``).
"""

from __future__ import annotations

from typing import Any

from masterd.journal.store import Store, event_rows, insert_events
from shared.reservations import NodeReservation

SCHEMA = """
CREATE TABLE IF NOT EXISTS node_reservations (
    name TEXT PRIMARY KEY,
    nodes TEXT NOT NULL,
    start_time REAL NOT NULL,
    end_time REAL NOT NULL,
    users TEXT NOT NULL,
    accounts TEXT NOT NULL,
    flags TEXT NOT NULL,
    reason TEXT NOT NULL
);
"""


def ensure_schema(store: Store) -> None:
    store.db.executescript(SCHEMA)


def _words(text: str) -> tuple[str, ...]:
    return tuple(w for w in text.split(",") if w)


def load_reservations(store: Store) -> list[NodeReservation]:
    ensure_schema(store)
    rows = store.db.execute(
        "SELECT name, nodes, start_time, end_time, users, accounts, flags, reason FROM "
        "node_reservations ORDER BY start_time, name").fetchall()
    return [NodeReservation(str(r[0]), str(r[1]), float(r[2]), float(r[3]), _words(str(r[4])),
                            _words(str(r[5])), _words(str(r[6])), str(r[7])) for r in rows]


def save_reservation(store: Store, reservation: NodeReservation,
                     event: tuple[Any, ...]) -> None:
    """Write a new reservation, or replace its namesake (an update)."""
    r = reservation

    def run() -> None:
        store.db.execute("DELETE FROM node_reservations WHERE name=?", (r.name,))
        store.db.execute(
            "INSERT INTO node_reservations (name, nodes, start_time, end_time, users, "
            "accounts, flags, reason) VALUES (?,?,?,?,?,?,?,?)",
            (r.name, r.nodes, r.start, r.end, ",".join(r.users), ",".join(r.accounts),
             ",".join(r.flags), r.reason))
        insert_events(store.db, event_rows([event]))

    store.transaction(run)


def delete_reservation(store: Store, name: str, event: tuple[Any, ...]) -> None:
    def run() -> None:
        store.db.execute("DELETE FROM node_reservations WHERE name=?", (name,))
        insert_events(store.db, event_rows([event]))

    store.transaction(run)
