"""Liquid's testbed (§7.4) as a workload: nodes of two T4 GPUs and, per five nodes, four
ResNet-50, two Inception V3 and two VGG-16 training jobs, arriving together (batch mode).

The paper gives the platform (20 ``ecs.gn6i`` VMs: 2 Tesla T4, 48 vCPUs, 186 GB, 15 Gbps)
and the job mix, not the jobs' sizes or lengths. Filled in, seeded and documented here (and
in docs/results-notes/liquid.md), never tuned:

* each job is one parameter server and ``W`` workers of one GPU each, ``W`` drawn from
  ``workers`` (Fig. 1's VGG-16 has one PS and two workers); batch 32 per worker;
* it trains a number of iterations drawn uniformly from ``iterations``;
* its jobs arrive within ``arrival_spread_s`` of each other, in a random order;
* per model, compute time per iteration on a T4 and model (gradient) size are
  :data:`SYNC_PROFILES` (sizes are the models' parameter counts × 4 bytes; compute times
  round public T4 training throughputs at batch 32 in FP32), launching takes ``launch_s``.

Ground truth beyond computing is the parameter servers' traffic (:mod:`sim.psnet`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from shared.model import JobKind, JobSpec
from sim.cluster import NodeGroup, build_cluster
from sim.psnet import SyncProfile
from sim.truth import ModelProfile, TruthConfig, TruthParams
from sim.workloads.base import SimJob, Workload

SYNC_PROFILES: dict[str, SyncProfile] = {
    "resnet50": SyncProfile(gradient_mb=102.0, compute_s=0.32),
    "inception-v3": SyncProfile(gradient_mb=95.0, compute_s=0.46),
    "vgg16": SyncProfile(gradient_mb=553.0, compute_s=0.58),
}
MIX: tuple[tuple[str, int], ...] = (("resnet50", 4), ("inception-v3", 2), ("vgg16", 2))
BATCH_PER_WORKER = 32


@dataclass(frozen=True)
class LiquidTestbed:
    nodes: int = 20
    gpus_per_node: int = 2
    nic_mbps: int = 15000  # 15 Gbps
    cpu_cores: int = 48
    memory_mib: int = 186 * 1024
    gpu_memory_mib: int = 15360
    workers: tuple[int, ...] = (2, 3, 4)
    iterations: tuple[int, int] = (800, 1600)
    arrival_spread_s: float = 10.0
    launch_s: float = 20.0
    seed: int = 1

    def __post_init__(self) -> None:
        if self.nodes < 5 or self.nodes % 5:
            raise ValueError(f"the testbed grows by five nodes; got {self.nodes}")
        if not self.workers or min(self.workers) < 1:
            raise ValueError("workers per job must be at least 1")
        if not 0 < self.iterations[0] <= self.iterations[1]:
            raise ValueError(f"iterations range {self.iterations} is not a range")


def truth_profiles(launch_s: float) -> dict[str, tuple[ModelProfile, ModelProfile]]:
    """The truth's compute rates: flat (a worker's batch is fixed) and no GENIE
    communication term (the parameter servers' traffic is sim.psnet's)."""
    out = {}
    for model, sync in SYNC_PROFILES.items():
        rate = BATCH_PER_WORKER / sync.compute_s
        profile = ModelProfile(rate, 0.0, 0.0, 0.0, 0.0, launch_s)
        out[model] = (profile, profile)
    return out


def testbed_truth(launch_s: float) -> TruthConfig:
    """Computing is placement-independent here; what placement changes is the PS traffic
    (sim.psnet), so the GENIE-style locality and interference terms are off."""
    return TruthConfig(profiles=truth_profiles(launch_s), gpu_speed=(("T4", 1.0),),
                       interference=False, beta_switch=0.0, beta_socket=0.0)


def build_testbed(config: LiquidTestbed) -> Workload:
    nodes = build_cluster([NodeGroup(
        count=config.nodes, gpus_per_node=config.gpus_per_node, gpu_model="T4",
        gpu_memory_mib=config.gpu_memory_mib, cpu_cores=config.cpu_cores, sockets=2,
        gpus_per_switch=config.gpus_per_node, memory_mib=config.memory_mib,
        nic_mbps=config.nic_mbps, prefix="t4")])
    rng = random.Random(f"liquid-testbed/{config.seed}")
    models = [m for m, count in MIX for _ in range(count * config.nodes // 5)]
    rng.shuffle(models)
    jobs: list[SimJob] = []
    for i, model in enumerate(models):
        workers = rng.choice(config.workers)
        iterations = rng.randint(*config.iterations)
        submit = rng.uniform(0.0, config.arrival_spread_s)
        name = f"{model.replace('-', '')}-{i:03d}"
        spec = JobSpec(
            name=name, user="liquid", kind=JobKind.TRAINING, gpus=workers, gpu_model="T4",
            cpus=2 * workers, memory_mib=8192 * workers, model_type=model,
            batch=BATCH_PER_WORKER * workers, iterations=iterations,
            command=("python3", "train.py", "--model", model, "--batch-size",
                     str(BATCH_PER_WORKER), "--workers", str(workers), "--steps",
                     str(iterations)),
        )
        jobs.append(SimJob(id=name, spec=spec, submit=submit, truth=TruthParams(
            model_type=model, batch=BATCH_PER_WORKER * workers, iterations=iterations)))
    workload = Workload(name="liquid-testbed", jobs=jobs, nodes=nodes, notes={
        "nodes": config.nodes, "gpus": config.nodes * config.gpus_per_node,
        "jobs": len(jobs), "mix": {m: c * config.nodes // 5 for m, c in MIX},
        "workers_per_job": list(config.workers), "iterations": list(config.iterations),
        "arrival_spread_s": config.arrival_spread_s,
    })
    workload.sort()
    return workload
