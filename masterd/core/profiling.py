"""Running GENIE's profiling jobs at the lowest priority (seeds/genie.md §5.1.5, §6).

"When the GPU cluster has enough available resources, the lightweight profiler would make a
profiling for the new task type." A profiling run is an ordinary queued job (journalled,
restored, cancellable) that must run on an exact shape ``<d_node, d_gpn>``: its spec asks for
``d_node·d_gpn`` GPUs of one model with ``max_nodes = d_node``.

``ProfilingPolicy`` wraps the configured policy. Each pass:

1. the wrapped policy decides over the queue *without* the profiling runs (it never sees
   them, so they cannot take a user job's place in any ordering);
2. what it leaves free is offered to the profiling runs, in queue order, each realised on
   exactly its shape — but only if no waiting user job could start on those free resources
   now (a user job held back by its policy, a quota, an ordering, is still a user job).

So profiling never takes resources a waiting job could use at that moment; it does use
resources a large job is waiting to accumulate, which is why runs are kept short (about a
hundred iterations, §5.1.5).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from masterd.core.arrays.policy import PassResult
from masterd.core.cluster import ClusterSnapshot
from masterd.core.eligibility import eligible, placement_key
from masterd.core.fairorder import FairShareOrdering
from masterd.core.placement import FreePool, pack, realise
from masterd.core.policy import Decision, Policy, Start
from shared.model import Job, Placement


class ProfilingPolicy:
    """The configured policy plus the profiler's runs on what it leaves idle."""

    def __init__(self, inner: Policy, is_profiling_run: Callable[[str], bool],
                 any_runs: Callable[[], bool]) -> None:
        self.inner = inner
        self.name = inner.name
        self.is_profiling_run = is_profiling_run
        self.any_runs = any_runs

    def decide(
        self, snapshot: ClusterSnapshot, queue: Sequence[Job], now: float
    ) -> list[Decision]:
        return self.plan(snapshot, queue, now).decisions

    def _inner_plan(
        self, snapshot: ClusterSnapshot, queue: Sequence[Job], now: float
    ) -> tuple[list[Decision], dict[str, str]]:
        plan = getattr(self.inner, "plan", None)
        if plan is not None:
            result = plan(snapshot, queue, now)
            return list(result.decisions), dict(result.notes)
        return list(self.inner.decide(snapshot, queue, now)), {}

    def plan(self, snapshot: ClusterSnapshot, queue: Sequence[Job], now: float) -> PassResult:
        if not self.any_runs():
            decisions, notes = self._inner_plan(snapshot, queue, now)
            return PassResult(decisions, notes)
        users: list[Job] = []
        runs: list[Job] = []
        for job in queue:
            (runs if self.is_profiling_run(job.id) else users).append(job)
        decisions, notes = self._inner_plan(snapshot, users, now) if users else ([], {})
        if not runs:
            return PassResult(decisions, notes)
        pool = FreePool(snapshot)
        started: set[str] = set()
        for d in decisions:
            if isinstance(d, Start):
                pool.take(d.placement)
                started.add(d.job_id)
        blocker = _first_fitting((j for j in users if j.id not in started), pool)
        if blocker is not None:
            for job in runs:
                notes[job.id] = (
                    f"waiting: profiling runs only on resources no waiting job can use "
                    f"(job {blocker} could start)"
                )
            return PassResult(decisions, notes)
        for job in runs:
            placement = _exact(job, pool)
            if placement is None:
                d_node, d_gpn = run_shape(job)
                model = f" {job.spec.gpu_model}" if job.spec.gpu_model else ""
                notes[job.id] = (
                    f"waiting: profiling run needs {d_node} node(s) with {d_gpn} idle"
                    f"{model} GPU(s) each"
                )
                continue
            pool.take(placement)
            decisions.append(Start(job.id, placement))
        return PassResult(decisions, notes)


def run_shape(job: Job) -> tuple[int, int]:
    """``<d_node, d_gpn>`` of a profiling run, from its spec."""
    d_node = job.spec.max_nodes or 1
    return d_node, max(1, job.spec.gpus // d_node)


def _exact(job: Job, pool: FreePool) -> Placement | None:
    d_node, d_gpn = run_shape(job)
    names = [
        n for n, v in pool.views.items()
        if eligible(job.spec, v.inventory)
    ]
    return realise(job.spec, pool, d_node, d_gpn, names)


def _first_fitting(jobs: Iterable[Job], pool: FreePool) -> str | None:
    """A waiting job that fits the free resources as they are, if any (one check per
    distinct demand: resources do not change while we look)."""
    seen: set[tuple[object, ...]] = set()
    for job in jobs:
        s = job.spec
        demand = placement_key(s)
        if demand in seen:
            continue
        seen.add(demand)
        if pack(s, pool) is not None:
            return job.id
    return None


def unwrap(policy: Policy) -> Policy:
    """The configured policy inside any wrapper."""
    while isinstance(policy, ProfilingPolicy | FairShareOrdering):
        policy = policy.inner
    return policy
