"""A job as Liquid schedules it: tasks, and what each task needs.

Liquid runs parameter-server jobs: one PS and several workers (§1, Fig. 1). A Trellis job asks
for GPUs; Liquid's view of it is one worker task per GPU plus, for a training job of two GPUs
or more, one parameter-server task without a GPU. The PS runs with rank 0: the placement's
first allocation is its node (a part without GPUs when no worker shares the node).

What a task needs comes from the job's predictions, which a feature (the resource model,
``masterd.features.liquid``) or a replay attaches to ``Job.annotations`` under the keys
below; without them, the user's request stands in (a fractional job's ``gpu_milli``, the
whole GPU otherwise) and the bandwidth is the policy's ``default_bandwidth_mbps``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from shared.model import Job, JobKind, JobSpec

# Job.annotations keys the resource model writes (all floats).
GPU_UTIL = "liquid.gpu_util"  # mean GPU utilisation of one worker, 0..1
GPU_UTIL_STD = "liquid.gpu_util_std"
GPU_MEM = "liquid.gpu_mem_mib"  # peak GPU memory of one worker
CPU = "liquid.cpu"  # peak CPU of one task, in cores
MEM = "liquid.mem_mib"  # peak memory of one task
NET = "liquid.net_mbps"  # network bandwidth of one worker, MB/s sent + received
# Pre-scheduling (§6.1): predicted phase lengths and when the post phase began.
PRE_S = "liquid.pre_s"
POST_S = "liquid.post_s"
POST_SINCE = "liquid.post_since"

WORKER = "worker"
PS = "ps"


@dataclass(frozen=True)
class Task:
    job_id: str
    index: int  # 0.. within the job: workers first, the PS last
    role: str  # WORKER or PS
    gpus: int
    cpus: int
    memory_mib: int


@dataclass(frozen=True)
class Demand:
    """One job's tasks and the predictions Liquid's rules read."""

    job_id: str
    tasks: tuple[Task, ...]
    bandwidth: float  # MB/s of one worker: weighs its traffic in the network cost
    gpu_util: float  # predicted mean utilisation of one worker, 0..1
    gpu_mem_mib: float | None  # predicted peak GPU memory of one worker (None: unknown)
    shareable: bool  # may share a GPU (a 1-GPU job that gave gpu_milli)

    @property
    def has_ps(self) -> bool:
        return self.tasks[-1].role == PS if self.tasks else False

    @property
    def workers(self) -> int:
        return sum(1 for t in self.tasks if t.role == WORKER)

    @property
    def gpus(self) -> int:
        return sum(t.gpus for t in self.tasks)


def has_ps(spec: JobSpec) -> bool:
    return spec.kind is JobKind.TRAINING and spec.gpus >= 2


def task_count(spec: JobSpec) -> int:
    if spec.gpus == 0:
        return 1
    return spec.gpus + (1 if has_ps(spec) else 0)


def demand_of(job: Job, default_bandwidth_mbps: float, gpu_memory_mib: int | None) -> Demand:
    """``gpu_memory_mib``: the memory of the GPUs the job would use (for a fractional job's
    default memory estimate); None when unknown."""
    spec, notes = job.spec, job.annotations
    workers = spec.gpus
    per_cpu = math.ceil(spec.cpus / workers) if workers else spec.cpus
    per_mem = math.ceil(spec.memory_mib / workers) if workers else spec.memory_mib
    tasks = [Task(job.id, i, WORKER, 1, per_cpu, per_mem) for i in range(workers)]
    if workers == 0:
        tasks.append(Task(job.id, 0, WORKER, 0, spec.cpus, spec.memory_mib))
    if has_ps(spec):
        # The PS holds no GPU and no dedicated cores: it runs on the cores its node offers.
        tasks.append(Task(job.id, len(tasks), PS, 0, 0, 0))
    share = spec.gpu_milli / 1000 if spec.gpu_milli is not None else None
    util = notes.get(GPU_UTIL, share if share is not None else 1.0)
    mem = notes.get(GPU_MEM)
    if mem is None and share is not None and gpu_memory_mib:
        mem = share * gpu_memory_mib
    return Demand(
        job_id=job.id,
        tasks=tuple(tasks),
        bandwidth=float(notes.get(NET, default_bandwidth_mbps)),
        gpu_util=max(0.0, float(util)),
        gpu_mem_mib=None if mem is None else max(0.0, float(mem)),
        shareable=spec.gpu_milli is not None and spec.gpus == 1,
    )
