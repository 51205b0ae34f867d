"""Restricted snapshots: the cluster as one array (or a set of arrays) sees it.

Inner policies know nothing about arrays: they get an ordinary ``ClusterSnapshot`` whose node
views hold only the arrays' units. GPU views keep every GPU of the node (GPU arrays take whole
nodes) and drop the cores of other arrays; CPU views drop the GPUs. The inventory is narrowed
the same way, so capacity-based policies (DRF shares, GENIE's cost) see the array's size.
Memory is not partitioned: every view shows the node's free memory.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

from masterd.core.arrays.layout import CPU_ARRAY, ArrayId, ArrayMap, NodeArrays
from masterd.core.cluster import ClusterSnapshot, NodeView
from shared.model import Job, NodeAllocation, NodeInventory, Placement


class Scratch:
    """Free units per schedulable node, consumed across every array of one pass."""

    def __init__(self, snapshot: ClusterSnapshot) -> None:
        self.gpus: dict[str, set[int]] = {}
        self.cpus: dict[str, set[int]] = {}
        self.memory: dict[str, int] = {}
        for name, view in snapshot.nodes.items():
            if view.schedulable:
                self.gpus[name] = set(view.free_gpus)
                self.cpus[name] = set(view.free_cpus)
                self.memory[name] = view.free_memory_mib
        self.version = 0  # bumped on every change so cached pools know they are stale

    @classmethod
    def empty(cls, snapshot: ClusterSnapshot) -> Scratch:
        """Every unit of every schedulable node free, as if nothing ran."""
        scratch = cls.__new__(cls)
        scratch.gpus, scratch.cpus, scratch.memory = {}, {}, {}
        for name, view in snapshot.nodes.items():
            if view.schedulable:
                inv = view.inventory
                scratch.gpus[name] = {g.index for g in inv.gpus if g.healthy}
                scratch.cpus[name] = {c.id for c in inv.cpus}
                scratch.memory[name] = inv.memory_mib
        scratch.version = 0
        return scratch

    def copy(self) -> Scratch:
        other = Scratch.__new__(Scratch)
        other.gpus = {n: set(s) for n, s in self.gpus.items()}
        other.cpus = {n: set(s) for n, s in self.cpus.items()}
        other.memory = dict(self.memory)
        other.version = self.version
        return other

    def covers(self, placement: Placement) -> str | None:
        """Why ``placement`` cannot be taken from what is free, or None if it can."""
        seen: set[tuple[str, str, int]] = set()
        memory: dict[str, int] = {}
        for alloc in placement.allocations:
            if alloc.node not in self.gpus:
                return f"node {alloc.node} is not schedulable"
            for kind, units, free in (
                ("GPU", alloc.gpus, self.gpus[alloc.node]),
                ("core", alloc.cpus, self.cpus[alloc.node]),
            ):
                for unit in units:
                    key = (alloc.node, kind, unit)
                    if key in seen or unit not in free:
                        return f"{kind} {unit} on {alloc.node} is not free"
                    seen.add(key)
            memory[alloc.node] = memory.get(alloc.node, 0) + alloc.memory_mib
        for node, mib in memory.items():
            if mib > self.memory[node]:
                return f"{mib} MiB on {node} exceeds the {self.memory[node]} MiB free"
        return None

    def take(self, placement: Placement) -> None:
        for alloc in placement.allocations:
            self.gpus[alloc.node].difference_update(alloc.gpus)
            self.cpus[alloc.node].difference_update(alloc.cpus)
            self.memory[alloc.node] -= alloc.memory_mib
        self.version += 1


@dataclass(frozen=True)
class _Cut:
    """Which unit groups of a node a view includes."""

    gpus: bool
    gpu_job_cpus: bool
    cpu_job_cpus: bool


class ViewBuilder:
    """Builds restricted node views, caching narrowed inventories across passes."""

    def __init__(self) -> None:
        # (node, cut) -> (source inventory, narrowed inventory); the source is compared by
        # identity, so a re-registered node gets a fresh narrowed copy.
        self._inventories: dict[tuple[str, _Cut], tuple[NodeInventory, NodeInventory]] = {}

    def _narrow(
        self, inv: NodeInventory, na: NodeArrays, cut: _Cut, cpus: frozenset[int]
    ) -> NodeInventory:
        key = (na.node, cut)
        cached = self._inventories.get(key)
        if cached is not None and cached[0] is inv:
            return cached[1]
        narrowed = replace(
            inv,
            gpus=inv.gpus if cut.gpus else (),
            cpus=tuple(c for c in inv.cpus if c.id in cpus),
            gpu_links=inv.gpu_links if cut.gpus else (),
        )
        self._inventories[key] = (inv, narrowed)
        return narrowed

    def view(
        self,
        snapshot: ClusterSnapshot,
        amap: ArrayMap,
        allowed: Iterable[ArrayId],
        scratch: Scratch,
        running: Mapping[str, Job],
        gpu_view: bool,
    ) -> ClusterSnapshot:
        """The cluster restricted to ``allowed`` arrays, with the pass's current free units.

        ``gpu_view`` builds a view for GPU jobs (nodes whose GPU array is allowed); otherwise
        a view for CPU jobs (nodes with allowed cores, no GPUs).
        """
        allowed = frozenset(allowed)
        nodes: dict[str, NodeView] = {}
        for name, na in amap.nodes.items():
            view = snapshot.nodes.get(name)
            if view is None:
                continue
            if gpu_view:
                if na.gpu_array not in allowed:
                    continue
                cut = _Cut(True, na.gpu_cpu_array in allowed, CPU_ARRAY in allowed)
            else:
                cut = _Cut(False, na.gpu_cpu_array in allowed, CPU_ARRAY in allowed)
            cpus = (na.gpu_job_cpus if cut.gpu_job_cpus else frozenset()) | (
                na.cpu_job_cpus if cut.cpu_job_cpus else frozenset()
            )
            if not gpu_view and not cpus:
                continue
            if name in scratch.gpus:
                free_gpus = scratch.gpus[name] if cut.gpus else set()
                free_cpus = scratch.cpus[name]
                free_mem = scratch.memory[name]
            else:
                free_gpus = set(view.free_gpus) if cut.gpus else set()
                free_cpus = set(view.free_cpus)
                free_mem = view.free_memory_mib
            nodes[name] = NodeView(
                inventory=self._narrow(view.inventory, na, cut, cpus),
                free_gpus=frozenset(free_gpus),
                free_cpus=frozenset(free_cpus & cpus),
                free_memory_mib=free_mem,
                schedulable=view.schedulable,
            )
        return ClusterSnapshot(
            nodes=MappingProxyType(nodes), running=trim_running(nodes, running)
        )


def trim_running(nodes: Mapping[str, NodeView], running: Mapping[str, Job]) -> Mapping[str, Job]:
    """Running jobs cut down to what they hold inside the view.

    A view's policy then never meets a node or unit it cannot look up, and capacity-based
    policies count only what occupies the array. Jobs holding nothing in the view are left out.
    The copies are the policy's to read; the core's records are untouched.
    """
    out: dict[str, Job] = {}
    for job_id, job in running.items():
        if job.placement is None:
            continue
        kept: list[NodeAllocation] = []
        for alloc in job.placement.allocations:
            view = nodes.get(alloc.node)
            if view is None:
                continue
            gpus = {g.index for g in view.inventory.gpus}
            cpus = {c.id for c in view.inventory.cpus}
            cut = NodeAllocation(
                alloc.node,
                tuple(g for g in alloc.gpus if g in gpus),
                tuple(c for c in alloc.cpus if c in cpus),
                alloc.memory_mib,
            )
            if cut.gpus or cut.cpus:
                kept.append(cut)
        if not kept:
            continue
        if len(kept) == len(job.placement.allocations) and all(
            a == b for a, b in zip(kept, job.placement.allocations, strict=True)
        ):
            out[job_id] = job
        else:
            out[job_id] = replace(job, placement=Placement(tuple(kept)))
    return MappingProxyType(out)


def within(view: ClusterSnapshot, placement: Placement) -> str | None:
    """Why ``placement`` uses units outside the restricted ``view``, or None if it does not."""
    for alloc in placement.allocations:
        node = view.nodes.get(alloc.node)
        if node is None:
            return f"node {alloc.node} is outside the array"
        if not node.schedulable:
            return f"node {alloc.node} is not schedulable"
        outside_gpus = set(alloc.gpus) - node.free_gpus
        if outside_gpus:
            return f"GPUs {sorted(outside_gpus)} on {alloc.node} are not free in the array"
        outside_cpus = set(alloc.cpus) - node.free_cpus
        if outside_cpus:
            return f"cores {sorted(outside_cpus)} on {alloc.node} are not free in the array"
    return None
