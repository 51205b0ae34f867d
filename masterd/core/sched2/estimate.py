"""Predicted execution times: what SCHED²'s profiling tool measures (seeds/sched2.md §III-B).

The paper profiles each job "under k different placements (from concentrated to scattered) by
executing it for a few mini-batches" and computes the remaining time of running jobs from their
mini-batch time. Trellis already has that profiler: GENIE's (``trellisctl profile``), whose fits
land in the model database every predicting policy reads (``modeldb``). So a job's time on
``servers`` servers is GENIE's Eq. 4–8 for its declared model type, batch and iterations, with
its GPUs on those servers: Eq. 8 inside one server, and across servers the slowdown Eq. 8
gives at the one shape SCHED² measured (4 GPUs over two servers, §II-A) extended to ``s``
servers by ``sched2.locality`` (Eq. 8 itself falls to its floor at other shapes for the
locality-sensitive models, inverting the paper's order of them).

A job the database cannot predict (no model type, batch or iterations, nothing similar) takes
``default_duration_s`` wherever it runs: there is nothing to tell its placements apart. A
placement whose communication the model says eats every GPU is taken to run at
``MIN_SCALING`` of linear scaling rather than never (the simulator's truth has the same floor).
In the simulator the database is the oracle (``sim.oracle``): the profiles are exact.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from masterd.core.genie import model as perf
from masterd.core.genie.modeldb import ModelDB, Resolution
from masterd.core.sched2.locality import spread_slowdown
from masterd.core.sched2.packing import best_servers
from shared.model import Job, JobKind, JobSpec

MIN_SCALING = 0.05


def two_server_slowdown(c: perf.Coefficients) -> float:
    """How many times slower Eq. 8 says a 4-GPU job runs over two servers than on one: the
    one shape SCHED² measured (§II-A), from which ``sched2.locality`` extends to the rest."""
    one = max(4 - perf.comm_penalty(c, 1, 4), MIN_SCALING * 4)
    two = max(4 - perf.comm_penalty(c, 2, 2), MIN_SCALING * 4)
    return max(1.0, one / two)


@dataclass(frozen=True)
class Profile:
    """A waiting job as the agent sees it: predicted seconds at ``k`` placements."""

    ideal: float  # at best locality (T_ideal of Eq. 2)
    levels: tuple[float, ...]  # at k placements, most concentrated first


def spread_levels(gpus: int, gpus_per_server: int, servers: int, k: int) -> tuple[int, ...]:
    """Server counts of ``k`` placements from most concentrated to most scattered.

    From ``ceil(gpus / M)`` servers to one GPU per server (at most ``servers``), spaced
    geometrically: 4 GPUs on 8-GPU servers give 1, 2, 3, 4; 16 GPUs give 2, 4, 8, 16.
    """
    low = best_servers(gpus, gpus_per_server)
    high = max(low, min(gpus, servers))
    if k == 1:
        return (low,)
    return tuple(
        min(high, max(low, round(low * (high / low) ** (i / (k - 1))))) for i in range(k)
    )


class Estimator:
    """Execution times from a model database, memoised per job (keyed by id and spec)."""

    def __init__(self, db: ModelDB, default_duration_s: float = 3600.0) -> None:
        if not (math.isfinite(default_duration_s) and default_duration_s > 0):
            raise ValueError(f"default_duration_s must be a number > 0, got {default_duration_s!r}")
        self.db = db
        self.default_duration_s = default_duration_s
        self._resolved: dict[tuple[object, ...], Resolution | None] = {}
        self._times: dict[tuple[str, str, int], float] = {}
        self._version = db.version

    def _check_version(self) -> None:
        if self.db.version != self._version:  # a model was loaded or fitted: predict again
            self._resolved.clear()
            self._times.clear()
            self._version = self.db.version

    def _resolve(self, spec: JobSpec, gpu_model: str) -> Resolution | None:
        kind = "inference" if spec.kind is JobKind.INFERENCE else "training"
        key = (spec.model_type, gpu_model, kind, spec.model_family, spec.model_params_m)
        if key not in self._resolved:
            self._resolved[key] = self.db.resolve(
                spec.model_type, gpu_model, kind, spec.model_family, spec.model_params_m)
        return self._resolved[key]

    def seconds(self, job: Job, gpu_model: str, servers: int) -> float:
        """Predicted run time of ``job`` with its GPUs spread evenly over ``servers``."""
        self._check_version()
        key = (job.id, gpu_model, servers)
        cached = self._times.get(key)
        if cached is None:
            cached = self._times[key] = self._predict(job.spec, gpu_model, servers)
        return cached

    def _predict(self, spec: JobSpec, gpu_model: str, servers: int) -> float:
        if spec.batch is None or spec.iterations is None or spec.gpus < 1:
            return self.default_duration_s
        res = self._resolve(spec, gpu_model)
        if res is None:
            return self.default_duration_s
        c = res.coefficients
        inference = spec.kind is JobKind.INFERENCE
        servers = max(1, min(servers, spec.gpus))
        d_gpn = spec.gpus / servers
        local = spec.batch / spec.gpus
        spr = perf.single_gpu_rate(c, local)
        if not spr > 0:
            return self.default_duration_s
        if inference or spec.gpus == 1:
            comm = perf.comm_penalty(c, servers, d_gpn, inference)  # type: ignore[arg-type]
            rate = max(spec.gpus - comm, MIN_SCALING * spec.gpus) * spr
        else:
            # Eq. 8 inside one server; across servers the two-server slowdown Eq. 8 gives at
            # §II-A's shape (what profiling measures), extended by SCHED²'s locality form.
            local = max(spec.gpus - perf.comm_penalty(c, 1, spec.gpus),  # type: ignore[arg-type]
                        MIN_SCALING * spec.gpus)
            rate = local / spread_slowdown(two_server_slowdown(c), servers) * spr
        return perf.latency_from_rate(float(spec.batch) * spec.iterations, rate, c.nu)

    def profile(self, job: Job, gpu_model: str, gpus_per_server: int, servers: int,
                k: int) -> Profile:
        levels = spread_levels(job.spec.gpus, gpus_per_server, servers, k)
        times = tuple(self.seconds(job, gpu_model, s) for s in levels)
        return Profile(ideal=times[0], levels=times)

    def __len__(self) -> int:
        return len(self._times)

    def forget(self, live: Sequence[str] | set[str]) -> None:
        """Drop memoised times of jobs no longer queued or running."""
        keep = set(live)
        self._times = {k: v for k, v in self._times.items() if k[0] in keep}
