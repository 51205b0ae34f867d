"""What a feature of the master gets instead of the master: :class:`FeatureContext`.

A feature (GENIE's profiler, SODA's arrays, the inference placer, ...) needs a handful of
things from the master, and only those: the clock and the running configuration, the journal
(rows and events, written in order with everything else), a read-only view of the scheduling
core and a way to ask for a pass, the job actions every client has (submit, cancel, preempt)
plus the few a placer needs, node commands, supervised background tasks, and the master's
events. Handing it the whole master instead is how a scheduler becomes one 3,000-line class:
each feature starts reaching into the others' state and private methods.

The job and node actions are the master's bound methods, gathered in small frozen
dataclasses; tests give a feature a context built from small fakes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, TypeVar

from masterd.core.cluster import ClusterSnapshot, NodeView
from masterd.core.policy import Policy, Preempt
from masterd.core.profiling import unwrap
from masterd.core.quotas import QuotaAdmission
from masterd.core.scheduler import JobError, SchedulingCore
from masterd.journal.journal import Journal
from masterd.journal.store import Store, StoreError
from masterd.runtime.events import MasterEvents
from masterd.runtime.tasks import TaskSupervisor
from masterd.runtime.workers import WorkerPool
from shared.config import MasterConfig
from shared.model import Job, JobSpec, JobState, Placement
from shared.priorityclasses import ClassTable

T = TypeVar("T")

log = logging.getLogger("trellis.master")


class CoreView:
    """The scheduling core, read-only: what a feature may look at, never change.

    Jobs are the core's own objects (copying every job per look would cost more than the
    look); a feature changes a job only through :class:`JobActions`.
    """

    def __init__(self, core: SchedulingCore) -> None:
        self._core = core
        self.jobs: Mapping[str, Job] = MappingProxyType(core.jobs)

    @property
    def policy(self) -> Policy:
        """The policy as configured, without the wrappers the master adds (profiling)."""
        return unwrap(self._core.policy)

    @property
    def policy_name(self) -> str:
        return self._core.policy.name

    def job(self, job_id: str) -> Job | None:
        return self._core.jobs.get(job_id)

    def queue(self) -> Sequence[Job]:
        return self._core.queue()

    def active_jobs(self) -> Mapping[str, Job]:
        return self._core.active_jobs()

    def snapshot(self) -> ClusterSnapshot:
        return self._core.snapshot()

    def node(self, name: str) -> NodeView | None:
        return self._core.cluster.node(name)

    def nodes(self) -> Iterable[NodeView]:
        return self._core.cluster.views()

    def unsatisfiable(self, spec: JobSpec) -> str | None:
        """Why the cluster as registered can never run ``spec`` (None: it could, empty)."""
        return self._core.unsatisfiable(spec)

    def jobs_on(self, node: str) -> list[str]:
        return self._core.cluster.jobs_on(node)

    def active_on(self, node: str) -> list[Job]:
        """The starting and running jobs placed on ``node`` (O(its own jobs))."""
        return self._core.active_on(node)


class JournalPort:
    """The journal as features use it: their own tables and events, in the one write order.

    ``call`` runs ``fn(store, *args)`` as one transaction in the journal's writer, after every
    write issued before it. ``now`` runs it on this thread, for reading (and the repairs of a
    restore) before the master serves: nothing else writes then.
    """

    def __init__(self, journal: Journal, store: Store) -> None:
        self._journal = journal
        self._store = store

    def call(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        return self._journal.call(fn, *args)

    async def persist(self, jobs: list[Job], events: list[tuple]) -> None:
        """Journal jobs' rows and events ``(time, job, node, kind, detail)``."""
        try:
            await self._journal.update(jobs, events)
        except StoreError as exc:
            log.error("store write failed: %s", exc)
            raise

    def now(self, fn: Callable[..., T], *args: Any) -> T:
        return fn(self._store, *args)

    @property
    def location(self) -> str:
        """Where the journal is (a SQLite path or a PostgreSQL URL), for a worker process that
        reads the history itself (``masterd.journal.backends.open_reader``) rather than have
        it pickled through the event loop."""
        return self._store.location


