"""SODA's published workload (sim/workloads/soda_paper.py), the allocator's widening rule
(masterd/core/widen.py) and what widening does in the replay (sim/soda.py)."""

from __future__ import annotations

import pytest

from masterd.core.cluster import ClusterSnapshot, NodeView
from masterd.core.policies import make_policy
from masterd.core.widen import ceiling, node_spare_cores, spare_cores, widened
from shared.model import JobKind, JobSpec
from sim.cluster import NodeGroup, build_node
from sim.engine import SimConfig
from sim.soda import Mechanisms, SodaConfig, SodaSimulator
from sim.soda_truth import SodaTruth, SodaTruthConfig
from sim.studies.openb import _busy_of_active
from sim.truth import TruthConfig, TruthModel, TruthParams
from sim.workloads.base import SimJob, Workload
from sim.workloads.soda_paper import (
    SodaPaperConfig,
    generate,
    services_of,
    training_runtime_params,
)


@pytest.fixture(scope="module")
def workload() -> Workload:
    return generate(SodaPaperConfig(nodes=20, days=3.0), TruthModel(TruthConfig(), 1))


def test_the_workload_follows_the_published_distributions(workload: Workload) -> None:
    nodes = workload.nodes
    assert len(nodes) == 20 and all(len(n.gpus) == 5 and len(n.cpus) == 28 for n in nodes)
    training = [j for j in workload.jobs if j.id.startswith("train-")]
    cpu = [j for j in workload.jobs if j.spec.kind is JobKind.CPU]
    # §VI-A: 25,000 training and 75,000 CPU jobs a month on 80 nodes (Poisson, so roughly).
    assert abs(len(training) - 25_000 / 80 / 30 * 20 * 3) < 80
    assert 2.5 < len(cpu) / len(training) < 4.0
    # §III-B: 76.1% ask 1–2 cores, 15.3% more than 10.
    asks = [j.spec.cpus for j in training]
    assert abs(sum(c <= 2 for c in asks) / len(asks) - 0.761) < 0.05
    assert abs(sum(c > 10 for c in asks) / len(asks) - 0.153) < 0.04
    # §VI-H: 68.5% run over an hour, 39.6% over two.
    runs = [j.truth.known_duration or 0.0 for j in training]
    assert abs(sum(r > 3600 for r in runs) / len(runs) - 0.685) < 0.05
    assert abs(sum(r > 7200 for r in runs) / len(runs) - 0.396) < 0.05
    assert len(services_of(workload)) == 3  # 12 per 80 nodes


def test_the_runtime_fit_passes_through_both_published_points() -> None:
    import math
    mu, sigma = training_runtime_params(SodaPaperConfig())

    def over(t: float) -> float:
        return 0.5 * math.erfc((math.log(t) - mu) / (sigma * math.sqrt(2)))
    assert over(3600) == pytest.approx(0.685, abs=1e-6)
    assert over(7200) == pytest.approx(0.396, abs=1e-6)


def test_the_workload_is_reproducible_and_the_seed_matters() -> None:
    truth = TruthModel(TruthConfig(), 1)
    a = generate(SodaPaperConfig(nodes=2, days=0.5), truth)
    b = generate(SodaPaperConfig(nodes=2, days=0.5), truth)
    c = generate(SodaPaperConfig(nodes=2, days=0.5, seed=2), truth)
    assert [(j.id, j.submit, j.spec.cpus) for j in a.jobs] == \
        [(j.id, j.submit, j.spec.cpus) for j in b.jobs]
    assert [j.submit for j in a.jobs] != [j.submit for j in c.jobs]
    with pytest.raises(ValueError, match="at least one node"):
        generate(SodaPaperConfig(nodes=0), truth)


