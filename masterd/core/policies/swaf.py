"""GENIE's QoS-aware scheduling: Shortest Waiting Allowance First (seeds/genie.md §5.4).

At every decide() (an event: a job arrived, finished, a node changed), Algorithm 1:

1. every waiting GPU job takes the highest-CER placement ``<d_node, d_gpn>`` whose latency
   meets its ECT (Eq. 12), else the highest-CER placement overall — except an Urgent job
   (ECT 0, "as soon as possible"), which takes its fastest placement unless
   ``urgent_placement="cer"`` asks for the literal line 13;
2. its waiting allowance is ``w = e − (l + now)`` (Eq. 13);
3. jobs launch in increasing ``w`` while resources allow; a job whose placement does not fit
   now is skipped and later ones may start. Shapes are realised with the best locality
   (``placement.realise``).

``late_tasks`` (beyond the paper): ``"serve"`` (default, Algorithm 1 as published) orders
every job by ``w`` alone, so a job that can no longer meet its ECT on any placement (``w < 0``
under every shape) goes first and delays jobs that still could — the domino effect of
deadline-first ordering under overload. ``"defer"`` puts such late jobs behind every job that
can still meet its ECT, ordered among themselves by ``w`` as before. Urgent jobs placed "as
soon as possible" (ECT 0, never meetable) are not deferred.

CPU-only jobs (``gpus == 0``) have no GENIE model: after the GPU jobs, they are packed in queue
(submission) order with ``placement.pack``, skipping any that do not fit. Jobs lacking model
information are handled by ``genie.plan`` (database similarity fallback, else a default rate).
Ties in ``w`` go to the earlier job in queue order: higher re-queue priority, then submission
time, then job id.

Why the pass is cheap with 10,000 waiting jobs: a job's plan (candidate placements by CER with
their latencies) depends only on the job and the platform, so it is computed once. Its choice
changes only when ``now`` crosses ``e − l`` of its current placement, and ``w + now = e − l``
does not depend on ``now``; so jobs are kept ordered by ``e − l`` and a heap of those
crossing times re-places only the jobs whose choice changed. Jobs are grouped by identical
resource demand (GPU model, shape, cores and memory per node); within a pass resources only
shrink, so once one job of a group cannot be placed, none of that group can, and the launch
loop merges groups by their head job and drops a group at its first failure. A node joining
re-plans only the jobs whose view of the platform changes (``plan.platform_view``). The result
is the same as running Algorithm 1 from scratch (the tests check it against a brute-force
version, across arrivals, completions, node changes and replayed time).
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import logging
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from masterd.core.cluster import ClusterSnapshot
from masterd.core.genie.freepool import LazyFreePool
from masterd.core.genie.modeldb import ModelDB
from masterd.core.genie.options import genie_setup
from masterd.core.genie.plan import (
    Candidate,
    Estimator,
    GenieSettings,
    JobPlan,
    Platform,
    platform_view,
    refresh_candidate,
)
from masterd.core.placement import pack, per_node_share, realise
from masterd.core.policy import Decision, Start
from shared.model import Job, NodeSelector

log = logging.getLogger("trellis.genie")

# (gpu model, d_node, d_gpn, cores per node, MiB per node, the nodes it selects): jobs
# with one demand fit alike.
DemandKey = tuple[str, int, int, int, int, NodeSelector]
# (late, e − l, −requeue priority, submit time, job id): the SWAF order, unique per job;
# ``late`` is 1 only for a deferred job (``late_tasks="defer"``), else 0.
OrderItem = tuple[int, float, int, float, str]
LATE_TASKS = ("serve", "defer")

_BULK = 32  # more changes than this to one group: rebuild its list instead of bisecting


@dataclass(frozen=True)
class Choice:
    """Why a waiting job stands where it does (for operators and tests)."""

    job_id: str
    ect: float
    placement: Candidate
    latency: float
    waiting_allowance: float
    meets_ect: bool
    model_fallback: str  # empty when the job's own profile was used
    deferred: bool = False  # behind every job that can still meet its ECT (late_tasks="defer")


class _Entry:
    __slots__ = (
        "job", "plan", "requeue_priority", "slot", "spec", "state", "submit_time", "trigger",
        "version", "view",
    )

    def __init__(self, job: Job, plan: JobPlan, view: tuple[object, ...]) -> None:
        self.job = job
        self.view = view  # the platform as the plan saw it (plan.platform_view)
        self.spec = job.spec
        self.submit_time = job.submit_time
        self.requeue_priority = job.requeue_priority
        self.plan = plan
        self.state = -1
        # Where the job sits: its demand group and its position key (None: no placement).
        self.slot: tuple[DemandKey, OrderItem] | None = None
        self.trigger = math.inf
        self.version = 0


def _trigger(ect: float, latency: float) -> float:
    """When to re-check a choice: just before ``now`` can exceed ``ect − latency``.

    The exact flip point depends on rounding in ``ect − now``; waking a hair early and
    re-checking exactly keeps the cached choice equal to the from-scratch one.
    """
    flip = ect - latency
    return flip - 1e-9 * (1.0 + abs(ect) + abs(latency))


class SwafPolicy:
    name = "swaf"

    def __init__(
        self,
        modeldb: ModelDB | str | None = None,
        theta: float = 0.4,
        shape_mode: str = "cap",
        default_rate: float = 100.0,
        default_duration_s: float = 3600.0,
        urgent_placement: str = "fastest",
        late_tasks: str = "serve",
    ) -> None:
        db, settings = genie_setup(
            modeldb, theta, shape_mode, default_rate, default_duration_s, urgent_placement
        )
        if late_tasks not in LATE_TASKS:
            raise ValueError(
                f"late_tasks must be one of {', '.join(LATE_TASKS)}, got {late_tasks!r}"
            )
        self.late_tasks = late_tasks
        self.settings: GenieSettings = settings
        self.estimator = Estimator(db, settings)
        self._platform: Platform | None = None
        self._entries: dict[str, _Entry] = {}
        self._groups: dict[DemandKey, list[OrderItem]] = {}
        self._heap: list[tuple[float, int, str, int]] = []
        self._seq = itertools.count()
        self._last_now: float | None = None
        self._db_version = self.estimator.db.version

    # -- the pass ------------------------------------------------------------------------
    def decide(
        self, snapshot: ClusterSnapshot, queue: Sequence[Job], now: float
    ) -> list[Decision]:
        platform = Platform.from_snapshot(snapshot)
        if self.estimator.db.version != self._db_version:
            self._forget_all()  # a model was (re)profiled: every plan may change
            self._db_version = self.estimator.db.version
        if platform != self._platform:
            self._platform_changed(platform)
            self._platform = platform
        if self._last_now is not None and now < self._last_now:
            self._rechoose_all(now)  # time went backwards (a replay): recompute every choice
        self._last_now = now
        cpu_jobs = self._sync(queue, platform, now)
        self._advance(now)
        decisions = self._launch(snapshot, platform, cpu_jobs)
        log.debug("swaf_pass now=%.3f waiting=%d starts=%d", now, len(queue), len(decisions))
        return decisions

    def explain(self, job_id: str, now: float | None = None) -> Choice | None:
        """The choice the last pass made for a waiting GPU job, with ``w`` at ``now``
        (default: the last pass's time)."""
        entry = self._entries.get(job_id)
        if entry is None or entry.slot is None:
            return None
        if now is None:
            now = self._last_now if self._last_now is not None else 0.0
        plan = entry.plan
        r = plan.pick(entry.state)
        c = plan.candidates[plan.records[r]]
        if self._platform is not None:
            c = refresh_candidate(c, self._platform, self.settings.theta)
        latency = plan.record_latencies[r]
        group = plan.groups[c.group]
        fallback = ""
        if group.resolution is None:
            fallback = "no prediction model: default rate"
        elif group.resolution.fallback:
            fallback = group.resolution.reason
        return Choice(
            job_id=job_id,
            ect=plan.ect,
            placement=c,
            latency=latency,
            waiting_allowance=plan.ect - (latency + now),
            meets_ect=latency <= plan.ect - now,
            model_fallback=fallback,
            deferred=bool(entry.slot[1][0]),
        )

    def waiting_order(self) -> list[Choice]:
        """Every waiting GPU job the last pass saw, in SWAF order, with its choice."""
        items = sorted(item for group in self._groups.values() for item in group)
        out = []
        for item in items:
            choice = self.explain(item[4])
            if choice is not None:
                out.append(choice)
        return out

    # -- keeping the ordered queue in step with the real one -----------------------------
    def _sync(self, queue: Sequence[Job], platform: Platform, now: float) -> list[Job]:
        """Match the cache to the queue; returns the CPU-only jobs in queue order.

        This loop is the one cost every pass pays per waiting job, so it does as little as it
        can: one dict lookup and a few identity checks for a job already known.
        """
        entries = self._entries
        get = entries.get
        cpu_jobs: list[Job] = []
        added: list[_Entry] = []
        stale: list[_Entry] = []
        for job in queue:
            entry = get(job.id)
            # The same record with the same spec, not re-queued since: nothing about it
            # changed (submit_time is never reassigned on a queued job; a re-queue bumps the
            # priority; trellisctl update replaces the spec, e.g. its QoS class).
            if (
                entry is not None
                and entry.job is job
                and entry.spec is job.spec
                and entry.requeue_priority == job.requeue_priority
            ):
                continue
            if job.spec.gpus == 0:
                cpu_jobs.append(job)
                if entry is not None:
                    stale.append(entry)  # the id now names a CPU-only job
                continue
            if entry is not None:
                if (
                    entry.spec is job.spec
                    and entry.submit_time == job.submit_time
                    and entry.requeue_priority == job.requeue_priority
                ):
                    entry.job = job  # the same job in a new record: keep its plan
                    continue
                stale.append(entry)  # same id, different job (re-submitted or re-queued)
            added.append(
                _Entry(job, self.estimator.plan(job, platform),
                       platform_view(job.spec, platform, self.settings.shape_mode))
            )
        # Queue ids are unique (the core's queue is keyed by id), so equal counts mean every
        # cached job was matched and nothing left; otherwise find out which ones left.
        gpu_jobs = len(queue) - len(cpu_jobs)
        gone = stale
        if gpu_jobs - len(added) != len(entries) - len(stale):
            # Some jobs left the queue (started, cancelled): find them, stale ones included.
            missing = set(entries).difference([job.id for job in queue])
            gone = stale + [entries[job_id] for job_id in sorted(missing)]
        self._drop(gone)
        for entry in added:
            entries[entry.job.id] = entry
            self._choose(entry, now)
        self._insert(added)
        return cpu_jobs

    def _choose(self, entry: _Entry, now: float) -> None:
        """Algorithm 1 lines 8–14 for one job, and when to look at it again."""
        plan = entry.plan
        # Unique across entries, so a heap item left by a dropped entry never matches a new
        # entry for the same job id.
        entry.version = next(self._seq)
        entry.slot = None
        entry.trigger = math.inf
        if not plan.records:
            return  # no placement on this platform at all: it waits until the cluster changes
        state = plan.state(now)
        entry.state = state
        pick = plan.pick(state)
        c = plan.candidates[plan.records[pick]]
        latency = plan.record_latencies[pick]
        spec = entry.spec
        demand = (
            c.gpu_model,
            c.d_node,
            c.d_gpn,
            per_node_share(spec.cpus, c.d_node),
            per_node_share(spec.memory_mib, c.d_node),
            spec.selector,
        )
        late = int(
            self.late_tasks == "defer" and state == len(plan.records) and not plan.asap
        )
        entry.slot = (
            demand,
            (late, plan.ect - latency, -entry.requeue_priority, entry.submit_time,
             entry.job.id),
        )
        if state < len(plan.records):
            entry.trigger = _trigger(plan.ect, latency)
            heapq.heappush(self._heap, (entry.trigger, next(self._seq), entry.job.id,
                                        entry.version))

    def _advance(self, now: float) -> None:
        """Re-place the jobs whose choice may have changed since the last pass."""
        heap = self._heap
        recheck: list[tuple[float, int, str, int]] = []
        moved: list[_Entry] = []
        while heap and heap[0][0] <= now:
            top = heapq.heappop(heap)
            entry = self._entries.get(top[2])
            if entry is None or entry.version != top[3]:
                continue
            if entry.plan.state(now) == entry.state:
                recheck.append(top)  # inside the rounding margin: look again next pass
                continue
            moved.append(entry)
        for top in recheck:
            heapq.heappush(heap, top)
        if moved:
            self._drop(moved, forget=False)
            for entry in moved:
                self._choose(entry, now)
            self._insert(moved)
        if len(heap) > 2 * len(self._entries) + 64:
            self._compact_heap()

    def _rechoose_all(self, now: float) -> None:
        self._groups.clear()
        self._heap.clear()
        for entry in self._entries.values():
            self._choose(entry, now)
        self._insert(list(self._entries.values()))

    def _platform_changed(self, platform: Platform) -> None:
        """Forget the plans the new platform changes; typically few when a node joins."""
        changed = [
            e for e in self._entries.values()
            if platform_view(e.spec, platform, self.settings.shape_mode) != e.view
        ]
        if len(changed) == len(self._entries):
            self._forget_all()
        else:
            self._drop(changed)

    def _forget_all(self) -> None:
        self._entries.clear()
        self._groups.clear()
        self._heap.clear()

    def _compact_heap(self) -> None:
        self._heap = [
            (e.trigger, next(self._seq), job_id, e.version)
            for job_id, e in self._entries.items()
            if e.trigger != math.inf
        ]
        heapq.heapify(self._heap)

    # -- the ordered groups ----------------------------------------------------------------
    def _insert(self, entries: list[_Entry]) -> None:
        by_group: dict[DemandKey, list[OrderItem]] = defaultdict(list)
        for e in entries:
            if e.slot is not None:
                by_group[e.slot[0]].append(e.slot[1])
        for key, items in by_group.items():
            group = self._groups.setdefault(key, [])
            if len(items) > _BULK:
                group.extend(items)
                group.sort()
            else:
                for item in items:
                    bisect.insort(group, item)

    def _drop(self, entries: list[_Entry], forget: bool = True) -> None:
        by_group: dict[DemandKey, list[OrderItem]] = defaultdict(list)
        for e in entries:
            if e.slot is not None:
                by_group[e.slot[0]].append(e.slot[1])
            if forget and self._entries.get(e.job.id) is e:
                del self._entries[e.job.id]
        for key, items in by_group.items():
            group = self._groups[key]
            if len(items) > _BULK:
                remove = set(items)
                group[:] = [item for item in group if item not in remove]
            else:
                for item in items:
                    del group[bisect.bisect_left(group, item)]
            if not group:
                del self._groups[key]

    # -- launching ---------------------------------------------------------------------------
    def _launch(
        self, snapshot: ClusterSnapshot, platform: Platform, cpu_jobs: list[Job]
    ) -> list[Decision]:
        pool = LazyFreePool(snapshot)
        decisions: list[Decision] = []
        if self._groups:
            self._launch_gpu_jobs(pool, platform, decisions)
        dead: set[tuple[int, int, NodeSelector]] = set()
        for job in cpu_jobs:
            demand = (job.spec.cpus, job.spec.memory_mib, job.spec.selector)
            if demand in dead:
                continue
            placement = pack(job.spec, pool)
            if placement is None:
                dead.add(demand)  # resources only shrink within a pass
                continue
            pool.take(placement)
            decisions.append(Start(job.id, placement))
        return decisions

    def _launch_gpu_jobs(
        self, pool: LazyFreePool, platform: Platform, decisions: list[Decision]
    ) -> None:
        heads = [(items[0], key, 0) for key, items in self._groups.items()]
        heapq.heapify(heads)
        entries = self._entries
        while heads:
            item, key, position = heapq.heappop(heads)
            gpu_model, d_node, d_gpn, cpus_per_node, mem_per_node, _ = key
            job = entries[item[4]].job  # its group's features are every member's
            names = list(itertools.islice(
                pool.ranked(gpu_model, d_gpn, cpus_per_node, mem_per_node, job.spec), d_node))
            if len(names) < d_node:
                continue  # the whole group stays out for this pass
            placement = realise(job.spec, pool, d_node, d_gpn, names)
            if placement is None:
                continue
            pool.take(placement)
            decisions.append(Start(job.id, placement))
            items = self._groups[key]
            if position + 1 < len(items):
                heapq.heappush(heads, (items[position + 1], key, position + 1))
