"""``sched2-scorer``: SCHED²'s frozen-time selection with a per-job scorer over the whole queue.

Beyond the paper (docs/policies/sched2.md): instead of a Q-network with one output per slot of
a window of the J oldest jobs, one network scores every waiting GPU job that fits the free
GPUs, in arrival order, plus a "no job" head (``masterd.core.sched2.scorer``). Everything else
is SCHED²'s: the GPU state, packing, time frozen while the agent picks jobs one at a time,
the Eq. 2 reward, holding GPUs back ("no job") while something runs. The network pools over
servers, so a model is not tied to the number of servers, only to their GPU count.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from masterd.core.cluster import ClusterSnapshot
from masterd.core.genie.modeldb import ModelDB
from masterd.core.placement import FreePool
from masterd.core.policies.sched2 import (
    Sched2Selection,
    fits_free,
    queue_totals,
    take_from_totals,
)
from masterd.core.policy import Decision
from masterd.core.sched2.agent import Agent, GreedyAgent
from masterd.core.sched2.models import GpuModels
from masterd.core.sched2.network import Shape
from masterd.core.sched2.scorer import ScorerNetwork
from masterd.core.sched2.state import ScorerObservation, Waiting, job_row, queue_statistics

DEFAULT_SCORER = (Path(__file__).resolve().parents[1] / "sched2" / "models"
                  / "sched2-scorer-x8.npz")


class Sched2ScorerPolicy(Sched2Selection):
    name = "sched2-scorer"

    def __init__(self, model: str | Path | ScorerNetwork | None = None,
                 modeldb: ModelDB | str | Path | None = None,
                 gpus_per_server: int | None = None, default_duration_s: float = 3600.0,
                 agent: Agent | None = None) -> None:
        self.network = model if isinstance(model, ScorerNetwork) else ScorerNetwork.load(
            model or DEFAULT_SCORER)
        self.network.check(gpus_per_server)
        self.source = self.network.source
        s = self.network.shape
        # The state's matrix has a row per GPU server, however many there are (``fit``).
        super().__init__(Shape(1, s.gpus_per_server, 1, s.profiles, packing=True,
                               canonical=True),
                         agent if agent is not None else GreedyAgent(self.network),
                         self.network.time_scale, modeldb, default_duration_s, fit=True)

    def _select(self, waiting: list[Waiting], snapshot: ClusterSnapshot, pool: FreePool,
                models: GpuModels, now: float) -> list[Decision]:
        scale, m, k = self.time_scale, self.shape.gpus_per_server, self.shape.profiles
        free = self.gpu_state.free()
        busy = any(job.spec.gpus for job in snapshot.running.values())
        usable = self.gpu_state.usable()
        remaining = list(waiting)
        blocked: set[str] = set()
        decisions: list[Decision] = []
        totals: list[float] = []
        # A job's row is fixed for the pass (time is frozen) but for packing's slowdown,
        # which the placements of this pass change: built once, the slowdown set per decision.
        rows: dict[str, np.ndarray] = {}
        while True:
            candidates = [w for w in remaining if w.job.id not in blocked and fits_free(w, free)]
            if not candidates:
                break
            if not totals:
                totals = queue_totals(remaining)
            mask = np.ones(len(candidates) + 1, dtype=bool)
            mask[-1] = busy or bool(decisions)  # the idle-cluster guard of ``sched2``
            for w in candidates:
                if w.job.id not in rows:
                    rows[w.job.id] = job_row(w, now, scale, m, 0.0, k)
            jobs = np.stack([rows[w.job.id] for w in candidates])
            jobs[:, k + 2] = self._packing(candidates, mask, pool, models)
            stats = np.concatenate((
                queue_statistics((totals[0], totals[1], totals[2], totals[3]), now, scale, m),
                np.array([sum(free.values()) / max(1, usable),
                          np.log1p(len(candidates)) / 10.0], dtype=np.float32)))
            observation = ScorerObservation(self.gpu_state.features(now, scale), jobs, stats,
                                            mask, now)
            action = self.agent.act(observation)
            none = len(candidates)
            if not 0 <= action <= none or not mask[action]:
                action = none if mask[none] else 0
            if action == none:
                break
            chosen = candidates[action]
            start = self._start(chosen, pool, models, free, now)
            if start is None:
                blocked.add(chosen.job.id)
                continue
            decisions.append(start)
            remaining.remove(chosen)
            take_from_totals(totals, chosen)
        return decisions

