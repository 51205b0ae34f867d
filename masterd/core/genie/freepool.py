"""Fast free-resource views for a scheduling pass over a large cluster.

``LazyFreePool`` is the name SWAF knows :class:`~masterd.core.placement.FreePool` by: the core's
pool now copies a node's free sets only when the pass changes that node, which is what this
subclass used to add. ``FreeIndex`` buckets the schedulable nodes of one GPU model by free
GPUs, each bucket in the order ``realise`` ranks nodes (fewest free GPUs, then fewest free
cores, then name), so a pass can tell in O(G) whether any ``<d_node, d_gpn>`` can fit and hand
``realise`` just the nodes it would pick.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable

from masterd.core.placement import FreePool
from shared.model import Placement


class LazyFreePool(FreePool):
    """``FreePool(snapshot)``, which is copy-on-write itself now."""


class FreeIndex:
    """Schedulable nodes of one GPU model, bucketed by free GPU count."""

    def __init__(self, max_gpus: int) -> None:
        self.buckets: list[list[tuple[int, str]]] = [[] for _ in range(max_gpus + 1)]
        self._state: dict[str, tuple[int, int]] = {}  # node -> (free GPUs, free cores)

    @classmethod
    def build(cls, max_gpus: int, nodes: Iterable[tuple[str, int, int]]) -> FreeIndex:
        index = cls(max_gpus)
        for name, free_gpus, free_cpus in nodes:
            index.buckets[free_gpus].append((free_cpus, name))
            index._state[name] = (free_gpus, free_cpus)
        for bucket in index.buckets:
            bucket.sort()
        return index

    def at_least(self, gpus: int) -> int:
        """How many nodes have ``gpus`` or more free GPUs."""
        return sum(len(b) for b in self.buckets[gpus:])

    def pick(
        self, pool: FreePool, d_node: int, d_gpn: int, cpus_per_node: int, mem_per_node: int
    ) -> list[str] | None:
        """The ``d_node`` nodes ``realise`` would choose for this shape, or None if too few fit.

        ``realise`` keeps the nodes with enough GPUs, cores and memory and takes the first
        ``d_node`` by (free GPUs, free cores, name): the buckets are already in that order.
        """
        chosen: list[str] = []
        for bucket in self.buckets[d_gpn:]:
            start = bisect.bisect_left(bucket, (cpus_per_node, ""))
            for _, name in bucket[start:]:
                if pool.memory[name] >= mem_per_node:
                    chosen.append(name)
                    if len(chosen) == d_node:
                        return chosen
        return None

    def taken(self, pool: FreePool, placement: Placement) -> None:
        """Re-bucket the nodes a placement just consumed resources on."""
        for alloc in placement.allocations:
            name = alloc.node
            old = self._state.get(name)
            if old is None:
                continue
            bucket = self.buckets[old[0]]
            i = bisect.bisect_left(bucket, (old[1], name))
            del bucket[i]
            new = (len(pool.gpus[name]), len(pool.cpus[name]))
            bisect.insort(self.buckets[new[0]], (new[1], name))
            self._state[name] = new
