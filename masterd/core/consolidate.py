"""Helios' consolidated placement (ConsolidateAllocate, Helios §4.2.2): as few nodes as possible.

A job that fits one node goes on the fullest node that still fits it (fewest free GPUs, the
free index's best fit). A larger job needs ``gpus // G`` nodes that are entirely free plus, for
the remainder ``gpus % G``, the fullest node that fits it (``G``: GPUs per node); anything
else "violates the consolidation principle" (a 16-GPU job waits for two idle 8-GPU nodes
rather than starting as 4 × 4). So a job waits where :func:`masterd.core.placement.pack` would
split it over several partly used nodes.

One difference from the Helios artifact's placer, on purpose: for the remainder of a multi-node
job the artifact takes the next node in most-free-first order, we take the fullest that fits
(the same best fit as single-node jobs), which keeps whole nodes free for later large jobs.

CPU cores and memory go to each node in proportion to its share of the job's GPUs (rounded
up); CPU-only jobs go on one node.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from itertools import islice

from masterd.core.cluster import ClusterSnapshot
from masterd.core.eligibility import placement_key
from masterd.core.placement import (
    FreePool,
    choose_cpus,
    choose_gpus,
    model_scope,
    pack,
    realise,
)
from masterd.core.policy import Decision, Start
from shared.model import Job, JobSpec, NodeAllocation, Placement

PLACEMENTS = ("pack", "consolidate")


def check_placement(name: str) -> str:
    """``name`` if it is a known placement option, else a ValueError naming the choices."""
    if name not in PLACEMENTS:
        raise ValueError(f"placement must be one of {', '.join(PLACEMENTS)}, got {name!r}")
    return name


def _share(total: int, part: int, whole: int) -> int:
    return math.ceil(total * part / whole) if total else 0


def consolidate(spec: JobSpec, pool: FreePool) -> Placement | None:
    """Place ``spec`` consolidated, or None if it must wait."""
    if spec.gpus == 0:
        return realise(spec, pool, 1, 0)
    scope = model_scope(spec)
    per_node = pool.index.max_gpus_per_node(scope)
    if per_node == 0:
        return None
    if spec.gpus <= per_node:
        return _on_nodes(spec, pool, [(_fullest(spec, pool, spec.gpus, ()), spec.gpus)])
    whole, rest = divmod(spec.gpus, per_node)
    if spec.max_nodes is not None and whole + (rest > 0) > spec.max_nodes:
        return None
    cpus = _share(spec.cpus, per_node, spec.gpus)
    memory = _share(spec.memory_mib, per_node, spec.gpus)
    # Nodes with a whole node's GPUs free: the index yields only those with >= per_node free.
    free_nodes = [n for n in pool.ranked(scope, per_node, cpus, memory, spec)
                  if len(pool.gpus[n]) == pool.views[n].total_gpus]
    chosen = list(islice(free_nodes, whole))
    if len(chosen) < whole:
        return None
    parts: list[tuple[str | None, int]] = [(n, per_node) for n in chosen]
    if rest:
        parts.append((_fullest(spec, pool, rest, chosen), rest))
    return _on_nodes(spec, pool, parts)


def _fullest(spec: JobSpec, pool: FreePool, gpus: int, taken: list[str] | tuple[()]
             ) -> str | None:
    """The node with the fewest free GPUs that holds ``gpus`` of the job (and its share of
    cores and memory), other than ``taken``."""
    cpus = _share(spec.cpus, gpus, spec.gpus)
    memory = _share(spec.memory_mib, gpus, spec.gpus)
    for name in pool.ranked(model_scope(spec), gpus, cpus, memory, spec):
        if name not in taken:
            return name
    return None


def _on_nodes(spec: JobSpec, pool: FreePool, parts: list[tuple[str | None, int]]
              ) -> Placement | None:
    allocations: list[NodeAllocation] = []
    for name, gpus in parts:
        if name is None:
            return None
        view = pool.views[name]
        chosen = choose_gpus(view, pool.gpus[name], gpus)
        if chosen is None:
            return None
        numa = {view.inventory.numa_of_gpu(g) for g in chosen} - {-1}
        cores = choose_cpus(view, pool.cpus[name], _share(spec.cpus, gpus, spec.gpus), numa)
        if cores is None:
            return None
        allocations.append(NodeAllocation(name, chosen, cores,
                                          _share(spec.memory_mib, gpus, spec.gpus)))
    return Placement(tuple(allocations))


def place(spec: JobSpec, pool: FreePool, placement: str) -> Placement | None:
    """``pack`` (the packing placement every policy uses) or ``consolidate``."""
    if placement == "consolidate":
        return consolidate(spec, pool)
    return pack(spec, pool)


class ShrinkingPlacer:
    """``place`` on a pool that only shrinks (jobs are taken from it, nothing is given back),
    remembering the shapes that did not fit: such a shape cannot fit later in the same pass,
    so a backfill scan over a queue of thousands costs one placement try per shape, not per
    job. The shape is every field placement reads."""

    def __init__(self, pool: FreePool, placement: str) -> None:
        self.pool = pool
        self.placement = placement
        self._misfits: set[tuple[object, ...]] = set()

    @staticmethod
    def shape(spec: JobSpec) -> tuple[object, ...]:
        return (*placement_key(spec), spec.gpu_milli)

    def __call__(self, spec: JobSpec) -> Placement | None:
        shape = self.shape(spec)
        if shape in self._misfits:
            return None
        chosen = place(spec, self.pool, self.placement)
        if chosen is None:
            self._misfits.add(shape)
        return chosen


def start_in_order(snapshot: ClusterSnapshot, ordered: Iterable[Job], placement: str,
                   backfill: bool) -> list[Decision]:
    """Start jobs in the given order, each placed by ``placement``; the first that does not
    fit stops the rest, unless ``backfill`` lets later ones use what it cannot (what FIFO,
    SJF and QSSF share once they have ordered their queue)."""
    pool = FreePool(snapshot)
    placer = ShrinkingPlacer(pool, placement)
    decisions: list[Decision] = []
    for job in ordered:
        chosen = placer(job.spec)
        if chosen is None:
            if backfill:
                continue
            break
        pool.take(chosen)
        decisions.append(Start(job.id, chosen))
    return decisions
