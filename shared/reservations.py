"""Reservations: nodes set aside for some users or accounts for a stretch of time (Slurm's
``scontrol create reservation``): a course's 16 GPUs on Thursday 14:00-16:00, a demo.

For every job not in it a reservation is a block in time on its nodes, as a maintenance
window is (shared/maintenance.py): before it, a job starts there only if its time limit ends
before the reservation begins (a job without a limit never does); while it lasts nothing else
starts there. A job in it (``--reservation NAME``, from one of its users or accounts) starts
once it has begun, only on its nodes, and is stopped when it ends (Slurm's default, no
overrun). Flags:

* ``maint``: the nodes read ``maintenance`` while it lasts; it may have no users at all.
* ``ignore_jobs``: created even though jobs already running on its nodes would run into it
  (without it that is refused, naming them).
* ``flex``: its jobs may also start before it begins, run past its end and use other nodes
  as any job may (the flag as it was when a job was submitted holds for that job).

Nodes are named, or counted: ``gpus`` of a GPU model reserves the fewest whole nodes of that
model holding that many, chosen when it is created.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from shared.hostlist import HostlistError, expand
from shared.maintenance import seconds_before
from shared.model import NAME_PATTERN, ReservationHold
from shared.schema import bounded

FLAGS = ("maint", "ignore_jobs", "flex")


class ReservationError(ValueError):
    """A reservation that cannot be made; one sentence naming it."""


@dataclass(frozen=True)
class NodeReservation:
    name: str = bounded(pattern=NAME_PATTERN)
    nodes: str = bounded(max_len=65_536)  # a Slurm node list
    start: float = bounded(min=0)  # seconds since the epoch
    end: float = bounded(min=0)
    users: tuple[str, ...] = bounded(default_factory=tuple, max_len=256,
                                     pattern=r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
    accounts: tuple[str, ...] = bounded(default_factory=tuple, max_len=256,
                                        pattern=NAME_PATTERN)
    flags: tuple[str, ...] = bounded(default_factory=tuple, max_len=16)
    reason: str = bounded("", max_len=512)

    def node_names(self) -> tuple[str, ...]:
        return _node_names(self.name, self.nodes)

    @property
    def maint(self) -> bool:
        return "maint" in self.flags

    @property
    def flex(self) -> bool:
        return "flex" in self.flags

    def may_use(self, user: str, account: str | None) -> bool:
        """A job of ``user`` under ``account`` may run in it."""
        return user in self.users or (account is not None and account in self.accounts)

    def who(self) -> str:
        """Its users and accounts as people read them."""
        parts = [f"user {', '.join(self.users)}"] if self.users else []
        if self.accounts:
            parts.append(f"account {', '.join(self.accounts)}")
        return " and ".join(parts) or "nobody (maint)"


@functools.lru_cache(maxsize=1024)
def _node_names(name: str, nodes: str) -> tuple[str, ...]:
    """A reservation's node list, expanded once (the master reads it at every pass)."""
    try:
        return tuple(expand(nodes, f"reservation {name!r}: nodes"))
    except HostlistError as exc:
        raise ReservationError(str(exc)) from None


def check(reservation: NodeReservation, others: Iterable[NodeReservation],
          known_nodes: Iterable[str], now: float) -> None:
    """Refuse a reservation that cannot be made beside ``others`` (itself excluded by name,
    so an update checks the same way): in the past, ending before it starts, with unknown
    flags, on nodes never seen, overlapping another on a node, or usable by nobody."""
    where = f"reservation {reservation.name!r}"
    unknown_flags = [f for f in reservation.flags if f not in FLAGS]
    if unknown_flags:
        raise ReservationError(f"{where}: unknown flag(s) {', '.join(unknown_flags)} "
                               f"(known: {', '.join(FLAGS)})")
    if not reservation.end > reservation.start:
        raise ReservationError(f"{where} ends before it starts")
    if reservation.end <= now:
        raise ReservationError(f"{where} is in the past")
    if not reservation.users and not reservation.accounts and not reservation.maint:
        raise ReservationError(f"{where} names no user and no account: nobody could use it "
                               "(a maintenance reservation takes flag maint)")
    names = reservation.node_names()
    if not names:
        raise ReservationError(f"{where} names no node")
    unknown = sorted(set(names) - set(known_nodes))
    if unknown:
        raise ReservationError(f"{where} names node(s) the master has never seen: "
                               f"{', '.join(unknown[:10])}")
    mine = set(names)
    for other in others:
        if other.name == reservation.name:
            continue
        shared = mine.intersection(other.node_names())
        if shared and other.start < reservation.end and reservation.start < other.end:
            raise ReservationError(f"{where} overlaps reservation {other.name!r} on "
                                   f"{', '.join(sorted(shared)[:10])}")


def holds(reservations: Iterable[NodeReservation],
          now: float) -> dict[str, tuple[ReservationHold, ...]]:
    """Per node, the reservations not over yet that hold it, as its inventory carries them
    (earliest first)."""
    found: dict[str, list[ReservationHold]] = {}
    for reservation in sorted(reservations, key=lambda r: (r.start, r.name)):
        if reservation.end <= now:
            continue
        hold = ReservationHold(reservation.name, seconds_before(reservation.start, now))
        for node in reservation.node_names():
            found.setdefault(node, []).append(hold)
    return {node: tuple(held) for node, held in found.items()}


@dataclass(frozen=True)
class Candidate:
    """A node a counted reservation could take: its name, GPU model and GPU count, and how
    many jobs running there would run into the reservation (fewer is better)."""

    name: str
    gpu_model: str | None
    gpus: int
    crossing: int


def pick_nodes(gpus: int, gpu_model: str | None,
               candidates: Sequence[Candidate]) -> list[str]:
    """The fewest whole nodes of ``gpu_model`` (None: any single model) holding ``gpus``
    GPUs, preferring nodes no running job would run into the reservation from, then larger
    nodes. Raises ReservationError when the cluster has not that many."""
    if gpus < 1:
        raise ReservationError("a reservation by count needs at least one GPU")
    by_model: dict[str | None, list[Candidate]] = {}
    for c in candidates:
        if c.gpus and (gpu_model is None or c.gpu_model == gpu_model):
            by_model.setdefault(c.gpu_model, []).append(c)
    best: list[str] | None = None
    for found in by_model.values():
        # The fewest nodes that can hold it; among such sets, nodes nobody runs into it on.
        fewest = _take(sorted(found, key=lambda c: (-c.gpus, c.crossing > 0, c.name)), gpus)
        if fewest is None:
            continue
        calm = _take(sorted(found, key=lambda c: (c.crossing > 0, -c.gpus, c.name)), gpus)
        chosen = calm if calm is not None and len(calm) == len(fewest) else fewest
        if best is None or len(chosen) < len(best):
            best = chosen
    if best is None:
        model = f" of model {gpu_model}" if gpu_model else " of one model"
        raise ReservationError(f"the cluster has no {gpus} GPUs{model} on nodes free of "
                               "other reservations then")
    return sorted(best)


def _take(ordered: Sequence[Candidate], gpus: int) -> list[str] | None:
    """The first nodes of ``ordered`` that hold ``gpus`` GPUs together (None: all do not)."""
    chosen, total = [], 0
    for c in ordered:
        if total >= gpus:
            break
        chosen.append(c.name)
        total += c.gpus
    return chosen if total >= gpus else None
