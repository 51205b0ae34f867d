"""The agent's state (seeds/sched2.md §III-B, Table I), built from a snapshot and the queue.

- **GPU state**: an N×M matrix, one row per GPU server (servers in name order), the predicted
  remaining time of the job on each GPU, 0 for a free GPU. Each row is sorted, longest first:
  which GPU of a server a job holds does not matter to server-level locality, and the shared
  per-server MLP then sees one canonical row per situation. A slot with no usable GPU behind
  it (a server smaller than M, a missing, drained or unreachable server, an unhealthy GPU) is
  -1, so the agent can tell "no GPU" from "free".
- **Job state**, for each of the first J waiting GPU jobs in queue (arrival) order: the
  predicted time at k placements (``estimate.spread_levels``), the GPU demand ÷ M and the time
  waited so far; zeros for an empty slot.
- **Packing** (a learning fix beyond Table I, with ``Shape.packing``): per job, the
  slowdown of the placement packing would give it now (``packing_feature``), so whether a
  job would get its best locality is an input, not something to infer from the matrix.
- **Canonical order** (with ``Shape.canonical``): the rows sorted, so servers that differ
  only in name give one input.
- **Statistics** of the waiting GPU jobs beyond the window: how many (log1p(n) / 10), their
  mean demand ÷ M, mean ideal time and mean wait.

Times enter as ``log1p(t / time_scale)`` (the model file's ``time_scale``), so hours and
minutes both stay in a range a small network handles.

The matrix is kept across passes: running jobs that started or ended since the last pass are
added or cleared (a set difference, not a walk over every GPU), and a job placed during a pass
fills its GPUs at once, so the next decision of the same frozen instant sees it (§III-C).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from masterd.core.cluster import ClusterSnapshot, NodeView
from masterd.core.sched2.estimate import Profile
from masterd.core.sched2.network import Shape
from shared.model import Job, Placement

ABSENT = -1.0


@dataclass(frozen=True)
class Observation:
    """One decision's input: the GPU state, the job vector and which actions are allowed."""

    servers: np.ndarray  # (N, M) float32
    jobs: np.ndarray  # (Shape.job_features,) float32
    mask: np.ndarray  # (J + 1,) bool; the last action, "no job", is always allowed
    now: float = 0.0  # the frozen instant (the trainer discounts by elapsed time)

    def parts(self) -> dict[str, np.ndarray]:
        """The network's inputs by name (what a trainer stores and feeds)."""
        return {"servers": self.servers, "jobs": self.jobs}


@dataclass(frozen=True)
class ScorerObservation:
    """One decision of the per-job scorer (``sched2.scorer``): the GPU state, one row per
    candidate (every waiting job that fits, arrival order) and the queue's statistics.
    Actions: a candidate's row, or ``len(jobs)`` for "no job"."""

    servers: np.ndarray  # (N, M) float32
    jobs: np.ndarray  # (C, k + 3) float32
    stats: np.ndarray  # (scorer.STATS,) float32
    mask: np.ndarray  # (C + 1,) bool
    now: float = 0.0

    def parts(self) -> dict[str, np.ndarray]:
        return {"servers": self.servers, "jobs": self.jobs, "stats": self.stats}


def time_feature(seconds: float | np.ndarray, scale: float) -> np.ndarray:
    return np.log1p(np.maximum(seconds, 0.0) / scale)


