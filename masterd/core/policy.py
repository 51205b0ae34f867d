"""The interface every scheduling policy implements: ``decide(snapshot, queue, now)``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from masterd.core.cluster import ClusterSnapshot
from shared.model import Job, Placement


@dataclass(frozen=True)
class Start:
    """Start a queued job on exactly these resources."""

    job_id: str
    placement: Placement


@dataclass(frozen=True)
class Preempt:
    """Stop a running job, free its resources and re-queue it at the head of its array.

    A priority class's preemption (masterd/core/preemption.py) instead warns the job and
    gives it ``grace_s`` before the kill, and requeues it in its own place with ``restarts``
    + 1 (``in_place``), as a node loss does."""

    job_id: str
    reason: str
    grace_s: float | None = None  # None: the job's own stop grace
    in_place: bool = False


Decision = Start | Preempt
# A preempted job's reason begins so, the decision's reason after it.
PREEMPTED_PREFIX = "preempted: "


class Policy(Protocol):
    """A scheduling policy. ``decide`` must be pure with respect to its inputs and its own
    caches: same snapshot, queue and ``now`` give the same decisions."""

    name: str

    def decide(
        self, snapshot: ClusterSnapshot, queue: Sequence[Job], now: float
    ) -> list[Decision]: ...
