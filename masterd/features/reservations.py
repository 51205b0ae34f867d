"""Reservations (shared/reservations.py) in the master: created, updated and deleted by an
admin through the RPC (``trellisctl reservation``), journalled, and kept in force.

* Every node a reservation holds carries it in the inventory the core places on
  (``events.effective_inventory``), with the seconds left before it begins, so the one
  eligibility test keeps every policy from starting another's job there whose time limit
  would cross it, and keeps a job in it on its nodes. The stamps are refreshed every
  ``REFRESH_S`` and before every pass.
* A queued job in a reservation that has not begun (not ``flex``), or that is over or was
  deleted, waits behind the ``reservation`` gate with a sentence saying which and when.
* At a reservation's end its jobs still running (not ``flex``) are stopped into ``timeout``
  as at a time limit, and it is removed from the journal with an event.
* A submission naming a reservation that does not exist, or that is not its user's or
  account's, is refused with one sentence (``invalid_reservation``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace
from typing import Any

from masterd.core.scheduler import JobError, Transition
from masterd.journal.reservations import (
    delete_reservation,
    load_reservations,
    save_reservation,
)
from masterd.runtime.caller import caller
from masterd.runtime.context import FeatureContext
from shared.accounts import AccountTree
from shared.maintenance import REFRESH_S
from shared.model import Job, JobSpec, JobState, NodeInventory, ReservationHold, WaitReason
from shared.reservations import (
    Candidate,
    NodeReservation,
    ReservationError,
    check,
    holds,
    pick_nodes,
)

log = logging.getLogger("trellis.master.reservations")

GATE = WaitReason.RESERVATION.value


class Reservations:
    def __init__(self, ctx: FeatureContext) -> None:
        self.ctx = ctx
        self.reservations: dict[str, NodeReservation] = {}
        self.tree = AccountTree.of(())
        self._holds: dict[str, tuple[ReservationHold, ...]] = {}
        self._phase: dict[str, str] = {}  # name -> "planned" | "active", as last gated
        self._ticking = False
        events = ctx.events
        events.effective_inventory.provide(self.stamped)
        events.ready_status.provide(self.status)
        events.submitting.subscribe(self.check_submission)
        events.spec_defaults.provide(self.with_flex)
        events.job_submitted.subscribe(self.gate)
        events.job_transition.subscribe(self.on_transition)
        events.accounts_changed.subscribe(self.accounts_changed)
        events.restored.subscribe(self.restored)
        events.before_pass.subscribe(self.refresh)

    # -- the nodes -----------------------------------------------------------------------
    def stamped(self, inventory: NodeInventory) -> NodeInventory:
        held = self._holds.get(inventory.name, ())
        if inventory.reservations == held:
            return inventory
        return replace(inventory, reservations=held)

    def status(self, node: str) -> str | None:
        """``reserved`` (``maintenance`` for a maint reservation) while one holds it."""
        for hold in self._holds.get(node, ()):
            reservation = self.reservations.get(hold.name)
            if reservation is not None and reservation.start <= self.ctx.clock():
                return "maintenance" if reservation.maint else "reserved"
        return None

    def refresh(self, regate: bool = False) -> None:
        """Re-stamp the nodes and the gates as time passes; end reservations that are over.
        The queued jobs in reservations are gated again when one begins or ends, or
        (``regate``) when the reservations themselves changed."""
        now = self.ctx.clock()
        for reservation in [r for r in self.reservations.values() if r.end <= now]:
            del self.reservations[reservation.name]
            self.ctx.tasks.spawn(self._end(reservation), name=f"reservation-end-{reservation.name}")
        before, self._holds = self._holds, holds(self.reservations.values(), now)
        for node in before.keys() | self._holds.keys():
            if before.get(node, ()) != self._holds.get(node, ()):
                self.ctx.nodes.reinventory(node)  # only nodes whose stamp moved
        phase = {r.name: "active" if r.start <= now else "planned"
                 for r in self.reservations.values()}
        if phase != self._phase or regate:
            self._phase = phase
            self._gate_all()

    async def _end(self, reservation: NodeReservation) -> None:
        """Its jobs still running are stopped (a flex job runs on), and only then is it
        forgotten: a master that dies in between still has the reservation in its journal
        and ends it again when restored, rather than leaving its jobs running past it."""
        reason = f"its reservation {reservation.name} ended"
        await asyncio.gather(*(
            self.ctx.jobs.time_out(job, reason)
            for job in list(self.ctx.core.active_jobs().values())
            if job.spec.selector.reservation == reservation.name
            and not job.spec.selector.flex and job.state is JobState.RUNNING))
        await self._forget(reservation, "reservation_ended")

    def restored(self) -> None:
        self.reservations = {r.name: r for r in self.ctx.journal.now(load_reservations)}
        self.refresh(regate=True)  # every queued job in a reservation is gated afresh
        if self.reservations:
            log.info("reservations: %s", ", ".join(self.reservations))
        self._tick()

    def _tick(self) -> None:
        """Refresh every REFRESH_S (a reservation's start and end need no event to act):
        a pass refreshes the stamps and the gates first (before_pass). Outside a loop (a
        restore in tests) the next change starts it."""
        if not self._ticking:
            self._ticking = self.ctx.pass_every(REFRESH_S, "reservations-refresh")

    # -- jobs ----------------------------------------------------------------------------
    def accounts_changed(self, tree: AccountTree) -> None:
        self.tree = tree

    def check_submission(self, spec: JobSpec) -> None:
        name = spec.selector.reservation
        if not name:
            return
        reservation = self.reservations.get(name)
        if reservation is None:
            raise JobError("invalid_reservation", f"job {spec.name}: no reservation {name!r} "
                           "(trellisctl reservation list shows them)")
        account = self.tree.submission_account(spec.user, spec.tenant)
        if not reservation.may_use(spec.user, account):
            raise JobError("invalid_reservation", f"job {spec.name}: reservation {name!r} is "
                           f"for {reservation.who()}, not user {spec.user!r}"
                           + (f" in account {account!r}" if account else ""))
        reason = self.ctx.core.unsatisfiable(self.with_flex(spec))
        if reason is not None:
            raise JobError("unsatisfiable", f"job {spec.name}: {reason}")

    def with_flex(self, spec: JobSpec) -> JobSpec:
        """The reservation's flex flag written into the job (it holds for the job)."""
        reservation = self.reservations.get(spec.selector.reservation)
        if reservation is None or reservation.flex == spec.selector.flex:
            return spec
        return replace(spec, selector=replace(spec.selector, flex=reservation.flex))

    def gate(self, job: Job) -> None:
        """Close or open the job's reservation gate as its reservation stands now."""
        name = job.spec.selector.reservation
        if not name or job.state is not JobState.QUEUED:
            return
        self.ctx.jobs.set_gate(job.id, GATE, self._waits(job.spec))

    async def on_transition(self, job: Job, transition: Transition) -> None:
        if transition.state is JobState.QUEUED:  # preempted or re-queued: gated again
            self.gate(job)

    def _gate_all(self) -> None:
        for job in list(self.ctx.core.jobs.values()):
            if job.spec.selector.reservation and job.state is JobState.QUEUED:
                self.gate(job)

    def _waits(self, spec: JobSpec) -> str | None:
        name = spec.selector.reservation
        reservation = self.reservations.get(name)
        if reservation is None:
            return (f"its reservation {name} is over or was deleted: cancel the job, or an "
                    "admin creates the reservation again")
        if reservation.start > self.ctx.clock() and not spec.selector.flex:
            return f"waits for its reservation {name}, which begins {_when(reservation.start)}"
        return None

    # -- changes (admins) ----------------------------------------------------------------
    def resolve(self, reservation: NodeReservation, gpus: int | None,
                gpu_model: str | None) -> NodeReservation:
        """The reservation with its nodes: those named, or (a count of GPUs) the fewest
        whole nodes of the model free of other reservations then."""
        if gpus is None:
            return reservation
        overlapping: set[str] = set()
        for other in self.reservations.values():
            if (other.name != reservation.name and other.start < reservation.end
                    and reservation.start < other.end):
                overlapping.update(other.node_names())
        active = self.ctx.core.active_jobs()
        candidates = []
        for view in self.ctx.core.nodes():
            name = view.inventory.name
            if name in overlapping:
                continue
            crossing = sum(1 for job_id in self.ctx.core.jobs_on(name)
                           if (job := active.get(job_id)) is not None
                           and _runs_into(job, reservation.start))
            candidates.append(Candidate(name, view.inventory.gpu_model,
                                        len(view.inventory.gpus), crossing))
        try:
            nodes = pick_nodes(gpus, gpu_model, candidates)
        except ReservationError as exc:
            raise JobError("invalid_reservation",
                           f"reservation {reservation.name!r}: {exc}") from None
        return replace(reservation, nodes=",".join(nodes))

    def _checked(self, reservation: NodeReservation) -> None:
        try:
            check(reservation, self.reservations.values(),
                  [v.inventory.name for v in self.ctx.core.nodes()], self.ctx.clock())
        except ReservationError as exc:
            raise JobError("invalid_reservation", str(exc)) from None
        if "ignore_jobs" in reservation.flags:
            return
        across = self.running_into(reservation, exclude_own=True)
        if across:
            raise JobError("invalid_reservation", (
                f"reservation {reservation.name!r}: job(s) {', '.join(across[:10])} running "
                "on its nodes would run into it; wait for them, stop them, or create it with "
                "flag ignore_jobs"))

    async def create(self, reservation: NodeReservation) -> NodeReservation:
        if reservation.name in self.reservations:
            raise JobError("invalid_reservation",
                           f"reservation {reservation.name!r} exists already")
        self._checked(reservation)
        await self._save(reservation, "reservation_created")
        return reservation

    async def update(self, name: str, changes: dict[str, Any]) -> NodeReservation:
        old = self.reservations.get(name)
        if old is None:
            raise JobError("invalid_reservation", f"no reservation {name!r}")
        try:
            new = replace(old, **changes)
        except ValueError as exc:
            raise JobError("invalid_reservation", f"reservation {name!r}: {exc}") from None
        if new == old:
            return old
        self._checked(new)
        await self._save(new, "reservation_updated")
        return new

    async def delete(self, name: str) -> NodeReservation:
        reservation = self.reservations.get(name)
        if reservation is None:
            raise JobError("invalid_reservation", f"no reservation {name!r}")
        del self.reservations[name]
        await self._forget(reservation, "reservation_deleted")
        log.info("reservation %s deleted", name)
        self.refresh()
        self.ctx.request_pass()
        return reservation

    async def _save(self, reservation: NodeReservation, kind: str) -> None:
        who = caller()
        r = reservation
        event = (self.ctx.clock(), None, None, kind,
                 {"name": r.name, "nodes": r.nodes, "start": r.start, "end": r.end,
                  "users": list(r.users), "accounts": list(r.accounts),
                  "flags": list(r.flags), "reason": r.reason,
                  "who": "local" if who is None else who.name})
        await self.ctx.journal.call(save_reservation, reservation, event)
        self.reservations[reservation.name] = reservation
        log.info("reservation %s %s on %s from %s to %s for %s", r.name, kind.split("_")[1],
                 r.nodes, r.start, r.end, r.who())
        self.refresh(regate=True)  # a change can move its start: gate its jobs afresh
        self._tick()
        self.ctx.request_pass()

    async def _forget(self, reservation: NodeReservation, kind: str) -> None:
        who = caller()
        await self.ctx.journal.call(delete_reservation, reservation.name, (
            self.ctx.clock(), None, None, kind,
            {"name": reservation.name, "who": "local" if who is None else who.name}))

    # -- the view ------------------------------------------------------------------------
    def running_into(self, reservation: NodeReservation, exclude_own: bool = False) -> list[str]:
        """Jobs not in it running on its nodes whose time limit (or lack of one) reaches
        into it."""
        nodes = set(reservation.node_names())
        return sorted(
            job.id for job in self.ctx.core.active_jobs().values()
            if job.placement is not None and nodes.intersection(job.placement.nodes)
            and job.spec.selector.reservation != reservation.name
            and _runs_into(job, reservation.start))

    def listing(self) -> list[dict[str, Any]]:
        now = self.ctx.clock()
        rows = []
        for r in sorted(self.reservations.values(), key=lambda r: (r.start, r.name)):
            jobs = sorted(j.id for j in self.ctx.core.jobs.values()
                          if j.spec.selector.reservation == r.name and not j.state.terminal)
            rows.append({"name": r.name, "nodes": r.nodes, "start": r.start, "end": r.end,
                         "users": list(r.users), "accounts": list(r.accounts),
                         "flags": list(r.flags), "reason": r.reason,
                         "state": "active" if r.start <= now else "planned",
                         "gpus": sum(len(v.inventory.gpus) for n in r.node_names()
                                     if (v := self.ctx.core.node(n)) is not None),
                         "jobs": jobs, "running_across": self.running_into(r)})
        return rows


def _runs_into(job: Job, start: float) -> bool:
    """The running job may still run at ``start`` (no time limit: it may)."""
    limit = job.spec.time_limit_s
    return limit is None or job.start_time is None or job.start_time + limit > start


def _when(moment: float) -> str:
    return time.strftime("at %Y-%m-%d %H:%M", time.localtime(moment))
