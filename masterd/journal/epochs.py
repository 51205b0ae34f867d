"""The master epoch of a SQLite journal: a count of the master's starts, kept in ``meta``.

On PostgreSQL the epoch is the leadership's (masterd.journal.lease: +1 at every takeover).
A SQLite journal has one master, but the nodes fence on the epoch all the same
(noded/fencing.py): each start of the master takes the next number, so a node refuses any
command still coming from a master process that was replaced (frozen and restarted under
it, say). It is journalled, with an ``epoch`` event, before the master serves.
"""

from __future__ import annotations

from typing import Any

from masterd.journal.store import Store, event_rows, insert_events

KEY = "master_epoch"


def read_epoch(db: Any) -> int:
    """The epoch last taken (0: none yet)."""
    row = db.execute("SELECT value FROM meta WHERE key = ?", (KEY,)).fetchone()
    return int(row[0]) if row is not None else 0


def take_next_epoch(store: Store, now: float) -> int:
    """Take (and journal) the epoch this start of the master leads at."""

    def run() -> int:
        epoch = read_epoch(store.db) + 1
        store.db.execute("INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT(key) "
                         "DO UPDATE SET value = excluded.value", (KEY, str(epoch)))
        insert_events(store.db, event_rows([(now, None, None, "epoch",
                                             {"epoch": epoch, "store": "sqlite"})]))
        return epoch

    return store.transaction(run)
