"""One scheduling pass of Liquid: the state it builds from the snapshot and the steps it
takes for each kind of waiting job (see :class:`masterd.core.policies.liquid.LiquidPolicy`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from masterd.core.cluster import ClusterSnapshot
from masterd.core.eligibility import eligible
from masterd.core.liquid.bestfit import best_fit, similar_groups
from masterd.core.liquid.demand import Demand, Task, demand_of, has_ps
from masterd.core.liquid.ga import GaSettings, grouping_ga
from masterd.core.liquid.nodes import Load, NodeCap
from masterd.core.liquid.realise import realise_plan
from masterd.core.liquid.score import ScoreWeights
from masterd.core.liquid.sharing import Holder, SharingRule, lent_eligible
from masterd.core.placement import FreePool, choose_cpus
from masterd.core.policy import Start
from shared.model import Job, JobSpec, NodeAllocation, Placement


@dataclass
class PassStats:
    batches: int = 0
    batch_jobs: int = 0
    ga_generations: int = 0
    ga_evaluations: int = 0
    ga_capped: int = 0  # batches the evaluation cap stopped before Liquid's rule did
    shared_starts: int = 0
    prescheduled_starts: int = 0


@dataclass
class LiquidPass:
    """Free capacity of one pass, as counts (``caps``, ``load``) and as concrete ids
    (``pool``), kept in step as jobs are placed."""

    snapshot: ClusterSnapshot
    now: float
    weights: ScoreWeights
    default_bandwidth: float
    rule: SharingRule
    prescheduling: bool
    sharing: bool = True  # fractional jobs hold their GPU shared (else whole)
    pool: FreePool = field(init=False)
    caps: dict[str, NodeCap] = field(init=False)
    load: Load = field(init=False, default_factory=Load)
    # (node, gpu) -> jobs holding it shared; lent GPU ids eligible for pre-scheduling.
    holders: dict[tuple[str, int], list[Holder]] = field(init=False, default_factory=dict)
    lent: dict[str, list[int]] = field(init=False, default_factory=dict)
    ps_added: dict[str, int] = field(init=False, default_factory=dict)
    wake: list[float] = field(init=False, default_factory=list)
    stats: PassStats = field(init=False, default_factory=PassStats)
    _by_model: dict[object, list[NodeCap]] = field(init=False, default_factory=dict)
    _groups: dict[object, list[list[tuple[int, NodeCap]]]] = field(init=False,
                                                                   default_factory=dict)

    def __post_init__(self) -> None:
        snapshot = self.snapshot
        self.pool = FreePool(snapshot)
        ps_tasks: dict[str, int] = {}
        for job in snapshot.running.values():
            placement = job.placement
            if placement is None or not placement.allocations:
                continue
            if has_ps(job.spec):
                first = placement.allocations[0].node
                ps_tasks[first] = ps_tasks.get(first, 0) + 1
            for alloc in placement.allocations:
                if alloc.shared:
                    self._hold(job, alloc)
        self.caps = {}
        for name, view in snapshot.schedulable.items():
            self.caps[name] = NodeCap(
                name=name, inventory=view.inventory, total_gpus=view.total_gpus,
                free_gpus=len(view.free_gpus), lent_gpus=len(self.lent.get(name, ())),
                free_cpus=len(view.free_cpus), free_memory_mib=view.free_memory_mib,
                ps_tasks=ps_tasks.get(name, 0))

    def _hold(self, job: Job, alloc: NodeAllocation) -> None:
        view = self.snapshot.schedulable.get(alloc.node)
        memory = _gpu_memory(view.inventory.gpus, alloc.gpus) if view is not None else None
        demand = demand_of(job, self.default_bandwidth, memory)
        for g in alloc.gpus:
            self.holders.setdefault((alloc.node, g), []).append(Holder(
                job.id, demand.gpu_util, demand.gpu_mem_mib, demand.shareable))
        if not self.prescheduling or demand.shareable or view is None:
            return
        for g in alloc.gpus:
            holders = self.holders[(alloc.node, g)]
            # Lent by a job saving its model, held by it alone: Liquid's "exactly one job".
            if len(holders) != 1 or view.shared_gpus.get(g) != 1:
                continue
            ok, when = lent_eligible(job, None, self.now)
            if ok:
                self.lent.setdefault(alloc.node, []).append(g)
            elif when is not None:
                self.wake.append(when)

    # -- candidates ----------------------------------------------------------------------
    def candidates(self, job: Job) -> list[NodeCap]:
        spec = job.spec
        key = _candidate_key(spec)
        found = self._by_model.get(key)
        if found is None:
            found = [c for c in self.caps.values()
                     if (spec.gpus == 0 or c.total_gpus > 0) and eligible(spec, c.inventory)
                     and (not spec.selector.exclusive or self.pool.idle(c.name))]
            self._by_model[key] = found
            self._groups[key] = similar_groups(found)
        return found

    def groups(self, job: Job) -> list[list[tuple[int, NodeCap]]]:
        self.candidates(job)
        return self._groups[_candidate_key(job.spec)]

    def demand(self, job: Job) -> Demand:
        memory = None
        if job.spec.gpu_milli is not None:
            memory = next((c.inventory.gpus[0].memory_mib for c in self.candidates(job)
                           if c.inventory.gpus), None)
        return demand_of(job, self.default_bandwidth, memory)

    # -- steps ---------------------------------------------------------------------------
    def immediate(self, job: Job, demand: Demand) -> Start | None:
        """Best fit (Algorithm 1); a whole-GPU job may take GPUs lent for pre-scheduling."""
        lent = self.prescheduling and not demand.shareable and any(self.lent.values())
        if lent:
            for name, ids in self.lent.items():
                self.caps[name].lent_gpus = len(ids)
        placed = best_fit(demand, self.candidates(job), self.caps, self.load, self.weights,
                          lent=lent, ps_added=self.ps_added, groups=self.groups(job))
        if placed is None:
            return None
        placement = realise_plan(demand, placed, self.pool, self.lent if lent else {},
                                 shared=demand.shareable and self.sharing)
        if placement is None:
            self._undo(demand, placed)
            return None
        if any(a.shared for a in placement.allocations) and lent:
            self.stats.prescheduled_starts += 1
        return self._started(job, demand, placement)

    def share(self, job: Job, demand: Demand) -> Start | None:
        """Join a GPU other sharing jobs hold, if Liquid's rule admits the job (§6.2)."""
        task = demand.tasks[0]
        best: tuple[float, int, str, int] | None = None
        allowed = {c.name for c in self.candidates(job)}
        order = {name: i for i, name in enumerate(self.caps)}
        for (node, gpu), holders in self.holders.items():
            cap = self.caps.get(node)
            if cap is None or node not in allowed:
                continue
            memory = _gpu_memory(cap.inventory.gpus, (gpu,))
            if not self.rule.admits(holders, demand.gpu_util, demand.gpu_mem_mib, memory or 0):
                continue
            if (self.load.cpus.get(node, 0) + task.cpus > cap.free_cpus
                    or self.load.memory.get(node, 0) + task.memory_mib > cap.free_memory_mib):
                continue
            # Best fit: the fullest GPU that still admits the job.
            key = (-sum(h.util for h in holders), order[node], node, gpu)
            if best is None or key < best:
                best = key
        if best is None:
            return None
        node, gpu = best[2], best[3]
        view = self.pool.views[node]
        cpus = choose_cpus(view, self.pool.cpus[node], task.cpus,
                           {view.inventory.numa_of_gpu(gpu)} - {-1})
        if cpus is None:
            return None
        placement = Placement((NodeAllocation(node, (gpu,), cpus, task.memory_mib,
                                              shared=True),))
        self.pool.take(placement)
        self.load.add(node, Task(job.id, 0, task.role, 0, task.cpus, task.memory_mib))
        self.stats.shared_starts += 1
        return self._started(job, demand, placement)

    def reserve(self, job: Job, demand: Demand) -> dict[int, str] | None:
        """Hold room for a job of a closing batch by best fit, in its queue position; the
        batch is re-planned together by :meth:`place_batch`."""
        return best_fit(demand, self.candidates(job), self.caps, self.load, self.weights,
                        ps_added=self.ps_added, groups=self.groups(job))

    def place_batch(self, jobs: Sequence[tuple[Job, Demand, dict[int, str]]],
                    settings: GaSettings, seed: str) -> list[Start]:
        """Place a batch together with the grouping GA (Eq. 7–8), starting from the room
        reserved for it (a plan the GA's result can only better)."""
        for _, demand, placed in jobs:
            self._undo(demand, placed)
        demands = [d for _, d, _ in jobs]
        candidates = [self.candidates(j) for j, _, _ in jobs]
        result = grouping_ga(demands, candidates, self.caps, self.load, self.weights, settings,
                             seed, self.ps_added, seeds=[[p for _, _, p in jobs]])
        if result is None:  # never expected: the reserved plan is a valid one
            return []
        self.stats.batches += 1
        self.stats.batch_jobs += len(jobs)
        self.stats.ga_generations += result.generations
        self.stats.ga_evaluations += result.evaluations
        self.stats.ga_capped += result.capped
        starts = []
        for (job, demand, _), placed in zip(jobs, result.placed, strict=True):
            placement = realise_plan(demand, placed, self.pool, {})
            if placement is None:  # counts and ids disagree: never expected
                self._undo(demand, placed)
                continue
            starts.append(self._started(job, demand, placement))
        return starts

    def _started(self, job: Job, demand: Demand, placement: Placement) -> Start:
        for alloc in placement.allocations:
            if alloc.shared:
                for g in alloc.gpus:
                    self.holders.setdefault((alloc.node, g), []).append(Holder(
                        job.id, demand.gpu_util, demand.gpu_mem_mib, demand.shareable))
        if has_ps(job.spec) and placement.allocations:
            first = placement.allocations[0].node
            self.ps_added[first] = self.ps_added.get(first, 0) + 1
        return Start(job.id, placement)

    def _undo(self, demand: Demand, placed: dict[int, str]) -> None:
        for task in demand.tasks:
            self.load.add(placed[task.index], task, -1)

    def free_gpus(self) -> int:
        return sum(max(0, c.free_gpus - self.load.gpus.get(c.name, 0)) for c in
                   self.caps.values()) + sum(len(v) for v in self.lent.values())


def _gpu_memory(gpus: Sequence[object], indices: Sequence[int]) -> int | None:
    by_index = {g.index: g for g in gpus}  # type: ignore[attr-defined]
    sizes = [by_index[i].memory_mib for i in indices if i in by_index]
    return min(sizes) if sizes else None


def _candidate_key(spec: JobSpec) -> object:
    """Jobs with one key may use the same nodes (masterd.core.eligibility)."""
    return ("cpu" if spec.gpus == 0 else ("gpu", spec.gpu_model), spec.selector)
