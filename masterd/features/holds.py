"""Holds, updates and who may use which QoS class: the operators' say over queued jobs
(Slurm's ``scontrol hold/release/update``).

* ``hold``: a queued job's ``held`` gate closes (``Job.held`` = ``user`` or ``admin``,
  journalled); holding a job that already started is refused, since a hold keeps a job from
  starting and stops nothing. ``release`` opens it; only an admin releases an admin's hold.
* ``update``: a job's QoS class, time limit or priority. A user may only lower what concerns
  their own job; admins may change anything (:mod:`masterd.core.permissions`). The spec is
  replaced and journalled with the old and new values, the job moves to its new place in the
  queue, and ``job_updated`` tells the features that keep per-spec state (time limits).
* At submission and at update: a client may use ``urgent``/``prior`` only if the master's
  ``qos_urgent_users``/``qos_prior_users`` list it, and may not raise a priority above 0.

The caller is the authenticated principal of the RPC being served (``masterd.runtime.caller``);
in-process calls and open loopback access are an admin's.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any

from masterd.core.permissions import priority_refusal, qos_refusal, update_refusal
from masterd.core.scheduler import JobError
from masterd.journal.dependencies import look_up
from masterd.journal.store import Store
from masterd.runtime.caller import caller, is_admin, owns
from masterd.runtime.context import FeatureContext
from shared.auth import Principal
from shared.model import Job, JobSpec, JobState, QosClass, WaitReason
from shared.schema import bounded

log = logging.getLogger("trellis.master.holds")

GATE = WaitReason.HELD.value
HELD_BY = {"user": "held by its user (trellisctl release {id} lets it go)",
           "admin": "held by an admin (only an admin may release it)"}
UPDATABLE = ("qos", "time_limit_s", "priority")


@dataclass(frozen=True)
class HoldParams:
    id: str = bounded(max_len=256)


@dataclass(frozen=True)
class UpdateParams:
    id: str = bounded(max_len=256)
    # The new QoS class; nil: unchanged.
    qos: QosClass | None = None
    # The new time limit in seconds; nil: unchanged.
    time_limit_s: int | None = bounded(None, min=1, max=366 * 86400)
    # The new priority; nil: unchanged.
    priority: int | None = bounded(None, min=-1_000_000, max=1_000_000)


def _who(principal: Principal | None) -> tuple[str, str]:
    """(by, name): "admin" or "user", and the credential's name for the journal."""
    if principal is None:
        return "admin", "local"
    return ("admin" if principal.is_admin else "user"), principal.name


