"""Scheduling policies, each a plain class implementing :class:`masterd.core.policy.Policy`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from masterd.core.arrays.policy import ArrayPolicy
from masterd.core.policies.capacity import CapacityPolicy
from masterd.core.policies.drf import DrfPolicy
from masterd.core.policies.fifo import FifoPolicy
from masterd.core.policies.liquid import LiquidPolicy
from masterd.core.policies.liquid_baselines import (
    BuddyCellPolicy,
    EvenSpreadPolicy,
    LeastRequestedPolicy,
    RandomPolicy,
)
from masterd.core.policies.minmin import MinMinPolicy
from masterd.core.policies.qssf import QssfPolicy
from masterd.core.policies.sched2 import Sched2Policy
from masterd.core.policies.sched2_baselines import (
    DsifPolicy,
    HoldPolicy,
    LrfPolicy,
    SafPolicy,
    SifPolicy,
    SpfPolicy,
)
from masterd.core.policies.sched2_scorer import Sched2ScorerPolicy
from masterd.core.policies.sjf import SjfPolicy
from masterd.core.policies.swaf import SwafPolicy
from masterd.core.policies.tetris import TetrisCerPolicy, TetrisPerfPolicy
from masterd.core.policies.weighted_fair import WeightedFairPolicy
from masterd.core.policy import Policy

# name -> factory taking the policy's options table from the configuration: every policy that
# orders one queue (what SODA's arrays may use inside each array) ...
POLICIES: dict[str, Callable[..., Policy]] = {
    "fifo": FifoPolicy,
    "drf": DrfPolicy,
    "swaf": SwafPolicy,
    "capacity": CapacityPolicy,
    "min-min": MinMinPolicy,
    "weighted-fair": WeightedFairPolicy,
    "tetris-perf": TetrisPerfPolicy,
    "tetris-cer": TetrisCerPolicy,
    "sjf": SjfPolicy,
    "qssf": QssfPolicy,
    # SCHED² (seeds/sched2.md) and the baselines of its evaluation, with its packing.
    "sched2": Sched2Policy,
    "sif": SifPolicy,
    "dsif": DsifPolicy,
    "saf": SafPolicy,
    "lrf": LrfPolicy,
    "spf": SpfPolicy,
    "sched2-hold": HoldPolicy,
    # Beyond SCHED²: one learned scorer over every waiting job instead of a window of J.
    "sched2-scorer": Sched2ScorerPolicy,
}


def soda_arrays(config: Any = None, **options: Any) -> ArrayPolicy:
    """SODA's multi-array pools, their arrays ordered by the policies above."""
    return ArrayPolicy(config, registry=POLICIES, **options)


# ... and every policy, the composite ones too.
REGISTRY: dict[str, Callable[..., Policy]] = {**POLICIES, ArrayPolicy.name: soda_arrays}
# Liquid (seeds/liquid.md) and the placements its evaluation compares it with: each places a
# job's tasks (workers and parameter server) itself, so none orders an array's queue.
REGISTRY.update({
    LiquidPolicy.name: LiquidPolicy,
    RandomPolicy.name: RandomPolicy,
    EvenSpreadPolicy.name: EvenSpreadPolicy,
    LeastRequestedPolicy.name: LeastRequestedPolicy,
    BuddyCellPolicy.name: BuddyCellPolicy,
})


def make_policy(name: str, **options: object) -> Policy:
    try:
        factory = REGISTRY[name]
    except KeyError:
        known = ", ".join(sorted(REGISTRY))
        raise ValueError(f"unknown scheduling policy {name!r}; known: {known}") from None
    return factory(**options)
