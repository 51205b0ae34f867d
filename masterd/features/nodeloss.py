"""Node loss: a node silent for ``node_lost_s`` is down, and its jobs are requeued or ended.

Slurm's model (SlurmdTimeout, JobRequeue, MaxBatchRequeue), in three steps from the moment
the master loses a node's session (a closed connection, or a heartbeat that went
unanswered: 1.5 × ``node_heartbeat_s`` after the last data came from the node):

1. After ``node_grace_s`` the node is ``unreachable`` (the master's own timer): nothing new
   is placed there, its jobs are kept, a short glitch costs nothing.
2. ``node_lost_s`` after the node fell silent (the session's close, or the last data of a
   session the heartbeat ended) it is ``down``: the ``node_down``
   row (and the ``nodes_down`` table's row) is journalled first. Then every job with a live
   part there is settled by masterd/core/failures.py: requeued if it may be (its
   ``stop.requeue``, else ``requeue_default``) and has not been requeued
   ``max_requeues`` times, else ended ``node_lost`` with a reason naming the node. The
   lost part counts as exited; the job's parts on healthy nodes are stopped first (SIGTERM,
   SIGKILL after the job's grace) and the job is queued again (or ends) once they exited
   (``JobActions.lose_parts``: each step journalled before any node is told).
3. A node that says hello again is no longer down (``node_returned``); what it still runs
   of a job the master requeued is stopped by the reconciliation of its hello.

A restarted master reads ``nodes_down`` back: such a node is down at once, and jobs it still
holds (a restart between the ``node_down`` row and the last job) are settled then. Every
other node gets ``node_lost_s`` from the restart, since the master cannot know how long it
was silent before. A node with a power state (Cluster Energy Saving turned it off on
purpose) is never declared lost.
"""

from __future__ import annotations

import asyncio
import logging

from masterd.core.failures import (
    RequeueRules,
    jobs_on_node,
    node_lost_cause,
    verdict,
)
from masterd.core.scheduler import JobError
from masterd.journal.failures import clear_down, load_down, save_down
from masterd.runtime.context import FeatureContext
from shared.model import JobState

log = logging.getLogger("trellis.master.nodeloss")

DOWN = "down"


