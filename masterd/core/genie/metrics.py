"""Evaluation metrics of GENIE §7.1: QoS-guarantee percentage, makespan, normalised latency.

Plain functions over finished jobs, for the trace-driven simulator and for reports.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class JobOutcome:
    """What the metrics need about one finished task (all times in seconds)."""

    submit_time: float
    start_time: float
    end_time: float
    ect: float  # absolute expected completion time (Eq. 9 or the job's deadline)
    single_gpu_latency: float  # Lat(t, <1,1>) predicted by the model (Eq. 4)

    def __post_init__(self) -> None:
        if not self.submit_time <= self.start_time <= self.end_time:
            raise ValueError(
                f"times must satisfy submit <= start <= end, got submit={self.submit_time} "
                f"start={self.start_time} end={self.end_time}"
            )
        if not self.single_gpu_latency > 0:
            raise ValueError(
                f"single_gpu_latency must be > 0, got {self.single_gpu_latency}"
            )

    @property
    def runtime(self) -> float:
        return self.end_time - self.start_time

    @property
    def response(self) -> float:
        return self.end_time - self.submit_time


def qos_met(outcome: JobOutcome) -> bool:
    """A task meets its QoS when it completes no later than its ECT."""
    return outcome.end_time <= outcome.ect


def qos_guarantee(outcomes: Iterable[JobOutcome]) -> float:
    """Eq. 14: the fraction of scheduled tasks completed by their ECT (0..1)."""
    done = list(outcomes)
    if not done:
        raise ValueError("qos_guarantee needs at least one finished task")
    return sum(1 for o in done if qos_met(o)) / len(done)


def makespan(outcomes: Iterable[JobOutcome]) -> float:
    """From the first submission to the last completion."""
    done = list(outcomes)
    if not done:
        raise ValueError("makespan needs at least one finished task")
    return max(o.end_time for o in done) - min(o.submit_time for o in done)


def normalised_latency(wall_seconds: float, single_gpu_latency: float) -> float:
    """Eq. 16: a task's walltime over its predicted single-GPU latency."""
    if not single_gpu_latency > 0:
        raise ValueError(f"single_gpu_latency must be > 0, got {single_gpu_latency}")
    return wall_seconds / single_gpu_latency


def average_normalised_latency(
    outcomes: Sequence[JobOutcome] | Iterable[JobOutcome], include_wait: bool = False
) -> float:
    """Eq. 15: the mean of Eq. 16 over tasks.

    The paper's walltime is the run under the chosen placement (``end − start``);
    ``include_wait=True`` uses the response time from submission instead.
    """
    done = list(outcomes)
    if not done:
        raise ValueError("average_normalised_latency needs at least one finished task")
    total = 0.0
    for o in done:
        wall = o.response if include_wait else o.runtime
        total += normalised_latency(wall, o.single_gpu_latency)
    return total / len(done)
