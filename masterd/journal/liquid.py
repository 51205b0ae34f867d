"""The journal's ``liquid_usage`` table: what job parts really used (noded's ``job_usage``),
with the job's features on final rows, so Liquid's resource model can be trained from it
(``masterd.features.liquid``).

Each function runs in the journal's writer as one transaction (``JournalPort.call``), or on
the master's thread before it serves (``JournalPort.now``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from masterd.journal.store import Store

SCHEMA = """
CREATE TABLE IF NOT EXISTS liquid_usage (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id TEXT NOT NULL,
    node TEXT NOT NULL,
    time REAL NOT NULL,
    final INTEGER NOT NULL,
    usage TEXT NOT NULL,
    features TEXT,
    labels TEXT
);
CREATE INDEX IF NOT EXISTS liquid_usage_job ON liquid_usage(job_id);
CREATE INDEX IF NOT EXISTS liquid_usage_final ON liquid_usage(final, seq);
"""


def create_tables(store: Store) -> None:
    store.db.executescript(SCHEMA)


def insert_usage(store: Store, rows: Sequence[tuple[str, str, float, bool, dict[str, Any],
                                                    dict[str, Any] | None,
                                                    dict[str, Any] | None]]) -> None:
    """Rows of (job, node, time, final, usage, features, labels)."""

    def run() -> None:
        for job_id, node, time, final, usage, features, labels in rows:
            store.db.execute(
                "INSERT INTO liquid_usage (job_id, node, time, final, usage, features, labels) "
                "VALUES (?,?,?,?,?,?,?)",
                (job_id, node, time, 1 if final else 0, json.dumps(usage),
                 None if features is None else json.dumps(features),
                 None if labels is None else json.dumps(labels)))

    store.transaction(run)


def job_usage(store: Store, job_id: str) -> list[dict[str, Any]]:
    """The newest report of each node of a job (a final one if there is one)."""
    rows = store.db.execute(
        "SELECT node, time, final, usage FROM liquid_usage WHERE job_id=? ORDER BY seq",
        (job_id,)).fetchall()
    latest: dict[str, dict[str, Any]] = {}
    for row in rows:
        entry = {"node": row[0], "time": row[1], "final": bool(row[2]), **json.loads(row[3])}
        if not latest.get(row[0], {}).get("final"):
            latest[row[0]] = entry
    return [latest[n] for n in sorted(latest)]


def training_rows(store: Store, limit: int) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(features, labels) of the newest ``limit`` final reports that have both."""
    rows = store.db.execute(
        "SELECT features, labels FROM liquid_usage WHERE final=1 AND features IS NOT NULL "
        "AND labels IS NOT NULL ORDER BY seq DESC LIMIT ?", (limit,)).fetchall()
    return [(json.loads(r[0]), json.loads(r[1])) for r in reversed(rows)]