@dataclass(frozen=True)
class JobActions:
    """What a feature may do to jobs; the master carries each out as it would for a client.

    Bound methods of the master, not the master: a feature holding this cannot reach
    anything else.
    """

    # Raise JobError unless jobs may run as this Unix user.
    check_user: Callable[[str], None]
    # Accept a job exactly as the submit RPC does (journalled before it returns).
    submit: Callable[..., Awaitable[Job]]
    # Cancel a job exactly as the cancel RPC does.
    cancel: Callable[[str], Awaitable[Job]]
    # Stop a running job and re-queue it at the head of its array, outside a policy pass;
    # False when it is not running or already stopping.
    preempt: Callable[[Preempt], bool]
    # Cancel a job that waits in the queue; the change is journalled in the background.
    drop_queued: Callable[[str], None]
    # (spec, placement, id prefix, reason) -> the job: start it on exactly that placement,
    # bypassing the queue and the policy but not the node filter or the quota permit. Its
    # resources are taken at once, the job is journalled and launched in the background; a
    # launch that fails ends it (it never waits in the queue). Raises JobError (a closed node,
    # over its account's limits, resources taken), before anything changed, when it cannot
    # be started.
    launch_placed: Callable[[JobSpec, Placement, str, str], Job]
    # (job, node, cpus): a running part now holds these cores there: a subset, or at launch
    # its cores plus free ones (the adaptive allocator widening it, masterd.core.widen).
    cores_changed: Callable[[str, str, tuple[int, ...]], None]
    # (job, reason), during the restore only: cancel a restored job, journalled at once.
    cancel_restored: Callable[[str, str], None]
    # (job, {key: value}): attach predictions to a job for the policy to read (Job.annotations;
    # keys are namespaced by feature, e.g. "liquid.gpu_util"), and ask for a pass. Not
    # journalled: the feature attaches them again after a restart. False: not in memory.
    annotate: Callable[[str, Mapping[str, float]], bool]
    # (job): a running job entered its post phase (Liquid §6.1: it saves its model); its GPUs
    # are lent for pre-scheduling (SchedulingCore.enter_post_phase), journalled. False when
    # the job is not running or was lent already.
    post_phase: Callable[[str], bool]
    # (job, gate, sentence or None): close or open one admission gate of a queued job (a
    # WaitReason value: held, dependency, time_limit, quota); see SchedulingCore.set_gate.
    # Raises JobError for an unknown job, or when closing a gate of a job not queued. Not
    # journalled: the caller journals what it changed and sets its gates again on restore.
    set_gate: Callable[[str, str, str | None], None] = lambda job, gate, reason: None
    # (job, end state, reason): end a job in ``end state`` (cancelled, timeout) as cancel
    # does: at once if queued, else its parts are stopped (SIGTERM, SIGKILL after the
    # job's grace) and it ends so once they exited. Journalled before it returns.
    stop: Callable[[str, JobState, str], Awaitable[Job]] | None = None
    # (job): a queued job's spec was replaced (its priority or QoS changed): move it to its
    # place in the queue (SchedulingCore.reorder).
    reorder: Callable[[str], None] = lambda job: None
    # (job, lost nodes, reason, end state or None): take a job off its nodes after a
    # failure. Its parts on the lost nodes count as exited, the others are stopped, and
    # once they exited it is queued again (end state queued: SchedulingCore.requeue, its
    # restarts + 1) or ends so (node_lost). None, or a job being stopped already: its end
    # stands and only the lost parts are counted. Journalled before any node is told.
    lose_parts: Callable[[str, Sequence[str], str, JobState | None],
                         Awaitable[Job]] | None = None
    # (admission or None): attach quota admission to the scheduling core, or detach it
    # (SchedulingCore.set_admission; masterd.features.accounts).
    set_admission: Callable[[QuotaAdmission | None], None] = lambda admission: None
    # (table): install priority classes in the scheduling core: the queue's order and the
    # preemption stage (SchedulingCore.set_priority_classes; masterd.features.priorityclasses).
    set_priority_classes: Callable[[ClassTable], None] = lambda table: None
    # (tiers): the partitions' priority tiers, the queue's order after the classes
    # (SchedulingCore.set_partition_tiers; masterd.features.partitions).
    set_partition_tiers: Callable[[Mapping[str, int]], None] = lambda tiers: None

    async def time_out(self, job: Job, reason: str) -> None:
        """Stop a running job into ``timeout`` with ``reason`` (its time limit, its
        reservation's end): SIGTERM, SIGKILL after its grace. A job ending already (being
        cancelled or preempted) keeps that ending; one that ended meanwhile is left."""
        if job.stopping or job.state.terminal:
            return
        if self.stop is None:
            raise RuntimeError("this master cannot stop jobs into a state of their own")
        log.info("job=%s %s; stopping it", job.id, reason)
        try:
            await self.stop(job.id, JobState.TIMEOUT, reason)
        except JobError as exc:
            log.debug("job=%s not stopped (%s): %s", job.id, reason, exc)


