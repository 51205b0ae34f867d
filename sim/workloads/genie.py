"""GENIE's synthetic task queue (§7.1, Table 3) on its 4-node × 4-GPU K80 platform (Table 1).

Poisson arrivals at ``density`` tasks/hour over ``hours``; model type uniform over the six
models; calculation type 50% training / 50% inference; QoS Urgent 5% / Prior 35% / Normal 60%;
batch size and iteration count uniform over per-model ranges (the paper says "uniform" without
giving the ranges: ours put a task's single-GPU latency between about ten minutes and a few
hours, see docs/simulator.md). The requested GPU count is our addition (the paper's policies
choose placements themselves): training 1/2/4/8 GPUs with weights 40/30/20/10%, inference
1/2/4 with 50/30/20%.

Task lengths (``GenieOptions.lengths``): ``"short"`` draws iterations uniformly from the ranges
above (single-GPU latency about ten minutes to a few hours); ``"long"`` follows §7.1's "from a
couple of hours to weeks": a task's single-GPU latency is log-uniform between 2 hours and 2
weeks (the paper gives the span, not the distribution; log-uniform gives every order of
magnitude of that span the same share of tasks), turned into iterations with the simulator's
noise-free single-GPU rate of the task's model, kind and batch (what a user who knows how long
their task takes on one GPU would declare).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from shared.model import JobKind, JobSpec
from sim.cluster import NodeGroup, build_cluster
from sim.truth import NodeTopology, TruthConfig, TruthModel, TruthParams
from sim.workloads.assign import (
    BATCHES,
    GENIE_QOS_MIX,
    MODEL_TYPES,
    ModelFill,
    iterations_for_duration,
    pick_weighted,
)
from sim.workloads.base import SimJob, Workload

# Uniform iteration ranges per (model, kind).
ITERATIONS: dict[tuple[str, JobKind], tuple[int, int]] = {
    ("alexnet", JobKind.TRAINING): (1500, 19000),
    ("googlenet", JobKind.TRAINING): (1100, 13500),
    ("resnet50", JobKind.TRAINING): (850, 10000),
    ("inception-v3", JobKind.TRAINING): (550, 6750),
    ("lstm", JobKind.TRAINING): (5000, 59000),
    ("seq2seq", JobKind.TRAINING): (2100, 25000),
    ("alexnet", JobKind.INFERENCE): (1800, 21600),
    ("googlenet", JobKind.INFERENCE): (1300, 15400),
    ("resnet50", JobKind.INFERENCE): (1000, 11600),
    ("inception-v3", JobKind.INFERENCE): (650, 7700),
    ("lstm", JobKind.INFERENCE): (5600, 67000),
    ("seq2seq", JobKind.INFERENCE): (2400, 28800),
}

TRAINING_GPUS: tuple[tuple[int, float], ...] = ((1, 0.4), (2, 0.3), (4, 0.2), (8, 0.1))
INFERENCE_GPUS: tuple[tuple[int, float], ...] = ((1, 0.5), (2, 0.3), (4, 0.2))
TENANTS: tuple[str, ...] = ("team-a", "team-b", "team-c", "team-d")

LENGTHS = ("short", "long")
# "long": single-GPU latency log-uniform over [2 h, 2 weeks] (§7.1: "a couple of hours to weeks").
LONG_SPAN_S: tuple[float, float] = (2 * 3600.0, 14 * 86400.0)

# GENIE Table 1: 4 nodes, 2 × 10-core Xeon, 64 GB, 4 × K80 (one K80 die per GPU here), no NVLink.
GENIE_PLATFORM = NodeGroup(
    count=4,
    gpus_per_node=4,
    gpu_model="K80",
    gpu_memory_mib=12288,
    cpu_cores=20,
    sockets=2,
    gpus_per_switch=2,
    memory_mib=65536,
    nic_mbps=56000,
    prefix="genie",
)


@dataclass(frozen=True)
class GenieOptions:
    density: float = 10.0  # task arrivals per hour
    hours: float = 24.0
    seed: int = 1
    platform: NodeGroup = GENIE_PLATFORM
    lengths: str = "short"  # LENGTHS: today's mix, or GENIE's hours-to-weeks tasks


def generate(options: GenieOptions) -> Workload:
    if options.density <= 0:
        raise ValueError(f"arrival density must be positive, got {options.density:g}")
    if options.hours <= 0:
        raise ValueError(f"arrival duration must be positive, got {options.hours:g} h")
    if options.lengths not in LENGTHS:
        raise ValueError(f"task lengths must be one of {', '.join(LENGTHS)}, "
                         f"got {options.lengths!r}")
    nodes = build_cluster([options.platform])
    speeds = TruthModel()  # noise-free rates: what the long mix's users expect of one GPU
    single = NodeTopology(1, 1, 1)
    max_gpus = options.platform.count * options.platform.gpus_per_node
    r = random.Random(
        f"genie/{options.seed}/{float(options.density)!r}/{float(options.hours)!r}"
    )
    horizon = options.hours * 3600.0
    rate = options.density / 3600.0
    jobs: list[SimJob] = []
    t = r.expovariate(rate)
    while t < horizon:
        i = len(jobs)
        model_type = MODEL_TYPES[r.randrange(len(MODEL_TYPES))]
        kind = JobKind.TRAINING if r.random() < 0.5 else JobKind.INFERENCE
        qos = pick_weighted(r, GENIE_QOS_MIX)
        batch = r.choice(BATCHES[model_type])
        if options.lengths == "short":
            lo, hi = ITERATIONS[(model_type, kind)]
            iterations = r.randint(lo, hi)
        else:
            low, high = LONG_SPAN_S
            seconds = math.exp(r.uniform(math.log(low), math.log(high)))
            iterations = iterations_for_duration(speeds, ModelFill(model_type, batch), kind,
                                                 seconds, 1, single)
        gpus = pick_weighted(r, TRAINING_GPUS if kind is JobKind.TRAINING else INFERENCE_GPUS)
        gpus = min(gpus, max_gpus)
        tenant = TENANTS[r.randrange(len(TENANTS))]
        name = f"genie-{i:05d}"
        spec = JobSpec(
            name=name,
            command=("python", "-m", f"bench.{model_type}", f"--batch={batch}"),
            user=tenant.replace("-", "_"),
            kind=kind,
            tenant=tenant,
            qos=qos,
            gpus=gpus,
            cpus=2 * gpus,
            model_type=model_type,
            batch=batch,
            iterations=iterations,
        )
        truth = TruthParams(model_type=model_type, batch=batch, iterations=iterations)
        jobs.append(SimJob(id=name, spec=spec, submit=t, truth=truth))
        t += r.expovariate(rate)
    workload = Workload(
        name=f"genie-d{options.density:g}" + ("-long" if options.lengths == "long" else ""),
        jobs=jobs,
        nodes=nodes,
        notes={
            "density_per_hour": options.density,
            "arrival_hours": options.hours,
            "lengths": options.lengths,
            "platform": f"{options.platform.count}x{options.platform.gpus_per_node} "
                        f"{options.platform.gpu_model}",
        },
    )
    workload.sort()
    return workload


@dataclass(frozen=True)
class OfferedLoad:
    """Work offered over the arrival window against what the platform can do in it.

    ``work_gpu_h`` is every task's single-GPU latency (noise-free ground truth, no
    neighbours) in GPU-hours: one GPU is the cheapest way to run a task in GPU-hours (spreading
    adds synchronisation and shrinks the local batch), so this is the least the tasks need.
    ``capacity_gpu_h`` is the platform's GPUs × the arrival window. A ratio above 1 means the
    platform cannot finish the window's work within the window whatever the policy.
    """

    tasks: int
    work_gpu_h: float
    gpus: int
    hours: float

    @property
    def capacity_gpu_h(self) -> float:
        return self.gpus * self.hours

    @property
    def ratio(self) -> float:
        return self.work_gpu_h / self.capacity_gpu_h if self.capacity_gpu_h > 0 else math.inf

    def arithmetic(self) -> str:
        """The sum spelled out, e.g. ``240 tasks, 313 GPU-h ÷ (16 GPUs × 24 h) = 0.82``."""
        return (f"{self.tasks} tasks, {self.work_gpu_h:.0f} GPU-h ÷ ({self.gpus} GPUs × "
                f"{self.hours:g} h) = {self.ratio:.2f}")


def offered_load(workload: Workload, hours: float) -> OfferedLoad:
    """The offered load of a generated GENIE workload over its ``hours`` of arrivals."""
    truth = TruthModel(TruthConfig(noise_sigma=0.0, interference=False))
    single = NodeTopology(1, 1, 1)
    seconds = 0.0
    for job in workload.jobs:
        seconds += truth.job_truth(job.id, job.spec.kind, 1, job.truth, single).lat11
    gpus = sum(len(n.gpus) for n in workload.nodes)
    return OfferedLoad(len(workload.jobs), seconds / 3600.0, gpus, hours)
