"""Bodies of the messages on the node channel; each is decoded with :func:`shared.schema.decode`.

Node → master: ``hello``, ``job_started``, ``job_exited``, ``gpu_util``, ``gpu_health``,
``contention``.
Master → node: ``prepare_job``, ``start_job``, ``stop_job``, ``forget_job``.
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.model import NAME_PATTERN, JobSpec, NodeAllocation, NodeInventory
from shared.schema import bounded


@dataclass(frozen=True)
class JobReport:
    """What a node knows about one job when it (re)connects."""

    job_id: str = bounded(pattern=NAME_PATTERN)
    state: str = bounded(pattern=r"prepared|running|exited")
    pid: int | None = None
    exit_code: int | None = None
    signal: int | None = None


@dataclass(frozen=True)
class Hello:
    inventory: NodeInventory
    jobs: tuple[JobReport, ...] = bounded(default_factory=tuple, max_len=10_000)
    version: str = bounded("", max_len=64)


@dataclass(frozen=True)
class JobStarted:
    job_id: str = bounded(pattern=NAME_PATTERN)
    pid: int = bounded(min=1)


@dataclass(frozen=True)
class JobExited:
    job_id: str = bounded(pattern=NAME_PATTERN)
    exit_code: int | None = None
    signal: int | None = None


@dataclass(frozen=True)
class GpuUtil:
    index: int = bounded(min=0, max=1023)
    utilization_pct: float = bounded(min=0, max=100)
    band: str = bounded(pattern=r"idle|low|medium|high")
    job_id: str | None = bounded(None, pattern=NAME_PATTERN)


@dataclass(frozen=True)
class GpuHealth:
    index: int = bounded(min=0, max=1023)
    healthy: bool = True
    reason: str = bounded("", max_len=512)


CONTENTION_ACTIONS = r"mba|cores|restore_mba|restore_cores"


@dataclass(frozen=True)
class Contention:
    """The node's contention eliminator changed a job's share (SODA V-E).

    ``value`` is the new setting: for ``mba``/``restore_mba`` the job's memory-bandwidth level in
    percent of unthrottled, for ``cores``/``restore_cores`` the number of cores it keeps.
    """

    job_id: str = bounded(pattern=NAME_PATTERN)
    action: str = bounded(pattern=CONTENTION_ACTIONS)
    value: int = bounded(min=0, max=1 << 20)
    reason: str = bounded("", max_len=512)
    previous: int | None = bounded(None, min=0, max=1 << 20)


@dataclass(frozen=True)
class PrepareJob:
    job_id: str = bounded(pattern=NAME_PATTERN)
    spec: JobSpec
    allocation: NodeAllocation
    node_rank: int = bounded(0, min=0)
    nnodes: int = bounded(1, min=1)


@dataclass(frozen=True)
class StartJob:
    job_id: str = bounded(pattern=NAME_PATTERN)
    master_addr: str = bounded(max_len=255)
    master_port: int = bounded(min=1, max=65535)


@dataclass(frozen=True)
class StopJob:
    job_id: str = bounded(pattern=NAME_PATTERN)
    grace_s: float = bounded(10.0, min=0, max=3600)
    reason: str = bounded("", max_len=256)


@dataclass(frozen=True)
class ForgetJob:
    """The master has durably recorded the job's exit; the node may drop its state."""

    job_id: str = bounded(pattern=NAME_PATTERN)


NODE_EVENTS = {
    "hello": Hello,
    "job_started": JobStarted,
    "job_exited": JobExited,
    "gpu_util": GpuUtil,
    "gpu_health": GpuHealth,
    "contention": Contention,
}
NODE_COMMANDS = {
    "prepare_job": PrepareJob,
    "start_job": StartJob,
    "stop_job": StopJob,
    "forget_job": ForgetJob,
}


def utilisation_band(pct: float) -> str:
    if pct < 5:
        return "idle"
    if pct < 30:
        return "low"
    if pct < 70:
        return "medium"
    return "high"
