"""Weighted Fair baseline (GENIE §7.1): order by a weighted mean of arrival time and ECT.

``key = weight·submit_time + (1 − weight)·ECT``, smallest first (ties by queue order); jobs are
placed as asked (``spec.gpus``, packed) and skipped when they do not fit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from masterd.core.cluster import ClusterSnapshot
from masterd.core.genie.modeldb import ModelDB
from masterd.core.genie.plan import JobPlan
from masterd.core.policies.launching import start_packed
from masterd.core.policies.predicting import PredictingPolicy
from masterd.core.policy import Decision
from shared.model import Job


class WeightedFairPolicy(PredictingPolicy):
    name = "weighted-fair"

    def __init__(
        self,
        weight: float = 0.5,
        modeldb: ModelDB | str | Path | None = None,
        theta: float = 0.4,
        shape_mode: str = "cap",
        default_rate: float = 100.0,
        default_duration_s: float = 3600.0,
    ) -> None:
        if isinstance(weight, bool) or not isinstance(weight, int | float) or not (
            math.isfinite(weight) and 0.0 <= weight <= 1.0
        ):
            raise ValueError(f"weight must be a number in [0, 1], got {weight!r}")
        super().__init__(modeldb, theta, shape_mode, default_rate, default_duration_s)
        self.weight = float(weight)

    def plan_decisions(
        self,
        snapshot: ClusterSnapshot,
        queue: Sequence[Job],
        plans: dict[str, JobPlan],
        now: float,
    ) -> list[Decision]:
        w = self.weight
        position = {job.id: i for i, job in enumerate(queue)}
        ordered = sorted(
            queue,
            key=lambda j: (w * j.submit_time + (1.0 - w) * plans[j.id].ect, position[j.id]),
        )
        return start_packed(snapshot, ordered)
