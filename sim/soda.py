"""SODA's node-level mechanisms in the replay, driven by the code the daemons run (§V).

:class:`SodaSimulator` extends the discrete-event :class:`~sim.engine.Simulator` with

* the **adaptive CPU allocator** (§V-B): N_start from ``masterd.core.cores.start_point`` (the
  master's rule, with the owner history it keeps), then the node's tuning session
  ``noded.policy.tuning.PartTuning`` fed one window's mean GPU utilisation at a time, as
  noded's loop feeds it; cores it stops holding go back through ``SchedulingCore.cores_changed``
  exactly as the master applies a ``cores_changed`` event, and the converged count joins the
  owner's history (``masterd.core.cores.remember``);
* the **contention eliminator** (§V-E): one ``noded.policy.contention.ContentionController``
  per node, given the node's and each CPU job's memory bandwidth (MBM) every pass; its MBA
  steps and core halvings change the CPU jobs' bandwidth and speed;
* the **inference placer** (§V-D): ``masterd.core.inference.InferencePlacer`` with the
  services' daily load reported every pass and planned before every scheduling pass, as the
  master's inference feature does; its replicas are jobs placed in the core at the placer's
  exact resources, and its preemptions stop their victims through the engine.

Ground truth (how cores, bandwidth and load act on jobs) is :mod:`sim.soda_truth`; the
mechanisms see only what noded would measure from it: GPU utilisation per window (with
seeded noise) and bandwidth per job and node. Each mechanism can be switched off
(:class:`Mechanisms`) for the ablation; the truth applies whatever runs, so a baseline's jobs
are starved, slowed by contention and hold GPUs at night just the same.

Differences from the live daemons, by design: the eliminator and the placer act every
``tick_s`` (60 s) instead of every second; a tuning window is ``TunerConfig.window_s`` of
simulated time and its utilisation is the truth's value at its end; MBA is taken to exist on
every node with the levels ``mba_levels(step, mba_floor_pct)``.
"""

from __future__ import annotations

import logging
import math
import random
import signal
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from masterd.core.arrays import ArrayPolicy
from masterd.core.cores import remember, start_point
from masterd.core.eligibility import eligible
from masterd.core.inference import (
    InferencePlacer,
    InferenceProfile,
    LaunchReplica,
    PlacerConfig,
    ReplicaKind,
    RetireReplica,
    bandwidth_headroom,
    replica_room,
)
from masterd.core.policy import Policy, Preempt
from masterd.core.widen import node_spare_cores, widened
from noded.policy.contention import (
    ContentionController,
    JobSample,
    Observation,
    mba_levels,
)
from noded.policy.tuning import PartTuning, Pin, rank_cores
from shared.config import ContentionConfig, TunerConfig
from shared.model import Job, JobKind, JobSpec, JobState
from sim.engine import CALL, STOP, JobRecord, ProgressFn, SimConfig, SimResult, Simulator, _Run
from sim.soda_truth import CpuJobTruth, SodaTruth, SodaTruthConfig
from sim.workloads.base import SimJob, Workload

log = logging.getLogger("trellis.sim.soda")

GB = 1e9


@dataclass(frozen=True)
class Mechanisms:
    """Which of SODA's node-level mechanisms run (the arrays are the policy's business)."""

    allocator: bool = True
    placer: bool = True
    eliminator: bool = True

    @classmethod
    def none(cls) -> Mechanisms:
        return cls(False, False, False)


