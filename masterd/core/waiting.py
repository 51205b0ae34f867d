"""Why a queued job waits, for every policy: one (WaitReason, sentence) per job from one
vocabulary (``shared.model.WaitReason``, documented in docs/protocol.md).

In this order, the first that applies:

1. an admission gate is closed (held, dependency, time_limit, quota): that gate and its
   sentence, as the core keeps them (``Job.wait``/``Job.reason``);
2. the policy's own note from its last pass (SODA's arrays: "waiting: large:A100 reclaims it
   from ..."; a Liquid batch window; the profiler's shape): ``policy``;
3. the job is the head job the policy reserves resources for (EASY backfill):
   ``reserved``, "resources reserved from 14:05 on gpu-3";
4. no node holds the job's shape with the resources free now: ``no_fit``, "no node has 4
   free GPUs of A100 now";
5. it fits the free resources, yet a reservation for the head job holds them: ``reserved``;
6. otherwise other jobs come first in the policy's order: ``priority``, "behind 12 jobs the
   policy orders first" (SWAF's own order where the policy gives one, else the queue's).

Computed when shown, not per pass: :class:`WaitExplainer` is built once per listing and
computes queue positions, the free pool and the reservation once, and each shape's fit once,
so a listing of thousands of queued jobs stays cheap. Pure: no clock, no I/O.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from typing import Any

from masterd.core.backfill import Reservation
from masterd.core.conditions import DISCONNECTED, DRAINED, MAINTENANCE, POWER
from masterd.core.eligibility import PlacementKey, eligible, placement_key, selects
from masterd.core.placement import FreePool, pack
from masterd.core.profiling import unwrap
from masterd.core.scheduler import SchedulingCore
from shared.model import Job, JobSpec, JobState, NodeInventory, WaitReason


class WaitExplainer:
    def __init__(self, core: SchedulingCore) -> None:
        self.core = core
        self.policy = unwrap(core.policy)
        self._positions: dict[str, int] | None = None
        self._pool: FreePool | None = None
        self._fits: dict[PlacementKey, str | None] = {}
        # Each closed node's inventory and first condition, read once per listing.
        self._closed_nodes: list[tuple[NodeInventory, str]] | None = None
        self._reservation = reservation_of(self.policy)

    def why(self, job: Job) -> tuple[str, str]:
        """(wait reason, sentence) of a queued job; ("", its reason) for any other job."""
        if job.state is not JobState.QUEUED:
            return "", job.reason
        if job.gates:
            return job.wait, job.reason
        if job.reason and self.core.noted(job.id):
            return WaitReason.POLICY.value, job.reason
        code, sentence = self._why_placed(job)
        # What brought it back to the queue (preempted, a start that failed) stays first.
        return code, f"{job.reason}; {sentence}" if job.reason else sentence

    def _why_placed(self, job: Job) -> tuple[str, str]:
        """Why a job the policy sees, with no note of its own, did not start."""
        held = self._reservation
        if held is not None and held.job_id == job.id:
            return WaitReason.RESERVED.value, (f"resources reserved for it {_when(held.start)} "
                                               f"on {', '.join(held.nodes) or 'its nodes'}")
        misfit = self._misfit(job.spec)
        if misfit is not None:
            return WaitReason.NO_FIT.value, misfit
        if held is not None and job.id in held.held:
            return WaitReason.RESERVED.value, (f"it fits now, but would still run when job "
                                               f"{held.job_id}'s reservation begins "
                                               f"({_when(held.start)})")
        ahead = self._position(job.id)
        if ahead == 0:
            return WaitReason.PRIORITY.value, ("first in the policy's order; the next "
                                               "scheduling pass starts it")
        return WaitReason.PRIORITY.value, (f"behind {ahead} job{'s' if ahead != 1 else ''} "
                                           "the policy orders first")

    # -- the parts computed once per listing ---------------------------------------------------
    def _position(self, job_id: str) -> int:
        if self._positions is None:
            self._positions = {}
            order = getattr(self.policy, "waiting_order", None)
            ranked: list[str] = []
            if callable(order):
                # The policy's own order (SWAF's waiting allowance), where it gives one.
                ranked = [choice.job_id for choice in order()]
            queue = [job.id for job in self.core.queue()]
            seen = set(ranked)
            ranked += [job_id for job_id in queue if job_id not in seen]
            self._positions = {job_id: i for i, job_id in enumerate(ranked)}
        return self._positions.get(job_id, len(self._positions))

    def _misfit(self, spec: JobSpec) -> str | None:
        """Why no placement of the job fits the free resources now (None: one does)."""
        if spec.gpu_milli is not None:
            return None  # a share of a GPU: the policy decides who shares with whom
        key = placement_key(spec)
        if key in self._fits:
            return self._fits[key]
        if self._pool is None:
            self._pool = FreePool(self.core.snapshot())
        pool = self._pool
        why = None
        if pack(spec, pool) is None:
            why = _sentence(spec, pool, self._closed(spec))
        self._fits[key] = why
        return why


    def _closed(self, spec: JobSpec) -> str:
        """The nodes the job could use that take no new work, counted by their first
        condition ("2 drained, 1 disconnected"), or ""."""
        if self._closed_nodes is None:
            self._closed_nodes = []
            for name, conditions in self.core.conditions.closed().items():
                view = self.core.cluster.node(name)
                if conditions and view is not None:
                    self._closed_nodes.append((view.inventory, conditions[0].kind))
        counts = Counter(kind for node, kind in self._closed_nodes if eligible(spec, node))
        return ", ".join(f"{n} {_CLOSED_WORDS[kind]}" for kind, n in counts.most_common())


# How a count of closed nodes reads, by their first condition's kind.
_CLOSED_WORDS = {DISCONNECTED: "not connected", DRAINED: "drained",
                 MAINTENANCE: "in maintenance", POWER: "powered down"}


def _sentence(spec: JobSpec, pool: FreePool, closed: str = "") -> str:
    nodes = pool.nodes_for(spec)
    model = f" of {spec.gpu_model}" if spec.gpu_model else ""
    # The nodes it selects: "no node with ib has 2 free GPUs now".
    selector = spec.selector
    node = (f"node {selector}" if selector.only_features
            else f"node in partition {'|'.join(selector.partitions)}"
            if selector.only_partitions
            else f"node ({selector})" if selects(spec) else "node")
    memory = f" and {spec.memory_mib} MiB" if spec.memory_mib else ""
    if not nodes:
        later = [v.inventory for v in pool.views.values()
                 if eligible(spec, v.inventory, now=False)]
        down = sorted({name for inv in later for name in inv.closed_partitions
                       if name in spec.selector.partitions})
        if down:
            return (f"partition {', '.join(down)} starts no job now (down or inactive); "
                    "`trellisctl partitions` says why")
        if later:
            limit = ("its time limit" if spec.time_limit_s is not None
                     else "without a time limit it")
            return (f"{limit} would run into {_blocks(spec, later)} on every {node}{model} "
                    "up now; it waits until it has passed (a shorter --time may fit before "
                    "it)")
        return f"no {node}{model} is up and schedulable now" + (f" ({closed})" if closed
                                                                  else "")
    if spec.selector.exclusive and not any(pool.idle(n) for n in nodes):
        return (f"no {node}{model} is idle now (--exclusive takes whole nodes that run "
                "nothing else)")
    if spec.gpus:
        if max(len(pool.views[n].inventory.gpus) for n in nodes) < spec.gpus:
            where = f" of the nodes it selects ({spec.selector})" if selects(spec) else ""
            return (f"the free GPUs{model}{where} do not make up {spec.gpus} in a shape of "
                    "the job now (it spans nodes)")
        if max(pool.free_gpu_count(n) for n in nodes) < spec.gpus:
            return f"no {node} has {spec.gpus} free GPUs{model} now"
        return (f"no {node} has {spec.gpus} free GPUs{model} with {spec.cpus} free "
                f"cores{memory} now")
    return f"no {node} has {spec.cpus} free cores{memory} now"


def _blocks(spec: JobSpec, nodes: list[NodeInventory]) -> str:
    """What keeps the job off nodes it may use some day: "a maintenance window", "reservation
    course" (the blocks ahead of it there, as the nodes are stamped)."""
    found: dict[str, None] = {}
    for node in nodes:
        if node.maintenance_in_s is not None:
            found["a maintenance window"] = None
        for hold in node.reservations:
            if hold.name != spec.selector.reservation:
                found[f"reservation {hold.name}"] = None
    return " or ".join(list(found)[:3]) or "a reservation"


def _when(moment: float) -> str:
    """When a reservation begins, as a person reads it."""
    if math.isinf(moment):
        return "once a running job without a time limit ends"
    return "from " + time.strftime("%H:%M", time.localtime(moment))


def reservation_of(policy: Any) -> Reservation | None:
    """The head job's reservation, if the policy keeps one after its pass (EASY backfill's
    ``policy.reservation``), or None."""
    found = getattr(policy, "reservation", None)
    return found if isinstance(found, Reservation) else None
