"""The discrete-event loop: drives masterd's SchedulingCore with a virtual clock.

One heap holds every future event of the cluster. At each instant the simulator applies all
events of that instant (job exits, preemption stops, node failures and recoveries, deferred
starts, arrivals), then, if any of them could change a decision, runs exactly one scheduling
pass ``core.schedule(now)`` and carries the decisions out as the master would: a Start becomes
``node_started`` on every node of the placement and a future exit whose time the ground-truth
model decides; a Preempt stops the job's parts (``node_exited`` with SIGTERM) so the core
re-queues it. Events created by a pass at the same instant (zero stop delay) form the next
batch of that instant, followed by another pass.

Time limits: a job whose spec has ``time_limit_s`` gets a LIMIT event at its start + limit
(masterd.core.timelimits, as the master's timer); if it still runs then, the core stops it
(``core.stop`` into ``timeout``, its parts exiting with SIGTERM at that instant) and it ends
``timeout``, counted apart from finished and failed jobs.

Node failure: ``core.node_down``, and every job with a part on the node is settled by the
master's own rules (masterd/core/failures.py, as masterd/features/nodeloss.py applies them
when a node is declared lost): requeued if it may be (its ``stop.requeue``, else
``requeue_default``) and has been requeued fewer than ``max_retries`` (the master's
``max_requeues``) times, else ended ``node_lost``. The lost part counts as exited, the other
parts are stopped (SIGTERM) at the same instant, and a requeued job goes back to its own
place in the queue (``SchedulingCore.requeue``) with its restart count one higher; its work
so far is lost. Recovery: ``core.node_up``.

Dependencies (``--after``): the master's own gate (masterd/core/dependency_gate.py), which
the master's feature wraps with its journal; a dependency that can never hold cancels the job
at that instant.
"""

from __future__ import annotations

import heapq
import logging
import math
import signal
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Protocol

from masterd.core.dependencies import ArrayTasks, Status
from masterd.core.dependency_gate import DependencyGate, Outcome
from masterd.core.failures import RequeueRules, jobs_on_node, node_lost_cause, verdict
from masterd.core.fairshare import FairShare
from masterd.core.policy import Policy, Preempt, Start
from masterd.core.quotas import QuotaAdmission
from masterd.core.scheduler import SchedulingCore
from masterd.core.timelimits import deadlines, stop_reason
from shared.accounts import Account, AccountTree
from shared.maintenance import Window
from shared.model import (
    Job,
    JobKind,
    JobSpec,
    JobState,
    NodeInventory,
    Placement,
    QosClass,
)
from sim.calendar import CalendarError, Drain, NodeCalendar
from sim.metrics import fragmentation
from sim.truth import (
    JobTruth,
    NodeTopology,
    PlacementShape,
    TruthConfig,
    TruthModel,
    shape_of,
)
from sim.workloads.base import SimJob, Workload

log = logging.getLogger("trellis.sim.engine")

# Event kinds; the number is also the order of events within one instant. CALL carries a
# callable (an extension's periodic work, e.g. sim/soda.py) returning whether it changed
# anything that a scheduling pass should see.
# A job's exit at the very instant of its limit wins over the limit (EXIT comes first).
EXIT, STOP, LIMIT, FAIL, RECOVER, START, ARRIVAL, SAMPLE, CALL = range(9)
_SCHEDULING_EVENTS = frozenset({EXIT, STOP, LIMIT, FAIL, RECOVER, START, ARRIVAL})


# Follow-up passes at one instant (quota admission), at most.
_FOLLOW_UPS = 8


class SimulationError(RuntimeError):
    """The replay cannot continue (a policy that never settles, an inconsistent core)."""


@dataclass(frozen=True)
class FailureConfig:
    mtbf_hours: float  # mean time between failures of one node
    repair_hours: float  # time a failed node stays down

    def __post_init__(self) -> None:
        if not (self.mtbf_hours > 0 and self.repair_hours > 0):
            raise ValueError("node MTBF and repair time must be positive")


@dataclass(frozen=True)
class Outage:
    """One planned node failure: down at ``start`` (s), back ``duration`` s later."""

    node: str
    start: float
    duration: float

    def __post_init__(self) -> None:
        if self.start < 0 or self.duration <= 0:
            raise ValueError(
                f"outage of {self.node}: start must be >= 0 and duration > 0 "
                f"(got {self.start:g}, {self.duration:g})"
            )


