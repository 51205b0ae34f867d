"""Maintenance windows: nodes taken out of service for a stretch of time, planned ahead
(Slurm's ``scontrol create reservation flags=maint``).

Before a window, a job may start on its nodes only if its time limit ends before the window
begins (a job without a limit never does: it could run into it); during the window nothing
starts there, and the node reads ``maintenance`` with the window's reason. Running jobs are
left alone: ``trellisctl maintenance list`` names those whose limit crosses the window, so
an operator can act. The master stamps each node's inventory with the seconds left before
its next window (``NodeInventory.maintenance_in_s``), which the one eligibility test reads.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable
from dataclasses import dataclass

from shared.hostlist import HostlistError, expand
from shared.model import NAME_PATTERN
from shared.schema import bounded

# How often the master refreshes the nodes' horizons; a horizon is stamped this much (and
# a minute's rounding) short, so between refreshes no job can be let through that would
# run into the window.
REFRESH_S = 30.0


class MaintenanceError(ValueError):
    """A window that cannot be planned; one sentence naming it."""


@dataclass(frozen=True)
class Window:
    name: str = bounded(pattern=NAME_PATTERN)
    nodes: str = bounded(max_len=65_536)  # a Slurm node list
    start: float = bounded(min=0)  # seconds since the epoch
    end: float = bounded(min=0)
    reason: str = bounded("", max_len=512)

    def node_names(self) -> tuple[str, ...]:
        return _node_names(self.name, self.nodes)


@functools.lru_cache(maxsize=1024)
def _node_names(name: str, nodes: str) -> tuple[str, ...]:
    """A window's node list, expanded once (the master reads it at every pass)."""
    try:
        return tuple(expand(nodes, f"maintenance window {name!r}: nodes"))
    except HostlistError as exc:
        raise MaintenanceError(str(exc)) from None


def check(window: Window, others: Iterable[Window], known_nodes: Iterable[str],
          now: float) -> None:
    """Refuse a window that cannot be planned beside ``others``: in the past, ending before
    it starts, on nodes never seen, or overlapping another window on a node."""
    where = f"maintenance window {window.name!r}"
    if not window.end > window.start:
        raise MaintenanceError(f"{where} ends before it starts")
    if window.end <= now:
        raise MaintenanceError(f"{where} is in the past")
    names = window.node_names()
    unknown = sorted(set(names) - set(known_nodes))
    if unknown:
        raise MaintenanceError(f"{where} names node(s) the master has never seen: "
                               f"{', '.join(unknown[:10])}")
    mine = set(names)
    for other in others:
        if other.name == window.name:
            raise MaintenanceError(f"{where} exists already")
        shared = mine.intersection(other.node_names())
        if shared and other.start < window.end and window.start < other.end:
            raise MaintenanceError(f"{where} overlaps window {other.name!r} on "
                                   f"{', '.join(sorted(shared)[:10])}")


def seconds_before(start: float, now: float) -> float:
    """The seconds a node's inventory carries before a block in time that begins at
    ``start`` (0: it has begun): short by REFRESH_S and rounded down to the minute, so a
    stamp changes once a minute and never lets through a job that would run into it."""
    left = start - now - REFRESH_S
    return 0.0 if left <= 0 else math.floor(left / 60.0) * 60.0


def horizons(windows: Iterable[Window], now: float) -> dict[str, tuple[float, Window]]:
    """Per node with a window not over yet: the seconds to stamp before its next one (0:
    inside it), conservative for REFRESH_S, and that window."""
    found: dict[str, tuple[float, Window]] = {}
    for window in windows:
        if window.end <= now:
            continue
        stamp = seconds_before(window.start, now)
        for node in window.node_names():
            held = found.get(node)
            if held is None or window.start < held[1].start:
                found[node] = (stamp, window)
    return found
