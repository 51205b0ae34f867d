"""What the cluster has and what is given away: the single owner of resource accounting."""

from __future__ import annotations

import bisect
import enum
from collections.abc import Callable, Iterable, Iterator, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from masterd.core.eligibility import EligibilityKey, eligibility_key, eligible
from shared.model import Job, JobSpec, NodeAllocation, NodeInventory, Placement


class AllocationError(RuntimeError):
    """A decision asked for a resource that is not free (a policy bug or a stale decision)."""


_NO_SHARES: Mapping[int, int] = MappingProxyType({})


@dataclass(frozen=True)
class NodeView:
    """One node as a policy sees it: immutable, so a snapshot can be shared without copying."""

    inventory: NodeInventory
    free_gpus: frozenset[int]
    free_cpus: frozenset[int]
    free_memory_mib: int
    schedulable: bool = True
    # GPUs held shared (fractional jobs, or lent by a job saving its model) -> how many jobs
    # hold each; such a GPU is in neither ``free_gpus`` nor held whole. Empty unless a policy
    # places shared allocations, so whole-GPU accounting is exactly what it was without it.
    shared_gpus: Mapping[int, int] = field(default_factory=lambda: _NO_SHARES)

    @property
    def name(self) -> str:
        return self.inventory.name

    @property
    def gpu_model(self) -> str | None:
        return self.inventory.gpu_model

    @property
    def total_gpus(self) -> int:
        return len(self.inventory.gpus)

    @property
    def idle(self) -> bool:
        """Nothing is allocated on the node (see :func:`idle_node`)."""
        return idle_node(self, self.free_gpus, self.free_cpus, self.free_memory_mib)


def idle_node(view: NodeView, free_gpus: AbstractSet[int], free_cpus: AbstractSet[int],
              free_memory_mib: int) -> bool:
    """With these free resources, nothing is allocated on the node (every healthy GPU, every
    core and all its memory free, no GPU shared): an exclusive job may take it whole. One
    test for the pool's search (its own free sets mid-pass) and the core's start."""
    inventory = view.inventory
    return (not view.shared_gpus and len(free_cpus) == len(inventory.cpus)
            and len(free_gpus) == sum(1 for g in inventory.gpus if g.healthy)
            and free_memory_mib >= inventory.memory_mib)


class AnyModel(enum.Enum):
    """The scope "nodes of every GPU model" (CPU-only jobs and jobs that name no model)."""

    ANY = "any"


ANY_MODEL = AnyModel.ANY
# Which nodes a search covers: one GPU model (None: nodes without GPUs) or all of them.
ModelScope = str | None | AnyModel

# GPU model (None: no GPUs) -> GPUs per node -> number of nodes.
NodeSizes = Mapping[str | None, Mapping[int, int]]

# One node in a bucket: (free cores, name) is the order ``realise`` ranks nodes with the
# same number of free GPUs, so a bucket kept sorted needs no sorting at search time.
_Entry = tuple[int, str]


