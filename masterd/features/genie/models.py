"""GENIE's model database in the live master (seeds/genie.md §6, Fig. 12).

One :class:`ModelDB` object is shared by the master and every policy that predicts (SWAF, the
predicting baselines, SWAF inside SODA's arrays), so a model loaded by an operator or fitted
by the profiler changes the next scheduling pass (``ModelDB.version`` tells the policies to
re-plan). It starts from a *base* — the ``modeldb`` file named in the policy options, else the
built-in table — with the rows of the journal's ``genie_models`` table on top: everything
loaded with ``load_models`` or fitted by the profiler, which therefore survives restarts.

The table lives in the master's SQLite journal (same connection). It is created and read
synchronously when the master starts, before anything is written through the journal (as the
master's own restore does); later writes go through the journal's writer process.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from masterd.core.arrays.config import ArrayConfig
from masterd.core.arrays.layout import GPU_KINDS
from masterd.core.arrays.policy import ArrayPolicy
from masterd.core.genie.modeldb import ROW_FIELDS, ModelDB, ModelDBError, ModelEntry
from masterd.core.genie.options import load_modeldb
from masterd.core.policies import REGISTRY
from masterd.core.policy import Policy
from masterd.journal.journal import Journal
from masterd.journal.store import Store, event_rows, insert_events

log = logging.getLogger("trellis.master.models")

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
MAX_ROWS = 10_000  # one load_models call


def _key(entry: ModelEntry) -> str:
    return "|".join(entry.key)


# -- functions run in the journal writer (each one transaction) ---------------------------------
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


# -- the policy, sharing the live database -------------------------------------------------------
def base_path(policy: str, options: Mapping[str, Any]) -> str | None:
    """The ``modeldb`` file the configuration names, if any.

    A predicting policy takes it as its own option; SODA's arrays as an option of an inner
    policy (the first one naming a file wins: they all share one database here).
    """
    if policy == ArrayPolicy.name:
        inner = options.get("inner", {})
        if isinstance(inner, Mapping):
            for spec in inner.values():
                if isinstance(spec, Mapping) and isinstance(spec.get("modeldb"), str):
                    return str(spec["modeldb"])
        return None
    value = options.get("modeldb")
    return str(value) if isinstance(value, str | Path) else None


def predicts(factory: Callable[..., Policy]) -> bool:
    """Whether a policy consults GENIE's prediction model (takes a ``modeldb``)."""
    try:
        return "modeldb" in inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return False


def build_policy(name: str, options: Mapping[str, Any], db: ModelDB) -> Policy:
    """The configured policy, with every predicting part of it reading ``db``."""
    try:
        factory = REGISTRY[name]
    except KeyError:
        known = ", ".join(sorted(REGISTRY))
        raise ValueError(f"unknown scheduling policy {name!r}; known: {known}") from None
    if name == ArrayPolicy.name:
        config = ArrayConfig.from_table(dict(options))
        factories: dict[str, Callable[[], Policy]] = {}
        for kind in GPU_KINDS:
            spec = config.inner.get(kind)
            # ArrayPolicy's own default for GPU arrays is SWAF.
            inner_name = spec.name if spec is not None else "swaf"
            inner_options = dict(spec.options) if spec is not None else {}
            inner = REGISTRY.get(inner_name)
            if inner is not None and predicts(inner):
                factories[kind] = _factory(inner, inner_options, db)
        return ArrayPolicy(config, inner_factories=factories)
    if predicts(factory):
        return factory(**{**options, "modeldb": db})
    return factory(**options)


def _factory(
    factory: Callable[..., Policy], options: dict[str, Any], db: ModelDB
) -> Callable[[], Policy]:
    def make() -> Policy:
        return factory(**{**options, "modeldb": db})

    return make


# -- the live database ---------------------------------------------------------------------------
class ModelStore:
    """The master's model database: base table plus the journal's rows, kept in step."""

    def __init__(self, store: Store, journal: Journal, base: ModelDB,
                 clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.journal = journal
        self.clock = clock
        self.db = base
        create_tables(store)
        rows, default = read_rows(store)
        self.stored: set[tuple[str, str, str]] = set()
        for i, row in enumerate(rows):
            try:
                entry = ModelDB.from_rows([row]).entries()[0]
            except ModelDBError as exc:
                log.error("model row %d in the journal is unusable, skipped: %s", i, exc)
                continue
            self.db.put(entry)
            self.stored.add(entry.key)
        if default:
            self._set_default(default)
        log.info("models total=%d stored=%d default_gpu_model=%s", len(self.db),
                 len(self.stored), self.db.default_gpu_model)

    @classmethod
    def for_config(cls, store: Store, journal: Journal, policy: str,
                   options: Mapping[str, Any]) -> ModelStore:
        return cls(store, journal, load_modeldb(base_path(policy, options)))

    def _set_default(self, gpu_model: str) -> None:
        if gpu_model != self.db.default_gpu_model:
            self.db.default_gpu_model = gpu_model
            self.db.version += 1  # fallbacks resolve differently now: plans must be redone

    async def put(self, entries: Iterable[ModelEntry], origin: str,
                  default_gpu_model: str | None = None) -> list[ModelEntry]:
        """Store entries durably, then make them live (the next pass uses them)."""
        items = list(entries)
        now = self.clock()
        event = (now, None, None, "models_loaded", {
            "origin": origin, "count": len(items),
            "models": [f"{e.model_type}/{e.gpu_model}/{e.kind}" for e in items[:20]],
        })
        await self.journal.call(write_rows, items, now, default_gpu_model, event)
        for entry in items:
            self.db.put(entry)
            self.stored.add(entry.key)
        if default_gpu_model is not None:
            self._set_default(default_gpu_model)
        log.info("models_loaded origin=%s count=%d", origin, len(items))
        return items

    async def load_rows(self, rows: Sequence[Mapping[str, Any]], origin: str,
                        default_gpu_model: str | None = None) -> list[ModelEntry]:
        """Validate rows (``ROW_FIELDS`` keys) and store them; nothing is stored if any is bad."""
        if len(rows) > MAX_ROWS:
            raise ModelDBError(f"at most {MAX_ROWS} models per load, got {len(rows)}")
        parsed = ModelDB.from_rows(rows)  # errors name the row and the field
        return await self.put(parsed.entries(), origin, default_gpu_model)

    async def load_file(self, path: str) -> list[ModelEntry]:
        """Read a ``.json``/``.toml`` model database on the master's host and store it."""
        loaded = ModelDB.load(path)
        return await self.put(loaded.entries(), f"file {path}", loaded.default_gpu_model)

    def listing(self) -> list[dict[str, Any]]:
        out = []
        for e in self.db.entries():
            c = e.coefficients
            out.append({
                "model_type": e.model_type, "gpu_model": e.gpu_model, "kind": e.kind,
                "family": e.family, "params_m": e.params_m,
                "k0": c.k0, "k1": c.k1, "k2": c.k2, "gamma": c.gamma, "lam": c.lam,
                "nu": c.nu, "max_local_batch": c.max_local_batch,
                "source": e.source, "stored": e.key in self.stored,
            })
        return out
