"""Which waiting jobs Liquid schedules together (batch mode, §5.3).

Jobs of at least ``min_tasks`` tasks are batched: the first such job to arrive opens a window
of ``window_s`` seconds, every such job arriving before it closes joins the batch, and the
batch is scheduled when the window closes (the next such job opens a new window). A job that
could not be placed when its window closed waits and joins the next batch scheduled. Windows
follow from submission times alone, so a restarted master forms the same batches.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from shared.model import Job


@dataclass(frozen=True)
class Windows:
    closes: dict[str, float]  # job id -> when its batch is scheduled

    def ready(self, job_id: str, now: float) -> bool:
        return now >= self.closes[job_id]

    def next_close(self, now: float) -> float | None:
        later = [t for t in self.closes.values() if t > now]
        return min(later) if later else None


def batch_windows(jobs: Iterable[Job], window_s: float) -> Windows:
    """``jobs``: the waiting multi-task jobs (any order)."""
    closes: dict[str, float] = {}
    start: float | None = None
    for job in sorted(jobs, key=lambda j: (j.submit_time, j.id)):
        if start is None or job.submit_time >= start + window_s:
            start = job.submit_time
        closes[job.id] = start + window_s
    return Windows(closes)
