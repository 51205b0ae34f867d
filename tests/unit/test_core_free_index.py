"""The free index (schedulable nodes by GPU model and free GPUs) stays equal to one rebuilt
from the node views, in ClusterState and in a FreePool, and index-driven placement decides
exactly what the full filter-and-sort over the job's nodes decides."""

from __future__ import annotations

import contextlib
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from masterd.core.cluster import (
    ANY_MODEL,
    AllocationError,
    ClusterSnapshot,
    ClusterState,
    FreeIndex,
    NodeView,
)
from masterd.core.placement import FreePool, pack, realise, shapes
from shared.model import JobSpec, NodeAllocation, Placement
from tests.unit.helpers import inventory, job

NAMES = [f"n{i}" for i in range(6)]
MODELS = ["A100", "V100", None]  # None: a CPU-only node


def rebuilt(views: list[NodeView]) -> dict:  # type: ignore[type-arg]
    return FreeIndex.build(v for v in views if v.schedulable).contents()


def node_inventory(data: st.DataObject, name: str):  # type: ignore[no-untyped-def]
    model = data.draw(st.sampled_from(MODELS))
    gpus = 0 if model is None else data.draw(st.sampled_from([1, 2, 4, 8]))
    inv = inventory(name, gpus=gpus, cpus=data.draw(st.integers(2, 12)),
                    model=model or "none", memory_mib=data.draw(st.integers(0, 4)) * 1000)
    if gpus and data.draw(st.booleans()):  # an unhealthy GPU is never free
        sick = data.draw(st.integers(0, gpus - 1))
        inv = replace(inv, gpus=tuple(
            replace(g, healthy=False) if g.index == sick else g for g in inv.gpus))
    return inv


def some_placement(data: st.DataObject, state: ClusterState) -> Placement | None:
    names = state.node_names
    if not names:
        return None
    nodes = data.draw(st.lists(st.sampled_from(names), min_size=1, max_size=2, unique=True))
    allocs = []
    for name in nodes:
        view = state.node(name)
        assert view is not None
        # Mostly free units; sometimes any unit, so that refused allocations are tried too.
        gpu_pool = sorted(view.free_gpus if data.draw(st.booleans()) else
                          {g.index for g in view.inventory.gpus})
        cpu_pool = sorted(view.free_cpus) or [0]
        allocs.append(NodeAllocation(
            name,
            tuple(data.draw(st.lists(st.sampled_from(gpu_pool), unique=True, max_size=4)))
            if gpu_pool else (),
            tuple(data.draw(st.lists(st.sampled_from(cpu_pool), unique=True, max_size=4))),
            data.draw(st.integers(0, 1500)),
        ))
    return Placement(tuple(allocs))


def step(data: st.DataObject, state: ClusterState, jobs: list[str]) -> None:
    """One random change to the cluster: what masterd and the simulator do to it."""
    op = data.draw(st.sampled_from(
        ["upsert", "upsert", "remove", "drain", "allocate", "allocate", "release", "resize"]))
    if op == "upsert":
        state.upsert_node(node_inventory(data, data.draw(st.sampled_from(NAMES))))
    elif op == "remove" and state.node_names:
        state.remove_node(data.draw(st.sampled_from(state.node_names)))
    elif op == "drain" and state.node_names:
        state.set_schedulable(data.draw(st.sampled_from(state.node_names)), data.draw(
            st.booleans()))
    elif op == "allocate":
        placement = some_placement(data, state)
        if placement is not None:
            job_id = f"j{len(jobs)}"
            with contextlib.suppress(AllocationError):  # refused: nothing may change
                state.allocate(job_id, placement)
                jobs.append(job_id)
    elif op == "release" and jobs:
        state.release(jobs.pop(data.draw(st.integers(0, len(jobs) - 1))))
    elif op == "resize" and jobs:
        job_id = data.draw(st.sampled_from(jobs))
        alloc = state.allocation(job_id).allocations[0]  # type: ignore[union-attr]
        view = state.node(alloc.node)
        if view is not None:
            free = sorted(view.free_cpus | set(alloc.cpus))
            cpus = data.draw(st.lists(st.sampled_from(free), min_size=1, max_size=4,
                                      unique=True)) if free else []
            with contextlib.suppress(AllocationError):  # refused: nothing may change
                state.resize_cpus(job_id, alloc.node, tuple(cpus))


