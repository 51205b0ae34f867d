"""GENIE's model database in the live master (seeds/genie.md §6, Fig. 12).

One :class:`ModelDB` object is shared by the master and every policy that predicts (SWAF, the
predicting baselines, SWAF inside SODA's arrays), so a model loaded by an operator or fitted
by the profiler changes the next scheduling pass (``ModelDB.version`` tells the policies to
re-plan). It starts from a *base* — the ``modeldb`` file named in the policy options, else the
built-in table — with the rows of the journal's ``genie_models`` table on top: everything
loaded with ``load_models`` or fitted by the profiler, which therefore survives restarts.

The table (``masterd.journal.models``) lives in the master's journal. It is created and read
synchronously when the master starts, before anything is written through the journal (as the
master's own restore does); later writes go through the journal's writer process.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from masterd.core.arrays.config import ArrayConfig
from masterd.core.arrays.layout import GPU_KINDS
from masterd.core.arrays.policy import ArrayPolicy
from masterd.core.genie.modeldb import ModelDB, ModelDBError, ModelEntry
from masterd.core.genie.options import load_modeldb
from masterd.core.policies import POLICIES, REGISTRY
from masterd.core.policy import Policy
from masterd.journal.models import create_tables, read_rows, write_rows
from masterd.runtime.context import FeatureContext

log = logging.getLogger("trellis.master.models")

MAX_ROWS = 10_000  # one load_models call


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
        return ArrayPolicy(config, registry=POLICIES, inner_factories=factories)
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

    def __init__(self, ctx: FeatureContext, base: ModelDB) -> None:
        self.ctx = ctx
        self.db = base
        ctx.journal.now(create_tables)
        rows, default = ctx.journal.now(read_rows)
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
    def for_config(cls, ctx: FeatureContext, policy: str,
                   options: Mapping[str, Any]) -> ModelStore:
        return cls(ctx, load_modeldb(base_path(policy, options)))

    def _set_default(self, gpu_model: str) -> None:
        if gpu_model != self.db.default_gpu_model:
            self.db.default_gpu_model = gpu_model
            self.db.version += 1  # fallbacks resolve differently now: plans must be redone

    async def put(self, entries: Iterable[ModelEntry], origin: str,
                  default_gpu_model: str | None = None) -> list[ModelEntry]:
        """Store entries durably, then make them live (the next pass uses them)."""
        items = list(entries)
        now = self.ctx.clock()
        event = (now, None, None, "models_loaded", {
            "origin": origin, "count": len(items),
            "models": [f"{e.model_type}/{e.gpu_model}/{e.kind}" for e in items[:20]],
        })
        await self.ctx.journal.call(write_rows, items, now, default_gpu_model, event)
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
