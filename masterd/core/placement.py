"""Turning "how many GPUs on how many nodes" into concrete GPUs and cores.

Policies decide shapes; this module realises them with the best locality a node offers:
GPUs behind one PCIe switch first, then on one NUMA node (socket), then across sockets, and
CPU cores on the NUMA nodes of the chosen GPUs. ``FreePool`` is the copy-on-write view of free
resources a policy consumes while it places several jobs within one pass; its ``FreeIndex``
lets a search look at the best-fitting nodes only, not at every node of the cluster.
"""

from __future__ import annotations

import math
import weakref
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, MutableMapping, Sequence
from collections.abc import Set as AbstractSet
from itertools import chain, islice
from typing import Any, TypeVar

from masterd.core.cluster import (
    ANY_MODEL,
    ClusterSnapshot,
    FreeIndex,
    ModelScope,
    NodeView,
    idle_node,
)
from masterd.core.eligibility import eligible, missing_features, selects
from shared.model import JobSpec, NodeAllocation, Placement

V = TypeVar("V")


class _NodeValues(MutableMapping[str, V]):
    """One kind of free resource of every node of a pool, copied on write.

    Reads fall through to the snapshot's view until the pass changes the node, so creating a
    pool copies nothing. Values are immutable (frozensets, ints): change a node by assigning
    (``pool.gpus[n] -= taken`` works), which lets the pool keep its index in step.
    """

    def __init__(self, views: Mapping[str, NodeView], attr: str,
                 owner: weakref.ref[FreePool]) -> None:
        self._views = views
        self._attr = attr  # the NodeView field read for nodes the pass has not changed
        # A weak reference: a strong one made every pass's pool a reference cycle, and the
        # cyclic collector then spent tens of milliseconds at a time freeing old pools.
        self._owner = owner
        self._changed: dict[str, V] = {}

    def __getitem__(self, node: str) -> V:
        changed = self._changed
        if node in changed:  # cheaper than catching KeyError for the many unchanged nodes
            return changed[node]
        value: V = getattr(self._views[node], self._attr)
        return value

    def __setitem__(self, node: str, value: V) -> None:
        if node not in self._views:
            raise KeyError(node)  # a pool holds the schedulable nodes, no others
        pool = self._owner()
        if pool is None:
            raise RuntimeError("the FreePool of these values is gone")
        pool.set_free(self._attr, node, value)

    def store(self, node: str, value: V) -> None:
        """Record a node's new value (for the pool, which keeps the index itself)."""
        self._changed[node] = value

    def __delitem__(self, node: str) -> None:
        raise TypeError("nodes cannot be removed from a FreePool")

    def __iter__(self) -> Iterator[str]:
        return iter(self._views)

    def __len__(self) -> int:
        return len(self._views)

    def __contains__(self, node: object) -> bool:
        return node in self._views


