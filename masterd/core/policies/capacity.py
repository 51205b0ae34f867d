"""Capacity baseline (GENIE §7.1, as in YARN's Capacity Scheduler): GPU quotas per model type.

Each model type may hold at most its quota of the cluster's GPUs (running jobs included).
``quotas`` maps model type names (matched like the model database: case and punctuation
ignored) to fractions of all GPUs; the key ``"*"`` covers every other type, jobs without a
model type included. Without ``quotas``, the GPUs are split equally among the model types
present (queued or running) at each pass.

Inside a type jobs run in queue order and the first one that cannot start blocks its type
(its own FIFO queue), not the others. A job asking for more than its type's whole quota may
still start when its type holds no GPUs, so it is not starved forever. Placement is the black
box one: ``spec.gpus`` packed. CPU-only jobs have no GPU quota and are packed in queue order.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from masterd.core.cluster import ClusterSnapshot
from masterd.core.genie.modeldb import normalise
from masterd.core.placement import FreePool, pack
from masterd.core.policy import Decision, Start
from shared.model import Job

OTHER = "*"


def _type_of(job: Job) -> str:
    return normalise(job.spec.model_type) if job.spec.model_type else OTHER


class CapacityPolicy:
    name = "capacity"

    def __init__(self, quotas: Mapping[str, float] | None = None) -> None:
        self.quotas: dict[str, float] | None = None
        if quotas is not None:
            if not isinstance(quotas, Mapping) or not quotas:
                raise ValueError("quotas must be a non-empty table of model type -> fraction")
            parsed: dict[str, float] = {}
            for name, share in quotas.items():
                if not isinstance(name, str) or not (name == OTHER or normalise(name)):
                    raise ValueError(f"quotas: {name!r} is not a model type name")
                if isinstance(share, bool) or not isinstance(share, int | float) or not (
                    math.isfinite(share) and 0 < share <= 1
                ):
                    raise ValueError(f"quotas[{name!r}] must be a fraction in (0, 1], "
                                     f"got {share!r}")
                parsed[OTHER if name == OTHER else normalise(name)] = float(share)
            if sum(parsed.values()) > 1 + 1e-9:
                raise ValueError(f"quotas add up to {sum(parsed.values()):g}, more than 1")
            self.quotas = parsed

    def limits(self, types: set[str], total_gpus: int) -> dict[str, int]:
        if self.quotas is None:
            share = 1.0 / len(types) if types else 0.0
            return {t: math.floor(share * total_gpus) for t in types}
        return {
            t: math.floor(self.quotas.get(t, self.quotas.get(OTHER, 0.0)) * total_gpus)
            for t in types
        }

    def decide(
        self, snapshot: ClusterSnapshot, queue: Sequence[Job], now: float
    ) -> list[Decision]:
        used: dict[str, int] = {}
        for job in snapshot.running.values():
            if job.placement is not None and job.placement.gpu_count:
                t = _type_of(job)
                used[t] = used.get(t, 0) + job.placement.gpu_count
        gpu_jobs = [j for j in queue if j.spec.gpus]
        limit = self.limits({_type_of(j) for j in gpu_jobs} | set(used), snapshot.total_gpus)
        pool = FreePool(snapshot)
        blocked: set[str] = set()
        decisions: list[Decision] = []
        for job in gpu_jobs:
            t = _type_of(job)
            if t in blocked:
                continue
            held = used.get(t, 0)
            within = held + job.spec.gpus <= limit[t] or held == 0
            placement = pack(job.spec, pool) if within else None
            if placement is None:
                blocked.add(t)
                continue
            pool.take(placement)
            used[t] = held + placement.gpu_count
            decisions.append(Start(job.id, placement))
        for job in queue:
            if job.spec.gpus == 0:
                placement = pack(job.spec, pool)
                if placement is not None:
                    pool.take(placement)
                    decisions.append(Start(job.id, placement))
        return decisions