def test_widening_takes_spare_cores_up_to_the_ceiling() -> None:
    assert ceiling(2, 2, 6) == 12 and ceiling(16, 1, 6) == 16 and ceiling(3, 1, 0) == 3
    with pytest.raises(ValueError):
        ceiling(1, 1, -1)
    # Under the arrays only the CPU-job array's free cores are lent.
    assert spare_cores({4, 5, 20, 21}, {20, 21, 22}, 3, 5) == [20, 21]
    # Without arrays a reserve stays for the node's free GPUs.
    assert spare_cores(set(range(10)), None, 1, 4) == [4, 5, 6, 7, 8, 9]
    assert spare_cores(set(range(3)), None, 2, 4) == []
    assert widened((0,), 1, [4, 5, 6, 7, 8, 9], 6) == (0, 4, 5, 6, 7, 8)
    assert widened((0, 1, 2), 1, [5], 0) == (0, 1, 2)


def test_the_replay_widens_a_starved_job_which_then_runs_faster_and_busier() -> None:
    node = build_node("n0", NodeGroup(count=1, gpus_per_node=4, gpu_model="A100",
                                      cpu_cores=32, sockets=2, memory_mib=512_000))
    spec = JobSpec(name="t1", command=("t",), user="alice", kind=JobKind.TRAINING, gpus=2,
                   cpus=1, model_type="resnet50", batch=64, iterations=1000)
    job = SimJob("t1", spec, 0.0, TruthParams(model_type="resnet50", batch=64,
                                              known_duration=4 * 3600.0, known_gpus=2))
    need = SodaTruth(SodaTruthConfig(), 3).best_fit("t1", "resnet50", 2)
    assert need >= 4  # two GPUs of a CV model need more than the one core asked

    def run(ceiling_per_gpu: int) -> tuple[SodaSimulator, float | None]:
        sim = SodaSimulator(Workload("t", [job], [node]), make_policy("fifo"), SimConfig(seed=3),
                            SodaConfig(mechanisms=Mechanisms(True, False, False),
                                       max_cores_per_gpu=ceiling_per_gpu))
        result = sim.run()
        end = sim.records["t1"].end
        assert end is not None
        return sim, _busy_of_active(result, 0.0, end)

    (wide, wide_busy), (narrow, narrow_busy) = run(8), run(0)
    # SODA §III-A's measure: the busy share of the GPUs in use moves with the cores.
    assert wide_busy is not None and narrow_busy is not None and wide_busy > 2 * narrow_busy
    assert wide.stats.cores_widened > 0 and narrow.stats.cores_widened == 0
    assert wide.stats.core_changes and wide.stats.core_changes[0] > 0  # more than asked
    assert narrow.stats.tuned_parts == 0  # one core: nothing to tune, starved throughout
    end_wide, end_narrow = wide.records["t1"].end, narrow.records["t1"].end
    assert end_wide is not None and end_narrow is not None and end_wide < end_narrow / 2


def test_a_nodes_spare_cores_follow_the_policy() -> None:
    """What the master (masterd.features.adaptive) and the replay (sim.soda) widen into: the
    CPU-job array's free cores under SODA's arrays, else free cores beyond a reserve per free
    GPU (the node's cores per GPU)."""
    inv = build_node("n0", NodeGroup(count=1, gpus_per_node=2, gpu_model="A100", cpu_cores=8,
                                     sockets=1, memory_mib=64_000))
    view = NodeView(inv, frozenset({1}), frozenset(range(1, 8)), 64_000)
    calls: list[int] = []

    def snapshot() -> ClusterSnapshot:
        calls.append(1)
        return ClusterSnapshot({"n0": view}, {})

    # FIFO: one GPU free, so 8 // 2 = 4 of the 7 free cores stay back for it.
    assert node_spare_cores(make_policy("fifo"), snapshot, view) == [5, 6, 7]
    assert calls == []  # no snapshot without arrays
    arrays = make_policy("soda-arrays")
    cpu_array = arrays.array_map(ClusterSnapshot({"n0": view}, {})).nodes["n0"].cpu_job_cpus
    assert cpu_array and not cpu_array >= {5}  # the array holds fewer than the reserve rule
    assert node_spare_cores(arrays, snapshot, view) == sorted(cpu_array & view.free_cpus)
    assert calls == [1]