class _Buckets:
    """Nodes by free GPU count, each bucket sorted by (free cores, name).

    Copy-on-write per bucket: ``copy`` shares every bucket list, and whichever copy changes a
    bucket first gives itself a private list. A snapshot per scheduling pass then costs
    O(GPUs per node), and a change costs one bucket copy at most once per snapshot.
    """

    __slots__ = ("_lists", "_owned")

    def __init__(self) -> None:
        self._lists: list[list[_Entry]] = []
        self._owned: set[int] = set()  # buckets no other copy shares

    def copy(self) -> _Buckets:
        other = _Buckets()
        other._lists = list(self._lists)
        self._owned.clear()  # every bucket is shared now, by both copies
        return other

    def _writable(self, gpus: int) -> list[_Entry]:
        while len(self._lists) <= gpus:
            self._owned.add(len(self._lists))
            self._lists.append([])
        if gpus not in self._owned:
            self._lists[gpus] = list(self._lists[gpus])
            self._owned.add(gpus)
        return self._lists[gpus]

    def add(self, gpus: int, cpus: int, name: str) -> None:
        bisect.insort(self._writable(gpus), (cpus, name))

    def remove(self, gpus: int, cpus: int, name: str) -> None:
        bucket = self._writable(gpus)
        i = bisect.bisect_left(bucket, (cpus, name))
        if i == len(bucket) or bucket[i] != (cpus, name):
            # The index lost step with the free sets: a bug, never a user error.
            raise AssertionError(f"free index has no node {name} with {gpus} GPUs/{cpus} cores")
        del bucket[i]

    def move(self, name: str, old: tuple[int, int], new: tuple[int, int]) -> None:
        # Every allocation and release lands here, twice (model and ANY_MODEL): kept to the
        # two bucket edits.
        self.remove(old[0], old[1], name)
        bisect.insort(self._writable(new[0]), (new[1], name))

    def ranked(self, min_gpus: int, min_cpus: int) -> Iterator[str]:
        """Names with at least ``min_gpus`` free GPUs and ``min_cpus`` free cores, best fit
        first: fewest free GPUs, then fewest free cores, then name."""
        for bucket in self._lists[min_gpus:]:
            # Names sort after "", so this skips exactly the entries with too few cores.
            for i in range(bisect.bisect_left(bucket, (min_cpus, "")), len(bucket)):
                yield bucket[i][1]

    def contents(self) -> list[list[_Entry]]:
        """The buckets without trailing empty ones (for comparing two indexes)."""
        lists = [list(b) for b in self._lists]
        while lists and not lists[-1]:
            lists.pop()
        return lists


class FreeIndex:
    """Schedulable nodes by GPU model and free GPU count: what best-fit placement searches.

    ``ClusterState`` keeps one current as resources come and go and hands a copy to every
    snapshot; a ``FreePool`` copies the snapshot's and keeps it current as a pass places jobs.
    So a search touches only the nodes it may pick, instead of every node of the cluster.
    Every node is filed under its own model and under ``ANY_MODEL``.
    """

    def __init__(self) -> None:
        self._buckets: dict[ModelScope, _Buckets] = {}
        # scope -> total GPUs of a node -> how many schedulable nodes have that many: pack's
        # largest GPUs-per-node and node count, without a pass over the nodes.
        self._sizes: dict[ModelScope, dict[int, int]] = {}

    @classmethod
    def build(cls, views: Iterable[NodeView]) -> FreeIndex:
        """An index of ``views`` (which should all be schedulable) from scratch."""
        index = cls()
        for view in views:
            _index_view(index, view)
        return index

    def copy(self) -> FreeIndex:
        other = FreeIndex()
        other._buckets = {scope: b.copy() for scope, b in self._buckets.items()}
        other._sizes = {scope: dict(sizes) for scope, sizes in self._sizes.items()}
        return other

    def add(self, name: str, model: str | None, total_gpus: int, gpus: int, cpus: int) -> None:
        for scope in (model, ANY_MODEL):
            self._buckets.setdefault(scope, _Buckets()).add(gpus, cpus, name)
            sizes = self._sizes.setdefault(scope, {})
            sizes[total_gpus] = sizes.get(total_gpus, 0) + 1

    def remove(self, name: str, model: str | None, total_gpus: int, gpus: int, cpus: int) -> None:
        for scope in (model, ANY_MODEL):
            self._buckets[scope].remove(gpus, cpus, name)
            sizes = self._sizes[scope]
            sizes[total_gpus] -= 1
            if not sizes[total_gpus]:
                del sizes[total_gpus]

    def move(self, name: str, model: str | None, old: tuple[int, int],
             new: tuple[int, int]) -> None:
        """A node's free (GPUs, cores) changed from ``old`` to ``new``."""
        if old == new:
            return
        self._buckets[model].move(name, old, new)
        self._buckets[ANY_MODEL].move(name, old, new)

    def ranked(self, scope: ModelScope, min_gpus: int, min_cpus: int) -> Iterator[str]:
        """Nodes of ``scope`` with enough free GPUs and cores, best fit first."""
        buckets = self._buckets.get(scope)
        return buckets.ranked(min_gpus, min_cpus) if buckets is not None else iter(())

    def max_gpus_per_node(self, scope: ModelScope) -> int:
        return max(self._sizes.get(scope, ()), default=0)

    def node_count(self, scope: ModelScope) -> int:
        return sum(self._sizes.get(scope, {}).values())

    def contents(self) -> dict[ModelScope, tuple[list[list[_Entry]], dict[int, int]]]:
        """Everything the index holds, comparable with ``==`` (for tests and debugging)."""
        return {
            scope: (buckets.contents(), dict(self._sizes[scope]))
            for scope, buckets in self._buckets.items()
            if buckets.contents() or self._sizes[scope]
        }


