"""What the master's RPC methods answer, as dataclasses: the typed SDK (control.typed)
decodes replies into these with the same schema code that checks every request
(:func:`shared.schema.decode`), and docs/protocol.md documents the job view from
:class:`JobView`'s fields, so the reference, the master and the SDK cannot drift apart (a
test decodes the master's own views strictly).

The master builds its views as plain maps on its hot path (masterd.api.rpc.job_view); a
client decodes only the keys it knows (:func:`decode_view`), so an older SDK keeps working
against a newer master that added keys.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from dataclasses import dataclass, field
from typing import Any, TypeVar

from shared.model import ArrayTask, GpuInfo
from shared.schema import decode

V = TypeVar("V")


@dataclass(frozen=True)
class PlacementPart:
    """One node's share of a placed job."""

    node: str
    gpus: tuple[int, ...] = ()
    cpus: tuple[int, ...] = ()
    memory_mib: int = 0


@dataclass(frozen=True)
class JobView:
    """A job as `submit`, `submit_many`, `cancel`, `jobs` and `job` show it."""

    # The job's id (NAME-SEQ unless the submission chose it).
    id: str
    # queued, starting, running, finished, failed, cancelled, timeout or node_lost.
    state: str
    # The spec's name, kind, tenant, user and QoS class ([job spec](#job-spec)) ...
    name: str
    kind: str
    tenant: str
    user: str
    qos: str
    # ... the GPUs, cores and memory it asked for ...
    gpus: int
    cpus: int
    memory_mib: int
    # ... and its command.
    command: tuple[str, ...]
    # The OCI image it runs in (nil: a host command).
    image: str | None = None
    # Its time limit in seconds (nil: none) ...
    time_limit_s: int | None = None
    # ... the warning it asked for before the limit, as Slurm writes it ("[B:]SIG@SECONDS") ...
    warning: str | None = None
    # ... its SIGTERM-to-SIGKILL grace (nil: the master's stop_grace_s) ...
    grace_s: float | None = None
    # ... and whether it is requeued when its node is lost or a GPU of it fails (nil: the
    # master's requeue_default).
    requeue: bool | None = None
    # Its priority among otherwise equal jobs (higher first).
    priority: int = 0
    # Its dependency in Slurm's syntax ("afterok:prep-3,afterany:clean"; "" for none).
    after: str = ""
    # The node features it selects, in Slurm's --constraint syntax ("a100&ib"; "" for none).
    constraint: str = ""
    # The nodes it may not use (Slurm's --exclude).
    exclude: tuple[str, ...] = ()
    # The only nodes it may use (Slurm's --nodelist; empty: any).
    nodelist: tuple[str, ...] = ()
    # The partitions it may run in ("gpu,debug"; "" where the cluster has none).
    partition: str = ""
    # The reservation it runs in ("" for none).
    reservation: str = ""
    # Its priority class (None where the cluster has none).
    priority_class: str | None = None
    # The array it is a task of, and its index there.
    array: ArrayTask | None = None
    # When it was submitted (seconds since the epoch) ...
    submit_time: float = 0.0
    # ... started (every part running) ...
    start_time: float | None = None
    # ... and ended.
    end_time: float | None = None
    # Seconds it waited before starting.
    queued_s: float | None = None
    # How it ended: its exit code ...
    exit_code: int | None = None
    # ... or the signal that killed it.
    signal: int | None = None
    # Why it is where it is: why a queued job waits, why a job failed or was stopped.
    reason: str = ""
    # Why a queued job waits ([why a job waits](#why-a-job-waits); "" for other jobs).
    wait: str = ""
    # Who holds it back: "" (nobody), "user" or "admin" (trellisctl hold).
    held: str = ""
    # Times it was placed (a retry or a re-queue after preemption places it again).
    attempts: int = 0
    # Times it was requeued after its node was lost or a GPU of it failed (the job sees it
    # as TRELLIS_RESTART_COUNT).
    restarts: int = 0
    # The nodes it runs (or ran) on ...
    nodes: tuple[str, ...] = ()
    # ... and what it holds on each.
    placement: tuple[PlacementPart, ...] = ()
    # When a running job reaches its time limit (its start + its limit), else nil.
    time_limit_at: float | None = None


