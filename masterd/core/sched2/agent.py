"""Who picks the action at each decision: the trained network, greedily, in the master.

The ``sched2`` policy asks an :class:`Agent` for every decision and tells it the reward of
each job it schedules. Serving uses :class:`GreedyAgent` (the action with the highest Q-value
among the allowed ones, lowest index on ties: deterministic). The trainer (``sim.rl``) plugs
in its own agent — ε-greedy over the PyTorch network, recording transitions — and so trains
through exactly the code that serves.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from masterd.core.sched2.network import QNetwork, Shape
from masterd.core.sched2.scorer import ScorerNetwork
from masterd.core.sched2.state import Observation, ScorerObservation


class Agent(Protocol):
    def act(self, observation: Any) -> int:
        """The action: a window slot (0..J-1) or J for "no job" (an :class:`Observation`);
        a candidate's row or ``len(jobs)`` for "no job" (a :class:`ScorerObservation`)."""
        ...

    def reward(self, value: float) -> None:
        """The reward of the job the last action scheduled (Eq. 2)."""
        ...


def greedy(q: np.ndarray, mask: np.ndarray) -> int:
    """The allowed action with the highest value (the first one on ties)."""
    return int(np.argmax(np.where(mask, q, -np.inf)))


class GreedyAgent:
    """A trained network, greedily: the Q-network over the window (``sched2``) or the per-job
    scorer (``sched2-scorer``), each fed the inputs its observation names (``parts``)."""

    def __init__(self, network: QNetwork | ScorerNetwork) -> None:
        self.network = network

    def act(self, observation: Observation | ScorerObservation) -> int:
        q = self.network.q_values(**observation.parts())
        return greedy(q, observation.mask)

    def reward(self, value: float) -> None:
        """Serving does not learn."""


def hold_action(observation: Observation, shape: Shape) -> int:
    """The hold rule (``sched2-hold``) read off the state: of the allowed slots whose job
    packing would place at its best locality now (packing feature 0), the one with the
    shortest ideal time (its first profile level); else "no job" (J) when allowed. Needs a
    state with the packing feature (``shape.packing``)."""
    if not shape.packing:
        raise ValueError("the hold rule needs the packing feature in the state")
    J, step = shape.jobs, shape.job_step
    return _hold(observation.jobs[:J * step].reshape(J, step), observation.mask,
                 shape.profiles)


def _hold(jobs: np.ndarray, mask: np.ndarray, profiles: int) -> int:
    """The hold rule over rows of job features (``state.job_row``), "no job" after the last:
    of the allowed rows whose packing feature is 0, the shortest ideal time (the first on
    ties); else "no job" when allowed, else the first allowed row."""
    none = len(jobs)
    ok = mask[:none] & (jobs[:, profiles + 2] == 0.0)
    if ok.any():
        return int(np.argmin(np.where(ok, jobs[:, 0], np.inf)))
    return none if mask[none] else int(np.argmax(mask))


class HoldAgent:
    """The hold rule in the agent's seat: the teacher the trainer imitates first."""

    def __init__(self, shape: Shape) -> None:
        self.shape = shape

    def act(self, observation: Observation) -> int:
        return hold_action(observation, self.shape)

    def reward(self, value: float) -> None:
        """A rule does not learn."""


def scorer_hold_action(observation: ScorerObservation, profiles: int) -> int:
    """The hold rule over the whole queue read off the scorer's state: of the candidates that
    packing places at their best locality now (packing feature 0), the one with the shortest
    ideal time, the oldest on ties; else "no job" when allowed, else the oldest candidate."""
    return _hold(observation.jobs, observation.mask, profiles)


class ScorerHoldAgent:
    """The hold rule over the whole queue in the scorer's seat: the scorer's teacher."""

    def __init__(self, profiles: int) -> None:
        self.profiles = profiles

    def act(self, observation: ScorerObservation) -> int:
        return scorer_hold_action(observation, self.profiles)

    def reward(self, value: float) -> None:
        """A rule does not learn."""