class NodeLoss:
    def __init__(self, ctx: FeatureContext) -> None:
        self.ctx = ctx
        # node -> (since, reason): declared lost, journalled; read before serving.
        self.down: dict[str, tuple[float, str]] = ctx.journal.now(load_down)
        # node -> when the master lost contact (its session closed, or the restart).
        self.silent_since: dict[str, float] = {}
        # Nodes this master has not heard from since it began leading (restored): their
        # silence counts from the takeover, and the sentence says so.
        self.unheard: set[str] = set()
        self._timers: dict[str, asyncio.TimerHandle] = {}
        # For the metrics: nodes declared lost, jobs requeued and ended (by this process).
        self.nodes_lost = 0
        self.requeued = 0
        self.ended = 0
        events = ctx.events
        events.node_disconnected.subscribe(self.disconnected)
        events.node_ready.subscribe(self.returned)
        events.restored.subscribe(self.restored)
        events.node_status.provide(self.status)

    def rules(self) -> RequeueRules:
        return RequeueRules.of(self.ctx.config())

    def status(self, node: str) -> str | None:
        return DOWN if node in self.down else None

    # -- timers --------------------------------------------------------------------------
    def disconnected(self, node: str, since: float) -> None:
        """The session ended; the node has been silent since ``since`` (earlier than now
        when a heartbeat, not a closed connection, ended it)."""
        self.silent_since[node] = since
        self.unheard.discard(node)
        lost_s = self.ctx.config().node_lost_s
        if lost_s > 0:
            self._arm(node, since + lost_s - self.ctx.clock())

    def _arm(self, node: str, delay: float) -> None:
        self._disarm(node)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # restored outside a loop (tests): nothing is timed then
            return
        self._timers[node] = loop.call_later(max(0.0, delay), self._expired, node)

    def _disarm(self, node: str) -> None:
        handle = self._timers.pop(node, None)
        if handle is not None:
            handle.cancel()

    def _expired(self, node: str) -> None:
        self._timers.pop(node, None)
        # A supervised task: the master's shutdown cancels it with the others.
        self.ctx.tasks.spawn(self.lose(node), name=f"node-lost-{node}")

    def restored(self) -> None:
        """After a restart or a failover every node is without a session: a node that was
        down is down again at once (and its remaining jobs settled), the others get
        node_lost_s from now."""
        now = self.ctx.clock()
        delay = self.ctx.config().node_lost_s
        # The journalled nodes, and any a restored job names (a node the journal lost
        # track of still holds that job's part).
        nodes = {view.name for view in self.ctx.core.nodes()} | set(self.down)
        for job in self.ctx.core.active_jobs().values():
            nodes.update(job.node_states)
        for node in sorted(nodes):
            if node not in self.silent_since:
                self.silent_since[node] = now
                self.unheard.add(node)
            if node in self.down:
                self._arm(node, 0.0)
            elif delay > 0:  # node_lost_s = 0: a silent node keeps its jobs
                self._arm(node, delay)

    def returned(self, node: str) -> None:
        """The node said hello: whatever happened, it is back."""
        self._disarm(node)
        self.silent_since.pop(node, None)
        self.unheard.discard(node)
        entry = self.down.pop(node, None)
        if entry is None:
            return
        since, _ = entry
        now = self.ctx.clock()
        log.warning("node=%s returned after %.0f s down", node, now - since)
        self.ctx.tasks.spawn(self.ctx.journal.call(
            clear_down, node, (now, None, node, "node_returned", {"down_s": now - since})),
            name=f"node-returned-{node}")

    # -- the loss ------------------------------------------------------------------------
    async def lose(self, node: str) -> None:
        """Declare ``node`` down (journalled first) and settle every job with a live part
        there. Nothing happens to a node that came back or has a power state."""
        if self.ctx.nodes.status(node) in ("ready", "drained"):
            return  # it said hello meanwhile
        if self.ctx.nodes.power_state(node) is not None:
            return  # turned off on purpose (Cluster Energy Saving): no job runs there
        now = self.ctx.clock()
        silent = now - self.silent_since.get(node, now)
        if node in self.down:  # down before this master's restart: why it went down
            cause = self.down[node][1]
        else:
            cause = node_lost_cause(node, silent, since_takeover=node in self.unheard)
        jobs = jobs_on_node(self.ctx.core.active_jobs().values(), node)
        if node not in self.down:
            self.down[node] = (now, cause)
            self.nodes_lost += 1
            await self.ctx.journal.call(save_down, node, now, cause, (
                now, None, node, "node_down",
                {"silent_s": round(silent, 3), "jobs": [j.id for j in jobs]}))
            log.warning("node=%s down: %s; jobs=%d", node, cause, len(jobs))
        elif jobs:
            log.warning("node=%s down since before the restart; settling jobs=%d", node,
                        len(jobs))
        rules = self.rules()
        lose = self.ctx.jobs.lose_parts
        if lose is None:
            raise RuntimeError("this master cannot take jobs off a lost node")
        for job in jobs:
            if job.state.terminal or node not in job.node_states:
                continue  # ended while an earlier job was settled
            if job.stopping:
                # Being stopped already (cancelled, preempted, requeued for another loss):
                # its end stands; only the lost part is counted as exited.
                decided, end_as = job.reason, None
            else:
                found = verdict(job, cause, rules)
                decided, end_as = found.reason, found.end_as
            try:
                await lose(job.id, (node,), decided, end_as)
            except JobError as exc:  # it ended meanwhile
                log.debug("job=%s not settled after the loss of %s: %s", job.id, node, exc)
                continue
            if end_as is JobState.QUEUED:
                self.requeued += 1
            elif end_as is not None:
                self.ended += 1
            log.info("job=%s node=%s lost: %s", job.id, node, decided)
        self.ctx.request_pass()
