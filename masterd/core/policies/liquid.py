"""Liquid (seeds/liquid.md §5–6): network-aware best fit, grouping-GA batches, fine-grained
GPU sharing and pre-scheduling, over the predictions features attach to jobs.

Each pass goes through the queue in order (later jobs may start when an earlier one cannot):

* a job that gave ``gpu_milli`` first tries to join a GPU other sharing jobs hold (Liquid's
  rule: predicted utilisations sum below ``util_limit``, predicted memory fits), else takes a
  free GPU, held shared so that others may join it;
* a job of at least ``batch_min_tasks`` tasks waits for its batch window
  (``batch_window_s``) to close, then is placed with the rest of its batch by the grouping
  genetic algorithm;
* any other job is placed at once by best fit, on free GPUs or on GPUs lent by jobs saving
  their model (pre-scheduling).

``wake_at`` tells the driver when the next batch window closes (or a lent GPU becomes
eligible), so a pass runs then even if nothing else happens. Options are described in
docs/policies/liquid.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from masterd.core.arrays.policy import PassResult
from masterd.core.cluster import ClusterSnapshot
from masterd.core.liquid.batch import batch_windows
from masterd.core.liquid.demand import Demand, task_count
from masterd.core.liquid.ga import GaSettings
from masterd.core.liquid.network import Distances
from masterd.core.liquid.passes import LiquidPass, PassStats
from masterd.core.liquid.score import ScoreWeights
from masterd.core.liquid.sharing import SharingRule
from masterd.core.policy import Decision
from shared.model import Job


class LiquidPolicy:
    name = "liquid"

    def __init__(
        self,
        batch: bool = True,
        batch_window_s: float = 15.0,
        batch_min_tasks: int = 3,
        sharing: bool = True,
        util_limit: float = 1.3,
        memory_limit: float = 1.0,
        max_jobs_per_gpu: int | None = None,
        prescheduling: bool = True,
        default_bandwidth_mbps: float = 100.0,
        network_weight: float = 1.0,
        distances: Mapping[str, float] | None = None,
        ga: Mapping[str, Any] | None = None,
        seed: int = 0,
    ) -> None:
        if batch_window_s < 0 or batch_min_tasks < 1:
            raise ValueError("liquid: batch_window_s must be >= 0 and batch_min_tasks >= 1")
        if default_bandwidth_mbps < 0 or network_weight < 0:
            raise ValueError("liquid: default_bandwidth_mbps and network_weight must be >= 0")
        self.batch = batch
        self.window = batch_window_s
        self.min_tasks = batch_min_tasks
        self.sharing = sharing
        self.rule = SharingRule(util_limit, memory_limit, max_jobs_per_gpu)
        self.prescheduling = prescheduling
        self.bandwidth = default_bandwidth_mbps
        try:
            self.weights = ScoreWeights(network_weight, Distances(**(distances or {})))
            self.ga = GaSettings(**(ga or {}))
        except TypeError as exc:
            raise ValueError(f"liquid: {exc}") from None
        self.seed = seed
        self.last = PassStats()
        self._wake: float | None = None

    @property
    def shares_gpus(self) -> bool:
        """Declared to the simulator (sim/engines.py): this policy's jobs may share a GPU,
        by sharing or by starting on a GPU a job saving its model lends."""
        return self.sharing or self.prescheduling

    def decide(self, snapshot: ClusterSnapshot, queue: Sequence[Job],
               now: float) -> list[Decision]:
        return self.plan(snapshot, queue, now).decisions

    def plan(self, snapshot: ClusterSnapshot, queue: Sequence[Job], now: float) -> PassResult:
        state = LiquidPass(snapshot, now, self.weights, self.bandwidth, self.rule,
                           self.prescheduling, self.sharing)
        batched = [j for j in queue if self.batch and task_count(j.spec) >= self.min_tasks]
        windows = batch_windows(batched, self.window)
        decisions: list[Decision] = []
        notes: dict[str, str] = {}
        ready: list[tuple[Job, Demand, dict[int, str]]] = []
        failed: set[tuple[object, ...]] = set()
        for job in queue:
            spec = job.spec
            demand = state.demand(job)
            if job.id in windows.closes and not windows.ready(job.id, now):
                notes[job.id] = (f"waiting for its batch window to close at "
                                 f"{windows.closes[job.id]:.0f}")
                continue
            shape = (spec.gpus, spec.cpus, spec.memory_mib, spec.gpu_model, spec.gpu_milli,
                     job.id in windows.closes)
            can_share = self.sharing and demand.shareable
            if shape in failed or (spec.gpus > state.free_gpus() and not can_share):
                continue  # the same demand found no room earlier in this pass
            if job.id in windows.closes:
                # Room is held by best fit in queue order; the batch is re-planned together.
                placed = state.reserve(job, demand)
                if placed is None:
                    failed.add(shape)
                else:
                    ready.append((job, demand, placed))
                continue
            start = None
            if can_share:
                start = state.share(job, demand)
            if start is None:
                start = state.immediate(job, demand)
            if start is None:
                failed.add(shape)
                continue
            decisions.append(start)
        if ready:
            decisions.extend(state.place_batch(ready, self.ga, self._batch_seed(ready)))
        self.last = state.stats
        self._wake = min([t for t in (windows.next_close(now), *state.wake) if t is not None],
                         default=None)
        return PassResult(decisions, notes)

    def wake_at(self, now: float) -> float | None:
        """When the last pass wants another one although nothing happens (or None)."""
        return self._wake if self._wake is not None and self._wake > now else None

    def _batch_seed(self, jobs: Sequence[tuple[Job, Demand, dict[int, str]]]) -> str:
        return f"liquid/{self.seed}/" + ",".join(sorted(j.id for j, _, _ in jobs))