@settings(max_examples=80, deadline=None)
@given(st.data())
def test_state_index_equals_one_rebuilt_from_the_views(data: st.DataObject) -> None:
    state = ClusterState()
    jobs: list[str] = []
    kept: list[tuple[ClusterSnapshot, dict, list[str]]] = []  # type: ignore[type-arg]
    for _ in range(data.draw(st.integers(1, 40))):
        step(data, state, jobs)
        views = list(state.views())
        assert state.free_index().contents() == rebuilt(views)
        snapshot = state.snapshot({})
        assert list(snapshot.schedulable) == [v.name for v in views if v.schedulable]
        by_hand = ClusterSnapshot(nodes=snapshot.nodes, running={})
        assert snapshot.node_sizes() == by_hand.node_sizes()
        assert snapshot.total_gpus == sum(v.total_gpus for v in views)
        for model in (*MODELS, None):
            assert snapshot.max_gpus_per_node(model) == max(
                (v.total_gpus for v in views if model is None or v.gpu_model == model),
                default=0)
        assert snapshot.schedulable_nodes() == [v for v in views if v.schedulable]
        if data.draw(st.booleans()):
            if data.draw(st.booleans()):  # read now: shares the state's index from here on
                assert snapshot.free_index.contents() == rebuilt(views)
            kept.append((snapshot, rebuilt(views), list(snapshot.schedulable)))
    # Later changes never show through an earlier snapshot: one that read the state's index
    # shares it copy-on-write; one that reads it only now builds its own from its nodes.
    for snapshot, contents, schedulable in kept:
        assert snapshot.free_index.contents() == contents
        assert list(snapshot.schedulable) == schedulable


def old_pack(spec: JobSpec, pool: FreePool) -> Placement | None:
    """pack as it was before the index: every node of the job's model, filtered and sorted."""
    if spec.gpus == 0:
        return realise(spec, pool, 1, 0, pool.nodes_for(spec))
    names = pool.nodes_for(spec)
    max_gpn = max((pool.views[n].total_gpus for n in names), default=0)
    for d_node, d_gpn in shapes(spec.gpus, max_gpn, spec.max_nodes or len(names)):
        placement = realise(spec, pool, d_node, d_gpn, names)
        if placement is not None:
            return placement
    return None


def pool_views(pool: FreePool) -> list[NodeView]:
    return [
        replace(view, free_gpus=pool.gpus[name], free_cpus=pool.cpus[name],
                free_memory_mib=pool.memory[name])
        for name, view in pool.views.items()
    ]


@settings(max_examples=80, deadline=None)
@given(st.data())
def test_pool_index_follows_takes_and_decides_like_a_full_scan(data: st.DataObject) -> None:
    state = ClusterState()
    jobs: list[str] = []
    for _ in range(data.draw(st.integers(1, 25))):
        step(data, state, jobs)
    snapshot = state.snapshot({})
    before = snapshot.free_index.contents()
    pool = FreePool(snapshot)
    for _ in range(data.draw(st.integers(1, 12))):
        gpus = data.draw(st.sampled_from([0, 1, 2, 3, 4, 8, 16]))
        spec = job("x", gpus=gpus, cpus=data.draw(st.integers(0 if gpus else 1, 10)),
                   gpu_model=data.draw(st.sampled_from(MODELS)),
                   memory_mib=data.draw(st.integers(0, 3000)),
                   max_nodes=data.draw(st.sampled_from([None, 1, 2]))).spec
        placement = pack(spec, pool)
        assert placement == old_pack(spec, pool)
        if placement is not None:
            pool.take(placement)
        elif pool.views and data.draw(st.booleans()):
            # What the array policy does: give units back by assignment.
            name = data.draw(st.sampled_from(sorted(pool.views)))
            view = pool.views[name]
            pool.gpus[name] |= {g.index for g in view.inventory.gpus if g.healthy}
            pool.cpus[name] = pool.cpus[name] | {c.id for c in view.inventory.cpus}
            pool.memory[name] += 100
        assert pool.index.contents() == rebuilt(pool_views(pool))
    # The pass's changes stay in the pool.
    assert snapshot.free_index.contents() == before
    assert state.free_index().contents() == before


