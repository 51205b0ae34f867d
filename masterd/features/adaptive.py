"""The master's half of SODA's adaptive CPU allocator (§V-B): N_start, budgets, history.

The rule for a training job's cores when the allocator is on (``adaptive_cpus`` in the master
configuration, or ``TRELLIS_ADAPTIVE_CPUS=1`` in the job's environment, which also turns it off
per job with ``0``):

* The policy places the job with ``spec.cpus`` (split over its nodes like any job's cores).
  A job's request is **not** its ceiling when ``adaptive_max_cores_per_gpu`` is set: at launch
  each part is widened to ``max(its cores, adaptive_max_cores_per_gpu × its GPUs)`` from
  spare cores of its node (``masterd.core.widen``: the idle cores of the CPU-job array under
  SODA's arrays, else free cores beyond a reserve for the node's free GPUs), as §V-B's
  allocator tries more cores than asked (57.1% of the paper's jobs ended with 1–5 more,
  §VI-D). With 0 the request is the ceiling. Either way the whole tuning budget is held from
  the start: the node never has to ask for a core that another job might have taken
  meanwhile (the paper's "large parallelism at the beginning", §VI-H).
* The job is launched pinned to **N_start** of them (``masterd.core.cores.start_point``: the
  owner's history for the model category, else the category default ± declared traits,
  clamped to the cores the job holds on that node).
* The node's tuner (``noded.tuning``) then measures and re-pins the running job. Every step is a
  ``cores_changed`` event: cores the tuner can no longer need go back to the pool at once, and
  the converged count is remembered as the owner's history for the category.

A part left with a single core (after widening), a job without GPUs on the node, or a job of
another kind is not tuned: it runs on exactly the cores it was given.
"""

from __future__ import annotations

import logging
from typing import Any

from masterd.core.cluster import AllocationError
from masterd.core.cores import category_of, declared_traits, remember, start_point
from masterd.core.scheduler import JobError
from masterd.core.widen import node_spare_cores, widened
from masterd.journal.cores import load_history, remember_cores
from masterd.runtime.context import FeatureContext
from shared.messages import CorePlan, CoresChanged
from shared.model import Job, JobKind, JobSpec, JobState, NodeAllocation

log = logging.getLogger("trellis.master.cores")

ADAPTIVE_ENV = "TRELLIS_ADAPTIVE_CPUS"
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


