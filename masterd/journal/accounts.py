"""The journal's ``account_tree`` table: the account tree as changed at run time
(``trellisctl account``), one JSON document, so a restart or a failover finds it.

The master's configuration ([[master.accounts]]) seeds it once, when the journal holds no
tree yet; from then on the journalled tree is the truth (masterd.features.accounts).
Each function runs in the journal's writer as one transaction (``JournalPort.call``), or on
the master's thread before it serves (``JournalPort.now``).
"""

from __future__ import annotations

import json
from typing import Any

from masterd.journal.store import Store, event_rows, insert_events
from shared.accounts import Account
from shared.schema import decode, encode

SCHEMA = """
CREATE TABLE IF NOT EXISTS account_tree (
    id INTEGER PRIMARY KEY,
    changed REAL NOT NULL,
    data TEXT NOT NULL
);
"""


def create_tables(store: Store) -> None:
    store.db.executescript(SCHEMA)


def read_tree(store: Store) -> list[Account] | None:
    """The journalled accounts, or None when no tree was ever journalled."""
    return tree_of(store.db)


def tree_of(db: Any) -> list[Account] | None:
    """:func:`read_tree` on any connection to the journal (``trellis-sim whatif``'s reader
    too)."""
    row = db.execute("SELECT data FROM account_tree WHERE id = 1").fetchone()
    if row is None:
        return None
    return [decode(Account, item, f"account_tree[{i}]")
            for i, item in enumerate(json.loads(row[0]))]


def write_tree(store: Store, accounts: list[Account], when: float,
               event: tuple[Any, ...] | None) -> None:
    """Replace the journalled tree (and record ``event``) in one transaction."""
    data = json.dumps([encode(a) for a in accounts])

    def run() -> None:
        store.db.execute(
            "INSERT INTO account_tree (id, changed, data) VALUES (1, ?, ?) "
            "ON CONFLICT(id) DO UPDATE SET changed=excluded.changed, data=excluded.data",
            (when, data))
        if event is not None:
            insert_events(store.db, event_rows([event]))

    store.transaction(run)
