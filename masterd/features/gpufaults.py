"""GPU faults: a GPU a node reports unhealthy stays out of service until it is returned,
and a fatal fault stops (and requeues) the jobs using it.

The node reports each change of a GPU's health (``gpu_health``, with the Xid when there is
one; application Xids never leave the node: shared/xid.py). Here:

* Every unhealthy report is journalled as a fault (``gpu_faults``, event ``gpu_fault``) and
  the GPU is held out of service by the master itself, whatever a later hello says: a
  restarted node daemon forgets its faults, the master does not (``events.effective_inventory``
  marks the GPU unhealthy in every inventory the master takes, from a hello or the journal).
* A fatal fault (shared/xid.py: 79 fallen off the bus, 48 double-bit ECC, ... or no Xid:
  NVML lost the device or wants a reset) stops every job using the GPU, each requeued or
  ended ``node_lost`` by the same rules as a node loss (masterd/core/failures.py). Other
  faults (63, 92, ...) keep new jobs off the GPU and leave the running one alone.
* The GPU is returned by an operator, ``trellisctl gpu reset NODE INDEX`` (:meth:`reset`:
  the node clears its own record, then the master; journalled ``gpu_reset``), or by the
  node reporting it healthy again (its configured health check passed, or NVML came back
  after a driver reload; journalled ``gpu_returned``).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from masterd.core.failures import RequeueRules, gpu_failed_cause, jobs_on_gpu, verdict
from masterd.core.scheduler import JobError
from masterd.journal.failures import (
    GpuFault,
    clear_fault,
    ensure_schema,
    load_faults,
    save_fault,
)
from masterd.runtime.commands import CommandFailed
from masterd.runtime.context import FeatureContext
from shared.messages import GpuHealth, ResetGpu
from shared.model import JobState, NodeInventory
from shared.xid import is_fatal

log = logging.getLogger("trellis.master.gpufaults")


class GpuFaults:
    def __init__(self, ctx: FeatureContext) -> None:
        self.ctx = ctx
        ctx.journal.now(ensure_schema)
        # (node, GPU index) -> why it is out of service; read before serving.
        self.faults: dict[tuple[str, int], GpuFault] = ctx.journal.now(load_faults)
        # For the metrics (this process): faults by kind, jobs requeued and ended by them.
        self.fatal_faults = 0
        self.other_faults = 0
        self.requeued = 0
        self.ended = 0
        ctx.events.effective_inventory.provide(self.held_out)
        ctx.events.gpu_health.subscribe(self.on_health)

    def rules(self) -> RequeueRules:
        return RequeueRules.of(self.ctx.config())

    def of(self, node: str, index: int) -> dict[str, Any] | None:
        """A GPU's fault as the node view shows it, or None while it is in service."""
        fault = self.faults.get((node, index))
        if fault is None:
            return None
        return {"xid": fault.xid, "reason": fault.reason, "fatal": fault.fatal,
                "since": fault.since}

    def out_of_service(self, node: str) -> int:
        return sum(1 for (n, _) in self.faults if n == node)

    def held_out(self, inventory: NodeInventory) -> NodeInventory:
        """The inventory with every GPU the master holds out marked unhealthy."""
        held = {i for (n, i) in self.faults if n == inventory.name}
        if not held or all(not g.healthy for g in inventory.gpus if g.index in held):
            return inventory
        return replace(inventory, gpus=tuple(
            replace(g, healthy=False) if g.index in held else g for g in inventory.gpus))

    # -- reports from nodes --------------------------------------------------------------
    async def on_health(self, node: str, event: GpuHealth) -> None:
        key = (node, event.index)
        now = self.ctx.clock()
        if event.healthy:
            fault = self.faults.pop(key, None)
            if fault is not None:
                log.warning("node=%s gpu=%d back in service: %s", node, event.index,
                            event.reason or "the node reports it healthy")
                await self.ctx.journal.call(clear_fault, node, event.index, (
                    now, None, node, "gpu_returned",
                    {"gpu": event.index, "reason": event.reason, "xid": fault.xid}))
            return
        fatal = is_fatal(event.xid)
        known = self.faults.get(key)
        if known is not None and (known.fatal or not fatal):
            return  # held out already, for a reason at least as grave
        fault = GpuFault(event.xid, event.reason, fatal, now)
        self.faults[key] = fault
        if fatal:
            self.fatal_faults += 1
        else:
            self.other_faults += 1
        jobs = (jobs_on_gpu(self.ctx.core.active_jobs().values(), node, event.index)
                if fatal else [])
        await self.ctx.journal.call(save_fault, node, event.index, fault, (
            now, None, node, "gpu_fault",
            {"gpu": event.index, "xid": event.xid, "reason": event.reason, "fatal": fatal,
             "jobs": [j.id for j in jobs]}))
        log.error("node=%s gpu=%d out of service (%s): %s; jobs stopped=%d", node,
                  event.index, "fatal" if fatal else "kept running", event.reason, len(jobs))
        cause = gpu_failed_cause(node, event.index, event.reason or "unhealthy")
        await self._settle(jobs, node, cause)

    async def _settle(self, jobs: list[Any], node: str, cause: str) -> None:
        lose = self.ctx.jobs.lose_parts
        if lose is None:
            raise RuntimeError("this master cannot stop jobs after a GPU failure")
        rules = self.rules()
        for job in jobs:
            if job.stopping or job.state.terminal:
                continue  # being stopped already (cancelled, preempted): that end stands
            found = verdict(job, cause, rules)
            try:
                await lose(job.id, (), found.reason, found.end_as)
            except JobError as exc:
                log.debug("job=%s not stopped after the GPU failure: %s", job.id, exc)
                continue
            if found.end_as is JobState.QUEUED:
                self.requeued += 1
            else:
                self.ended += 1
            log.info("job=%s node=%s: %s", job.id, node, found.reason)

    # -- operators -----------------------------------------------------------------------
    async def reset(self, node: str, index: int) -> dict[str, Any]:
        """Return GPU ``index`` of ``node`` to service (trellisctl gpu reset). Refused, with
        nothing changed, for an unknown node or GPU, a GPU in service, or a node that is
        not connected (the node daemon must clear its own record too)."""
        view = self.ctx.core.node(node)
        if view is None:
            raise JobError("unknown_node", f"node {node!r} is not registered")
        gpu = next((g for g in view.inventory.gpus if g.index == index), None)
        if gpu is None:
            indices = [g.index for g in view.inventory.gpus]
            have = (f"its GPUs are {min(indices)}-{max(indices)}" if indices
                    else "it has no GPUs")
            raise JobError("unknown_gpu", f"node {node} has no GPU {index} ({have})")
        fault = self.faults.get((node, index))
        if fault is None and gpu.healthy:
            raise JobError("gpu_in_service", f"GPU {index} of node {node} is in service; only "
                           "a GPU out of service can be reset")
        status = self.ctx.nodes.status(node)
        if status not in ("ready", "drained"):
            raise JobError("node_unreachable", f"node {node} is {status}: a GPU is returned "
                           "to service through its node daemon, so reset it once the node "
                           "is connected again")
        try:
            answer = await self.ctx.nodes.send(node, "reset_gpu", ResetGpu(index=index))
        except CommandFailed as exc:
            raise JobError(exc.code if exc.code != "timeout" else "node_unreachable",
                           f"node {node} did not reset GPU {index}: {exc.message}") from None
        now = self.ctx.clock()
        was = self.of(node, index)
        self.faults.pop((node, index), None)
        await self.ctx.journal.call(clear_fault, node, index, (
            now, None, node, "gpu_reset",
            {"gpu": index, "by": "operator", "was": was,
             "node_held_it": bool(answer.get("recovered", False))}))
        self.ctx.nodes.gpu_health(node, index, True)
        log.warning("node=%s gpu=%d returned to service by an operator (was: %s)", node, index,
                    was["reason"] if was else "unhealthy")
        return {"node": node, "index": index, "healthy": True, "was": was}