class AdaptiveCpus:
    def __init__(self, ctx: FeatureContext, enabled: bool, max_cores_per_gpu: int = 0) -> None:
        self.ctx = ctx
        self.enabled = enabled
        self.max_cores_per_gpu = max_cores_per_gpu
        # Read before serving (the store is used from this thread then).
        self.history: dict[tuple[str, str], int] = ctx.journal.now(load_history)
        log.info("core history loaded entries=%d", len(self.history))
        ctx.events.submitting.subscribe(self.check)
        ctx.events.core_plan.provide(self.plan)
        ctx.events.node_event.subscribe(self.on_node_event)

    # -- submission ------------------------------------------------------------------------
    def check(self, spec: JobSpec) -> None:
        """Refuse a job whose allocator settings cannot be read (at submission, not launch)."""
        try:
            self._wanted(spec)
            declared_traits(spec)
        except ValueError as exc:
            raise JobError("invalid_job", str(exc)) from None

    def _wanted(self, spec: JobSpec) -> bool:
        value = spec.env.get(ADAPTIVE_ENV)
        if value is None:
            return self.enabled
        text = value.strip().lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
        raise ValueError(
            f"job {spec.name}: env {ADAPTIVE_ENV} must be 1/0, true/false, yes/no or on/off, "
            f"got {value!r}"
        )

    def applies(self, spec: JobSpec) -> bool:
        return spec.kind is JobKind.TRAINING and spec.gpus > 0 and self._wanted(spec)

    # -- launch ----------------------------------------------------------------------------
    def plan(self, job: Job, alloc: NodeAllocation) -> CorePlan | None:
        """The tuning plan for one part of a job being launched, or None (pin as placed)."""
        try:
            if not self.applies(job.spec) or not alloc.gpus or not alloc.cpus:
                return None
            # Raises for a spec it cannot read: checked before widening takes any cores.
            start_point(job.spec, self.history, available=len(alloc.cpus))
        except ValueError as exc:  # checked at submission; a restored job may predate that
            log.warning("job=%s node=%s not tuned: %s", job.id, alloc.node, exc)
            return None
        asked = len(alloc.cpus)
        # A one-core request is widened too (most of SODA's jobs ask for one or two, §III-B);
        # a part left with a single core has nothing to tune.
        cpus = self._widen(job, alloc)
        if len(cpus) < 2:
            return None
        start = start_point(job.spec, self.history, available=len(cpus))
        log.info("job=%s node=%s n_start=%d max_cores=%d asked=%d warm=%s reason=%r", job.id,
                 alloc.node, start.cores, len(cpus), asked, start.from_history, start.reason)
        detail = {"n_start": start.cores, "max_cores": len(cpus), "asked": asked,
                  "category": start.category, "warm": start.from_history,
                  "reason": start.reason}
        # A widened placement itself is journalled by the launch before any node hears of it.
        self.ctx.tasks.spawn(self.ctx.journal.persist(
            [], [(self.ctx.clock(), job.id, alloc.node, "cores_start", detail)]))
        return CorePlan(n_start=start.cores, warm=start.from_history,
                        launch_cores=start.cores)

    def _widen(self, job: Job, alloc: NodeAllocation) -> tuple[int, ...]:
        """The part's cores after §V-B's widening (masterd.core.widen), taken in the core."""
        if self.max_cores_per_gpu <= 0:
            return alloc.cpus
        view = self.ctx.core.node(alloc.node)
        if view is None:
            return alloc.cpus
        spare = node_spare_cores(self.ctx.core.policy, self.ctx.core.snapshot, view)
        cpus = widened(alloc.cpus, len(alloc.gpus), spare, self.max_cores_per_gpu)
        if len(cpus) == len(alloc.cpus):
            return alloc.cpus
        try:
            self.ctx.jobs.cores_changed(job.id, alloc.node, cpus)
        except (JobError, AllocationError) as exc:
            log.warning("job=%s node=%s not widened: %s", job.id, alloc.node, exc)
            return alloc.cpus
        log.info("job=%s node=%s widened from %d to %d cores (ceiling %d per GPU)", job.id,
                 alloc.node, len(alloc.cpus), len(cpus), self.max_cores_per_gpu)
        return cpus

    # -- events from nodes -----------------------------------------------------------------
    async def on_node_event(self, node: str, event: Any) -> None:
        if isinstance(event, CoresChanged):
            await self.cores_changed(node, event)

    async def cores_changed(self, node: str, event: CoresChanged) -> None:
        job = self.ctx.core.job(event.job_id)
        if job is None or job.state not in (JobState.STARTING, JobState.RUNNING):
            log.warning("node=%s cores_changed for job=%s that is not running here; ignored",
                        node, event.job_id)
            return
        held = {c for a in job.placement.allocations if a.node == node
                for c in a.cpus} if job.placement else set()
        if not set(event.cpus) <= held:
            # The whole budget is given at launch; a node only ever hands cores back.
            log.warning("node=%s job=%s cores_changed asks for cores %s it does not hold; "
                        "ignored", node, job.id, sorted(set(event.cpus) - held))
            return
        try:
            self.ctx.jobs.cores_changed(job.id, node, tuple(event.cpus))
        except (JobError, AllocationError) as exc:
            log.warning("node=%s job=%s cores_changed refused: %s", node, job.id, exc)
            return
        now = self.ctx.clock()
        detail = {
            "cpus": list(event.cpus), "pinned": list(event.pinned), "step": event.step,
            "utilisation": None if event.utilisation is None else round(event.utilisation, 2),
            "measured_cores": event.measured_cores, "converged": event.converged,
            "reason": event.reason,
        }
        await self.ctx.journal.persist([job], [(now, job.id, node, "cores_changed", detail)])
        log.info("job=%s node=%s cores=%d pinned=%d step=%d util=%s converged=%s", job.id,
                 node, len(event.cpus), len(event.pinned), event.step, event.utilisation,
                 event.converged)
        if event.converged:
            await self._remember(job, len(event.pinned), now)
        self.ctx.request_pass()  # cores came free: a queued job may fit now

    async def _remember(self, job: Job, cores: int, now: float) -> None:
        category = category_of(job.spec) or "unknown"  # as cores.remember keys it
        stored = await self.ctx.journal.call(remember_cores, job.spec.user, category,
                                             cores, now)
        remember(self.history, job.spec, cores)
        self.history[(job.spec.user, category)] = stored
        log.info("core history owner=%s category=%s converged=%d stored=%d", job.spec.user,
                 category, cores, stored)
