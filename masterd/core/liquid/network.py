"""How far apart two nodes are in the network (Liquid's ``Cost(Node1, Node2)``, Eq. 2).

Liquid's code weighs the traffic between two tasks by 1 when their nodes share a rack, 4 when
they share a network domain but not a rack, 40 across domains, and 0 on the same node. Racks
and domains come from each node's configuration (``node.rack``, ``node.domain``, sent in its
hello); a node that names none is in the default rack of the default domain.
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.model import NodeInventory


@dataclass(frozen=True)
class Distances:
    same_rack: float = 1.0
    same_domain: float = 4.0
    other_domain: float = 40.0

    def between(self, a: NodeInventory, b: NodeInventory) -> float:
        if a.name == b.name:
            return 0.0
        if a.domain != b.domain:
            return self.other_domain
        if a.rack != b.rack:
            return self.same_domain
        return self.same_rack
