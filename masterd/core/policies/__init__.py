"""Scheduling policies, each a plain class implementing :class:`masterd.core.policy.Policy`."""

from __future__ import annotations

from collections.abc import Callable

from masterd.core.arrays.policy import ArrayPolicy
from masterd.core.policies.capacity import CapacityPolicy
from masterd.core.policies.drf import DrfPolicy
from masterd.core.policies.fifo import FifoPolicy
from masterd.core.policies.minmin import MinMinPolicy
from masterd.core.policies.sjf import SjfPolicy
from masterd.core.policies.swaf import SwafPolicy
from masterd.core.policies.tetris import TetrisCerPolicy, TetrisPerfPolicy
from masterd.core.policies.weighted_fair import WeightedFairPolicy
from masterd.core.policy import Policy

# name -> factory taking the policy's options table from the configuration.
REGISTRY: dict[str, Callable[..., Policy]] = {
    "fifo": FifoPolicy,
    "drf": DrfPolicy,
    "soda-arrays": ArrayPolicy,
    "swaf": SwafPolicy,
    "capacity": CapacityPolicy,
    "min-min": MinMinPolicy,
    "weighted-fair": WeightedFairPolicy,
    "tetris-perf": TetrisPerfPolicy,
    "tetris-cer": TetrisCerPolicy,
    "sjf": SjfPolicy,
}


def make_policy(name: str, **options: object) -> Policy:
    try:
        factory = REGISTRY[name]
    except KeyError:
        known = ", ".join(sorted(REGISTRY))
        raise ValueError(f"unknown scheduling policy {name!r}; known: {known}") from None
    return factory(**options)
