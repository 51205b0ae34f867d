"""Maintenance windows (shared/maintenance.py) in the master: planned by an admin through
the RPC (``trellisctl maintenance``), journalled, and kept in force on the nodes.

* Every node with a window ahead carries, in the inventory the core places on, the seconds
  left before it (``events.effective_inventory``), so the one eligibility test keeps every
  policy from starting a job there whose time limit would cross the window. The horizons are
  refreshed every ``REFRESH_S`` and before every pass.
* Inside a window a node has the ``maintenance`` condition with the window's reason: it
  takes no new work and ``trellisctl nodes`` says why. Running jobs are not touched; the
  listing names those whose limit crosses a window.
* A window that has passed is removed from the journal with an event.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from masterd.core.conditions import MAINTENANCE
from masterd.core.scheduler import JobError
from masterd.journal.maintenance import delete_window, load_windows, save_window
from masterd.runtime.caller import caller
from masterd.runtime.context import FeatureContext
from shared.maintenance import REFRESH_S, MaintenanceError, Window, check, horizons
from shared.model import NodeInventory

log = logging.getLogger("trellis.master.maintenance")


class Maintenance:
    def __init__(self, ctx: FeatureContext) -> None:
        self.ctx = ctx
        self.windows: dict[str, Window] = {}
        self._horizons: dict[str, tuple[float, Window]] = {}
        self._inside: dict[str, Window] = {}  # nodes holding the condition, and for which
        self._ticking = False
        events = ctx.events
        events.effective_inventory.provide(self.stamped)
        events.restored.subscribe(self.restored)
        events.before_pass.subscribe(self.refresh)

    # -- the nodes -----------------------------------------------------------------------
    def stamped(self, inventory: NodeInventory) -> NodeInventory:
        value = _stamp(self._horizons.get(inventory.name))
        if inventory.maintenance_in_s == value:
            return inventory
        return replace(inventory, maintenance_in_s=value)

    def refresh(self) -> None:
        """Re-stamp the horizons and the conditions as time passes; drop passed windows."""
        now = self.ctx.clock()
        for window in [w for w in self.windows.values() if w.end <= now]:
            del self.windows[window.name]
            self.ctx.tasks.spawn(self._forget(window, "maintenance_ended"))
        before, self._horizons = self._horizons, horizons(self.windows.values(), now)
        for node in before.keys() | self._horizons.keys():
            if _stamp(before.get(node)) != _stamp(self._horizons.get(node)):
                self.ctx.nodes.reinventory(node)  # only nodes whose horizon moved
        inside = {n: w for n, (_, w) in self._horizons.items() if w.start <= now}
        for node in self._inside.keys() - inside.keys():
            self.ctx.nodes.set_condition(node, MAINTENANCE, None)
        for node, window in inside.items():
            # Every pass, not only when it changed: a node that joins later (its hello
            # after the master restored) gets it too; setting it again is a no-op.
            self.ctx.nodes.set_condition(
                node, MAINTENANCE, f"maintenance window {window.name}"
                + (f": {window.reason}" if window.reason else ""))
        self._inside = inside

    def restored(self) -> None:
        self.windows = {w.name: w for w in self.ctx.journal.now(load_windows)}
        self.refresh()
        if self.windows:
            log.info("maintenance windows: %s", ", ".join(self.windows))
        self._tick()

    def _tick(self) -> None:
        """Refresh every REFRESH_S (a window's start and end need no event to act): a pass
        refreshes the horizons first (before_pass). Outside a loop (a restore in tests) the
        next change starts it."""
        if not self._ticking:
            self._ticking = self.ctx.pass_every(REFRESH_S, "maintenance-refresh")

    # -- changes (admins) ----------------------------------------------------------------
    async def plan(self, window: Window) -> Window:
        try:
            check(window, self.windows.values(),
                  [v.inventory.name for v in self.ctx.core.nodes()], self.ctx.clock())
        except MaintenanceError as exc:
            raise JobError("invalid_maintenance", str(exc)) from None
        who = caller()
        event = (self.ctx.clock(), None, None, "maintenance_planned",
                 {"name": window.name, "nodes": window.nodes, "start": window.start,
                  "end": window.end, "reason": window.reason,
                  "who": "local" if who is None else who.name})
        await self.ctx.journal.call(save_window, window, event)
        self.windows[window.name] = window
        log.info("maintenance window %s planned on %s from %s to %s: %s", window.name,
                 window.nodes, window.start, window.end, window.reason)
        self.refresh()
        self._tick()
        self.ctx.request_pass()
        return window

    async def remove(self, name: str) -> Window:
        window = self.windows.get(name)
        if window is None:
            raise JobError("invalid_maintenance", f"no maintenance window {name!r}")
        del self.windows[name]
        await self._forget(window, "maintenance_removed")
        self.refresh()
        self.ctx.request_pass()
        return window

    async def _forget(self, window: Window, kind: str) -> None:
        who = caller()
        await self.ctx.journal.call(delete_window, window.name, (
            self.ctx.clock(), None, None, kind,
            {"name": window.name, "who": "local" if who is None else who.name}))

    # -- the view ------------------------------------------------------------------------
    def listing(self) -> list[dict[str, Any]]:
        now = self.ctx.clock()
        rows = []
        for window in sorted(self.windows.values(), key=lambda w: (w.start, w.name)):
            nodes = set(window.node_names())
            across = sorted(
                job.id for job in self.ctx.core.active_jobs().values()
                if job.placement is not None and nodes.intersection(job.placement.nodes)
                and (job.spec.time_limit_s is None or job.start_time is None
                     or job.start_time + job.spec.time_limit_s > window.start))
            rows.append({"name": window.name, "nodes": window.nodes, "start": window.start,
                         "end": window.end, "reason": window.reason,
                         "state": "active" if window.start <= now else "planned",
                         "running_across": across})
        return rows


def _stamp(horizon: tuple[float, Window] | None) -> float | None:
    """The seconds a node's inventory carries for a horizon (None: no window ahead)."""
    return None if horizon is None else horizon[0]
