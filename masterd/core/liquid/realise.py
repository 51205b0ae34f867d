"""Turning a plan (task -> node) into a placement with concrete GPUs and cores.

The parameter server's node comes first in the placement (rank 0: the job's PS runs with
``RANK=0``); the other nodes follow by the number of the job's workers on them, then by name.
GPUs are chosen with the locality every policy uses (``choose_gpus``): free whole GPUs first,
then GPUs lent by jobs saving their model (the allocation is then held shared). Cores go on
the NUMA nodes of the chosen GPUs (``choose_cpus``).
"""

from __future__ import annotations

from collections.abc import Mapping

from masterd.core.liquid.demand import PS, Demand
from masterd.core.placement import FreePool, choose_cpus, choose_gpus
from shared.model import NodeAllocation, Placement


def realise_plan(
    demand: Demand,
    placed: Mapping[int, str],
    pool: FreePool,
    lent: dict[str, list[int]],
    shared: bool = False,
) -> Placement | None:
    """``lent``: per node, lent GPU ids the job may take (taken ones are removed);
    ``shared``: hold every GPU shared (a fractional job on a free GPU)."""
    gpus_on: dict[str, int] = {}
    cpus_on: dict[str, int] = {}
    mem_on: dict[str, int] = {}
    workers_on: dict[str, int] = {}
    ps_node: str | None = None
    for task in demand.tasks:
        node = placed[task.index]
        gpus_on[node] = gpus_on.get(node, 0) + task.gpus
        cpus_on[node] = cpus_on.get(node, 0) + task.cpus
        mem_on[node] = mem_on.get(node, 0) + task.memory_mib
        if task.role == PS:
            ps_node = node
        else:
            workers_on[node] = workers_on.get(node, 0) + 1
    order = sorted(gpus_on, key=lambda n: (n != ps_node, -workers_on.get(n, 0), n))
    allocations: list[NodeAllocation] = []
    for node in order:
        view = pool.views[node]
        want = gpus_on[node]
        free = pool.gpus[node]
        from_free = min(want, len(free))
        gpus = choose_gpus(view, free, from_free) if from_free else ()
        if gpus is None:
            return None
        borrowed: tuple[int, ...] = ()
        if want > from_free:
            spare = lent.get(node, [])
            if len(spare) < want - from_free:
                return None
            borrowed = tuple(spare[: want - from_free])
        numa = {view.inventory.numa_of_gpu(g) for g in (*gpus, *borrowed)} - {-1}
        cpus = choose_cpus(view, pool.cpus[node], cpus_on[node], numa)
        if cpus is None or pool.memory[node] < mem_on[node]:
            return None
        allocations.append(NodeAllocation(
            node, tuple(sorted((*gpus, *borrowed))), cpus, mem_on[node],
            shared=shared or bool(borrowed)))
    placement = Placement(tuple(allocations))
    for alloc in placement.allocations:
        taken = set(alloc.gpus)
        if alloc.node in lent:
            lent[alloc.node] = [g for g in lent[alloc.node] if g not in taken]
    pool.take(placement)
    return placement
