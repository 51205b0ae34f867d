"""First in, first out with packing (or Helios' consolidated) placement."""

from __future__ import annotations

from collections.abc import Sequence

from masterd.core.backfill import Reservation, easy_backfill
from masterd.core.cluster import ClusterSnapshot
from masterd.core.consolidate import check_placement, start_in_order
from masterd.core.policy import Decision
from shared.model import Job


class FifoPolicy:
    """Start jobs strictly in queue order; the first job that does not fit blocks the rest.

    Blocking is the point of FIFO (no job is overtaken); ``backfill=True`` lets later jobs use
    resources the blocked head cannot use, which trades strict order for utilisation and can
    starve a large head; ``backfill="easy"`` lets them only where they do not delay the head
    (EASY: the head gets a reservation from running jobs' time limits, masterd/core/backfill.py;
    ``reservation`` holds it after each pass, None when nothing waits).
    ``placement="consolidate"`` places as Helios does (one node, or whole free nodes).
    """

    name = "fifo"

    def __init__(self, backfill: bool | str = False, placement: str = "pack") -> None:
        if not (isinstance(backfill, bool) or backfill == "easy"):
            raise ValueError(f"backfill must be true, false or \"easy\", got {backfill!r}")
        self.backfill = backfill
        self.placement = check_placement(placement)
        self.reservation: Reservation | None = None

    def decide(
        self, snapshot: ClusterSnapshot, queue: Sequence[Job], now: float
    ) -> list[Decision]:
        if self.backfill == "easy":
            decisions, self.reservation = easy_backfill(snapshot, queue, self.placement, now)
            return decisions
        return start_in_order(snapshot, queue, self.placement, bool(self.backfill))
