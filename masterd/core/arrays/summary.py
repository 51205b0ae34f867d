"""A read-only account of every array, for ``trellisctl pools``."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from masterd.core.arrays.accounting import holdings
from masterd.core.arrays.layout import CPU_ARRAY, GPU_CPU, ArrayId, ArrayMap
from masterd.core.cluster import ClusterSnapshot
from shared.model import Job


@dataclass(frozen=True)
class ArraySummary:
    name: str
    gpu_model: str | None
    kind: str  # large | small (GPUs), gpu-cpu | cpu (cores)
    unit: str  # "gpus" or "cores"
    size: int  # units the array owns
    used: int  # owned units held by any running job
    borrowed_out: int  # owned units held by jobs of other arrays
    borrowed_in: int  # units of this unit type held elsewhere by this array's jobs
    queued: int  # jobs waiting in this array (GPU-job cores have no queue of their own)


def summarise(
    amap: ArrayMap, snapshot: ClusterSnapshot, queue: Sequence[Job]
) -> list[ArraySummary]:
    used: Counter[ArrayId] = Counter()
    lent: Counter[ArrayId] = Counter()
    borrowed_in: Counter[ArrayId] = Counter()
    for h in holdings(amap, snapshot.running).values():
        assert h.job.placement is not None
        for alloc in h.job.placement.allocations:
            na = amap.nodes.get(alloc.node)
            if na is None:
                continue
            if alloc.gpus and na.gpu_array is not None:
                used[na.gpu_array] += len(alloc.gpus)
            for core in alloc.cpus:
                owner = na.core_owner(core)
                if owner is not None:
                    used[owner] += 1
        core_home = (
            CPU_ARRAY if h.home.job_array == CPU_ARRAY
            else ArrayId(GPU_CPU, h.home.job_array.gpu_model)
        )
        for array, n in h.borrowed.items():
            lent[array] += n
            borrowed_in[h.home.job_array if array.holds_gpus else core_home] += n
    queued: Counter[ArrayId] = Counter()
    for job in queue:
        home = amap.home(job.spec)
        if home is not None:
            queued[home.job_array] += 1
    return [
        ArraySummary(
            name=array.name,
            gpu_model=array.gpu_model,
            kind=array.kind,
            unit=array.unit,
            size=amap.size(array),
            used=used[array],
            borrowed_out=lent[array],
            borrowed_in=borrowed_in[array],
            queued=queued[array],
        )
        for array in amap.arrays
    ]
