"""Time limits as arithmetic: when a running job is warned and stopped, what is due at a
time, the grace a stop gives, and whether a limit exceeds the master's maximum.

Plain and synchronous (no clock of its own): the master's time-limit feature
(masterd/features/timelimits.py) drives it from real timers, the simulator (sim/engine.py)
and EASY backfill (masterd/core/backfill.py) read the same deadlines.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

from shared.model import Job, JobSpec
from shared.slurmtime import format_time

WARN = "warn"
STOP = "stop"
_ACTIONS = (WARN, STOP)  # at the same instant a warning comes before the stop


@dataclass(frozen=True)
class Deadlines:
    """When a job started at ``start`` is warned (None: it asked for no warning) and
    stopped (None: it has no limit)."""

    warn_at: float | None
    stop_at: float | None


def deadlines(spec: JobSpec, start: float) -> Deadlines:
    """The limit counts from the start of the run; a warning that would come before the
    start (``--signal USR1@600`` on a 5-minute job) comes at the start."""
    limit = spec.time_limit_s
    if limit is None:
        return Deadlines(None, None)
    stop_at = start + limit
    warning = spec.stop.warning
    warn_at = None if warning is None else max(start, stop_at - warning.seconds)
    return Deadlines(warn_at, stop_at)


def end_by_limit(job: Job, now: float) -> float:
    """When a placed job ends at the latest by its limit (``math.inf`` without one). A job
    not yet running counts from ``now`` (its limit starts when it runs); one past its limit
    but still stopping ends ``now`` at the earliest."""
    limit = job.spec.time_limit_s
    if limit is None:
        return math.inf
    start = job.start_time if job.start_time is not None else now
    return max(now, start + limit)


def grace_for(spec: JobSpec, stop_grace_s: float, max_grace_s: float) -> float:
    """SIGTERM-to-SIGKILL grace of a job: its own ``stop.grace_s`` (0 allowed), else the
    master's ``stop_grace_s``, either capped at ``max_grace_s``."""
    own = spec.stop.grace_s
    wanted = stop_grace_s if own is None else own
    return min(wanted, max_grace_s)


def over_maximum(spec: JobSpec, max_time_limit_s: int) -> str | None:
    """The time_limit gate's sentence when the job's limit exceeds the maximum (0: none),
    else None. Slurm's PartitionTimeLimit: the job waits rather than being refused."""
    limit = spec.time_limit_s
    if not max_time_limit_s or limit is None or limit <= max_time_limit_s:
        return None
    return (f"time limit {format_time(limit)} exceeds the maximum "
            f"{format_time(max_time_limit_s)}")


def stop_reason(spec: JobSpec) -> str:
    return f"time limit {format_time(spec.time_limit_s)} reached"


class LimitSchedule:
    """What is due when, over many jobs: a heap of (time, job, action) where re-arming or
    disarming a job makes its older entries stale (dropped when they reach the top)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, int, str]] = []  # (time, action, version, job)
        self._armed: dict[str, tuple[int, Deadlines, bool]] = {}  # job -> (version, ...)
        self._version = 0

    def arm(self, job_id: str, due: Deadlines, warned: bool = False) -> None:
        """(Re)arm a job: its warning unless ``warned`` already, then its stop."""
        if due.stop_at is None:  # no limit (any more): nothing is due
            self.disarm(job_id)
            return
        self._version += 1
        version = self._version
        self._armed[job_id] = (version, due, warned)
        if due.warn_at is not None and not warned:
            heapq.heappush(self._heap, (due.warn_at, 0, version, job_id))
        heapq.heappush(self._heap, (due.stop_at, 1, version, job_id))

    def disarm(self, job_id: str) -> None:
        self._armed.pop(job_id, None)

    def armed(self, job_id: str) -> Deadlines | None:
        entry = self._armed.get(job_id)
        return None if entry is None else entry[1]

    def warned(self, job_id: str) -> bool:
        entry = self._armed.get(job_id)
        return entry is not None and entry[2]

    def __len__(self) -> int:
        return len(self._armed)

    def _live(self, entry: tuple[float, int, int, str]) -> bool:
        _, _, version, job_id = entry
        armed = self._armed.get(job_id)
        return armed is not None and armed[0] == version

    def next_time(self) -> float | None:
        """When the next action is due (None: nothing armed)."""
        heap = self._heap
        while heap and not self._live(heap[0]):
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def pop_due(self, now: float) -> list[tuple[str, str]]:
        """(job, action) of everything due by ``now``, in time order; a job stopped here is
        disarmed, a warned one keeps its stop."""
        due: list[tuple[str, str]] = []
        heap = self._heap
        while heap and heap[0][0] <= now:
            entry = heapq.heappop(heap)
            if not self._live(entry):
                continue
            _, order, version, job_id = entry
            action = _ACTIONS[order]
            if action == STOP:
                del self._armed[job_id]
            else:
                _, deadlines_, _ = self._armed[job_id]
                self._armed[job_id] = (version, deadlines_, True)
            due.append((job_id, action))
        return due
