"""Min-Min baseline (GENIE §7.1, after Braun et al.): earliest expected completion time first.

Jobs are ordered by their ECT (Eq. 9, or the job's deadline), ties by queue order, and placed
as asked (``spec.gpus``, packed) like a black box; a job that does not fit is skipped.
"""

from __future__ import annotations

from collections.abc import Sequence

from masterd.core.cluster import ClusterSnapshot
from masterd.core.genie.plan import JobPlan
from masterd.core.policies.launching import start_packed
from masterd.core.policies.predicting import PredictingPolicy
from masterd.core.policy import Decision
from shared.model import Job


class MinMinPolicy(PredictingPolicy):
    name = "min-min"

    def plan_decisions(
        self,
        snapshot: ClusterSnapshot,
        queue: Sequence[Job],
        plans: dict[str, JobPlan],
        now: float,
    ) -> list[Decision]:
        position = {job.id: i for i, job in enumerate(queue)}
        ordered = sorted(queue, key=lambda j: (plans[j.id].ect, position[j.id]))
        return start_packed(snapshot, ordered)
