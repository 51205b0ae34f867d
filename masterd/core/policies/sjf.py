"""Shortest (predicted) Job First: order by GENIE's predicted latency of the job as asked.

The prediction is ``Lat(t, s)`` (Eq. 4) on exactly ``spec.gpus`` GPUs over the fewest nodes,
falling back to the single-GPU latency divided by the GPU count when the model has no such
shape; CPU-only jobs use their default-rate estimate. Ties go to queue order. Jobs are placed
as asked (packed) and skipped when they do not fit.
"""

from __future__ import annotations

from collections.abc import Sequence

from masterd.core.cluster import ClusterSnapshot
from masterd.core.genie.plan import JobPlan
from masterd.core.policies.launching import start_packed
from masterd.core.policies.predicting import PredictingPolicy
from masterd.core.policy import Decision
from shared.model import Job


class SjfPolicy(PredictingPolicy):
    name = "sjf"

    def plan_decisions(
        self,
        snapshot: ClusterSnapshot,
        queue: Sequence[Job],
        plans: dict[str, JobPlan],
        now: float,
    ) -> list[Decision]:
        position = {job.id: i for i, job in enumerate(queue)}
        predicted = {
            job.id: plans[job.id].latency_as_requested(job.spec.gpus) for job in queue
        }
        ordered = sorted(queue, key=lambda j: (predicted[j.id], position[j.id]))
        return start_packed(snapshot, ordered)
