"""masterd.core.placement.FreePool: no reference cycle per pass, and its value maps still
keep the pool's index in step when written through."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from masterd.core.cluster import ANY_MODEL, ClusterSnapshot, ClusterState
from masterd.core.placement import FreePool, pack
from tests.unit.helpers import inventory, job


@pytest.fixture
def snapshot() -> ClusterSnapshot:
    state = ClusterState()
    state.upsert_node(inventory("a", gpus=8, cpus=16))
    state.upsert_node(inventory("b", gpus=8, cpus=16))
    state.upsert_node(inventory("c", gpus=4, cpus=8, model="H100"))
    return state.snapshot({})


@pytest.fixture
def no_gc() -> Iterator[None]:
    """Only reference counting frees anything while this is active."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def test_a_used_pool_is_freed_by_reference_counting(snapshot: ClusterSnapshot,
                                                     no_gc: None) -> None:
    pool = FreePool(snapshot)
    placement = pack(job("j", gpus=2, cpus=2).spec, pool)
    assert placement is not None
    pool.take(placement)
    pool.gpus["b"] = frozenset({0, 1})
    pool.cpus["b"] = frozenset({3})
    pool.memory["a"] = 10
    pool.gpus["b"] -= {1}  # the read-modify-write form passes through __setitem__ too
    assert list(pool.ranked(ANY_MODEL, 1, 1, 0))  # builds the pool's own index copy
    ref = weakref.ref(pool)
    del pool
    assert ref() is None, "the pool is in a reference cycle: only the cyclic GC frees it"


def test_values_outliving_their_pool_refuse_writes(snapshot: ClusterSnapshot,
                                                    no_gc: None) -> None:
    pool = FreePool(snapshot)
    gpus = pool.gpus
    ref = weakref.ref(pool)
    del pool
    assert ref() is None  # the value map does not keep its pool alive
    assert gpus["a"] == frozenset(range(8))  # reading still works from the snapshot
    with pytest.raises(RuntimeError, match="FreePool"):
        gpus["a"] = frozenset()


def test_setting_gpus_refiles_the_index(snapshot: ClusterSnapshot) -> None:
    before = snapshot.free_index.contents()
    pool = FreePool(snapshot)
    assert list(pool.index.ranked(ANY_MODEL, 1, 0)) == ["c", "a", "b"]  # fewest free first
    pool.gpus["b"] = frozenset({0, 1})
    assert pool.gpus["b"] == frozenset({0, 1})
    assert pool.counts("b") == (2, 16)
    assert list(pool.index.ranked(ANY_MODEL, 1, 0)) == ["b", "c", "a"]
    assert list(pool.index.ranked(ANY_MODEL, 3, 0)) == ["c", "a"]
    assert list(pool.index.ranked("A100", 1, 0)) == ["b", "a"]
    pool.gpus["a"] = set()  # any set is taken, stored frozen
    assert pool.gpus["a"] == frozenset() and isinstance(pool.gpus["a"], frozenset)
    assert list(pool.index.ranked(ANY_MODEL, 1, 0)) == ["b", "c"]
    pool.cpus["c"] = frozenset({0})
    assert list(pool.index.ranked(ANY_MODEL, 1, 2)) == ["b"]
    # The snapshot's index is shared: the pool changed its own copy only.
    assert snapshot.free_index.contents() == before


def test_setting_memory(snapshot: ClusterSnapshot) -> None:
    pool = FreePool(snapshot)
    full = pool.memory["a"]
    pool.memory["a"] = 100
    assert pool.memory["a"] == 100 and pool.memory["b"] == full
    assert list(pool.ranked(ANY_MODEL, 1, 1, 1000)) == ["c", "b"]
    assert list(pool.ranked(ANY_MODEL, 1, 1, 100)) == ["c", "a", "b"]
    # A job needing more memory than a is left with cannot go there.
    placement = pack(job("big", gpus=8, cpus=1, memory_mib=1000).spec, pool)
    assert placement is not None and placement.nodes == ("b",)


@pytest.mark.parametrize("values", ["gpus", "cpus", "memory"])
def test_unknown_node_is_refused(snapshot: ClusterSnapshot, values: str) -> None:
    pool = FreePool(snapshot)
    mapping = getattr(pool, values)
    with pytest.raises(KeyError):
        mapping["nope"] = frozenset() if values != "memory" else 0
    assert "nope" not in mapping
    assert sorted(mapping) == ["a", "b", "c"] and len(mapping) == 3


def test_drained_node_is_not_in_the_pool() -> None:
    state = ClusterState()
    state.upsert_node(inventory("a"))
    state.upsert_node(inventory("d"))
    state.set_schedulable("d", False)
    pool = FreePool(state.snapshot({}))
    with pytest.raises(KeyError):
        pool.gpus["d"] = frozenset()
    assert list(pool.gpus) == ["a"]
