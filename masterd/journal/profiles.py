"""The journal's ``genie_profiles`` table: GENIE's profiling campaigns, one JSON document each
(``masterd.features.genie.profiler`` runs them).

Each function runs in the journal's writer as one transaction (``JournalPort.call``), or on
the master's thread before it serves (``JournalPort.now``).
"""

from __future__ import annotations

import json
from typing import Any

from masterd.journal.store import Store, event_rows, insert_events

SCHEMA = """
CREATE TABLE IF NOT EXISTS genie_profiles (
    id TEXT PRIMARY KEY,
    created REAL NOT NULL,
    state TEXT NOT NULL,
    data TEXT NOT NULL
);
"""


def create_tables(store: Store) -> None:
    store.db.executescript(SCHEMA)


def read_campaigns(store: Store) -> list[dict[str, Any]]:
    rows = store.db.execute("SELECT data FROM genie_profiles ORDER BY created, id").fetchall()
    return [json.loads(r[0]) for r in rows]


def write_campaign(store: Store, data: dict[str, Any], event: tuple[Any, ...] | None) -> None:
    def run() -> None:
        store.db.execute(
            "INSERT INTO genie_profiles (id, created, state, data) VALUES (?,?,?,?) "
            "ON CONFLICT(id) DO UPDATE SET state=excluded.state, data=excluded.data",
            (data["id"], data["created"], data["state"], json.dumps(data)),
        )
        if event is not None:
            insert_events(store.db, event_rows([event]))

    store.transaction(run)