@dataclass(frozen=True)
class ClusterSnapshot:
    nodes: Mapping[str, NodeView]
    running: Mapping[str, Job]
    # Derived from ``nodes``: ``ClusterState.snapshot`` fills them from what it keeps
    # current; a snapshot built by hand (array views, tests) computes them on first use.
    _schedulable: Mapping[str, NodeView] | None = field(
        default=None, init=False, repr=False, compare=False)
    _free_index: FreeIndex | None = field(default=None, init=False, repr=False, compare=False)
    _sizes: NodeSizes | None = field(default=None, init=False, repr=False, compare=False)
    # Gives the free index its owner keeps, or None if that has changed since (see indexed).
    _index_source: Callable[[], FreeIndex | None] | None = field(
        default=None, init=False, repr=False, compare=False)
    _timed: bool | None = field(default=None, init=False, repr=False, compare=False)
    # Gives the nodes a job may use as its owner keeps them, or None if its nodes'
    # inventories have changed since (see eligible_names).
    _eligible_source: Callable[[JobSpec], frozenset[str] | None] | None = field(
        default=None, init=False, repr=False, compare=False)
    _eligible: dict[EligibilityKey, frozenset[str]] | None = field(
        default=None, init=False, repr=False, compare=False)

    @classmethod
    def indexed(
        cls,
        nodes: Mapping[str, NodeView],
        running: Mapping[str, Job],
        schedulable: Mapping[str, NodeView],
        index_source: Callable[[], FreeIndex | None],
        sizes: NodeSizes,
        timed: bool = False,
        eligible_source: Callable[[JobSpec], frozenset[str] | None] | None = None,
    ) -> ClusterSnapshot:
        """A snapshot whose derived views are already known.

        The free index is fetched from ``index_source`` only when first asked for: a pass
        that never searches it (SWAF places through its own) costs its owner nothing. If the
        source has changed by then, the snapshot builds its own from ``nodes``.
        """
        snapshot = cls(nodes=nodes, running=running)
        object.__setattr__(snapshot, "_timed", timed)
        object.__setattr__(snapshot, "_schedulable", schedulable)
        object.__setattr__(snapshot, "_index_source", index_source)
        object.__setattr__(snapshot, "_sizes", sizes)
        object.__setattr__(snapshot, "_eligible_source", eligible_source)
        return snapshot

    def eligible_names(self, spec: JobSpec) -> frozenset[str]:
        """The nodes ``spec`` may use now (masterd.core.eligibility), of every node: asked
        once per kind of job (its eligibility key) while the nodes' inventories stay as they
        are, where a placer would otherwise ask each node again for each shape it tries."""
        if self._eligible_source is not None:
            found = self._eligible_source(spec)
            if found is not None:
                return found
        if self._eligible is None:
            object.__setattr__(self, "_eligible", {})
        assert self._eligible is not None
        return _eligible_names(self._eligible, spec, self.timed, self.nodes)

    @property
    def timed(self) -> bool:
        """Some node has a maintenance window or a reservation ahead (its eligibility
        depends on a job's time limit, so placers ask ``eligible`` of every job, not only of
        jobs that select)."""
        if self._timed is None:
            object.__setattr__(self, "_timed", any(
                _timed(v.inventory) for v in self.nodes.values()))
        assert self._timed is not None
        return self._timed

    @property
    def schedulable(self) -> Mapping[str, NodeView]:
        """The schedulable nodes, by name, in the order of ``nodes``."""
        if self._schedulable is None:
            object.__setattr__(self, "_schedulable", MappingProxyType(
                {name: v for name, v in self.nodes.items() if v.schedulable}))
        assert self._schedulable is not None
        return self._schedulable

    @property
    def free_index(self) -> FreeIndex:
        """The schedulable nodes by free GPUs (read-only: ``copy()`` it to change it)."""
        if self._free_index is None:
            index = self._index_source() if self._index_source is not None else None
            if index is None:  # built by hand, or the state has moved on since
                index = FreeIndex.build(self.schedulable.values())
            object.__setattr__(self, "_free_index", index)
        assert self._free_index is not None
        return self._free_index

    def node_sizes(self) -> NodeSizes:
        """Every node, schedulable or not: GPU model -> GPUs per node -> how many nodes.

        What a platform description (nodes and GPUs per node of each model) needs, without
        a pass over the nodes.
        """
        if self._sizes is None:
            sizes: dict[str | None, dict[int, int]] = {}
            for view in self.nodes.values():
                _count_size(sizes, view, +1)
            object.__setattr__(self, "_sizes", sizes)
        assert self._sizes is not None
        return self._sizes

    def schedulable_nodes(self) -> list[NodeView]:
        return list(self.schedulable.values())

    @property
    def total_gpus(self) -> int:
        return sum(
            gpus * count for by_size in self.node_sizes().values()
            for gpus, count in by_size.items()
        )

    def max_gpus_per_node(self, gpu_model: str | None = None) -> int:
        return max(
            (
                gpus
                for model, by_size in self.node_sizes().items()
                if gpu_model is None or model == gpu_model
                for gpus in by_size
            ),
            default=0,
        )


