"""The RPC of reservations (``trellisctl reservation``), served by the reservations feature
(``masterd.features.reservations``). Listing is open to every caller (users see what they
may use and why a node is closed to them); creating, updating and deleting are an admin's."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from masterd.core.scheduler import JobError
from masterd.features.reservations import Reservations
from shared.model import NAME_PATTERN
from shared.reservations import NodeReservation
from shared.rpcdoc import returns
from shared.schema import bounded

USER_PATTERN = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}"


@dataclass(frozen=True)
class NoParams:
    pass


@dataclass(frozen=True)
class CreateParams:
    name: str = bounded(pattern=NAME_PATTERN)
    start: float = bounded(min=0)  # seconds since the epoch
    # Its end, or its length in seconds (one of the two).
    end: float | None = bounded(None, min=0)
    duration_s: float | None = bounded(None, min=1, max=366 * 86400)
    # Its nodes (a Slurm node list), or a count of GPUs (of `gpu_model`, or of any one
    # model): one of the two.
    nodes: str | None = bounded(None, max_len=65_536)
    gpus: int | None = bounded(None, min=1, max=1_000_000)
    gpu_model: str | None = bounded(None, max_len=128)
    # Who may use it: these users, and every user's jobs in these accounts.
    users: tuple[str, ...] = bounded(default_factory=tuple, max_len=256, pattern=USER_PATTERN)
    accounts: tuple[str, ...] = bounded(default_factory=tuple, max_len=256,
                                        pattern=NAME_PATTERN)
    # maint, ignore_jobs, flex (docs/reservations.md).
    flags: tuple[str, ...] = bounded(default_factory=tuple, max_len=16)
    reason: str = bounded("", max_len=512)


@dataclass(frozen=True)
class UpdateParams:
    """What is given changes; what is left out stays."""

    name: str = bounded(pattern=NAME_PATTERN)
    start: float | None = bounded(None, min=0)
    end: float | None = bounded(None, min=0)
    duration_s: float | None = bounded(None, min=1, max=366 * 86400)
    nodes: str | None = bounded(None, max_len=65_536)
    users: tuple[str, ...] | None = bounded(None, max_len=256, pattern=USER_PATTERN)
    accounts: tuple[str, ...] | None = bounded(None, max_len=256, pattern=NAME_PATTERN)
    flags: tuple[str, ...] | None = bounded(None, max_len=16)
    reason: str | None = bounded(None, max_len=512)


@dataclass(frozen=True)
class NameParams:
    name: str = bounded(pattern=NAME_PATTERN)


RESERVATION_VIEW = (
    "reservation view: `name`, `nodes` (a node list), `gpus` (on them), `start` and `end` "
    "(seconds since the epoch), `users`, `accounts`, `flags` (`maint`, `ignore_jobs`, "
    "`flex`), `reason`, `state` (`planned` or `active`), `jobs` (queued and running jobs "
    "in it) and `running_across` (other jobs running on its nodes whose time limit, or lack "
    "of one, reaches into it)")


def _view(reservations: Reservations, name: str) -> dict[str, Any]:
    return next(r for r in reservations.listing() if r["name"] == name)


def method_table(reservations: Reservations) -> Mapping[str, tuple[type, Any]]:
    """The entries for :class:`masterd.api.rpc.Rpc`'s method table."""

    @returns(f"`reservations`: one {RESERVATION_VIEW} per reservation not over yet, "
             "earliest first.")
    async def reservation_list(_: NoParams) -> dict[str, Any]:
        """The planned and active reservations."""
        return {"reservations": reservations.listing()}

    @returns(f"`reservation`: its {RESERVATION_VIEW}.", ("invalid_reservation", "forbidden"))
    async def reservation_create(p: CreateParams) -> dict[str, Any]:
        """Create a reservation (admins only): from then on no job outside it starts on its
        nodes if its time limit would cross its start, and while it lasts only its users' and
        accounts' jobs naming it (``--reservation``) start there. Refused in one sentence: in
        the past, ending before it starts, unknown nodes or flags, overlapping another on a
        node, usable by nobody, a name taken, not enough GPUs of the model, or jobs running
        on its nodes into it (unless flag ``ignore_jobs``)."""
        if (p.end is None) == (p.duration_s is None):
            raise JobError("invalid_reservation", "give the reservation's end or its "
                           "duration_s, one of the two")
        if (p.nodes is None) == (p.gpus is None):
            raise JobError("invalid_reservation", "give the reservation's nodes or a count "
                           "of gpus, one of the two")
        if p.gpu_model is not None and p.gpus is None:
            raise JobError("invalid_reservation", "gpu_model goes with a count of gpus")
        end = p.end if p.end is not None else p.start + (p.duration_s or 0)
        asked = NodeReservation(p.name, p.nodes or "", p.start, end, p.users, p.accounts,
                                tuple(dict.fromkeys(p.flags)), p.reason)
        made = await reservations.create(reservations.resolve(asked, p.gpus, p.gpu_model))
        return {"reservation": _view(reservations, made.name)}

    @returns(f"`reservation`: its {RESERVATION_VIEW}.", ("invalid_reservation", "forbidden"))
    async def reservation_update(p: UpdateParams) -> dict[str, Any]:
        """Change a reservation (admins only): its times, nodes, users, accounts, flags or
        reason, checked as a new one is; nothing changes when the result is refused. A
        change of ``flex`` holds for jobs submitted after it."""
        if p.end is not None and p.duration_s is not None:
            raise JobError("invalid_reservation", "give the reservation's end or its "
                           "duration_s, not both")
        changes: dict[str, Any] = {k: getattr(p, k) for k in (
            "start", "end", "nodes", "users", "accounts", "reason") if getattr(p, k) is not None}
        if p.flags is not None:
            changes["flags"] = tuple(dict.fromkeys(p.flags))
        if p.duration_s is not None:
            old = reservations.reservations.get(p.name)
            start = p.start if p.start is not None else (old.start if old else 0.0)
            changes["end"] = start + p.duration_s
        if not changes:
            raise JobError("invalid_reservation", "the update changes nothing: give start, "
                           "end or duration_s, nodes, users, accounts, flags or reason")
        made = await reservations.update(p.name, changes)
        return {"reservation": _view(reservations, made.name)}

    @returns("`reservation`: the deleted reservation's name.",
             ("invalid_reservation", "forbidden"))
    async def reservation_delete(p: NameParams) -> dict[str, Any]:
        """Delete a reservation (admins only), planned or active: its nodes take anyone's
        work again; its running jobs run on; its queued jobs wait, saying so."""
        made = await reservations.delete(p.name)
        return {"reservation": made.name}

    return {"reservation_list": (NoParams, reservation_list),
            "reservation_create": (CreateParams, reservation_create),
            "reservation_update": (UpdateParams, reservation_update),
            "reservation_delete": (NameParams, reservation_delete)}
