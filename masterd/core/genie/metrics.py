"""Evaluation metrics of GENIE §7.1: QoS-guarantee percentage, makespan, normalised latency.

Plain functions over the tasks a scheduler was given, the one implementation of Eq. 14–16:
the trace-driven simulator (``sim.metrics``) reports them, and anything else that needs them
should call these too. A metric with nothing to measure is ``None`` (undefined), not an error.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class TaskOutcome:
    """What the metrics need about one scheduled task (all times in seconds).

    ``start_time`` is the first start (``None``: never started); ``end_time`` the successful
    completion (``None``: the task failed, was cancelled or had not finished). Walltime runs
    from the first start, so time lost to preemption after it counts; queueing before it not.
    """

    submit_time: float
    ect: float  # absolute expected completion time (Eq. 9 or the job's deadline)
    single_gpu_latency: float  # Lat(t, <1,1>), Eq. 16's denominator; 0 for a task with no work
    start_time: float | None = None
    end_time: float | None = None

    def __post_init__(self) -> None:
        if self.end_time is not None and self.start_time is None:
            raise ValueError(f"a completed task needs a start time, got end={self.end_time}")
        times = [t for t in (self.submit_time, self.start_time, self.end_time) if t is not None]
        if times != sorted(times):
            raise ValueError(
                f"times must satisfy submit <= start <= end, got submit={self.submit_time} "
                f"start={self.start_time} end={self.end_time}"
            )
        if not self.single_gpu_latency >= 0:
            raise ValueError(
                f"single_gpu_latency must be >= 0, got {self.single_gpu_latency}"
            )

    @property
    def completed(self) -> bool:
        return self.end_time is not None

    @property
    def runtime(self) -> float | None:
        """Walltime under the chosen placement: first start to completion."""
        if self.end_time is None or self.start_time is None:
            return None
        return self.end_time - self.start_time

    @property
    def response(self) -> float | None:
        """Submission to completion (the job completion time)."""
        return None if self.end_time is None else self.end_time - self.submit_time


def qos_met(outcome: TaskOutcome) -> bool:
    """A task meets its QoS when it completes no later than its ECT.

    An urgent task's ECT is its submission instant, so it can never be met (the paper says as
    much); a task that never completed has not met it.
    """
    return outcome.end_time is not None and outcome.end_time <= outcome.ect


def qos_guarantee(outcomes: Iterable[TaskOutcome]) -> float | None:
    """Eq. 14: NUM_comp / NUM_task as a percentage (0..100) of the scheduled tasks given."""
    tasks = list(outcomes)
    if not tasks:
        return None
    return 100.0 * sum(qos_met(o) for o in tasks) / len(tasks)


def makespan(outcomes: Iterable[TaskOutcome]) -> float | None:
    """First submission to last completion, over the tasks that completed."""
    done = [(o.submit_time, o.end_time) for o in outcomes if o.end_time is not None]
    if not done:
        return None
    return max(end for _, end in done) - min(submit for submit, _ in done)


def normalised_latency(wall_seconds: float, single_gpu_latency: float) -> float:
    """Eq. 16: a task's walltime over its single-GPU latency Lat(t, <1,1>)."""
    if not single_gpu_latency > 0:
        raise ValueError(f"single_gpu_latency must be > 0, got {single_gpu_latency}")
    return wall_seconds / single_gpu_latency


def average_normalised_latency(
    outcomes: Iterable[TaskOutcome], include_wait: bool = False
) -> float | None:
    """Eq. 15: the mean of Eq. 16 over the completed tasks.

    The paper's walltime is the run under the chosen placement (first start to end);
    ``include_wait=True`` uses the response time from submission instead (the user's view,
    JCT / Lat(t, <1,1>), often called slowdown). Tasks whose Lat(t, <1,1>) is 0 have no
    defined Eq. 16 and are left out.
    """
    values: list[float] = []
    for o in outcomes:
        wall = o.response if include_wait else o.runtime
        if wall is not None and o.single_gpu_latency > 0:
            values.append(normalised_latency(wall, o.single_gpu_latency))
    return math.fsum(values) / len(values) if values else None
