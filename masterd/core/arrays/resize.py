"""Re-deriving array sizes from recent demand (SODA: "derived from historical statistics").

``resize`` is pure: the master keeps the demand history (one record per finished job), calls it
periodically and hands the result to :meth:`ArrayPolicy.reconfigure`.

* The large-job share of model M's GPUs becomes the large jobs' share of M's GPU-seconds over
  the window.
* The CPU-job share of every GPU node's cores becomes the CPU jobs' share of all core-seconds
  over the window (CPU jobs run on any node, so the ratio is cluster-wide).

A share with no demand behind it in the window is left as configured. New shares are clamped to
the configured bounds right here when the bound is a fraction; a bound given as a count is
honoured when the map resolves sizes against real capacities (a count cannot be compared with a
fraction before the capacity is known), so either way the array sizes stay within bounds.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, replace

from masterd.core.arrays.config import ArrayConfig, ModelArrays, Size
from masterd.core.arrays.layout import CPU, LARGE, SMALL
from shared.model import Job

DAY = 86_400.0


@dataclass(frozen=True)
class DemandRecord:
    """What one finished job consumed."""

    end_time: float
    array_kind: str  # large | small | cpu
    gpu_model: str | None
    gpu_seconds: float
    core_seconds: float


def demand_of(job: Job) -> DemandRecord | None:
    """The record for a job that ran (None if it never started or has not ended)."""
    if job.start_time is None or job.end_time is None or job.end_time < job.start_time:
        return None
    seconds = job.end_time - job.start_time
    if job.placement is not None:
        gpus = job.placement.gpu_count
        cores = sum(len(a.cpus) for a in job.placement.allocations)
    else:
        gpus, cores = job.spec.gpus, job.spec.cpus
    return DemandRecord(
        end_time=job.end_time,
        array_kind=job.spec.array_kind,
        gpu_model=job.spec.gpu_model,
        gpu_seconds=gpus * seconds,
        core_seconds=cores * seconds,
    )


def _bounded_share(share: float, low: Size, high: Size) -> Size:
    if low.fraction:
        share = max(share, low.value)
    if high.fraction:
        share = min(share, high.value)
    return Size.share(min(1.0, max(0.0, share)))


def resize(config: ArrayConfig, history: Iterable[DemandRecord], now: float) -> ArrayConfig:
    """Sizes from the last ``config.history_days`` of demand, kept within the bounds."""
    since = now - config.history_days * DAY
    gpu_s: dict[str | None, dict[str, float]] = defaultdict(lambda: {LARGE: 0.0, SMALL: 0.0})
    cpu_job_cores = gpu_job_cores = 0.0
    for record in history:
        if not since <= record.end_time <= now:
            continue
        if record.array_kind == CPU:
            cpu_job_cores += max(0.0, record.core_seconds)
            continue
        if record.array_kind not in (LARGE, SMALL):
            raise ValueError(f"demand record has unknown array kind {record.array_kind!r}")
        model = record.gpu_model or config.default_gpu_model
        gpu_s[model][record.array_kind] += max(0.0, record.gpu_seconds)
        gpu_job_cores += max(0.0, record.core_seconds)

    core_share: float | None = None
    if cpu_job_cores + gpu_job_cores > 0:
        core_share = cpu_job_cores / (cpu_job_cores + gpu_job_cores)

    def updated(arrays: ModelArrays, model: str | None) -> ModelArrays:
        demand = gpu_s.get(model)
        if demand is not None and demand[LARGE] + demand[SMALL] > 0:
            share = demand[LARGE] / (demand[LARGE] + demand[SMALL])
            arrays = replace(
                arrays, large=_bounded_share(share, arrays.large_min, arrays.large_max)
            )
        if core_share is not None:
            arrays = replace(
                arrays,
                cpu_job_cores=_bounded_share(
                    core_share, arrays.cpu_job_cores_min, arrays.cpu_job_cores_max
                ),
            )
        return arrays

    # Jobs naming no model (and no default model configured) size the default entry.
    result = config.with_model(None, updated(config.default, None))
    for model in sorted({m for m in gpu_s if m is not None} | set(config.models)):
        result = result.with_model(model, updated(config.for_model(model), model))
    return result
