"""Scheduling policies, each a plain class implementing :class:`masterd.core.policy.Policy`."""

from __future__ import annotations

from collections.abc import Callable

from masterd.core.policies.fifo import FifoPolicy
from masterd.core.policies.swaf import SwafPolicy
from masterd.core.policy import Policy

# name -> factory taking the policy's options table from the configuration.
REGISTRY: dict[str, Callable[..., Policy]] = {
    "fifo": FifoPolicy,
    "swaf": SwafPolicy,
}


def make_policy(name: str, **options: object) -> Policy:
    try:
        factory = REGISTRY[name]
    except KeyError:
        known = ", ".join(sorted(REGISTRY))
        raise ValueError(f"unknown scheduling policy {name!r}; known: {known}") from None
    return factory(**options)