def _count_size(sizes: dict[str | None, dict[int, int]], view: NodeView, sign: int) -> None:
    by_size = sizes.setdefault(view.gpu_model, {})
    by_size[view.total_gpus] = by_size.get(view.total_gpus, 0) + sign
    if not by_size[view.total_gpus]:
        del by_size[view.total_gpus]
        if not by_size:
            del sizes[view.gpu_model]


def _index_view(index: FreeIndex, view: NodeView) -> None:
    index.add(view.name, view.gpu_model, view.total_gpus,
              len(view.free_gpus), len(view.free_cpus))


def _unindex_view(index: FreeIndex, view: NodeView) -> None:
    index.remove(view.name, view.gpu_model, view.total_gpus,
                 len(view.free_gpus), len(view.free_cpus))


class ClusterState:
    """Node inventories plus the allocations of running jobs.

    Free sets are kept as frozensets replaced per node on every change, so taking a snapshot
    costs one dict copy whatever the cluster size. Every change goes through ``_put`` and
    ``_drop``, which keep the schedulable nodes and the free index in step with the views.
    """

    def __init__(self) -> None:
        self._views: dict[str, NodeView] = {}
        # Nodes with a maintenance window or a reservation ahead.
        self._timed_nodes: set[str] = set()
        self._schedulable: dict[str, NodeView] = {}  # _views' order, unless the flag below
        self._schedulable_unordered = False  # a node came back: reorder before it is read
        self._index = FreeIndex()
        self._index_shared = False  # a snapshot holds _index: copy it before changing it
        self._index_changes = 0  # bumped on every change, so a snapshot knows it is current
        self._sizes: dict[str | None, dict[int, int]] = {}  # of every node, see node_sizes
        # Bumped whenever a node joins, leaves or changes inventory (not on allocations), so
        # answers that depend only on what the cluster is made of can be cached.
        self.inventory_changes = 0
        # The nodes each kind of job may use, as of ``_eligible_at`` (inventory_changes).
        self._eligible: dict[EligibilityKey, frozenset[str]] = {}
        self._eligible_at = -1
        self._allocations: dict[str, Placement] = {}
        # node -> the jobs holding anything there (a dict as an ordered set): a node's own
        # jobs without a scan of every allocation (a reconnect storm is O(parts), not
        # O(nodes x jobs)).
        self._on_node: dict[str, dict[str, None]] = {}
        # node -> {(job id, incarnation): GPUs} held by parts the master does not own (an
        # older incarnation, a job it forgot) that still run there: the node refuses to give
        # them to anyone (gpus_busy) until they exit, so no placement may count them free.
        self._holds: dict[str, dict[tuple[str, int], frozenset[int]]] = {}

    def _writable_index(self) -> FreeIndex:
        self._index_changes += 1
        if self._index_shared:
            self._index, self._index_shared = self._index.copy(), False
        return self._index

    @property
    def timed(self) -> bool:
        """Some node has a window or a reservation ahead (see ClusterSnapshot.timed)."""
        return bool(self._timed_nodes)

    def _put(self, view: NodeView) -> None:
        """Add or replace one node's view."""
        name = view.name
        old = self._views.get(name)
        self._views[name] = view
        if old is None or old.inventory is not view.inventory:
            self.inventory_changes += 1
            if not _timed(view.inventory):
                self._timed_nodes.discard(name)
            else:
                self._timed_nodes.add(name)
            if old is not None:
                _count_size(self._sizes, old, -1)
            _count_size(self._sizes, view, +1)
        if old is not None and old.schedulable and view.schedulable and (
            old.inventory is view.inventory
        ):
            # Only free units changed (allocate, release): the common case, one move.
            self._writable_index().move(
                name, view.gpu_model, (len(old.free_gpus), len(old.free_cpus)),
                (len(view.free_gpus), len(view.free_cpus)))
            self._schedulable[name] = view
            return
        if old is not None and old.schedulable:
            _unindex_view(self._writable_index(), old)
        if view.schedulable:
            _index_view(self._writable_index(), view)
            if old is None or old.schedulable:
                self._schedulable[name] = view  # new nodes go last in both dicts
            else:
                # Back from drained or down: last for now; put in _views' order when a
                # snapshot is taken (rebuilding here made a reconnect storm O(nodes^2)).
                self._schedulable[name] = view
                self._schedulable_unordered = True
        elif old is not None and old.schedulable:
            del self._schedulable[name]

    def _drop(self, name: str) -> None:
        old = self._views.pop(name, None)
        self._timed_nodes.discard(name)
        if old is not None:
            self.inventory_changes += 1
            _count_size(self._sizes, old, -1)
        if old is not None and old.schedulable:
            _unindex_view(self._writable_index(), old)
            del self._schedulable[name]

    # -- nodes ---------------------------------------------------------------------------
    def upsert_node(self, inventory: NodeInventory) -> None:
        """Add a node or replace its inventory, keeping what running jobs hold on it."""
        name = inventory.name
        held_gpus: set[int] = set()
        held_cpus: set[int] = set()
        held_mem = 0
        shares: dict[int, int] = {}
        for job_id in self._on_node.get(name, ()):
            for alloc in self._allocations[job_id].allocations:
                if alloc.node == name:
                    if alloc.shared:
                        for g in alloc.gpus:
                            shares[g] = shares.get(g, 0) + 1
                    else:
                        held_gpus.update(alloc.gpus)
                    held_cpus.update(alloc.cpus)
                    held_mem += alloc.memory_mib
        for stray in self._holds.get(name, {}).values():
            held_gpus.update(stray)
        usable_gpus = {g.index for g in inventory.gpus if g.healthy}
        old = self._views.get(name)
        self._put(NodeView(
            inventory=inventory,
            free_gpus=frozenset(usable_gpus - held_gpus - shares.keys()),
            free_cpus=frozenset({c.id for c in inventory.cpus} - held_cpus),
            free_memory_mib=max(0, inventory.memory_mib - held_mem),
            schedulable=old.schedulable if old else True,
            shared_gpus=MappingProxyType(shares) if shares else _NO_SHARES,
        ))

    def remove_node(self, name: str) -> None:
        self._holds.pop(name, None)
        self._drop(name)

    # -- parts the master does not own ---------------------------------------------------
    def hold(self, node: str, job_id: str, restarts: int, gpus: Iterable[int]) -> frozenset[int]:
        """A part the master does not own runs on ``node`` with ``gpus``: they stay out of
        every placement until ``unhold`` (its exit reported), even those a job of the
        master's holds now (they are not free when that job ends). Returns what is held."""
        view = self._views.get(node)
        if view is None:
            return frozenset()
        held = self._holds.setdefault(node, {})
        key = (job_id, restarts)
        if key not in held:
            held[key] = frozenset(gpus) & {g.index for g in view.inventory.gpus}
            if view.free_gpus & held[key]:
                self._put(replace(view, free_gpus=view.free_gpus - held[key]))
        return held[key]

    def unhold(self, node: str, job_id: str, restarts: int) -> bool:
        """The part's exit was reported: what it held is free again, unless a job or another
        stray holds it. True if it held any GPU."""
        holds = self._holds.get(node)
        taken = holds.pop((job_id, restarts), None) if holds else None
        view = self._views.get(node)
        if not taken or view is None:
            return False
        busy = self._held_gpus(node)
        for job in self._on_node.get(node, ()):
            for alloc in self._allocations[job].allocations:
                if alloc.node == node:
                    busy.update(alloc.gpus)
        healthy = {g.index for g in view.inventory.gpus if g.healthy}
        back = (taken & healthy) - busy
        if back:
            self._put(replace(view, free_gpus=view.free_gpus | back))
        return True

    def _held_gpus(self, node: str) -> set[int]:
        held: set[int] = set()
        for gpus in self._holds.get(node, {}).values():
            held.update(gpus)
        return held

    def clear_holds(self, node: str) -> None:
        """Forget what ``node``'s strays held (it says hello and reports them afresh); the
        next ``upsert_node`` recomputes its free GPUs."""
        self._holds.pop(node, None)

    def holds(self, node: str) -> Mapping[tuple[str, int], frozenset[int]]:
        return MappingProxyType(self._holds.get(node, {}))

    def set_schedulable(self, name: str, schedulable: bool) -> None:
        view = self._views[name]
        if view.schedulable != schedulable:
            self._put(replace(view, schedulable=schedulable))

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
            shares = view.shared_gpus
            if alloc.shared:
                # A shared GPU may be free (the first holder) or shared already, never held
                # whole by another job.
                busy = sorted(gpus - view.free_gpus - shares.keys())
                if busy:
                    raise AllocationError(f"job {job_id}: GPUs {busy} on {alloc.node} are held "
                                          "whole by another job and cannot be shared")
                taken = {**shares}
                for g in gpus:
                    taken[g] = taken.get(g, 0) + 1
                shares = MappingProxyType(taken)
            elif not gpus <= view.free_gpus:
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
                shared_gpus=shares,
            )
        for view in updated.values():
            self._put(view)
        self._allocations[job_id] = placement
        for alloc in placement.allocations:
            self._on_node.setdefault(alloc.node, {})[job_id] = None

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
            on_node = self._on_node.get(alloc.node)
            if on_node is not None:
                on_node.pop(job_id, None)
                if not on_node:
                    del self._on_node[alloc.node]
            view = self._views.get(alloc.node)
            if view is None:
                continue
            healthy = {g.index for g in view.inventory.gpus if g.healthy}
            returned, shares = set(alloc.gpus), view.shared_gpus
            if alloc.shared:
                left = dict(shares)
                for g in alloc.gpus:
                    left[g] = left.get(g, 1) - 1
                # A GPU comes back free only when its last sharer leaves.
                returned = {g for g in alloc.gpus if left[g] <= 0}
                for g in returned:
                    del left[g]
                shares = MappingProxyType(left) if left else _NO_SHARES
            if self._holds.get(alloc.node):  # a stray part still holds some (rare)
                returned -= self._held_gpus(alloc.node)
            self._put(replace(
                view,
                free_gpus=view.free_gpus | (returned & healthy),
                # Only cores the node still has (it may have returned with fewer).
                free_cpus=view.free_cpus | (view.inventory.cpu_ids & set(alloc.cpus)),
                free_memory_mib=min(
                    view.inventory.memory_mib, view.free_memory_mib + alloc.memory_mib
                ),
                shared_gpus=shares,
            ))
        return placement

    def lend(self, job_id: str) -> Placement | None:
        """Hold a job's whole GPUs shared from now on (Liquid's pre-scheduling: the job is
        saving its model, and the next job may start on its GPUs). Returns the job's placement
        as now held, or None if the job holds nothing; lending twice changes nothing."""
        placement = self._allocations.get(job_id)
        if placement is None:
            return None
        if all(a.shared or not a.gpus for a in placement.allocations):
            return placement
        lent: list[NodeAllocation] = []
        for alloc in placement.allocations:
            if alloc.shared or not alloc.gpus:
                lent.append(alloc)
                continue
            view = self._views.get(alloc.node)
            if view is not None:
                shares = dict(view.shared_gpus)
                for g in alloc.gpus:
                    shares[g] = shares.get(g, 0) + 1
                self._put(replace(view, shared_gpus=MappingProxyType(shares)))
            lent.append(replace(alloc, shared=True))
        held = Placement(tuple(lent))
        self._allocations[job_id] = held
        return held

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
        self._put(replace(view, free_cpus=(view.free_cpus - taken) | (old - new)))

    def allocation(self, job_id: str) -> Placement | None:
        return self._allocations.get(job_id)

    @property
    def allocations(self) -> Mapping[str, Placement]:
        return MappingProxyType(self._allocations)

    def jobs_on(self, node: str) -> list[str]:
        """The jobs holding anything on ``node``, in the order they took it."""
        return list(self._on_node.get(node, ()))

    def snapshot(self, running: Mapping[str, Job]) -> ClusterSnapshot:
        nodes = MappingProxyType(dict(self._views))
        # With no node drained (the usual case) both mappings hold the same, in the same order.
        if len(self._schedulable) == len(self._views):
            schedulable = nodes
        else:
            if self._schedulable_unordered:  # O(nodes), as the copy below
                self._schedulable = {n: v for n, v in self._views.items() if v.schedulable}
                self._schedulable_unordered = False
            schedulable = MappingProxyType(dict(self._schedulable))
        taken_at = self._index_changes

        def index_then() -> FreeIndex | None:
            """The index as of this snapshot, if it has not changed since (shared from then
            on: the state copies before changing it again)."""
            if self._index_changes != taken_at:
                return None
            self._index_shared = True
            return self._index

        sizes = {model: dict(by_size) for model, by_size in self._sizes.items()}  # tiny
        made_at = self.inventory_changes

        def eligible_then(spec: JobSpec) -> frozenset[str] | None:
            """The nodes ``spec`` may use, shared between snapshots while no inventory has
            changed since this one was taken (None once one has)."""
            if self.inventory_changes != made_at:
                return None
            if self._eligible_at != made_at:
                self._eligible.clear()
                self._eligible_at = made_at
            return _eligible_names(self._eligible, spec, bool(self._timed_nodes), self._views)

        return ClusterSnapshot.indexed(nodes, running, schedulable, index_then, sizes,
                                       bool(self._timed_nodes), eligible_then)

    def free_index(self) -> FreeIndex:
        """The live index of schedulable nodes by free GPUs (read-only; for tests)."""
        return self._index

    def views(self) -> Iterable[NodeView]:
        return self._views.values()


def _timed(inventory: NodeInventory) -> bool:
    """Whether a job may start on the node depends on its time limit: a maintenance window
    or a reservation is ahead there."""
    return inventory.maintenance_in_s is not None or bool(inventory.reservations)


# Kinds of job remembered per inventory version: a bound, should every job differ (each set
# costs ~16 bytes per node: 256 of them at 5,000 nodes are ~20 MB).
ELIGIBLE_KINDS = 256


def _eligible_names(cache: dict[EligibilityKey, frozenset[str]], spec: JobSpec, timed: bool,
                    nodes: Mapping[str, NodeView]) -> frozenset[str]:
    key = eligibility_key(spec, timed)
    found = cache.get(key)
    if found is None:
        if len(cache) >= ELIGIBLE_KINDS:
            cache.clear()
        found = cache[key] = frozenset(
            name for name, view in nodes.items() if eligible(spec, view.inventory))
    return found
