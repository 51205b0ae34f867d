"""The RPC of maintenance windows (``trellisctl maintenance``), served by the maintenance
feature (``masterd.features.maintenance``). Listing is open to every caller (users see why
their job does not start on a node); planning and removing are an admin's."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from masterd.core.scheduler import JobError
from masterd.features.maintenance import Maintenance
from shared.maintenance import Window
from shared.model import NAME_PATTERN
from shared.rpcdoc import returns
from shared.schema import bounded


@dataclass(frozen=True)
class NoParams:
    pass


@dataclass(frozen=True)
class PlanParams:
    name: str = bounded(pattern=NAME_PATTERN)
    nodes: str = bounded(max_len=65_536)  # a Slurm node list
    start: float = bounded(min=0)  # seconds since the epoch
    # Its end, or its length (one of the two).
    end: float | None = bounded(None, min=0)
    duration_s: float | None = bounded(None, min=1, max=366 * 86400)
    reason: str = bounded("", max_len=512)


@dataclass(frozen=True)
class NameParams:
    name: str = bounded(pattern=NAME_PATTERN)


WINDOW_VIEW = ("a window view: `name`, `nodes` (a node list), `start` and `end` (seconds "
               "since the epoch), `reason`, `state` (`planned` or `active`) and "
               "`running_across` (jobs running on its nodes whose time limit, or lack of "
               "one, reaches into it)")


def method_table(maintenance: Maintenance) -> Mapping[str, tuple[type, Any]]:
    """The entries for :class:`masterd.api.rpc.Rpc`'s method table."""

    @returns(f"`windows`: one {WINDOW_VIEW} per window not over yet, earliest first.")
    async def maintenance_list(_: NoParams) -> dict[str, Any]:
        """The planned and active maintenance windows."""
        return {"windows": maintenance.listing()}

    @returns(f"`window`: the {WINDOW_VIEW}.", ("invalid_maintenance", "forbidden"))
    async def maintenance_plan(p: PlanParams) -> dict[str, Any]:
        """Plan a window (admins only): from then on no job starts on its nodes if its time
        limit would cross it, and inside it nothing starts there. Refused in one sentence:
        in the past, ending before it starts, unknown nodes, overlapping another window on
        a node, a name taken."""
        if (p.end is None) == (p.duration_s is None):
            raise JobError("invalid_maintenance", "give the window's end or its duration_s, "
                           "one of the two")
        end = p.end if p.end is not None else p.start + (p.duration_s or 0)
        window = await maintenance.plan(Window(p.name, p.nodes, p.start, end, p.reason))
        return {"window": next(w for w in maintenance.listing() if w["name"] == window.name)}

    @returns("`window`: the removed window's name.", ("invalid_maintenance", "forbidden"))
    async def maintenance_remove(p: NameParams) -> dict[str, Any]:
        """Remove a window (admins only), planned or active: its nodes take work again."""
        window = await maintenance.remove(p.name)
        return {"window": window.name}

    return {"maintenance_list": (NoParams, maintenance_list),
            "maintenance_plan": (PlanParams, maintenance_plan),
            "maintenance_remove": (NameParams, maintenance_remove)}
