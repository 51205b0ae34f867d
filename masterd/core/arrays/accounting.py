"""What running jobs hold, read from placements against the array map.

Everything here is derived from a snapshot's running jobs, never remembered between passes, so
a restarted master sees the same borrowers and the same tenant usage.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from masterd.core.arrays.layout import CPU_ARRAY, ArrayId, ArrayMap, Home
from shared.model import Job, Placement


def allocs(placement: Placement) -> Iterable[tuple[str, tuple[int, ...], tuple[int, ...]]]:
    return ((a.node, a.gpus, a.cpus) for a in placement.allocations)


def home_units(amap: ArrayMap, job_array: ArrayId, placement: Placement) -> tuple[int, int]:
    """GPUs and cores of ``placement`` inside ``job_array``'s own nodes (what quotas count)."""
    gpus = cores = 0
    for alloc in placement.allocations:
        na = amap.nodes.get(alloc.node)
        if na is None:
            continue
        if job_array == CPU_ARRAY:
            cores += sum(1 for c in alloc.cpus if c in na.cpu_job_cpus)
        elif na.gpu_array == job_array:
            gpus += len(alloc.gpus)
            cores += sum(1 for c in alloc.cpus if c in na.gpu_job_cpus)
    return gpus, cores


@dataclass(frozen=True)
class Holding:
    """One running job as the arrays see it."""

    job: Job
    home: Home
    borrowed: Counter[ArrayId]  # units held per foreign array

    @property
    def is_borrower(self) -> bool:
        return bool(self.borrowed)

    def recency(self) -> tuple[float, float, str]:
        # Starting jobs have no start time yet: they are the most recent of all.
        start = self.job.start_time if self.job.start_time is not None else float("inf")
        return (start, self.job.submit_time, self.job.id)


def holdings(amap: ArrayMap, running: Mapping[str, Job]) -> dict[str, Holding]:
    out: dict[str, Holding] = {}
    for job_id in sorted(running):
        job = running[job_id]
        if job.placement is None:
            continue
        home = amap.home(job.spec)
        if home is None:
            continue
        out[job_id] = Holding(job, home, amap.borrowed_units(allocs(job.placement), home))
    return out


def tenant_usage(
    amap: ArrayMap, held: Mapping[str, Holding]
) -> dict[tuple[str, ArrayId], list[int]]:
    """(tenant, job array) -> [GPUs, cores] held on the array's own nodes."""
    usage: dict[tuple[str, ArrayId], list[int]] = {}
    for h in held.values():
        assert h.job.placement is not None
        g, c = home_units(amap, h.home.job_array, h.job.placement)
        entry = usage.setdefault((h.job.spec.tenant, h.home.job_array), [0, 0])
        entry[0] += g
        entry[1] += c
    return usage


def borrowers_of(held: Mapping[str, Holding], arrays: Iterable[ArrayId]) -> list[Holding]:
    """Jobs holding borrowed units of any of ``arrays``, most recently started first."""
    wanted = set(arrays)
    found = [h for h in held.values() if wanted & set(h.borrowed)]
    return sorted(found, key=Holding.recency, reverse=True)
