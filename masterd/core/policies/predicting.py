"""Base for baseline policies that consult GENIE's prediction model (ECTs, latencies, CER)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from masterd.core.cluster import ClusterSnapshot
from masterd.core.genie.modeldb import ModelDB
from masterd.core.genie.options import genie_setup
from masterd.core.genie.plan import Estimator, JobPlan, PlanCache
from masterd.core.policy import Decision
from shared.model import Job


class PredictingPolicy:
    """Holds the model database, GENIE settings and a per-job plan cache.

    Subclasses implement ``plan_decisions``; the options are the same as ``SwafPolicy``'s so
    every GENIE-family policy can be configured alike.
    """

    name = "predicting"

    def __init__(
        self,
        modeldb: ModelDB | str | Path | None = None,
        theta: float = 0.4,
        shape_mode: str = "cap",
        default_rate: float = 100.0,
        default_duration_s: float = 3600.0,
    ) -> None:
        db, settings = genie_setup(modeldb, theta, shape_mode, default_rate, default_duration_s)
        self.settings = settings
        self._plans = PlanCache(Estimator(db, settings))

    def decide(
        self, snapshot: ClusterSnapshot, queue: Sequence[Job], now: float
    ) -> list[Decision]:
        plans = self._plans.plans(snapshot, queue)
        return self.plan_decisions(snapshot, queue, plans, now)

    def plan_decisions(
        self,
        snapshot: ClusterSnapshot,
        queue: Sequence[Job],
        plans: dict[str, JobPlan],
        now: float,
    ) -> list[Decision]:
        raise NotImplementedError
