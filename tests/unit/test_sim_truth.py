"""The ground-truth model: GENIE Eq. 5–8 by hand, locality and interference penalties."""

from __future__ import annotations

import dataclasses
import math

import pytest

from masterd.core.policies import make_policy
from shared.model import JobKind, JobSpec, NodeAllocation, Placement
from sim.cluster import NodeGroup, build_cluster
from sim.engine import SimConfig, simulate
from sim.truth import (
    DEFAULT_PROFILES,
    ModelProfile,
    NodeTopology,
    TruthConfig,
    TruthModel,
    TruthParams,
    comm_penalty,
    shape_of,
)
from sim.workloads.base import SimJob, Workload

QUIET = TruthConfig(noise_sigma=0.0)
# 2 nodes × 4 GPUs, 2 GPUs per PCIe switch, 2 sockets (GPUs 0-1 on NUMA 0, 2-3 on NUMA 1).
NODES = build_cluster([NodeGroup(count=2, gpus_per_node=4, cpu_cores=8, sockets=2,
                                 gpus_per_switch=2, prefix="t")])
INV = {n.name: n for n in NODES}
TOPO = NodeTopology.of(NODES)


def placement(*parts: tuple[str, tuple[int, ...]]) -> Placement:
    return Placement(tuple(NodeAllocation(node, gpus) for node, gpus in parts))


def model_truth(model: TruthModel, kind: JobKind = JobKind.TRAINING, batch: int = 64,
                gpus: int = 1, model_type: str = "resnet50"):
    params = TruthParams(model_type=model_type, batch=batch, iterations=1000)
    return model.job_truth("j", kind, gpus, params, TOPO)


def test_quadratic_single_gpu_rate_peaks_then_plateaus() -> None:
    p = ModelProfile.from_shape(c0=4, peak=100, b_sat=50, gamma=0.5, lam=0.2, startup_s=0)
    assert p.single_gpu_rate(0) == 4
    assert p.single_gpu_rate(50) == pytest.approx(100)
    assert p.single_gpu_rate(25) == pytest.approx(4 + 96 * 0.75)  # 100 - 96·(1/2)²
    assert p.single_gpu_rate(500) == p.single_gpu_rate(50)  # saturated, not falling


def test_comm_penalty_matches_eq8_by_hand() -> None:
    p = ModelProfile(0, 1, 0, gamma=0.8, lam=0.25, startup_s=0)
    assert comm_penalty(p, 1, 1) == 0.0
    # 2 nodes × 2 GPUs: ((2-1)·2 + 0.25·(2-1))·0.8 / (4-1) = 2.25·0.8/3 = 0.6
    assert comm_penalty(p, 2, 2) == pytest.approx(0.6)
    # 1 node × 4 GPUs: (0 + 0.25·3)·0.8/3 = 0.2 ; 4 nodes × 1 GPU: 3·0.8/3 = 0.8
    assert comm_penalty(p, 1, 4) == pytest.approx(0.2)
    assert comm_penalty(p, 4, 1) == pytest.approx(0.8)


def test_packed_beats_spread_and_spread_pays_eq8() -> None:
    model = TruthModel(QUIET)
    truth = model_truth(model, gpus=2)
    packed = shape_of(placement(("t-0000", (0, 1))), INV)  # one switch
    spread = shape_of(placement(("t-0000", (0,)), ("t-0001", (0,))), INV)
    prof = DEFAULT_PROFILES["resnet50"][0]
    per_gpu = prof.single_gpu_rate(32)
    assert model.speed(truth, packed) == pytest.approx((2 - prof.lam * prof.gamma) * per_gpu)
    assert model.speed(truth, spread) == pytest.approx((2 - prof.gamma) * per_gpu)
    assert model.speed(truth, spread) < model.speed(truth, packed)


def test_spanning_switches_and_sockets_costs_more_with_small_batches() -> None:
    model = TruthModel(QUIET)
    same_switch = shape_of(placement(("t-0000", (0, 1))), INV)
    other_socket = shape_of(placement(("t-0000", (0, 2))), INV)
    assert other_socket.spans_switches and other_socket.spans_sockets
    cfg = QUIET
    for batch in (8, 256):
        truth = model_truth(model, gpus=2, batch=batch)
        sens = cfg.batch_ref / (cfg.batch_ref + batch / 2)
        ratio = model.speed(truth, other_socket) / model.speed(truth, same_switch)
        assert ratio == pytest.approx(1 / (1 + (cfg.beta_switch + cfg.beta_socket) * sens))
    small = model_truth(model, gpus=2, batch=8)
    large = model_truth(model, gpus=2, batch=256)
    assert (model.speed(small, other_socket) / model.speed(small, same_switch)
            < model.speed(large, other_socket) / model.speed(large, same_switch))


def test_inference_has_no_communication_or_locality_penalty() -> None:
    model = TruthModel(QUIET)
    truth = model_truth(model, kind=JobKind.INFERENCE, gpus=2)
    packed = shape_of(placement(("t-0000", (0, 1))), INV)
    spread = shape_of(placement(("t-0000", (0,)), ("t-0001", (3,))), INV)
    assert model.speed(truth, packed) == model.speed(truth, spread)


