"""Evaluation metrics of a replay (GENIE §7.1, Helios §4.2.3, SCHED² Eq. 1).

GENIE's Eq. 14–16 (QoS guarantee, makespan, normalised latency) are computed by
``masterd.core.genie.metrics`` over the records' ``outcomes``; the rest is the simulator's own.
All functions are pure over job records and usage series so tests can check them by hand.
Percentiles use the nearest-rank method: p-th percentile = the ceil(p/100 · n)-th smallest.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from masterd.core.genie.metrics import (
    TaskOutcome,
    average_normalised_latency,
    makespan,
    qos_guarantee,
)
from shared.model import QosClass

if TYPE_CHECKING:  # the engine imports fragmentation() from here
    from sim.engine import JobRecord, Sample, SimResult


def percentile(values: Sequence[float], p: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100.0 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def mean(values: Sequence[float]) -> float | None:
    return math.fsum(values) / len(values) if values else None


def head_waits(records: Iterable[JobRecord]) -> dict[str, Any]:
    """Jobs that were ever at the head of the queue after a pass (the jobs a backfill
    reservation protects): how many, how many never started, and the mean, p99 and max of
    their wait (submission to first start, ``*_s``) and of their time at the head (from first
    being the head to the first start, ``at_head_*_s``: the part a backfill rule decides;
    the rest is the backlog ahead of them)."""
    heads = [r for r in records if r.head_since is not None]
    started = [r for r in heads if r.first_start is not None]
    waits = [r.first_start - r.submit for r in started]  # type: ignore[operator]
    at_head = [r.first_start - r.head_since for r in started]  # type: ignore[operator]
    return {"jobs": len(heads), "never_started": len(heads) - len(started),
            "avg_s": mean(waits), "p99_s": percentile(waits, 99),
            "max_s": max(waits) if waits else None,
            "at_head_avg_s": mean(at_head), "at_head_p99_s": percentile(at_head, 99),
            "at_head_max_s": max(at_head) if at_head else None}


def scheduled(records: Iterable[JobRecord]) -> list[JobRecord]:
    """Jobs the scheduler was given (rejected-as-unsatisfiable ones never were)."""
    return [r for r in records if r.state != "rejected"]


def outcome(record: JobRecord) -> TaskOutcome:
    """A job record as GENIE's metrics see it: only a finished job completed."""
    return TaskOutcome(
        submit_time=record.submit, ect=record.ect, single_gpu_latency=record.lat11,
        start_time=record.first_start,
        end_time=record.end if record.state == "finished" else None,
    )


def outcomes(records: Iterable[JobRecord]) -> list[TaskOutcome]:
    """The scheduled jobs' outcomes, which GENIE's Eq. 14–16 are taken over."""
    return [outcome(r) for r in scheduled(records)]


def qos_by_class(records: Iterable[JobRecord]) -> dict[str, float | None]:
    """GENIE Eq. 14 per QoS class."""
    groups: dict[QosClass, list[JobRecord]] = defaultdict(list)
    for r in scheduled(records):
        groups[r.qos].append(r)
    return {q.value: qos_guarantee(map(outcome, groups[q])) for q in QosClass if groups[q]}


def _finished_values(records: Iterable[JobRecord], attr: str) -> list[float]:
    return [
        getattr(r, attr) for r in records
        if r.state == "finished" and getattr(r, attr) is not None
    ]


def queue_by_tenant(records: Iterable[JobRecord]) -> dict[str, dict[str, float | int | None]]:
    groups: dict[str, list[float]] = defaultdict(list)
    for r in records:
        if r.state == "finished" and r.queue_delay is not None:
            groups[r.tenant].append(r.queue_delay)
    return {
        tenant: {"jobs": len(v), "avg_queue_s": mean(v), "p99_queue_s": percentile(v, 99)}
        for tenant, v in sorted(groups.items())
    }