@dataclass(frozen=True)
class SimConfig:
    seed: int = 1
    truth: TruthConfig = field(default_factory=TruthConfig)
    prediction_error: float = 0.0  # lognormal sigma on the iterations users declare
    start_delay: float = 0.0  # Start decision -> job running on its nodes
    stop_delay: float = 0.0  # Preempt decision -> parts exited
    preempt_keeps_progress: bool = False  # False: a preempted job restarts from scratch
    # Requeues of a job hit by a node failure (the master's max_requeues), and whether a job
    # that does not say (its stop.requeue) is requeued at all (its requeue_default).
    max_retries: int = 3
    requeue_default: bool = True
    failures: FailureConfig | None = None  # random failures of every node
    outages: tuple[Outage, ...] = ()  # planned failures of named nodes
    sample_interval: float | None = None  # seconds; None picks ~500 samples over arrivals
    max_passes_per_instant: int = 10_000
    # Accounts with quotas (docs/governance.md): the master's quota admission on the core,
    # jobs charged to their spec's tenant. Empty: no accounts, as before.
    accounts: tuple[Account, ...] = ()
    # Maintenance windows (times on the replay's clock) and drains by hand, and the nodes
    # whose allocated GPUs the result records (sim/calendar.py).
    windows: tuple[Window, ...] = ()
    drains: tuple[Drain, ...] = ()
    watch_nodes: tuple[str, ...] = ()


@dataclass
class JobRecord:
    """Everything metrics need about one workload job (across retries and preemptions)."""

    id: str
    tenant: str
    qos: QosClass
    kind: JobKind
    gpus: int
    submit: float
    ect: float  # absolute time the job should end by (GENIE Eq. 9, or the file's deadline)
    lat11: float  # true latency alone on one GPU (Eq. 16's denominator)
    first_start: float | None = None
    end: float | None = None
    # finished | failed | timeout | cancelled | node_lost | rejected | unfinished
    state: str = "pending"
    run_time: float = 0.0  # summed over attempts
    attempts: int = 0
    preemptions: int = 0
    retries: int = 0
    gpus_used: int = 0
    nodes_used: int = 0
    reason: str = ""
    # When it was first the first job of the queue after a pass (the job a backfill
    # reservation protects), None if never: the head-of-queue wait is measured over these.
    head_since: float | None = None

    @property
    def at_head(self) -> bool:
        return self.head_since is not None

    @property
    def jct(self) -> float | None:
        return None if self.end is None else self.end - self.submit

    @property
    def queue_delay(self) -> float | None:
        """Time not running: JCT minus the running time of every attempt."""
        return None if self.end is None else max(0.0, self.end - self.submit - self.run_time)


@dataclass(frozen=True)
class Sample:
    time: float
    allocated_gpus: int
    effective_gpus: float
    queued: int
    running: int
    fragmentation: float  # SCHED² Eq. 1, averaged over nodes with GPUs
    nodes_down: int


@dataclass
class SimResult:
    policy: str
    workload: str
    seed: int
    records: list[JobRecord]
    total_gpus: int
    # (time, allocated GPUs, effective GPUs) at every change: exact time-weighted averages.
    usage: list[tuple[float, int, float]]
    samples: list[Sample]
    events: int
    passes: int
    stale_events: int
    end_time: float
    notes: dict[str, object] = field(default_factory=dict)
    # (time, nodes holding at least one job) at every change: node utilisation as Helios
    # counts it (a node is busy while any job runs on it).
    busy_nodes: list[tuple[float, int]] = field(default_factory=list)
    total_nodes: int = 0
    # (time, GPUs allocated on SimConfig.watch_nodes) at every change.
    watched_usage: list[tuple[float, int]] = field(default_factory=list)
    # Per maintenance window: the jobs placed on its nodes when it began.
    running_at_window_start: dict[str, int] = field(default_factory=dict)


class Annotator(Protocol):
    """Attaches predictions to jobs as they arrive and learns from those that finish, the way
    a master feature does live (e.g. QSSF's rolling estimate): the replay then reproduces the
    estimator's state as well as the policy's."""

    def submitted(self, job: Job, now: float) -> None: ...

    def finished(self, job: Job, run_time: float) -> None: ...


