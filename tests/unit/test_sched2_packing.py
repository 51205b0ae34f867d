"""SCHED²'s packing placement (seeds/sched2.md §II-B, Fig. 2)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from masterd.core.cluster import ClusterState
from masterd.core.placement import FreePool
from masterd.core.sched2.packing import best_servers, pack, pack_split
from tests.unit.helpers import inventory, job


def pool_with(free: dict[str, int], gpus: int = 8, cpus: int = 16) -> FreePool:
    """A pool whose servers have ``free`` GPUs free (the others held by a job each)."""
    state = ClusterState()
    for name in free:
        state.upsert_node(inventory(name, gpus=gpus, cpus=cpus, model="P40"))
    pool = FreePool(state.snapshot({}))
    for name, count in free.items():
        pool.gpus[name] = frozenset(range(gpus - count, gpus))
    return pool


def test_the_server_with_the_fewest_free_gpus_that_fits() -> None:
    pool = pool_with({"a": 8, "b": 3, "c": 5, "d": 2})
    assert pack_split(job("j", gpus=3).spec, pool, "P40") == [("b", 3)]
    assert pack_split(job("j", gpus=4).spec, pool, "P40") == [("c", 4)]
    assert pack_split(job("j", gpus=1).spec, pool, "P40") == [("d", 1)]


def test_no_server_fits_the_emptiest_first_then_the_rest_again() -> None:
    # Fig. 2's case: 6 GPUs, no server has 6 free: take the emptiest (5), then the remaining
    # one from the server with the fewest free GPUs that fits it (d, with 1).
    pool = pool_with({"a": 3, "b": 5, "c": 2, "d": 1})
    assert pack_split(job("j", gpus=6).spec, pool, "P40") == [("b", 5), ("d", 1)]
    # 9: 5 + 3, then 1 from d (the fewest free that fits the last one).
    assert pack_split(job("j", gpus=9).spec, pool, "P40") == [("b", 5), ("a", 3), ("d", 1)]


def test_uneven_splits_the_even_packing_cannot_make() -> None:
    pool = pool_with({"a": 3, "b": 1})
    placement = pack(job("j", gpus=4, cpus=4).spec, pool, ["P40"])
    assert placement is not None
    assert [(a.node, len(a.gpus), len(a.cpus)) for a in placement.allocations] == [
        ("a", 3, 3), ("b", 1, 1)]  # cores follow the GPUs
    assert pack(job("j", gpus=5).spec, pool, ["P40"]) is None  # only 4 free


def test_best_servers() -> None:
    assert [best_servers(g, 8) for g in (1, 4, 8, 9, 16, 24)] == [1, 1, 1, 2, 2, 3]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 8), min_size=1, max_size=6), st.integers(1, 24))
def test_packing_takes_exactly_the_demand_from_free_gpus(free: list[int], gpus: int) -> None:
    pool = pool_with({f"n{i}": f for i, f in enumerate(free)})
    placement = pack(job("j", gpus=gpus, cpus=0).spec, pool, ["P40"])
    if sum(free) < gpus:
        assert placement is None
        return
    assert placement is not None and placement.gpu_count == gpus
    for alloc in placement.allocations:
        assert set(alloc.gpus) <= pool.gpus[alloc.node] and alloc.gpus
    # Never more servers than taking the emptiest servers first would need.
    need, servers = gpus, 0
    for f in sorted(free, reverse=True):
        if need <= 0:
            break
        need -= f
        servers += 1
    assert len(placement.allocations) <= servers