class FreePool:
    """Free resources per schedulable node, consumed as a pass places jobs.

    ``gpus``, ``cpus`` and ``memory`` map every schedulable node to what is free on it;
    nothing is copied until the pass changes a node. The pool keeps the snapshot's
    ``FreeIndex`` (its own copy once it changes a node) in step, so ``realise`` and ``pack``
    search only the nodes they may pick.
    """

    def __init__(self, snapshot: ClusterSnapshot) -> None:
        self.views: Mapping[str, NodeView] = snapshot.schedulable
        self._snapshot = snapshot
        # The snapshot's index, fetched on the first search (a pass that never searches it
        # leaves the state free to change its own without a copy); the pool's own copy once
        # the pass changes a node.
        self._index: FreeIndex | None = None
        self._own_index = False
        # Nodes changed since the index was last brought up to date, with their free
        # (GPUs, cores) then. Re-filing waits for the next search, so a pass that places jobs
        # through its own index (SWAF) does not pay for keeping this one current.
        self._stale: dict[str, tuple[int, int]] = {}
        owner = weakref.ref(self)
        self.gpus: _NodeValues[frozenset[int]] = _NodeValues(self.views, "free_gpus", owner)
        self.cpus: _NodeValues[frozenset[int]] = _NodeValues(self.views, "free_cpus", owner)
        self.memory: _NodeValues[int] = _NodeValues(self.views, "free_memory_mib", owner)
        # Some node's eligibility depends on a job's time limit (a maintenance window
        # ahead): every search asks ``eligible``, not only for jobs that select nodes.
        self.timed = snapshot.timed
        # Seconds from now this pool stands for (EASY backfill's shadow time): with blocks
        # ahead on nodes, a job may use only the nodes it may use then.
        self.after = 0.0

    @property
    def index(self) -> FreeIndex:
        """The pool's nodes by free GPUs, as of now (read-only)."""
        if self._index is None:
            self._index = self._snapshot.free_index
        if self._stale:
            self._refile(self._index)
        return self._index

    def _refile(self, index: FreeIndex) -> None:
        if not self._own_index:
            index = self._index = index.copy()
            self._own_index = True
        for node, before in self._stale.items():
            index.move(node, self.views[node].gpu_model, before, self.counts(node))
        self._stale.clear()

    def counts(self, node: str) -> tuple[int, int]:
        """Free (GPUs, cores) of a node: its key in the index."""
        return len(self.gpus[node]), len(self.cpus[node])

    def assign(
        self, node: str, gpus: AbstractSet[int] | None = None, cpus: AbstractSet[int] | None = None
    ) -> None:
        """Set a node's free GPUs and/or cores (the index re-files it before its next use)."""
        if node not in self._stale:
            self._stale[node] = self.counts(node)  # also rejects a node the pool does not hold
        # Frozen, so no one can change a value in place behind the index's back.
        if gpus is not None:
            self.gpus.store(node, frozenset(gpus))
        if cpus is not None:
            self.cpus.store(node, frozenset(cpus))

    def set_free(self, attr: str, node: str, value: Any) -> None:
        """``pool.gpus[node] = ...`` and the like end here."""
        if attr == "free_gpus":
            self.assign(node, gpus=value)
        elif attr == "free_cpus":
            self.assign(node, cpus=value)
        else:
            self.memory.store(node, value)  # memory is not indexed: realise checks it per node

    def take(self, placement: Placement) -> None:
        # assign() spelled out: this runs for every job a pass starts.
        for alloc in placement.allocations:
            node = alloc.node
            gpus, cpus = self.gpus[node], self.cpus[node]
            if node not in self._stale:
                self._stale[node] = (len(gpus), len(cpus))
            self.gpus.store(node, gpus.difference(alloc.gpus))
            self.cpus.store(node, cpus.difference(alloc.cpus))
            self.memory.store(node, self.memory[node] - alloc.memory_mib)

    def free_gpu_count(self, node: str) -> int:
        return len(self.gpus[node])

    def nodes_for(self, spec: JobSpec) -> list[str]:
        """Nodes the job may use (masterd.core.eligibility)."""
        if not selects(spec) and not self.timed and (spec.gpus == 0 or spec.gpu_model is None):
            return list(self.views)
        allowed = self._snapshot.eligible_names(spec)
        return [n for n in self.views if n in allowed]

    def ranked(
        self, scope: ModelScope, min_gpus: int, min_cpus: int, min_memory: int,
        spec: JobSpec | None = None,
    ) -> Iterator[str]:
        """Nodes of ``scope`` with enough free GPUs, cores and memory, best fit first (fewest
        free GPUs, then fewest free cores, then name); only those ``spec`` may use where it
        selects nodes beyond their model (the index is by model alone)."""
        if spec is not None and spec.selector.exclusive:
            found = self._ranked(scope, min_gpus, min_cpus, min_memory, spec)
            yield from (name for name in found if self.idle(name))
            return
        yield from self._ranked(scope, min_gpus, min_cpus, min_memory, spec)

    def idle(self, node: str) -> bool:
        """Nothing is allocated on the node now: an exclusive job may take it whole."""
        return idle_node(self.views[node], self.gpus[node], self.cpus[node],
                         self.memory[node])

    def _ranked(
        self, scope: ModelScope, min_gpus: int, min_cpus: int, min_memory: int,
        spec: JobSpec | None,
    ) -> Iterator[str]:
        memory = self.memory
        allowed = (self._snapshot.eligible_names(spec)
                   if spec is not None and (self.timed or selects(spec)) else None)
        if allowed is not None and self.after > 0 and self.timed:
            assert spec is not None
            views = self.views
            allowed = frozenset(n for n in allowed if n in views and eligible(
                spec, views[n].inventory, after=self.after))
        if allowed is None:
            for name in self.index.ranked(scope, min_gpus, min_cpus):
                if memory[name] >= min_memory:
                    yield name
            return
        if len(allowed) * 4 < len(self.views):
            # A few nodes (a partition, a reservation): rank them rather than walk the
            # index past every other node (the same order: _rank is the index's).
            views = self.views
            yield from _rank(self, [n for n in allowed if n in views], min_gpus, min_cpus,
                             min_memory)
            return
        for name in self.index.ranked(scope, min_gpus, min_cpus):
            if name in allowed and memory[name] >= min_memory:
                yield name


