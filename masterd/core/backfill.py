"""EASY backfill (Lifka's EASY scheduler; Mu'alem and Feitelson, TPDS 2001) on real nodes.

Jobs start in queue order while they fit. The first that does not (the head) gets a
reservation: running jobs are released in the order they end by their time limits
(``start_time + time_limit_s``; a job without one never ends) until the placement code
finds the head a place; that instant is the reservation's ``start`` and that placement, on
specific nodes, GPUs and cores, the resources it is promised. A later job may then start
only if it ends by its own limit before ``start`` or fits in what the reservation leaves
free: it never delays the head. With a job of no limit in the head's way, ``start`` is
infinite: no "ends before" exists, and only jobs that touch none of the reserved resources
backfill. Plain backfill (``backfill=true``) has no reservation: a stream of small jobs can
keep a large head waiting for ever.

Pure and deterministic, as every policy: no clock but ``now``, ties broken by order.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from masterd.core.cluster import ClusterSnapshot
from masterd.core.consolidate import ShrinkingPlacer, place
from masterd.core.eligibility import eligible
from masterd.core.placement import FreePool
from masterd.core.policy import Decision, Start
from masterd.core.timelimits import end_by_limit
from shared.model import Job, JobSpec, Placement


@dataclass(frozen=True)
class Reservation:
    """What the head job (``job_id``) is promised: ``placement`` from ``start`` on (inf: a
    job without a time limit is in its way); ``held``: later jobs that would fit now but
    wait so as not to delay it (their wait reason is ``reserved``)."""

    job_id: str
    start: float
    placement: Placement
    held: frozenset[str] = field(default_factory=frozenset)

    @property
    def nodes(self) -> tuple[str, ...]:
        return self.placement.nodes


def own_end(spec: JobSpec, now: float) -> float:
    """When a job started now ends at the latest by its limit."""
    return math.inf if spec.time_limit_s is None else now + spec.time_limit_s


def easy_backfill(snapshot: ClusterSnapshot, queue: Iterable[Job], placement: str,
                  now: float) -> tuple[list[Decision], Reservation | None]:
    pool = FreePool(snapshot)
    fit_now = ShrinkingPlacer(pool, placement)  # both pools only shrink during the pass
    decisions: list[Decision] = []
    # (end by limit, placement) of every job holding resources, this pass's starts included.
    ends = [(end_by_limit(j, now), j.placement) for j in snapshot.running.values()
            if j.placement is not None]
    jobs = iter(queue)
    head: Job | None = None
    for job in jobs:
        chosen = fit_now(job.spec)
        if chosen is None:
            head = job
            break
        pool.take(chosen)
        decisions.append(Start(job.id, chosen))
        ends.append((own_end(job.spec, now), chosen))
    if head is None:
        return decisions, None
    found = shadow(head.spec, snapshot, decisions, ends, placement, now)
    if found is None:  # it fits no schedulable node even when all is free: nothing to hold
        return decisions + _plain(jobs, fit_now), None
    start, promised = found
    outside = _without(snapshot, decisions, promised, ends, start)
    fit_outside = ShrinkingPlacer(outside, placement)
    held: set[str] = set()
    would_fit: dict[tuple[object, ...], bool] = {}  # shapes that fit now, until a start
    for job in jobs:
        if start < math.inf and own_end(job.spec, now) <= start:
            chosen = fit_now(job.spec)  # gone before the head starts
        else:
            chosen = fit_outside(job.spec)
            if chosen is None:
                shape = fit_now.shape(job.spec)
                if shape not in would_fit:
                    would_fit[shape] = fit_now(job.spec) is not None
                if would_fit[shape]:
                    held.add(job.id)
        if chosen is None:
            continue
        pool.take(chosen)
        outside.take(chosen)
        would_fit.clear()
        decisions.append(Start(job.id, chosen))
    return decisions, Reservation(head.id, start, promised, frozenset(held))


def _plain(jobs: Iterable[Job], fit: ShrinkingPlacer) -> list[Decision]:
    decisions: list[Decision] = []
    for job in jobs:
        chosen = fit(job.spec)
        if chosen is not None:
            fit.pool.take(chosen)
            decisions.append(Start(job.id, chosen))
    return decisions



def _pool_after(snapshot: ClusterSnapshot, decisions: list[Decision]) -> FreePool:
    pool = FreePool(snapshot)
    for decision in decisions:
        assert isinstance(decision, Start)
        pool.take(decision.placement)
    return pool


def shadow(spec: JobSpec, snapshot: ClusterSnapshot, decisions: list[Decision],
           ends: list[tuple[float, Placement]], placement: str, now: float = 0.0
           ) -> tuple[float, Placement] | None:
    """The earliest instant (the "shadow time") and place at which ``spec`` fits once the
    jobs of ``ends`` release their resources by their limits; None if it never fits."""
    future = _pool_after(snapshot, decisions)
    views = future.views

    # Cheap necessary condition before each placement try: enough GPUs (cores for a CPU
    # job) free on the job's nodes, kept as a running sum.
    def counted(node: str) -> bool:
        return eligible(spec, views[node].inventory)

    want = spec.gpus or spec.cpus
    free = sum(len(future.gpus[n]) if spec.gpus else len(future.cpus[n])
               for n in views if counted(n))
    shared: dict[tuple[str, int], int] = {}
    ordered = sorted(ends, key=lambda e: (e[0], e[1].nodes))
    i = 0
    while i < len(ordered):
        instant = ordered[i][0]
        while i < len(ordered) and ordered[i][0] == instant:
            free += _release(future, ordered[i][1], shared, spec.gpus > 0, counted)
            i += 1
        if free >= want:
            # Only nodes it may use then: no window or reservation there that its limit
            # would cross from that instant (a promise no block will break).
            future.after = max(0.0, instant - now) if future.timed else 0.0
            chosen = place(spec, future, placement)
            if chosen is not None:
                return instant, chosen
    return None


def _release(pool: FreePool, held: Placement, shared: dict[tuple[str, int], int],
             gpus: bool, counted: Callable[[str], bool]) -> int:
    """Give a job's resources back to ``pool``; how many GPUs (cores for a CPU job) of the
    counted scope came back. A GPU held shared comes back with its last holder."""
    back = 0
    for alloc in held.allocations:
        node = alloc.node
        if node not in pool.views:  # not schedulable: nothing comes back there
            continue
        returned = set(alloc.gpus)
        if alloc.shared:
            returned = set()
            for gpu in alloc.gpus:
                key = (node, gpu)
                holders = shared.get(key, pool.views[node].shared_gpus.get(gpu, 1)) - 1
                shared[key] = holders
                if holders <= 0:
                    returned.add(gpu)
        before = len(pool.gpus[node]) if gpus else len(pool.cpus[node])
        pool.assign(node, gpus=pool.gpus[node] | returned,
                    cpus=pool.cpus[node] | set(alloc.cpus))
        pool.memory[node] = pool.memory[node] + alloc.memory_mib
        if counted(node):
            back += (len(pool.gpus[node]) if gpus else len(pool.cpus[node])) - before
    return back


def _without(snapshot: ClusterSnapshot, decisions: list[Decision], promised: Placement,
             ends: list[tuple[float, Placement]], start: float) -> FreePool:
    """The pool now, less what the head is promised: its GPUs and cores that are free now,
    and the memory it needs beyond what jobs ending by ``start`` give back on each node."""
    pool = _pool_after(snapshot, decisions)
    released: dict[str, int] = {}
    for end, held in ends:
        if end <= start:
            for alloc in held.allocations:
                released[alloc.node] = released.get(alloc.node, 0) + alloc.memory_mib
    for alloc in promised.allocations:
        node = alloc.node
        pool.assign(node, gpus=pool.gpus[node] - set(alloc.gpus),
                    cpus=pool.cpus[node] - set(alloc.cpus))
        pool.memory[node] = pool.memory[node] - max(0, alloc.memory_mib
                                                    - released.get(node, 0))
    return pool
