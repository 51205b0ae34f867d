"""The master's events, which features subscribe to instead of the master calling them.

Two kinds of hook:

* :class:`Signal` — a notification. Subscribers run in subscription order; one that raises
  is logged and the others still run, so a broken feature cannot stop the master from
  recording a job's end or starting the next pass.
* :class:`Check` — a veto. Subscribers run in order and the first :class:`JobError` (or any
  other exception) reaches the caller: a submission one feature refuses is refused.

And one slot, :class:`Provider`, for a question exactly one feature answers (the adaptive
CPU allocator's launch plan); unanswered, it gives its default.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, ParamSpec, TypeVar

from masterd.core.fencing import Judgement
from masterd.core.scheduler import JobError, Transition
from shared.accounts import AccountTree
from shared.messages import CorePlan, GpuHealth, Hello, JobExited, JobMetric, JobReport
from shared.model import Job, JobSpec, NodeAllocation, NodeInventory
from shared.nodelease import LeaseTerms

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")

log = logging.getLogger("trellis.master.events")


class Signal(Generic[P]):
    """Synchronous notification: ``emit`` calls every subscriber, isolating failures."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._subscribers: list[Callable[P, None]] = []

    def subscribe(self, fn: Callable[P, None]) -> None:
        self._subscribers.append(fn)

    def emit(self, *args: P.args, **kwargs: P.kwargs) -> None:
        for fn in self._subscribers:
            try:
                fn(*args, **kwargs)
            except Exception:
                log.exception("event=%s subscriber=%s failed", self.name, _name(fn))

    def __len__(self) -> int:
        return len(self._subscribers)


class AsyncSignal(Generic[P]):
    """Like :class:`Signal` for coroutine subscribers, awaited one after the other (in
    order: a subscriber may rely on an earlier one having seen the event)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._subscribers: list[Callable[P, Awaitable[None]]] = []

    def subscribe(self, fn: Callable[P, Awaitable[None]]) -> None:
        self._subscribers.append(fn)

    async def emit(self, *args: P.args, **kwargs: P.kwargs) -> None:
        for fn in self._subscribers:
            try:
                await fn(*args, **kwargs)
            except Exception:
                log.exception("event=%s subscriber=%s failed", self.name, _name(fn))

    def __len__(self) -> int:
        return len(self._subscribers)


class Check(Generic[P]):
    """A veto: every subscriber runs, and the first exception reaches the caller."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._subscribers: list[Callable[P, None]] = []

    def subscribe(self, fn: Callable[P, None]) -> None:
        self._subscribers.append(fn)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> None:
        for fn in self._subscribers:
            fn(*args, **kwargs)


class AsyncCheck(Generic[P]):
    """Like :class:`Check` for coroutine subscribers: awaited in order, the first exception
    reaches the caller (a look-up that failed must refuse, not pass silently)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._subscribers: list[Callable[P, Awaitable[None]]] = []

    def subscribe(self, fn: Callable[P, Awaitable[None]]) -> None:
        self._subscribers.append(fn)

    async def __call__(self, *args: P.args, **kwargs: P.kwargs) -> None:
        for fn in self._subscribers:
            await fn(*args, **kwargs)


class Screen(Generic[P]):
    """A check of a whole submission: every subscriber returns the jobs it refuses, by index
    (index -> JobError), and the caller gets them all (the first per index wins)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._subscribers: list[Callable[P, Mapping[int, JobError]]] = []

    def subscribe(self, fn: Callable[P, Mapping[int, JobError]]) -> None:
        self._subscribers.append(fn)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> dict[int, JobError]:
        refused: dict[int, JobError] = {}
        for fn in self._subscribers:
            for index, error in fn(*args, **kwargs).items():
                refused.setdefault(index, error)
        return refused


class Provider(Generic[P, R]):
    """A question one feature answers; ``default`` answers while none does."""

    def __init__(self, name: str, default: Callable[P, R]) -> None:
        self.name = name
        self._answer: Callable[P, R] = default
        self._provided = False

    def provide(self, fn: Callable[P, R]) -> None:
        if self._provided:
            raise RuntimeError(f"{self.name} is already provided")
        self._answer = fn
        self._provided = True

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self._answer(*args, **kwargs)


