"""The simulator picks its engine from what the compared policies declare: a policy that
shares GPUs replays, with every policy beside it, on the engine that counts a shared GPU
once; the others on the base engine."""

from __future__ import annotations

from pathlib import Path

from masterd.core.policies import make_policy
from shared.model import JobSpec
from sim.engine import SimConfig, simulate
from sim.engines import engine_for, shares_gpus
from sim.liquid_sim import LiquidSimulator
from sim.truth import TruthConfig, TruthParams
from sim.workloads.base import SimJob, Workload
from tests.unit.test_sim_engine import one_node

EXACT = SimConfig(seed=1, truth=TruthConfig(noise_sigma=0.0, interference=False))


def half_gpu_jobs(count: int) -> Workload:
    jobs = []
    for i in range(count):
        spec = JobSpec(name=f"h{i}", command=("x",), user="u", gpus=1, cpus=1, gpu_milli=500)
        jobs.append(SimJob(f"h{i}", spec, 0.0, TruthParams(known_duration=100.0,
                                                            known_gpus=1)))
    return Workload("halves", jobs, one_node(gpus=1, cores=8))


def test_policies_declare_whether_they_share_gpus() -> None:
    assert shares_gpus(make_policy("liquid"))
    assert shares_gpus(make_policy("liquid", sharing=False))  # pre-scheduling lends GPUs
    assert not shares_gpus(make_policy("liquid", sharing=False, prescheduling=False))
    assert not shares_gpus(make_policy("fifo")) and not shares_gpus(make_policy("drf"))
    assert engine_for([make_policy("fifo"), make_policy("drf")]).name == "base"
    # One engine for the whole comparison: fifo beside liquid replays on the sharing one.
    both = engine_for([make_policy("fifo"), make_policy("liquid")])
    assert both.name == "sharing" and both.colocation is None
    assert "do not slow each other" in (both.note() or "")
    assert engine_for([make_policy("fifo")]).note() is None


def test_the_sharing_engine_counts_a_shared_gpu_once() -> None:
    workload = half_gpu_jobs(2)
    engine = engine_for([make_policy("liquid")])
    sim = engine.build(workload, make_policy("liquid"), EXACT)
    assert isinstance(sim, LiquidSimulator)
    result = sim.run()
    assert sim.shared_starts == 2  # both halves on the one GPU at once
    assert all(r.first_start == 0.0 for r in result.records)
    # Allocated GPUs never exceed the node's one GPU; the base engine counted two.
    assert max(u[1] for u in result.usage) <= 1
    base = simulate(half_gpu_jobs(2), make_policy("liquid"), EXACT)
    assert max(u[1] for u in base.usage) == 2


def test_the_sharing_engine_takes_measured_pairs_from_the_trace_directory(
        tmp_path: Path) -> None:
    from tests.unit.test_sim_results import write_traces

    write_traces(tmp_path)
    engine = engine_for([make_policy("liquid")], tmp_path)
    assert engine.colocation is not None and "measured pairs" in (engine.note() or "")
    assert engine_for([make_policy("liquid")], tmp_path / "none").colocation is None
