"""SODA's hardware-aware inference placer (§V-D): CPU replicas at low load, GPUs at high load.

Each service registers an offline profile: ``cpu_batch``, the largest batch a replica on
``cpu_cores`` cores serves within the QoS target (using ``cpu_mbw_gbps`` of memory bandwidth),
and ``bs_gpu``, the largest batch one GPU serves within the target.

**Load unit.** A service reports its load as *queries per batching window* (``window_ms`` of
its profile), so load compares directly with batch sizes: a CPU replica carries up to
``cpu_batch`` of it, a GPU replica up to ``bs_gpu``. A service that counts queries per second
converts with :func:`load_from_qps` (load = qps × window).

**Policy** (one :meth:`InferencePlacer.plan` call per event or tick, deterministic in its
inputs):

* Mode. A service runs CPU replicas while its load is below ``bs_gpu`` and GPU replicas above
  it. CPU→GPU when the load has stayed above ``bs_gpu`` for ``sustain_s`` (or at once when it
  also exceeds what the replicas can carry); GPU→CPU only when it has stayed below
  ``gpu_down_fraction × bs_gpu`` for ``sustain_s``. The gap between the two switch points is
  the hysteresis that keeps a load hovering at ``bs_gpu`` from flapping.
* Count. A replica is added when the load has stayed above ``scale_out_fraction`` (80 %) of the
  current maximum load for ``sustain_s``, or at once to the needed count when the load exceeds
  the maximum; one is retired when the load has stayed below ``scale_in_fraction`` of what the
  replicas minus one could carry. ``scale_in_fraction < scale_out_fraction`` keeps a retire
  from triggering a launch.
* Where. CPU replicas go on the CPU cores of GPU nodes whose memory-bandwidth headroom (an
  input: GB/s a node can still absorb before contention, §V-E, less what this placer's
  replicas there use) covers ``cpu_mbw_gbps``, most headroom first. GPU replicas go to the
  most idle GPU model (§V-D3), best-fit node. A CPU-mode service that cannot get CPU room
  is moved to a GPU. Mode switches are make-before-break: the old replicas are retired in
  the plan that launches enough new ones.
* Preemption. When no placement exists, the placer preempts the most recently submitted
  training or CPU job whose resources would make room, one pending preemption per service.

The placer keeps its own record of replicas and assumes the driver carries out every action
before the next ``plan``: it must allocate a launch's ``placement`` in the cluster state
(so the next snapshot shows those resources taken) and release a retired replica's.
"""

from __future__ import annotations

import enum
import logging
import math
from collections import deque
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from masterd.core.arrays import ArrayPolicy
from masterd.core.cluster import ClusterSnapshot, NodeView
from masterd.core.eligibility import model_fits
from masterd.core.placement import choose_cpus, choose_gpus
from masterd.core.policy import Policy, Preempt
from shared.model import Job, JobKind, NodeAllocation, Placement, check_name

log = logging.getLogger("trellis.inference")

MAX_SERVICE_NAME = 40  # leaves room for the replica suffix inside the 63-character name limit


class PlacerError(ValueError):
    """A request the placer cannot honour; the message names what was wrong."""


class UnknownServiceError(PlacerError):
    pass


class ReplicaKind(enum.StrEnum):
    CPU = "cpu"
    GPU = "gpu"


