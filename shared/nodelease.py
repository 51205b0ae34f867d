"""The node lease: when a node cut off from every master stops its requeueable parts itself.

A master declares a node lost ``node_lost_s`` after it last heard from it and requeues the
jobs with a part there that may be requeued (masterd/core/failures.py): they run again
elsewhere. The lost node cannot hear that. So each launch says whether the master would
requeue the part's job if the node were lost (``PrepareJob.requeue_if_lost``, with the
part's grace), the ack of every hello gives the node the master's terms (``LeaseTerms``),
and a node that has heard nothing from a leading master for

    node_lost_s - margin_s - grace

stops each such part on its own (SIGTERM, SIGKILL after the grace): it is dead
``margin_s`` before the master could requeue it, so no part of a job runs twice at once.

``margin_s`` is ``1.5 × node_heartbeat_s + node_fence_margin_s``. The first term is how much
later a node may last hear from the master than the master last heard from it (the link cut
only towards the master: the node still receives the master's pings until the master's
heartbeat gives up, 1.5 heartbeats on); the second covers timer slack, network delay and
clocks that advance at slightly different rates (both sides count on monotonic clocks, so
only their rates matter, not their settings). A part the master would not requeue (it asked
``--no-requeue``, or has used up ``max_requeues``) is left running: nothing replaces it.

Plain and synchronous, with no clock of its own: the node's daemon (noded/selffence.py)
drives it, and the master's configuration checks its terms (``lease_problem``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from shared.schema import bounded

# How much of node_heartbeat_s the margin counts: the master's WebSocket heartbeat gives up
# on a peer half a period after a ping it sent a period after the last data it received.
HEARTBEAT_SPAN = 1.5


@dataclass(frozen=True)
class LeaseTerms:
    """What the ack of a node's hello tells the node of the master's node loss."""

    # Seconds of silence after which the master declares the node lost and requeues its
    # requeueable jobs (its node_lost_s); 0: never, and the node stops nothing on its own.
    node_lost_s: float = bounded(0.0, min=0, max=30 * 86400)
    # How long before that each such part must be dead: 1.5 × node_heartbeat_s +
    # node_fence_margin_s.
    margin_s: float = bounded(0.0, min=0, max=30 * 86400)
    # The longest grace the master gives a stop (its max_grace_s): a part launched with a
    # longer one (before a reload lowered it) gets this much.
    max_grace_s: float = bounded(3600.0, min=0, max=3600)

    @property
    def active(self) -> bool:
        return self.node_lost_s > 0


@dataclass(frozen=True)
class LeasedPart:
    """A part running on the node, as the lease sees it."""

    job_id: str
    restarts: int
    # The master would requeue its job if this node were lost (said at launch).
    requeue_if_lost: bool
    # Its SIGTERM-to-SIGKILL grace (said at launch).
    grace_s: float


def lease_margin(node_heartbeat_s: float, node_fence_margin_s: float) -> float:
    """The margin a master gives its nodes (see the module's docstring)."""
    return HEARTBEAT_SPAN * node_heartbeat_s + node_fence_margin_s


def lease_problem(node_lost_s: float, max_grace_s: float, node_heartbeat_s: float,
                  node_fence_margin_s: float, node_grace_s: float) -> str | None:
    """Why a master's configuration cannot keep a cut-off node's requeueable parts from
    running twice (one sentence), or None when it can.

    A part with the longest grace must be stopped no sooner than ``node_grace_s`` of silence
    (before the master even marks the node unreachable: a short glitch costs nothing), and
    dead ``margin`` before ``node_lost_s``.
    """
    if node_lost_s <= 0:
        return None  # no node loss: nothing is requeued, and nodes stop nothing
    margin = lease_margin(node_heartbeat_s, node_fence_margin_s)
    least = node_grace_s + max_grace_s + margin
    if node_lost_s >= least - 1e-9:  # sums of decimal fractions are inexact
        return None
    return (f"node_lost_s ({node_lost_s:g}) is too short for a node cut off from every master "
            f"to stop its requeueable jobs before they are requeued elsewhere: it must be at "
            f"least node_grace_s ({node_grace_s:g}) + max_grace_s ({max_grace_s:g}) + "
            f"{HEARTBEAT_SPAN:g} × node_heartbeat_s ({node_heartbeat_s:g}) + "
            f"node_fence_margin_s ({node_fence_margin_s:g}) = {least:g} (or 0: nodes are "
            f"never declared lost)")


def part_grace(part: LeasedPart, terms: LeaseTerms) -> float:
    """The grace the node gives a part it stops on its own: its own, at most max_grace_s."""
    return min(part.grace_s, terms.max_grace_s)


def fence_after(part: LeasedPart, terms: LeaseTerms) -> float | None:
    """Seconds of silence after which the node stops ``part`` (None: never: the master
    would not requeue it, or never declares a node lost)."""
    if not terms.active or not part.requeue_if_lost:
        return None
    return max(0.0, terms.node_lost_s - terms.margin_s - part_grace(part, terms))


def due(parts: Iterable[LeasedPart], terms: LeaseTerms | None, heard: float | None,
        now: float) -> list[LeasedPart]:
    """The parts to stop at ``now``: ``heard`` is when the node last heard from a leading
    master (None: never since it started, and no terms are known then either); in the
    order given."""
    if terms is None or heard is None:
        return []
    silent = now - heard
    found = []
    for part in parts:
        after = fence_after(part, terms)
        if after is not None and silent >= after:
            found.append(part)
    return found


def next_due(parts: Iterable[LeasedPart], terms: LeaseTerms | None,
             heard: float | None) -> float | None:
    """When the next part falls due if nothing is heard meanwhile (None: none will)."""
    if terms is None or heard is None:
        return None
    afters = [a for a in (fence_after(p, terms) for p in parts) if a is not None]
    return heard + min(afters) if afters else None


def fence_reason(node: str, silent_s: float, part: LeasedPart, terms: LeaseTerms) -> str:
    """The sentence a part stopped by its node carries (its exit's reason, the journal)."""
    return (f"stopped by node {node}: no contact with any master for {silent_s:.0f} s, and "
            f"the master requeues its jobs elsewhere after {terms.node_lost_s:g} s "
            f"(grace {part_grace(part, terms):g} s, margin {terms.margin_s:g} s)")