def model_scope(spec: JobSpec) -> ModelScope:
    """The nodes a job may use: its GPU model's, or all for CPU-only and any-model jobs."""
    if spec.gpus == 0 or spec.gpu_model is None:
        return ANY_MODEL
    return spec.gpu_model


def per_node_share(total: int, d_node: int) -> int:
    return math.ceil(total / d_node) if total else 0


def choose_gpus(view: NodeView, free: AbstractSet[int], count: int) -> tuple[int, ...] | None:
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
    view: NodeView, free: AbstractSet[int], count: int, numa_nodes: Iterable[int] = ()
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
    shape does not fit the pool. Without ``candidates`` the job's nodes are searched through
    the pool's index; with them, only those nodes are considered.
    """
    cpus_per_node = per_node_share(spec.cpus, d_node)
    mem_per_node = per_node_share(spec.memory_mib, d_node)
    if candidates is None:
        ranked = pool.ranked(model_scope(spec), d_gpn, cpus_per_node, mem_per_node, spec)
    else:
        if pool.timed or selects(spec):  # a caller's list is of the model's nodes
            candidates = [n for n in candidates
                          if eligible(spec, pool.views[n].inventory, after=pool.after)
                          and (not spec.selector.exclusive or pool.idle(n))]
        ranked = _rank(pool, candidates, d_gpn, cpus_per_node, mem_per_node)
    # Know that enough nodes fit before choosing GPUs and cores on any of them.
    first = list(islice(ranked, d_node))
    if len(first) < d_node:
        return None
    allocations: list[NodeAllocation] = []
    # choose_gpus/choose_cpus cannot fail on a node that passed the filter, so the first
    # d_node nodes are the answer; the rest of ``ranked`` is there only so that the outcome
    # would stay that of a full best-fit scan if they ever could.
    for name in chain(first, ranked):
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


def _rank(
    pool: FreePool, names: Iterable[str], min_gpus: int, min_cpus: int, min_memory: int
) -> Iterator[str]:
    """``names`` that fit, best fit first: the index's order, for a caller's own node list."""
    gpus, cpus, memory = pool.gpus, pool.cpus, pool.memory
    fitting: list[tuple[int, int, str]] = []
    for name in names:
        free_gpus, free_cpus = len(gpus[name]), len(cpus[name])
        if free_gpus >= min_gpus and free_cpus >= min_cpus and memory[name] >= min_memory:
            fitting.append((free_gpus, free_cpus, name))
    # Fewest free GPUs first (best fit keeps whole nodes free for large jobs); name breaks ties.
    fitting.sort()
    return (name for _, _, name in fitting)


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
    scope = model_scope(spec)
    index = pool.index
    max_gpn = index.max_gpus_per_node(scope)
    limit = spec.max_nodes or index.node_count(scope)
    for d_node, d_gpn in shapes(spec.gpus, max_gpn, limit):
        placement = realise(spec, pool, d_node, d_gpn)
        if placement is not None:
            return placement
    return None


def fits_cluster(spec: JobSpec, snapshot: ClusterSnapshot) -> str | None:
    """Why a job can never run on this cluster as it is, or None if an empty cluster fits it."""
    nodes = [
        v for v in snapshot.nodes.values()
        if eligible(spec, v.inventory, now=False)  # a window passes: not "never"
    ]
    if not nodes:
        model = f" of model {spec.gpu_model}" if spec.gpu_model else ""
        partitions = spec.selector.partitions
        if partitions and all(v.inventory.partition_set.isdisjoint(partitions)
                              for v in snapshot.nodes.values()):
            return f"no registered node is in partition {'|'.join(partitions)}"
        if selects(spec):
            absent = missing_features(spec, [v.inventory for v in snapshot.nodes.values()])
            if absent:
                return f"no node has the feature{'s' if ',' in absent else ''} {absent}"
            if spec.selector.only_features:
                return f"no node{model} has all of the features {spec.selector.constraint}"
            return f"no node{model} matches what it selects ({spec.selector})"
        return f"no node{model} is registered"
    if spec.gpus:
        total = sum(v.total_gpus for v in nodes)
        if spec.gpus > total:
            if selects(spec):
                return (f"asks for {spec.gpus} GPUs but the nodes it selects "
                        f"({spec.selector}) have {total}")
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
