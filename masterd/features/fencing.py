"""Fencing to the node: what the master does with parts that are not its own, and with a
node that returns different (docs/high-availability.md, "Fencing on the nodes").

* A node's hello names the newest master epoch it has seen; a master leading at an older
  one refuses it (``stale_epoch``), so the node goes on to the next master URL. The node
  refuses any command of an older epoch on its own as well (noded/fencing.py).
* A part the master does not own (masterd.core.fencing.judge_part: an older incarnation of
  a requeued job, a job that ended or was never placed there, one it does not know) is
  stopped on the node that runs it and journalled (``stale_part``, ``stray_part``); its
  exit is journalled (``stale_part_exited``) and the node told to forget it. A node that
  stops an older incarnation on its own (asked to prepare a newer one) says so with a
  ``stale_part`` event, journalled the same way.
* A node that returns with other resources (fewer GPUs, other cores) is believed about what
  it has, not about what its jobs hold: each job placed on a GPU or core that no longer
  exists fails (``resources_gone``), as a job whose part failed does.
"""

from __future__ import annotations

import logging
from typing import Any

from masterd.core.failures import RequeueRules, verdict
from masterd.core.fencing import Judgement, Verdict, incarnation, placed_on_missing
from masterd.core.scheduler import JobError
from masterd.core.timelimits import grace_for
from masterd.runtime.commands import CommandFailed
from masterd.runtime.context import FeatureContext
from shared.messages import ForgetJob, Hello, JobReport, StalePart, StopJob
from shared.model import Job, NodeInventory

log = logging.getLogger("trellis.master.fencing")

# Journal event kinds (trellisctl events).
STALE = "stale_part"  # an incarnation the master no longer owns, stopped
STRAY = "stray_part"  # a part the master never placed there (or does not know), stopped
STALE_EXITED = "stale_part_exited"  # a stale part's exit, as its node reported it
GONE = "resources_gone"  # a job failed: its node returned without its GPUs or cores
REFUSED = "node_refused"  # a node's hello refused: it has seen a newer master epoch


