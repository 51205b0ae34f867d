"""Helios' tables and reads in the master's journal.

* Finished jobs as QSSF's estimator learns from them (:func:`finished_jobs`): read from the
  ``jobs`` table, in the master before it serves (``JournalPort.now``) or in a worker process
  through a reading connection of its own (``masterd.journal.backends.open_reader``: SQLite
  or PostgreSQL, whichever the journal is).
* ``power_nodes``: each node's power state (``powering_down``, ``powered_down``,
  ``powering_up``) since when and why; a node without a row is on. Survives restarts.
* ``power_history``: the busy and total node counts per CES step (the step's maximum), the
  forecaster's training data.
"""

from __future__ import annotations

from typing import Any

from masterd.core.helios.duration_model import JobRow
from masterd.journal.store import Store, event_rows, insert_events
from shared.protocol import unpack

SCHEMA = """
CREATE TABLE IF NOT EXISTS power_nodes (
    node TEXT PRIMARY KEY,
    state TEXT NOT NULL,
    since REAL NOT NULL,
    reason TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS power_history (
    step INTEGER PRIMARY KEY,
    busy INTEGER NOT NULL,
    total INTEGER NOT NULL
);
"""


def create_tables(store: Store) -> None:
    store.db.executescript(SCHEMA)


def finished_jobs(db: Any, limit: int) -> list[JobRow]:
    """The newest ``limit`` finished jobs (by submission), oldest first, with their run time."""
    rows = db.execute("SELECT spec, submit_time, data FROM jobs WHERE state='finished' "
                      "ORDER BY seq DESC LIMIT ?", (limit,)).fetchall()
    out: list[JobRow] = []
    for spec_blob, submit_time, data_blob in reversed(rows):
        spec: dict[str, Any] = unpack(spec_blob)
        data: dict[str, Any] = unpack(data_blob)
        start, end = data.get("start_time"), data.get("end_time")
        if start is None or end is None or end < start:
            continue
        out.append(JobRow(user=str(spec.get("user", "")), tenant=str(spec.get("tenant",
                                                                              "default")),
                          name=str(spec.get("name", "")), gpus=int(spec.get("gpus", 0)),
                          cpus=int(spec.get("cpus", 1)), submit_time=float(submit_time),
                          duration_s=float(end - start)))
    return out


def finished_from_store(store: Store, limit: int) -> list[JobRow]:
    return finished_jobs(store.db, limit)


# -- power -----------------------------------------------------------------------------------


def load_power(store: Store) -> dict[str, tuple[str, float, str]]:
    create_tables(store)
    rows = store.db.execute("SELECT node, state, since, reason FROM power_nodes").fetchall()
    return {r[0]: (r[1], r[2], r[3]) for r in rows}


def save_power(store: Store, node: str, state: str | None, since: float, reason: str,
               event: tuple[Any, ...]) -> None:
    """Set (or clear, ``state=None``) a node's power state, with its event, in one
    transaction."""

    def run() -> None:
        if state is None:
            store.db.execute("DELETE FROM power_nodes WHERE node=?", (node,))
        else:
            store.db.execute(
                "INSERT INTO power_nodes (node, state, since, reason) VALUES (?,?,?,?) "
                "ON CONFLICT(node) DO UPDATE SET state=excluded.state, since=excluded.since, "
                "reason=excluded.reason", (node, state, since, reason))
        insert_events(store.db, event_rows([event]))

    store.transaction(run)


def save_history(store: Store, step: int, busy: int, total: int) -> None:
    def run() -> None:
        store.db.execute(
            "INSERT INTO power_history (step, busy, total) VALUES (?,?,?) ON CONFLICT(step) "
            # CASE, not SQLite's two-argument max(): the same SQL runs on PostgreSQL.
            "DO UPDATE SET busy=CASE WHEN excluded.busy > power_history.busy "
            "THEN excluded.busy ELSE power_history.busy END, "
            "total=CASE WHEN excluded.total > power_history.total "
            "THEN excluded.total ELSE power_history.total END",
            (step, busy, total))

    store.transaction(run)


def load_history(store: Store, limit: int) -> list[tuple[int, int, int]]:
    """The newest ``limit`` steps, oldest first: (step, busy, total)."""
    create_tables(store)
    rows = store.db.execute("SELECT step, busy, total FROM power_history ORDER BY step DESC "
                            "LIMIT ?", (limit,)).fetchall()
    return [(int(s), int(b), int(t)) for s, b, t in reversed(rows)]
