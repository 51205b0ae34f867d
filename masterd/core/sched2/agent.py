"""Who picks the action at each decision: the trained network, greedily, in the master.

The ``sched2`` policy asks an :class:`Agent` for every decision and tells it the reward of
each job it schedules. Serving uses :class:`GreedyAgent` (the action with the highest Q-value
among the allowed ones, lowest index on ties: deterministic). The trainer (``sim.rl``) plugs
in its own agent — ε-greedy over the PyTorch network, recording transitions — and so trains
through exactly the code that serves.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from masterd.core.sched2.network import QNetwork
from masterd.core.sched2.state import Observation


class Agent(Protocol):
    def act(self, observation: Observation) -> int:
        """The action: a window slot (0..J-1) or J for "no job"."""
        ...

    def reward(self, value: float) -> None:
        """The reward of the job the last action scheduled (Eq. 2)."""
        ...


def greedy(q: np.ndarray, mask: np.ndarray) -> int:
    """The allowed action with the highest value (the first one on ties)."""
    return int(np.argmax(np.where(mask, q, -np.inf)))


class GreedyAgent:
    def __init__(self, network: QNetwork) -> None:
        self.network = network

    def act(self, observation: Observation) -> int:
        q = self.network.q_values(observation.servers, observation.jobs)
        return greedy(q, observation.mask)

    def reward(self, value: float) -> None:
        """Serving does not learn."""