@dataclass(frozen=True)
class NodeCommands:
    # (node, command type, body, timeout_s=None) -> the node's answer; raises CommandFailed
    # when the node is not connected, refuses or does not answer in time (timeout_s, else
    # the master's command_timeout_s: a command that waits on the node gives its own).
    send: Callable[..., Awaitable[dict[str, Any]]]
    # ready, drained, disconnected or unreachable; or the node's power state, if it has one.
    status: Callable[[str], str]
    # (node, state, reason): set a node's power state, or clear it (None: the node is on),
    # for Cluster Energy Saving (masterd.features.helios.power). States: powering_down,
    # powered_down, powering_up. Nothing is placed on a node with a power state; the state is
    # journalled with an event, survives a restart and is the node's status (trellisctl
    # nodes). powering_down is refused (JobError) for a node running any job or drained.
    set_power: Callable[[str, str | None, str], Awaitable[None]] = (
        lambda node, state, reason: _no_power())
    # node -> its power state, or None.
    power_state: Callable[[str], str | None] = lambda node: None
    # (node, GPU index, healthy): set a GPU's health in the master's view of the node (a
    # GPU returned to service by an operator) and ask for a pass.
    gpu_health: Callable[[str, int, bool], None] = lambda node, index, healthy: None
    # (node, kind, reason or None): set or clear one of a node's conditions (the
    # maintenance feature's, masterd/core/conditions.py), and ask for a pass.
    set_condition: Callable[[str, str, str | None], None] = lambda node, kind, reason: None
    # (node): take the node's inventory through events.effective_inventory again and ask
    # for a pass: a feature's view of the node changed (its partitions were reconfigured).
    reinventory: Callable[[str], None] = lambda node: None
    # The leadership epoch this master commands nodes at (every command carries it).
    epoch: Callable[[], int] = lambda: 0
    # (node, frame type, body): send a frame that is not a command (no ack awaited): the
    # bytes of a relayed stream (shared/relay.py). Dropped when the node is not connected.
    push: Callable[[str, str, dict[str, Any]], Awaitable[None]] = (
        lambda node, type_, body: _no_push())


async def _no_push() -> None:
    return None


async def _no_power() -> None:
    raise RuntimeError("this master does not manage node power")


class Workers:
    """The master's worker processes for CPU-heavy work (training, forecasting, fitting),
    started on first use: most masters never train, and a process costs memory.

    ``run`` raises what the function raised, ``WorkerBusy`` when the queue is full (a
    periodic retrainer skips that round), ``WorkerDied``/``WorkerClosed`` otherwise; see
    :mod:`masterd.runtime.workers`.
    """

    def __init__(self, processes: int = 1, max_queued: int = 4) -> None:
        self._pool = WorkerPool(processes=processes, max_queued=max_queued,
                                name="trellis-master-worker")
        self._started: asyncio.Future[None] | None = None

    async def run(self, fn: Callable[..., T], *args: Any, name: str | None = None) -> T:
        if self._started is None:
            self._started = asyncio.ensure_future(self._pool.start())
        await asyncio.shield(self._started)
        return await self._pool.run(fn, *args, name=name)

    @property
    def pool(self) -> WorkerPool:
        return self._pool

    async def close(self) -> None:
        if self._started is not None:
            await self._pool.close()


@dataclass(frozen=True)
class FeatureContext:
    """Everything a feature of the master may use."""

    clock: Callable[[], float]
    # The running configuration (SIGHUP may replace it: read it when needed, do not keep it).
    config: Callable[[], MasterConfig]
    journal: JournalPort
    core: CoreView
    request_pass: Callable[[], None]
    jobs: JobActions
    nodes: NodeCommands
    tasks: TaskSupervisor
    events: MasterEvents
    workers: Workers

    def pass_every(self, seconds: float, name: str) -> bool:
        """Ask for a scheduling pass every ``seconds``, for a feature whose state moves with
        time alone (maintenance windows, reservations: their ``before_pass`` refresh then
        runs). False outside a running loop (a restore in tests): ask again later."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return False
        self.tasks.every(seconds, self.request_pass, name)
        return True
