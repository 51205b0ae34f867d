"""Fair share with a memory and accounting: the master's half (docs/governance.md).

* Usage lives in :class:`masterd.core.fairshare.FairShare`, derived from the journal: when the
  master starts (or a standby takes over) it is rebuilt from the runs of every job submitted
  within ``history_half_lives`` half-lives (masterd/journal/history.py) plus the running jobs;
  from then on each job transition charges it (a run starts at ``running``; it is charged when
  the job leaves it: ended, preempted, requeued). Nothing of it is journalled separately, so a
  restart or a failover finds the same usage.
* The account tree is the configuration's ``[[master.accounts]]`` (every tenant a flat
  account while none is configured); :meth:`FairShareFeature.set_tree` swaps in another one
  (an admin's change at run time) and the factors follow at the next pass.
* With ``[master.fairshare] order = true`` the policy is wrapped in
  :class:`masterd.core.fairorder.FairShareOrdering` (see masterd/service/features.py).
* ``share`` (trellisctl share) and ``report`` (trellisctl report) are served from here; a
  report reads the journal in a thread on its own read connection, never on the event loop.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from masterd.core.fairorder import FairShareOrdering
from masterd.core.fairshare import FairShare, ShareRow, UsageWeights
from masterd.core.scheduler import Transition
from masterd.journal.accounting import (
    backfill,
    create_tables,
    read_jobs,
    record_ended,
    refresh_utilisation,
    report_journal,
)
from masterd.journal.backends import open_reader
from masterd.runtime.context import FeatureContext
from shared.accounts import AccountTree
from shared.config import FairShareConfig
from shared.messages import JobUsage
from shared.model import Job, JobState

log = logging.getLogger("trellis.master.fairshare")


def weights_of(config: FairShareConfig) -> UsageWeights:
    return UsageWeights(config.gpu_weight, config.cpu_weight, config.memory_gib_weight)


def job_resources(job: Job) -> tuple[int, int, int]:
    """GPUs, cores and memory a running job holds (its placement; its spec if unplaced)."""
    if job.placement is None:
        return job.spec.gpus, job.spec.cpus, job.spec.memory_mib
    gpus = cpus = memory = 0
    for alloc in job.placement.allocations:
        gpus += len(alloc.gpus)
        cpus += len(alloc.cpus)
        memory += alloc.memory_mib
    return gpus, cpus, memory or job.spec.memory_mib


class FairShareFeature:
    def __init__(self, ctx: FeatureContext) -> None:
        self.ctx = ctx
        config = ctx.config()
        self.tracker = FairShare(AccountTree.of(config.accounts), config.fairshare.half_life_s,
                                 weights_of(config.fairshare))
        self.ordering: FairShareOrdering | None = None
        self.rebuilt: dict[str, Any] = {}
        # Ended jobs whose accounting row is still to be written, and the write in flight.
        self._ended: list[str] = []
        self._writing: asyncio.Future[None] | None = None
        self.backfilled = 0
        self._listening = False
        # (account, end state) -> jobs ended since this master started (Prometheus).
        self.ended_counts: dict[tuple[str, str], int] = {}
        ctx.journal.now(create_tables)
        ctx.events.restored.subscribe(self.restored)
        ctx.events.job_ended.subscribe(self.ended)
        ctx.events.job_submitted.subscribe(lambda job: self.tracker.note(job.spec.tenant))
        ctx.events.job_transition.subscribe(self.on_transition)
        ctx.events.config_changed.subscribe(self.reconfigured)
        ctx.events.accounts_changed.subscribe(self.set_tree)

    # -- inputs --------------------------------------------------------------------------
    def restored(self) -> None:
        """Rebuild usage from the journal: every run of the recent jobs, then the running
        ones from the core (their runs go on)."""
        config = self.ctx.config().fairshare
        now = self.ctx.clock()
        since = now - config.history_half_lives * config.half_life_s
        jobs = self.ctx.journal.now(lambda store: read_jobs(
            store.db, ended_since=since, utilisation=False))
        runs = 0
        for record in jobs:
            self.tracker.note(record.account)
            for run in record.runs:
                if run.end is not None:
                    self.tracker.charge(record.account, run.gpus, run.cpus, run.memory_mib,
                                        run.start, min(run.end, now))
                    runs += 1
        for job in self.ctx.core.active_jobs().values():
            if job.state is JobState.RUNNING and job.start_time is not None:
                self.tracker.started(job.id, job.spec.tenant, *job_resources(job),
                                     job.start_time)
        self.rebuilt = {"time": now, "jobs": len(jobs), "runs": runs,
                        "running": self.tracker.running()}
        log.info("fairshare usage rebuilt from the journal: jobs=%d runs=%d running=%d",
                 len(jobs), runs, self.tracker.running())
        self.ctx.tasks.spawn(self._backfill(), name="accounting-backfill")
        # Subscribed now, not in __init__: after Liquid's feature, which journals a usage
        # report before this handler reads it (the subscribers run in order).
        if not self._listening:
            self._listening = True
            self.ctx.events.node_event.subscribe(self.node_event)

    async def node_event(self, node: str, body: Any) -> None:
        """A part's final usage report: its job's accounting row gets its utilisation (the
        row may have been written before the report came)."""
        if isinstance(body, JobUsage) and body.final:
            await self.ctx.journal.call(refresh_utilisation, body.job_id)

    async def _backfill(self) -> None:
        """Accounting rows of jobs that ended before they were written (a journal from
        before the table, a master stopped in between), a chunk per journal call so other
        writes interleave."""
        after: int | None = 0
        while after is not None:
            done, after = await self.ctx.journal.call(backfill, 2000, after)
            self.backfilled += done
        if self.backfilled:
            log.info("accounting rows derived for %d ended jobs", self.backfilled)

    def ended(self, job: Job) -> None:
        """A job ended: its accounting row is written (batched while a write is out)."""
        self._ended.append(job.id)
        key = (job.spec.tenant, job.state.value)
        self.ended_counts[key] = self.ended_counts.get(key, 0) + 1
        if self._writing is None:
            self._writing = self.ctx.tasks.spawn(self._write_ended(), name="accounting-rows")

    async def _write_ended(self) -> None:
        try:
            while self._ended:
                ids, self._ended = self._ended, []
                try:
                    await self.ctx.journal.call(record_ended, ids)
                except Exception as exc:  # derived again by the next start's backfill
                    log.warning("accounting rows of %d jobs not written: %s", len(ids), exc)
        finally:
            self._writing = None

    async def on_transition(self, job: Job, transition: Transition) -> None:
        if transition.state is JobState.RUNNING:
            start = job.start_time if job.start_time is not None else self.ctx.clock()
            self.tracker.started(job.id, job.spec.tenant, *job_resources(job), start)
        else:
            self.tracker.stopped(job.id, job.end_time if job.end_time is not None
                                 else self.ctx.clock())

    def set_tree(self, tree: AccountTree) -> None:
        """Use another account tree (an admin changed it at run time; the accounts feature
        asks for the pass that applies it)."""
        self.tracker.set_tree(tree)
        if self.ordering is not None:
            self.ordering.refresh()

    def reconfigured(self) -> None:
        # The tree itself comes from the accounts feature (accounts_changed): after the
        # first start the journal's tree wins over the file's.
        config = self.ctx.config()
        self.tracker.set_weights(weights_of(config.fairshare), config.fairshare.half_life_s)
        self.ctx.request_pass()

    # -- outputs -------------------------------------------------------------------------
    def rows(self, visible: set[str] | None = None) -> list[ShareRow]:
        rows = self.tracker.rows(self.ctx.clock())
        if visible is None:
            return rows
        return [row for row in rows if row.account in visible]

    def visible_accounts(self, user: str) -> set[str]:
        """The accounts a client of Unix user ``user`` may see: those it belongs to and
        their sub-accounts; with no accounts configured, the tenants of its own jobs."""
        tree = self.tracker.tree
        out: set[str] = set()
        if tree.enabled:
            for account in tree.accounts_of(user):
                out.update(tree.subtree(account))
        for job in self.ctx.core.jobs.values():
            if job.spec.user == user:
                out.add(job.spec.tenant)
        return out

    async def report(self, by: str, since: float, until: float,
                     user: str | None = None) -> list[dict[str, Any]]:
        """Accounting over ``[since, until)`` from the journal, read in a thread on a
        connection of its own (``user``: only that Unix user's jobs)."""
        location = self.ctx.journal.location
        return await asyncio.to_thread(report_from_journal, location, by, since, until, user)


def report_from_journal(location: str, by: str, since: float, until: float,
                        user: str | None = None) -> list[dict[str, Any]]:
    db = open_reader(location, application_name="trellis-report")
    try:
        return report_journal(db, by, since, until, None if user is None else (user,))
    finally:
        db.close()


def share_row(row: ShareRow) -> dict[str, Any]:
    return {"account": row.account, "parent": row.parent, "shares": row.shares,
            "norm_shares": round(row.norm_shares, 6), "raw_usage": round(row.raw_usage, 6),
            "norm_usage": round(row.norm_usage, 6),
            "effective_usage": round(row.effective_usage, 6), "factor": round(row.factor, 6)}