class JobControls:
    def __init__(self, ctx: FeatureContext) -> None:
        self.ctx = ctx
        ctx.events.submitting.subscribe(self.check_submission)
        ctx.events.restored.subscribe(self.restore)

    # -- submission --------------------------------------------------------------------------
    def check_submission(self, spec: JobSpec) -> None:
        principal = caller()
        if is_admin(principal):
            return
        assert principal is not None
        cfg = self.ctx.config()
        why = (qos_refusal(spec.qos, principal.name, cfg.qos_urgent_users, cfg.qos_prior_users)
               or priority_refusal(spec.priority))
        if why is not None:
            raise JobError("forbidden", f"job {spec.name}: {why}")

    # -- the job an action is about ----------------------------------------------------------
    async def _job(self, job_id: str, action: str) -> Job:
        """The job in memory that the caller may act on; refuses, with a sentence, a job
        that does not exist, ended, or belongs to another user."""
        job = self.ctx.core.job(job_id)
        if job is None:
            looked = await self.ctx.journal.call(look_up, [job_id], [])
            state = looked.jobs.get(job_id)
            if state is None:
                raise JobError("unknown_job", f"job {job_id!r} does not exist")
            raise JobError("job_finished", f"job {job_id} already ended ({state.value})")
        principal = caller()
        if not owns(principal, job.spec.user):
            raise JobError("forbidden", f"job {job_id} belongs to {job.spec.user!r}; only its "
                           f"owner or an admin may {action} it")
        if job.state.terminal:
            raise JobError("job_finished", f"job {job_id} already ended ({job.state.value})")
        return job

    async def _persist(self, job: Job, kind: str, detail: dict[str, Any]) -> None:
        await self.ctx.journal.persist([job], [(self.ctx.clock(), job.id, None, kind, detail)])

    # -- hold and release --------------------------------------------------------------------
    async def hold(self, job_id: str) -> Job:
        job = await self._job(job_id, "hold")
        if job.state is not JobState.QUEUED:
            raise JobError("job_not_queued", f"job {job_id} is {job.state.value}; a hold only "
                           "keeps a queued job from starting (cancel it to stop it)")
        by, name = _who(caller())
        if job.held == "admin" or job.held == by:
            return job  # held already, as firmly
        job.held = by
        self.ctx.jobs.set_gate(job.id, GATE, HELD_BY[by].format(id=job.id))
        await self._persist(job, "held", {"by": by, "who": name})
        log.info("job=%s held by=%s who=%s", job.id, by, name)
        return job

    async def release(self, job_id: str) -> Job:
        job = await self._job(job_id, "release")
        if not job.held:
            raise JobError("job_not_held", f"job {job_id} is not held")
        by, name = _who(caller())
        if job.held == "admin" and by != "admin":
            raise JobError("forbidden", f"job {job_id} is held by an admin; only an admin may "
                           "release it")
        job.held = ""
        self.ctx.jobs.set_gate(job.id, GATE, None)
        await self._persist(job, "released", {"by": by, "who": name})
        log.info("job=%s released by=%s who=%s", job.id, by, name)
        self.ctx.request_pass()
        return job

    # -- update ------------------------------------------------------------------------------
    async def update(self, params: UpdateParams) -> Job:
        changes = {key: getattr(params, key) for key in UPDATABLE
                   if getattr(params, key) is not None}
        if not changes:
            raise JobError("invalid_params", "update changes nothing: give qos, time_limit_s "
                           "or priority")
        job = await self._job(params.id, "update")
        principal = caller()
        by, name = _who(principal)
        old = job.spec
        if not is_admin(principal):
            assert principal is not None
            cfg = self.ctx.config()
            # (A job's spec holds its limit: the master's default is written in at submission.)
            why = update_refusal(old, changes)
            if why is None and "qos" in changes:
                why = qos_refusal(changes["qos"], principal.name, cfg.qos_urgent_users,
                                  cfg.qos_prior_users)
            if why is not None:
                raise JobError("forbidden", f"job {job.id}: {why}")
        new = replace(old, **changes)  # validated as any spec (ValueError: invalid_params)
        differ = {key: [_wire(getattr(old, key)), _wire(getattr(new, key))]
                  for key in changes if getattr(old, key) != getattr(new, key)}
        if not differ:
            return job
        # Journalled before it takes effect: a copy with the new spec is what is written.
        await self.ctx.journal.call(Store.update_spec, replace(job, spec=new), [(
            self.ctx.clock(), job.id, None, "updated", {**differ, "by": by, "who": name})])
        # (The wire cache keys a job's encoded spec by the spec object, so the new object is
        # encoded afresh for the next node command and view.)
        job.spec = new
        if job.state is JobState.QUEUED:
            self.ctx.jobs.reorder(job.id)
            self.ctx.request_pass()
        self.ctx.events.job_updated.emit(job, old)
        log.info("job=%s updated %s by=%s who=%s", job.id, differ, by, name)
        return job

    # -- restore -----------------------------------------------------------------------------
    def restore(self) -> None:
        """Holds are journalled, gates are not: close the held gate of every held job."""
        held = 0
        for job in self.ctx.core.jobs.values():
            if job.held and job.state is JobState.QUEUED:
                self.ctx.jobs.set_gate(job.id, GATE, HELD_BY.get(
                    job.held, HELD_BY["admin"]).format(id=job.id))
                held += 1
        if held:
            log.info("holds restored: %d job(s) held", held)


def _wire(value: Any) -> Any:
    return value.value if isinstance(value, QosClass) else value
