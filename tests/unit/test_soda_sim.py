"""SODA's node-level mechanisms in the simulator (sim/soda.py), each on a workload small enough
to check by hand: the CPU tuner hands cores back and remembers the best fit, the contention
eliminator throttles a bandwidth-heavy CPU job (by MBM, and by GPU-utilisation drops where
MBM is absent) and so speeds the training job up, the inference placer serves a service from
CPU replicas at night and GPU replicas by day."""

from __future__ import annotations

import pytest

from masterd.core.policies import make_policy
from shared.model import JobKind, JobSpec, NodeInventory
from sim.cluster import NodeGroup, build_node
from sim.engine import SimConfig
from sim.soda import Mechanisms, SodaConfig, SodaSimulator
from sim.soda_truth import SodaTruth, SodaTruthConfig
from sim.truth import TruthParams
from sim.workloads.base import SimJob, Workload

NODE = build_node("n0", NodeGroup(count=1, gpus_per_node=4, gpu_model="A100", cpu_cores=32,
                                  sockets=2, memory_mib=512_000))


def training(job_id: str, cpus: int, runtime: float, submit: float = 0.0) -> SimJob:
    spec = JobSpec(name=job_id, command=("t",), user="alice", kind=JobKind.TRAINING, gpus=1,
                   cpus=cpus, model_type="resnet50", batch=64, iterations=1000)
    return SimJob(job_id, spec, submit, TruthParams(model_type="resnet50", batch=64,
                                                    known_duration=runtime, known_gpus=1))


def cpu_job(job_id: str, cpus: int, runtime: float, submit: float = 0.0) -> SimJob:
    spec = JobSpec(name=job_id, command=("c",), user="bob", kind=JobKind.CPU, gpus=0,
                   cpus=cpus)
    return SimJob(job_id, spec, submit, TruthParams(known_duration=runtime, known_gpus=0))


def replay(jobs: list[SimJob], mechanisms: Mechanisms, truth: SodaTruthConfig | None = None,
           node: NodeInventory = NODE, **soda: object) -> SodaSimulator:
    sim = SodaSimulator(Workload("t", jobs, [node]), make_policy("fifo"), SimConfig(seed=3),
                        SodaConfig(mechanisms=mechanisms, truth=truth or SodaTruthConfig(),
                                   **soda))  # type: ignore[arg-type]
    sim.run()
    return sim


def end(sim: SodaSimulator, job_id: str) -> float:
    record = sim.records[job_id]
    assert record.state == "finished" and record.end is not None
    return record.end


def test_the_tuner_hands_back_cores_and_remembers_the_best_fit() -> None:
    jobs = [training("t1", cpus=16, runtime=3600.0)]
    sim = replay(jobs, Mechanisms(allocator=True, placer=False, eliminator=False))
    best = SodaTruth(SodaTruthConfig(), 3).best_fit("t1", "resnet50", 1)
    assert sim.stats.tuned_parts == 1 and sim.stats.tuning_windows >= 3
    assert sim.stats.core_changes == [best - 16]  # converged to the truth's best fit
    assert sim.stats.cores_returned == 16 - best
    assert sim.history == {("alice", "cv"): best}
    # Pinned at its best fit it runs faster than as recorded (16 cores, past the best fit).
    untuned = replay(jobs, Mechanisms.none())
    assert end(sim, "t1") < end(untuned, "t1")


@pytest.mark.parametrize("mbm", [True, False])
def test_the_eliminator_throttles_a_heavy_cpu_job_and_the_training_job_gains(
        mbm: bool) -> None:
    # Every CPU job heavy, 5 GB/s per core: 24 cores take 120 of the node's 140 GB/s.
    truth = SodaTruthConfig(heavy_share=1.0, heavy_gbps_per_core=5.0, sensitive_share=1.0)
    jobs = [training("t1", cpus=4, runtime=4 * 3600.0), cpu_job("c1", 24, 3 * 3600.0, 600.0)]
    on = replay(jobs, Mechanisms(allocator=False, placer=False, eliminator=True), truth,
                mbm=mbm)
    off = replay(jobs, Mechanisms.none(), truth, mbm=mbm)
    assert off.stats.throttle_actions == 0
    assert on.stats.throttle_actions > 0
    assert end(on, "t1") < end(off, "t1")  # the training job suffers less contention
    assert end(on, "c1") > end(off, "c1")  # the throttled CPU job pays for it


def test_the_placer_serves_from_cpu_at_night_and_gpu_by_day() -> None:
    spec = JobSpec(name="svc", command=("s",), user="carol", kind=JobKind.INFERENCE, gpus=2,
                   cpus=8, model_type="alexnet")  # AlexNet serves a batch of 16 on 16 cores
    service = SimJob("svc", spec, 0.0, TruthParams(model_type="alexnet",
                                                   known_duration=2 * 86400.0, known_gpus=2))
    # Cores for the CPU replicas at the switch point and the GPU replicas replacing them.
    big = build_node("n1", NodeGroup(count=1, gpus_per_node=4, gpu_model="A100",
                                     cpu_cores=96, sockets=2, memory_mib=512_000))
    sim = replay([service], Mechanisms(allocator=False, placer=True, eliminator=False),
                 node=big, services=frozenset({"svc"}))
    # The daily load crosses bs_gpu: CPU replicas at night, GPU replicas by day, each way.
    assert sim.stats.launches_by_kind["cpu"] >= 2 and sim.stats.launches_by_kind["gpu"] >= 2
    assert sim.placer.services == []  # deregistered when the pod's runtime ended
    assert sim.stats.replica_retires == sim.stats.replica_launches  # nothing left behind
    assert sim.records["svc"].state == "service" and sim.records["svc"].end == 2 * 86400.0