class Chain(Generic[T]):
    """A value passed through every subscriber in turn, each returning it (changed or not):
    the spec a submission is journalled with, completed by several features."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._steps: list[Callable[[T], T]] = []

    def provide(self, fn: Callable[[T], T]) -> None:
        self._steps.append(fn)

    def __call__(self, value: T) -> T:
        for fn in self._steps:
            value = fn(value)
        return value


def _no_core_plan(job: Job, alloc: NodeAllocation) -> CorePlan | None:
    return None


def _no_status(node: str) -> str | None:
    return None


def _no_lease() -> LeaseTerms | None:
    return None


def _not_requeued(job: Job) -> bool:
    return False


async def _not_settled(node: str, exited: JobExited) -> bool:
    return False


def _name(fn: Any) -> str:
    return getattr(fn, "__qualname__", repr(fn))


@dataclass
class MasterEvents:
    """Everything a feature can hear from the master, and the two ways it can answer."""

    # A submission (one job, or a submit_many batch) is about to be checked: (specs, the ids
    # given, None where the master names the job). An asynchronous look-up the checks below
    # need is done here (the journal's record of jobs no longer in memory); raise JobError
    # to refuse the whole submission.
    preparing: AsyncCheck[[Sequence[JobSpec], Sequence[str | None]]] = field(
        default_factory=lambda: AsyncCheck("preparing"))
    # A submission is being accepted: raise JobError to refuse it (before it is journalled).
    submitting: Check[[JobSpec]] = field(default_factory=lambda: Check("submitting"))
    # The submission as a whole, after each job's `submitting`: (specs, ids given) -> the
    # jobs refused, by index (what depends on other jobs: dependencies, cycles).
    screening: Screen[[Sequence[JobSpec], Sequence[str | None]]] = field(
        default_factory=lambda: Screen("screening"))
    # The jobs of an accepted submission have their ids, before they are journalled: (the
    # jobs, whether each id was given). A feature may replace a job's spec here (array
    # tasks the master names take their array's id from the first of them).
    reserved: Signal[[Sequence[Job], Sequence[bool]]] = field(
        default_factory=lambda: Signal("reserved"))
    # The tuning plan of one part of a job being launched (None: pin it as placed).
    core_plan: Provider[[Job, NodeAllocation], CorePlan | None] = field(
        default_factory=lambda: Provider("core_plan", _no_core_plan))
    # The spec a checked submission is journalled with: the master's defaults written into
    # what the submission left open (the accounts feature: the user's default account; the
    # time limit feature: default_time_limit_s), each feature in turn. Return the spec
    # itself when nothing changes.
    spec_defaults: Chain[JobSpec] = field(default_factory=lambda: Chain("spec_defaults"))
    # The account tree in force changed (restored from the journal, seeded from the
    # configuration, or changed by an admin): the accounts feature's tree, whole.
    accounts_changed: Signal[[AccountTree]] = field(
        default_factory=lambda: Signal("accounts_changed"))
    # SIGHUP applied a new configuration (read it with FeatureContext.config).
    config_changed: Signal[[]] = field(default_factory=lambda: Signal("config_changed"))
    # A submission was journalled and joined the queue (before any pass can see it): an
    # admission feature may close a gate on it here (JobActions.set_gate).
    job_submitted: Signal[[Job]] = field(default_factory=lambda: Signal("job_submitted"))
    # A job's spec was replaced (trellisctl update: qos, time limit, priority) and the change
    # journalled: (the job, its spec before).
    job_updated: Signal[[Job, JobSpec]] = field(default_factory=lambda: Signal("job_updated"))
    # The journal was read back and the core holds every restored job (before serving).
    restored: Signal[[]] = field(default_factory=lambda: Signal("restored"))
    # A scheduling pass is about to run (some cluster event happened).
    before_pass: Signal[[]] = field(default_factory=lambda: Signal("before_pass"))
    # A job changed state, and the change is journalled.
    job_transition: AsyncSignal[[Job, Transition]] = field(
        default_factory=lambda: AsyncSignal("job_transition"))
    # A job reached a terminal state (after job_transition).
    job_ended: Signal[[Job]] = field(default_factory=lambda: Signal("job_ended"))
    # An ended job is dropped from memory (finished_jobs_in_memory); its journal rows stay.
    job_forgotten: Signal[[Job]] = field(default_factory=lambda: Signal("job_forgotten"))
    # A job's report on its metrics channel, accepted by the master (node, job, metric).
    job_metric: Signal[[str, Job, JobMetric]] = field(
        default_factory=lambda: Signal("job_metric"))
    # A node says hello, before its session opens: raise JobError to refuse it (the code and
    # sentence go back to the node).
    hello_check: Check[[Hello]] = field(default_factory=lambda: Check("hello_check"))
    # A node said hello and its inventory replaced the master's record of it, before its
    # jobs' resources are claimed and its reports reconciled (node, inventory).
    node_inventory: AsyncSignal[[str, NodeInventory]] = field(
        default_factory=lambda: AsyncSignal("node_inventory"))
    # A node reports a job part that is not the master's (masterd.core.fencing.judge_part):
    # another incarnation, a job never placed there, an unknown one. In a hello or as a
    # job_started/job_exited event (node, the part as reported, the verdict).
    stray_part: AsyncSignal[[str, JobReport, Judgement]] = field(
        default_factory=lambda: AsyncSignal("stray_part"))
    # A node said hello and the master took it back: its jobs are reconciled (node).
    node_ready: Signal[[str]] = field(default_factory=lambda: Signal("node_ready"))
    # An event a node pushed that the master does not handle itself (node, decoded body).
    node_event: AsyncSignal[[str, Any]] = field(
        default_factory=lambda: AsyncSignal("node_event"))
    # A node's session ended (node, when it fell silent: the moment the session closed,
    # or when the last data came for a session the heartbeat ended): it is disconnected,
    # unreachable after node_grace_s.
    node_disconnected: Signal[[str, float]] = field(
        default_factory=lambda: Signal("node_disconnected"))
    # The status of a node without a session when a feature knows better than
    # "disconnected"/"unreachable" (the node loss feature: "down"); None: the master's own.
    node_status: Provider[[str], str | None] = field(
        default_factory=lambda: Provider("node_status", _no_status))
    # The status of a connected node taking work when a feature knows better than "ready"
    # (reservations: "reserved" while one holds it); None: "ready".
    ready_status: Provider[[str], str | None] = field(
        default_factory=lambda: Provider("ready_status", _no_status))
    # The inventory the master takes from a node (its hello, the journal on restore, or
    # NodeCommands.reinventory), each feature in turn: GPUs held out of service whatever the
    # node says (GPU faults), the partitions the configuration puts it in. Each step must
    # give the same inventory when applied twice.
    effective_inventory: Chain[NodeInventory] = field(
        default_factory=lambda: Chain("effective_inventory"))
    # A node reported a GPU's health changed, and the master applied it (node, event).
    gpu_health: AsyncSignal[[str, GpuHealth]] = field(
        default_factory=lambda: AsyncSignal("gpu_health"))
    # The node lease (masterd.features.selffence): the terms the ack of a node's hello
    # carries (None: none, and nodes stop nothing on their own) ...
    node_lease: Provider[[], LeaseTerms | None] = field(
        default_factory=lambda: Provider("node_lease", _no_lease))
    # ... whether the master would requeue a job being launched if a node of it were lost
    # (each of its parts is launched requeue_if_lost) ...
    requeue_if_lost: Provider[[Job], bool] = field(
        default_factory=lambda: Provider("requeue_if_lost", _not_requeued))
    # ... and a part a node stopped on its own, cut off from every master (node, its exit):
    # True when the job was settled as after a node loss and nothing more is to be recorded
    # of that exit; False: the master handles it as any exit.
    part_fenced: Provider[[str, JobExited], Awaitable[bool]] = field(
        default_factory=lambda: Provider("part_fenced", _not_settled))