def test_interference_pcie_and_network_penalties() -> None:
    model = TruthModel(QUIET)
    truth = model_truth(model, gpus=2, batch=64)
    multi = shape_of(placement(("t-0000", (0,)), ("t-0001", (0,))), INV)
    alone = model.speed(truth, multi)
    sens = QUIET.batch_ref / (QUIET.batch_ref + 32)
    assert model.speed(truth, multi, pcie_neighbours=2) == pytest.approx(
        alone / (1 + QUIET.alpha_pcie * 2 * sens))
    assert model.speed(truth, multi, net_neighbours=1) == pytest.approx(
        alone / (1 + QUIET.alpha_net * sens))
    single = shape_of(placement(("t-0000", (0,))), INV)
    one = model_truth(model, gpus=1)
    # A single-node job does not use the network.
    assert model.speed(one, single, net_neighbours=3) == model.speed(one, single)
    off = TruthModel(dataclasses.replace(QUIET, interference=False))
    assert off.speed(truth, multi, 5, 5) == off.speed(truth, multi)


def test_known_duration_is_exact_on_the_reference_shape() -> None:
    model = TruthModel(QUIET)
    params = TruthParams(model_type="lstm", batch=64, known_duration=1234.5, known_gpus=4)
    truth = model.job_truth("k", JobKind.TRAINING, 4, params, TOPO)
    # The tightest packing of 4 GPUs on a 4-GPU node spans both switches and sockets; the
    # trace duration already includes that, so the same shape runs exactly as recorded.
    whole_node = shape_of(placement(("t-0000", (0, 1, 2, 3))), INV)
    assert model.speed(truth, whole_node) == 1.0
    spread = shape_of(placement(("t-0000", (0, 1)), ("t-0001", (0, 1))), INV)
    assert model.speed(truth, spread) < 1.0
    # Eight GPUs instead of four: faster, but less than twice (Eq. 8).
    eight = shape_of(placement(("t-0000", (0, 1, 2, 3)), ("t-0001", (0, 1, 2, 3))), INV)
    assert 1.0 < model.speed(truth, eight) < 2.0


def test_noise_is_seeded_per_job_and_bounded() -> None:
    a = TruthModel(TruthConfig(noise_sigma=0.05), seed=3)
    b = TruthModel(TruthConfig(noise_sigma=0.05), seed=3)
    params = TruthParams(batch=32, iterations=10)
    noises = [a.job_truth(f"j{i}", JobKind.TRAINING, 1, params, TOPO).noise for i in range(200)]
    assert noises == [b.job_truth(f"j{i}", JobKind.TRAINING, 1, params, TOPO).noise
                      for i in range(200)]
    assert len(set(noises)) == 200
    assert abs(sum(map(math.log, noises)) / 200) < 0.02


def test_two_jobs_behind_one_switch_slow_each_other_in_a_replay() -> None:
    # One node, 2 GPUs behind one switch: two 1-GPU jobs of 100 s each (trace durations)
    # both run at 1/(1 + α·sens) of their speed while together.
    nodes = build_cluster([NodeGroup(count=1, gpus_per_node=2, cpu_cores=2, sockets=1,
                                     gpus_per_switch=2, prefix="s")])
    jobs = []
    for name in ("a", "b"):
        spec = JobSpec(name=name, command=("x",), user="u", gpus=1, cpus=1)
        params = TruthParams(model_type="resnet50", batch=32, known_duration=100.0,
                             known_gpus=1)
        jobs.append(SimJob(name, spec, 0.0, params))
    config = SimConfig(truth=QUIET)
    result = simulate(Workload("i", jobs, nodes), make_policy("fifo"), config)
    sens = QUIET.batch_ref / (QUIET.batch_ref + 32)
    expected = 100.0 * (1 + QUIET.alpha_pcie * sens)
    assert [r.end for r in result.records] == [pytest.approx(expected)] * 2
    quiet = SimConfig(truth=dataclasses.replace(QUIET, interference=False))
    result = simulate(Workload("i", jobs, nodes), make_policy("fifo"), quiet)
    assert [r.end for r in result.records] == [100.0, 100.0]


def test_interference_ends_when_the_neighbour_leaves() -> None:
    # a (100 s) and b (20 s) start together: both slowed by f = 1 + α·sens until b ends at
    # 20·f; a has done 20 s of work by then and runs its last 80 s at full speed.
    nodes = build_cluster([NodeGroup(count=1, gpus_per_node=2, cpu_cores=2, sockets=1,
                                     gpus_per_switch=2, prefix="s")])
    jobs = []
    for name, duration in (("a", 100.0), ("b", 20.0)):
        spec = JobSpec(name=name, command=("x",), user="u", gpus=1, cpus=1)
        params = TruthParams(model_type="resnet50", batch=32, known_duration=duration,
                             known_gpus=1)
        jobs.append(SimJob(name, spec, 0.0, params))
    result = simulate(Workload("i", jobs, nodes), make_policy("fifo"), SimConfig(truth=QUIET))
    f = 1 + QUIET.alpha_pcie * QUIET.batch_ref / (QUIET.batch_ref + 32)
    by_id = {r.id: r for r in result.records}
    assert by_id["b"].end == pytest.approx(20.0 * f)
    assert by_id["a"].end == pytest.approx(20.0 * f + 80.0)
    # a's exit was estimated at 100 (alone, before b started) and 100·f (with b): both were
    # superseded; neither ends the replay late nor counts as an event.
    assert result.end_time == by_id["a"].end
    assert result.stale_events == 2
