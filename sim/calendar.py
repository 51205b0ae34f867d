"""Maintenance windows and hand drains in a replay, applied to the scheduling core as the
master applies them, so a replay answers what planning a window costs against draining.

* A window (shared/maintenance.py) stamps its nodes' inventories with the seconds left
  before it, before every pass, with the master's own conservative stamps
  (``shared.maintenance.horizons``): the one eligibility test then keeps every policy from
  starting a job there whose time limit crosses it, and inside it nothing starts there.
* A drain closes its nodes with the ``drained`` condition at its start (nothing new starts
  there, running jobs go on, as ``trellisctl drain``) and opens them at its end.
* Watched nodes have their allocated GPUs recorded at every change, so a study can count the
  GPU-time lost on them before a window.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from masterd.core.conditions import DRAINED
from masterd.core.scheduler import SchedulingCore
from shared.maintenance import Window, horizons
from shared.model import NodeInventory, Placement


class CalendarError(ValueError):
    """A window or drain the replay cannot apply; one sentence naming it."""


@dataclass(frozen=True)
class Drain:
    """Nodes drained by hand from ``start`` to ``end`` (seconds on the replay's clock)."""

    nodes: tuple[str, ...]
    start: float
    end: float


class NodeCalendar:
    def __init__(self, core: SchedulingCore, windows: Iterable[Window],
                 drains: Iterable[Drain], inventories: dict[str, NodeInventory],
                 watch: Iterable[str] = ()) -> None:
        self.core = core
        self.windows = tuple(windows)
        self.drains = tuple(drains)
        for nodes, what in [(w.node_names(), f"window {w.name}") for w in self.windows] + [
                (d.nodes, f"drain at {d.start:g}") for d in self.drains]:
            unknown = sorted(set(nodes) - inventories.keys())
            if unknown:
                raise CalendarError(f"{what} names unknown node(s) {', '.join(unknown[:5])}")
        for d in self.drains:
            if not d.end > d.start:
                raise CalendarError(f"drain at {d.start:g} ends before it starts")
        self._stamped = {n for w in self.windows for n in w.node_names()}
        self.watch = frozenset(watch)
        unknown = sorted(self.watch - inventories.keys())
        if unknown:
            raise CalendarError(f"watched node(s) unknown: {', '.join(unknown[:5])}")
        self._watched_gpus = 0
        # (time, GPUs allocated on the watched nodes) at every change.
        self.watched: list[tuple[float, int]] = [(0.0, 0)]
        # Per window: the jobs placed on its nodes when it began.
        self.running_at_start: dict[str, int] = {}

    def events(self, node_jobs: dict[str, set[str]]) -> list[tuple[float, Callable[[], bool]]]:
        """The moments the calendar acts, each with what it does there (True: a pass
        follows). ``node_jobs`` is the replay's jobs per node, read when a window begins."""
        out: list[tuple[float, Callable[[], bool]]] = []
        for window in self.windows:
            def began(w: Window = window) -> bool:
                self.running_at_start[w.name] = len(set().union(
                    *(node_jobs[n] for n in w.node_names())))
                return True
            out.append((window.start, began))
            out.append((window.end, lambda: True))  # its nodes take work again
        for drain in self.drains:
            out.append((drain.start, lambda d=drain: self._drain(d, True)))
            out.append((drain.end, lambda d=drain: self._drain(d, False)))
        return out

    def _drain(self, drain: Drain, closed: bool) -> bool:
        for node in drain.nodes:
            self.core.set_condition(node, DRAINED, "drained for maintenance" if closed
                                    else None, drain.start if closed else None)
        return True

    def before_pass(self, now: float) -> None:
        """Stamp each window node with the seconds before its next window (the master's
        maintenance feature does this before every pass)."""
        if not self._stamped:
            return
        found = horizons(self.windows, now)
        for node in self._stamped:
            view = self.core.cluster.node(node)
            if view is None:
                continue
            held = found.get(node)
            stamp = None if held is None else held[0]
            if view.inventory.maintenance_in_s != stamp:
                self.core.update_inventory(replace(view.inventory, maintenance_in_s=stamp))

    def placed(self, placement: Placement, now: float, sign: int) -> None:
        """A placement was taken (+1) or given back (-1)."""
        if not self.watch:
            return
        change = sum(len(a.gpus) for a in placement.allocations if a.node in self.watch)
        if not change:
            return
        self._watched_gpus += sign * change
        if self.watched[-1][0] == now:
            self.watched[-1] = (now, self._watched_gpus)
        else:
            self.watched.append((now, self._watched_gpus))


def gpu_seconds(series: list[tuple[float, int]], start: float, end: float) -> float:
    """The integral of a step series of (time, GPUs) over [start, end)."""
    total = 0.0
    for (t, gpus), (t_next, _) in zip(series, [*series[1:], (end, 0)], strict=True):
        lo, hi = max(t, start), min(t_next, end)
        if hi > lo:
            total += gpus * (hi - lo)
    return total
