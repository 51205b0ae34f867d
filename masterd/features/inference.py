"""The master's driver of SODA's hardware-aware inference placer (§V-D) and its placement RPC.

Inference services register their offline profile (``bs_gpu``; ``cpu_batch`` on ``cpu_cores``
cores within the QoS target and the memory bandwidth that takes) with the command a replica
runs, then report their load. At every report, at every cluster event (each scheduling pass,
*before* the policy runs, so a freed resource goes to the service that asked for it rather than
to the queue) and on a slow tick (the placer's "sustained for ``sustain_s``" rules need time to
pass, not only events), the driver runs :meth:`InferencePlacer.plan` and carries out what it
decides:

* **Launch**: the replica becomes a job of kind ``inference`` with the placer's exact
  resources, allocated in the cluster state at once (so the next pass sees them taken), written
  to the journal and started on its node by the master's ordinary two-phase launch: a real
  process, confined like any job, listed by ``trellisctl jobs``. Its environment names the
  service, the replica, its kind, batch size and port.
* **Retire**: the replica's job is cancelled through the master (SIGTERM, grace, SIGKILL).
* **Preempt**: the victim (the most recently submitted training or CPU job whose resources make
  room) goes through the master's preemption path and is re-queued at the head of its array.

A replica whose job ends (crash, lost node, failed start) is reported lost to the placer, which
replaces it at the next plan. ``place`` answers from a per-service cache keyed by the placer's
version and the set of ready replicas, so a client can poll it cheaply and cache the endpoints
until ``version`` changes.

Registrations are journalled; a restarted master re-registers every service and adopts the
replica jobs that still run.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from masterd.core.cluster import ClusterSnapshot
from masterd.core.inference import (
    InferencePlacer,
    InferenceProfile,
    LaunchReplica,
    PlacerConfig,
    PlacerError,
    Replica,
    ReplicaAction,
    ReplicaKind,
    RetireReplica,
    UnknownServiceError,
    bandwidth_headroom,
    load_from_qps,
    replica_room,
)
from masterd.core.policy import Preempt
from masterd.core.scheduler import JobError
from masterd.journal.services import delete_service, ensure_schema, load_services, save_service
from masterd.runtime.context import FeatureContext
from shared.config import InferenceConfig
from shared.messages import MEM_BANDWIDTH_REPORT_EVERY_S, MemBandwidth
from shared.model import (
    NAME_PATTERN,
    UNIX_USER_PATTERN,
    Job,
    JobKind,
    JobSpec,
    JobState,
)
from shared.rpcdoc import returns
from shared.schema import SchemaError, bounded, decode, encode

log = logging.getLogger("trellis.master.inference")

SERVICE_ENV = "TRELLIS_SERVICE"
REPLICA_ENV = "TRELLIS_REPLICA"
KIND_ENV = "TRELLIS_REPLICA_KIND"
BATCH_ENV = "TRELLIS_BATCH"
PORT_ENV = "TRELLIS_SERVICE_PORT"
FAILED_RUN_S = 10.0  # a replica that ends sooner than this after starting has failed
MAX_BACKOFF_S = 60.0


# -- RPC parameters -------------------------------------------------------------------------------


@dataclass(frozen=True)
class RegisterServiceParams:
    """``register_service``: the offline profile (§V-D2) and how to run a replica."""

    service: str = bounded(pattern=NAME_PATTERN)
    command: tuple[str, ...] = bounded(max_len=1024)
    user: str = bounded(pattern=UNIX_USER_PATTERN)
    bs_gpu: int = bounded(min=1, max=1 << 24)
    cpu_batch: int = bounded(0, min=0, max=1 << 24)
    cpu_cores: int = bounded(0, min=0, max=4096)
    cpu_mbw_gbps: float = bounded(0.0, min=0, max=100_000)
    qos_ms: float = bounded(200.0, min=0, max=3_600_000)
    window_ms: float | None = bounded(None, min=0, max=3_600_000)  # None: half the QoS target
    gpu_model: str | None = bounded(None, max_len=128)
    gpu_replica_cpus: int = bounded(1, min=1, max=4096)
    memory_mib: int = bounded(0, min=0, max=1 << 30)
    tenant: str = bounded("default", pattern=NAME_PATTERN)
    # Replicas listen on port + their number (0: the service picks its own ports).
    port: int = bounded(0, min=0, max=65535)
    env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.command:
            raise ValueError("command must not be empty")
        if any(not isinstance(a, str) or len(a) > 4096 for a in self.command):
            raise ValueError("command arguments must be strings of at most 4096 characters")
        for key, value in self.env.items():
            if not key or "=" in key or len(key) > 256 or len(value) > 65536:
                raise ValueError(f"env key {key!r} is not a valid variable name")

    def profile(self) -> InferenceProfile:
        return InferenceProfile(
            service=self.service, bs_gpu=self.bs_gpu, cpu_batch=self.cpu_batch,
            cpu_cores=self.cpu_cores, cpu_mbw_gbps=self.cpu_mbw_gbps, qos_ms=self.qos_ms,
            window_ms=self.window_ms if self.window_ms is not None else self.qos_ms / 2,
            gpu_model=self.gpu_model, gpu_replica_cpus=self.gpu_replica_cpus,
            memory_mib=self.memory_mib,
        )


@dataclass(frozen=True)
class ReportLoadParams:
    """``report_load``: queries per batching window (``load``) or per second (``qps``)."""

    service: str = bounded(max_len=256)
    load: float | None = None
    qps: float | None = None


@dataclass(frozen=True)
class ServiceParams:
    service: str = bounded(max_len=256)


@dataclass(frozen=True)
class NoServiceParams:
    pass


# -- the driver -----------------------------------------------------------------------------------


# A node's measurement older than this no longer counts (it reports every 30 s at least).
STALE_BANDWIDTH_S = 4 * MEM_BANDWIDTH_REPORT_EVERY_S


@dataclass(frozen=True)
class _Bandwidth:
    event: MemBandwidth
    at: float  # master clock when it arrived
    headroom_gbps: float  # what it leaves CPU replicas, this placer's own added back


class _RecentHeadroom(Mapping[str, float]):
    """The headroom of the nodes whose last measurement is no older than ``oldest``, read
    lazily like :class:`GpuNodeHeadroom` (a plan looks at few nodes, often none)."""

    def __init__(self, measured: Mapping[str, _Bandwidth], oldest: float) -> None:
        self._measured = measured
        self._oldest = oldest

    def __getitem__(self, node: str) -> float:
        b = self._measured[node]
        if b.at < self._oldest:
            raise KeyError(node)
        return b.headroom_gbps

    def __iter__(self) -> Iterator[str]:
        return (n for n, b in self._measured.items() if b.at >= self._oldest)

    def __len__(self) -> int:
        return sum(1 for _ in self)


@dataclass
class _Cached:
    key: tuple[int, frozenset[str], int]
    reply: dict[str, Any]


class GpuNodeHeadroom(Mapping[str, float]):
    """Memory-bandwidth headroom of the GPU nodes, the measured figure or else the configured
    default; read only for the nodes a plan actually considers (most plans consider none)."""

    def __init__(self, snapshot: ClusterSnapshot, measured: Mapping[str, float],
                 default: float) -> None:
        self._nodes = snapshot.nodes
        self._measured = measured
        self._default = default

    def __getitem__(self, name: str) -> float:
        view = self._nodes.get(name)
        if view is None or view.total_gpus == 0:
            raise KeyError(name)
        return self._measured.get(name, self._default)

    def __iter__(self) -> Iterator[str]:
        return (name for name, view in self._nodes.items() if view.total_gpus > 0)

    def __len__(self) -> int:
        return sum(1 for _ in self)


class InferenceService:
    def __init__(self, ctx: FeatureContext, cfg: InferenceConfig) -> None:
        self.ctx = ctx
        try:
            self.placer = InferencePlacer(PlacerConfig(
                scale_out_fraction=cfg.scale_out_fraction,
                scale_in_fraction=cfg.scale_in_fraction,
                gpu_down_fraction=cfg.gpu_down_fraction, sustain_s=cfg.sustain_s,
                min_replicas=cfg.min_replicas, max_replicas=cfg.max_replicas,
            ))
        except PlacerError as exc:
            raise ValueError(f"[master.inference]: {exc}") from None
        self.config = cfg
        ctx.journal.now(ensure_schema)  # before serving, on this thread, like the restore
        self.registrations: dict[str, RegisterServiceParams] = {}
        self.jobs: dict[str, str] = {}  # placer replica id -> job id
        # The nodes' last memory-bandwidth measurements (from their contention monitors) and
        # the headroom each leaves; nodes without a recent one get the configured figure.
        self.bandwidth: dict[str, _Bandwidth] = {}
        self._cache: dict[str, _Cached] = {}
        # Versions handed to clients: one counter per service, started from the clock in
        # milliseconds, so they keep growing across re-registrations and master restarts.
        self._epoch = int(ctx.clock() * 1000)
        self._versions: dict[str, int] = {}
        self._generation: dict[str, int] = {}  # bumped by every (re-)registration
        self._last_now = 0.0
        self._ticking = False
        self._failures: dict[str, int] = {}  # service -> consecutive failed replicas
        self.live: set[str] = set()  # replica job ids not yet ended
        self._ended: dict[str, float] = {}  # replica id -> when its job was seen ended
        ctx.events.restored.subscribe(self.restore)
        ctx.events.before_pass.subscribe(self.before_pass)
        ctx.events.job_forgotten.subscribe(self.forgetting)
        ctx.events.node_event.subscribe(self.on_node_event)

    # -- lifecycle ---------------------------------------------------------------------------
    def restore(self) -> None:
        """Re-register journalled services and adopt their running replicas (before serving)."""
        ctx = self.ctx
        for name, data in ctx.journal.now(load_services).items():
            try:
                reg = decode(RegisterServiceParams, data)
                self.placer.register(reg.profile())
            except (SchemaError, PlacerError) as exc:
                log.error("journalled service %s cannot be restored: %s", name, exc)
                continue
            self.registrations[name] = reg
        stale: list[Job] = []
        for job in ctx.core.jobs.values():
            service = job.spec.env.get(SERVICE_ENV)
            if (job.spec.kind is not JobKind.INFERENCE or service not in self.registrations
                    or job.state.terminal):
                continue
            replica = self._replica_of(job)
            if job.state is JobState.QUEUED or replica is None:
                stale.append(job)
                continue
            try:
                self.placer.adopt(replica)
            except PlacerError as exc:
                log.error("replica job %s cannot be adopted: %s", job.id, exc)
                stale.append(job)
                continue
            self.jobs[replica.id] = job.id
            self.live.add(job.id)
        for job in stale:
            ctx.jobs.cancel_restored(job.id, "stale inference replica")
        if self.registrations:
            log.info("inference services restored=%d replicas adopted=%d",
                     len(self.registrations), len(self.jobs))

    def _replica_of(self, job: Job) -> Replica | None:
        """Rebuild the placer's record of a replica job from the job itself."""
        placement = job.placement
        env = job.spec.env
        if placement is None or len(placement.allocations) != 1 or REPLICA_ENV not in env:
            return None
        alloc = placement.allocations[0]
        view = self.ctx.core.node(alloc.node)
        kind = ReplicaKind.GPU if alloc.gpus else ReplicaKind.CPU
        reg = self.registrations[env[SERVICE_ENV]]
        return Replica(
            id=env[REPLICA_ENV], service=reg.service, kind=kind, node=alloc.node,
            address=view.inventory.address if view is not None else "",
            cpus=tuple(alloc.cpus), gpu=alloc.gpus[0] if alloc.gpus else None,
            memory_mib=alloc.memory_mib,
            mbw_gbps=reg.cpu_mbw_gbps if kind is ReplicaKind.CPU else 0.0,
            launched_at=job.start_time or job.submit_time,
        )

    def _now(self) -> float:
        # The placer needs non-decreasing report times; the wall clock may step back.
        self._last_now = max(self._last_now, self.ctx.clock())
        return self._last_now

    def _ensure_ticker(self) -> None:
        if not self._ticking:
            self._ticking = True
            self.ctx.tasks.spawn(self._tick(), "inference-tick")

    async def _tick(self) -> None:
        """Re-plan while services exist: sustained conditions mature with time alone."""
        period = min(5.0, max(0.25, self.config.sustain_s / 4))
        try:
            while self.registrations:
                await asyncio.sleep(period)
                self.plan()
        finally:
            self._ticking = False

    # -- planning ----------------------------------------------------------------------------
    def before_pass(self) -> None:
        """Called at the start of every scheduling pass (a cluster event happened)."""
        if self.live:
            self._guard_queue()  # even for services deregistered meanwhile
        if self.registrations:
            self._ensure_ticker()
            self.plan()

    def plan(self) -> list[ReplicaAction]:
        self._guard_queue()
        self._forget_lost()
        snapshot = self.ctx.core.snapshot()
        headroom = GpuNodeHeadroom(snapshot, self.measured_headroom(),
                                   self.config.mbw_headroom_gbps)
        room = replica_room(self.ctx.core.policy, snapshot)
        actions = self.placer.plan(snapshot, self._now(), headroom, room)
        for action in actions:
            if isinstance(action, LaunchReplica):
                self._launch(action)
            elif isinstance(action, RetireReplica):
                self._retire(action)
            elif isinstance(action, Preempt):
                self._preempt(action)
        return actions

    def _guard_queue(self) -> None:
        """Cancel replica jobs a failed start put back in the queue (this runs before every
        policy pass): a replica runs where the placer put it or not at all."""
        for job_id in list(self.live):
            job = self.ctx.core.job(job_id)
            if job is None or job.state.terminal:
                self.live.discard(job_id)
            elif job.state is JobState.QUEUED:
                self._cancel_queued(job)
                self.live.discard(job_id)

    def _forget_lost(self) -> None:
        """Tell the placer about replicas whose jobs ended or were put back in the queue.

        A replica that failed (never ran, or died within ``FAILED_RUN_S`` of starting) keeps
        its place in the placer's books, shown as not ready, for a back-off that doubles with
        each consecutive failure of the service: a node that refuses a service's replicas
        must not turn every scheduling pass into another launch.
        """
        now = self.ctx.clock()
        for service in list(self.registrations):
            for replica in self.placer.replicas(service):
                job = self.ctx.core.job(self.jobs.get(replica.id, ""))
                if job is not None and job.state is JobState.RUNNING:
                    self._failures.pop(service, None)
                    continue
                if job is not None and not job.state.terminal \
                        and job.state is not JobState.QUEUED:
                    continue  # starting
                if job is not None and job.state is JobState.QUEUED:
                    self._cancel_queued(job)
                if job is not None and replica.id not in self._ended:
                    self._replica_ended(service, replica.id, job, now)
                ended = self._ended.get(replica.id, now)
                if self._failures.get(service) and now - ended < self._backoff(service):
                    continue
                self._ended.pop(replica.id, None)
                self.placer.replica_lost(service, replica.id)
                self.jobs.pop(replica.id, None)

    def _replica_ended(self, service: str, replica_id: str, job: Job, now: float) -> None:
        """Note when a replica's job was seen ended and whether it counts as a failure."""
        self._ended[replica_id] = now
        ran = (job.start_time is not None and job.end_time is not None
               and job.end_time - job.start_time >= FAILED_RUN_S)
        if ran:
            self._failures.pop(service, None)
        else:
            self._failed(service, f"replica job={job.id} failed "
                                  f"({job.reason or job.state.value})")

    def _failed(self, service: str, what: str) -> None:
        """One more consecutive failure of the service's replicas: the back-off doubles."""
        self._failures[service] = self._failures.get(service, 0) + 1
        log.warning("service=%s %s; retrying in %.0fs", service, what, self._backoff(service))

    def forgetting(self, job: Job) -> None:
        """The master is dropping this ended job from memory (finished_jobs_in_memory).

        If it is the job of a replica the placer still lists, its end is noted now, exactly
        as the next plan would have noted it: otherwise the plan would find no job, drop the
        replica without the failure back-off and relaunch a failing replica at once.
        """
        self.live.discard(job.id)
        replica_id = job.spec.env.get(REPLICA_ENV)
        service = job.spec.env.get(SERVICE_ENV)
        if replica_id is None or service is None or self.jobs.get(replica_id) != job.id:
            return
        if replica_id not in self._ended:
            self._replica_ended(service, replica_id, job, self.ctx.clock())

    def _backoff(self, service: str) -> float:
        failures = self._failures.get(service, 0)
        return min(MAX_BACKOFF_S, 2.0 ** max(0, failures - 1)) if failures else 0.0

    def _cancel_queued(self, job: Job) -> None:
        """A replica job must never run outside the placer's control: drop it from the queue."""
        self.ctx.jobs.drop_queued(job.id)

    def _launch(self, action: LaunchReplica) -> None:
        replica = action.replica
        reg = self.registrations[replica.service]
        number = replica.id.rsplit("-", 1)[-1]
        port = reg.port + int(number) if reg.port and number.isdigit() else 0
        env = dict(reg.env)
        env.update({
            SERVICE_ENV: reg.service, REPLICA_ENV: replica.id, KIND_ENV: replica.kind.value,
            BATCH_ENV: str(reg.profile().capacity(replica.kind)),
        })
        if port:
            env[PORT_ENV] = str(port)
        try:
            spec = JobSpec(
                name=replica.id[:63], command=reg.command, user=reg.user,
                kind=JobKind.INFERENCE, tenant=reg.tenant,
                gpus=1 if replica.gpu is not None else 0, gpu_model=reg.gpu_model,
                cpus=len(replica.cpus), memory_mib=replica.memory_mib, env=env,
            )
            job = self.ctx.jobs.launch_placed(spec, replica.placement, replica.id,
                                              f"service {reg.service}: {action.reason}")
        except (ValueError, RuntimeError) as exc:
            # Refused before it ran (a closed node, over its account's limits, resources
            # taken): a failed replica like one whose node refused it, so it stays listed
            # and backs off (_forget_lost) instead of being tried again at every pass.
            self._ended[replica.id] = self.ctx.clock()
            self._failed(replica.service, f"replica {replica.id} cannot be launched: {exc}")
            return
        self.jobs[replica.id] = job.id
        self.live.add(job.id)

    def _retire(self, action: RetireReplica) -> None:
        job_id = self.jobs.pop(action.replica.id, None)
        job = self.ctx.core.job(job_id or "")
        if job is None or job.state.terminal:
            return
        log.info("service=%s replica job=%s retiring reason=%r", action.replica.service,
                 job.id, action.reason)
        self.ctx.tasks.spawn(self._cancel(job.id))

    async def _cancel(self, job_id: str) -> None:
        try:
            await self.ctx.jobs.cancel(job_id)
        except JobError as exc:  # it ended meanwhile
            log.debug("replica job %s not cancelled: %s", job_id, exc)

    def _preempt(self, decision: Preempt) -> None:
        """The master's preemption path: mark the victim as the core does, stop its parts."""
        if self.ctx.jobs.preempt(decision):
            log.info("inference preempts job=%s reason=%r", decision.job_id, decision.reason)

    # -- RPC ---------------------------------------------------------------------------------
    def _service(self, name: str) -> RegisterServiceParams:
        reg = self.registrations.get(name)
        if reg is None:
            raise JobError("unknown_service", f"inference service {name!r} is not registered")
        return reg

    @returns("The `place` reply plus `registered` (true when new; registering again "
             "replaces the profile).", ("invalid_params", "too_many_services", "unknown_user",
                                        "user_refused"))
    async def register_service(self, p: RegisterServiceParams) -> dict[str, Any]:
        """Register (or update) an inference service: its profile and replica command."""
        try:
            profile = p.profile()
        except PlacerError as exc:
            raise JobError("invalid_params", str(exc)) from None
        if p.service not in self.registrations and \
                len(self.registrations) >= self.config.max_services:
            raise JobError("too_many_services",
                           f"the master serves at most {self.config.max_services} services")
        self.ctx.jobs.check_user(p.user)
        await self.ctx.journal.call(save_service, p.service, encode(p), self.ctx.clock())
        new = p.service not in self.registrations
        self.registrations[p.service] = p
        self._generation[p.service] = self._generation.get(p.service, 0) + 1
        self.placer.register(profile)
        self._ensure_ticker()
        self.plan()
        return {"service": p.service, "registered": new, **self._place(p.service)}

    @returns("The `place` reply after re-planning.", ("unknown_service", "invalid_params"))
    async def report_load(self, p: ReportLoadParams) -> dict[str, Any]:
        """Report a service's current load; the placer re-plans."""
        reg = self._service(p.service)
        if (p.load is None) == (p.qps is None):
            raise JobError("invalid_params", "give exactly one of load (queries per batching "
                           "window) or qps (queries per second)")
        value = p.load if p.load is not None else p.qps
        assert value is not None
        if not math.isfinite(value) or value < 0:
            which = "load" if p.load is not None else "qps"
            raise JobError("invalid_params",
                           f"{which} for service {p.service} must be a finite number >= 0, "
                           f"got {value!r}")
        load = value if p.load is not None else load_from_qps(value, reg.profile())
        try:
            self.placer.report_load(p.service, load, self._now())
        except UnknownServiceError as exc:
            raise JobError("unknown_service", str(exc)) from None
        except PlacerError as exc:
            raise JobError("invalid_params", str(exc)) from None
        self.plan()
        return self._place(p.service)

    @returns("`service`, `version` (changes whenever the endpoints or a replica's readiness "
             "do), `mode` (`cpu`/`gpu`), `load`, `endpoints`: `replica`, `job`, `kind`, "
             "`node`, `address`, `port`, `gpu` (index or nil), `cpus`, `ready`.",
             ("unknown_service",))
    async def place(self, p: ServiceParams) -> dict[str, Any]:
        """Where a service's replicas serve (cache the reply; poll cheaply)."""
        self._service(p.service)
        return self._place(p.service)

    def _place(self, service: str) -> dict[str, Any]:
        """The cached reply: rebuilt only when the placer's version or readiness changed."""
        version = self.placer.version(service)
        jobs, core_jobs = self.jobs, self.ctx.core.jobs
        ready = frozenset(
            r.id for r in self.placer.replicas(service)
            if (job := core_jobs.get(jobs.get(r.id, ""))) is not None
            and job.state is JobState.RUNNING
        )
        reg = self.registrations[service]
        key = (version, ready, self._generation.get(service, 0))
        cached = self._cache.get(service)
        if cached is not None and cached.key == key:
            return cached.reply
        answer = self.placer.place(service)
        number = max(self._versions.get(service, 0) + 1, self._epoch)
        self._versions[service] = number
        endpoints = []
        for e in answer.endpoints:
            seq = e.replica_id.rsplit("-", 1)[-1]
            endpoints.append({
                "replica": e.replica_id, "job": jobs.get(e.replica_id), "kind": e.kind.value,
                "node": e.node, "address": e.address,
                "port": reg.port + int(seq) if reg.port and seq.isdigit() else None,
                "gpu": e.gpu, "cpus": list(e.cpus), "ready": e.replica_id in ready,
            })
        reply = {"service": service, "version": number, "mode": answer.mode.value,
                 "load": self.placer.load(service), "endpoints": endpoints}
        self._cache[service] = _Cached(key, reply)
        return reply

    @returns("`service`; `retired`: the replicas being stopped.", ("unknown_service",))
    async def deregister_service(self, p: ServiceParams) -> dict[str, Any]:
        """Stop serving a service: its replicas are retired."""
        self._service(p.service)
        await self.ctx.journal.call(delete_service, p.service)
        del self.registrations[p.service]
        self._cache.pop(p.service, None)
        self._failures.pop(p.service, None)
        retired = self.placer.deregister(p.service)
        for action in retired:
            self._ended.pop(action.replica.id, None)
            self._retire(action)
        return {"service": p.service, "retired": [a.replica.id for a in retired]}

    @returns("`services`: each service's `service`, `user`, `tenant`, `mode`, `load`, "
             "`version`, `replicas`, `ready` and `profile`.")
    async def services(self, _: NoServiceParams) -> dict[str, Any]:
        """Every registered service."""
        out = []
        for name, reg in sorted(self.registrations.items()):
            answer = self._place(name)
            profile = {k: v for k, v in asdict(reg.profile()).items() if k != "service"}
            out.append({
                "service": name, "user": reg.user, "tenant": reg.tenant,
                "mode": answer["mode"], "load": answer["load"], "version": answer["version"],
                "replicas": len(answer["endpoints"]),
                "ready": sum(1 for e in answer["endpoints"] if e["ready"]),
                "profile": profile,
            })
        return {"services": out}

    async def on_node_event(self, node: str, event: Any) -> None:
        if isinstance(event, MemBandwidth):
            self.note_bandwidth(node, event)

    def note_bandwidth(self, node: str, event: MemBandwidth) -> None:
        """A node's measured memory bandwidth becomes its headroom for CPU replicas.

        The placer subtracts its own CPU replicas' profiled bandwidth itself, so what they
        used in the measurement is added back: replicas already running through the whole
        window. One launched since is not in the measurement, and the placer counts it.
        """
        now = self.ctx.clock()
        own = 0.0
        for service in self.registrations:
            for replica in self.placer.replicas(service):
                if replica.node != node or replica.kind is not ReplicaKind.CPU:
                    continue
                job_id = self.jobs.get(replica.id)
                job = self.ctx.core.job(job_id) if job_id is not None else None
                if (job is not None and job.start_time is not None
                        and job.start_time <= now - event.window_s):
                    own += replica.mbw_gbps
        headroom = bandwidth_headroom(event.limit_gbps, event.used_gbps, own)
        self.bandwidth[node] = _Bandwidth(event, now, headroom)
        log.debug("node=%s memory bandwidth used_gbps=%.2f limit_gbps=%.2f own_gbps=%.2f "
                  "headroom_gbps=%.2f", node, event.used_gbps, event.limit_gbps, own, headroom)

    def measured_headroom(self) -> Mapping[str, float]:
        """The nodes' recent measurements (a node that stopped reporting falls back to the
        configured figure)."""
        return _RecentHeadroom(self.bandwidth, self.ctx.clock() - STALE_BANDWIDTH_S)

    def bandwidth_of(self, node: str) -> dict[str, float] | None:
        """The node's last measurement for ``trellisctl node``, or None if it never sent one."""
        b = self.bandwidth.get(node)
        if b is None:
            return None
        return {"used_gbps": b.event.used_gbps, "limit_gbps": b.event.limit_gbps,
                "headroom_gbps": round(b.headroom_gbps, 4),
                "age_s": round(self.ctx.clock() - b.at, 1)}
