"""DQN (Mnih et al. 2015; SCHED² §III-F) with ε-greedy exploration and prioritized replay.

The learner keeps an online and a target network; every ``train_every`` decisions it samples a
prioritized batch and takes one Adam step on the importance-weighted Huber loss of

    Q(s, a) − (r + γ · e^(−Δt/τ) · max_{a' allowed in s'} Q_target(s', a'))   (0 after the last)

with Δt the simulated seconds between the decision and the next one. The per-decision γ
alone (the paper's form) makes "no job" cost 1% however long the GPUs then stay idle; the
time factor (``time_constant_s`` = τ; 0 turns it off) makes idle time cost what it costs.
Transitions of a teacher (the hold rule, ``TrainingAgent(teacher=...)``) are marked as
demonstrations and add DQfD's large-margin loss (Hester et al., AAAI 2018):
max_a [Q(s, a) + m·(a ≠ a_E)] − Q(s, a_E), so the network starts from the rule and TD
learning then moves it where the rewards say.

The target network copies the online one every ``target_every`` steps. A transition runs from
one decision of the agent to its next one, wherever that is: later in the same frozen instant
(after a job was placed) or at a later event (after "no job"); its reward is the Eq. 2
effectiveness of the job the action scheduled, 0 for "no job". Decisions the policy takes
without asking (nothing in the window fits) are not transitions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from masterd.core.sched2.agent import greedy
from masterd.core.sched2.network import Shape
from sim.rl.qnet import QNetCodec
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
    time_constant_s: float = 0.0  # τ of the elapsed-time discount; 0: per decision only
    margin: float = 0.1  # DQfD's margin for demonstrated actions
    demo_weight: float = 1.0  # weight of the margin loss


def discounts(config: DqnConfig, elapsed: np.ndarray) -> np.ndarray:
    """γ per decision times e^(−Δt/τ) for the seconds each transition spanned."""
    out = np.full(elapsed.shape, config.gamma, dtype=np.float32)
    if config.time_constant_s > 0:
        out *= np.exp(-np.maximum(elapsed, 0.0) / config.time_constant_s).astype(np.float32)
    return out


class DqnLearner:
    """``codec``: the network to learn and how its decisions are stored
    (``sim.rl.qnet.QNetCodec`` for the paper's agent, a :class:`Shape` being short for
    that; ``sim.rl.scorer_net.ScorerCodec`` for the per-job scorer)."""

    def __init__(self, codec: Any, config: DqnConfig, seed: int,
                 hidden: dict[str, int] | None = None) -> None:
        torch.manual_seed(seed)
        if isinstance(codec, Shape):
            codec = QNetCodec(codec, hidden)
        self.codec = codec
        self.config = config
        self.online = codec.make()
        self.target = codec.make()
        self.target.load_state_dict(self.online.state_dict())
        self.optimizer = torch.optim.Adam(self.online.parameters(), lr=config.lr)
        self.replay = PrioritizedReplay(codec.layout, codec.actions, config.replay,
                                        config.alpha, seed)
        self.steps = 0
        self.losses: list[float] = []

    def _q(self, net: nn.Module, state: dict[str, np.ndarray]) -> torch.Tensor:
        out: torch.Tensor = net(*(torch.from_numpy(state[k]) for k in self.codec.layout))
        return out

    def q_values(self, observation: Any) -> np.ndarray:
        """Q-values of every action of one decision, as it is (not as stored)."""
        with torch.no_grad():
            q = self._q(self.online, {k: v[None] for k, v in observation.parts().items()})
        return q[0].numpy()

    def store(self, observation: Any, action: int, reward: float, following: Any, done: bool,
              elapsed: float, demo: bool) -> None:
        state, mask, stored = self.codec.encode(observation, action)
        nxt, next_mask, _ = self.codec.encode(following)
        self.replay.add(state, mask, stored, reward, nxt, next_mask, done, elapsed, demo)

    def step(self, beta: float) -> float:
        c = self.config
        b = self.replay.sample(c.batch, beta)
        all_q = self._q(self.online, b.state)
        q = all_q.gather(1, torch.from_numpy(b.actions)[:, None])[:, 0]
        with torch.no_grad():
            nxt = self._q(self.target, b.next_state)
            nxt = nxt.masked_fill(~torch.from_numpy(b.next_masks), -torch.inf).max(1).values
            nxt = torch.where(torch.from_numpy(b.done), torch.zeros_like(nxt), nxt)
            factor = torch.from_numpy(discounts(c, b.elapsed))
            target = torch.from_numpy(b.rewards) + factor * nxt
        errors = q - target
        weights = torch.from_numpy(b.weights)
        loss = (weights * nn.functional.smooth_l1_loss(q, target, reduction="none")).mean()
        demo = torch.from_numpy(b.demo)
        if c.demo_weight > 0 and bool(demo.any()):
            actions = torch.from_numpy(b.actions)
            margins = torch.full_like(all_q, c.margin)
            margins.scatter_(1, actions[:, None], 0.0)
            masks = torch.from_numpy(b.masks)
            best = (all_q + margins).masked_fill(~masks, -torch.inf).max(1).values
            chosen = all_q.gather(1, actions[:, None])[:, 0]
            loss = loss + c.demo_weight * (weights * (best - chosen) * demo).sum() / max(
                1, int(demo.sum()))
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

    def __init__(self, learner: DqnLearner, total_decisions: int, seed: int,
                 teacher: Callable[[Any], int] | None = None) -> None:
        self.learner = learner
        # While ``teaching`` is on, the teacher acts (no exploration) and its transitions
        # are demonstrations; ε then counts from the first decision the agent takes itself.
        self.teacher = teacher
        self.teaching = teacher is not None
        self._own = 0  # decisions taken by the agent itself
        self.total = max(1, total_decisions)  # the planned number, for ε and β schedules
        self.rng = np.random.default_rng(seed)
        self.decisions = 0
        self.episode_reward = 0.0
        self._pending: tuple[Any, int, bool] | None = None
        self._reward = 0.0

    @property
    def epsilon(self) -> float:
        c = self.learner.config
        done = min(1.0, self._own / (c.eps_fraction * self.total))
        return c.eps_start + (c.eps_end - c.eps_start) * done

    def act(self, observation: Any) -> int:
        if self._pending is not None:
            self._store(observation, done=False)
        valid = np.flatnonzero(observation.mask)
        if self.teaching and self.teacher is not None:
            action = self.teacher(observation)
        elif self.rng.random() < self.epsilon:
            action = int(valid[self.rng.integers(len(valid))])
            self._own += 1
        else:
            action = greedy(self.learner.q_values(observation), observation.mask)
            self._own += 1
        self._pending = (observation, action, self.teaching)
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
            self._store(self._pending[0], done=True)
        total, self.episode_reward = self.episode_reward, 0.0
        return total

    def _store(self, following: Any, done: bool) -> None:
        assert self._pending is not None
        observation, action, demo = self._pending
        self.learner.store(observation, action, self._reward, following, done,
                           max(0.0, following.now - observation.now), demo)
        self._pending = None
