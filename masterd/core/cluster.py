"""What the cluster has and what is given away: the single owner of resource accounting."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

from shared.model import Job, NodeInventory, Placement


class AllocationError(RuntimeError):
    """A decision asked for a resource that is not free (a policy bug or a stale decision)."""


@dataclass(frozen=True)
class NodeView:
    """One node as a policy sees it: immutable, so a snapshot can be shared without copying."""

    inventory: NodeInventory
    free_gpus: frozenset[int]
    free_cpus: frozenset[int]
    free_memory_mib: int
    schedulable: bool = True

    @property
    def name(self) -> str:
        return self.inventory.name

    @property
    def gpu_model(self) -> str | None:
        return self.inventory.gpu_model

    @property
    def total_gpus(self) -> int:
        return len(self.inventory.gpus)


@dataclass(frozen=True)
class ClusterSnapshot:
    nodes: Mapping[str, NodeView]
    running: Mapping[str, Job]

    def schedulable_nodes(self) -> list[NodeView]:
        return [n for n in self.nodes.values() if n.schedulable]

    @property
    def total_gpus(self) -> int:
        return sum(n.total_gpus for n in self.nodes.values())

    def max_gpus_per_node(self, gpu_model: str | None = None) -> int:
        return max(
            (
                n.total_gpus
                for n in self.nodes.values()
                if gpu_model is None or n.gpu_model == gpu_model
            ),
            default=0,
        )


class ClusterState:
    """Node inventories plus the allocations of running jobs.

    Free sets are kept as frozensets replaced per node on every change, so taking a snapshot
    costs one dict copy whatever the cluster size.
    """

    def __init__(self) -> None:
        self._views: dict[str, NodeView] = {}
        self._allocations: dict[str, Placement] = {}

    # -- nodes ---------------------------------------------------------------------------
    def upsert_node(self, inventory: NodeInventory) -> None:
        """Add a node or replace its inventory, keeping what running jobs hold on it."""
        name = inventory.name
        held_gpus: set[int] = set()
        held_cpus: set[int] = set()
        held_mem = 0
        for placement in self._allocations.values():
            for alloc in placement.allocations:
                if alloc.node == name:
                    held_gpus.update(alloc.gpus)
                    held_cpus.update(alloc.cpus)
                    held_mem += alloc.memory_mib
        usable_gpus = {g.index for g in inventory.gpus if g.healthy}
        old = self._views.get(name)
        self._views[name] = NodeView(
            inventory=inventory,
            free_gpus=frozenset(usable_gpus - held_gpus),
            free_cpus=frozenset({c.id for c in inventory.cpus} - held_cpus),
            free_memory_mib=max(0, inventory.memory_mib - held_mem),
            schedulable=old.schedulable if old else True,
        )

    def remove_node(self, name: str) -> None:
        self._views.pop(name, None)

    def set_schedulable(self, name: str, schedulable: bool) -> None:
        view = self._views[name]
        if view.schedulable != schedulable:
            self._views[name] = replace(view, schedulable=schedulable)

    def node(self, name: str) -> NodeView | None:
        return self._views.get(name)

    @property
    def node_names(self) -> list[str]:
        return list(self._views)

    # -- allocations ---------------------------------------------------------------------
    def allocate(self, job_id: str, placement: Placement) -> None:
        if job_id in self._allocations:
            raise AllocationError(f"job {job_id} already holds resources")
        updated: dict[str, NodeView] = {}
        for alloc in placement.allocations:
            view = updated.get(alloc.node) or self._views.get(alloc.node)
            if view is None:
                raise AllocationError(f"job {job_id}: node {alloc.node} is not in the cluster")
            gpus, cpus = set(alloc.gpus), set(alloc.cpus)
            if len(gpus) != len(alloc.gpus) or len(cpus) != len(alloc.cpus):
                raise AllocationError(f"job {job_id}: duplicate GPU or core on {alloc.node}")
            if not gpus <= view.free_gpus:
                busy = sorted(gpus - view.free_gpus)
                raise AllocationError(f"job {job_id}: GPUs {busy} on {alloc.node} are not free")
            if not cpus <= view.free_cpus:
                busy = sorted(cpus - view.free_cpus)
                raise AllocationError(f"job {job_id}: cores {busy} on {alloc.node} are not free")
            if alloc.memory_mib > view.free_memory_mib:
                raise AllocationError(
                    f"job {job_id}: {alloc.memory_mib} MiB on {alloc.node} exceeds the "
                    f"{view.free_memory_mib} MiB free"
                )
            updated[alloc.node] = replace(
                view,
                free_gpus=view.free_gpus - gpus,
                free_cpus=view.free_cpus - cpus,
                free_memory_mib=view.free_memory_mib - alloc.memory_mib,
            )
        self._views.update(updated)
        self._allocations[job_id] = placement

    def adopt(self, job_id: str, placement: Placement) -> None:
        """Record resources a running job is known to hold, trusting the node's word.

        Used when a node reports a job the master had not placed on those exact resources
        (after a restart): the report wins, and anything it overlaps is a conflict to log.
        """
        if self._allocations.get(job_id) == placement:
            return
        self.release(job_id)
        self.allocate(job_id, placement)

    def release(self, job_id: str) -> Placement | None:
        placement = self._allocations.pop(job_id, None)
        if placement is None:
            return None
        for alloc in placement.allocations:
            view = self._views.get(alloc.node)
            if view is None:
                continue
            healthy = {g.index for g in view.inventory.gpus if g.healthy}
            self._views[alloc.node] = replace(
                view,
                free_gpus=view.free_gpus | (set(alloc.gpus) & healthy),
                free_cpus=view.free_cpus | set(alloc.cpus),
                free_memory_mib=min(
                    view.inventory.memory_mib, view.free_memory_mib + alloc.memory_mib
                ),
            )
        return placement

    def resize_cpus(self, job_id: str, node: str, cpus: tuple[int, ...]) -> None:
        """A running job's cores on one node changed (SODA's tuner re-pinned it): cores it
        gave back are free at once; cores it took must have been free."""
        placement = self._allocations.get(job_id)
        if placement is None:
            raise AllocationError(f"job {job_id} holds no resources")
        view = self._views.get(node)
        if view is None:
            raise AllocationError(f"job {job_id}: node {node} is not in the cluster")
        allocations = list(placement.allocations)
        i = next((k for k, a in enumerate(allocations) if a.node == node), None)
        if i is None:
            raise AllocationError(f"job {job_id} has nothing on node {node}")
        alloc = allocations[i]
        old, new = set(alloc.cpus), set(cpus)
        if len(new) != len(cpus) or not new:
            raise AllocationError(f"job {job_id}: core list {list(cpus)} is empty or repeats")
        taken = new - old
        if not taken <= view.free_cpus:
            raise AllocationError(
                f"job {job_id}: cores {sorted(taken - view.free_cpus)} on {node} are not free")
        allocations[i] = replace(alloc, cpus=tuple(sorted(new)))
        self._allocations[job_id] = Placement(tuple(allocations))
        self._views[node] = replace(view, free_cpus=(view.free_cpus - taken) | (old - new))

    def allocation(self, job_id: str) -> Placement | None:
        return self._allocations.get(job_id)

    @property
    def allocations(self) -> Mapping[str, Placement]:
        return MappingProxyType(self._allocations)

    def jobs_on(self, node: str) -> list[str]:
        return [
            job_id
            for job_id, placement in self._allocations.items()
            if node in placement.nodes
        ]

    def snapshot(self, running: Mapping[str, Job]) -> ClusterSnapshot:
        return ClusterSnapshot(nodes=MappingProxyType(dict(self._views)), running=running)

    def views(self) -> Iterable[NodeView]:
        return self._views.values()
