"""Why a node takes no new work: its conditions, each with a reason and since when.

A node is schedulable exactly when it has no condition. Each condition is set and cleared by
whoever knows about it (the master when a node connects or disconnects, an operator's drain,
a power state, the simulator's node failures) and the core derives the one schedulable bit the
placers read from all of them, so no caller recomputes it from the others' sets (the master
once did, in four places, and each had to know every other reason a node could be closed).

The reasons are what ``trellisctl node`` and the wait explainer show ("drained: disk
replacement"); the kinds are a small closed vocabulary, in the order a person reading one
line about a node wants the most fundamental first.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

# The kinds, most fundamental first: a node that is not connected is that before it is
# anything else; an operator's drain before the energy saver's power state.
DISCONNECTED = "disconnected"
DRAINED = "drained"
MAINTENANCE = "maintenance"  # inside a planned window (shared/maintenance.py)
POWER = "power"
KINDS = (DISCONNECTED, DRAINED, MAINTENANCE, POWER)
_RANK = {kind: rank for rank, kind in enumerate(KINDS)}


@dataclass(frozen=True)
class NodeCondition:
    """One reason a node takes no new work."""

    kind: str
    reason: str  # a sentence for people: "drained by an operator: disk replacement"
    since: float | None = None  # when it began, where the setter knows

    def __str__(self) -> str:
        return self.reason


class NodeConditions:
    """Every node's conditions; a node with none is schedulable."""

    def __init__(self) -> None:
        self._by_node: dict[str, dict[str, NodeCondition]] = {}

    def set(self, node: str, kind: str, reason: str, since: float | None = None) -> None:
        if kind not in _RANK:
            raise ValueError(f"node condition {kind!r} is not one of {', '.join(KINDS)}")
        self._by_node.setdefault(node, {})[kind] = NodeCondition(kind, reason, since)

    def clear(self, node: str, kind: str) -> None:
        held = self._by_node.get(node)
        if held is not None:
            held.pop(kind, None)
            if not held:
                del self._by_node[node]

    def has(self, node: str, kind: str) -> bool:
        return kind in self._by_node.get(node, {})

    def schedulable(self, node: str) -> bool:
        return node not in self._by_node

    def of(self, node: str) -> tuple[NodeCondition, ...]:
        """The node's conditions, most fundamental first."""
        held = self._by_node.get(node)
        if not held:
            return ()
        return tuple(sorted(held.values(), key=lambda c: _RANK[c.kind]))

    def closed(self) -> Mapping[str, tuple[NodeCondition, ...]]:
        """Every node with a condition, and its conditions (read-only)."""
        return MappingProxyType({node: self.of(node) for node in self._by_node})