@dataclass(frozen=True)
class InferenceProfile:
    """The offline profile of one inference service (§V-D2)."""

    service: str
    bs_gpu: int  # largest batch one GPU serves within the QoS target
    cpu_batch: int = 0  # largest batch within the target on cpu_cores cores; 0: CPU cannot
    cpu_cores: int = 0
    cpu_mbw_gbps: float = 0.0  # memory bandwidth one CPU replica uses at cpu_batch
    qos_ms: float = 200.0
    window_ms: float = 100.0  # batching window; load is counted in queries per window
    gpu_model: str | None = None  # the GPU type bs_gpu was profiled on; None: any
    gpu_replica_cpus: int = 1  # host cores a GPU replica needs
    memory_mib: int = 0  # host memory per replica

    def __post_init__(self) -> None:
        check_name(self.service, "service")
        if len(self.service) > MAX_SERVICE_NAME:
            raise PlacerError(
                f"service name {self.service!r} is longer than {MAX_SERVICE_NAME} characters"
            )
        _int_at_least(self.bs_gpu, 1, "bs_gpu")
        _int_at_least(self.cpu_batch, 0, "cpu_batch")
        _int_at_least(self.cpu_cores, 1 if self.cpu_batch else 0, "cpu_cores")
        _int_at_least(self.gpu_replica_cpus, 0, "gpu_replica_cpus")
        _int_at_least(self.memory_mib, 0, "memory_mib")
        for name in ("cpu_mbw_gbps", "qos_ms", "window_ms"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not (
                math.isfinite(value) and value >= 0
            ):
                raise PlacerError(f"{name} must be a finite number >= 0, got {value!r}")
        if self.qos_ms <= 0 or self.window_ms <= 0:
            raise PlacerError("qos_ms and window_ms must be positive")
        if self.window_ms > self.qos_ms:
            raise PlacerError(
                f"window_ms ({self.window_ms}) cannot exceed the QoS target ({self.qos_ms} ms)"
            )

    @property
    def cpu_capable(self) -> bool:
        return self.cpu_batch > 0

    def capacity(self, kind: ReplicaKind) -> int:
        """Queries per window one replica of ``kind`` serves within the QoS target."""
        return self.bs_gpu if kind is ReplicaKind.GPU else self.cpu_batch


def _int_at_least(value: object, low: int, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise PlacerError(f"{name} must be an integer >= {low}, got {value!r}")


def load_from_qps(qps: float, profile: InferenceProfile) -> float:
    """Convert queries per second into the placer's unit, queries per batching window."""
    return qps * profile.window_ms / 1000.0


@dataclass(frozen=True)
class PlacerConfig:
    scale_out_fraction: float = 0.8  # SODA: launch when load stays above 80 % of max load
    scale_in_fraction: float = 0.6
    gpu_down_fraction: float = 0.75  # GPU -> CPU below this share of bs_gpu
    sustain_s: float = 30.0  # how long a condition must hold before the placer acts on it
    min_replicas: int = 1  # a registered service always keeps this many
    max_replicas: int = 64

    def __post_init__(self) -> None:
        if not 0 < self.scale_in_fraction < self.scale_out_fraction <= 1:
            raise PlacerError("need 0 < scale_in_fraction < scale_out_fraction <= 1")
        if not 0 < self.gpu_down_fraction < 1:
            raise PlacerError("gpu_down_fraction must lie strictly between 0 and 1")
        if not (math.isfinite(self.sustain_s) and self.sustain_s >= 0):
            raise PlacerError("sustain_s must be a finite number >= 0")
        if not 1 <= self.min_replicas <= self.max_replicas:
            raise PlacerError("need 1 <= min_replicas <= max_replicas")


@dataclass(frozen=True)
class Replica:
    id: str
    service: str
    kind: ReplicaKind
    node: str
    address: str
    cpus: tuple[int, ...]
    gpu: int | None
    memory_mib: int
    mbw_gbps: float
    launched_at: float

    @property
    def placement(self) -> Placement:
        """The resources to allocate in the cluster state under the replica's id."""
        gpus = (self.gpu,) if self.gpu is not None else ()
        return Placement((NodeAllocation(self.node, gpus, self.cpus, self.memory_mib),))


@dataclass(frozen=True)
class LaunchReplica:
    replica: Replica
    reason: str


@dataclass(frozen=True)
class RetireReplica:
    replica: Replica
    reason: str


ReplicaAction = LaunchReplica | RetireReplica | Preempt


@dataclass(frozen=True)
class Endpoint:
    replica_id: str
    kind: ReplicaKind
    node: str
    address: str
    gpu: int | None
    cpus: tuple[int, ...]


@dataclass(frozen=True)
class ServiceEndpoints:
    """What a client needs to send queries; cache it until ``version`` changes."""

    service: str
    version: int
    mode: ReplicaKind
    endpoints: tuple[Endpoint, ...]


@dataclass(frozen=True)
class ReplicaRoom:
    """The cores replicas may use, node by node, per replica kind (a GPU replica takes any
    GPU of a node it may use). None: any free core of a GPU node."""

    cpu: Mapping[str, Collection[int]] | None = None
    gpu: Mapping[str, Collection[int]] | None = None


def bandwidth_headroom(limit_gbps: float, used_gbps: float, own_gbps: float) -> float:
    """A node's memory-bandwidth headroom as :meth:`InferencePlacer.plan` takes it: what the
    contention threshold (``limit``) leaves after the measured use, not counting the
    placer's own CPU replicas that the measurement saw (``own``: the placer subtracts every
    replica of its books itself)."""
    return max(0.0, limit_gbps - (used_gbps - own_gbps))


def replica_room(policy: Policy, snapshot: ClusterSnapshot) -> ReplicaRoom:
    """Where the placer's replicas may go under ``policy``. Under SODA's arrays a replica is a
    job like the others (§V-C, §V-D): a CPU replica takes cores of the CPU-job array, a GPU
    replica a GPU of the small-job array (one GPU) with GPU-job cores, never a loan that
    the arrays would take back from it."""
    if not isinstance(policy, ArrayPolicy):
        return ReplicaRoom()
    amap = policy.array_map(snapshot)
    return ReplicaRoom(cpu=amap.cpu_job_cores(), gpu=amap.small_job_cores())


@dataclass
class _Service:
    profile: InferenceProfile
    mode: ReplicaKind
    replicas: dict[str, Replica] = field(default_factory=dict)
    version: int = 0
    reports: deque[tuple[float, float]] = field(default_factory=deque)
    seq: int = 0
    preempting: str | None = None  # job id of this service's pending preemption
    short_logged: bool = False  # "short of resources" said once until a launch succeeds

    @property
    def load(self) -> float:
        return self.reports[-1][1] if self.reports else 0.0

    def of_kind(self, kind: ReplicaKind) -> list[Replica]:
        return [r for r in self.replicas.values() if r.kind is kind]

    def capacity(self) -> int:
        return sum(self.profile.capacity(r.kind) for r in self.replicas.values())


class _Free:
    """Free resources of schedulable nodes, consumed while one plan places replicas.

    Built on first use: a plan runs before every scheduling pass, and in the steady state
    (every service at its target) it never looks at free resources, so copying every node's
    free sets each time cost O(nodes) per pass for nothing.
    """

    views: dict[str, NodeView]
    gpus: dict[str, set[int]]
    cpus: dict[str, set[int]]
    memory: dict[str, int]
    headroom: dict[str, float]

    def __init__(
        self, snapshot: ClusterSnapshot, headroom: Mapping[str, float],
        replicas: Iterable[Replica],
        room: ReplicaRoom | None = None,
    ) -> None:
        self._source: tuple[ClusterSnapshot, Mapping[str, float], list[Replica]] | None = (
            snapshot, headroom, list(replicas))
        self.room = room or ReplicaRoom()

    def cpu_room(self, node: str, extra: Iterable[int] = ()) -> set[int]:
        """Free cores of ``node`` (plus ``extra``) a CPU replica may use."""
        return self._room(self.room.cpu, node, extra)

    def gpu_room(self, node: str, extra: Iterable[int] = ()) -> set[int]:
        """Free cores of ``node`` (plus ``extra``) a GPU replica may use."""
        return self._room(self.room.gpu, node, extra)

    def gpu_node(self, node: str) -> bool:
        """Whether a GPU replica may go on ``node`` at all."""
        return self.room.gpu is None or node in self.room.gpu

    def _room(self, allowed: Mapping[str, Collection[int]] | None, node: str,
              extra: Iterable[int]) -> set[int]:
        cores = self.cpus[node] | set(extra)
        if allowed is None:
            return cores
        return cores & set(allowed.get(node, ()))

    def __getattr__(self, name: str) -> Any:
        # Only reached for the resource tables, before they exist.
        if name not in ("views", "gpus", "cpus", "memory", "headroom") or self._source is None:
            raise AttributeError(name)
        self._build()
        return getattr(self, name)

    def _build(self) -> None:
        assert self._source is not None
        snapshot, headroom, replicas = self._source
        self._source = None
        self.views = {name: view for name, view in snapshot.nodes.items() if view.schedulable}
        self.gpus = {name: set(view.free_gpus) for name, view in self.views.items()}
        self.cpus = {name: set(view.free_cpus) for name, view in self.views.items()}
        self.memory = {name: view.free_memory_mib for name, view in self.views.items()}
        # A node missing from the headroom map has none to offer: unknown is not spare.
        self.headroom = {name: float(headroom.get(name, 0.0)) for name in self.views}
        for replica in replicas:
            if replica.node in self.headroom:
                self.headroom[replica.node] -= replica.mbw_gbps

    def copy(self) -> _Free:
        other = object.__new__(_Free)
        other._source = None
        other.room = self.room
        other.views = self.views
        other.gpus = {k: set(v) for k, v in self.gpus.items()}
        other.cpus = {k: set(v) for k, v in self.cpus.items()}
        other.memory = dict(self.memory)
        other.headroom = dict(self.headroom)
        return other

    def adopt(self, other: _Free) -> None:
        """Make ``other``'s state (a trial copy that worked out) this one's."""
        self.gpus, self.cpus = other.gpus, other.cpus
        self.memory, self.headroom = other.memory, other.headroom

    def take(self, node: str, gpus: Iterable[int], cpus: Iterable[int], memory: int,
             mbw: float) -> None:
        self.gpus[node].difference_update(gpus)
        self.cpus[node].difference_update(cpus)
        self.memory[node] -= memory
        self.headroom[node] -= mbw


@dataclass(frozen=True)
class _Slot:
    node: str
    gpu: int | None
    cpus: tuple[int, ...]


class InferencePlacer:
    """Decides where every registered inference service's replicas run."""

    def __init__(self, config: PlacerConfig | None = None) -> None:
        self.config = config or PlacerConfig()
        self._services: dict[str, _Service] = {}

    # -- services ----------------------------------------------------------------------------
    def register(self, profile: InferenceProfile) -> None:
        """Add a service, or replace the profile of a registered one (keeping its replicas)."""
        existing = self._services.get(profile.service)
        if existing is not None:
            existing.profile = profile
            log.info("inference profile updated service=%s", profile.service)
            return
        mode = ReplicaKind.CPU if profile.cpu_capable else ReplicaKind.GPU
        self._services[profile.service] = _Service(profile, mode)
        log.info(
            "inference service registered service=%s bs_gpu=%d cpu_batch=%d cpu_cores=%d",
            profile.service, profile.bs_gpu, profile.cpu_batch, profile.cpu_cores,
        )

    def deregister(self, service: str) -> list[RetireReplica]:
        """Forget a service; returns the retirements of all its replicas."""
        svc = self._service(service)
        del self._services[service]
        log.info("inference service deregistered service=%s replicas=%d",
                 service, len(svc.replicas))
        return [RetireReplica(r, "service deregistered") for r in svc.replicas.values()]

    @property
    def services(self) -> list[str]:
        return list(self._services)

    def report_load(self, service: str, load: float, now: float) -> None:
        """Record the service's load (queries per batching window) measured at ``now``."""
        svc = self._service(service)
        if isinstance(load, bool) or not isinstance(load, int | float) or not math.isfinite(load):
            raise PlacerError(f"load for service {service} must be a finite number, got {load!r}")
        if load < 0:
            raise PlacerError(f"load for service {service} cannot be negative, got {load}")
        if not math.isfinite(now):
            raise PlacerError(f"report time must be finite, got {now!r}")
        if svc.reports and now < svc.reports[-1][0]:
            raise PlacerError(
                f"load report for service {service} at {now} is older than the last one "
                f"({svc.reports[-1][0]})"
            )
        svc.reports.append((float(now), float(load)))
        self._prune(svc, now)

    def replica_lost(self, service: str, replica_id: str) -> None:
        """A replica died or failed to start: forget it so the next plan can replace it."""
        svc = self._service(service)
        if svc.replicas.pop(replica_id, None) is None:
            raise PlacerError(f"service {service} has no replica {replica_id!r}")
        svc.version += 1
        log.warning("inference replica lost service=%s replica=%s", service, replica_id)

    def place(self, service: str) -> ServiceEndpoints:
        """Where to send the service's queries, with a version that changes with the set."""
        svc = self._service(service)
        endpoints = tuple(
            Endpoint(r.id, r.kind, r.node, r.address, r.gpu, r.cpus)
            for r in svc.replicas.values()
        )
        return ServiceEndpoints(service, svc.version, svc.mode, endpoints)

    def replicas(self, service: str) -> list[Replica]:
        return list(self._service(service).replicas.values())

    def version(self, service: str) -> int:
        """The service's endpoint-set version (what :meth:`place` would report), cheaply."""
        return self._service(service).version

    def load(self, service: str) -> float:
        """The service's last reported load (queries per batching window)."""
        return self._service(service).load

    def mode(self, service: str) -> ReplicaKind:
        return self._service(service).mode

    def adopt(self, replica: Replica) -> None:
        """Take over a replica that already runs (a restarted master re-reading its journal).

        Later replicas are numbered past it, and a service whose adopted replicas are GPU
        replicas resumes in GPU mode.
        """
        svc = self._service(replica.service)
        if replica.id in svc.replicas:
            raise PlacerError(f"service {replica.service} already has replica {replica.id!r}")
        svc.replicas[replica.id] = replica
        number = replica.id.rsplit("-", 1)[-1]
        if number.isdigit():
            svc.seq = max(svc.seq, int(number))
        if replica.kind is ReplicaKind.GPU:
            svc.mode = ReplicaKind.GPU
        svc.version += 1
        log.info("inference replica adopted service=%s replica=%s kind=%s node=%s",
                 replica.service, replica.id, replica.kind, replica.node)

    # -- planning ----------------------------------------------------------------------------
    def plan(
        self,
        snapshot: ClusterSnapshot,
        now: float,
        bandwidth_headroom_gbps: Mapping[str, float] | None = None,
        room: ReplicaRoom | None = None,
    ) -> list[ReplicaAction]:
        """Launches, retirements and preemptions that bring every service to its target.

        ``room`` says which cores (and so which nodes) each kind of replica may use
        (:func:`replica_room`: under SODA's arrays, the arrays a CPU job and a one-GPU job
        would use); None lets replicas use any free unit of a GPU node.

        ``bandwidth_headroom_gbps`` maps a node to the memory bandwidth (GB/s) it can still
        absorb before contention (§V-E's threshold) *not counting this placer's own CPU
        replicas*: the placer subtracts their profiled bandwidth itself, so a replica launched
        a moment ago counts before any measurement sees it. Nodes missing from the map get
        no CPU replicas.
        """
        for svc in self._services.values():
            self._forget_vanished(svc, snapshot)
        free = _Free(
            snapshot, bandwidth_headroom_gbps if bandwidth_headroom_gbps is not None else {},
            (r for svc in self._services.values() for r in svc.replicas.values()),
            room,
        )
        for svc in self._services.values():
            if svc.preempting is not None and svc.preempting not in snapshot.running:
                svc.preempting = None  # the victim has gone: its resources are in ``free``
        preempting = {s.preempting for s in self._services.values() if s.preempting}
        actions: list[ReplicaAction] = []
        for svc in self._services.values():
            actions.extend(self._plan_service(svc, snapshot, free, now, preempting))
        return actions

    def _plan_service(
        self, svc: _Service, snapshot: ClusterSnapshot, free: _Free, now: float,
        preempting: set[str],
    ) -> list[ReplicaAction]:
        profile, load = svc.profile, svc.load
        actions: list[ReplicaAction] = []
        mode = self._next_mode(svc, now)
        if mode is not svc.mode:
            needed = self._needed(profile, mode, load)
            slots = self._place_all(svc, mode, needed, free)
            if slots is not None:
                side = "above" if mode is ReplicaKind.GPU else "below"
                why = f"load {load:g} {side} the switch point (bs_gpu {profile.bs_gpu})"
                log.info("inference mode switch service=%s from=%s to=%s load=%g",
                         profile.service, svc.mode, mode, load)
                svc.mode = mode
                actions += self._launch(svc, mode, slots, free, now, why)
                actions += self._retire_other_kinds(svc)
                return actions
            if mode is ReplicaKind.GPU:
                # The load needs a GPU and none is free: make room, keep serving from CPU.
                actions += self._preempt(svc, [ReplicaKind.GPU], snapshot, free, preempting)
            # A GPU service whose load fell but finds no CPU room simply stays on its GPUs.

        current = svc.of_kind(svc.mode)
        target = self._target(svc, now)
        if target > len(current):
            missing = target - len(current)
            why = (
                f"load {load:g} needs {target} {svc.mode.value} replica(s)" if not current
                else f"load {load:g} over {self.config.scale_out_fraction:.0%} of capacity"
            )
            slots = self._place_all(svc, svc.mode, missing, free)
            if slots is not None:
                actions += self._launch(svc, svc.mode, slots, free, now, why)
            elif svc.mode is ReplicaKind.CPU and (
                gpu_slots := self._place_all(
                    svc, ReplicaKind.GPU, self._needed(profile, ReplicaKind.GPU, load), free
                )
            ) is not None:
                log.info("inference cpu room short service=%s moving to gpu", profile.service)
                svc.mode = ReplicaKind.GPU
                actions += self._launch(svc, ReplicaKind.GPU, gpu_slots, free, now,
                                        "not enough CPU room or memory bandwidth")
            else:
                partial = self._place_some(svc, svc.mode, missing, free)
                actions += self._launch(svc, svc.mode, partial, free, now, why)
                if len(partial) < missing:
                    kinds = [svc.mode]
                    if svc.mode is ReplicaKind.CPU:
                        kinds.append(ReplicaKind.GPU)
                    actions += self._preempt(svc, kinds, snapshot, free, preempting)
        elif target < len(current):
            actions += self._retire_surplus(svc, len(current) - target, free)
        if len(svc.of_kind(svc.mode)) >= self._target(svc, now, settled=True):
            actions += self._retire_other_kinds(svc)
        return actions

    # -- the rules ---------------------------------------------------------------------------
    def _next_mode(self, svc: _Service, now: float) -> ReplicaKind:
        profile, load = svc.profile, svc.load
        if not profile.cpu_capable:
            return ReplicaKind.GPU
        bs_gpu = profile.bs_gpu
        if svc.mode is ReplicaKind.CPU:
            if load > bs_gpu and (
                load > svc.capacity() or self._sustained(svc, now, lambda x: x > bs_gpu)
            ):
                return ReplicaKind.GPU
            return ReplicaKind.CPU
        down = self.config.gpu_down_fraction * bs_gpu
        if self._sustained(svc, now, lambda x: x < down):
            return ReplicaKind.CPU
        return ReplicaKind.GPU

    def _needed(self, profile: InferenceProfile, kind: ReplicaKind, load: float) -> int:
        """Replicas that carry ``load`` at no more than the scale-out fraction of capacity."""
        per = profile.capacity(kind) * self.config.scale_out_fraction
        wanted = math.ceil(load / per) if load > 0 else 0
        return min(max(wanted, self.config.min_replicas), self.config.max_replicas)

    def _target(self, svc: _Service, now: float, settled: bool = False) -> int:
        """How many replicas of the service's mode it should have after this plan.

        ``settled`` asks only for the count the current load needs, ignoring how long it has
        held (used to decide whether the new mode has taken over from the old one).
        """
        cfg, profile, load = self.config, svc.profile, svc.load
        per = profile.capacity(svc.mode)
        n = len(svc.of_kind(svc.mode))
        needed = self._needed(profile, svc.mode, load)
        if settled or n == 0:
            return needed
        capacity = n * per
        if load > capacity:
            return max(n, needed)  # over the maximum: launch at once
        if n < cfg.max_replicas and self._sustained(
            svc, now, lambda x: x > cfg.scale_out_fraction * capacity
        ):
            return max(n + 1, needed)
        if n > cfg.min_replicas and self._sustained(
            svc, now, lambda x: x < cfg.scale_in_fraction * (n - 1) * per
        ):
            return n - 1
        return n

    def _sustained(self, svc: _Service, now: float, holds: Callable[[float], bool]) -> bool:
        """Has ``holds(load)`` been true for every report over the last ``sustain_s``?

        The report in force at the start of the span must satisfy it too, so a condition
        that began five seconds ago never counts as thirty seconds old.
        """
        start = now - self.config.sustain_s
        in_force_at_start: float | None = None
        for t, load in svc.reports:
            if t > now:
                break
            if t <= start:
                in_force_at_start = load
            elif not holds(load):
                return False
        return in_force_at_start is not None and holds(in_force_at_start)

    def _prune(self, svc: _Service, now: float) -> None:
        start = now - self.config.sustain_s
        # Keep the last report at or before the span's start: it is the one in force then.
        while len(svc.reports) > 1 and svc.reports[1][0] <= start:
            svc.reports.popleft()

    # -- placing -----------------------------------------------------------------------------
    def _place_all(
        self, svc: _Service, kind: ReplicaKind, count: int, free: _Free
    ) -> list[_Slot] | None:
        """Slots for all ``count`` replicas (consumed from ``free``), or None and nothing
        consumed."""
        trial = free.copy()
        slots = self._place_some(svc, kind, count, trial)
        if len(slots) < count:
            return None
        free.adopt(trial)
        return slots

    def _place_some(
        self, svc: _Service, kind: ReplicaKind, count: int, free: _Free
    ) -> list[_Slot]:
        """Up to ``count`` slots, consuming ``free`` as it goes."""
        slots: list[_Slot] = []
        profile = svc.profile
        for _ in range(count):
            slot = (
                self._gpu_slot(profile, free) if kind is ReplicaKind.GPU
                else self._cpu_slot(profile, free)
            )
            if slot is None:
                break
            mbw = profile.cpu_mbw_gbps if kind is ReplicaKind.CPU else 0.0
            gpus = () if slot.gpu is None else (slot.gpu,)
            free.take(slot.node, gpus, slot.cpus, profile.memory_mib, mbw)
            slots.append(slot)
        return slots

    def _cpu_slot(self, profile: InferenceProfile, free: _Free) -> _Slot | None:
        candidates = [
            name for name, view in free.views.items()
            if view.total_gpus > 0  # the CPU cores of GPU nodes (§V-D)
            and len(free.cpu_room(name)) >= profile.cpu_cores
            and free.memory[name] >= profile.memory_mib
            and free.headroom[name] >= profile.cpu_mbw_gbps
            and free.headroom[name] > 0
        ]
        # Most bandwidth headroom first: spread the pressure on memory bandwidth.
        for name in sorted(candidates, key=lambda n: (-free.headroom[n], -len(free.cpus[n]), n)):
            cpus = choose_cpus(free.views[name], free.cpu_room(name), profile.cpu_cores)
            if cpus is not None:
                return _Slot(name, None, cpus)
        return None

    def _gpu_slot(self, profile: InferenceProfile, free: _Free) -> _Slot | None:
        def fits(name: str) -> bool:
            view = free.views[name]
            return (
                model_fits(profile.gpu_model, view.gpu_model)
                and free.gpu_node(name)
                and bool(free.gpus[name])
                and len(free.gpu_room(name)) >= profile.gpu_replica_cpus
                and free.memory[name] >= profile.memory_mib
            )

        candidates = [name for name in free.views if fits(name)]
        if not candidates:
            return None
        # The most idle GPU model first (§V-D3), so inference does not starve one array.
        idle: dict[str | None, list[int]] = {}
        for name, view in free.views.items():
            if view.total_gpus:
                counts = idle.setdefault(view.gpu_model, [0, 0])
                counts[0] += len(free.gpus[name])
                counts[1] += view.total_gpus

        def rank(name: str) -> tuple[float, str, int, str]:
            model = free.views[name].gpu_model
            free_gpus, total = idle[model]
            # Then best fit: the node with the fewest free GPUs keeps whole nodes for jobs.
            return (-free_gpus / total, model or "", len(free.gpus[name]), name)

        for name in sorted(candidates, key=rank):
            view = free.views[name]
            gpus = choose_gpus(view, free.gpus[name], 1)
            if gpus is None:
                continue
            numa = {view.inventory.numa_of_gpu(gpus[0])} - {-1}
            cpus = choose_cpus(view, free.gpu_room(name), profile.gpu_replica_cpus, numa)
            if cpus is not None:
                return _Slot(name, gpus[0], cpus)
        return None

    def _launch(
        self, svc: _Service, kind: ReplicaKind, slots: list[_Slot], free: _Free, now: float,
        reason: str,
    ) -> list[ReplicaAction]:
        actions: list[ReplicaAction] = []
        for slot in slots:
            svc.seq += 1
            replica = Replica(
                id=f"{svc.profile.service}-{kind.value}-{svc.seq}",
                service=svc.profile.service,
                kind=kind,
                node=slot.node,
                address=free.views[slot.node].inventory.address,
                cpus=slot.cpus,
                gpu=slot.gpu,
                memory_mib=svc.profile.memory_mib,
                mbw_gbps=svc.profile.cpu_mbw_gbps if kind is ReplicaKind.CPU else 0.0,
                launched_at=now,
            )
            svc.replicas[replica.id] = replica
            svc.version += 1
            svc.short_logged = False
            actions.append(LaunchReplica(replica, reason))
            log.info(
                "inference launch service=%s replica=%s kind=%s node=%s gpu=%s cpus=%d "
                "reason=%r", svc.profile.service, replica.id, kind, slot.node, slot.gpu,
                len(slot.cpus), reason,
            )
        return actions

    # -- retiring ----------------------------------------------------------------------------
    def _retire(self, svc: _Service, replica: Replica, reason: str) -> RetireReplica:
        del svc.replicas[replica.id]
        svc.version += 1
        log.info("inference retire service=%s replica=%s kind=%s node=%s reason=%r",
                 svc.profile.service, replica.id, replica.kind, replica.node, reason)
        return RetireReplica(replica, reason)

    def _retire_surplus(self, svc: _Service, count: int, free: _Free) -> list[ReplicaAction]:
        current = svc.of_kind(svc.mode)
        if svc.mode is ReplicaKind.CPU:
            # Relieve the node closest to memory-bandwidth contention first.
            current.sort(key=lambda r: (free.headroom.get(r.node, 0.0), -r.launched_at))
        else:
            current.sort(key=lambda r: -r.launched_at)
        reason = f"load {svc.load:g} fell below {self.config.scale_in_fraction:.0%} of capacity"
        return [self._retire(svc, r, reason) for r in current[:count]]

    def _retire_other_kinds(self, svc: _Service) -> list[ReplicaAction]:
        others = [r for r in svc.replicas.values() if r.kind is not svc.mode]
        reason = f"replaced by {svc.mode.value} replicas"
        return [self._retire(svc, r, reason) for r in others]

    def _forget_vanished(self, svc: _Service, snapshot: ClusterSnapshot) -> None:
        for replica in list(svc.replicas.values()):
            if replica.node not in snapshot.nodes:
                del svc.replicas[replica.id]
                svc.version += 1
                log.warning("inference replica gone with its node service=%s replica=%s "
                            "node=%s", svc.profile.service, replica.id, replica.node)

    # -- preempting --------------------------------------------------------------------------
    def _preempt(
        self, svc: _Service, kinds: list[ReplicaKind], snapshot: ClusterSnapshot,
        free: _Free, preempting: set[str],
    ) -> list[ReplicaAction]:
        """Preempt the most recently submitted training/CPU job that makes room (§V-D2)."""
        if svc.preempting is not None:
            return []  # one at a time: wait for the last victim to leave
        victims = [
            job for job in snapshot.running.values()
            if job.spec.kind in (JobKind.TRAINING, JobKind.CPU)
            and job.placement is not None
            and job.id not in preempting
            and any(self._would_fit(svc.profile, kind, job, free) for kind in kinds)
        ]
        if not victims:
            if not svc.short_logged:  # a plan runs at every event: say it once, not each time
                svc.short_logged = True
                log.warning("inference short of resources service=%s and nothing to preempt",
                            svc.profile.service)
            return []
        victim = max(victims, key=lambda j: (j.submit_time, j.id))
        svc.preempting = victim.id
        preempting.add(victim.id)
        reason = f"inference service {svc.profile.service} needs resources"
        log.info("inference preempt service=%s job=%s submitted=%s", svc.profile.service,
                 victim.id, victim.submit_time)
        return [Preempt(victim.id, reason)]

    def _would_fit(
        self, profile: InferenceProfile, kind: ReplicaKind, job: Job, free: _Free
    ) -> bool:
        """Would releasing ``job`` let one replica of ``kind`` fit on one of its nodes?"""
        assert job.placement is not None
        for alloc in job.placement.allocations:
            view = free.views.get(alloc.node)
            if view is None or view.total_gpus == 0:
                continue
            memory = free.memory[alloc.node] + alloc.memory_mib
            if memory < profile.memory_mib:
                continue
            if kind is ReplicaKind.GPU:
                model_ok = (model_fits(profile.gpu_model, view.gpu_model)
                            and free.gpu_node(alloc.node))
                gpus = len(free.gpus[alloc.node]) + len(alloc.gpus)
                cpus = len(free.gpu_room(alloc.node, alloc.cpus))
                if model_ok and gpus >= 1 and cpus >= profile.gpu_replica_cpus:
                    return True
            elif (
                profile.cpu_capable
                and len(free.cpu_room(alloc.node, alloc.cpus)) >= profile.cpu_cores
                and free.headroom[alloc.node] >= profile.cpu_mbw_gbps
                and free.headroom[alloc.node] > 0
            ):
                return True
        return False

    # -- helpers -----------------------------------------------------------------------------
    def _service(self, service: str) -> _Service:
        svc = self._services.get(service)
        if svc is None:
            raise UnknownServiceError(f"inference service {service!r} is not registered")
        return svc
