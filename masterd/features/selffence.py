"""The master's half of the node lease: a node cut off from every master stops, on its own,
the parts the master would requeue elsewhere, before the master does (shared/nodelease.py;
docs/high-availability.md, "Why no part of a job runs twice at once").

* The ack of every hello carries the terms (``node_lost_s``, the margin, ``max_grace_s``);
  the configuration that could not keep them (``node_lost_s`` too short against
  ``max_grace_s`` and the margin) is refused at start and on SIGHUP (shared/config.py).
* Every launched part says whether the master would requeue its job if the node were lost:
  the verdict masterd/core/failures.py would give at launch (``stop.requeue``, else
  ``requeue_default``, and a requeue left under ``max_requeues``). A part that would end
  ``node_lost`` instead is left running by a cut-off node: nothing replaces it.
* A part its node stopped so is reported ``fenced`` (in the hello that follows, or as its
  exit) and journalled (``part_fenced``, trellisctl events). If it was still the master's
  part (the master had not yet declared the node lost: a master outage, a cut shorter than
  ``node_lost_s``), its job is settled as after a node loss: requeued, or ended
  ``node_lost``, by the same rules; its other parts stopped first.
"""

from __future__ import annotations

import logging

from masterd.core.failures import RequeueRules, verdict
from masterd.core.fencing import incarnation, judge_part
from masterd.core.scheduler import JobError
from masterd.runtime.context import FeatureContext
from shared.messages import JobExited
from shared.model import Job, JobState
from shared.nodelease import LeaseTerms, lease_margin

log = logging.getLogger("trellis.master.selffence")

FENCED = "part_fenced"  # journal event kind: a node stopped a part on its own


class NodeLeases:
    def __init__(self, ctx: FeatureContext) -> None:
        self.ctx = ctx
        # For the metrics: parts their nodes reported stopping on their own, and the jobs
        # this master then requeued or ended.
        self.fenced = 0
        self.requeued = 0
        self.ended = 0
        ctx.events.node_lease.provide(self.terms)
        ctx.events.requeue_if_lost.provide(self.requeue_if_lost)
        ctx.events.part_fenced.provide(self.on_fenced)

    def rules(self) -> RequeueRules:
        return RequeueRules.of(self.ctx.config())

    def terms(self) -> LeaseTerms | None:
        """The lease the ack of a hello gives (None with node_lost_s 0: no node loss)."""
        config = self.ctx.config()
        if config.node_lost_s <= 0:
            return None
        return LeaseTerms(node_lost_s=config.node_lost_s,
                          margin_s=lease_margin(config.node_heartbeat_s,
                                                config.node_fence_margin_s),
                          max_grace_s=config.max_grace_s)

    def requeue_if_lost(self, job: Job) -> bool:
        """Whether the loss of a node of ``job`` would requeue it (decided as at a loss)."""
        if self.ctx.config().node_lost_s <= 0:
            return False  # nodes are never declared lost: nothing would replace the part
        return verdict(job, "", self.rules()).requeue

    async def on_fenced(self, node: str, exited: JobExited) -> bool:
        """A node stopped a part on its own: journal it, and settle the job if the part was
        still the master's (True); otherwise (a part of a job requeued since, or ended) the
        master's usual handling of a stale or ended part follows (False)."""
        self.fenced += 1
        job = self.ctx.core.job(exited.job_id)
        judged = judge_part(job, exited.job_id, node, exited.restarts)
        settle = judged.mine and job is not None and not job.stopping
        log.warning("node=%s stopped part %s on its own (%s): %s", node,
                    incarnation(exited.job_id, exited.restarts), judged.verdict.value,
                    exited.reason)
        await self.ctx.journal.persist([], [(
            self.ctx.clock(), exited.job_id, node, FENCED,
            {"restarts": exited.restarts, "reason": exited.reason,
             "exit_code": exited.exit_code, "signal": exited.signal,
             "part": judged.verdict.value})])
        if not settle:
            return False
        assert job is not None
        lose = self.ctx.jobs.lose_parts
        if lose is None:
            raise RuntimeError("this master cannot take jobs off their nodes")
        cause = exited.reason or f"stopped by node {node}, cut off from every master"
        found = verdict(job, cause, self.rules())
        try:
            await lose(job.id, (node,), found.reason, found.end_as)
        except JobError as exc:  # it ended meanwhile: nothing more to record
            log.debug("job=%s not settled after its part on %s was fenced: %s", job.id, node,
                      exc)
            return True
        log.info("job=%s node=%s part stopped by its node: %s", job.id, node, found.reason)
        if found.end_as is JobState.QUEUED:
            self.requeued += 1
            self.ctx.request_pass()
        else:
            self.ended += 1
        return True
