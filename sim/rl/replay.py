"""Prioritized experience replay (Schaul et al. 2015, the proportional variant; SCHED² [12]).

A transition is drawn with probability p_i^α / Σ p^α, p_i = |TD error| + ε (new transitions
get the largest priority seen, so each is replayed at least once soon), and weighted by the
importance-sampling weight (N·P(i))^-β / max_j (N·P(j))^-β. A sum tree keeps sampling and
updates at O(log N). Storage is preallocated numpy, a ring buffer overwriting the oldest.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Batch:
    indices: np.ndarray
    weights: np.ndarray
    state: dict[str, np.ndarray]  # the network's inputs by name (the layout's)
    actions: np.ndarray
    rewards: np.ndarray
    masks: np.ndarray  # actions allowed in the state
    next_state: dict[str, np.ndarray]
    next_masks: np.ndarray
    done: np.ndarray
    elapsed: np.ndarray  # seconds from this decision to the next one
    demo: np.ndarray  # the action was the teacher's (imitation)


class SumTree:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.tree = np.zeros(2 * capacity, dtype=np.float64)  # leaves at [capacity, 2·capacity)

    def total(self) -> float:
        return float(self.tree[1])

    def update(self, index: int, value: float) -> None:
        i = index + self.capacity
        self.tree[i] = value
        i //= 2
        while i >= 1:
            self.tree[i] = self.tree[2 * i] + self.tree[2 * i + 1]
            i //= 2

    def find(self, mass: float) -> int:
        """The leaf where the running sum passes ``mass``."""
        i = 1
        while i < self.capacity:
            left = 2 * i
            if mass <= self.tree[left] or self.tree[left + 1] == 0.0:
                i = left
            else:
                mass -= self.tree[left]
                i = left + 1
        return i - self.capacity


class PrioritizedReplay:
    """``layout``: the shape of each of the network's inputs (one state); ``actions``: the
    length of an action mask."""

    def __init__(self, layout: Mapping[str, tuple[int, ...]], actions: int, capacity: int,
                 alpha: float = 0.6, seed: int = 0, epsilon: float = 1e-3) -> None:
        size = 1
        while size < capacity:
            size *= 2  # a power of two keeps the tree complete
        self.capacity = size
        self.alpha = alpha
        self.epsilon = epsilon
        self.rng = np.random.default_rng(seed)
        self.tree = SumTree(size)
        self.max_priority = 1.0
        self.size = 0
        self.next = 0
        self.state = {k: np.zeros((size, *dims), dtype=np.float32) for k, dims in layout.items()}
        self.next_state = {k: np.zeros((size, *dims), dtype=np.float32)
                           for k, dims in layout.items()}
        self.actions = np.zeros(size, dtype=np.int64)
        self.masks = np.zeros((size, actions), dtype=bool)
        self.rewards = np.zeros(size, dtype=np.float32)
        self.next_masks = np.zeros((size, actions), dtype=bool)
        self.done = np.zeros(size, dtype=bool)
        self.elapsed = np.zeros(size, dtype=np.float32)
        self.demo = np.zeros(size, dtype=bool)

    def __len__(self) -> int:
        return self.size

    def add(self, state: Mapping[str, np.ndarray], mask: np.ndarray, action: int,
            reward: float, next_state: Mapping[str, np.ndarray], next_mask: np.ndarray,
            done: bool, elapsed: float = 0.0, demo: bool = False) -> None:
        i = self.next
        for k, v in state.items():
            self.state[k][i] = v
        for k, v in next_state.items():
            self.next_state[k][i] = v
        self.masks[i], self.next_masks[i] = mask, next_mask
        self.elapsed[i], self.demo[i] = elapsed, demo
        self.actions[i], self.rewards[i] = action, reward
        self.done[i] = done
        self.tree.update(i, self.max_priority ** self.alpha)
        self.next = (i + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    def sample(self, batch: int, beta: float) -> Batch:
        total = self.tree.total()
        # Stratified: one draw in each of ``batch`` equal slices of the total mass.
        bounds = (np.arange(batch) + self.rng.random(batch)) * (total / batch)
        indices = np.array([self.tree.find(float(b)) for b in bounds], dtype=np.int64)
        indices = np.minimum(indices, self.size - 1)
        probs = self.tree.tree[indices + self.capacity] / total
        weights = (self.size * probs) ** (-beta)
        weights /= weights.max()
        return Batch(indices, weights.astype(np.float32),
                     {k: v[indices] for k, v in self.state.items()}, self.actions[indices],
                     self.rewards[indices], self.masks[indices],
                     {k: v[indices] for k, v in self.next_state.items()},
                     self.next_masks[indices], self.done[indices], self.elapsed[indices],
                     self.demo[indices])

    def update(self, indices: np.ndarray, errors: np.ndarray) -> None:
        priorities = np.abs(errors) + self.epsilon
        self.max_priority = max(self.max_priority, float(priorities.max()))
        for i, p in zip(indices, priorities, strict=True):
            self.tree.update(int(i), float(p) ** self.alpha)