class Fencing:
    def __init__(self, ctx: FeatureContext) -> None:
        self.ctx = ctx
        # node -> the epoch its refused hello named (journalled once per epoch, not per dial).
        self._refused: dict[str, int] = {}
        ctx.events.hello_check.subscribe(self.check_hello)
        ctx.events.node_inventory.subscribe(self.on_inventory)
        ctx.events.stray_part.subscribe(self.on_stray_part)
        ctx.events.node_event.subscribe(self.on_node_event)

    # -- epochs ---------------------------------------------------------------------------
    def check_hello(self, hello: Hello) -> None:
        node, mine = hello.inventory.name, self.ctx.nodes.epoch()
        if hello.epoch <= mine:
            self._refused.pop(node, None)
            return
        reason = (f"node {node} has seen master epoch {hello.epoch}, newer than this "
                  f"master's {mine}: another master leads (or this master's journal was "
                  "replaced; see docs/high-availability.md)")
        if self._refused.get(node) != hello.epoch:
            self._refused[node] = hello.epoch
            log.error("node=%s refused: %s", node, reason)
            self.ctx.tasks.spawn(self.ctx.journal.persist([], [(
                self.ctx.clock(), None, node, REFUSED,
                {"node_epoch": hello.epoch, "epoch": mine, "reason": reason})]),
                name=f"fencing-refused-{node}")
        raise JobError("stale_epoch", reason)

    # -- parts that are not the master's ---------------------------------------------------
    async def on_stray_part(self, node: str, report: JobReport, judged: Judgement) -> None:
        job_id, restarts = report.job_id, report.restarts
        name = incarnation(job_id, restarts)
        if report.state == "exited":
            if judged.verdict is Verdict.STALE:
                log.info("node=%s stale part %s exited code=%s signal=%s", node, name,
                         report.exit_code, report.signal)
                await self.ctx.journal.persist([], [(
                    self.ctx.clock(), job_id, node, STALE_EXITED,
                    {"restarts": restarts, "exit_code": report.exit_code,
                     "signal": report.signal})])
            else:  # recorded already, or never the master's: nothing to keep
                log.debug("node=%s part %s exited (%s); forgotten", node, name,
                          judged.verdict.value)
            self.ctx.tasks.spawn(self._forget(node, job_id, restarts),
                                 name=f"fencing-forget-{job_id}")
            return
        kind = STRAY if judged.verdict is Verdict.FOREIGN else STALE
        log.warning("node=%s %s; stopping it", node, judged.reason)
        await self.ctx.journal.persist([], [(
            self.ctx.clock(), job_id, node, kind,
            {"restarts": restarts, "state": report.state, "reason": judged.reason,
             "by": "master"})])
        self.ctx.tasks.spawn(self._stop(node, job_id, restarts, judged.reason),
                             name=f"fencing-stop-{job_id}")

    async def on_node_event(self, node: str, event: Any) -> None:
        """A node stopped an older incarnation on its own (asked for a newer one)."""
        if not isinstance(event, StalePart):
            return
        log.warning("node=%s stopped stale part %s (%s): %s", node,
                    incarnation(event.job_id, event.restarts), event.state, event.reason)
        await self.ctx.journal.persist([], [(
            self.ctx.clock(), event.job_id, node, STALE,
            {"restarts": event.restarts, "newer": event.newer, "state": event.state,
             "reason": event.reason, "by": "node"})])

    async def _stop(self, node: str, job_id: str, restarts: int, reason: str) -> None:
        config = self.ctx.config()
        job = self.ctx.core.job(job_id)
        grace = (grace_for(job.spec, config.stop_grace_s, config.max_grace_s) if job
                 else min(config.stop_grace_s, config.max_grace_s))
        try:
            await self.ctx.nodes.send(node, "stop_job", StopJob(
                job_id=job_id, grace_s=grace, reason=reason[:256], restarts=restarts))
        except CommandFailed as exc:
            # Its next hello reports it again, and it is stopped then.
            log.warning("node=%s stop of %s not delivered: %s", node,
                        incarnation(job_id, restarts), exc.message)

    async def _forget(self, node: str, job_id: str, restarts: int) -> None:
        try:
            await self.ctx.nodes.send(node, "forget_job",
                                      ForgetJob(job_id=job_id, restarts=restarts))
        except CommandFailed as exc:
            log.debug("node=%s forget %s not delivered: %s", node,
                      incarnation(job_id, restarts), exc.message)

    # -- a node returning with other resources ------------------------------------------
    async def on_inventory(self, node: str, inventory: NodeInventory) -> None:
        affected = list(placed_on_missing(self.ctx.core.active_on(node), inventory))
        for job, reason in affected:
            if job.stopping and job.end_as:
                continue  # being ended already (cancelled, timed out): that ending stands
            log.warning("job=%s node=%s %s; the job fails", job.id, node, reason)
            await self.ctx.journal.persist([], [(self.ctx.clock(), job.id, node, GONE,
                                                 {"reason": reason})])
            await self.fail(job, reason)

    async def fail(self, job: Job, reason: str) -> None:
        """The failure path of a job one of whose parts can no longer run: the same rules
        as a lost node or a failed GPU (masterd/core/failures.py) requeue it, with its
        restarts + 1, or end it ``node_lost``; its other parts are stopped first."""
        lose = self.ctx.jobs.lose_parts
        if lose is None:
            raise RuntimeError("this master cannot take jobs off their nodes")
        found = verdict(job, reason, RequeueRules.of(self.ctx.config()))
        try:
            await lose(job.id, (), found.reason, found.end_as)
        except JobError as exc:  # it ended meanwhile
            log.debug("job=%s not settled: %s", job.id, exc)
