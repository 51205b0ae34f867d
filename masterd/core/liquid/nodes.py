"""The nodes one pass may place on, as counts the algorithms change cheaply.

Best fit and the genetic algorithm try thousands of task-to-node moves; they count free GPUs,
cores and memory per node and never touch concrete GPU or core ids. Only the plan they settle
on is realised (``masterd.core.liquid.realise``), with the same locality rules as every other
policy (``masterd.core.placement.choose_gpus``/``choose_cpus``).

A node's GPUs for a job are its free whole GPUs plus, for jobs that may be pre-scheduled, the
GPUs lent by jobs saving their model (see :mod:`.sharing`).
"""

from __future__ import annotations

from dataclasses import dataclass

from masterd.core.liquid.demand import Task
from shared.model import NodeInventory


@dataclass
class NodeCap:
    """What one node has left in this pass."""

    name: str
    inventory: NodeInventory
    total_gpus: int
    free_gpus: int  # whole GPUs nobody holds
    lent_gpus: int  # GPUs held by a job saving its model, usable by a pre-scheduled job
    free_cpus: int
    free_memory_mib: int
    ps_tasks: int = 0  # parameter servers of running jobs on this node

    @property
    def used_gpus(self) -> int:
        return self.total_gpus - self.free_gpus

    def fits(self, task: Task, count: int = 1, lent: bool = False) -> bool:
        gpus = self.free_gpus + (self.lent_gpus if lent else 0)
        return (gpus >= task.gpus * count and self.free_cpus >= task.cpus * count
                and self.free_memory_mib >= task.memory_mib * count)

    def key(self) -> tuple[object, ...]:
        """Nodes with equal keys score alike for a job that uses neither yet (the score reads
        a node's GPU counts, its parameter servers and where it sits in the network)."""
        inv = self.inventory
        return (self.total_gpus, self.free_gpus, self.ps_tasks, inv.rack, inv.domain)

    def __post_init__(self) -> None:
        # Read once per candidate per task by best fit: computed once per pass.
        self.similar = self.key()
        self.where = (self.inventory.rack, self.inventory.domain)


class Load:
    """Tasks put on nodes by a plan under construction: the counts a fit check needs."""

    __slots__ = ("cpus", "gpus", "memory")

    def __init__(self) -> None:
        self.gpus: dict[str, int] = {}
        self.cpus: dict[str, int] = {}
        self.memory: dict[str, int] = {}

    def copy(self) -> Load:
        other = Load()
        other.gpus = dict(self.gpus)
        other.cpus = dict(self.cpus)
        other.memory = dict(self.memory)
        return other

    def add(self, node: str, task: Task, sign: int = 1) -> None:
        for counts, amount in ((self.gpus, task.gpus), (self.cpus, task.cpus),
                               (self.memory, task.memory_mib)):
            if amount:
                value = counts.get(node, 0) + sign * amount
                if value:
                    counts[node] = value
                else:  # back to what the pass started with: the node is untouched again
                    del counts[node]

    def touched(self) -> set[str]:
        return {*self.gpus, *self.cpus, *self.memory}

    def fits(self, cap: NodeCap, task: Task, lent: bool = False) -> bool:
        name = cap.name
        gpus = cap.free_gpus + (cap.lent_gpus if lent else 0)
        return (self.gpus.get(name, 0) + task.gpus <= gpus
                and self.cpus.get(name, 0) + task.cpus <= cap.free_cpus
                and self.memory.get(name, 0) + task.memory_mib <= cap.free_memory_mib)