@dataclass
class _Run:
    """A job attempt the truth model is advancing."""

    job_id: str
    truth: JobTruth
    shape: PlacementShape
    placement: Placement
    started: float
    work_left: float
    startup_end: float
    t_last: float
    speed: float = 0.0
    efficiency: float = 0.0
    finish: float = math.inf
    version: int = 0


ProgressFn = Callable[[float, int, int], None]


class Simulator:
    def __init__(
        self,
        workload: Workload,
        policy: Policy,
        config: SimConfig | None = None,
        progress: ProgressFn | None = None,
        annotator: Annotator | None = None,
        fairshare: FairShare | None = None,
    ) -> None:
        self.annotator = annotator
        # Fair share with a memory (masterd/core/fairshare.py), charged as the master's
        # feature charges it: from each run's start to its end.
        self.fairshare = fairshare
        self.workload = workload
        self.policy = policy
        self.config = config or SimConfig()
        self.progress = progress
        self.truth = TruthModel(self.config.truth, self.config.seed)
        self.core = SchedulingCore(policy)
        if self.config.accounts:
            self.core.set_admission(QuotaAdmission(AccountTree.of(self.config.accounts)))
        self.inventories: dict[str, NodeInventory] = {n.name: n for n in workload.nodes}
        if len(self.inventories) != len(workload.nodes):
            raise SimulationError(f"workload {workload.name}: duplicate node names")
        self.topology = NodeTopology.of(workload.nodes)
        try:
            self.calendar = NodeCalendar(self.core, self.config.windows, self.config.drains,
                                         self.inventories, self.config.watch_nodes)
        except CalendarError as exc:
            raise SimulationError(str(exc)) from None
        self.total_gpus = sum(len(n.gpus) for n in workload.nodes)
        self._heap: list[tuple[float, int, int, object]] = []
        self._seq = 0
        self.now = 0.0
        self.records: dict[str, JobRecord] = {}
        self._record_of: dict[str, JobRecord] = {}  # core job id (incl. retries) -> record
        self._truth_of: dict[str, JobTruth] = {}  # record id -> truth constants
        self._progress_of: dict[str, float] = {}  # record id -> work left after preemption
        self._spec_of: dict[str, JobSpec] = {}
        self._runs: dict[str, _Run] = {}
        self._switch_jobs: dict[tuple[str, int], set[str]] = {}
        self._net_jobs: dict[str, set[str]] = {}
        self._node_jobs: dict[str, set[str]] = {n: set() for n in self.inventories}
        self._placements: dict[str, Placement] = {}  # core job id -> placement held
        self._down: set[str] = set()
        self._allocated = 0
        self._effective = 0.0
        self.usage: list[tuple[float, int, float]] = [(0.0, 0, 0.0)]
        self.samples: list[Sample] = []
        self.events = 0  # events that changed something
        self.stale_events = 0  # superseded exits, stops of attempts already over
        self.passes = 0
        # Passes the policy asked for although nothing happened (SchedulingCore.wake_at: a
        # batch window closing), each instant once, as the master's timer runs them.
        self._wakes: set[float] = set()
        self.wakes = 0
        self._done = 0
        self._pending = 0  # non-sample events in the heap
        self._last_event = 0.0  # time of the last non-sample event: the replay's end
        self._queued: set[str] = set()  # core job ids waiting in the core's queue
        self._busy = 0  # nodes with at least one job
        self.busy_nodes: list[tuple[float, int]] = [(0.0, 0)]
        # Dependencies (JobSpec.after) by workload job id, resolved by the master's own code.
        self._facts = _SimFacts(self)
        self.dependencies = DependencyGate(self._facts, self.core.set_gate, self.core.jobs.get)
        self._versions = 0  # EXIT events' run versions (see _reprice)

    # -- event heap ----------------------------------------------------------------------
    def _push(self, time: float, kind: int, payload: object) -> None:
        self._seq += 1
        if kind != SAMPLE:
            self._pending += 1
        heapq.heappush(self._heap, (time, kind, self._seq, payload))

    def _seed_events(self) -> None:
        jobs = self.workload.jobs
        for index, job in enumerate(jobs):
            self._push(job.submit, ARRIVAL, index)
        horizon = jobs[-1].submit if jobs else 0.0
        failures = self.config.failures
        if failures is not None:
            for name in sorted(self.inventories):
                r = self.truth.rng(name, "failure")
                t = r.expovariate(1.0 / (failures.mtbf_hours * 3600.0))
                while t < horizon:
                    self._push(t, FAIL, name)
                    repair = failures.repair_hours * 3600.0
                    self._push(t + repair, RECOVER, name)
                    t += repair + r.expovariate(1.0 / (failures.mtbf_hours * 3600.0))
        for when, act in self.calendar.events(self._node_jobs):
            self._push(when, CALL, act)
        for outage in self.config.outages:
            if outage.node not in self.inventories:
                raise SimulationError(f"outage names unknown node {outage.node!r}")
            self._push(outage.start, FAIL, outage.node)
            self._push(outage.start + outage.duration, RECOVER, outage.node)
        interval = self.config.sample_interval
        if interval is None:
            interval = max(60.0, horizon / 500.0)
        if interval <= 0:
            raise SimulationError(f"sample interval must be positive, got {interval:g}")
        self._sample_interval = interval
        self._push(0.0, SAMPLE, None)

    # -- main loop -----------------------------------------------------------------------
    def run(self) -> SimResult:
        for node in self.workload.nodes:
            self.core.node_up(node)
        self._seed_events()
        total = len(self.workload.jobs)
        heap = self._heap
        instant = -math.inf
        passes_here = 0
        while heap:
            t = heap[0][0]
            if t < self.now:
                raise SimulationError(f"event at {t} precedes the clock {self.now}")
            self.now = t
            if t == instant:
                passes_here += 1
                if passes_here > self.config.max_passes_per_instant:
                    raise SimulationError(
                        f"policy {self.policy.name} made {passes_here} passes at t={t:g} "
                        "without time advancing"
                    )
            else:
                instant, passes_here = t, 0
            scheduling = False
            sample = False
            while heap and heap[0][0] == t:
                _, kind, _, payload = heapq.heappop(heap)
                if kind == SAMPLE:
                    sample = True
                    continue
                self._pending -= 1
                if kind == EXIT:
                    happened = self._on_exit(*payload)  # type: ignore[misc]
                elif kind == ARRIVAL:
                    happened = self._on_arrival(self.workload.jobs[payload])  # type: ignore[index]
                elif kind == STOP:
                    happened = self._on_stop(*payload)  # type: ignore[misc]
                elif kind == LIMIT:
                    happened = self._on_limit(*payload)  # type: ignore[misc]
                elif kind == START:
                    happened = self._on_start(*payload)  # type: ignore[misc]
                elif kind == FAIL:
                    happened = self._on_fail(payload)  # type: ignore[arg-type]
                elif kind == CALL:
                    happened = payload()  # type: ignore[operator]
                else:
                    happened = self._on_recover(payload)  # type: ignore[arg-type]
                if happened:
                    # Superseded exits and stops of finished attempts change nothing: they
                    # neither count as events nor trigger a pass.
                    self.events += 1
                    self._last_event = t
                    scheduling = True
                else:
                    self.stale_events += 1
            if scheduling:
                self._schedule(t)
                self._note_usage(t)
            if sample:
                self._sample(t)
                if self._pending or self._runs:
                    self._push(t + self._sample_interval, SAMPLE, None)
            if self.progress is not None and scheduling:
                self.progress(t, self._done, total)
        return self._result()

    # -- handlers ------------------------------------------------------------------------
    def _declared_spec(self, job: SimJob) -> JobSpec:
        sigma = self.config.prediction_error
        spec = job.spec
        if sigma <= 0 or spec.iterations is None:
            return spec
        factor = math.exp(self.truth.rng(job.id, "prediction").gauss(0.0, sigma))
        return replace(spec, iterations=max(1, round(spec.iterations * factor)))

    def _on_arrival(self, job: SimJob) -> bool:
        spec = self._declared_spec(job)
        truth = self.truth.job_truth(job.id, spec.kind, spec.gpus, job.truth, self.topology)
        if job.deadline is not None:
            ect = job.deadline
        elif spec.qos is QosClass.URGENT:
            ect = job.submit
        elif spec.qos is QosClass.PRIOR:
            ect = job.submit + truth.lat11
        else:
            ect = job.submit + 2.0 * truth.lat11
        record = JobRecord(
            id=job.id, tenant=spec.tenant, qos=spec.qos, kind=spec.kind, gpus=spec.gpus,
            submit=job.submit, ect=ect, lat11=truth.lat11,
        )
        if job.id in self.records:
            raise SimulationError(f"job id {job.id} appears twice in workload")
        self.records[job.id] = record
        self._truth_of[job.id] = truth
        self._spec_of[job.id] = spec
        if spec.array is not None:
            self.dependencies.book.add_task(job.id, spec.array)
        reason = self.core.unsatisfiable(spec)
        if reason is not None:
            record.state = "rejected"
            record.reason = reason
            self._done += 1
            log.debug("job_rejected job=%s reason=%s", job.id, reason)
            self._dependency_ended(job.id, JobState.FAILED)
            return False
        unknown = [t for term in spec.after for t in term.jobs
                   if self._facts.state(t) is None and self._facts.array(t) is None]
        if unknown:
            # As the master refuses a submission naming an id it does not know.
            record.state = "rejected"
            record.reason = (f"dependency names {unknown[0]}, which no job submitted before it "
                             "has")
            self._done += 1
            self._dependency_ended(job.id, JobState.FAILED)
            return False
        self._record_of[job.id] = record
        self._submit(Job(id=job.id, spec=spec, submit_time=self.now,
                         annotations=dict(job.annotations)))
        self._queued.add(job.id)
        if spec.after:
            self._act(self.dependencies.resolve(self.core.jobs[job.id], first=True))
        return True

    # -- dependencies (masterd.core.dependencies, as the master's feature drives it) ------
    def _act(self, outcome: Outcome) -> None:
        """A dependency that can never hold cancels the job, as the master's feature does."""
        if outcome.status is Status.NEVER:
            transition, _ = self.core.cancel(outcome.job.id, self.now, outcome.sentence)
            self._settle(outcome.job.id, transition)

    def _dependency_ended(self, record_id: str, state: JobState) -> None:
        """A workload job ended for good: resolve the jobs that wait for it again."""
        spec = self._spec_of.get(record_id)
        task = spec.array if spec is not None else None
        for outcome in self.dependencies.ended(record_id, task, state):
            self._act(outcome)

    def _submit(self, job: Job) -> None:
        if self.annotator is not None:
            self.annotator.submitted(job, self.now)
        self.core.submit(job)

    def _schedule(self, now: float) -> None:
        self._schedule_once(now)
        # Quota admission held starts back and asks for another pass at once (see
        # SchedulingCore.schedule); each such pass gates at least one job, so this ends.
        for _ in range(_FOLLOW_UPS if self.core.admission is not None else 0):
            if self.core.wake_at is None or self.core.wake_at > now:
                break
            self._schedule_once(now)
        wake = self.core.wake_at
        if wake is not None and wake > now and wake not in self._wakes:
            self._wakes.add(wake)
            self._push(wake, CALL, self._woken)

    def _woken(self) -> bool:
        self.wakes += 1
        return True  # a pass follows, as after any event

    def _schedule_once(self, now: float) -> None:
        self.calendar.before_pass(now)
        decisions = self.core.schedule(now)
        self.passes += 1
        queue = self.core.queue()
        if queue:
            head = self._record_of.get(queue[0].id)  # (an extension's own jobs have none)
            if head is not None and head.head_since is None:
                head.head_since = now
        for decision in decisions:
            if isinstance(decision, Start):
                self._launch(decision.job_id, decision.placement, now)
            elif isinstance(decision, Preempt):
                job = self.core.jobs[decision.job_id]
                self._push(now + self.config.stop_delay, STOP, (decision.job_id, job.attempts))

    def _launch(self, job_id: str, placement: Placement, now: float) -> None:
        record = self._record_of[job_id]
        record.attempts += 1
        self._queued.discard(job_id)
        self._placements[job_id] = placement
        self.calendar.placed(placement, now, +1)
        for node in placement.nodes:
            if not self._node_jobs[node]:
                self._note_busy(now, +1)
            self._node_jobs[node].add(job_id)
        self._allocated += placement.gpu_count
        if self.config.start_delay > 0:
            self._push(now + self.config.start_delay, START,
                       (job_id, self.core.jobs[job_id].attempts))
        else:
            self._begin(job_id, now)

    def _on_start(self, job_id: str, attempt: int) -> bool:
        job = self.core.jobs.get(job_id)
        if job is None or job.state is not JobState.STARTING or job.attempts != attempt:
            return False  # stopped or failed before its start landed
        self._begin(job_id, self.now)
        return True

    def _begin(self, job_id: str, now: float) -> None:
        for node in self._placements[job_id].nodes:
            self.core.node_started(job_id, node, now)
        job = self.core.jobs[job_id]
        stop_at = deadlines(job.spec, now).stop_at
        if stop_at is not None:
            self._push(stop_at, LIMIT, (job_id, job.attempts))
        record = self._record_of[job_id]
        if record.first_start is None:
            record.first_start = now
        truth = self._truth_of[record.id]
        placement = self._placements[job_id]
        shape = shape_of(placement, self.inventories)
        record.gpus_used = shape.gpus
        record.nodes_used = len(placement.nodes)
        if self.fairshare is not None:
            self.fairshare.started(job_id, job.spec.tenant, placement.gpu_count,
                                   sum(len(a.cpus) for a in placement.allocations),
                                   sum(a.memory_mib for a in placement.allocations), now)
        work = self._progress_of.pop(record.id, truth.work)
        run = _Run(
            job_id=job_id, truth=truth, shape=shape, placement=placement, started=now,
            work_left=work, startup_end=now + truth.startup_s, t_last=now,
        )
        self._runs[job_id] = run
        for key in shape.switches:
            self._switch_jobs.setdefault(key, set()).add(job_id)
        if shape.multi_node:
            for node in shape.nodes:
                self._net_jobs.setdefault(node, set()).add(job_id)
        self._reprice(run, now)
        for other in sorted(self._neighbours(run)):
            self._reprice(self._runs[other], now)

    def _neighbours(self, run: _Run) -> set[str]:
        found: set[str] = set()
        for key in run.shape.switches:
            found |= self._switch_jobs.get(key, set())
        if run.shape.multi_node:
            for node in run.shape.nodes:
                found |= self._net_jobs.get(node, set())
        found.discard(run.job_id)
        return found

    def _reprice(self, run: _Run, now: float) -> None:
        self._advance(run, now)
        shape = run.shape
        pcie = 0
        if shape.switches:
            others: set[str] = set()
            for key in shape.switches:
                others |= self._switch_jobs.get(key, set())
            pcie = len(others) - (run.job_id in others)
        net = 0
        if shape.multi_node:
            others = set()
            for node in shape.nodes:
                others |= self._net_jobs.get(node, set())
            net = len(others) - (run.job_id in others)
        speed, efficiency = self.truth.speed_and_efficiency(run.truth, shape, pcie, net)
        speed, efficiency = self._adjust(run, speed, efficiency)
        self._effective += (efficiency - run.efficiency) * shape.gpus
        run.efficiency = efficiency
        if speed == run.speed and run.finish != math.inf:
            return
        run.speed = speed
        # Unique over every run of every job: a requeued or preempted job runs again under
        # the same id, and its earlier run's pending EXIT must not match the new run.
        self._versions += 1
        run.version = self._versions
        run.finish = max(now, run.startup_end) + run.work_left / speed
        self._push(run.finish, EXIT, (run.job_id, run.version))

    def _adjust(self, run: _Run, speed: float, efficiency: float) -> tuple[float, float]:
        """Speed and GPU busy share after what an extension models beyond placement and
        interference (CPU cores, memory bandwidth, query load: sim/soda.py); as is here."""
        return speed, efficiency

    @staticmethod
    def _advance(run: _Run, now: float) -> None:
        if now <= run.t_last:
            return
        active_from = max(run.t_last, run.startup_end)
        if now > active_from and run.speed > 0:
            run.work_left = max(0.0, run.work_left - (now - active_from) * run.speed)
        run.t_last = now

    def _end_run(self, job_id: str, now: float) -> _Run | None:
        """Take a job attempt out of the truth model (finished, stopped or failed)."""
        run = self._runs.pop(job_id, None)
        if self.fairshare is not None:
            self.fairshare.stopped(job_id, now)
        if run is not None:
            self._advance(run, now)
            for key in run.shape.switches:
                self._switch_jobs[key].discard(job_id)
            if run.shape.multi_node:
                for node in run.shape.nodes:
                    self._net_jobs[node].discard(job_id)
            self._effective -= run.efficiency * run.shape.gpus
            record = self._record_of[job_id]
            record.run_time += now - run.started
            for other in sorted(self._neighbours(run)):
                self._reprice(self._runs[other], now)
        placement = self._placements.pop(job_id, None)
        if placement is not None:
            self.calendar.placed(placement, now, -1)
            for node in placement.nodes:
                self._node_jobs[node].discard(job_id)
                if not self._node_jobs[node]:
                    self._note_busy(now, -1)
            self._allocated -= placement.gpu_count
        return run

    def _on_exit(self, job_id: str, version: int) -> bool:
        run = self._runs.get(job_id)
        if run is None or run.version != version:
            return False  # superseded by a re-pricing, or the attempt was stopped
        self._end_run(job_id, self.now)
        transition = None
        for node in run.placement.nodes:
            transition, _ = self.core.node_exited(job_id, node, 0, None, self.now)
        self._settle(job_id, transition)
        return True

    def _on_stop(self, job_id: str, attempt: int) -> bool:
        job = self.core.jobs.get(job_id)
        if job is None or job.state.terminal or job.attempts != attempt:
            return False
        if job.state is JobState.QUEUED:
            return False
        run = self._end_run(job_id, self.now)
        record = self._record_of[job_id]
        if run is not None and self.config.preempt_keeps_progress:
            self._progress_of[record.id] = run.work_left
        transition = None
        for node, state in list(job.node_states.items()):
            if state != "exited":
                transition, _ = self.core.node_exited(
                    job_id, node, None, int(signal.SIGTERM), self.now
                )
        if transition is not None and transition.state is JobState.QUEUED:
            record.preemptions += 1
        self._settle(job_id, transition)
        return True

    def _on_limit(self, job_id: str, attempt: int) -> bool:
        """A job reached its time limit: stopped through the core into ``timeout``."""
        job = self.core.jobs.get(job_id)
        if (job is None or job.state is not JobState.RUNNING or job.attempts != attempt
                or job.stopping):
            return False  # ended, re-queued or being stopped already
        _, nodes = self.core.stop(job_id, JobState.TIMEOUT, stop_reason(job.spec), self.now)
        self._end_run(job_id, self.now)
        transition = None
        for node in nodes:
            transition, _ = self.core.node_exited(job_id, node, None, int(signal.SIGTERM),
                                                  self.now)
        self._settle(job_id, transition)
        return True

    def _on_fail(self, node: str) -> bool:
        if node in self._down:
            return False  # overlapping outages: already down
        self.core.node_down(node)
        self._down.add(node)
        rules = RequeueRules(self.config.requeue_default, self.config.max_retries)
        cause = node_lost_cause(node, None)
        # The master's order and rules (masterd/features/nodeloss.py), with the loss at
        # once: a replay has no silence to wait out.
        for job in jobs_on_node(self.core.active_jobs().values(), node):
            job_id = job.id
            self._end_run(job_id, self.now)
            requeued = False
            if job.stopping:  # being preempted or stopped already: that end stands
                transition = None
                others = [n for n, s in job.node_states.items() if s != "exited"]
            else:
                found = verdict(job, cause, rules)
                requeued = found.requeue
                if requeued:
                    transition, others = self.core.requeue(job_id, found.reason, self.now)
                else:
                    transition, others = self.core.stop(job_id, JobState.NODE_LOST,
                                                        found.reason, self.now)
            lost, _ = self.core.node_exited(job_id, node, None, int(signal.SIGKILL), self.now)
            transition = transition or lost
            for other in others:
                if other != node:
                    transition, _ = self.core.node_exited(
                        job_id, other, None, int(signal.SIGTERM), self.now)
            if requeued:
                self._record_of[job_id].retries += 1
            self._settle(job_id, transition)
        log.debug("node_failed node=%s t=%g", node, self.now)
        return True

    def _on_recover(self, node: str) -> bool:
        if node not in self._down:
            return False
        self._down.discard(node)
        self.core.node_up(self.inventories[node])
        return True

    def _settle(self, job_id: str, transition: object) -> None:
        """Record a job's terminal transition (or resubmit it after a node failure)."""
        job = self.core.jobs[job_id]
        record = self._record_of[job_id]
        if job.state is JobState.QUEUED:
            # Preempted, its start failed, or requeued after a node failure: queued again.
            self._queued.add(job_id)
            return
        if not job.state.terminal:
            return
        # Ended, in whichever state (finished, failed, cancelled, timeout, node_lost).
        record.end = self.now
        record.state = job.state.value
        if job.state is JobState.FINISHED:
            if self.annotator is not None and job.start_time is not None:
                self.annotator.finished(job, self.now - job.start_time)
        else:
            record.reason = job.reason
        self._queued.discard(job_id)
        self._done += 1
        self._dependency_ended(record.id, job.state)

    # -- observation ---------------------------------------------------------------------
    def _note_busy(self, t: float, change: int) -> None:
        self._busy += change
        if self.busy_nodes[-1][0] == t:
            self.busy_nodes[-1] = (t, self._busy)
        else:
            self.busy_nodes.append((t, self._busy))

    def _note_usage(self, t: float) -> None:
        last = self.usage[-1]
        effective = max(self._effective, 0.0)
        if last[1] == self._allocated and abs(last[2] - effective) < 1e-9:
            return
        if last[0] == t:
            self.usage[-1] = (t, self._allocated, effective)
        else:
            self.usage.append((t, self._allocated, effective))

    def _sample(self, t: float) -> None:
        frag_sum = 0.0
        counted = 0
        for name, inv in self.inventories.items():
            n = len(inv.gpus)
            if n == 0:
                continue
            counted += 1
            jobs = self._node_jobs[name]
            if not jobs:
                continue
            remaining = [0.0] * n
            position = {g.index: i for i, g in enumerate(inv.gpus)}
            for job_id in jobs:
                run = self._runs.get(job_id)
                if run is None:
                    continue
                left = max(0.0, run.finish - t)
                for alloc in run.placement.allocations:
                    if alloc.node == name:
                        for g in alloc.gpus:
                            remaining[position[g]] = left
            frag_sum += fragmentation(remaining)
        self.samples.append(
            Sample(
                time=t,
                allocated_gpus=self._allocated,
                effective_gpus=max(self._effective, 0.0),
                queued=len(self._queued),
                running=len(self._runs),
                fragmentation=frag_sum / counted if counted else 0.0,
                nodes_down=len(self._down),
            )
        )

    def _result(self) -> SimResult:
        for record in self.records.values():
            if record.state == "pending":
                record.state = "unfinished"
                record.reason = "still queued or running when no event was left"
        return SimResult(
            policy=self.policy.name,
            workload=self.workload.name,
            seed=self.config.seed,
            records=list(self.records.values()),
            total_gpus=self.total_gpus,
            usage=self.usage,
            samples=self.samples,
            events=self.events,
            passes=self.passes,
            stale_events=self.stale_events,
            end_time=self._last_event,
            notes=dict(self.workload.notes),
            busy_nodes=self.busy_nodes,
            total_nodes=len(self.inventories),
            watched_usage=self.calendar.watched,
            running_at_window_start=dict(self.calendar.running_at_start),
        )


