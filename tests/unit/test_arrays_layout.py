"""Which GPUs and cores belong to which array."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from masterd.core.arrays import ArrayConfig, ArrayId, ModelArrays, Size, build_array_map
from masterd.core.cluster import ClusterState
from shared.model import CpuCore, GpuInfo, NodeInventory
from tests.unit.arrays_fixtures import cpu_node, gpu_node, job


def _nodes(*invs: NodeInventory) -> ClusterState:
    state = ClusterState()
    for inv in invs:
        state.upsert_node(inv)
    return state


def _config(large: Size, cores: Size, **bounds: Size) -> ArrayConfig:
    return ArrayConfig(default=ModelArrays(large=large, cpu_job_cores=cores, **bounds))


def test_large_array_takes_whole_nodes_biggest_first() -> None:
    state = _nodes(gpu_node("a", 8), gpu_node("b", 8), gpu_node("c", 4), gpu_node("d", 8))
    amap = build_array_map(state.snapshot({}).nodes, _config(Size.count(16), Size.count(2)))
    large, small = ArrayId("large", "A100"), ArrayId("small", "A100")
    assert {n: na.gpu_array for n, na in amap.nodes.items()} == {
        "a": large, "b": large, "c": small, "d": small,
    }
    assert amap.size(large) == 16 and amap.size(small) == 12
    # Every GPU of a node sits in one array.
    for na in amap.nodes.values():
        assert na.gpus == {g.index for g in state.node(na.node).inventory.gpus}


def test_large_array_respects_bounds_at_node_granularity() -> None:
    state = _nodes(gpu_node("a", 8), gpu_node("b", 8), gpu_node("c", 8))
    # Target 10 of 24: one node (8) is nearer than two (16).
    amap = build_array_map(state.snapshot({}).nodes, _config(Size.count(10), Size.count(0)))
    assert amap.size(ArrayId("large", "A100")) == 8
    # A lower bound of 12 pulls in a second node; an upper bound of 12 forbids it.
    amap = build_array_map(
        state.snapshot({}).nodes,
        _config(Size.count(10), Size.count(0), large_min=Size.count(12)),
    )
    assert amap.size(ArrayId("large", "A100")) == 16
    amap = build_array_map(
        state.snapshot({}).nodes,
        _config(Size.count(10), Size.count(0), large_min=Size.count(12),
                large_max=Size.count(12)),
    )
    assert amap.size(ArrayId("large", "A100")) == 8


def test_cpu_job_cores_come_from_the_numa_node_without_gpus() -> None:
    inv = NodeInventory(
        name="n", hostname="n", address="127.0.0.1",
        gpus=tuple(GpuInfo(index=i, uuid=f"u{i}", model="A100", memory_mib=1, numa_node=0)
                   for i in range(2)),
        cpus=tuple(CpuCore(id=c, socket=c // 8, numa_node=c // 8, core=c) for c in range(16)),
        memory_mib=1000,
    )
    amap = build_array_map(_nodes(inv).snapshot({}).nodes, _config(Size.share(0), Size.count(4)))
    na = amap.nodes["n"]
    assert na.cpu_job_cpus == {12, 13, 14, 15}
    assert na.gpu_job_cpus == set(range(12))
    assert na.core_owner(3) == ArrayId("gpu-cpu", "A100")
    assert na.core_owner(15) == ArrayId("cpu")


def test_gpu_less_nodes_give_every_core_to_cpu_jobs() -> None:
    amap = build_array_map(
        _nodes(cpu_node("c", cores=8), gpu_node("g", 4, cores=8)).snapshot({}).nodes,
        _config(Size.share(0.5), Size.count(2)),
    )
    assert amap.nodes["c"].cpu_job_cpus == set(range(8))
    assert amap.nodes["c"].gpu_array is None
    assert amap.size(ArrayId("cpu")) == 10
    assert amap.size(ArrayId("gpu-cpu", "A100")) == 6


def test_map_ignores_schedulability_and_default_model_is_the_biggest() -> None:
    state = _nodes(gpu_node("a", 8, "A100"), gpu_node("v1", 8, "V100"), gpu_node("v2", 8, "V100"))
    config = _config(Size.share(0.5), Size.count(2))
    before = build_array_map(state.snapshot({}).nodes, config)
    state.set_schedulable("a", False)
    after = build_array_map(state.snapshot({}).nodes, config)
    assert before.nodes == after.nodes
    assert before.default_gpu_model == "V100"
    configured = build_array_map(
        state.snapshot({}).nodes, ArrayConfig(default_gpu_model="A100")
    )
    assert configured.default_gpu_model == "A100"
    assert before.arrays[-1] == ArrayId("cpu")
    assert [a.name for a in before.arrays[:3]] == ["large:A100", "small:A100", "gpu-cpu:A100"]


def test_home_and_lenders() -> None:
    state = _nodes(gpu_node("a", 8, "A100"), gpu_node("v", 8, "V100"))
    amap = build_array_map(state.snapshot({}).nodes, ArrayConfig(default_gpu_model="A100"))
    small_a, large_a = ArrayId("small", "A100"), ArrayId("large", "A100")
    home = amap.home(job(gpus=2, model="A100").spec)
    assert home is not None and home.job_array == small_a
    assert home.allowed == {small_a, ArrayId("gpu-cpu", "A100")}
    assert amap.lenders(job(gpus=2, model="A100").spec, home) == [frozenset({large_a})]
    big = amap.home(job(gpus=4, model="A100").spec)
    assert big is not None and big.job_array == large_a
    cpu = amap.home(job(cpus=2).spec)
    assert cpu is not None and cpu.job_array == ArrayId("cpu")
    assert amap.lenders(job(cpus=2).spec, cpu) == [
        frozenset({ArrayId("gpu-cpu", "A100")}), frozenset({ArrayId("gpu-cpu", "V100")})
    ]
    # A job naming no model queues in the default model and may borrow any model.
    anyjob = job(gpus=1)
    anyhome = amap.home(anyjob.spec)
    assert anyhome is not None and anyhome.job_array == small_a
    assert frozenset({ArrayId("small", "V100"), ArrayId("gpu-cpu", "V100")}) in amap.lenders(
        anyjob.spec, anyhome
    )
    assert amap.home(job(gpus=1, model="H100").spec) is None


@st.composite
def clusters(draw: st.DrawFn) -> list[NodeInventory]:
    count = draw(st.integers(1, 6))
    nodes = []
    for i in range(count):
        gpus = draw(st.sampled_from([0, 1, 2, 4, 8]))
        model = draw(st.sampled_from(["A100", "V100"]))
        cores = draw(st.integers(1, 24))
        nodes.append(gpu_node(f"n{i}", gpus, model, cores))
    return nodes


sizes = st.one_of(
    st.integers(0, 40).map(Size.count),
    st.floats(0, 1, allow_nan=False).map(Size.share),
)


@settings(max_examples=150, deadline=None)
@given(clusters(), sizes, sizes, sizes, sizes, sizes, sizes)
def test_every_unit_has_exactly_one_array_and_bounds_hold(
    nodes: list[NodeInventory],
    large: Size, large_min: Size, large_max: Size,
    cores: Size, cores_min: Size, cores_max: Size,
) -> None:
    config = ArrayConfig(default=ModelArrays(large, large_min, large_max, cores, cores_min,
                                             cores_max))
    state = _nodes(*nodes)
    amap = build_array_map(state.snapshot({}).nodes, config)
    again = build_array_map(state.snapshot({}).nodes, config)
    assert amap == again  # deterministic
    for inv in nodes:
        na = amap.nodes[inv.name]
        all_cores = {c.id for c in inv.cpus}
        assert na.gpu_job_cpus | na.cpu_job_cpus == all_cores
        assert not na.gpu_job_cpus & na.cpu_job_cpus
        if inv.gpus:
            assert na.gpus == {g.index for g in inv.gpus}
            assert na.gpu_array is not None and na.gpu_array.gpu_model == inv.gpu_model
            expected = min(max(cores.resolve(len(all_cores)), cores_min.resolve(len(all_cores))),
                           cores_max.resolve(len(all_cores)))
            assert len(na.cpu_job_cpus) == expected
        else:
            assert na.cpu_job_cpus == all_cores and na.gpu_array is None
    for model in {inv.gpu_model for inv in nodes if inv.gpus}:
        assert model is not None
        total = sum(len(inv.gpus) for inv in nodes if inv.gpu_model == model)
        got = amap.size(ArrayId("large", model))
        assert got + amap.size(ArrayId("small", model)) == total
        assert got <= large_max.resolve(total)
