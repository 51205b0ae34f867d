"""The journal's ``genie_models`` table: GENIE's model database rows that operators loaded or
the profiler fitted, kept across restarts (``masterd.features.genie.models`` keeps them live).

Each function runs in the journal's writer as one transaction (``JournalPort.call``), or on
the master's thread before it serves (``JournalPort.now``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from masterd.core.genie.modeldb import ROW_FIELDS, ModelEntry
from masterd.journal.store import Store, event_rows, insert_events

SCHEMA = """
CREATE TABLE IF NOT EXISTS genie_models (
    key TEXT PRIMARY KEY,
    model_type TEXT NOT NULL,
    gpu_model TEXT NOT NULL,
    kind TEXT NOT NULL,
    family TEXT,
    params_m REAL,
    k0 REAL NOT NULL,
    k1 REAL NOT NULL,
    k2 REAL NOT NULL,
    gamma REAL NOT NULL,
    lam REAL NOT NULL,
    nu REAL NOT NULL,
    max_local_batch REAL,
    source TEXT NOT NULL,
    updated REAL NOT NULL
);
"""
DEFAULT_GPU_KEY = "genie.default_gpu_model"


def _key(entry: ModelEntry) -> str:
    return "|".join(entry.key)


def create_tables(store: Store) -> None:
    store.db.executescript(SCHEMA)


def read_rows(store: Store) -> tuple[list[dict[str, Any]], str | None]:
    rows = store.db.execute(
        f"SELECT {', '.join(ROW_FIELDS)} FROM genie_models ORDER BY key"
    ).fetchall()
    meta = store.db.execute("SELECT value FROM meta WHERE key=?", (DEFAULT_GPU_KEY,)).fetchone()
    return [dict(r) for r in rows], (meta[0] if meta else None)


def write_rows(
    store: Store,
    entries: Sequence[ModelEntry],
    updated: float,
    default_gpu_model: str | None,
    event: tuple[Any, ...] | None,
) -> None:
    def run() -> None:
        for e in entries:
            c = e.coefficients
            store.db.execute(
                "INSERT INTO genie_models (key, model_type, gpu_model, kind, family, params_m, "
                "k0, k1, k2, gamma, lam, nu, max_local_batch, source, updated) "
                "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?) ON CONFLICT(key) DO UPDATE SET "
                "model_type=excluded.model_type, gpu_model=excluded.gpu_model, "
                "family=excluded.family, params_m=excluded.params_m, k0=excluded.k0, "
                "k1=excluded.k1, k2=excluded.k2, gamma=excluded.gamma, lam=excluded.lam, "
                "nu=excluded.nu, max_local_batch=excluded.max_local_batch, "
                "source=excluded.source, updated=excluded.updated",
                (_key(e), e.model_type, e.gpu_model, e.kind, e.family, e.params_m, c.k0, c.k1,
                 c.k2, c.gamma, c.lam, c.nu, c.max_local_batch, e.source, updated),
            )
        if default_gpu_model is not None:
            store.db.execute(
                "INSERT INTO meta (key, value) VALUES (?, ?) "
                "ON CONFLICT(key) DO UPDATE SET value=excluded.value",
                (DEFAULT_GPU_KEY, default_gpu_model),
            )
        if event is not None:
            insert_events(store.db, event_rows([event]))

    store.transaction(run)