_RECORD_STATES = {"finished": JobState.FINISHED, "failed": JobState.FAILED,
                  "rejected": JobState.FAILED, "cancelled": JobState.CANCELLED,
                  "node_lost": JobState.NODE_LOST, "timeout": JobState.TIMEOUT}


class _SimFacts:
    """What dependencies see of workload jobs: each record's outcome (a rejected job counts
    as failed), or its attempt's state while it is pending."""

    def __init__(self, sim: Simulator) -> None:
        self._sim = sim

    def state(self, job_id: str) -> JobState | None:
        record = self._sim.records.get(job_id)
        if record is None:
            return None
        ended = _RECORD_STATES.get(record.state)
        if ended is not None:
            return ended
        job = self._sim.core.jobs.get(job_id)
        if job is not None and not job.state.terminal:
            return job.state
        return JobState.QUEUED  # between attempts (resubmitted after a node failure)

    def array(self, array_id: str) -> ArrayTasks | None:
        return self._sim.dependencies.book.arrays.get(array_id)


def simulate(
    workload: Workload,
    policy: Policy,
    config: SimConfig | None = None,
    progress: ProgressFn | None = None,
    annotator: Annotator | None = None,
    fairshare: FairShare | None = None,
) -> SimResult:
    return Simulator(workload, policy, config, progress, annotator, fairshare).run()

