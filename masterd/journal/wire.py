"""Wire forms of a job's immutable parts, encoded once and reused.

A job's spec is encoded for its journal row and again for every prepare_job sent to a node,
and its placement for every persist of the job's state (placed, started, exited, ...); the
RPC view of a job shows parts of both on every listing. All of these are frozen, so the
encoded dict of one object never changes: the master keeps it per job and re-encodes only
when the job holds a different object (a new placement after a retry).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from shared.dependency import format_dependency
from shared.model import Job, JobSpec, Placement
from shared.schema import encode
from shared.slurmtime import format_signal

# Views are packed and sent, never changed: these parts are shared between responses.
NO_PLACEMENT_VIEW: dict[str, Any] = {"nodes": [], "placement": []}


def spec_view(spec: JobSpec) -> dict[str, Any]:
    """What an RPC job view shows of the spec."""
    stop = spec.stop
    return {
        "name": spec.name,
        "kind": spec.kind.value,
        "tenant": spec.tenant,
        "user": spec.user,
        "qos": spec.qos.value,
        "gpus": spec.gpus,
        "cpus": spec.cpus,
        "memory_mib": spec.memory_mib,
        "command": list(spec.command),
        # The OCI image it runs in (None: a host command; docs/containers.md).
        "image": spec.launch.image,
        # Time limit in seconds (None: none), its warning ("[B:]SIG@SECONDS"), the grace
        # the job asked for (None: the master's stop_grace_s) and whether it may be requeued
        # after a failure (None: the master's requeue_default): the spec's stop, flat.
        "time_limit_s": spec.time_limit_s,
        "warning": None if stop.warning is None else format_signal(stop.warning),
        "grace_s": stop.grace_s,
        "requeue": stop.requeue,
        "priority": spec.priority,
        # Its priority class (None where the cluster has none).
        "priority_class": spec.priority_class,
        # Its dependency in Slurm's syntax ("afterok:prep-3,afterany:clean"; "" for none)
        # and the array it is a task of ({id, index}, or nil).
        "after": format_dependency(spec.after),
        # The node features it selects, in Slurm's --constraint syntax ("a100&ib",
        # "a100|h100"; ""), and the nodes it may not use (--exclude).
        "constraint": spec.selector.constraint,
        "exclude": list(spec.selector.exclude),
        # The only nodes it may use (--nodelist; empty: any).
        "nodelist": list(spec.selector.only),
        # The partitions it may run in ("gpu,debug"; "" where the cluster has none).
        "partition": ",".join(spec.selector.partitions),
        # The reservation it runs in ("" for none).
        "reservation": spec.selector.reservation,
        "array": {"id": spec.array.id, "index": spec.array.index} if spec.array else None,
    }


def placement_view(placement: Placement) -> dict[str, Any]:
    """What an RPC job view shows of the placement."""
    return {
        "nodes": list(placement.nodes),
        "placement": [
            {"node": a.node, "gpus": list(a.gpus), "cpus": list(a.cpus),
             "memory_mib": a.memory_mib}
            for a in placement.allocations
        ],
    }


class WireCache:
    """Per-job encoded spec and placement, checked by identity and dropped when the job ends.

    ``limit`` bounds the entries kept should some path end jobs without :meth:`forget`.
    """

    def __init__(self, limit: int = 50_000) -> None:
        self.limit = limit
        self._specs: dict[str, tuple[JobSpec, dict[str, Any]]] = {}
        self._placements: dict[str, tuple[Placement, dict[str, Any]]] = {}
        # The immutable parts of a job's RPC view (see masterd.api.rpc.job_view).
        self._spec_views: dict[str, tuple[JobSpec, dict[str, Any]]] = {}
        self._placement_views: dict[str, tuple[Placement, dict[str, Any]]] = {}

    def spec(self, job: Job) -> dict[str, Any]:
        return self._cached(self._specs, job.id, job.spec, encode)

    def remember_spec(self, job: Job, wire: dict[str, Any]) -> None:
        """Use ``wire`` (a map that decodes to ``job.spec``) as the spec's wire form."""
        self._room(self._specs)
        self._specs[job.id] = (job.spec, wire)

    def placement(self, job: Job) -> dict[str, Any] | None:
        if job.placement is None:
            return None
        return self._cached(self._placements, job.id, job.placement, encode)

    def spec_view(self, job: Job) -> dict[str, Any]:
        return self._cached(self._spec_views, job.id, job.spec, spec_view)

    def placement_view(self, job: Job) -> dict[str, Any]:
        if job.placement is None:
            return NO_PLACEMENT_VIEW
        return self._cached(self._placement_views, job.id, job.placement, placement_view)

    def _cached(self, table: dict[str, tuple[Any, dict[str, Any]]], job_id: str, part: Any,
                make: Callable[[Any], dict[str, Any]]) -> dict[str, Any]:
        """``make(part)``, kept per job while the job holds this very object."""
        hit = table.get(job_id)
        if hit is not None and hit[0] is part:
            return hit[1]
        made = make(part)
        self._room(table)
        table[job_id] = (part, made)
        return made

    def forget(self, job_id: str) -> None:
        self._specs.pop(job_id, None)
        self._placements.pop(job_id, None)
        self._spec_views.pop(job_id, None)
        self._placement_views.pop(job_id, None)

    def __len__(self) -> int:
        return len(self._specs.keys() | self._placements.keys())

    def _room(self, table: dict[str, Any]) -> None:
        if len(table) >= self.limit:
            # Oldest first (dicts keep insertion order): long-lived jobs re-encode once.
            for key in list(table)[: self.limit // 10 or 1]:
                del table[key]
