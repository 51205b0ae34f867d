"""Accounting: who used what over a window, from the journal's history (Slurm's sreport).

Plain aggregation over :class:`masterd.journal.history.JobHistory` records; the report RPC
runs it off the event loop. The simulator's ``whatif`` reads the same records (its own
formulas give "what really happened", to match its replays).
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
from collections.abc import Iterable
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


# What a report needs of one job, as a plain tuple (a year of jobs is 365,000 of them: no
# object per job): (account, user, GPU model label, submitted, ended or None, state,
# runs ((start, end or None, gpus), ...), requeued at (times, ...), GPU utilisation or None).
Fact = tuple[str, str, str, float, float | None, str,
             tuple[tuple[float, float | None, int], ...], tuple[float, ...], float | None]
_GROUP_INDEX = {"account": 0, "user": 1, "gpu-model": 2}


def model_label(gpu_model: str | None, gpus: int) -> str:
    """What ``--by gpu-model`` groups a job under."""
    return gpu_model or ("cpu" if gpus == 0 else "any")


def fact_of(job: JobHistory) -> Fact:
    return (job.account, job.user, model_label(job.gpu_model, job.gpus), job.submit, job.end,
            job.state, tuple((r.start, r.end, r.gpus) for r in job.runs),
            tuple(job.requeued_at), job.gpu_util)


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


def report_jobs(jobs: Iterable[JobHistory], by: str, since: float, until: float
                ) -> list[dict[str, Any]]:
    return report(map(fact_of, jobs), by, since, until)


def report(facts: Iterable[Fact], by: str, since: float, until: float
           ) -> list[dict[str, Any]]:
    """One row per group with anything in the window, sorted by GPU-hours (most first)."""
    aggregate = Aggregate(by, since, until)
    for fact in facts:
        aggregate.add(fact)
    return aggregate.rows()


class Aggregate:
    """A report being summed: fed job by job (:meth:`add`), or with sums a database computed
    for many jobs at once (:meth:`add_sums`, :meth:`add_ended`, :meth:`add_waits`, the
    journal's fast path for jobs that ran once: masterd/journal/accounting.py)."""

    def __init__(self, by: str, since: float, until: float) -> None:
        if by not in _GROUP_INDEX:
            raise ValueError(f"--by must be one of {', '.join(GROUPINGS)}, got {by!r}")
        if until <= since:
            raise ValueError("--until must be after --since")
        self.by, self.since, self.until = by, since, until
        self._index = _GROUP_INDEX[by]
        self.groups: dict[str, _Acc] = {}

    def _acc(self, group: str) -> _Acc:
        acc = self.groups.get(group)
        if acc is None:
            acc = self.groups[group] = _Acc()
        return acc

    def add(self, fact: Fact) -> None:
        since, until = self.since, self.until
        _, _, _, submit, end_time, state, runs, requeued, util = fact
        if submit >= until:
            return
        allocated = 0.0
        running = False
        for start, end, gpus in runs:
            if end is None or end >= until:
                end = until
                running = running or start < until
            if start < since:
                start = since
            if end > start:
                allocated += (end - start) * gpus
        first = runs[0][0] if runs else None
        ended_here = end_time is not None and since <= end_time < until and state in _ENDS
        started_here = first is not None and since <= first < until
        requeues = 0
        for t in requeued:
            if since <= t < until:
                requeues += 1
        if not (allocated or ended_here or running or started_here or requeues):
            return
        acc = self._acc(fact[self._index])
        acc.gpu_s += allocated
        if util is not None and allocated:
            acc.busy_s += allocated * util
            acc.measured_s += allocated
        if ended_here:
            acc.ended[state] = acc.ended.get(state, 0) + 1
        if running:
            acc.running += 1
        if started_here:
            acc.waits.append(max(0.0, first - submit))  # type: ignore[operator]
        acc.requeues += requeues

    def add_sums(self, group: str, gpu_s: float, busy_s: float, measured_s: float,
                 running: int) -> None:
        if gpu_s or running:
            acc = self._acc(group)
            acc.gpu_s += gpu_s
            acc.busy_s += busy_s
            acc.measured_s += measured_s
            acc.running += running

    def add_ended(self, group: str, state: str, count: int) -> None:
        acc = self._acc(group)
        acc.ended[state] = acc.ended.get(state, 0) + count

    def add_waits(self, group: str, waits: list[float]) -> None:
        self._acc(group).waits.extend(w if w > 0.0 else 0.0 for w in waits)

    def rows(self) -> list[dict[str, Any]]:
        key = self.by.replace("-", "_")
        rows = []
        for name, acc in self.groups.items():
            rows.append({
                key: name,
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
        rows.sort(key=lambda r: (-r["gpu_hours_allocated"], r[key]))
        return rows


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
