"""Liquid's mechanisms in the replay, beside the engine's ground truth (sim/engine.py).

:class:`LiquidSimulator` extends :class:`~sim.engine.Simulator` with what the liquid policy
needs and what its comparisons measure, all driven by the code the master runs:

* **batch windows**: the base engine runs a pass at the core's ``wake_at`` (the policy's
  next window close, or when a lent GPU becomes eligible), as the master's timer does, for
  every policy;
* **GPU sharing**: jobs holding one GPU shared (the policy's ``shared`` allocations) slow each
  other as measured pairs did (:mod:`sim.colocation`); a fractional job's GPU busy share is
  its request times the speed it gets, and it counts as that share of a GPU allocated (a whole
  GPU when a policy rounds it up);
* **parameter-server traffic**: where a :class:`~sim.psnet.PsNetwork` is given, each job's
  speed also follows its PS flows over the NICs they share.

An :class:`~sim.engine.Annotator` (the resource model's predictions) attaches what the live
feature would.
"""

from __future__ import annotations

from masterd.core.fairshare import FairShare
from shared.model import Placement
from sim.colocation import ColocationTable, Profile
from sim.engine import Annotator, ProgressFn, SimConfig, Simulator, _Run
from sim.psnet import PsNetwork
from sim.workloads.base import Workload


class LiquidSimulator(Simulator):
    def __init__(
        self,
        workload: Workload,
        policy: object,
        config: SimConfig | None = None,
        progress: ProgressFn | None = None,
        annotator: Annotator | None = None,
        *,
        colocation: ColocationTable | None = None,
        network: PsNetwork | None = None,
        fairshare: FairShare | None = None,
    ) -> None:
        super().__init__(workload, policy, config, progress,  # type: ignore[arg-type]
                         annotator, fairshare)
        self.colocation = colocation
        self.network = network
        self._gpu_jobs: dict[tuple[str, int], set[str]] = {}
        self._profiles: dict[str, Profile] = {}
        self.shared_starts = 0

    # -- resources held ------------------------------------------------------------------
    def _share(self, job_id: str) -> float | None:
        spec = self.core.jobs[job_id].spec
        return None if spec.gpu_milli is None else spec.gpu_milli / 1000.0

    def _weight(self, job_id: str, placement: Placement) -> float:
        share = self._share(job_id)
        if share is not None and any(a.shared for a in placement.allocations):
            return share * placement.gpu_count
        return float(placement.gpu_count)

    def _launch(self, job_id: str, placement: Placement, now: float) -> None:
        if any(a.shared for a in placement.allocations):
            self.shared_starts += 1
        super()._launch(job_id, placement, now)
        self._allocated += self._weight(job_id, placement) - placement.gpu_count

    def _begin(self, job_id: str, now: float) -> None:
        placement = self._placements[job_id]
        for alloc in placement.allocations:
            if alloc.shared:
                for g in alloc.gpus:
                    self._gpu_jobs.setdefault((alloc.node, g), set()).add(job_id)
        if self.network is not None:
            self.network.start(job_id, self.core.jobs[job_id].spec.model_type, placement)
        super()._begin(job_id, now)

    def _end_run(self, job_id: str, now: float) -> _Run | None:
        placement = self._placements.get(job_id)
        weight = self._weight(job_id, placement) if placement is not None else 0.0
        others = self._coupled(job_id)
        if placement is not None:
            for alloc in placement.allocations:
                for g in alloc.gpus:
                    self._gpu_jobs.get((alloc.node, g), set()).discard(job_id)
        if self.network is not None:
            others |= self.network.end(job_id)
        run = super()._end_run(job_id, now)
        if placement is not None:
            self._allocated += placement.gpu_count - weight
        for other in sorted(others):
            if other in self._runs:
                self._reprice(self._runs[other], now)
        return run

    # -- coupling between jobs -----------------------------------------------------------
    def _sharers(self, job_id: str) -> set[str]:
        """Jobs on the GPUs this job holds shared."""
        found: set[str] = set()
        placement = self._placements.get(job_id)
        if placement is not None:
            for alloc in placement.allocations:
                if alloc.shared:
                    for g in alloc.gpus:
                        found |= self._gpu_jobs.get((alloc.node, g), set())
        found.discard(job_id)
        return found

    def _coupled(self, job_id: str) -> set[str]:
        found = self._sharers(job_id)
        if self.network is not None:
            found |= self.network.neighbours(job_id)
        return found

    def _neighbours(self, run: _Run) -> set[str]:
        return super()._neighbours(run) | self._coupled(run.job_id)

    def profile(self, job_id: str) -> Profile | None:
        if self.colocation is None:
            return None
        found = self._profiles.get(job_id)
        if found is None:
            found = self._profiles[job_id] = self.colocation.assign(self.config.seed, job_id)
        return found

    def _adjust(self, run: _Run, speed: float, efficiency: float) -> tuple[float, float]:
        speed, efficiency = super()._adjust(run, speed, efficiency)
        factor = 1.0
        beside = sorted(j for j in self._sharers(run.job_id) if j in self._runs)
        if beside and self.colocation is not None:
            mine = self.profile(run.job_id)
            assert mine is not None
            factor *= self.colocation.speed(mine, [p for j in beside
                                                   if (p := self.profile(j)) is not None])
        if self.network is not None:
            factor *= self.network.factor(run.job_id)
        share = self._share(run.job_id)
        busy = factor * (share if share is not None else 1.0)
        return speed * factor, efficiency * busy
