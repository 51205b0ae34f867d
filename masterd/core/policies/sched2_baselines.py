"""The heuristic baselines of SCHED²'s evaluation (seeds/sched2.md §IV-A), with its packing.

"All of these baselines use the packing placement algorithm" (``sched2.packing``). Each pass a
policy starts waiting jobs one at a time in its order; a job the free GPUs cannot hold is
skipped and the next one tried (the paper's baselines pick "from waiting queue" whatever can
be scheduled). Ideal and actual times are the same predictions the ``sched2`` policy sees
(``sched2.estimate``: GENIE's model database; the simulator hands them the oracle's, so SAF is
the oracle the paper describes). Ties go to queue (arrival) order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from masterd.core.cluster import ClusterSnapshot
from masterd.core.eligibility import placement_key
from masterd.core.genie.modeldb import ModelDB
from masterd.core.genie.options import load_modeldb
from masterd.core.placement import FreePool
from masterd.core.policy import Decision, Start
from masterd.core.sched2.estimate import Estimator
from masterd.core.sched2.models import GpuModels
from masterd.core.sched2.packing import best_servers, pack
from shared.model import Job, Placement

MAX_DELAYS = 3  # DSIF: "it will delay the job for at most 3 times"


class _Baseline:
    name = "sched2-baseline"

    def __init__(self, modeldb: ModelDB | str | Path | None = None,
                 default_duration_s: float = 3600.0) -> None:
        self.estimator = Estimator(load_modeldb(modeldb), default_duration_s)

    def decide(self, snapshot: ClusterSnapshot, queue: Sequence[Job],
               now: float) -> list[Decision]:
        models = GpuModels.of(snapshot)
        pool = FreePool(snapshot)
        decisions = self.select(list(queue), pool, models, now)
        if len(self.estimator) > 4 * (len(queue) + len(snapshot.running)) + 4096:
            self.estimator.forget({*(j.id for j in queue), *snapshot.running})
        return decisions

    def select(self, queue: list[Job], pool: FreePool, models: GpuModels,
               now: float) -> list[Decision]:
        """Start jobs in ``order``; subclasses with a different rule override this."""
        ordered = self.order(queue, models)
        return start_in_order(ordered, pool, models)

    def order(self, queue: list[Job], models: GpuModels) -> list[Job]:
        raise NotImplementedError

    def ideal(self, job: Job, models: GpuModels) -> float:
        """T_ideal: the predicted time at best locality (the fewest servers)."""
        model = models.model_for(job.spec) or ""
        servers = best_servers(job.spec.gpus, models.gpus_per_server.get(model, 1))
        return self.estimator.seconds(job, model, servers)

    def actual(self, job: Job, placement: Placement, pool: FreePool) -> float:
        """T_actual: the predicted time on ``placement``."""
        model = pool.views[placement.allocations[0].node].gpu_model or ""
        return self.estimator.seconds(job, model, len(placement.allocations))


def start_in_order(jobs: Sequence[Job], pool: FreePool, models: GpuModels) -> list[Decision]:
    """Each job packed in turn; a demand that failed once fails for the rest of the pass."""
    decisions: list[Decision] = []
    failed: set[tuple[object, ...]] = set()
    for job in jobs:
        s = job.spec
        demand = placement_key(s)
        if demand in failed:
            continue
        placement = pack(s, pool, models.names)
        if placement is None:
            failed.add(demand)
            continue
        pool.take(placement)
        decisions.append(Start(job.id, placement))
    return decisions


class SifPolicy(_Baseline):
    """SIF, Shortest Ideal time job First: the job with the shortest ideal execution time
    (its predicted time at best locality) first."""

    name = "sif"

    def order(self, queue: list[Job], models: GpuModels) -> list[Job]:
        return sorted(queue, key=lambda j: self.ideal(j, models))  # stable: arrival on ties


class LrfPolicy(_Baseline):
    """LRF, Least Resource job First: the job demanding the fewest GPUs first."""

    name = "lrf"

    def order(self, queue: list[Job], models: GpuModels) -> list[Job]:
        return sorted(queue, key=lambda j: j.spec.gpus)


class SpfPolicy(_Baseline):
    """SPF, Smallest Product job First: the smallest GPU demand × ideal execution time first."""

    name = "spf"

    def order(self, queue: list[Job], models: GpuModels) -> list[Job]:
        return sorted(queue, key=lambda j: j.spec.gpus * self.ideal(j, models))


class DsifPolicy(SifPolicy):
    """DSIF, Delayed Shortest Ideal time job First: SIF's order, but a job that would not get
    the best locality (packing spreads it over more servers than ``ceil(GPUs / M)``) is
    skipped, at most 3 times; then it takes what packing gives.

    A delay counts once per instant: asked twice at the same ``now``, the policy answers the
    same (the count is its only memory between passes).
    """

    name = "dsif"

    def __init__(self, modeldb: ModelDB | str | Path | None = None,
                 default_duration_s: float = 3600.0) -> None:
        super().__init__(modeldb, default_duration_s)
        # job -> (delays so far, instant of the last one)
        self._delays: dict[str, tuple[int, float | None]] = {}

    def select(self, queue: list[Job], pool: FreePool, models: GpuModels,
               now: float) -> list[Decision]:
        decisions: list[Decision] = []
        for job in self.order(queue, models):
            placement = pack(job.spec, pool, models.names)
            if placement is None:
                continue
            model = pool.views[placement.allocations[0].node].gpu_model or ""
            best = best_servers(job.spec.gpus, models.gpus_per_server.get(model, 1))
            count, last = self._delays.get(job.id, (0, None))
            if len(placement.allocations) > best and (last == now or count < MAX_DELAYS):
                # A second pass at the same instant repeats the delay without counting it.
                self._delays[job.id] = (count if last == now else count + 1, now)
                continue
            self._delays.pop(job.id, None)
            pool.take(placement)
            decisions.append(Start(job.id, placement))
        if len(self._delays) > 2 * len(queue) + 1024:
            waiting = {j.id for j in queue}
            self._delays = {k: v for k, v in self._delays.items() if k in waiting}
        return decisions


class SafPolicy(_Baseline):
    """SAF, Shortest Actual time job First: repeatedly the job with the shortest actual
    execution time "given the current cluster state" — its predicted time on the placement
    packing would give it now (the oracle of the paper when the predictions are exact)."""

    name = "saf"

    def select(self, queue: list[Job], pool: FreePool, models: GpuModels,
               now: float) -> list[Decision]:
        decisions: list[Decision] = []
        waiting = list(queue)
        while waiting:
            best = shortest_packed(waiting, pool, models,
                                   lambda job, placement: self.actual(job, placement, pool))
            if best is None:
                break
            i, placement = best
            pool.take(placement)
            decisions.append(Start(waiting.pop(i).id, placement))
        return decisions


def shortest_packed(jobs: Sequence[Job], pool: FreePool, models: GpuModels,
                    seconds: Callable[[Job, Placement], float | None]
                    ) -> tuple[int, Placement] | None:
    """Of ``jobs``, the index and packed placement of the one whose ``seconds`` (None: not a
    candidate) is least, the first on ties; None when none packs or qualifies."""
    # Packing depends on the demand, not the job: one placement per demand per step.
    placements: dict[tuple[object, ...], Placement | None] = {}
    best: tuple[float, int, Placement] | None = None
    for i, job in enumerate(jobs):
        s = job.spec
        demand = placement_key(s)
        if demand not in placements:
            placements[demand] = pack(s, pool, models.names)
        placement = placements[demand]
        if placement is None:
            continue
        t = seconds(job, placement)
        if t is not None and (best is None or t < best[0]):
            best = (t, i, placement)
    return None if best is None else (best[1], best[2])


class HoldPolicy(_Baseline):
    """The hold rule, inside SCHED²'s own action space: of the first ``window`` waiting GPU
    jobs (arrival order, J = 10 as the agent's; 0: the whole queue), start the shortest one
    (ideal time) that packing places on its fewest servers (``ceil(GPUs / M)``), and repeat
    as the window refills; when none can have its best locality now, "no job": the free GPUs
    are held for the jobs that will. A job that needs more GPUs than are free waits like any
    other. CPU-only jobs are not the rule's business: they start first come, first served.

    It is the policy a learned agent must beat to count as having learned anything: every
    choice it makes is one of the agent's J + 1 actions.
    """

    name = "sched2-hold"

    def __init__(self, modeldb: ModelDB | str | Path | None = None,
                 default_duration_s: float = 3600.0, window: int = 10) -> None:
        if isinstance(window, bool) or not isinstance(window, int) or window < 0:
            raise ValueError(f"window must be a whole number >= 0 (0: the whole queue), "
                             f"got {window!r}")
        super().__init__(modeldb, default_duration_s)
        self.window = window

    def select(self, queue: list[Job], pool: FreePool, models: GpuModels,
               now: float) -> list[Decision]:
        decisions: list[Decision] = []
        waiting: list[Job] = []
        for job in queue:
            if job.spec.gpus:
                waiting.append(job)
                continue
            placement = pack(job.spec, pool, models.names)
            if placement is not None:
                pool.take(placement)
                decisions.append(Start(job.id, placement))
        while waiting:
            window = waiting[:self.window] if self.window else waiting

            def at_best_locality(job: Job, placement: Placement) -> float | None:
                model = pool.views[placement.allocations[0].node].gpu_model or ""
                if len(placement.allocations) > best_servers(
                        job.spec.gpus, models.gpus_per_server.get(model, 1)):
                    return None
                return self.ideal(job, models)

            best = shortest_packed(window, pool, models, at_best_locality)
            if best is None:
                break  # "no job": nothing in the window gets its best locality now
            i, placement = best
            pool.take(placement)
            decisions.append(Start(waiting.pop(i).id, placement))
        return decisions
