"""Tetris+Perf and Tetris+CER baselines (GENIE §7.1): model-driven placement, QoS-blind order.

Both serve jobs in queue order and skip a job whose placement does not fit now (Tetris packs
what fits rather than blocking). Tetris+Perf gives each job its highest-processing-rate
placement (Eq. 5); Tetris+CER its highest cost-effective-ratio placement (Eq. 11). Neither
looks at ECTs. CPU-only jobs follow, packed, in queue order.
"""

from __future__ import annotations

from collections.abc import Sequence

from masterd.core.cluster import ClusterSnapshot
from masterd.core.genie.plan import Candidate, JobPlan
from masterd.core.placement import FreePool
from masterd.core.policies.launching import start_packed, start_shapes
from masterd.core.policies.predicting import PredictingPolicy
from masterd.core.policy import Decision
from shared.model import Job


class _TetrisPolicy(PredictingPolicy):
    def pick(self, plan: JobPlan) -> Candidate | None:
        raise NotImplementedError

    def plan_decisions(
        self,
        snapshot: ClusterSnapshot,
        queue: Sequence[Job],
        plans: dict[str, JobPlan],
        now: float,
    ) -> list[Decision]:
        choices: list[tuple[Job, Candidate]] = []
        for job in queue:
            if job.spec.gpus:
                c = self.pick(plans[job.id])
                if c is not None:
                    choices.append((job, c))
        pool = FreePool(snapshot)
        decisions = start_shapes(snapshot, choices, pool)
        decisions += start_packed(snapshot, [j for j in queue if j.spec.gpus == 0], pool)
        return decisions


class TetrisPerfPolicy(_TetrisPolicy):
    name = "tetris-perf"

    def pick(self, plan: JobPlan) -> Candidate | None:
        fastest = plan.table.fastest
        return plan.candidates[fastest] if fastest >= 0 else None


class TetrisCerPolicy(_TetrisPolicy):
    name = "tetris-cer"

    def pick(self, plan: JobPlan) -> Candidate | None:
        return plan.candidates[0] if plan.candidates else None
