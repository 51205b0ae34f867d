"""Slurm's names for what noded tells a job (``LaunchSpec.slurm_env``; docs/slurm.md).

One table: each Slurm variable and where its value comes from, read from the job's Trellis
environment (so the two can never disagree) or its spec. Trellis runs one task per node of a
job, so a task's rank is its node's rank and a job has as many tasks as nodes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from shared.messages import PrepareJob


@dataclass(frozen=True)
class Part:
    """What the table reads: the job's Trellis variables and its part on this node."""

    env: dict[str, str]
    prepare: PrepareJob
    node: str


def _array_id(p: Part) -> str | None:
    return p.prepare.spec.array.id if p.prepare.spec.array is not None else None


def _array_index(p: Part) -> str | None:
    array = p.prepare.spec.array
    return str(array.index) if array is not None else None


def _nodelist(p: Part) -> str:
    # Slurm's compressed hostlist ("n[1-2]") is not needed: a comma list is a hostlist too.
    return ",".join(p.prepare.nodes) if p.prepare.nodes else p.node


# Slurm's name -> its value (None: not set for this job).
TABLE: dict[str, Callable[[Part], str | None]] = {
    "SLURM_JOB_ID": lambda p: p.env["TRELLIS_JOB_ID"],
    "SLURM_JOBID": lambda p: p.env["TRELLIS_JOB_ID"],
    "SLURM_JOB_NAME": lambda p: p.prepare.spec.name,
    "SLURM_JOB_USER": lambda p: p.prepare.spec.user,
    "SLURM_JOB_ACCOUNT": lambda p: p.prepare.spec.tenant,
    "SLURM_JOB_QOS": lambda p: p.prepare.spec.qos.value,
    "SLURM_ARRAY_JOB_ID": _array_id,
    "SLURM_ARRAY_TASK_ID": _array_index,
    "SLURM_ARRAY_TASK_COUNT": lambda p: p.env.get("TRELLIS_ARRAY_COUNT") if _array_id(p)
    else None,
    "SLURM_JOB_NUM_NODES": lambda p: p.env["NNODES"],
    "SLURM_NNODES": lambda p: p.env["NNODES"],
    "SLURM_NODEID": lambda p: p.env["NODE_RANK"],
    "SLURM_PROCID": lambda p: p.env["NODE_RANK"],
    "SLURM_LOCALID": lambda p: "0",
    "SLURM_NTASKS": lambda p: p.env["NNODES"],
    "SLURM_NPROCS": lambda p: p.env["NNODES"],
    "SLURM_NTASKS_PER_NODE": lambda p: "1",
    "SLURM_TASKS_PER_NODE": lambda p: f"1(x{p.env['NNODES']})" if p.env["NNODES"] != "1"
    else "1",
    "SLURM_CPUS_PER_TASK": lambda p: str(len(p.prepare.allocation.cpus) or 1),
    "SLURM_CPUS_ON_NODE": lambda p: str(len(p.prepare.allocation.cpus) or 1),
    "SLURM_MEM_PER_NODE": lambda p: str(p.prepare.allocation.memory_mib)
    if p.prepare.allocation.memory_mib else None,
    "SLURM_JOB_NODELIST": _nodelist,
    "SLURM_NODELIST": _nodelist,
    "SLURMD_NODENAME": lambda p: p.node,
    "SLURM_TOPOLOGY_ADDR": lambda p: p.node,
    "SLURM_SUBMIT_DIR": lambda p: p.env.get("TRELLIS_SUBMIT_DIR"),
    "SLURM_GPUS": lambda p: str(p.prepare.spec.gpus) if p.prepare.spec.gpus else None,
    "SLURM_GPUS_ON_NODE": lambda p: str(len(p.prepare.allocation.gpus))
    if p.prepare.allocation.gpus else None,
    "SLURM_JOB_GPUS": lambda p: p.env["CUDA_VISIBLE_DEVICES"] or None,
    "SLURM_STEP_GPUS": lambda p: p.env["CUDA_VISIBLE_DEVICES"] or None,
    "SLURM_RESTART_COUNT": lambda p: p.env["TRELLIS_RESTART_COUNT"],
    "SLURM_CLUSTER_NAME": lambda p: "trellis",
}


def slurm_variables(env: dict[str, str], prepare: PrepareJob, node: str) -> dict[str, str]:
    """The Slurm variables of a job part whose Trellis environment is ``env``."""
    part = Part(env, prepare, node)
    found = {name: value(part) for name, value in TABLE.items()}
    return {name: value for name, value in found.items() if value is not None}
