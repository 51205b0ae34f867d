"""What becomes of a job whose node is lost or whose GPU fails: requeued or ended node_lost.

Slurm's rules, written once for the master (masterd/features/failures.py drives them from
timers and node reports) and the simulator (sim/engine.py drives them from its outages):

* A job may be requeued unless it says otherwise: ``JobSpec.stop.requeue``
  (``trellisctl submit --requeue`` / ``--no-requeue``; Slurm's ``--requeue``), else the
  master's ``requeue_default`` (Slurm's ``JobRequeue``).
* It is requeued at most ``max_requeues`` times (Slurm's ``MaxBatchRequeue``); after that a
  failure ends it ``node_lost``, as does any failure of a job that may not be requeued.
* A requeued job keeps its place in the order (SchedulingCore.requeue: its own priority and
  submission time, not the head-of-array place a preempted job gets) and runs again with
  its restart count one higher (``TRELLIS_RESTART_COUNT`` on the node).

Plain and synchronous: no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from shared.model import Job, JobSpec, JobState

# The restart count a job's processes see: 0 on its first run, n after n requeues.
RESTART_COUNT_ENV = "TRELLIS_RESTART_COUNT"


@dataclass(frozen=True)
class RequeueRules:
    """The master's configuration of requeues (``requeue_default``, ``max_requeues``)."""

    requeue_default: bool = True
    max_requeues: int = 5

    @classmethod
    def of(cls, config: Any) -> RequeueRules:
        """The rules a master's configuration sets (``requeue_default``, ``max_requeues``)."""
        return cls(config.requeue_default, config.max_requeues)


@dataclass(frozen=True)
class Verdict:
    """What to do with a job a failure hit: ``requeue`` it, or end it ``node_lost``; the
    sentence is the job's reason either way."""

    requeue: bool
    reason: str

    @property
    def end_as(self) -> JobState:
        return JobState.QUEUED if self.requeue else JobState.NODE_LOST


def _wanted(spec: JobSpec) -> bool | None:
    """The job's own word, or None when it gave none (the master's default applies)."""
    return spec.stop.requeue


def may_requeue(spec: JobSpec, rules: RequeueRules) -> bool:
    wanted = _wanted(spec)
    return rules.requeue_default if wanted is None else wanted


def verdict(job: Job, cause: str, rules: RequeueRules) -> Verdict:
    """Requeue or end ``job``, hit by ``cause`` (a sentence: "node gpu-3 lost")."""
    wanted = _wanted(job.spec)
    if wanted is False or (wanted is None and not rules.requeue_default):
        why = "--no-requeue" if wanted is False else "requeue_default = false"
        return Verdict(False, f"{cause}; the job may not be requeued ({why})")
    if job.restarts >= rules.max_requeues:
        return Verdict(False, f"{cause}; not requeued again: it was requeued {job.restarts} "
                              f"time(s), max_requeues is {rules.max_requeues}")
    return Verdict(True, f"{cause}; requeued (restart {job.restarts + 1} of at most "
                         f"{rules.max_requeues})")


def node_lost_cause(node: str, silent_s: float | None, since_takeover: bool = False) -> str:
    """Why ``node``'s jobs are settled. ``silent_s`` None: the node failed outright (a
    replay's trace says so); ``since_takeover``: the master counted from when it began
    leading (a restart or a failover), not from the node's last word, which it never saw."""
    if silent_s is None:
        return f"node {node} lost (it failed)"
    if since_takeover:
        return (f"node {node} lost (no contact in the {silent_s:.0f} s since this master "
                "began leading)")
    return f"node {node} lost (no contact for {silent_s:.0f} s)"


def gpu_failed_cause(node: str, index: int, reason: str) -> str:
    return f"GPU {index} of node {node} failed: {reason}"


def lost_parts(job: Job, node: str) -> bool:
    """Whether ``job`` has a part on ``node`` that has not exited (a lost node's part will
    never report its exit: it is counted as exited when the node is declared lost)."""
    state = job.node_states.get(node)
    return state is not None and state != "exited"


def jobs_on_node(jobs: Iterable[Job], node: str) -> list[Job]:
    """The starting or running jobs with a live part on ``node``, in id order (a stable
    order, so the master and the simulator act on them alike)."""
    return sorted((j for j in jobs if lost_parts(j, node)), key=lambda j: j.id)


def jobs_on_gpu(jobs: Iterable[Job], node: str, index: int) -> list[Job]:
    """The starting or running jobs whose allocation on ``node`` includes GPU ``index``."""
    found = []
    for job in jobs:
        if job.placement is None or not lost_parts(job, node):
            continue
        if any(a.node == node and index in a.gpus for a in job.placement.allocations):
            found.append(job)
    return sorted(found, key=lambda j: j.id)


def restart_env(restarts: int) -> Mapping[str, str]:
    """What a job part's environment says of its restarts."""
    return {RESTART_COUNT_ENV: str(restarts)}
