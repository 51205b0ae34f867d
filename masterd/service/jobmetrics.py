"""What jobs report on their metrics channel, as the master keeps it.

Nodes relay ``job_metric`` events (noded/metrics_channel.py). The master accepts one only for a
job that is running on the sending node, at most one per job, name and ``min_interval_s``
(a node misbehaving cannot make the master do more work than that), and keeps the latest
values of at most ``max_jobs`` jobs in memory — for ``trellisctl show`` and the profiler. They
are not journalled: a rate is a measurement, and the profiler stores what it derives from it.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from shared.messages import JobMetric
from shared.model import Job, JobState

log = logging.getLogger("trellis.master.metrics")

MAX_NAMES = 8


@dataclass
class MetricValue:
    value: float
    last: float
    count: int  # lines behind every accepted event, summed
    time: float
    node: str


class JobMetrics:
    def __init__(
        self,
        clock: Callable[[], float],
        sink: Callable[[Job, str, JobMetric], None] | None = None,
        min_interval_s: float = 0.2,
        max_jobs: int = 10_000,
    ) -> None:
        self.clock = clock
        self.sink = sink
        self.min_interval_s = min_interval_s
        self.max_jobs = max_jobs
        self._values: OrderedDict[str, dict[str, MetricValue]] = OrderedDict()
        # Per job: (node, name) -> when the last report was accepted. Keyed by job first so
        # dropping a job is one pop, not a scan of every job's entries.
        self._last: dict[str, dict[tuple[str, str], float]] = {}
        self.dropped = 0

    def on_event(self, node: str, metric: JobMetric, job: Job | None) -> bool:
        """Accept (True) or drop one relayed report."""
        if (
            job is None
            or job.state not in (JobState.STARTING, JobState.RUNNING)
            or node not in job.node_states
        ):
            self.dropped += 1
            log.debug("node=%s job=%s metric=%s dropped: not running there", node,
                      metric.job_id, metric.name)
            return False
        now = self.clock()
        key = (node, metric.name)
        last = self._last.get(job.id, {}).get(key)
        if last is not None and now - last < self.min_interval_s:
            self.dropped += 1
            return False
        values = self._values.get(job.id)
        if values is None:
            values = self._values[job.id] = {}
            while len(self._values) > self.max_jobs:
                gone, _ = self._values.popitem(last=False)
                self._last.pop(gone, None)
        else:
            self._values.move_to_end(job.id)
        if metric.name not in values and len(values) >= MAX_NAMES:
            self.dropped += 1
            return False
        self._last.setdefault(job.id, {})[key] = now
        previous = values.get(metric.name)
        values[metric.name] = MetricValue(
            metric.value, metric.last, metric.count + (previous.count if previous else 0), now,
            node,
        )
        if self.sink is not None:
            self.sink(job, node, metric)
        return True

    def forget(self, job_id: str) -> None:
        """Drop a job's values (the master forgot the ended job)."""
        self._values.pop(job_id, None)
        self._last.pop(job_id, None)

    def __len__(self) -> int:
        """Jobs with values kept."""
        return len(self._values)

    def of(self, job_id: str) -> dict[str, dict[str, Any]]:
        return {
            name: {"value": v.value, "last": v.last, "count": v.count, "time": v.time,
                   "node": v.node}
            for name, v in sorted(self._values.get(job_id, {}).items())
        }
