"""Accounting: who used what over a window, from the journal's history (Slurm's sreport).

Plain aggregation over :class:`masterd.journal.history.JobHistory` records; the report RPC
runs it off the event loop, the simulator's ``whatif`` uses it for "what really happened".
Per group (an account, a user or a GPU model) over ``[since, until)``:

* ``gpu_hours_allocated``: GPUs held × hours, each run clipped to the window (a run still
  going counts up to ``until``);
* ``gpu_hours_busy``: those GPU-hours × the GPU utilisation the job's nodes measured (mean of
  its parts' final ``job_usage`` reports), summed over the jobs that have a measurement;
  ``gpu_hours_measured`` is the allocated GPU-hours it covers (busy is nil where none);
* ``jobs``: jobs that ended in the window, by end state; ``running`` at ``until``;
* ``wait_p50_s``/``wait_p95_s``: submission to first start, of jobs first started in the
  window (nearest-rank percentiles);
* ``requeues``: times a job went back to the queue after running (preempted or requeued
  after a failure), in the window.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

GROUPINGS = ("account", "user", "gpu-model")


@dataclass(slots=True)
class Run:
    """One run of a job: ``gpus`` GPUs and ``cpus`` cores from ``start`` to ``end`` (None:
    still running as the journal was read)."""

    start: float
    end: float | None
    gpus: int
    cpus: int
    memory_mib: int
    nodes: tuple[str, ...] = ()


@dataclass(slots=True)
class JobHistory:
    """One job as accounting sees it (masterd/journal/history.py reads it back)."""

    id: str
    account: str
    user: str
    name: str
    kind: str
    gpus: int  # as asked
    cpus: int
    memory_mib: int
    gpu_model: str | None  # asked for, else the model of the nodes it ran on
    submit: float
    state: str
    end: float | None
    runs: list[Run] = field(default_factory=list)
    # When it went back to the queue after having run (preempted or requeued).
    requeued_at: list[float] = field(default_factory=list)
    # Mean GPU utilisation its parts measured (0..1), None where no node reported it.
    gpu_util: float | None = None
    spec: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def first_start(self) -> float | None:
        return self.runs[0].start if self.runs else None


END_STATES = ("finished", "failed", "cancelled", "timeout", "node_lost")
_ENDS = frozenset(END_STATES)


def group_of(by: str) -> Callable[[JobHistory], str]:
    if by == "account":
        return lambda job: job.account
    if by == "user":
        return lambda job: job.user
    if by == "gpu-model":
        return lambda job: job.gpu_model or ("cpu" if job.gpus == 0 else "any")
    raise ValueError(f"--by must be one of {', '.join(GROUPINGS)}, got {by!r}")


@dataclass
class _Acc:
    gpu_s: float = 0.0
    busy_s: float = 0.0
    measured_s: float = 0.0
    ended: dict[str, int] = field(default_factory=dict)
    running: int = 0
    waits: list[float] = field(default_factory=list)
    requeues: int = 0


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile of ``values`` (sorted in place); None when empty."""
    if not values:
        return None
    values.sort()
    rank = max(1, math.ceil(q / 100.0 * len(values)))
    return values[rank - 1]


def report(jobs: Iterable[JobHistory], by: str, since: float, until: float
           ) -> list[dict[str, Any]]:
    """One row per group with anything in the window, sorted by GPU-hours (most first)."""
    if until <= since:
        raise ValueError("--until must be after --since")
    key = group_of(by)
    groups: dict[str, _Acc] = {}
    for job in jobs:
        if job.submit >= until:
            continue
        allocated = 0.0
        running = False
        for run in job.runs:
            start, end = run.start, run.end
            if end is None or end >= until:
                end = until
                running = running or start < until
            if start < since:
                start = since
            if end > start:
                allocated += (end - start) * run.gpus
        runs = job.runs
        first = runs[0].start if runs else None
        ended_here = job.end is not None and since <= job.end < until and job.state in _ENDS
        started_here = first is not None and since <= first < until
        requeues = 0
        for t in job.requeued_at:
            if since <= t < until:
                requeues += 1
        if not (allocated or ended_here or running or started_here or requeues):
            continue
        acc = groups.get(key(job))
        if acc is None:
            acc = groups[key(job)] = _Acc()
        acc.gpu_s += allocated
        if job.gpu_util is not None and allocated:
            acc.busy_s += allocated * job.gpu_util
            acc.measured_s += allocated
        if ended_here:
            acc.ended[job.state] = acc.ended.get(job.state, 0) + 1
        if running:
            acc.running += 1
        if started_here:
            acc.waits.append(max(0.0, first - job.submit))  # type: ignore[operator]
        acc.requeues += requeues
    rows = []
    for name, acc in groups.items():
        rows.append({
            by.replace("-", "_"): name,
            "gpu_hours_allocated": round(acc.gpu_s / 3600.0, 6),
            "gpu_hours_busy": round(acc.busy_s / 3600.0, 6) if acc.measured_s else None,
            "gpu_hours_measured": round(acc.measured_s / 3600.0, 6),
            "jobs": {state: acc.ended.get(state, 0) for state in END_STATES},
            "running": acc.running,
            "started": len(acc.waits),
            "wait_p50_s": _round(percentile(acc.waits, 50)),
            "wait_p95_s": _round(percentile(acc.waits, 95)),
            "requeues": acc.requeues,
        })
    rows.sort(key=lambda r: (-r["gpu_hours_allocated"], r[by.replace("-", "_")]))
    return rows


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
