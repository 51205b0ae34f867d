"""First in, first out with packing (or Helios' consolidated) placement."""

from __future__ import annotations

from collections.abc import Sequence

from masterd.core.cluster import ClusterSnapshot
from masterd.core.consolidate import check_placement, start_in_order
from masterd.core.policy import Decision
from shared.model import Job


class FifoPolicy:
    """Start jobs strictly in queue order; the first job that does not fit blocks the rest.

    Blocking is the point of FIFO (no job is overtaken); ``backfill=True`` lets later jobs use
    resources the blocked head cannot use, which trades strict order for utilisation.
    ``placement="consolidate"`` places as Helios does (one node, or whole free nodes).
    """

    name = "fifo"

    def __init__(self, backfill: bool = False, placement: str = "pack") -> None:
        self.backfill = backfill
        self.placement = check_placement(placement)

    def decide(
        self, snapshot: ClusterSnapshot, queue: Sequence[Job], now: float
    ) -> list[Decision]:
        return start_in_order(snapshot, queue, self.placement, self.backfill)
