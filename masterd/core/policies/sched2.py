"""SCHED²: a learned job selection with packing placement (seeds/sched2.md §III).

At every pass (an event: submission, start, exit) time is frozen and the agent, given the
state of ``masterd.core.sched2.state``, picks one of the first J waiting GPU jobs or "no job";
a picked job is placed by SCHED²'s packing (``sched2.packing``) and its GPUs enter the state
at once; the agent is asked again until it says "no job" or no waiting job in the window fits
the free GPUs (§III-C). Holding GPUs back while jobs could run is allowed: that is how the
agent keeps good locality for jobs that need it (§IV-C).

The agent is the numpy forward pass of a trained Q-network (``policy_options.model``, an
``.npz`` file from ``trellis-sim train sched2``; the model shipped in the package by default).
Predicted times come from GENIE's model database (``sched2.estimate``). CPU-only jobs are not
the agent's business: they start first come, first served, on whatever they fit.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from masterd.core.arrays.policy import PassResult
from masterd.core.cluster import ClusterSnapshot
from masterd.core.eligibility import placement_key
from masterd.core.genie.modeldb import ModelDB
from masterd.core.genie.options import load_modeldb
from masterd.core.placement import FreePool
from masterd.core.policy import Decision, Start
from masterd.core.sched2.agent import Agent, GreedyAgent
from masterd.core.sched2.estimate import Estimator
from masterd.core.sched2.models import GpuModels
from masterd.core.sched2.network import QNetwork, Shape
from masterd.core.sched2.packing import pack
from masterd.core.sched2.state import (
    NO_PLACEMENT,
    GpuState,
    Observation,
    Waiting,
    job_vector,
    packing_feature,
)
from shared.model import Job, Placement

DEFAULT_MODEL = Path(__file__).resolve().parents[1] / "sched2" / "models" / "sched2-15x8-j10.npz"


class Sched2Selection:
    """What SCHED²'s learned policies share: profiles of the waiting jobs, the GPU state kept
    across passes, CPU-only jobs first come first served, packing, and starting a picked job
    (its GPUs enter the state at once; the agent is told its Eq. 2 reward). Subclasses decide
    how the agent sees the queue (``_select``)."""

    name = "sched2-selection"
    source = "<memory>"  # the model file, for messages

    def __init__(self, shape: Shape, agent: Agent, time_scale: float,
                 modeldb: ModelDB | str | Path | None, default_duration_s: float,
                 fit: bool = False) -> None:
        self.shape = shape
        self.agent = agent
        self.time_scale = time_scale
        self.estimator = Estimator(load_modeldb(modeldb), default_duration_s)
        self.gpu_state = GpuState(shape, fit=fit)
        self._profiles: dict[str, Waiting] = {}  # waiting job -> its profile
        self._facts: tuple[object, ...] | None = None

    def decide(self, snapshot: ClusterSnapshot, queue: Sequence[Job],
               now: float) -> list[Decision]:
        return self.plan(snapshot, queue, now).decisions

    def plan(self, snapshot: ClusterSnapshot, queue: Sequence[Job], now: float) -> PassResult:
        models = GpuModels.of(snapshot)
        # Profiles depend on the job, the platform and the model database only.
        facts = (models, self.estimator.db.version)
        if facts != self._facts:
            self._facts, self._profiles = facts, {}
        pool = FreePool(snapshot)
        decisions: list[Decision] = []
        waiting: list[Waiting] = []
        profiles = self._profiles
        for job in queue:
            known = profiles.get(job.id)
            if known is not None and known.job is job:  # the usual case: seen last pass
                waiting.append(known)
                continue
            if job.spec.gpus:
                waiting.append(self._waiting(job, models))
                continue
            placement = pack(job.spec, pool, models.names)
            if placement is not None:
                pool.take(placement)
                decisions.append(Start(job.id, placement))
        self.gpu_state.sync(snapshot, lambda job: self._end(job, models, now))
        if self.gpu_state.mismatch is not None:
            note = f"waiting: {self.name} model {self.source}: {self.gpu_state.mismatch}"
            return PassResult(decisions, {w.job.id: note for w in waiting})
        decisions += self._select(waiting, snapshot, pool, models, now)
        if len(self.estimator) > 4 * (len(queue) + len(snapshot.running)) + 4096:
            live = {*(j.id for j in queue), *snapshot.running}
            self.estimator.forget(live)
            self._profiles = {k: v for k, v in self._profiles.items() if k in live}
        return PassResult(decisions)

    def _waiting(self, job: Job, models: GpuModels) -> Waiting:
        model = models.model_for(job.spec) or ""
        profile = self.estimator.profile(job, model, models.gpus_per_server.get(model, 1),
                                         models.servers.get(model, 1), self.shape.profiles)
        waiting = self._profiles[job.id] = Waiting(job, profile, job.spec.gpus)
        return waiting

    def _end(self, job: Job, models: GpuModels, now: float) -> float:
        placement = job.placement
        assert placement is not None
        model = models.model_for(job.spec) or ""
        started = job.start_time if job.start_time is not None else now
        return started + self.estimator.seconds(job, model, len(placement.allocations))

    def _start(self, chosen: Waiting, pool: FreePool, models: GpuModels, free: Counter[str],
               now: float) -> Start | None:
        """Pack ``chosen`` and start it (None: packing found no room after all); its GPUs
        enter the state at once and the agent hears the job's reward."""
        placement = pack(chosen.job.spec, pool, models.names)
        if placement is None:
            return None
        pool.take(placement)
        model = pool.views[placement.allocations[0].node].gpu_model or ""
        actual = self.estimator.seconds(chosen.job, model, len(placement.allocations))
        self.gpu_state.occupy(placement, now + actual)
        free[model] -= chosen.gpus
        # Eq. 2: T_ideal / (T_wait + T_actual), known the moment the job is placed.
        self.agent.reward(chosen.profile.ideal / (now - chosen.job.submit_time + actual))
        return Start(chosen.job.id, placement)

    def _select(self, waiting: list[Waiting], snapshot: ClusterSnapshot, pool: FreePool,
                models: GpuModels, now: float) -> list[Decision]:
        raise NotImplementedError

    def _packing(self, window: list[Waiting | None], mask: np.ndarray, pool: FreePool,
                 models: GpuModels) -> list[float]:
        """Per slot, the slowdown of the placement packing would give the job now."""
        out: list[float] = []
        placements: dict[tuple[object, ...], Placement | None] = {}
        for i, w in enumerate(window):
            if w is None or not mask[i]:
                out.append(NO_PLACEMENT)
                continue
            s = w.job.spec
            demand = placement_key(s)
            if demand not in placements:  # packing depends on the demand, not the job
                placements[demand] = pack(s, pool, models.names)
            placement = placements[demand]
            actual = None
            if placement is not None:
                model = pool.views[placement.allocations[0].node].gpu_model or ""
                actual = self.estimator.seconds(w.job, model, len(placement.allocations))
            out.append(packing_feature(actual, w.profile.ideal))
        return out


