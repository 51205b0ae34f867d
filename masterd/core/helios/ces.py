"""Cluster Energy Saving decisions (Helios §4.3, Algorithm 2): pure, one call per step.

Time advances in steps (10 minutes in Helios). ``busy`` is the number of nodes running jobs,
``powered`` the number of nodes powered on (Helios' "Active"), ``total`` every node.

* Wake-up (JOBARRIVALCHECK, and at every step): when demand exceeds the powered nodes, power
  on ``demand + σ`` (σ: the buffer of idle powered nodes kept for unexpected jobs) and hold
  the count for ``cooldown_steps`` steps.
* Power-down (PERIODICCHECK): when the busy count fell over the last ``history_steps`` steps
  (by at least ``history_threshold``), the forecast says it will not rise over the next
  ``future_steps`` (busy now − mean forecast >= ``future_threshold``), the cool-down has
  passed and the forecast's next ``future_steps`` are not below its next ``2·future_steps``
  (no rise coming right after), reduce the powered nodes to ``busy + σ`` if that sheds at
  least ``min_decrease`` nodes.

Without a forecast (no model yet) the forecast's two conditions are skipped: decisions follow
the recent trend alone. :func:`vanilla_step` is the baseline Helios compares with: power down
every idle node beyond σ at once, wake as needed, no trends and no cool-down.

Defaults are the Helios artifact's Philly settings (``CES_Philly.py``): σ = 20, 2 steps of
history, 30 steps (5 h) ahead, thresholds 0.1 and 0, minimum decrease 1, cool-down 10 steps.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class CesParams:
    buffer: int = 20  # σ: idle nodes kept powered
    history_steps: int = 2
    future_steps: int = 30
    history_threshold: float = 0.1
    future_threshold: float = 0.0
    min_decrease: int = 1
    cooldown_steps: int = 10

    def __post_init__(self) -> None:
        for name in ("buffer", "min_decrease", "cooldown_steps"):
            if getattr(self, name) < 0:
                raise ValueError(f"CES {name} must not be negative, got {getattr(self, name)}")
        for name in ("history_steps", "future_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"CES {name} must be at least 1, got {getattr(self, name)}")


@dataclass
class CesState:
    powered: int
    hold_until: int = 0  # no power-down before this step (cool-down after a wake-up)


@dataclass(frozen=True)
class StepResult:
    powered: int  # nodes powered on after this step
    woken: int  # nodes powered on by this step (> 0: one wake-up)
    shed: int  # nodes powered down by this step


def wake_for(params: CesParams, powered: int, demand: int, total: int) -> int:
    """Nodes to power on now so that ``demand`` nodes are available (0 if enough are)."""
    if demand <= powered:
        return 0
    return max(0, min(total, demand + params.buffer) - powered)


def step(params: CesParams, state: CesState, i: int, busy_before: Sequence[float], busy: int,
         forecast: Sequence[float] | None, total: int) -> StepResult:
    """One step ``i``: ``busy_before`` holds the busy counts of the steps before ``i`` (at
    least ``history_steps`` of them), ``forecast`` the predicted busy counts of steps ``i``,
    ``i+1``, ... (at least ``2·future_steps`` of them) or None."""
    before = state.powered
    woken = wake_for(params, state.powered, busy, total)
    if woken:
        state.powered += woken
        state.hold_until = i + params.cooldown_steps
    state.powered = min(state.powered, total)
    shed = 0
    if _may_shed(params, state, i, busy_before, busy, forecast):
        target = min(state.powered, busy + params.buffer)
        if state.powered - target >= max(params.min_decrease, 1):
            shed = state.powered - target
            state.powered = target
    return StepResult(powered=state.powered, woken=max(0, state.powered - before) if woken
                      else 0, shed=shed)


def _may_shed(params: CesParams, state: CesState, i: int, busy_before: Sequence[float],
              busy: int, forecast: Sequence[float] | None) -> bool:
    recent = busy_before[-params.history_steps:]
    if len(recent) < params.history_steps:
        return False
    if _mean(recent) - busy < params.history_threshold:
        return False
    if forecast is not None:
        f = params.future_steps
        if len(forecast) < 2 * f:
            raise ValueError(f"CES needs {2 * f} forecast steps, got {len(forecast)}")
        near = _mean(forecast[:f])
        if busy - near < params.future_threshold:
            return False
        if near < _mean(forecast[:2 * f]):
            return False  # a rise follows the near future: keep the nodes
    return i >= state.hold_until


def vanilla_step(params: CesParams, state: CesState, busy: int, total: int) -> StepResult:
    """Power-down-when-idle: keep exactly ``busy + σ`` powered, whatever comes next."""
    before = state.powered
    target = min(total, busy + params.buffer)
    state.powered = target
    return StepResult(powered=target, woken=max(0, target - before),
                      shed=max(0, before - target))


def _mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values)
