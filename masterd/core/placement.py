"""Turning "how many GPUs on how many nodes" into concrete GPUs and cores.

Policies decide shapes; this module realises them with the best locality a node offers:
GPUs behind one PCIe switch first, then on one NUMA node (socket), then across sockets, and
CPU cores on the NUMA nodes of the chosen GPUs. ``FreePool`` is the scratch copy of free
resources a policy consumes while it places several jobs within one pass.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence

from masterd.core.cluster import ClusterSnapshot, NodeView
from shared.model import JobSpec, NodeAllocation, Placement


class FreePool:
    """Free resources per schedulable node, consumed as a pass places jobs."""

    def __init__(self, snapshot: ClusterSnapshot) -> None:
        self.views: dict[str, NodeView] = {
            name: view for name, view in snapshot.nodes.items() if view.schedulable
        }
        self.gpus: dict[str, set[int]] = {}
        self.cpus: dict[str, set[int]] = {}
        self.memory: dict[str, int] = {}
        for name, view in self.views.items():
            self.gpus[name] = set(view.free_gpus)
            self.cpus[name] = set(view.free_cpus)
            self.memory[name] = view.free_memory_mib

    def take(self, placement: Placement) -> None:
        for alloc in placement.allocations:
            self.gpus[alloc.node].difference_update(alloc.gpus)
            self.cpus[alloc.node].difference_update(alloc.cpus)
            self.memory[alloc.node] -= alloc.memory_mib

    def free_gpu_count(self, node: str) -> int:
        return len(self.gpus[node])

    def nodes_for(self, spec: JobSpec) -> list[str]:
        """Nodes whose GPU model matches the job (any node for CPU-only jobs)."""
        if spec.gpus == 0 or spec.gpu_model is None:
            return list(self.views)
        return [n for n, v in self.views.items() if v.gpu_model == spec.gpu_model]


def per_node_share(total: int, d_node: int) -> int:
    return math.ceil(total / d_node) if total else 0


def choose_gpus(view: NodeView, free: set[int], count: int) -> tuple[int, ...] | None:
    """Pick ``count`` free GPUs with the tightest locality, or None if too few are free."""
    if count == 0:
        return ()
    if len(free) < count:
        return None
    by_gpu = {g.index: g for g in view.inventory.gpus}
    # Candidate groups from tightest to loosest; inside a group, lowest indices first so
    # choices are deterministic.
    for key in (lambda g: ("switch", g.pcie_switch), lambda g: ("numa", g.numa_node)):
        groups: dict[object, list[int]] = defaultdict(list)
        for index in sorted(free):
            groups[key(by_gpu[index])].append(index)
        fitting = [members for members in groups.values() if len(members) >= count]
        if fitting:
            # Best fit: the group with the fewest free GPUs that still fits, so a large
            # group stays whole for a later large job.
            best = min(fitting, key=lambda members: (len(members), members[0]))
            return tuple(best[:count])
    # Across sockets: fill NUMA nodes with the most free GPUs first to touch as few as we can.
    groups = defaultdict(list)
    for index in sorted(free):
        groups[by_gpu[index].numa_node].append(index)
    chosen: list[int] = []
    for members in sorted(groups.values(), key=lambda m: (-len(m), m[0])):
        chosen.extend(members[: count - len(chosen)])
        if len(chosen) == count:
            break
    return tuple(sorted(chosen))


def choose_cpus(
    view: NodeView, free: set[int], count: int, numa_nodes: Iterable[int] = ()
) -> tuple[int, ...] | None:
    """Pick ``count`` free cores, preferring the given NUMA nodes and whole physical cores."""
    if count == 0:
        return ()
    if len(free) < count:
        return None
    preferred = set(numa_nodes)
    cores = {c.id: c for c in view.inventory.cpus}

    def rank(core_id: int) -> tuple[int, int, int]:
        core = cores.get(core_id)
        if core is None:
            return (1, 0, core_id)
        return (0 if core.numa_node in preferred or not preferred else 1, core.socket, core_id)

    return tuple(sorted(sorted(free, key=rank)[:count]))


def realise(
    spec: JobSpec,
    pool: FreePool,
    d_node: int,
    d_gpn: int,
    candidates: Sequence[str] | None = None,
) -> Placement | None:
    """Place ``spec`` as ``d_node`` nodes × ``d_gpn`` GPUs, best-fit by free GPUs per node.

    CPU cores and memory are split evenly across the nodes (rounded up). Returns None when the
    shape does not fit the pool.
    """
    cpus_per_node = per_node_share(spec.cpus, d_node)
    mem_per_node = per_node_share(spec.memory_mib, d_node)
    names = candidates if candidates is not None else pool.nodes_for(spec)
    fitting = [
        n
        for n in names
        if len(pool.gpus[n]) >= d_gpn
        and len(pool.cpus[n]) >= cpus_per_node
        and pool.memory[n] >= mem_per_node
    ]
    if len(fitting) < d_node:
        return None
    # Fewest free GPUs first (best fit keeps whole nodes free for large jobs); name breaks ties.
    fitting.sort(key=lambda n: (len(pool.gpus[n]), len(pool.cpus[n]), n))
    allocations: list[NodeAllocation] = []
    for name in fitting:
        view = pool.views[name]
        gpus = choose_gpus(view, pool.gpus[name], d_gpn)
        if gpus is None:
            continue
        numa = {view.inventory.numa_of_gpu(g) for g in gpus} - {-1}
        cpus = choose_cpus(view, pool.cpus[name], cpus_per_node, numa)
        if cpus is None:
            continue
        allocations.append(NodeAllocation(name, gpus, cpus, mem_per_node))
        if len(allocations) == d_node:
            return Placement(tuple(allocations))
    return None


def shapes(gpus: int, max_gpn: int, max_nodes: int) -> list[tuple[int, int]]:
    """All ``(d_node, d_gpn)`` with ``d_node·d_gpn == gpus`` that a cluster could host."""
    return [
        (d_node, gpus // d_node)
        for d_node in range(1, min(gpus, max_nodes) + 1)
        if gpus % d_node == 0 and gpus // d_node <= max_gpn
    ]


def pack(spec: JobSpec, pool: FreePool) -> Placement | None:
    """Packing placement: the fewest nodes that fit, best-fit node choice inside a shape."""
    if spec.gpus == 0:
        return realise(spec, pool, 1, 0)
    names = pool.nodes_for(spec)
    max_gpn = max((pool.views[n].total_gpus for n in names), default=0)
    limit = spec.max_nodes or len(names)
    for d_node, d_gpn in shapes(spec.gpus, max_gpn, limit):
        placement = realise(spec, pool, d_node, d_gpn, names)
        if placement is not None:
            return placement
    return None


def fits_cluster(spec: JobSpec, snapshot: ClusterSnapshot) -> str | None:
    """Why a job can never run on this cluster as it is, or None if an empty cluster fits it."""
    nodes = [
        v for v in snapshot.nodes.values()
        if spec.gpus == 0 or spec.gpu_model is None or v.gpu_model == spec.gpu_model
    ]
    if not nodes:
        model = f" of model {spec.gpu_model}" if spec.gpu_model else ""
        return f"no node{model} is registered"
    if spec.gpus:
        total = sum(v.total_gpus for v in nodes)
        if spec.gpus > total:
            return f"asks for {spec.gpus} GPUs but the cluster has {total}"
        max_gpn = max(v.total_gpus for v in nodes)
        if not shapes(spec.gpus, max_gpn, spec.max_nodes or len(nodes)):
            return (
                f"{spec.gpus} GPUs cannot be split evenly over nodes of at most "
                f"{max_gpn} GPUs"
            )
    max_cpus = max(len(v.inventory.cpus) for v in nodes)
    if spec.gpus == 0 and spec.cpus > max_cpus:
        return f"asks for {spec.cpus} cores but the largest node has {max_cpus}"
    return None