def time_weighted(series: Sequence[tuple[float, float]], start: float, end: float) -> float | None:
    """Average of a step function given as (time, value) change points over [start, end]."""
    if end <= start or not series:
        return None
    total = 0.0
    for i, (t, value) in enumerate(series):
        t_next = series[i + 1][0] if i + 1 < len(series) else end
        lo, hi = max(t, start), min(t_next, end)
        if hi > lo:
            total += value * (hi - lo)
    return total / (end - start)


def gpu_rates(result: SimResult) -> tuple[float | None, float | None]:
    """(GPU active rate, GPU utilisation) as time-weighted shares of all GPUs.

    Active: GPUs held by jobs. Utilisation: GPUs weighted by the share of ideal linear scaling
    the truth model says they deliver (communication, locality and interference losses).
    """
    if not result.total_gpus or not result.records:
        return None, None
    start = min(r.submit for r in result.records)
    end = result.end_time
    active = time_weighted([(t, a) for t, a, _ in result.usage], start, end)
    useful = time_weighted([(t, e) for t, _, e in result.usage], start, end)
    if active is None or useful is None:
        return None, None
    return active / result.total_gpus, useful / result.total_gpus


def node_utilisation(result: SimResult, start: float | None = None,
                     end: float | None = None) -> float | None:
    """Time-weighted share of nodes running at least one job (Helios' node utilisation),
    over [start, end]: by default the arrival window (first to last submission), while load
    is offered."""
    if not result.total_nodes or not result.records or len(result.busy_nodes) < 1:
        return None
    lo = min(r.submit for r in result.records) if start is None else start
    hi = max(r.submit for r in result.records) if end is None else end
    busy = time_weighted([(t, float(b)) for t, b in result.busy_nodes], lo, hi)
    return None if busy is None else busy / result.total_nodes


def fragmentation(values: Sequence[float]) -> float:
    """SCHED² Eq. 1 for one server: 1 − (Σx)² / (n·Σx²), x = remaining time per GPU."""
    n = len(values)
    squares = math.fsum(x * x for x in values)
    if n == 0 or squares == 0:
        return 0.0
    return 1.0 - math.fsum(values) ** 2 / (n * squares)


def average_fragmentation(samples: Sequence[Sample]) -> float | None:
    return mean([s.fragmentation for s in samples])


def summarise(result: SimResult) -> dict[str, Any]:
    records = result.records
    tasks = outcomes(records)
    jct = _finished_values(records, "jct")
    queue = _finished_values(records, "queue_delay")
    active, useful = gpu_rates(result)
    states: dict[str, int] = defaultdict(int)
    for r in records:
        states[r.state] += 1
    return {
        "workload": result.workload,
        "policy": result.policy,
        "seed": result.seed,
        "jobs": len(records),
        "finished": states["finished"],
        "rejected": states["rejected"],
        "failed": states["failed"],
        "timeout": states["timeout"],
        "node_lost": states["node_lost"],
        "unfinished": states["unfinished"],
        "qos_pct": qos_guarantee(tasks),
        "qos_pct_by_class": qos_by_class(records),
        "makespan_s": makespan(tasks),
        "avg_norm_latency": average_normalised_latency(tasks),
        # JCT (queueing included) over Lat(t, <1,1>): the user's view of Eq. 16.
        "avg_slowdown": average_normalised_latency(tasks, include_wait=True),
        "avg_jct_s": mean(jct),
        "p99_jct_s": percentile(jct, 99),
        "avg_queue_s": mean(queue),
        "p99_queue_s": percentile(queue, 99),
        # Helios' count: jobs that waited at least a second.
        "queued_jobs": sum(d >= 1.0 for d in queue),
        "node_utilisation": node_utilisation(result),
        "queue_by_tenant": queue_by_tenant(records),
        "gpu_active_rate": active,
        "gpu_utilisation": useful,
        "fragmentation": average_fragmentation(result.samples),
        "preemptions": sum(r.preemptions for r in records),
        "retries": sum(r.retries for r in records),
        "events": result.events,
        "passes": result.passes,
        "end_time_s": result.end_time,
    }
