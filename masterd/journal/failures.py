"""The failure features' tables in the master's journal (SQLite or PostgreSQL, one SQL).

* ``nodes_down``: each node declared lost (masterd.features.nodeloss), since when and why; a
  row is written with the ``node_down`` event, in one transaction, before any of its jobs is
  touched, and removed when the node says hello again. A restarted master reads it back: a
  node that was down is down at once, and the jobs it still holds are settled then.
* ``gpu_faults``: each GPU held out of service (masterd.features.gpufaults): the Xid (NULL
  without one), the reason, whether it was fatal, since when. Removed when the GPU is
  returned (``trellisctl gpu reset``, or the node reporting it healthy after a check).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from masterd.journal.store import Store, event_rows, insert_events

SCHEMA = """
CREATE TABLE IF NOT EXISTS nodes_down (
    node TEXT PRIMARY KEY,
    since REAL NOT NULL,
    reason TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS gpu_faults (
    node TEXT NOT NULL,
    gpu INTEGER NOT NULL,
    xid INTEGER,
    reason TEXT NOT NULL,
    fatal INTEGER NOT NULL,
    since REAL NOT NULL,
    PRIMARY KEY (node, gpu)
);
"""


@dataclass(frozen=True)
class GpuFault:
    """Why a GPU is out of service: its Xid (None: lost or reset required without one),
    the node's sentence, whether its jobs were stopped (fatal), and since when."""

    xid: int | None
    reason: str
    fatal: bool
    since: float


def ensure_schema(store: Store) -> None:
    store.db.executescript(SCHEMA)


# -- nodes down -------------------------------------------------------------------------------


def load_down(store: Store) -> dict[str, tuple[float, str]]:
    ensure_schema(store)
    rows = store.db.execute("SELECT node, since, reason FROM nodes_down").fetchall()
    return {str(r[0]): (float(r[1]), str(r[2])) for r in rows}


def save_down(store: Store, node: str, since: float, reason: str,
              event: tuple[Any, ...]) -> None:
    """Declare ``node`` down, with its event, in one transaction."""

    def run() -> None:
        store.db.execute(
            "INSERT INTO nodes_down (node, since, reason) VALUES (?,?,?) ON CONFLICT(node) "
            "DO UPDATE SET since=excluded.since, reason=excluded.reason", (node, since, reason))
        insert_events(store.db, event_rows([event]))

    store.transaction(run)


def clear_down(store: Store, node: str, event: tuple[Any, ...]) -> None:
    """``node`` is back: no longer down, with its event."""

    def run() -> None:
        store.db.execute("DELETE FROM nodes_down WHERE node=?", (node,))
        insert_events(store.db, event_rows([event]))

    store.transaction(run)


# -- GPU faults -------------------------------------------------------------------------------


def load_faults(store: Store) -> dict[tuple[str, int], GpuFault]:
    ensure_schema(store)
    rows = store.db.execute("SELECT node, gpu, xid, reason, fatal, since FROM gpu_faults"
                            ).fetchall()
    return {(str(r[0]), int(r[1])): GpuFault(None if r[2] is None else int(r[2]), str(r[3]),
                                             bool(r[4]), float(r[5])) for r in rows}


def save_fault(store: Store, node: str, gpu: int, fault: GpuFault,
               event: tuple[Any, ...]) -> None:
    def run() -> None:
        store.db.execute(
            "INSERT INTO gpu_faults (node, gpu, xid, reason, fatal, since) VALUES "
            "(?,?,?,?,?,?) ON CONFLICT(node, gpu) DO UPDATE SET xid=excluded.xid, "
            "reason=excluded.reason, fatal=excluded.fatal, since=excluded.since",
            (node, gpu, fault.xid, fault.reason, int(fault.fatal), fault.since))
        insert_events(store.db, event_rows([event]))

    store.transaction(run)


def clear_fault(store: Store, node: str, gpu: int, event: tuple[Any, ...]) -> None:
    def run() -> None:
        store.db.execute("DELETE FROM gpu_faults WHERE node=? AND gpu=?", (node, gpu))
        insert_events(store.db, event_rows([event]))

    store.transaction(run)