class Sched2Policy(Sched2Selection):
    """The paper's agent: a Q-network over the window of the first J waiting jobs."""

    name = "sched2"

    def __init__(self, model: str | Path | QNetwork | None = None,
                 modeldb: ModelDB | str | Path | None = None, jobs: int | None = None,
                 servers: int | None = None, gpus_per_server: int | None = None,
                 default_duration_s: float = 3600.0, agent: Agent | None = None) -> None:
        """``jobs``, ``servers``, ``gpus_per_server``: what the model must have been trained
        for (checked now, so a wrong file stops the master at start-up)."""
        self.network = model if isinstance(model, QNetwork) else QNetwork.load(
            model or DEFAULT_MODEL)
        self.network.check(servers, gpus_per_server, jobs)
        self.source = self.network.source
        super().__init__(self.network.shape,
                         agent if agent is not None else GreedyAgent(self.network),
                         self.network.time_scale, modeldb, default_duration_s)

    def _select(self, waiting: list[Waiting], snapshot: ClusterSnapshot, pool: FreePool,
                models: GpuModels, now: float) -> list[Decision]:
        """The frozen-time loop of §III-C over the window of the first J waiting jobs."""
        J, scale = self.shape.jobs, self.time_scale
        gpus_per_server = self.shape.gpus_per_server
        free = self.gpu_state.free()
        busy = any(job.spec.gpus for job in snapshot.running.values())
        # (jobs, GPUs, ideal seconds, submit times) of every waiting job not started yet,
        # summed when the first decision needs them (most passes have nothing to decide).
        totals: list[float] = []
        window: list[Waiting | None] = [*waiting[:J], *[None] * (J - len(waiting[:J]))]
        following = len(waiting[:J])
        blocked: set[str] = set()  # jobs the free GPUs hold in number but packing could not
        decisions: list[Decision] = []
        while True:
            mask = np.zeros(J + 1, dtype=bool)
            # Waiting pays only while something runs: on an idle cluster every job has its
            # best locality, and "no job" there could wait for ever (our guard, not §III).
            mask[J] = busy or bool(decisions)
            for i, w in enumerate(window):
                mask[i] = w is not None and w.job.id not in blocked and fits_free(w, free)
            if not mask[:J].any():
                break  # nothing to choose: "no job" is the only action
            if not totals:
                totals = queue_totals(waiting)
            present = [w for w in window if w is not None]
            rest = (int(totals[0]) - len(present), totals[1] - sum(w.gpus for w in present),
                    totals[2] - sum(w.profile.ideal for w in present),
                    totals[3] - sum(w.job.submit_time for w in present))
            packing = (self._packing(window, mask, pool, models) if self.shape.packing
                       else None)
            observation = Observation(
                self.gpu_state.features(now, scale, self.shape.canonical),
                job_vector(window, rest, self.shape, now, scale, gpus_per_server, packing),
                mask, now)
            action = self.agent.act(observation)
            if not 0 <= action <= J or not mask[action]:
                # Not an allowed action: "no job" if that is allowed, else the oldest job
                # that fits (the idle-cluster guard holds whatever the agent does).
                action = J if mask[J] else int(np.argmax(mask))
            if action == J:
                break
            chosen = window[action]
            assert chosen is not None
            start = self._start(chosen, pool, models, free, now)
            if start is None:
                blocked.add(chosen.job.id)
                continue
            decisions.append(start)
            take_from_totals(totals, chosen)
            # The window stays in arrival order: the next waiting job joins at its end.
            del window[action]
            window.append(waiting[following] if following < len(waiting) else None)
            following += 1
        return decisions


def queue_totals(waiting: Sequence[Waiting]) -> list[float]:
    """(jobs, GPUs, ideal seconds, submit times) of ``waiting``, summed: what Table I's
    statistics are taken from (``state.queue_statistics``)."""
    return [float(len(waiting)), float(sum([w.gpus for w in waiting])),
            math.fsum([w.profile.ideal for w in waiting]),
            math.fsum([w.job.submit_time for w in waiting])]


def take_from_totals(totals: list[float], started: Waiting) -> None:
    """``queue_totals`` once ``started`` has left the queue."""
    for i, value in enumerate((1.0, started.gpus, started.profile.ideal,
                               started.job.submit_time)):
        totals[i] -= value


def fits_free(w: Waiting, free: Counter[str]) -> bool:
    """Whether the free GPUs suffice in number (packing may split over any servers)."""
    model = w.job.spec.gpu_model
    if model is not None:
        return free.get(model, 0) >= w.gpus
    return max(free.values(), default=0) >= w.gpus