class GpuState:
    """Predicted end time of the job on every GPU slot, in step with the running jobs.

    ``fit``: as many rows as the cluster has GPU servers (the scorer, whose network pools over
    servers), instead of the model's fixed N."""

    def __init__(self, shape: Shape, fit: bool = False) -> None:
        self.shape = shape
        self.fit = fit
        n, m = shape.servers, shape.gpus_per_server
        self._ends = np.zeros((n, m), dtype=np.float64)
        self._busy = np.zeros((n, m), dtype=bool)  # held by a running or just placed job
        self._absent = np.ones((n, m), dtype=bool)
        self._layout: list[tuple[object, bool]] | None = None
        self._slots: dict[str, dict[int, int]] = {}  # node -> GPU index -> flat slot
        self._rows: dict[str, np.ndarray] = {}  # GPU model -> its servers' rows
        self._held: dict[str, np.ndarray] = {}  # running job -> its flat slots
        self._tentative: list[np.ndarray] = []  # slots filled during the last pass
        self.mismatch: str | None = None

    def _rebuild(self, views: Sequence[NodeView]) -> None:
        n, m = self.shape.servers, self.shape.gpus_per_server
        if self.fit:
            n = len(views)
            self._ends = np.zeros((n, m), dtype=np.float64)
            self._busy = np.zeros((n, m), dtype=bool)
            self._absent = np.ones((n, m), dtype=bool)
        self._ends[:] = 0.0
        self._busy[:] = False
        self._absent[:] = True
        self._slots, self._rows, self._held, self._tentative = {}, {}, {}, []
        biggest = max((v.total_gpus for v in views), default=0)
        if len(views) > n or biggest > m:
            self.mismatch = (
                f"the cluster has {len(views)} GPU servers with up to {biggest} GPUs; the "
                f"model was trained for {n} servers × {m} GPUs")
            return
        self.mismatch = None
        rows: dict[str, list[int]] = {}
        for row, view in enumerate(views):
            slots: dict[int, int] = {}
            for col, gpu in enumerate(view.inventory.gpus):
                slots[gpu.index] = row * m + col
                self._absent[row, col] = not (view.schedulable and gpu.healthy)
            self._slots[view.name] = slots
            rows.setdefault(view.gpu_model or "", []).append(row)
        self._rows = {model: np.array(r, dtype=np.int64) for model, r in rows.items()}

    def sync(self, snapshot: ClusterSnapshot, end_of: Callable[[Job], float]) -> None:
        """Bring the matrix up to date with ``snapshot``; ``end_of(job)``: predicted end."""
        # Inventories are replaced, never changed in place: comparing them (and whether each
        # node takes work) by identity finds a changed cluster without reading every GPU.
        layout = [(v.inventory, v.schedulable) for v in snapshot.nodes.values()]
        if layout != self._layout:
            self._layout = layout
            self._rebuild(sorted((v for v in snapshot.nodes.values() if v.total_gpus),
                                 key=lambda v: v.name))
        if self.mismatch is not None:
            return
        ends, busy = self._ends.reshape(-1), self._busy.reshape(-1)
        for slots in self._tentative:
            ends[slots], busy[slots] = 0.0, False
        self._tentative = []
        running: Mapping[str, Job] = snapshot.running
        for job_id in self._held.keys() - running.keys():
            slots = self._held.pop(job_id)
            ends[slots], busy[slots] = 0.0, False
        for job_id in running.keys() - self._held.keys():
            job = running[job_id]
            if job.placement is None:
                continue
            slots = self._slots_of(job.placement)
            self._held[job_id] = slots
            ends[slots], busy[slots] = end_of(job), True

    def _slots_of(self, placement: Placement) -> np.ndarray:
        found = [
            self._slots[a.node][g]
            for a in placement.allocations if a.node in self._slots
            for g in a.gpus if g in self._slots[a.node]
        ]
        return np.array(found, dtype=np.int64)

    def occupy(self, placement: Placement, end: float) -> None:
        """A job placed during this pass: its GPUs are busy until ``end``."""
        slots = self._slots_of(placement)
        self._ends.reshape(-1)[slots] = end
        self._busy.reshape(-1)[slots] = True
        self._tentative.append(slots)

    def free(self) -> Counter[str]:
        """Free GPUs per GPU model: usable and held by no job (what the core's free sets
        hold, counted from the matrix instead of from every node's view)."""
        usable = ~(self._absent | self._busy)
        return Counter({model: int(np.count_nonzero(usable[rows]))
                        for model, rows in self._rows.items()})

    def usable(self) -> int:
        """GPUs that could take work: on a schedulable server and healthy."""
        return int(np.count_nonzero(~self._absent))

    def features(self, now: float, scale: float, canonical: bool = False) -> np.ndarray:
        rows = time_feature(self._ends - now, scale)
        rows[self._absent] = ABSENT
        rows = -np.sort(-rows, axis=1)  # longest first in every row
        if canonical:
            # Servers are interchangeable: rows sorted (first column first, descending), so
            # one situation is one input whatever the servers' names.
            rows = rows[np.lexsort(-rows.T[::-1])]
        return rows.astype(np.float32)


@dataclass(frozen=True)
class Waiting:
    """A waiting GPU job as the job state and the statistics need it."""

    job: Job
    profile: Profile
    gpus: int


def job_row(w: Waiting, now: float, scale: float, gpus_per_server: int, packing: float,
            k: int) -> np.ndarray:
    """One waiting job's features: its predicted time at k placements, its GPUs ÷ M, its
    wait, and packing's slowdown for it now (``packing_feature``)."""
    out = np.empty(k + 3, dtype=np.float32)
    out[:k] = time_feature(np.array(w.profile.levels), scale)
    out[k] = w.gpus / gpus_per_server
    out[k + 1] = time_feature(now - w.job.submit_time, scale)
    out[k + 2] = packing
    return out


def queue_statistics(rest: tuple[float, float, float, float], now: float, scale: float,
                     gpus_per_server: int) -> np.ndarray:
    """Table I's statistics of waiting jobs from (jobs, GPUs, ideal seconds, submit times)
    summed: log1p(n) / 10, mean demand ÷ M, mean ideal time, mean wait."""
    count, gpus, ideal, submits = rest
    if count <= 0:
        return np.zeros(4, dtype=np.float32)
    return np.array([np.log1p(count) / 10.0, gpus / count / gpus_per_server,
                     time_feature(ideal / count, scale),
                     time_feature(now - submits / count, scale)], dtype=np.float32)


def job_vector(window: Sequence[Waiting | None], rest: tuple[int, float, float, float],
               shape: Shape, now: float, scale: float, gpus_per_server: int,
               packing: Sequence[float] | None = None) -> np.ndarray:
    """Job state of the window's slots followed by the statistics of ``rest``.

    ``rest`` = (jobs, sum of GPU demands, sum of ideal times, sum of submit times) of the
    waiting GPU jobs outside the window. ``packing`` (with ``shape.packing``): per slot, the
    feature of :func:`packing_feature`.
    """
    k, step = shape.profiles, shape.job_step
    out = np.zeros(shape.job_features, dtype=np.float32)
    for i, w in enumerate(window):
        if w is None:
            continue
        slowdown = packing[i] if shape.packing and packing is not None else 0.0
        out[i * step:(i + 1) * step] = job_row(w, now, scale, gpus_per_server, slowdown,
                                               k)[:step]
    base = step * shape.jobs
    out[base:base + 4] = queue_statistics(rest, now, scale, gpus_per_server)
    return out


NO_PLACEMENT = -1.0


def packing_feature(actual: float | None, ideal: float) -> float:
    """How much slower the placement packing would give a job now is than its best:
    ln(T_actual / T_ideal), 0 at best locality; -1 when packing cannot place it now."""
    if actual is None or not ideal > 0:
        return NO_PLACEMENT
    return float(np.log(max(actual / ideal, 1.0)))
