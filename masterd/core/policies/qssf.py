"""Quasi-Shortest-Service-First (Helios §4.2, Algorithm 1).

Priority = requested GPUs × estimated duration, smallest first (ties: queue order). Jobs are
placed consolidated (:mod:`masterd.core.consolidate`) and, as Algorithm 1 does, the pass
stops at the first job that does not fit: a large job with a small estimate is not starved
by the small jobs behind it (``backfill=True`` lets later jobs use what it cannot).

The estimate is read from the job's annotations (``duration_estimate_s``), which the master's
estimator feature attaches at submission and refreshes after each retraining; a replay
attaches them from its own estimate. A job without one ranks as ``default_estimate_s``.
"""

from __future__ import annotations

from collections.abc import Sequence

from masterd.core.cluster import ClusterSnapshot
from masterd.core.consolidate import check_placement, start_in_order
from masterd.core.fairorder import fair_key
from masterd.core.helios.estimate import ESTIMATE_KEY
from masterd.core.policy import Decision
from shared.model import Job


class QssfPolicy:
    name = "qssf"

    def __init__(self, placement: str = "consolidate", backfill: bool = False,
                 default_estimate_s: float = 3600.0) -> None:
        self.placement = check_placement(placement)
        self.backfill = backfill
        if not default_estimate_s > 0:
            raise ValueError(f"default_estimate_s must be positive, got {default_estimate_s!r}")
        self.default_estimate_s = default_estimate_s

    def priority(self, job: Job) -> float:
        """Expected GPU time: what QSSF ranks by."""
        estimate = job.annotations.get(ESTIMATE_KEY, self.default_estimate_s)
        return max(job.spec.gpus, 1) * estimate

    def decide(
        self, snapshot: ClusterSnapshot, queue: Sequence[Job], now: float
    ) -> list[Decision]:
        order = sorted(enumerate(queue),
                       key=lambda entry: (fair_key(entry[1]), self.priority(entry[1]), entry[0]))
        return start_in_order(snapshot, (job for _, job in order), self.placement,
                              self.backfill)
