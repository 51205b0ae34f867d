"""Shortest (predicted) Job First: order by GENIE's predicted latency of the job as asked.

The prediction is ``Lat(t, s)`` (Eq. 4) on exactly ``spec.gpus`` GPUs over the fewest nodes,
falling back to the single-GPU latency divided by the GPU count when the model has no such
shape; CPU-only jobs use their default-rate estimate. Ties go to queue order. Jobs are placed
as asked (packed) and skipped when they do not fit.

Helios' SJF (§4.2.3) differs in three ways, each an option: ``rank="recorded"`` orders by the
trace's recorded duration (the job annotation ``recorded_duration_s``, which replays attach;
a job without one ranks last), ``backfill=False`` stops the pass at the first job that does
not fit instead of skipping it, and ``placement="consolidate"`` places as Helios does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from masterd.core.cluster import ClusterSnapshot
from masterd.core.consolidate import check_placement, start_in_order
from masterd.core.fairorder import fair_key
from masterd.core.genie.modeldb import ModelDB
from masterd.core.genie.plan import JobPlan
from masterd.core.helios.estimate import RECORDED_KEY
from masterd.core.policies.launching import start_packed
from masterd.core.policies.predicting import PredictingPolicy
from masterd.core.policy import Decision
from shared.model import Job

RANKS = ("predicted", "recorded")


class SjfPolicy(PredictingPolicy):
    name = "sjf"

    def __init__(self, modeldb: ModelDB | str | Path | None = None, theta: float = 0.4,
                 shape_mode: str = "cap", default_rate: float = 100.0,
                 default_duration_s: float = 3600.0, rank: str = "predicted",
                 backfill: bool = True, placement: str = "pack") -> None:
        super().__init__(modeldb, theta, shape_mode, default_rate, default_duration_s)
        if rank not in RANKS:
            raise ValueError(f"rank must be one of {', '.join(RANKS)}, got {rank!r}")
        self.rank = rank
        self.backfill = backfill
        self.placement = check_placement(placement)

    def decide(
        self, snapshot: ClusterSnapshot, queue: Sequence[Job], now: float
    ) -> list[Decision]:
        if self.rank == "recorded":  # no model needed: skip GENIE's plans
            return self.plan_decisions(snapshot, queue, {}, now)
        return super().decide(snapshot, queue, now)

    def plan_decisions(
        self,
        snapshot: ClusterSnapshot,
        queue: Sequence[Job],
        plans: dict[str, JobPlan],
        now: float,
    ) -> list[Decision]:
        position = {job.id: i for i, job in enumerate(queue)}
        if self.rank == "recorded":
            predicted = {job.id: job.annotations.get(RECORDED_KEY, math.inf) for job in queue}
        else:
            predicted = {
                job.id: plans[job.id].latency_as_requested(job.spec.gpus) for job in queue
            }
        ordered = sorted(queue, key=lambda j: (fair_key(j), predicted[j.id], position[j.id]))
        if self.backfill and self.placement == "pack":
            return start_packed(snapshot, ordered)
        return start_in_order(snapshot, ordered, self.placement, self.backfill)
