"""The trainer's learning fixes: the elapsed-time discount and the imitation (margin) loss."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from masterd.core.sched2.agent import greedy
from masterd.core.sched2.network import Shape
from masterd.core.sched2.state import Observation

torch = pytest.importorskip("torch", reason="training needs torch, the optional extra 'rl'")

from sim.rl.dqn import DqnConfig, DqnLearner, TrainingAgent, discounts  # noqa: E402

SHAPE = Shape(2, 4, 3, packing=True)


def test_idle_time_costs_what_it_lasts() -> None:
    c = DqnConfig(gamma=0.99, time_constant_s=3600.0)
    d = discounts(c, np.array([0.0, 3600.0, 7200.0], dtype=np.float32))
    assert d == pytest.approx([0.99, 0.99 / np.e, 0.99 / np.e ** 2], rel=1e-5)
    assert discounts(replace(c, time_constant_s=0.0), np.array([1e6])) == pytest.approx([0.99])


def _observation(now: float, mask: np.ndarray | None = None) -> Observation:
    rng = np.random.default_rng(int(now))
    return Observation(rng.random((2, 4), dtype=np.float32),
                       rng.random(SHAPE.job_features, dtype=np.float32),
                       np.ones(SHAPE.actions, dtype=bool) if mask is None else mask, now)


def test_demonstrations_are_recorded_with_elapsed_time_and_learned() -> None:
    config = DqnConfig(warmup=10 ** 9, margin=0.5, lr=1e-2, batch=16)
    learner = DqnLearner(SHAPE, config, seed=3)
    agent = TrainingAgent(learner, 1000, seed=3, teacher=lambda o: 2)
    for t in range(40):
        assert agent.act(_observation(float(100 * t))) == 2  # the teacher acts
        agent.reward(0.5)
    agent.end_episode()
    replay = learner.replay
    assert len(replay) == 40 and replay.demo[:40].all()
    assert replay.elapsed[0] == 100.0 and replay.done[39]
    for _ in range(80):
        learner.step(1.0)
    agreed = [greedy(learner.q_values(_observation(float(100 * t))), np.ones(4, dtype=bool))
              for t in range(40)]
    assert agreed.count(2) == 40
    agent.teaching = False  # now the agent acts itself: ε-greedy, not a demonstration
    agent.act(_observation(5000.0))
    agent.act(_observation(5100.0))
    assert not replay.demo[40]
