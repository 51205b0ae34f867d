"""Why each drained node is drained, in the master's journal (SQLite or PostgreSQL, one SQL).

``node_drains``: the operator's reason and since when, one row per drained node. A drain or
undrain is one transaction: the nodes table's ``drained`` flag (what a restarted master
closes), this row (the condition's sentence, so ``trellisctl node`` says why after a restart
too) and the ``drained``/``undrained`` event.
"""

from __future__ import annotations

from typing import Any

from masterd.journal.store import Store, event_rows, insert_events

SCHEMA = """
CREATE TABLE IF NOT EXISTS node_drains (
    node TEXT PRIMARY KEY,
    since REAL NOT NULL,
    reason TEXT NOT NULL
);
"""


def ensure_schema(store: Store) -> None:
    store.db.executescript(SCHEMA)


def load_drains(store: Store) -> dict[str, tuple[float, str]]:
    """node -> (since, reason) of every drain the journal holds."""
    ensure_schema(store)
    rows = store.db.execute("SELECT node, since, reason FROM node_drains").fetchall()
    return {str(r[0]): (float(r[1]), str(r[2])) for r in rows}


def save_drain(store: Store, node: str, drained: bool, since: float, reason: str,
               event: tuple[Any, ...]) -> None:
    """Drain (or undrain) a registered node: its flag, its reason and its event, in one
    transaction."""

    def run() -> None:
        store.db.execute("UPDATE nodes SET drained=? WHERE name=?", (int(drained), node))
        if drained:
            store.db.execute(
                "INSERT INTO node_drains (node, since, reason) VALUES (?,?,?) ON CONFLICT(node) "
                "DO UPDATE SET since=excluded.since, reason=excluded.reason",
                (node, since, reason))
        else:
            store.db.execute("DELETE FROM node_drains WHERE node=?", (node,))
        insert_events(store.db, event_rows([event]))

    store.transaction(run)