def test_snapshot_built_by_hand_indexes_itself() -> None:
    state = ClusterState()
    for name, model in (("a", "A100"), ("b", "V100"), ("c", "A100")):
        state.upsert_node(inventory(name, gpus=4, model=model))
    state.set_schedulable("c", False)
    by_hand = ClusterSnapshot(nodes=dict(state.snapshot({}).nodes), running={})
    assert list(by_hand.schedulable) == ["a", "b"]
    assert by_hand.node_sizes() == {"A100": {4: 2}, "V100": {4: 1}}  # drained nodes count
    index = by_hand.free_index
    assert list(index.ranked("A100", 1, 0)) == ["a"]
    assert sorted(index.ranked(ANY_MODEL, 0, 0)) == ["a", "b"]
    assert index.max_gpus_per_node("V100") == 4 and index.node_count(ANY_MODEL) == 2
    assert index.contents() == state.free_index().contents()


def test_ranked_is_best_fit_order_and_skips_what_does_not_fit() -> None:
    state = ClusterState()
    for name in ("a", "b", "c", "d"):
        state.upsert_node(inventory(name, gpus=4, cpus=8))
    state.allocate("j1", Placement((NodeAllocation("c", (0, 1), (0,), 0),)))
    state.allocate("j2", Placement((NodeAllocation("b", (0, 1), (0, 1, 2), 0),)))
    state.allocate("j3", Placement((NodeAllocation("d", (0, 1, 2, 3), (), 0),)))
    index = state.free_index()
    # 2 free GPUs before 4; among equals, fewer free cores (b: 5) before more (c: 7).
    assert list(index.ranked("A100", 1, 0)) == ["b", "c", "a"]
    assert list(index.ranked("A100", 1, 6)) == ["c", "a"]
    assert list(index.ranked(ANY_MODEL, 0, 0)) == ["d", "b", "c", "a"]
    assert list(index.ranked("H100", 0, 0)) == []


def test_pool_values_cannot_be_changed_in_place_or_grow_nodes() -> None:
    state = ClusterState()
    state.upsert_node(inventory("a", gpus=2))
    pool = FreePool(state.snapshot({}))
    with pytest.raises(AttributeError):
        pool.gpus["a"].discard(0)  # type: ignore[attr-defined]
    with pytest.raises(KeyError):
        pool.gpus["nope"] = frozenset()
    with pytest.raises(TypeError):
        del pool.cpus["a"]
    pool.gpus["a"] = {1}  # type: ignore[assignment]  # a set is frozen on the way in
    assert pool.gpus["a"] == frozenset({1}) and isinstance(pool.gpus["a"], frozenset)
    assert "a" in pool.gpus and list(pool.memory) == ["a"] and len(pool.cpus) == 1


def test_copies_share_buckets_until_either_side_changes() -> None:
    index = FreeIndex()
    for name, gpus in (("a", 2), ("b", 4), ("c", 4)):
        index.add(name, "A100", 4, gpus, 8)
    copy = index.copy()
    index.move("b", "A100", (4, 8), (1, 8))  # the original changes after the copy...
    copy.remove("c", "A100", 4, 4, 8)  # ...and so does the copy
    assert list(index.ranked("A100", 0, 0)) == ["b", "a", "c"]
    assert list(copy.ranked("A100", 0, 0)) == ["a", "b"]
    assert index.node_count(ANY_MODEL) == 3 and copy.node_count(ANY_MODEL) == 2
    with pytest.raises(AssertionError, match="no node d"):
        index.remove("d", "A100", 4, 4, 8)
