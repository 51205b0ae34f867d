"""SCHED²'s packing placement (seeds/sched2.md §II-B, Fig. 2).

"The algorithm first tries to find the server with the fewest free GPUs that can satisfy the
job's GPU demand if possible. If there is no such server, the algorithm chooses the server
with the most amount of free GPUs, and then the remaining GPU requirement will be satisfied by
the above logic again." A job may so end up split unevenly (3 + 1 GPUs), which the even shapes
of :func:`masterd.core.placement.pack` never do.

Ties go to the free index's order (fewest free cores, then name), so placements are
deterministic. A job's CPU cores and memory are split over its servers in proportion to the
GPUs it gets on each (rounded up). The paper assumes identical GPUs; a job that names no GPU
model is packed within one model, the one where it needs the fewest servers.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from masterd.core.placement import FreePool, choose_cpus, choose_gpus, realise
from shared.model import JobSpec, NodeAllocation, Placement


def best_servers(gpus: int, gpus_per_server: int) -> int:
    """How many servers a job needs at best locality (all its GPUs as packed as can be)."""
    return max(1, math.ceil(gpus / max(gpus_per_server, 1)))


def _share(total: int, part: int, whole: int) -> int:
    return math.ceil(total * part / whole) if total else 0


def _fitting(spec: JobSpec, pool: FreePool, model: str, need: int,
             used: set[str]) -> str | None:
    """The server with the fewest free GPUs that holds ``need`` more GPUs, if any."""
    g = spec.gpus
    for node in pool.ranked(model, need, _share(spec.cpus, need, g),
                            _share(spec.memory_mib, need, g), spec):
        if node not in used:
            return node
    return None


def _emptiest(spec: JobSpec, pool: FreePool, model: str, need: int,
              used: set[str]) -> tuple[str, int] | None:
    """The server with the most free GPUs (and cores for them), and how many it gives."""
    g = spec.gpus
    for free in range(min(pool.index.max_gpus_per_node(model), need), 0, -1):
        # ranked() yields servers with at least ``free`` free GPUs, fewest first: the first
        # unused one has exactly ``free`` once every larger count has been tried.
        for node in pool.ranked(model, free, _share(spec.cpus, free, g),
                                _share(spec.memory_mib, free, g), spec):
            if node not in used:
                return node, free
    return None


def pack_split(spec: JobSpec, pool: FreePool, model: str) -> list[tuple[str, int]] | None:
    """Servers and GPU counts packing gives ``spec`` among servers of ``model``, or None."""
    need = spec.gpus
    chosen: list[tuple[str, int]] = []
    used: set[str] = set()
    while need > 0:
        node = _fitting(spec, pool, model, need, used)
        if node is not None:
            chosen.append((node, need))
            return chosen
        found = _emptiest(spec, pool, model, need, used)
        if found is None:
            return None
        node, count = found
        chosen.append((node, count))
        used.add(node)
        need -= count
    return chosen


def realise_split(spec: JobSpec, pool: FreePool, split: list[tuple[str, int]]) -> Placement:
    """Concrete GPUs (tightest locality inside each server), cores and memory for a split."""
    allocations = []
    for node, count in split:
        view = pool.views[node]
        gpus = choose_gpus(view, pool.gpus[node], count)
        assert gpus is not None  # pack_split only picks servers with that many free GPUs
        numa = {view.inventory.numa_of_gpu(i) for i in gpus} - {-1}
        cpus = choose_cpus(view, pool.cpus[node], _share(spec.cpus, count, spec.gpus), numa)
        assert cpus is not None
        allocations.append(
            NodeAllocation(node, gpus, cpus, _share(spec.memory_mib, count, spec.gpus)))
    return Placement(tuple(allocations))


def pack(spec: JobSpec, pool: FreePool, models: Iterable[str]) -> Placement | None:
    """SCHED²'s packing of ``spec`` on ``pool``; ``models``: the cluster's GPU models.

    CPU-only jobs take one node (``placement.realise``). Returns None when the job does not
    fit the free resources.
    """
    if spec.gpus == 0:
        return realise(spec, pool, 1, 0)
    scopes = [spec.gpu_model] if spec.gpu_model is not None else sorted(models)
    best: list[tuple[str, int]] | None = None
    for model in scopes:
        split = pack_split(spec, pool, model)
        if split is not None and (best is None or len(split) < len(best)):
            best = split
    return None if best is None else realise_split(spec, pool, best)