@dataclass(frozen=True)
class JobEvent:
    """One journal row about a job (`job`'s `events`)."""

    time: float
    node: str | None
    kind: str
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class JobDetail:
    """`job`: a job with its journal rows and what the features say of it (GENIE's
    prediction, the metrics it reported, Liquid's usage and resources, Helios' estimate:
    left as maps, each feature's own shape)."""

    job: JobView
    events: tuple[JobEvent, ...] = ()
    prediction: dict[str, Any] | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    usage: tuple[dict[str, Any], ...] = ()
    resources: dict[str, float] = field(default_factory=dict)
    estimate: dict[str, Any] | None = None


@dataclass(frozen=True)
class GpuView(GpuInfo):
    """One GPU of a node as `nodes` shows it: its inventory, its utilisation, its holder."""

    utilization_pct: float | None = None
    # (`node` only) the job holding it.
    job: str | None = None
    # (`node` only) why it is out of service, nil while in service: `{xid, reason, fatal,
    # since}` (`trellisctl gpu reset` returns it).
    fault: dict[str, Any] | None = None


@dataclass(frozen=True)
class NodeView:
    """A node as `nodes` shows it."""

    name: str
    # ready, drained, disconnected, unreachable, down (lost: node_lost_s), or a power state.
    status: str
    address: str
    gpu_model: str | None
    gpus: int
    gpus_free: int
    gpus_unhealthy: tuple[int, ...]
    cpus: int
    cpus_free: int
    memory_mib: int
    memory_free_mib: int
    jobs: tuple[str, ...]
    gpu_detail: tuple[GpuView, ...]


@dataclass(frozen=True)
class NodePart:
    """A job part placed on a node (`node`'s `jobs`)."""

    id: str
    state: str
    tenant: str
    user: str
    qos: str
    gpus: tuple[int, ...]
    cpus: tuple[int, ...]
    memory_mib: int


@dataclass(frozen=True)
class NodeDetail:
    """`node`: one node with the job parts placed there."""

    node: NodeView
    jobs: tuple[NodePart, ...]
    rdt: dict[str, bool]
    partition: dict[str, Any] | None = None
    memory_bandwidth: dict[str, Any] | None = None


@dataclass(frozen=True)
class JournalEvent:
    """One journal row (`events`)."""

    seq: int
    time: float
    job: str | None
    node: str | None
    kind: str
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class EventPage:
    """`events`: rows oldest first, and the cursor to pass as `after` next time."""

    events: tuple[JournalEvent, ...]
    last: int


@dataclass(frozen=True)
class MasterInfo:
    """`ping`: the master's version and policy."""

    version: str
    policy: str


def decode_view(cls: type[V], data: Any, path: str = "result") -> V:
    """``data`` (a reply map) as ``cls``, keeping only the keys ``cls`` knows, at every level
    of nesting: a newer master may add keys, and an older client must still read its reply.
    Values are checked as strictly as any request (SchemaError names the field)."""
    return decode(cls, _known(cls, data), path)


def _known(cls: Any, data: Any) -> Any:
    if not isinstance(data, dict):
        return data
    fields = _fields(cls)
    return {k: v if fields[k] is None else _trim(fields[k], v)
            for k, v in data.items() if k in fields}


def _trim(target: Any, value: Any) -> Any:
    if isinstance(value, list | tuple):
        return [_known(target, v) for v in value]
    return _known(target, value)


@functools.cache
def _fields(cls: Any) -> dict[str, Any]:
    """Each field of dataclass ``cls`` with the dataclass its value holds (alone, optional
    or in a tuple), or None. Worked out once per class: a listing decodes thousands of
    views, and resolving type hints per view cost more than decoding it."""
    out: dict[str, Any] = {}
    for name, hint in typing.get_type_hints(cls).items():
        inner = [a for a in typing.get_args(hint) if a is not type(None) and a is not Ellipsis]
        if dataclasses.is_dataclass(hint):
            out[name] = hint
        elif inner and dataclasses.is_dataclass(inner[0]):
            out[name] = inner[0]
        else:
            out[name] = None
    return out
