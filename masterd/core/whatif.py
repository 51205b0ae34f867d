"""What-if placement for preemption: would a job fit if these running jobs were stopped?

Shared by every stage that chooses victims (quota reclaim, masterd/core/quotas.py; priority
classes, masterd/core/preemption.py), so both free resources every policy's placement
accepts: the job's fewest-nodes shape, one node when one can hold it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from masterd.core.cluster import ClusterSnapshot
from masterd.core.eligibility import eligible
from masterd.core.placement import FreePool, model_scope, realise, shapes
from shared.model import Job, JobSpec, Placement


def fewest_nodes_shape(spec: JobSpec, pool: FreePool) -> tuple[int, int] | None:
    """The fewest-nodes shape (nodes, GPUs per node) of a job; (1, 0) for a CPU-only one."""
    if spec.gpus == 0:
        return 1, 0
    scope = model_scope(spec)
    max_gpn = pool.index.max_gpus_per_node(scope)
    limit = spec.max_nodes or pool.index.node_count(scope)
    found = shapes(spec.gpus, max_gpn, limit)
    return found[0] if found else None


def needed_victims(spec: JobSpec, snapshot: ClusterSnapshot, chosen: list[Job],
            nodes: tuple[str, ...], d_gpn: int) -> list[Job]:
    """The victims the owner's placement on ``nodes`` needs: on each node, the newest of
    those there until enough GPUs are free; the others keep running. Checked once: if
    the kept ones do not make it fit (cores or memory), every chosen victim there stays."""
    kept: dict[str, Job] = {}
    for node in nodes:
        short = d_gpn - len(snapshot.nodes[node].free_gpus)
        for job in chosen:  # newest first
            if short <= 0:
                break
            for alloc in job.placement.allocations:  # type: ignore[union-attr]
                if alloc.node == node:
                    kept[job.id] = job
                    short -= len(alloc.gpus)
    pool = FreePool(snapshot)
    for job in kept.values():
        give_back(pool, job)
    if realise(spec, pool, len(nodes), d_gpn, candidates=list(nodes)) is not None:
        return list(kept.values())
    on_nodes = set(nodes)
    return [j for j in chosen
            if any(a.node in on_nodes for a in j.placement.allocations)]  # type: ignore[union-attr]


def fits_now(spec: JobSpec, pool: FreePool) -> bool:
    """Whether the job fits on the fewest nodes it can use (one node when one can hold it,
    else whole nodes): what every placement accepts, packing and Helios' consolidation
    alike, so what reclaim frees is usable whatever the policy's placement rule."""
    if spec.gpus == 0:
        return realise(spec, pool, 1, 0) is not None
    scope = model_scope(spec)
    max_gpn = pool.index.max_gpus_per_node(scope)
    limit = spec.max_nodes or pool.index.node_count(scope)
    for d_node, d_gpn in shapes(spec.gpus, max_gpn, limit)[:1]:
        if realise(spec, pool, d_node, d_gpn) is not None:
            return True
    return False



def give_back(pool: FreePool, job: Job) -> None:
    """What-if: ``job``'s resources free in ``pool``."""
    for alloc in job.placement.allocations:  # type: ignore[union-attr]
        if alloc.node not in pool.views:
            continue
        pool.assign(alloc.node, gpus=pool.gpus[alloc.node] | frozenset(alloc.gpus),
                    cpus=pool.cpus[alloc.node] | frozenset(alloc.cpus))
        pool.memory.store(alloc.node, pool.memory[alloc.node] + alloc.memory_mib)


def free_until_fits(spec: JobSpec, snapshot: ClusterSnapshot, pool: FreePool,
                    shape: tuple[int, int], candidates: Iterable[Job],
                    usable: Callable[[str], bool] = lambda node: True,
                    chosen: Callable[[Job], None] = lambda job: None,
                    ) -> tuple[list[Job], Placement] | None:
    """Give ``candidates`` back in ``pool`` one at a time, in their order, until ``spec``
    fits in ``shape`` (nodes, GPUs per node): the victims its placement needs (on each node
    only as many as it takes) and the placement; None when all of them would not make it fit.

    A candidate with no node the job may use (``eligible`` and ``usable``) is passed over;
    ``chosen`` hears each one given back (a caller that weighs the next by what was freed).
    The search stays cheap on a large cluster: a placement is tried only among the nodes
    that have (or were given back) enough free GPUs, once there are enough of them."""
    d_node, d_gpn = shape
    ok = {n for n in pool.ranked(model_scope(spec), d_gpn, 0, 0, spec) if usable(n)}
    given: list[Job] = []
    for victim in candidates:
        assert victim.placement is not None
        nodes = [a.node for a in victim.placement.allocations
                 if a.node in pool.views and usable(a.node)
                 and eligible(spec, pool.views[a.node].inventory)]
        if not nodes:
            continue
        chosen(victim)
        given.append(victim)
        give_back(pool, victim)
        ok.update(n for n in nodes if len(pool.gpus[n]) >= d_gpn)
        if len(ok) < d_node:
            continue
        placement = realise(spec, pool, d_node, d_gpn, candidates=sorted(ok))
        if placement is not None:
            return needed_victims(spec, snapshot, given, placement.nodes, d_gpn), placement
    return None