@dataclass(frozen=True)
class SodaConfig:
    mechanisms: Mechanisms = field(default_factory=Mechanisms)
    truth: SodaTruthConfig = field(default_factory=SodaTruthConfig)
    tuner: TunerConfig = field(default_factory=TunerConfig)  # noded's defaults
    contention: ContentionConfig = field(default_factory=ContentionConfig)
    placer: PlacerConfig = field(default_factory=PlacerConfig)  # the master's defaults
    tick_s: float = 60.0  # eliminator and placer passes; load reports
    window_noise: float = 1.0  # standard deviation (points) of a measured window's mean
    mba_floor_pct: int = 10  # lowest MBA level of the (assumed) hardware
    # Whether nodes monitor memory bandwidth (MBM); without it the eliminator detects
    # contention from training jobs' GPU utilisation drops (§V-E), as noded does.
    mbm: bool = True
    services: frozenset[str] = frozenset()  # workload job ids that are inference services
    # Job id -> the share of each GPU it asked for (openb's gpu_milli / 1000) where below 1:
    # the core gives whole GPUs, but such a job keeps its GPU busy at most that share.
    gpu_share: Mapping[str, float] = field(default_factory=dict)
    tick_until: float = math.inf  # periodic passes stop after this (simulated seconds)
    # The allocator's per-GPU ceiling (the master's adaptive_max_cores_per_gpu; 0: a job's
    # request is its ceiling). Cores above the request come from spare cores of the node.
    max_cores_per_gpu: int = 0


@dataclass
class _Part:
    """One node's share of a running training job."""

    node: str
    order: list[int]  # its cores, in the order noded pins them (rank_cores)
    requested: int  # cores it was placed with (what the trace duration was measured with)
    best: int  # the truth's best fit
    pinned: int
    session: PartTuning | None = None
    token: object = field(default_factory=object)  # tells a stale window event apart


@dataclass
class _Throttle:
    mba: int = 100
    cores: int | None = None


@dataclass
class _Replica:
    service: str
    job_id: str
    kind: ReplicaKind
    node: str
    busy: float = 0.0  # GPU busy share it contributes


@dataclass
class _Service:
    name: str
    record: JobRecord
    peak: float
    gpus: int
    ends: float
    cpu_batch: int


@dataclass
class SodaStats:
    tuned_parts: int = 0
    tuning_windows: int = 0
    cores_returned: int = 0  # cores handed back to the cluster by tuning
    cores_widened: int = 0  # cores given beyond requests at launch (masterd.core.widen)
    core_changes: list[int] = field(default_factory=list)  # converged - requested, per part
    throttle_actions: int = 0
    replica_launches: int = 0
    launches_by_kind: dict[str, int] = field(default_factory=lambda: {"cpu": 0, "gpu": 0})
    replica_retires: int = 0
    placer_preemptions: int = 0
    replicas_lost: int = 0
    # Why queued GPU jobs waited, counted at every sample (one per job and sample):
    # "gpus" no node of the job's model has its GPUs free; "cores" one has, with the memory
    # but not the cores (stranded GPUs); "memory" one has, with the cores but not the
    # memory; "both" neither; "held" it would fit a node, so the policy (its order, or the
    # arrays' reservations) held it back.
    # Under SODA's arrays "held" is split by where the fitting node is: "held_model" only on
    # nodes of another GPU model than the job's array, "held_array" only in the other GPU
    # array (large / small) of its model; "held" then means inside its own array.
    wait_reasons: dict[str, int] = field(default_factory=lambda: {
        "gpus": 0, "cores": 0, "memory": 0, "both": 0, "held": 0, "held_model": 0,
        "held_array": 0})
    tuning_s: float = 0.0  # simulated time tuned parts spent in measurement windows
    replica_core_s: float = 0.0  # core-seconds the placer's CPU replicas held (to tick_until)


