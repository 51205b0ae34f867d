"""DQN (Mnih et al. 2015; SCHED² §III-F) with ε-greedy exploration and prioritized replay.

The learner keeps an online and a target network; every ``train_every`` decisions it samples a
prioritized batch and takes one Adam step on the importance-weighted Huber loss of

    Q(s, a) − (r + γ · max_{a' allowed in s'} Q_target(s', a'))     (0 after the last decision)

The target network copies the online one every ``target_every`` steps. A transition runs from
one decision of the agent to its next one, wherever that is: later in the same frozen instant
(after a job was placed) or at a later event (after "no job"); its reward is the Eq. 2
effectiveness of the job the action scheduled, 0 for "no job". Decisions the policy takes
without asking (nothing in the window fits) are not transitions.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from masterd.core.sched2.agent import greedy
from masterd.core.sched2.network import DEFAULT_HIDDEN, Shape
from masterd.core.sched2.state import Observation
from sim.rl.qnet import TorchQNet
from sim.rl.replay import PrioritizedReplay


@dataclass(frozen=True)
class DqnConfig:
    """Hyper-parameters. SCHED² publishes none of them (REFERENCES.md); these are common
    DQN settings, fixed before any result was looked at."""

    gamma: float = 0.99  # per decision
    lr: float = 5e-4
    batch: int = 64
    replay: int = 65536
    alpha: float = 0.6  # prioritisation exponent
    beta_start: float = 0.4  # importance-sampling exponent, annealed to 1 over training
    train_every: int = 4  # decisions per gradient step
    target_every: int = 500  # gradient steps per target copy
    warmup: int = 1000  # decisions before the first step
    eps_start: float = 1.0
    eps_end: float = 0.05
    eps_fraction: float = 0.5  # share of the training decisions over which ε decays
    grad_clip: float = 10.0


class DqnLearner:
    def __init__(self, shape: Shape, config: DqnConfig, seed: int,
                 hidden: dict[str, int] | None = None) -> None:
        torch.manual_seed(seed)
        self.config = config
        self.online = TorchQNet(shape, hidden or dict(DEFAULT_HIDDEN))
        self.target = TorchQNet(shape, self.online.hidden)
        self.target.load_state_dict(self.online.state_dict())
        self.optimizer = torch.optim.Adam(self.online.parameters(), lr=config.lr)
        self.replay = PrioritizedReplay(shape, config.replay, config.alpha, seed)
        self.steps = 0
        self.losses: list[float] = []

    def q_values(self, observation: Observation) -> np.ndarray:
        with torch.no_grad():
            q = self.online(torch.from_numpy(observation.servers[None]),
                            torch.from_numpy(observation.jobs[None]))
        return q[0].numpy()

    def step(self, beta: float) -> float:
        c = self.config
        b = self.replay.sample(c.batch, beta)
        servers, jobs = torch.from_numpy(b.servers), torch.from_numpy(b.jobs)
        q = self.online(servers, jobs).gather(1, torch.from_numpy(b.actions)[:, None])[:, 0]
        with torch.no_grad():
            nxt = self.target(torch.from_numpy(b.next_servers), torch.from_numpy(b.next_jobs))
            nxt = nxt.masked_fill(~torch.from_numpy(b.next_masks), -torch.inf).max(1).values
            nxt = torch.where(torch.from_numpy(b.done), torch.zeros_like(nxt), nxt)
            target = torch.from_numpy(b.rewards) + c.gamma * nxt
        errors = q - target
        loss = (torch.from_numpy(b.weights)
                * nn.functional.smooth_l1_loss(q, target, reduction="none")).mean()
        self.optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(self.online.parameters(), c.grad_clip)
        self.optimizer.step()
        self.replay.update(b.indices, errors.detach().numpy())
        self.steps += 1
        if self.steps % c.target_every == 0:
            self.target.load_state_dict(self.online.state_dict())
        value = float(loss.item())
        self.losses.append(value)
        return value


class TrainingAgent:
    """The agent the ``sched2`` policy consults while training: ε-greedy, recording each
    decision as a transition and learning as it goes."""

    def __init__(self, learner: DqnLearner, total_decisions: int, seed: int) -> None:
        self.learner = learner
        self.total = max(1, total_decisions)  # the planned number, for ε and β schedules
        self.rng = np.random.default_rng(seed)
        self.decisions = 0
        self.episode_reward = 0.0
        self._pending: tuple[Observation, int] | None = None
        self._reward = 0.0

    @property
    def epsilon(self) -> float:
        c = self.learner.config
        done = min(1.0, self.decisions / (c.eps_fraction * self.total))
        return c.eps_start + (c.eps_end - c.eps_start) * done

    def act(self, observation: Observation) -> int:
        if self._pending is not None:
            self._store(observation, done=False)
        valid = np.flatnonzero(observation.mask)
        if self.rng.random() < self.epsilon:
            action = int(valid[self.rng.integers(len(valid))])
        else:
            action = greedy(self.learner.q_values(observation), observation.mask)
        self._pending = (observation, action)
        self._reward = 0.0
        self.decisions += 1
        c = self.learner.config
        if self.decisions >= c.warmup and self.decisions % c.train_every == 0:
            progress = min(1.0, self.decisions / self.total)
            self.learner.step(c.beta_start + (1.0 - c.beta_start) * progress)
        return action

    def reward(self, value: float) -> None:
        self._reward += value
        self.episode_reward += value

    def end_episode(self) -> float:
        """The episode is over: its last decision is terminal. Returns the episode's reward."""
        if self._pending is not None:
            observation, _ = self._pending
            self._store(observation, done=True)
        total, self.episode_reward = self.episode_reward, 0.0
        return total

    def _store(self, following: Observation, done: bool) -> None:
        assert self._pending is not None
        observation, action = self._pending
        self.learner.replay.add(observation.servers, observation.jobs, action, self._reward,
                                following.servers, following.jobs, following.mask, done)
        self._pending = None
