"""The placements Liquid is compared with (§7.4), over Liquid's task model.

Each is first come, first served with later jobs allowed past one that does not fit (as
Liquid's own policy), places every task of a job (one worker per GPU, one parameter server for
a multi-GPU training job; see ``masterd.core.liquid.demand``) and differs only in where:

* ``random``: each task on a node drawn uniformly among those it fits (seeded per job);
* ``even-spread``: each task on the node with the fewest tasks — GPUs in use plus parameter
  servers — "the instances placed to each computing node averagely";
* ``least-requested``: Kubernetes' default spreading score, each task (a pod) on the node with
  the largest mean of its free CPU and free memory shares (LeastRequestedPriority; GPUs are a
  filter, as for the device plugin's extended resource);
* ``buddy-cells``: a HiveD-like buddy cell allocator for the workers — the job gets one cell
  of the smallest level holding its GPUs (level 0 one GPU, level 1 one node, level k ≥ 1 an
  aligned run of 2^(k-1) nodes), all of it free, taken from the most used cell above it so
  large cells stay whole; the parameter server, which holds no GPU, goes inside the job's
  cell too (HiveD binds all of a job's pods to its cell), on the cell's node Kubernetes'
  default score prefers (``least-requested`` over the cell's nodes).

None shares GPUs or batches jobs: a fractional job gets a whole GPU.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from masterd.core.cluster import ClusterSnapshot
from masterd.core.liquid.demand import PS, Demand, Task
from masterd.core.liquid.nodes import NodeCap
from masterd.core.liquid.passes import LiquidPass
from masterd.core.liquid.realise import realise_plan
from masterd.core.liquid.score import ScoreWeights
from masterd.core.liquid.sharing import SharingRule
from masterd.core.policy import Decision, Start
from shared.model import Job

Chooser = Callable[[LiquidPass, Job, Demand, Task, list[NodeCap], dict[int, str]], str | None]


class _PerTaskPolicy:
    """Queue order with backfill; ``choose`` picks each task's node."""

    name = "per-task"
    # A policy whose choice depends only on the job's shape may skip a shape that failed.
    stateless = True

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    def decide(self, snapshot: ClusterSnapshot, queue: Sequence[Job],
               now: float) -> list[Decision]:
        state = LiquidPass(snapshot, now, ScoreWeights(), 100.0, SharingRule(), False)
        decisions: list[Decision] = []
        failed: set[tuple[object, ...]] = set()
        for job in queue:
            spec = job.spec
            shape = (spec.gpus, spec.cpus, spec.memory_mib, spec.gpu_model)
            if shape in failed and self.stateless:
                continue
            demand = state.demand(job)
            placed = self.place(state, job, demand)
            if placed is None:
                failed.add(shape)
                continue
            placement = realise_plan(demand, placed, state.pool, {})
            if placement is None:
                for task in demand.tasks:
                    state.load.add(placed[task.index], task, -1)
                continue
            decisions.append(Start(job.id, placement))
        return decisions

    def place(self, state: LiquidPass, job: Job, demand: Demand) -> dict[int, str] | None:
        placed: dict[int, str] = {}
        cands = state.candidates(job)
        for task in demand.tasks:
            node = self.choose(state, job, demand, task, cands, placed)
            if node is None:
                for index, where in placed.items():
                    state.load.add(where, demand.tasks[index], -1)
                return None
            placed[task.index] = node
            state.load.add(node, task)
        return placed

    def choose(self, state: LiquidPass, job: Job, demand: Demand, task: Task,
               cands: list[NodeCap], placed: dict[int, str]) -> str | None:
        raise NotImplementedError


def _fitting(state: LiquidPass, task: Task, cands: list[NodeCap]) -> list[NodeCap]:
    return [c for c in cands if state.load.fits(c, task)]


class RandomPolicy(_PerTaskPolicy):
    name = "random"
    stateless = False

    def choose(self, state: LiquidPass, job: Job, demand: Demand, task: Task,
               cands: list[NodeCap], placed: dict[int, str]) -> str | None:
        fitting = _fitting(state, task, cands)
        if not fitting:
            return None
        rng = random.Random(f"random/{self.seed}/{job.id}/{task.index}")
        return fitting[rng.randrange(len(fitting))].name


def _tasks_on(state: LiquidPass, cap: NodeCap) -> int:
    return (cap.used_gpus + state.load.gpus.get(cap.name, 0) + cap.ps_tasks
            + state.ps_added.get(cap.name, 0))


class EvenSpreadPolicy(_PerTaskPolicy):
    name = "even-spread"

    def choose(self, state: LiquidPass, job: Job, demand: Demand, task: Task,
               cands: list[NodeCap], placed: dict[int, str]) -> str | None:
        fitting = _fitting(state, task, cands)
        if not fitting:
            return None
        best = min(fitting, key=lambda c: _tasks_on(state, c))
        if task.role == PS:
            state.ps_added[best.name] = state.ps_added.get(best.name, 0) + 1
        return best.name


