"""Time limits (Slurm's --time, --signal): defaults, the maximum, the warning, the stop.

* At submission a job without a limit gets ``default_time_limit_s`` written into its spec
  (``events.spec_defaults``), as Slurm writes a partition's DefaultTime into the job: the
  limit the job is journalled with is the one ``trellisctl show`` reports, backfill plans
  with and a restart keeps. A later change of the default applies to later submissions.
* A queued job whose limit exceeds ``max_time_limit_s`` waits behind the ``time_limit``
  gate (Slurm's PartitionTimeLimit) rather than being refused; the gate opens when its limit
  is lowered (``job_updated``) or the maximum raised (SIGHUP, ``config_changed``).
* From the moment a job runs, its limit counts from its journalled ``start_time``: at
  ``limit - warning.seconds`` every running part gets the warning signal (``signal_job``,
  journalled as ``warned``), at the limit the job is stopped into ``timeout``
  (``JobActions.stop``: SIGTERM, SIGKILL after its grace). A restarted or newly elected
  master re-arms every running job from the journal, so a limit already past stops the job
  at once and a warning already journalled is not sent again.

The arithmetic (deadlines, what is due when) is masterd/core/timelimits.py, which the
simulator uses too; this module adds the timer, the node commands and the journal.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace

from masterd.core.scheduler import Transition
from masterd.core.timelimits import (
    STOP,
    LimitSchedule,
    deadlines,
    over_maximum,
    stop_reason,
)
from masterd.journal.store import Store
from masterd.runtime.context import FeatureContext
from shared.messages import SignalJob
from shared.model import Job, JobSpec, JobState, WaitReason

log = logging.getLogger("trellis.master.timelimits")

GATE = WaitReason.TIME_LIMIT.value


class TimeLimits:
    def __init__(self, ctx: FeatureContext) -> None:
        self.ctx = ctx
        self.schedule = LimitSchedule()
        self._timer: asyncio.Future[None] | None = None
        self._timer_at: float | None = None
        events = ctx.events
        events.spec_defaults.provide(self.with_default)
        events.job_submitted.subscribe(self.check_gate)
        events.job_updated.subscribe(self.updated)
        events.restored.subscribe(self.restored)
        events.job_transition.subscribe(self.on_transition)
        events.job_ended.subscribe(self.ended)
        events.config_changed.subscribe(self.reconfigured)

    # -- admission -----------------------------------------------------------------------
    def with_default(self, spec: JobSpec) -> JobSpec:
        """The spec with the master's default limit when it asked for none."""
        default = self.ctx.config().default_time_limit_s
        if spec.time_limit_s is None and default:
            return replace(spec, time_limit_s=default)
        return spec

    def check_gate(self, job: Job) -> None:
        """Close the time_limit gate of a queued job over the maximum, open it otherwise."""
        if job.state is not JobState.QUEUED:
            return
        sentence = over_maximum(job.spec, self.ctx.config().max_time_limit_s)
        if sentence is None and GATE not in job.gates:
            return
        self.ctx.jobs.set_gate(job.id, GATE, sentence)
        if sentence is None:
            log.info("job=%s time limit within the maximum again; it may start", job.id)
            self.ctx.request_pass()

    def reconfigured(self) -> None:
        for job in list(self.ctx.core.jobs.values()):
            if job.state is JobState.QUEUED:
                self.check_gate(job)

    # -- arming --------------------------------------------------------------------------
    def arm(self, job: Job, warned: bool = False) -> None:
        if job.start_time is None or job.state is not JobState.RUNNING:
            return
        self.schedule.arm(job.id, deadlines(job.spec, job.start_time), warned)
        self._reset_timer()

    def disarm(self, job_id: str) -> None:
        self.schedule.disarm(job_id)
        self._reset_timer()

    async def on_transition(self, job: Job, transition: Transition) -> None:
        if transition.state is JobState.RUNNING:
            self.arm(job)
        elif transition.state is JobState.QUEUED:  # preempted or re-queued: a new run later
            self.disarm(job.id)

    def ended(self, job: Job) -> None:
        self.disarm(job.id)

    def updated(self, job: Job, before: JobSpec) -> None:
        """A job's spec was replaced (trellisctl update --time): re-check or re-arm it."""
        if job.state is JobState.QUEUED:
            self.check_gate(job)
            return
        if job.state is not JobState.RUNNING or job.start_time is None:
            return
        due = deadlines(job.spec, job.start_time)
        # Warned already, it is warned again only if the new warning lies ahead.
        warned = (self.schedule.warned(job.id) and due.warn_at is not None
                  and due.warn_at <= self.ctx.clock())
        self.schedule.arm(job.id, due, warned)
        self._reset_timer()
        log.info("job=%s time limit re-armed: stop at %s", job.id, due.stop_at)

    def restored(self) -> None:
        """After a restart or a failover: gates again, and every running job re-armed from
        its journalled start (a warning journalled already is not sent twice)."""
        now = self.ctx.clock()
        for job in list(self.ctx.core.jobs.values()):
            if job.state is JobState.QUEUED:
                self.check_gate(job)
            elif job.state is JobState.RUNNING and job.start_time is not None:
                due = deadlines(job.spec, job.start_time)
                warned = (due.warn_at is not None and due.warn_at <= now
                          and self._journalled_warning(job.id))
                self.arm(job, warned)

    def _journalled_warning(self, job_id: str) -> bool:
        rows = self.ctx.journal.now(Store.events, job_id, 0, 100_000)
        return any(row.kind == "warned" for row in rows)

    # -- the timer -----------------------------------------------------------------------
    def _reset_timer(self) -> None:
        when = self.schedule.next_time()
        if when == self._timer_at and self._timer is not None:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = when
        if when is None:
            return
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # restored outside a loop (tests): the next event sets it
            self._timer_at = None
            return
        # A supervised task, not a bare loop timer: the master's shutdown cancels it.
        self._timer = self.ctx.tasks.spawn(self._sleep(max(0.0, when - self.ctx.clock())),
                                           name="timelimits")

    async def _sleep(self, delay: float) -> None:
        await asyncio.sleep(delay)
        self._timer = None
        self._timer_at = None
        self._fire()

    def _fire(self) -> None:
        for job_id, action in self.schedule.pop_due(self.ctx.clock()):
            job = self.ctx.core.job(job_id)
            if job is None or job.state is not JobState.RUNNING:
                continue
            if action == STOP:
                self.ctx.tasks.spawn(self.ctx.jobs.time_out(job, stop_reason(job.spec)),
                                     name=f"timelimit-stop-{job_id}")
            else:
                self.ctx.tasks.spawn(self._warn(job), name=f"timelimit-warn-{job_id}")
        self._reset_timer()

    async def _warn(self, job: Job) -> None:
        warning = job.spec.stop.warning
        if warning is None or job.stopping:
            return
        nodes = [n for n, s in job.node_states.items() if s == "running"]
        command = SignalJob(job_id=job.id, signal=warning.signal,
                            leader_only=warning.batch_only, restarts=job.restarts)
        answers = await asyncio.gather(*(self.ctx.nodes.send(n, "signal_job", command)
                                         for n in nodes), return_exceptions=True)
        delivered = []
        for node, answer in zip(nodes, answers, strict=True):
            if isinstance(answer, BaseException):  # not connected, refused, no answer
                log.warning("job=%s node=%s warning %s not delivered: %s", job.id, node,
                            warning.signal, answer)
            elif answer.get("delivered", True):
                delivered.append(node)
        log.info("job=%s warned with %s %d s before its limit on %s", job.id, warning.signal,
                 warning.seconds, ",".join(delivered) or "no node")
        await self.ctx.journal.persist([], [(self.ctx.clock(), job.id, None, "warned", {
            "signal": warning.signal, "seconds": warning.seconds, "nodes": delivered})])