class SodaSimulator(Simulator):
    def __init__(
        self,
        workload: Workload,
        policy: Policy,
        config: SimConfig | None = None,
        soda: SodaConfig | None = None,
        progress: ProgressFn | None = None,
    ) -> None:
        super().__init__(workload, policy, config, progress)
        self.soda = soda or SodaConfig()
        self.mech = self.soda.mechanisms
        self.strue = SodaTruth(self.soda.truth, self.config.seed)
        self.stats = SodaStats()
        self.history: dict[tuple[str, str], int] = {}  # the master's owner core history
        self._parts: dict[str, list[_Part]] = {}
        self._cpu: dict[str, CpuJobTruth] = {}
        self._throttle: dict[str, _Throttle] = {}
        self._bw: dict[str, dict[str, float]] = {n: {} for n in self.inventories}  # GB/s
        self._peak = {n: self.strue.peak_gbps(len({c.socket for c in inv.cpus}) or 1)
                      for n, inv in self.inventories.items()}
        self._sensitive: dict[str, bool] = {}
        self._controllers: dict[str, ContentionController] = {}
        self._levels = mba_levels(self.soda.contention.mba_step, self.soda.mba_floor_pct)
        self._noise = random.Random(f"soda/{self.config.seed}/window-noise")
        self.placer = InferencePlacer(self.soda.placer)
        self._services: dict[str, _Service] = {}
        self._replicas: dict[str, _Replica] = {}
        self._ticking = False

    # -- jobs starting and ending --------------------------------------------------------
    def _begin(self, job_id: str, now: float) -> None:
        job = self.core.jobs[job_id]
        spec = job.spec
        placement = self._placements[job_id]
        if spec.kind is JobKind.TRAINING and spec.gpus:
            parts = []
            widen = self.mech.allocator and self.soda.max_cores_per_gpu > 0
            for alloc in placement.allocations:
                if not alloc.gpus:
                    continue
                inv = self.inventories[alloc.node]
                numa = {c.id: c.numa_node for c in inv.cpus}
                gpu_numa = {g.numa_node for g in inv.gpus if g.index in alloc.gpus}
                cpus = self._widen(job_id, alloc.node, alloc.cpus, len(alloc.gpus)) \
                    if widen and len(alloc.cpus) >= 1 else alloc.cpus
                order = rank_cores(cpus, numa, gpu_numa)
                best = self.strue.best_fit(self._record_of[job_id].id, spec.model_type,
                                           len(alloc.gpus))
                # ``requested``: what the trace's duration was measured with (not widened).
                parts.append(_Part(alloc.node, order, len(alloc.cpus), best, len(order)))
            self._parts[job_id] = parts
            self._sensitive[job_id] = self.strue.sensitive(self._record_of[job_id].id)
            if self.mech.allocator:
                for part in parts:
                    self._start_tuning(job_id, spec, part, now)
            for part in parts:
                self._bw[part.node][job_id] = self.strue.training_gbps(part.pinned)
        elif spec.kind is JobKind.CPU:
            truth = self._cpu[job_id] = self.strue.cpu_job(self._record_of[job_id].id)
            for alloc in placement.allocations:
                self._bw[alloc.node][job_id] = self.strue.cpu_job_gbps(truth, 100,
                                                                       len(alloc.cpus))
        super()._begin(job_id, now)
        self._reprice_nodes(placement.nodes, now, skip=job_id)
        self._ensure_ticking(now)

    def _widen(self, job_id: str, node: str, cpus: tuple[int, ...], gpus: int
               ) -> tuple[int, ...]:
        """§V-B: more cores than asked, from the node's spare cores (masterd.core.widen, the
        rule the master's allocator applies at launch), taken as the master takes them."""
        view = self.core.cluster.node(node)
        if view is None:
            return cpus
        spare = node_spare_cores(self.policy, self.core.snapshot, view)
        new = widened(cpus, gpus, spare, self.soda.max_cores_per_gpu)
        if len(new) > len(cpus):
            self.core.cores_changed(job_id, node, new)
            self.stats.cores_widened += len(new) - len(cpus)
        return new

    def _end_run(self, job_id: str, now: float) -> _Run | None:
        placement = self._placements.get(job_id)
        run = super()._end_run(job_id, now)
        self._parts.pop(job_id, None)
        self._cpu.pop(job_id, None)
        self._throttle.pop(job_id, None)
        self._sensitive.pop(job_id, None)
        if placement is not None:
            for node in placement.nodes:
                self._bw[node].pop(job_id, None)
            self._reprice_nodes(placement.nodes, now, skip=job_id)
        return run

    # -- the truth of a running job --------------------------------------------------------
    def _adjust(self, run: _Run, speed: float, efficiency: float) -> tuple[float, float]:
        job_id = run.job_id
        parts = self._parts.get(job_id)
        if parts:
            strue = self.strue
            rel = min(strue.throughput(p.pinned, p.best) for p in parts)
            ref = min(strue.throughput(p.requested, p.best) for p in parts)
            slow = 1.0
            if self._sensitive.get(job_id):
                slow = max(strue.contention_slowdown(self._pressure(p.node, job_id))
                           for p in parts)
            share = self.soda.gpu_share.get(self._record_of[job_id].id, 1.0)
            return (speed * rel / ref / slow,
                    efficiency * min(strue.config.u_best * rel / slow, share))
        cpu = self._cpu.get(job_id)
        if cpu is not None:
            t = self._throttle.get(job_id)
            if t is None:
                return speed, efficiency
            cores = sum(len(a.cpus) for a in run.placement.allocations)
            kept = cores if t.cores is None else t.cores
            return speed * self.strue.cpu_job_speed(cpu, t.mba, kept, cores), efficiency
        share = self.soda.gpu_share.get(self._record_of[job_id].id, 1.0)
        if job_id in self.soda.services and run.shape.gpus:
            # A service run as a plain job (the placer off): its GPUs follow its load.
            peak = self.strue.service_peak(run.shape.gpus)
            load = self.strue.daily_load(peak, self.now)
            busy = min(1.0, load / (run.shape.gpus * self.strue.config.bs_gpu))
            return speed, efficiency * min(busy, share)
        if run.shape.gpus:
            return speed, efficiency * min(self.strue.config.u_best, share)
        return speed, efficiency

    def _pressure(self, node: str, exclude: str) -> float:
        """Bandwidth of everything on ``node`` but ``exclude``, over the node's peak."""
        used = self._bw[node]
        return (sum(used.values()) - used.get(exclude, 0.0)) / self._peak[node]

    def _reprice_nodes(self, nodes: tuple[str, ...] | list[str], now: float,
                       skip: str | None = None) -> None:
        """Bandwidth on these nodes changed: re-price their sensitive training jobs."""
        seen: set[str] = set()
        for node in nodes:
            for other in self._bw[node]:
                if other == skip or other in seen:
                    continue
                seen.add(other)
                if self._sensitive.get(other) and other in self._runs:
                    self._reprice(self._runs[other], now)

    # -- the adaptive CPU allocator ---------------------------------------------------------
    def _start_tuning(self, job_id: str, spec: JobSpec, part: _Part, now: float) -> None:
        if len(part.order) < 2:
            return
        start = start_point(spec, self.history, available=len(part.order))
        part.session = PartTuning(
            n_start=start.cores, warm=start.from_history, launch_cores=start.cores,
            min_cores=1, max_cores=len(part.order), config=self.soda.tuner,
        )
        self.stats.tuned_parts += 1
        cfg = self.soda.tuner
        pin = part.session.begin()
        if pin is not None:
            self._apply_pin(job_id, part, pin, now)
        pin = part.session.next_window()
        if pin is not None:
            self._apply_pin(job_id, part, pin, now)
        settle = cfg.settle_s if pin is not None else 0.0
        self._push_window(job_id, part, now + cfg.warmup_s + settle + cfg.window_s)

    def _push_window(self, job_id: str, part: _Part, at: float) -> None:
        token = part.token
        self._push(at, CALL, lambda: self._window_done(job_id, part, token))

    def _window_done(self, job_id: str, part: _Part, token: object) -> bool:
        """A tuning window of ``part`` ended: feed its utilisation, carry out what follows."""
        if (part.token is not token or part.session is None or job_id not in self._runs
                or not any(p is part for p in self._parts.get(job_id, ()))):
            return False  # the attempt ended (finished, preempted; maybe running again) since
        now = self.now
        session = part.session
        run = self._runs[job_id]
        busy = self._adjust(run, 1.0, 1.0)[1]  # the part's GPU busy share now
        util = min(100.0, max(0.0, 100.0 * busy + self._noise.gauss(0.0, self.soda.window_noise)))
        self.stats.tuning_windows += 1
        self.stats.tuning_s += self.soda.tuner.window_s
        freed = False
        pin = session.observe(util)
        if pin is not None:
            freed |= self._apply_pin(job_id, part, pin, now)
        if session.converged:
            best = session.best
            assert best is not None
            remember(self.history, self.core.jobs[job_id].spec, best)
            self.stats.core_changes.append(best - part.requested)
            return freed
        pin = session.next_window()
        if pin is not None:
            freed |= self._apply_pin(job_id, part, pin, now)
        cfg = self.soda.tuner
        self._push_window(job_id, part, now + (cfg.settle_s if pin is not None else 0.0)
                          + cfg.window_s)
        self._note_usage(now)
        return freed

    def _apply_pin(self, job_id: str, part: _Part, pin: Pin, now: float) -> bool:
        """Re-pin and hand cores back as the master applies ``cores_changed``; True if
        cores came free (a queued job may fit now)."""
        part.pinned = pin.pinned
        self._bw[part.node][job_id] = self.strue.training_gbps(part.pinned)
        placement = self.core.placement_of(job_id)
        assert placement is not None
        held_now = sum(len(a.cpus) for a in placement.allocations if a.node == part.node)
        freed = False
        if pin.held < held_now:
            self.core.cores_changed(job_id, part.node, tuple(sorted(part.order[:pin.held])))
            self.stats.cores_returned += held_now - pin.held
            freed = True
        if job_id in self._runs:
            self._reprice(self._runs[job_id], now)
        self._reprice_nodes([part.node], now, skip=job_id)
        return freed

    # -- periodic passes: eliminator, placer, load ----------------------------------------------
    def _ensure_ticking(self, now: float) -> None:
        if not self._ticking and now < self.soda.tick_until:
            self._ticking = True
            self._push(now + self.soda.tick_s, CALL, self._tick)

    def _tick(self) -> bool:
        now = self.now
        changed = False
        if self.mech.eliminator:
            changed |= self._eliminate(now)
        if self._services:
            self._report_loads(now)
        # Inference jobs' busy share follows their load through the day.
        for job_id in self.soda.services & self._runs.keys():
            self._reprice(self._runs[job_id], now)
        self._update_replica_busy()
        self.stats.replica_core_s += self.soda.tick_s * sum(
            len(self.core.placement_of(r.job_id).allocations[0].cpus)  # type: ignore[union-attr]
            for r in self._replicas.values() if r.kind is ReplicaKind.CPU)
        if self._services and self.mech.placer:
            changed |= self._plan_services(now)
        self._note_usage(now)
        busy = bool(self._runs or self._services or self._replicas)
        if busy and now + self.soda.tick_s < self.soda.tick_until:
            self._push(now + self.soda.tick_s, CALL, self._tick)
        else:
            self._ticking = False
        return changed

    def _eliminate(self, now: float) -> bool:
        changed = False
        for node, used in self._bw.items():
            cpu_jobs = [j for j in used if j in self._cpu]
            ctl = self._controllers.get(node)
            # Without MBM the detector needs each training job's stable level from before
            # any CPU job arrives, so such nodes are watched all along, as noded does.
            watch = not self.soda.mbm and any(j in self._parts for j in used)
            if not cpu_jobs and not watch and (ctl is None or not ctl.throttled()):
                continue
            if ctl is None:
                ctl = self._controllers[node] = ContentionController(
                    self.soda.contention, peak_bps=self._peak[node] * GB, levels=self._levels)
            samples = []
            for job_id, gbps in used.items():
                job = self.core.jobs.get(job_id)
                placement = self.core.placement_of(job_id)
                if job is None or placement is None:
                    continue
                alloc = next((a for a in placement.allocations if a.node == node), None)
                if alloc is None:
                    continue
                util = None
                if alloc.gpus and job_id in self._runs:
                    util = 100.0 * self._adjust(self._runs[job_id], 1.0, 1.0)[1]
                samples.append(JobSample(
                    job_id=job_id, kind=job.spec.kind.value, cpus=tuple(alloc.cpus),
                    gpus=len(alloc.gpus), bandwidth_bps=gbps * GB if self.soda.mbm else None,
                    gpu_util=util, mba=True))
            obs = Observation(now=now, jobs=tuple(samples), mbm=self.soda.mbm,
                              node_bandwidth_bps=(sum(used.values()) * GB if self.soda.mbm
                                                  else None))
            decisions = ctl.observe(obs)
            for d in decisions:
                t = self._throttle.setdefault(d.job_id, _Throttle())
                if d.action in ("mba", "restore_mba"):
                    t.mba = d.value
                else:
                    t.cores = d.value
                self.stats.throttle_actions += 1
                cpu = self._cpu.get(d.job_id)
                placement = self._placements.get(d.job_id)
                if cpu is not None and placement is not None:
                    total = sum(len(a.cpus) for a in placement.allocations)
                    kept = total if t.cores is None else t.cores
                    self._bw[node][d.job_id] = self.strue.cpu_job_gbps(cpu, t.mba, kept)
                if d.job_id in self._runs:
                    self._reprice(self._runs[d.job_id], now)
            if decisions:
                self._reprice_nodes([node], now)
                changed = True
        return changed

    # -- the inference placer ---------------------------------------------------------------
    def _on_arrival(self, job: SimJob) -> bool:
        if not (self.mech.placer and job.id in self.soda.services):
            return super()._on_arrival(job)
        spec = job.spec
        model = self.strue.inference_model(spec.model_type)
        cfg = self.strue.config
        profile = InferenceProfile(
            service=job.id[:40], bs_gpu=cfg.bs_gpu, cpu_batch=model.cpu_batch,
            cpu_cores=cfg.cpu_cores if model.cpu_batch else 0, cpu_mbw_gbps=model.cpu_mbw_gbps,
            qos_ms=cfg.qos_ms, window_ms=cfg.window_ms, gpu_model=spec.gpu_model,
            gpu_replica_cpus=max(1, spec.cpus // max(1, spec.gpus)),
            memory_mib=spec.memory_mib // max(1, spec.gpus),
        )
        record = JobRecord(id=job.id, tenant=spec.tenant, qos=spec.qos, kind=spec.kind,
                           gpus=spec.gpus, submit=job.submit, ect=job.submit, lat11=0.0,
                           state="service")
        self.records[job.id] = record
        runtime = job.truth.known_duration or 0.0
        svc = _Service(profile.service, record, self.strue.service_peak(spec.gpus), spec.gpus,
                       job.submit + runtime, model.cpu_batch)
        self._services[svc.name] = svc
        self.placer.register(profile)
        self.placer.report_load(svc.name, self.strue.daily_load(svc.peak, self.now), self.now)
        self._push(svc.ends, CALL, lambda: self._service_ends(svc.name))
        self._ensure_ticking(self.now)
        return True

    def _service_ends(self, name: str) -> bool:
        svc = self._services.pop(name, None)
        if svc is None:
            return False
        for action in self.placer.deregister(name):
            self._retire(action.replica.id)
        svc.record.end = self.now
        svc.record.first_start = svc.record.submit
        self._done += 1
        self._note_usage(self.now)
        return True

    def _report_loads(self, now: float) -> None:
        for svc in self._services.values():
            self.placer.report_load(svc.name, self.strue.daily_load(svc.peak, now), now)

    def _schedule(self, now: float) -> None:
        if self._services and self.mech.placer:
            self._plan_services(now)
        super()._schedule(now)

    def _plan_services(self, now: float) -> bool:
        headroom = _Headroom(self, 0.75)
        snapshot = self.core.snapshot()
        actions = self.placer.plan(snapshot, now, headroom,
                                   replica_room(self.policy, snapshot))
        changed = False
        for action in actions:
            if isinstance(action, LaunchReplica):
                self._launch_replica(action, now)
            elif isinstance(action, RetireReplica):
                self._retire(action.replica.id)
                changed = True
            elif isinstance(action, Preempt):
                job = self.core.jobs.get(action.job_id)
                if job is None or job.stopping or job.state is not JobState.RUNNING:
                    continue
                job.stopping = True
                job.reason = f"preempted: {action.reason}"
                self.stats.placer_preemptions += 1
                self._push(now + self.config.stop_delay, STOP, (job.id, job.attempts))
        if actions:
            self._update_replica_busy()
            self._note_usage(now)
        return changed

    def _launch_replica(self, action: LaunchReplica, now: float) -> None:
        r = action.replica
        spec = JobSpec(name=r.id[:63], command=("replica",), user="openb",
                       kind=JobKind.INFERENCE, tenant="ls", gpus=1 if r.gpu is not None else 0,
                       cpus=len(r.cpus), memory_mib=r.memory_mib)
        placement = r.placement
        job = Job(id=r.id, spec=spec, submit_time=now, state=JobState.STARTING,
                  placement=placement, attempts=1, node_states={r.node: "preparing"})
        self.core.cluster.allocate(r.id, placement)
        self.core.submit(job)
        self.core.node_started(r.id, r.node, now)
        self._replicas[r.id] = _Replica(r.service, r.id, r.kind, r.node)
        if r.kind is ReplicaKind.GPU:
            self._allocated += 1
        else:
            self._bw[r.node][r.id] = r.mbw_gbps
            self._reprice_nodes([r.node], now, skip=r.id)
        self.stats.replica_launches += 1
        self.stats.launches_by_kind[r.kind.value] += 1

    def _retire(self, job_id: str) -> None:
        rep = self._replicas.pop(job_id, None)
        if rep is None:
            return
        job = self.core.jobs.get(job_id)
        if job is not None and not job.state.terminal:
            self.core.cancel(job_id, self.now)
            self.core.node_exited(job_id, rep.node, None, int(signal.SIGTERM), self.now)
        self._drop_replica(rep)
        self.stats.replica_retires += 1

    def _drop_replica(self, rep: _Replica) -> None:
        self._effective -= rep.busy
        rep.busy = 0.0
        if rep.kind is ReplicaKind.GPU:
            self._allocated -= 1
        elif self._bw[rep.node].pop(rep.job_id, None) is not None:
            self._reprice_nodes([rep.node], self.now)

    def _on_stop(self, job_id: str, attempt: int) -> bool:
        rep = self._replicas.get(job_id)
        if rep is None:
            return super()._on_stop(job_id, attempt)
        # The arrays policy reclaimed what a replica borrowed: the replica is lost, and the
        # placer replaces it at its next plan (the master's inference feature does the same).
        job = self.core.jobs[job_id]
        if job.state.terminal:
            return False
        del self._replicas[job_id]
        self.core.node_exited(job_id, rep.node, None, int(signal.SIGTERM), self.now)
        if job.state is JobState.QUEUED:
            self.core.cancel(job_id, self.now)  # a replica never waits in the queue
        self._drop_replica(rep)
        if rep.service in self._services:
            self.placer.replica_lost(rep.service, job_id)
        self.stats.replicas_lost += 1
        return True

    def _update_replica_busy(self) -> None:
        """Each replica carries its share of the service's load (§V-D1); a GPU replica is
        busy that share over ``bs_gpu`` of the time."""
        by_service: dict[str, list[_Replica]] = {}
        for rep in self._replicas.values():
            by_service.setdefault(rep.service, []).append(rep)
        bs_gpu = self.strue.config.bs_gpu
        for name, reps in by_service.items():
            svc = self._services.get(name)
            load = self.strue.daily_load(svc.peak, self.now) if svc is not None else 0.0
            cpu_batch = svc.cpu_batch if svc is not None else 0
            total = sum(bs_gpu if r.kind is ReplicaKind.GPU else cpu_batch for r in reps)
            for rep in reps:
                if rep.kind is not ReplicaKind.GPU:
                    continue
                busy = min(1.0, load / total) if total else 0.0
                self._effective += busy - rep.busy
                rep.busy = busy

    def _sample(self, t: float) -> None:
        super()._sample(t)
        if not self._queued:
            return
        snapshot = self.core.snapshot()
        views = [v for v in snapshot.nodes.values() if v.schedulable]
        amap = (self.policy.array_map(snapshot) if isinstance(self.policy, ArrayPolicy)
                else None)
        reasons = self.stats.wait_reasons
        for job_id in self._queued:
            job = self.core.jobs.get(job_id)
            if job is None or not job.spec.gpus:
                continue
            spec = job.spec
            nodes = [v for v in views if v.total_gpus >= spec.gpus
                     and eligible(spec, v.inventory)]
            if not nodes:
                continue  # a multi-node job: none of the three stories is simple
            gpus_free = [v for v in nodes if len(v.free_gpus) >= spec.gpus]
            if not gpus_free:
                reasons["gpus"] += 1
                continue
            cores = [len(v.free_cpus) >= spec.cpus for v in gpus_free]
            memory = [v.free_memory_mib >= spec.memory_mib for v in gpus_free]
            fits = [v for v, c, m in zip(gpus_free, cores, memory, strict=True) if c and m]
            if fits:
                home = amap.home(spec) if amap is not None else None
                if home is None:
                    reasons["held"] += 1
                elif not any(v.gpu_model == home.job_array.gpu_model for v in fits):
                    reasons["held_model"] += 1
                elif not any(amap.nodes[v.name].gpu_array == home.job_array for v in fits):
                    reasons["held_array"] += 1
                else:
                    reasons["held"] += 1
            elif any(memory):
                reasons["cores"] += 1
            elif any(cores):
                reasons["memory"] += 1
            else:
                reasons["both"] += 1

    def _result(self) -> SimResult:
        result = super()._result()
        result.notes = dict(result.notes)
        result.notes["soda"] = self.stats
        return result


class _Headroom(Mapping[str, float]):
    """Memory-bandwidth headroom (GB/s) of the GPU nodes before the eliminator's threshold,
    as the contention monitor would measure it, less the placer's own CPU replicas (which
    the placer subtracts itself)."""

    def __init__(self, sim: SodaSimulator, threshold: float) -> None:
        self.sim = sim
        self.threshold = threshold

    def __getitem__(self, node: str) -> float:
        sim = self.sim
        if node not in sim.inventories or not sim.inventories[node].gpus:
            raise KeyError(node)
        used = sim._bw[node]
        own = sum(v for j, v in used.items() if j in sim._replicas)
        return bandwidth_headroom(self.threshold * sim._peak[node], sum(used.values()), own)

    def __iter__(self) -> Iterator[str]:
        return (n for n, inv in self.sim.inventories.items() if inv.gpus)

    def __len__(self) -> int:
        return sum(1 for _ in self)


def simulate_soda(
    workload: Workload,
    policy: Policy,
    config: SimConfig | None = None,
    soda: SodaConfig | None = None,
    progress: ProgressFn | None = None,
) -> SimResult:
    return SodaSimulator(workload, policy, config, soda, progress).run()
