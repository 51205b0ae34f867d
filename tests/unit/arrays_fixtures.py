"""Builders shared by the multi-array and DRF tests: nodes, jobs, and driving a SchedulingCore."""

from __future__ import annotations

import itertools
from collections.abc import Iterable

from masterd.core.policy import Decision, Policy, Preempt, Start
from masterd.core.scheduler import SchedulingCore
from shared.model import CpuCore, GpuInfo, Job, JobKind, JobSpec, JobState, NodeInventory

_ids = itertools.count()


def gpu_node(
    name: str, gpus: int = 8, model: str = "A100", cores: int = 16, memory_mib: int = 256_000
) -> NodeInventory:
    """Two sockets/NUMA nodes, GPUs split evenly across them, two PCIe switches per socket."""
    half_gpu = max(1, gpus // 2)
    half_core = max(1, cores // 2)
    return NodeInventory(
        name=name,
        hostname=name,
        address="127.0.0.1",
        gpus=tuple(
            GpuInfo(
                index=i, uuid=f"GPU-{name}-{i}", model=model, memory_mib=40_000,
                numa_node=i // half_gpu, pcie_switch=i // max(1, half_gpu // 2),
            )
            for i in range(gpus)
        ),
        cpus=tuple(
            CpuCore(id=c, socket=c // half_core, numa_node=c // half_core, core=c)
            for c in range(cores)
        ),
        memory_mib=memory_mib,
    )


def cpu_node(name: str, cores: int = 16, memory_mib: int = 64_000) -> NodeInventory:
    return gpu_node(name, gpus=0, cores=cores, memory_mib=memory_mib)


def job(
    gpus: int = 0,
    cpus: int = 1,
    tenant: str = "default",
    model: str | None = None,
    memory_mib: int = 0,
    submit: float = 0.0,
    job_id: str | None = None,
) -> Job:
    spec = JobSpec(
        name=f"j{next(_ids)}",
        command=("true",),
        user="alice",
        kind=JobKind.TRAINING if gpus else JobKind.CPU,
        tenant=tenant,
        gpus=gpus,
        gpu_model=model,
        cpus=cpus,
        memory_mib=memory_mib,
    )
    return Job(id=job_id or spec.name, spec=spec, submit_time=submit)


def make_core(policy: Policy, nodes: Iterable[NodeInventory]) -> SchedulingCore:
    core = SchedulingCore(policy)
    for inv in nodes:
        core.node_up(inv)
    return core


def run_pass(core: SchedulingCore, now: float) -> list[Decision]:
    """One scheduling pass; every started part reports running at ``now``."""
    applied = core.schedule(now)
    for decision in applied:
        if isinstance(decision, Start):
            for node in decision.placement.nodes:
                core.node_started(decision.job_id, node, now)
    return applied


def finish(core: SchedulingCore, job_id: str, now: float) -> None:
    job = core.jobs[job_id]
    assert job.placement is not None
    for node in job.placement.nodes:
        core.node_exited(job_id, node, 0, None, now)
    assert job.state is JobState.FINISHED


def complete_preemption(core: SchedulingCore, job_id: str, now: float) -> None:
    """The node killed the preempted job's parts (SIGTERM): the core re-queues it."""
    job = core.jobs[job_id]
    assert job.placement is not None
    for node in job.placement.nodes:
        core.node_exited(job_id, node, None, 15, now)
    assert job.state is JobState.QUEUED, job.state


def starts(decisions: Iterable[Decision]) -> dict[str, Start]:
    return {d.job_id: d for d in decisions if isinstance(d, Start)}


def preempts(decisions: Iterable[Decision]) -> dict[str, Preempt]:
    return {d.job_id: d for d in decisions if isinstance(d, Preempt)}
