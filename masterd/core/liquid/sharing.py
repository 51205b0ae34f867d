"""Fine-grained GPU sharing and pre-scheduling (Liquid §6.1–6.2).

Sharing: a job that gave ``gpu_milli`` (one GPU, one task) may join a GPU that other such
jobs hold when the predicted mean utilisations of all of them sum below ``util_limit`` (1.3
by default, Liquid's code) and their predicted peak GPU memory fits the GPU's memory (times
``memory_limit``). Only sharing jobs share: a GPU held by a whole-GPU job is never joined.

Pre-scheduling: a job whose GPU utilisation fell after training (it entered its post phase,
saving its model; the node reports it) lends its GPUs (``ClusterState.lend``). A lent GPU held
by that job alone is eligible for the next whole-GPU job by Liquid's rule: once the holder's
remaining time is within the next job's launching phase plus 15 s, i.e. ``elapsed > total -
post - next.pre - 15 s``. With the post phase observed, the holder has ``post - (now -
post_since)`` left; where the phase lengths are not predicted, the GPU is eligible as soon as
the post phase begins.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from masterd.core.liquid.demand import POST_S, POST_SINCE, PRE_S
from shared.model import Job

PRESCHEDULE_SLACK_S = 15.0


@dataclass(frozen=True)
class Holder:
    job_id: str
    util: float  # predicted mean utilisation, 0..1
    mem_mib: float | None
    sharing: bool  # a fractional job (else a whole-GPU job on a lent or pre-scheduled GPU)


@dataclass(frozen=True)
class SharingRule:
    util_limit: float = 1.3
    memory_limit: float = 1.0
    max_jobs_per_gpu: int | None = None

    def __post_init__(self) -> None:
        if not self.util_limit > 0:
            raise ValueError(f"sharing util_limit must be positive, got {self.util_limit}")
        if not self.memory_limit > 0:
            raise ValueError(f"sharing memory_limit must be positive, got {self.memory_limit}")
        if self.max_jobs_per_gpu is not None and self.max_jobs_per_gpu < 1:
            raise ValueError("sharing max_jobs_per_gpu must be at least 1")

    def admits(self, holders: list[Holder], util: float, mem_mib: float | None,
               gpu_memory_mib: int) -> bool:
        """May a sharing job of predicted ``util`` and ``mem_mib`` join these holders?"""
        if not holders or not all(h.sharing for h in holders):
            return False
        if self.max_jobs_per_gpu is not None and len(holders) + 1 > self.max_jobs_per_gpu:
            return False
        if sum(h.util for h in holders) + util >= self.util_limit:
            return False
        if gpu_memory_mib > 0:
            mems = [h.mem_mib for h in holders] + [mem_mib]
            if any(m is None for m in mems):
                return False  # memory unknown: Liquid's memory check cannot pass
            if sum(m for m in mems if m is not None) > gpu_memory_mib * self.memory_limit:
                return False
        return True


def lent_eligible(holder: Job, next_pre_s: float | None, now: float) -> tuple[bool, float | None]:
    """Whether a GPU lent by ``holder`` (alone on it) may take the next job now; if not, when
    it will be. ``next_pre_s``: the next job's predicted launching phase, if known."""
    notes: Mapping[str, float] = holder.annotations
    post, since = notes.get(POST_S), notes.get(POST_SINCE)
    if post is None or since is None:
        return True, None
    remaining = post - (now - since)
    allowance = (next_pre_s or 0.0) + PRESCHEDULE_SLACK_S
    # A wake-up computed as since + post - allowance lands here with float rounding: a
    # microsecond's tolerance keeps that pass from waking itself again.
    if remaining <= allowance + 1e-6:
        return True, None
    return False, now + (remaining - allowance)


def pre_phase(job: Job) -> float | None:
    return job.annotations.get(PRE_S)