def least_requested(state: LiquidPass, task: Task, cands: list[NodeCap]) -> str | None:
    """The fitting node with the largest mean of free CPU and free memory shares after the
    task; the first such node in the pass's order on a tie."""
    best: tuple[float, int, str] | None = None
    for order, cap in enumerate(_fitting(state, task, cands)):
        inv = cap.inventory
        cpu = (cap.free_cpus - state.load.cpus.get(cap.name, 0) - task.cpus) / max(
            len(inv.cpus), 1)
        mem = (cap.free_memory_mib - state.load.memory.get(cap.name, 0)
               - task.memory_mib) / max(inv.memory_mib, 1)
        # Pods count towards a node's requests even when they ask for nothing (Kubernetes
        # gives each a small default request): at equal shares, fewer pods first.
        pods = _tasks_on(state, cap) / max(cap.total_gpus + 1, 1)
        key = (-((cpu + mem) / 2 - 1e-3 * pods), order, cap.name)
        if best is None or key < best:
            best = key
    return None if best is None else best[2]


class LeastRequestedPolicy(_PerTaskPolicy):
    name = "least-requested"

    def choose(self, state: LiquidPass, job: Job, demand: Demand, task: Task,
               cands: list[NodeCap], placed: dict[int, str]) -> str | None:
        node = least_requested(state, task, cands)
        if node is not None and task.role == PS:
            state.ps_added[node] = state.ps_added.get(node, 0) + 1
        return node


class BuddyCellPolicy(_PerTaskPolicy):
    name = "buddy-cells"

    def place(self, state: LiquidPass, job: Job, demand: Demand) -> dict[int, str] | None:
        workers = [t for t in demand.tasks if t.role != PS]
        cands = state.candidates(job)
        placed: dict[int, str] = {}
        gpu_workers = [t for t in workers if t.gpus]
        inside = cands  # where the job's other tasks may go: its cell, once it has one
        if gpu_workers:
            cell = self._cell(state, cands, gpu_workers)
            if cell is None:
                return None
            for task, node in zip(gpu_workers, cell, strict=True):
                placed[task.index] = node
                state.load.add(node, task)
            members = set(cell)
            inside = [c for c in cands if c.name in members]
        for task in demand.tasks:
            if task.index in placed:
                continue
            node = least_requested(state, task, inside)
            if node is None:
                for index, where in placed.items():
                    state.load.add(where, demand.tasks[index], -1)
                return None
            if task.role == PS:
                state.ps_added[node] = state.ps_added.get(node, 0) + 1
            placed[task.index] = node
            state.load.add(node, task)
        return placed

    def _cell(self, state: LiquidPass, cands: list[NodeCap],
              tasks: list[Task]) -> list[str] | None:
        """Nodes for each worker: one free buddy cell of the smallest level that holds them."""
        need = len(tasks)
        per_node = max((c.total_gpus for c in cands), default=0)
        if per_node == 0:
            return None

        def free(c: NodeCap) -> int:
            return c.free_gpus - state.load.gpus.get(c.name, 0)

        def fits(c: NodeCap, count: int) -> bool:
            t = tasks[0]
            return (free(c) >= count and state.load.cpus.get(c.name, 0) + t.cpus * count
                    <= c.free_cpus and state.load.memory.get(c.name, 0) + t.memory_mib * count
                    <= c.free_memory_mib)

        if need < per_node:
            # Inside one node: the most used node that still has room (the buddy of a busy
            # cell first, so whole nodes stay free for larger cells).
            fitting = [(free(c), i, c) for i, c in enumerate(cands) if fits(c, need)]
            if not fitting:
                return None
            _, _, cap = min(fitting, key=lambda e: (e[0], e[1]))
            return [cap.name] * need
        size = 1
        while size * per_node < need:
            size *= 2
        best: tuple[int, int, list[NodeCap]] | None = None
        for start in range(0, len(cands) - size + 1, size):
            group = cands[start:start + size]
            if not all(free(c) == c.total_gpus == per_node for c in group):
                continue
            parent = (start // (2 * size)) * 2 * size
            parent_free = sum(free(c) for c in cands[parent:parent + 2 * size])
            if best is None or (parent_free, start) < best[:2]:
                best = (parent_free, start, group)
        if best is None:
            return None
        nodes = [c.name for c in best[2] for _ in range(per_node)][:need]
        for name, count in _counts(nodes).items():
            cap = state.caps[name]
            if not fits(cap, count):
                return None
        return nodes


def _counts(nodes: list[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for n in nodes:
        out[n] = out.get(n, 0) + 1
    return out
