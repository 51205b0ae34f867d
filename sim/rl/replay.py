"""Prioritized experience replay (Schaul et al. 2015, the proportional variant; SCHED² [12]).

A transition is drawn with probability p_i^α / Σ p^α, p_i = |TD error| + ε (new transitions
get the largest priority seen, so each is replayed at least once soon), and weighted by the
importance-sampling weight (N·P(i))^-β / max_j (N·P(j))^-β. A sum tree keeps sampling and
updates at O(log N). Storage is preallocated numpy, a ring buffer overwriting the oldest.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from masterd.core.sched2.network import Shape


@dataclass(frozen=True)
class Batch:
    indices: np.ndarray
    weights: np.ndarray
    servers: np.ndarray
    jobs: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    masks: np.ndarray  # actions allowed in the state
    next_servers: np.ndarray
    next_jobs: np.ndarray
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
    def __init__(self, shape: Shape, capacity: int, alpha: float = 0.6,
                 seed: int = 0, epsilon: float = 1e-3) -> None:
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
        n, m, d, a = shape.servers, shape.gpus_per_server, shape.job_features, shape.actions
        self.servers = np.zeros((size, n, m), dtype=np.float32)
        self.jobs = np.zeros((size, d), dtype=np.float32)
        self.actions = np.zeros(size, dtype=np.int64)
        self.masks = np.zeros((size, a), dtype=bool)
        self.rewards = np.zeros(size, dtype=np.float32)
        self.next_servers = np.zeros((size, n, m), dtype=np.float32)
        self.next_jobs = np.zeros((size, d), dtype=np.float32)
        self.next_masks = np.zeros((size, a), dtype=bool)
        self.done = np.zeros(size, dtype=bool)
        self.elapsed = np.zeros(size, dtype=np.float32)
        self.demo = np.zeros(size, dtype=bool)

    def __len__(self) -> int:
        return self.size

    def add(self, servers: np.ndarray, jobs: np.ndarray, action: int, reward: float,
            next_servers: np.ndarray, next_jobs: np.ndarray, next_mask: np.ndarray,
            done: bool, elapsed: float = 0.0, demo: bool = False,
            mask: np.ndarray | None = None) -> None:
        i = self.next
        self.masks[i] = True if mask is None else mask
        self.elapsed[i], self.demo[i] = elapsed, demo
        self.servers[i], self.jobs[i] = servers, jobs
        self.actions[i], self.rewards[i] = action, reward
        self.next_servers[i], self.next_jobs[i] = next_servers, next_jobs
        self.next_masks[i], self.done[i] = next_mask, done
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
        return Batch(indices, weights.astype(np.float32), self.servers[indices],
                     self.jobs[indices], self.actions[indices], self.rewards[indices],
                     self.masks[indices],
                     self.next_servers[indices], self.next_jobs[indices],
                     self.next_masks[indices], self.done[indices], self.elapsed[indices],
                     self.demo[indices])

    def update(self, indices: np.ndarray, errors: np.ndarray) -> None:
        priorities = np.abs(errors) + self.epsilon
        self.max_priority = max(self.max_priority, float(priorities.max()))
        for i, p in zip(indices, priorities, strict=True):
            self.tree.update(int(i), float(p) ** self.alpha)
