"""RPC methods for GENIE's model database and profiler and SODA's pools.

``models`` · ``load_models {path | rows, default_gpu_model?}`` · ``profile {...}`` ·
``profiles {id?}`` · ``pools`` · ``resize_arrays``; plus the ``prediction`` and ``metrics`` of
a job added to the ``job`` method's result.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from masterd.core.scheduler import JobError
from masterd.features.genie.prediction import predict
from masterd.features.genie.profiler import ProfileRequest
from masterd.service.master import Master
from shared.model import NAME_PATTERN, UNIX_USER_PATTERN, Job
from shared.rpcdoc import returns
from shared.schema import bounded

Handler = tuple[type, Callable[[Any], Awaitable[Any]]]


@dataclass(frozen=True)
class NoParams:
    pass


@dataclass(frozen=True)
class LoadModelsParams:
    # A .json/.toml model database on the master's host ...
    path: str | None = bounded(None, max_len=4096)
    # ... or its rows: tables with the keys of ModelDB.ROW_FIELDS.
    rows: tuple[dict[str, Any], ...] | None = bounded(None, max_len=10_000)
    default_gpu_model: str | None = bounded(None, max_len=128)


@dataclass(frozen=True)
class ProfileParams:
    model_type: str = bounded(max_len=128)
    command: tuple[str, ...] = bounded(max_len=1024)
    user: str = bounded(pattern=UNIX_USER_PATTERN)
    gpu_model: str | None = bounded(None, max_len=128)
    kind: str = bounded("training", pattern="training|inference")
    batches: tuple[int, ...] = bounded((8, 16, 32, 64), min=1, max=1 << 24, max_len=64)
    global_batch: int | None = bounded(None, min=1, max=1 << 24)
    iterations: int = bounded(100, min=1, max=1 << 24)
    max_nodes: int | None = bounded(None, min=1, max=64)
    max_gpus_per_node: int | None = bounded(None, min=1, max=64)
    cpus_per_gpu: int = bounded(1, min=0, max=256)
    memory_mib: int = bounded(0, min=0, max=1 << 30)
    tenant: str = bounded("default", pattern=NAME_PATTERN)
    family: str | None = bounded(None, max_len=64)
    params_m: float | None = bounded(None, min=0)
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ProfilesParams:
    id: str | None = bounded(None, max_len=256)


def method_table(master: Master) -> dict[str, Handler]:
    features = master.features
    @returns("`models`: every row of the model database (`model_type`, `gpu_model`, `kind`, "
             "`family`, `k0`, `k1`, `k2`, `gamma`, `lam`, `nu`, `source`, `stored`); "
             "`default_gpu_model`.")
    async def models(_: NoParams) -> dict[str, Any]:
        """GENIE's prediction model database."""
        return {"models": features.models.listing(),
                "default_gpu_model": features.models.db.default_gpu_model}

    @returns("`loaded`: how many rows; `models`: `TYPE/GPU_MODEL/KIND` of each.",
             ("invalid_params",))
    async def load_models(p: LoadModelsParams) -> dict[str, Any]:
        """Add or replace model rows, from a file on the master's host or given inline."""
        if (p.path is None) == (p.rows is None):
            raise JobError("invalid_params", "give either path (a .json/.toml file on the "
                           "master's host) or rows")
        if p.path is not None:
            entries = await features.models.load_file(p.path)
        else:
            assert p.rows is not None
            entries = await features.models.load_rows(p.rows, "rpc", p.default_gpu_model)
        master.request_pass()
        return {"loaded": len(entries),
                "models": [f"{e.model_type}/{e.gpu_model}/{e.kind}" for e in entries]}

    @returns("`profile`: the new campaign (`id`, `model_type`, `gpu_model`, `kind`, "
             "`state`, `runs`: each run's `job_id`, `phase`, `d_node`, `d_gpn`, `batch`, "
             "`state`, `rate`).", ("unsatisfiable", "unknown_user", "user_refused"))
    async def profile(p: ProfileParams) -> dict[str, Any]:
        """Start a profiling campaign (B + N + G runs) that fits a model type."""
        request = ProfileRequest(
            model_type=p.model_type, command=p.command, user=p.user, gpu_model=p.gpu_model,
            kind=p.kind, batches=p.batches, global_batch=p.global_batch,
            iterations=p.iterations, max_nodes=p.max_nodes,
            max_gpus_per_node=p.max_gpus_per_node, cpus_per_gpu=p.cpus_per_gpu,
            memory_mib=p.memory_mib, tenant=p.tenant, family=p.family, params_m=p.params_m,
            env=p.env,
        )
        campaign = await features.profiler.start(request)
        return {"profile": features.profiler.view(campaign)}

    @returns("`profiles`: every campaign (or the one asked for) as `profile` returns it, "
             "with `fit` (coefficients and fit errors) once fitted and `error` if it "
             "failed.", ("unknown_profile",))
    async def profiles(p: ProfilesParams) -> dict[str, Any]:
        """Profiling campaigns, or one of them."""
        if p.id is not None:
            return {"profiles": [features.profiler.view(features.profiler.get(p.id))]}
        campaigns = features.profiler.campaigns.values()
        return {"profiles": [features.profiler.view(c) for c in campaigns]}

    @returns("`arrays`: each SODA array's `name`, `kind`, `unit`, `size`, `used`, "
             "`borrowed_out`, `borrowed_in`, `queued`; `last_resize` and `last_change` "
             "(time, jobs, changed) or nil.")
    async def pools(_: NoParams) -> dict[str, Any]:
        """SODA's arrays: sizes, use, loans and queues."""
        return features.arrays.summary()

    @returns("The re-sizing: the sizes before and after and whether they changed.",
             ("invalid_params",))
    async def resize_arrays(_: NoParams) -> dict[str, Any]:
        """Re-derive SODA's array sizes from recent demand now."""
        features.arrays.require()
        return await features.arrays.resize_now()

    return {
        "models": (NoParams, models),
        "load_models": (LoadModelsParams, load_models),
        "profile": (ProfileParams, profile),
        "profiles": (ProfilesParams, profiles),
        "pools": (NoParams, pools),
        "resize_arrays": (NoParams, resize_arrays),
    }


def job_extras(master: Master, job: Job) -> dict[str, Any]:
    """The ``prediction`` and ``metrics`` parts of a ``job`` result."""
    return {
        "prediction": predict(master.context.core, master.features.models.db, job,
                              master.clock()),
        "metrics": master.job_metrics.of(job.id),
    }
