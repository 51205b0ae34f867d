from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from masterd.core.cluster import ClusterState
from masterd.core.placement import FreePool, choose_gpus, pack
from masterd.core.policies.fifo import FifoPolicy
from masterd.core.policy import Start
from masterd.core.scheduler import SchedulingCore
from tests.unit.helpers import inventory, job


def cluster(*invs):  # type: ignore[no-untyped-def]
    state = ClusterState()
    for inv in invs:
        state.upsert_node(inv)
    return state


def test_gpus_on_one_switch_then_one_numa_node() -> None:
    state = cluster(inventory("n1", gpus=8, numa=2, per_switch=2))
    view = state.node("n1")
    assert view is not None
    assert choose_gpus(view, set(range(8)), 2) == (0, 1)  # one switch
    assert choose_gpus(view, {1, 2, 3, 4, 5}, 2) == (2, 3)  # a whole switch beats 1+2
    assert choose_gpus(view, set(range(8)), 4) == (0, 1, 2, 3)  # one NUMA node
    assert choose_gpus(view, {0, 1, 2, 4, 5, 6, 7}, 4) == (4, 5, 6, 7)


def test_cpus_follow_the_gpus_numa_node() -> None:
    state = cluster(inventory("n1", gpus=8, cpus=16, numa=2))
    pool = FreePool(state.snapshot({}))
    pool.gpus["n1"] -= {0, 1, 2, 3}
    placement = pack(job("a", gpus=2, cpus=4).spec, pool)
    assert placement is not None
    alloc = placement.allocations[0]
    assert alloc.gpus == (4, 5)
    assert all(c >= 8 for c in alloc.cpus)  # NUMA node 1 holds cores 8-15


def test_fewest_nodes_then_best_fit() -> None:
    state = cluster(inventory("a"), inventory("b"), inventory("c"))
    state.allocate("x", pack(job("x", gpus=6).spec, FreePool(state.snapshot({}))))  # type: ignore[arg-type]
    pool = FreePool(state.snapshot({}))
    # 2 GPUs fit on the node with only 2 free (best fit), not on an empty node.
    p = pack(job("y", gpus=2).spec, pool)
    assert p is not None and p.nodes == ("a",)
    # 16 GPUs need two whole nodes.
    p16 = pack(job("z", gpus=16).spec, pool)
    assert p16 is not None and sorted(p16.nodes) == ["b", "c"]
    assert all(len(a.gpus) == 8 for a in p16.allocations)


def test_fifo_blocks_behind_the_head() -> None:
    state = cluster(inventory("a", gpus=4))
    snapshot = state.snapshot({})
    queue = [job("big", gpus=8, t=1), job("small", gpus=1, t=2)]
    assert FifoPolicy().decide(snapshot, queue, 10) == []
    decisions = FifoPolicy(backfill=True).decide(snapshot, queue, 10)
    assert [d.job_id for d in decisions if isinstance(d, Start)] == ["small"]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 8), st.integers(1, 4)), min_size=1, max_size=30))
def test_no_gpu_or_core_given_twice(requests: list[tuple[int, int]]) -> None:
    core = SchedulingCore(FifoPolicy(backfill=True))
    for name in ("a", "b", "c"):
        core.node_up(inventory(name, gpus=8, cpus=8))
    for i, (gpus, cpus) in enumerate(requests):
        core.submit(job(f"j{i}", gpus=gpus, cpus=cpus, t=i))
    decisions = core.schedule(100)
    seen_gpus: set[tuple[str, int]] = set()
    seen_cpus: set[tuple[str, int]] = set()
    for d in decisions:
        assert isinstance(d, Start)
        placement = d.placement
        spec = core.jobs[d.job_id].spec
        assert placement.gpu_count == spec.gpus
        for a in placement.allocations:
            for g in a.gpus:
                assert (a.node, g) not in seen_gpus
                seen_gpus.add((a.node, g))
            for c in a.cpus:
                assert (a.node, c) not in seen_cpus
                seen_cpus.add((a.node, c))
