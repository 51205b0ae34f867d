"""SODA's multi-array pools in the live master (§V-C): the pools view and periodic re-sizing.

Array sizes "come from configuration and history": every ``[master] array_resize_interval_s``
the master collects the demand of the jobs that ended in the last ``array_history_days``
(else the policy's ``history_days``), re-derives the sizes with :func:`resize` (within the
configured bounds) and hands them to the policy. A change is journalled as an
``arrays_resized`` event with the sizes before and after; jobs already running keep their
resources, and borrowers of a shrunk array are preempted by the usual rules when an owner
needs the units back.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from masterd.core.arrays.policy import ArrayPolicy
from masterd.core.arrays.resize import DAY, DemandRecord, demand_of, resize
from masterd.core.scheduler import JobError
from masterd.features.arrays.demand import DemandLog
from masterd.journal.store import Store
from masterd.runtime.context import FeatureContext
from shared.model import Job

log = logging.getLogger("trellis.master.arrays")


class ArrayPools:
    def __init__(self, ctx: FeatureContext) -> None:
        self.ctx = ctx
        self.last_resize: dict[str, Any] | None = None  # the latest re-sizing pass
        self.last_change: dict[str, Any] | None = None  # the latest one that changed sizes
        # The window's demand, summed as jobs end (None unless the policy has arrays): the
        # master keeps only the newest ended jobs in memory, not the window's.
        self.demand: DemandLog | None = None
        ctx.events.restored.subscribe(self.start)
        ctx.events.job_ended.subscribe(self.job_ended)

    def policy(self) -> ArrayPolicy | None:
        base = self.ctx.core.policy
        return base if isinstance(base, ArrayPolicy) else None

    def require(self) -> ArrayPolicy:
        """The array policy, or a JobError saying this master runs another one."""
        policy = self.policy()
        if policy is None:
            raise JobError(
                "not_supported",
                f"pools exist only under the soda-arrays policy; this master runs "
                f"{self.ctx.core.policy_name!r} (set [master] policy = \"soda-arrays\")",
            )
        return policy

    def sizes(self, policy: ArrayPolicy) -> dict[str, int]:
        snapshot = self.ctx.core.snapshot()
        return {s.name: s.size for s in policy.summary(snapshot, ())}

    def summary(self) -> dict[str, Any]:
        policy = self.require()
        core = self.ctx.core
        arrays = [dataclasses.asdict(s) for s in policy.summary(core.snapshot(), core.queue())]
        return {
            "arrays": arrays,
            "history_days": self.history_days(policy),
            "resize_interval_s": self.ctx.config().array_resize_interval_s,
            "last_resize": self.last_resize,
            "last_change": self.last_change,
        }

    def history_days(self, policy: ArrayPolicy) -> float:
        configured = self.ctx.config().array_history_days
        return configured if configured is not None else policy.config.history_days

    # -- re-sizing -------------------------------------------------------------------------
    def start(self) -> None:
        """After the master restored its jobs, before serving (the store is used from this
        thread then): load the window's demand from the journal, start re-sizing."""
        policy = self.policy()
        if policy is None:
            return
        self._load_demand(policy)
        interval = self.ctx.config().array_resize_interval_s
        if interval > 0:
            self.ctx.tasks.every(interval, self._resize_periodically, "arrays-resize")

    def _load_demand(self, policy: ArrayPolicy) -> None:
        window = self.history_days(policy) * DAY
        now = self.ctx.clock()
        self.demand = DemandLog(window)
        # Jobs submitted up to a window before it starts: one that ran longer than the whole
        # window before ending in it is left out (the journal is read in submission order, so
        # the read stops at the window instead of going through every job ever run).
        jobs = self.ctx.journal.now(Store.ended_jobs, now - 2 * window)
        for job in jobs:
            record = demand_of(job)
            if record is not None and record.end_time >= now - window:
                self.demand.add(record)
        log.info("array demand loaded jobs=%d buckets=%d window_days=%g", len(jobs),
                 len(self.demand), window / DAY)

    def job_ended(self, job: Job) -> None:
        """Called by the master as a job reaches a terminal state."""
        if self.demand is not None:
            record = demand_of(job)
            if record is not None:
                self.demand.add(record)

    async def _resize_periodically(self) -> None:
        await self.resize_now()

    def history(self, since: float) -> list[DemandRecord]:
        if self.demand is None:
            return []
        self.demand.prune(self.ctx.clock())
        return self.demand.records(since)

    async def resize_now(self) -> dict[str, Any]:
        """Re-derive array sizes from recent demand; returns what changed."""
        policy = self.require()
        now = self.ctx.clock()
        config = dataclasses.replace(policy.config, history_days=self.history_days(policy))
        since = now - config.history_days * DAY
        records = self.history(since)
        jobs = self.demand.jobs(since) if self.demand is not None else 0
        new = resize(config, records, now)
        before = self.sizes(policy)
        changed = new != policy.config
        if changed:
            policy.reconfigure(new)
        after = self.sizes(policy)
        result = {"time": now, "jobs": jobs, "changed": after != before,
                  "before": before, "after": after}
        self.last_resize = result
        if after != before:
            self.last_change = result
            await self.ctx.journal.persist([], [(now, None, None, "arrays_resized", {
                "jobs": jobs, "before": before, "after": after})])
            log.info("arrays_resized jobs=%d sizes=%s", jobs,
                     ",".join(f"{k}={v}" for k, v in after.items()))
            self.ctx.request_pass()
        else:
            log.debug("arrays_resize_unchanged jobs=%d", jobs)
        return result
