"""The job state machine and scheduling pass shared by masterd and the simulator.

``SchedulingCore`` owns the jobs, the queue and the cluster accounting. Drivers feed it events
(``submit``, ``node_started``, ``node_exited``, ...) with the time they happened and call
``schedule(now)``; it returns the decisions it applied, which the driver carries out (real
node commands in masterd, virtual completions in the simulator).
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Protocol, overload

from masterd.core.cluster import AllocationError, ClusterSnapshot, ClusterState
from masterd.core.conditions import DISCONNECTED, DRAINED, NodeCondition, NodeConditions
from masterd.core.eligibility import eligible, selects
from masterd.core.placement import fits_cluster
from masterd.core.policy import PREEMPTED_PREFIX, Decision, Policy, Preempt, Start
from masterd.core.preemption import PriorityPreemption
from masterd.core.profiling import unwrap
from shared.model import (
    Job,
    JobSpec,
    JobState,
    NodeAllocation,
    NodeInventory,
    Placement,
    WaitReason,
)
from shared.priorityclasses import ClassTable

# The order in which a job's admission gates are reported (the first one that holds it is
# its wait reason): what the user can act on first.
_GATE_ORDER = {code.value: rank for rank, code in enumerate(WaitReason)}
_QueueKey = tuple[int, int, int, int, float, int]


class Admission(Protocol):
    """Quota admission's hooks (masterd.core.quotas.QuotaAdmission), called by the core as
    jobs enter and leave the queue and their resources."""

    def bind(self, core: SchedulingCore) -> None: ...
    def queued(self, job: Job) -> None: ...
    def ordered(self, job: Job, key: tuple[int, int, int, float, int]) -> None: ...
    def dequeued(self, job: Job) -> None: ...
    def admit(self, job: Job, placement: Placement) -> str | None: ...
    def permits(self, job: Job, placement: Placement) -> str | None: ...
    def within_quota(self, job: Job) -> bool: ...
    def started(self, job: Job) -> None: ...
    def released(self, job: Job) -> None: ...
    def recheck(self) -> None: ...
    def reclaim(self, snapshot: ClusterSnapshot, queue_order: Mapping[str, object]
                ) -> list[Preempt | Reorder]: ...


@dataclass(frozen=True)
class Reorder:
    """Admission moved a queued job's ``requeue_priority``: refile it in the queue."""

    job_id: str


class JobError(ValueError):
    """A request about a job that cannot be honoured; ``code`` is the wire error code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Transition:
    """A job state change the driver should record (and act on)."""

    job_id: str
    state: JobState
    reason: str = ""
    # The journal row's kind when it is not the state's name ("requeued": queued again
    # after a failure, SchedulingCore.requeue).
    event: str = ""


class QueueView(Sequence[Job]):
    def __init__(self, ordered: list[tuple[_QueueKey, str]],
                 jobs: dict[str, Job]) -> None:
        self._ordered = ordered
        self._jobs = jobs

    def __len__(self) -> int:
        return len(self._ordered)

    @overload
    def __getitem__(self, index: int) -> Job: ...
    @overload
    def __getitem__(self, index: slice) -> list[Job]: ...
    def __getitem__(self, index: int | slice) -> Job | list[Job]:
        if isinstance(index, slice):
            return [self._jobs[job_id] for _, job_id in self._ordered[index]]
        return self._jobs[self._ordered[index][1]]

    def __iter__(self) -> Iterator[Job]:
        jobs = self._jobs
        for _, job_id in self._ordered:
            yield jobs[job_id]


class SchedulingCore:
    def __init__(self, policy: Policy, max_start_failures: int = 3) -> None:
        self.policy = policy
        self.max_start_failures = max_start_failures
        self.cluster = ClusterState()
        # Why each closed node takes no new work; a node with none is schedulable.
        self.conditions = NodeConditions()
        self.jobs: dict[str, Job] = {}
        self._queued: dict[str, Job] = {}
        self._active: dict[str, Job] = {}  # starting or running
        # node -> restored active jobs placed there whose resources its hello has not
        # claimed yet (claim_restored); with the cluster's own index, active_on(node).
        self._unclaimed: dict[str, dict[str, None]] = {}
        # Queued jobs an admission gate keeps from the policy (held, waiting for a
        # dependency, over a cap): state queued, not in the queue the policy sees.
        self._blocked: dict[str, Job] = {}
        self._seq = itertools.count()
        # Queue order kept sorted as jobs come and go: sorting every pass would cost
        # O(n log n) per event on a queue of thousands.
        self._order: dict[str, _QueueKey] = {}
        self._ordered: list[tuple[_QueueKey, str]] = []
        # Queued jobs whose reason is a policy's note from the last pass (see schedule()).
        self._noted: set[str] = set()
        # fits_cluster reads only a few spec fields and the nodes' inventories: one scan of
        # every node per submission was a tenth of the submit RPC's cost on 100 nodes.
        self._fit_cache: dict[tuple[object, ...], str | None] = {}
        self._fit_inventory = -1
        # When the policy wants a pass although nothing happens (a batch window closing), as
        # of the last pass: the master sets a timer, the simulator an event.
        self.wake_at: float | None = None
        # Quota admission (masterd/core/quotas.py), when accounts are on: its hooks run as
        # jobs enter and leave the queue and their resources.
        self.admission: Admission | None = None
        self._last_notes: Mapping[str, str] = {}
        # When the pass asked for a follow-up pass (admission), so that one asks for none.
        self._follow_up_at: float | None = None
        # Priority classes (shared/priorityclasses.py): the queue's first key, and the
        # preemption stage when a class may preempt (masterd/core/preemption.py).
        self.classes = ClassTable()
        # Partitions' priority tiers (only those not 0): the queue's second key.
        self.partition_tiers: dict[str, int] = {}
        self.preemption: PriorityPreemption | None = None

    def set_partition_tiers(self, tiers: Mapping[str, int]) -> None:
        """Install the partitions' priority tiers (Slurm's PriorityTier; only those not 0):
        the queue is re-ordered by them, after the priority classes."""
        if dict(tiers) == self.partition_tiers:
            return
        self.partition_tiers = dict(tiers)
        for job_id in list(self._queued):
            self.reorder(job_id)

    def _partition_tier(self, spec: JobSpec) -> int:
        tiers = self.partition_tiers
        if not tiers or not spec.selector.partitions:
            return 0
        return max(tiers.get(name, 0) for name in spec.selector.partitions)

    def set_priority_classes(self, table: ClassTable) -> None:
        """Install (or replace) the priority classes: the queue is re-ordered by them and
        the preemption stage runs while any class may preempt; nominations carry over."""
        self.classes = table
        if table.preempting_floor is not None:
            if self.preemption is None:
                self.preemption = PriorityPreemption(table, self._within_quota)
            else:
                self.preemption.table = table
            self.preemption.rebuild(self._active.values())
        else:
            self.preemption = None
        for job_id in list(self._queued):
            self.reorder(job_id)

    def _holds(self, job: Job) -> None:
        """A job took resources (started, or restored running): what counts them hears."""
        if self.admission is not None:
            self.admission.started(job)
        if self.preemption is not None:
            self.preemption.started(job)

    def _gives_back(self, job: Job) -> None:
        """A job's resources were released."""
        if self.admission is not None:
            self.admission.released(job)
        if self.preemption is not None:
            self.preemption.released(job)

    def _within_quota(self, job: Job) -> bool:
        return self.admission is not None and self.admission.within_quota(job)

    def set_admission(self, admission: Admission | None) -> None:
        """Attach (or detach: None) quota admission; the jobs already here are counted."""
        previous = self.admission
        self.admission = admission
        if admission is not None:
            admission.bind(self)
        elif previous is not None:  # accounts turned off: every quota gate opens
            for job in list(self._blocked.values()):
                self.set_gate(job.id, "quota", None)

    # -- nodes ---------------------------------------------------------------------------
    # A node is schedulable exactly when it has no condition (masterd/core/conditions.py):
    # each caller sets or clears its own, and the core derives the bit the placers read.
    def node_up(self, inventory: NodeInventory) -> None:
        """The node is connected with this inventory; its other conditions stay."""
        self.cluster.upsert_node(inventory)
        self.conditions.clear(inventory.name, DISCONNECTED)
        self._apply_conditions(inventory.name)

    def update_inventory(self, inventory: NodeInventory) -> None:
        """The node's inventory changed (a GPU's health): connected or not, as it was."""
        self.cluster.upsert_node(inventory)
        self._apply_conditions(inventory.name)

    def node_down(self, name: str, reason: str = "the node is not connected to the master",
                  since: float | None = None) -> None:
        """The node is unreachable: place nothing new there, keep its jobs' resources."""
        if self.cluster.node(name) is not None:
            self.set_condition(name, DISCONNECTED, reason, since)

    def set_drained(self, name: str, drained: bool, reason: str = "",
                    since: float | None = None) -> None:
        if self.cluster.node(name) is None:
            raise JobError("unknown_node", f"node {name!r} is not registered")
        sentence = f"drained by an operator: {reason}" if reason else "drained by an operator"
        self.set_condition(name, DRAINED, sentence if drained else None, since)

    def set_condition(self, name: str, kind: str, reason: str | None,
                      since: float | None = None) -> None:
        """Set (a reason) or clear (None) one of a known node's conditions."""
        if reason is None:
            self.conditions.clear(name, kind)
        else:
            self.conditions.set(name, kind, reason, since)
        self._apply_conditions(name)

    def node_conditions(self, name: str) -> tuple[NodeCondition, ...]:
        return self.conditions.of(name)

    def _apply_conditions(self, name: str) -> None:
        if self.cluster.node(name) is not None:
            self.cluster.set_schedulable(name, self.conditions.schedulable(name))

    # -- jobs ----------------------------------------------------------------------------
    def unsatisfiable(self, spec: JobSpec) -> str | None:
        """Why this cluster can never run the job, or None if it could when empty."""
        if self._fit_inventory != self.cluster.inventory_changes:
            self._fit_cache.clear()
            self._fit_inventory = self.cluster.inventory_changes
        # Exactly the fields fits_cluster reads (cpus only matter for CPU-only jobs).
        key = (spec.gpus, spec.gpu_model, spec.cpus if spec.gpus == 0 else 0, spec.max_nodes,
               spec.selector)
        try:
            return self._fit_cache[key]
        except KeyError:
            reason = self._fit_cache[key] = fits_cluster(spec, self.cluster.snapshot({}))
            return reason

    def check_submittable(self, spec: JobSpec) -> None:
        reason = self.unsatisfiable(spec)
        if reason is not None:
            raise JobError("unsatisfiable", f"job {spec.name}: {reason}")

    def submit(self, job: Job) -> None:
        if job.id in self.jobs:
            raise JobError("duplicate_job", f"job id {job.id!r} already exists")
        self.jobs[job.id] = job
        if job.state is JobState.QUEUED:
            self._enqueue(job)
        elif not job.state.terminal:
            self._active[job.id] = job
            self._holds(job)

    def start_placed(self, job: Job) -> None:
        """Take a job that bypasses the queue and the policy (an inference replica, state
        starting, on its given placement) — but not the node filter or the permit: each of
        its nodes must take new work and its account must admit what the placement charges.
        JobError names what refused it; nothing is taken then."""
        placement = job.placement
        assert placement is not None and job.state is JobState.STARTING
        for node in placement.nodes:
            if self.cluster.node(node) is None:
                raise JobError("unknown_node", f"node {node!r} is not registered")
            closed = self.conditions.of(node)
            if closed:
                raise JobError("node_closed", f"node {node} takes no new work: "
                                              f"{closed[0].reason}")
        if self.admission is not None:
            refused = self.admission.permits(job, placement)
            if refused is not None:
                raise JobError("quota", refused)
        try:
            self.cluster.allocate(job.id, placement)
        except AllocationError as exc:
            raise JobError("conflict", f"job {job.id} cannot take its placement: {exc}"
                           ) from None
        self.submit(job)

    def restore(self, job: Job) -> None:
        """Re-enter a job loaded from the store, keeping its resources if it was placed."""
        self.jobs[job.id] = job
        if job.state is JobState.QUEUED:
            self._enqueue(job)
        elif not job.state.terminal:
            self._active[job.id] = job
            if job.placement is not None:  # claimed when its nodes say hello
                for node in job.placement.nodes:
                    self._unclaimed.setdefault(node, {})[job.id] = None
            self._holds(job)

    def forget(self, job_id: str) -> Job:
        """Drop an ended job from memory (its journal row stays); returns it.

        Only a terminal job that holds nothing can go: a queued or active one is still the
        core's to schedule, and forgetting it would leak its place in the queue or its
        resources.
        """
        job = self.jobs.get(job_id)
        if job is None:
            raise JobError("unknown_job", f"job {job_id!r} is not in memory")
        if (not job.state.terminal or job_id in self._queued or job_id in self._active
                or job_id in self._blocked or self.cluster.allocation(job_id) is not None):
            raise JobError("job_active", f"job {job_id} is {job.state.value} and still "
                           "scheduled or holding resources; only an ended job can be forgotten")
        del self.jobs[job_id]
        self._noted.discard(job_id)
        return job

    def claim_restored(self, job_id: str) -> str | None:
        """Re-allocate a restored active job's resources once its nodes are back."""
        job = self._active.get(job_id)
        if job is None or job.placement is None:
            return None
        if self.cluster.allocation(job_id) == job.placement:
            return None
        try:
            self.cluster.adopt(job_id, job.placement)
        except AllocationError as exc:
            return str(exc)
        for node in job.placement.nodes:
            self._unclaimed.get(node, {}).pop(job_id, None)
        return None

    def active_on(self, node: str) -> list[Job]:
        """The starting and running jobs placed on ``node``: those holding resources there,
        and restored ones whose resources are not claimed yet. O(the node's own jobs)."""
        found: dict[str, Job] = {}
        unclaimed = self._unclaimed.get(node)
        for job_id in [*self.cluster.jobs_on(node), *(unclaimed or ())]:
            job = self._active.get(job_id)
            if job is not None and job.placement is not None and node in job.placement.nodes:
                found[job_id] = job
            elif unclaimed is not None:
                unclaimed.pop(job_id, None)  # ended or moved before it was claimed
        if unclaimed is not None and not unclaimed:
            del self._unclaimed[node]
        return list(found.values())

    def _enqueue(self, job: Job) -> None:
        job.state = JobState.QUEUED
        if self.admission is not None:
            self.admission.queued(job)  # closes its quota gate if it may not be admitted
        if job.gates:
            self._blocked[job.id] = job
            self._note_gate(job)
            return
        self._queued[job.id] = job
        # Higher priority classes first, then higher partition tiers, then re-queued
        # (preempted) jobs, then the job's priority, then submission order.
        key = (-self.classes.tier(job.spec.priority_class), -self._partition_tier(job.spec),
               -job.requeue_priority, -job.spec.priority, job.submit_time, next(self._seq))
        self._order[job.id] = key
        if self.admission is not None:
            self.admission.ordered(job, key)
        entry = (key, job.id)
        ordered = self._ordered
        if not ordered or ordered[-1] < entry:
            ordered.append(entry)  # the usual case: a new submission goes last
        else:
            bisect.insort(ordered, entry)

    def _dequeue(self, job_id: str) -> Job:
        job = self._queued.pop(job_id)
        key = self._order.pop(job_id)
        i = bisect.bisect_left(self._ordered, (key, job_id))
        del self._ordered[i]
        return job

    def queue(self) -> Sequence[Job]:
        """Queued jobs in order, as a view: a policy that looks only at the head (FIFO) does
        not pay for the whole queue on every event. Jobs an admission gate holds back are not
        in it (see :meth:`blocked`)."""
        return QueueView(self._ordered, self._queued)

    def queue_keys(self) -> Iterator[tuple[_QueueKey, str]]:
        """(key, job id) of every job in the policy's queue, in order."""
        return iter(self._ordered)

    def noted(self, job_id: str) -> bool:
        """Whether a queued job's reason is the policy's note from the last pass."""
        return job_id in self._noted

    def blocked(self) -> Mapping[str, Job]:
        """Queued jobs an admission gate keeps from the policy, read-only and not copied."""
        return MappingProxyType(self._blocked)

    # -- admission -----------------------------------------------------------------------
    def set_gate(self, job_id: str, code: str, reason: str | None) -> None:
        """Close (``reason`` given) or open (``reason`` None) one admission gate of a queued
        job. While any gate is closed the job stays queued but out of the policy's queue,
        its ``wait`` the first closed gate (in WaitReason's order) and ``reason`` that
        gate's sentence; when the last one opens it re-enters the queue by its priority and
        submission time, as if it had never left."""
        job = self.jobs.get(job_id)
        if job is None:
            raise JobError("unknown_job", f"job {job_id!r} does not exist")
        if code not in _GATE_ORDER:
            raise ValueError(f"{code!r} is not a wait reason")
        if reason is None:
            if job.gates.pop(code, None) is None:
                return
        else:
            if job.state is not JobState.QUEUED:
                raise JobError("job_not_queued", f"job {job_id} is {job.state.value}; only a "
                               "queued job can be held back")
            job.gates[code] = reason
        if job.state is not JobState.QUEUED:
            return
        if job.gates:
            if job_id in self._queued:
                self._dequeue(job_id)
                self._noted.discard(job_id)
                self._blocked[job_id] = job
            self._note_gate(job)
        elif job_id in self._blocked:
            del self._blocked[job_id]
            job.wait = ""
            job.reason = ""
            self._enqueue(job)

    @staticmethod
    def _note_gate(job: Job) -> None:
        code = min(job.gates, key=_GATE_ORDER.__getitem__)
        job.wait = code
        job.reason = job.gates[code]

    def reorder(self, job_id: str) -> None:
        """A queued job's priority changed (its spec was replaced, or its requeue priority
        by quota reclaim): move it to its place."""
        if job_id in self._queued:
            job = self._dequeue(job_id)
            self._enqueue(job)

    def running(self) -> dict[str, Job]:
        return dict(self._active)

    def active_jobs(self) -> Mapping[str, Job]:
        """Starting and running jobs, read-only and not copied (do not hold across awaits
        that may change job states)."""
        return MappingProxyType(self._active)

    def snapshot(self) -> ClusterSnapshot:
        return self.cluster.snapshot(self._active)

    # -- the scheduling pass -------------------------------------------------------------
    def schedule(self, now: float) -> list[Decision]:
        self.wake_at = None
        if self.admission is not None:
            self.admission.recheck()  # gates opened by jobs that gave resources back
        if not self._queued:
            return []
        applied: list[Decision] = []
        held_back: set[str] = set()
        if self.preemption is not None and self.preemption.nominations:
            self._start_nominated(applied, held_back)
        held_back |= self._decide_and_apply(now, applied)
        notes = self._last_notes
        if self.admission is not None:
            # Gates of accounts whose use changed, then borrowed resources reclaimed for
            # owners within their quotas that the policy could not place.
            self.admission.recheck()
            for decision in self.admission.reclaim(self.snapshot(), self._order):
                if isinstance(decision, Reorder):
                    self.reorder(decision.job_id)
                    continue
                self._preempting(decision, applied)
        if self.preemption is not None:
            # Priority classes: running jobs of lower classes stopped for waiting ones.
            for decision in self.preemption.plan(self.queue(), self._queued, self.snapshot(),
                                                 self._active, now):
                self._preempting(decision, applied)
        wake = getattr(unwrap(self.policy), "wake_at", None)
        if wake is not None:
            self.wake_at = wake(now)
        if self.preemption is not None and self.preemption.wake_at is not None \
                and self.preemption.wake_at > now and self._queued:
            # A victim comes of age for a waiting preemptor: a pass then, event or not.
            self.wake_at = min(self.wake_at or math.inf, self.preemption.wake_at)
        follow_up, self._follow_up_at = self._follow_up_at == now, None
        if "limit" in held_back and self._queued and not follow_up:
            # Admission held back starts the policy chose that together pass a limit:
            # another pass at once (one, not a chain), where the policy sees their gates, so
            # what it planned for them is not left idle until the next event (the master
            # runs it straight after this one; the simulator too).
            self.wake_at = self._follow_up_at = now
        if notes or self._noted:
            # A note from an earlier pass that no longer applies is dropped, not left stale.
            for job_id in self._noted.difference(notes):
                stale = self._queued.get(job_id)
                if stale is not None:
                    stale.reason = ""
            self._noted = set()
            for job_id, note in notes.items():
                waiting = self._queued.get(job_id)
                if waiting is not None:
                    waiting.reason = note
                    self._noted.add(job_id)
        return applied

    def _decide_and_apply(self, now: float, applied: list[Decision]) -> set[str]:
        """The policy's decisions applied; returns why admission held starts back, if it
        did ("limit", "pause")."""
        held_back: set[str] = set()
        # A policy with plan() also says why jobs wait, borrow or are preempted (SODA's
        # arrays); those notes become the jobs' reasons, so operators see them.
        plan = getattr(self.policy, "plan", None)
        notes: Mapping[str, str] = {}
        if plan is not None:
            result = plan(self.snapshot(), self.queue(), now)
            decisions, notes = result.decisions, result.notes
        else:
            decisions = self.policy.decide(self.snapshot(), self.queue(), now)
        self._last_notes = notes
        for decision in decisions:
            if isinstance(decision, Start):
                self._start(decision, notes, held_back, applied)
            elif isinstance(decision, Preempt):
                self._preempting(decision, applied)
        return held_back

    def _start(self, decision: Start, notes: Mapping[str, str], held_back: set[str],
               applied: list[Decision]) -> None:
        """Apply one start, through the node filter and the permits (nominated nodes,
        quota admission); a start refused leaves the job queued for a later pass."""
        job = self._queued.get(decision.job_id)
        if job is None:
            return
        if (self.cluster.timed or selects(job.spec)) \
                and not self._may_use(job.spec, decision.placement):
            return  # a policy that searched by model alone: it waits, never misplaced
        if job.spec.selector.exclusive:
            whole = self._whole_nodes(decision.placement)
            if whole is None:
                return  # a node of it runs something else now: it waits for idle nodes
            decision = Start(decision.job_id, whole)
        if self.preemption is not None:
            holder = self.preemption.permit(job, decision.placement)
            if holder is not None:  # freed for a preemptor: it waits for them
                held_back.add("nominated")
                return
        if self.admission is not None:
            refused = self.admission.admit(job, decision.placement)
            if refused is not None:  # over its account's limits after earlier starts
                held_back.add(refused)
                return
        try:
            self.cluster.allocate(job.id, decision.placement)
        except AllocationError:
            # A stale or conflicting decision: leave the job queued for the next pass.
            return
        self._dequeue(job.id)
        job.state = JobState.STARTING
        job.placement = decision.placement
        job.attempts += 1
        job.node_states = {n: "preparing" for n in decision.placement.nodes}
        job.reason = notes.get(job.id, "")  # e.g. "borrowing 2 gpus of large:A100"
        job.wait = ""
        self._active[job.id] = job
        self._holds(job)
        if self.preemption is not None:
            self.preemption.forget(job.id)
        applied.append(decision)

    def _start_nominated(self, applied: list[Decision], held_back: set[str]) -> None:
        """Preemptors whose victims have all stopped start on their nominated nodes before
        the policy decides: whatever its order or placement rule, what was freed for them
        goes to them (kube-scheduler's nominated node)."""
        assert self.preemption is not None
        for job_id in list(self.preemption.nominations):
            job = self._queued.get(job_id)
            if job is None:
                continue
            placement = self.preemption.placement(job, self.snapshot())
            if placement is not None:
                self._start(Start(job_id, placement), {}, held_back, applied)

    def _whole_nodes(self, placement: Placement) -> Placement | None:
        """An exclusive job's placement widened to every free GPU, core and byte of memory
        of its nodes (Slurm's --exclusive), or None if any of them holds another job."""
        allocations = []
        for alloc in placement.allocations:
            view = self.cluster.node(alloc.node)
            # (Not idle also when a part the master does not own holds something there.)
            if view is None or self.cluster.jobs_on(alloc.node) or not view.idle:
                return None
            allocations.append(NodeAllocation(alloc.node, tuple(sorted(view.free_gpus)),
                                              tuple(sorted(view.free_cpus)),
                                              view.free_memory_mib))
        return Placement(tuple(allocations))

    def _may_use(self, spec: JobSpec, placement: Placement) -> bool:
        """The node filter on a policy's start: every node of it is one the job may use."""
        for node in placement.nodes:
            view = self.cluster.node(node)
            if view is None or not eligible(spec, view.inventory):
                return False
        return True

    def _preempting(self, decision: Preempt, applied: list[Decision]) -> None:
        """Mark a running job as being preempted (once) and note the decision as applied."""
        job = self._active.get(decision.job_id)
        if job is None or job.stopping:
            return
        job.stopping = True
        job.reason = PREEMPTED_PREFIX + decision.reason
        if decision.in_place:  # back to its own place, restarts + 1 (see _finish)
            job.end_as = JobState.QUEUED.value
        applied.append(decision)

    # -- events from nodes ---------------------------------------------------------------
    def start_failed(self, job_id: str, reason: str, now: float,
                     counted: bool = True) -> Transition | None:
        """A node refused to start its part: free everything and queue the job again, unless
        it has failed to start ``max_start_failures`` times (then it fails for good, rather
        than bouncing between the queue and the same refusing node forever).

        A job asked to end while its launch was in flight (cancelled, timed out) ends so: the
        failed launch is its stop, never a reason to run it elsewhere. One asked to be
        requeued (its node lost, a GPU failed) is requeued as that asked, restarts + 1. One
        preempted meanwhile goes back to the queue as a preempted job does: its node dropping
        the part the preemption stopped is no failure of its start.

        ``counted`` False: the refusal was no fault of the job's (its node held the GPUs for
        a part the master did not own, now accounted for), so it does not bring the job
        nearer to failing for good."""
        job = self._active.get(job_id)
        if job is None:
            return None
        if job.end_as or (job.stopping and job.reason.startswith("preempted")):
            # No part runs (the launch failed): every part counts as exited.
            job.node_states = dict.fromkeys(job.node_states, "exited")
            return self._finish(job, now)
        del self._active[job_id]
        self.cluster.release(job_id)
        self._gives_back(job)
        job.placement = None
        job.node_states = {}
        job.reason = f"start failed: {reason}"
        job.stopping = False
        job.start_failures += counted
        if job.start_failures >= self.max_start_failures:
            job.state = JobState.FAILED
            job.end_time = now
            job.reason = f"gave up after {job.start_failures} failed starts; last: {reason}"
            return Transition(job_id, JobState.FAILED, job.reason)
        job.requeue_priority = max(job.requeue_priority, 1)
        self._enqueue(job)
        return Transition(job_id, JobState.QUEUED, job.reason)

    def node_started(self, job_id: str, node: str, now: float) -> Transition | None:
        job = self._active.get(job_id)
        if job is None or node not in job.node_states:
            return None
        job.node_states[node] = "running"
        if job.state is JobState.STARTING and all(
            s == "running" for s in job.node_states.values()
        ):
            job.state = JobState.RUNNING
            job.start_time = now
            return Transition(job_id, JobState.RUNNING)
        return None

    def node_exited(
        self, job_id: str, node: str, exit_code: int | None, signal: int | None, now: float
    ) -> tuple[Transition | None, list[str]]:
        """Record one node's part exiting.

        Returns the job's transition (once every part has exited) and the nodes whose parts
        must now be stopped (a failed rank takes the whole job down).
        """
        job = self._active.get(job_id)
        if job is None or node not in job.node_states:
            return None, []
        job.node_states[node] = "exited"
        failed = (exit_code not in (0, None)) or signal is not None
        if failed and job.exit_code in (0, None) and job.signal is None:
            job.exit_code, job.signal = exit_code, signal
        elif job.exit_code is None and job.signal is None:
            job.exit_code = exit_code
        to_stop: list[str] = []
        if failed and not job.stopping:
            job.stopping = True
            to_stop = [n for n, s in job.node_states.items() if s != "exited"]
        if any(s != "exited" for s in job.node_states.values()):
            return None, to_stop
        return self._finish(job, now), to_stop

    def _finish(self, job: Job, now: float) -> Transition:
        del self._active[job.id]
        self.cluster.release(job.id)
        self._gives_back(job)
        stopping = job.stopping
        job.stopping = False
        if job.end_as == JobState.QUEUED.value:
            return self._requeue(job)
        if job.end_as:
            # Stopped to end so (cancelled, timeout), however its parts exited.
            job.state = JobState(job.end_as)
            job.end_time = now
            return Transition(job.id, job.state, job.reason)
        if job.state is JobState.CANCELLED or job.reason == "cancelled":
            # (A journal written before end_as existed.)
            job.state = JobState.CANCELLED
            job.end_time = now
            return Transition(job.id, JobState.CANCELLED, "cancelled")
        finished_anyway = job.exit_code == 0 and job.signal is None
        if stopping and job.reason.startswith("preempted") and finished_anyway:
            job.reason = "finished before its preemption took effect"
        elif stopping and job.reason.startswith("preempted"):
            # Back to the head of its array, as if never started.
            job.placement = None
            job.node_states = {}
            job.start_time = None
            job.exit_code = job.signal = None
            job.requeue_priority += 1
            self._enqueue(job)
            return Transition(job.id, JobState.QUEUED, job.reason)
        job.end_time = now
        if job.exit_code == 0 and job.signal is None:
            job.state = JobState.FINISHED
        else:
            job.state = JobState.FAILED
            if not job.reason:
                job.reason = (
                    f"killed by signal {job.signal}"
                    if job.signal is not None
                    else f"exited with code {job.exit_code}"
                )
        return Transition(job.id, job.state, job.reason)

    def cancel(self, job_id: str, now: float, reason: str = "cancelled"
               ) -> tuple[Transition | None, list[str]]:
        """Cancel a job: at once if queued; running parts must be stopped on these nodes."""
        return self.stop(job_id, JobState.CANCELLED, reason, now)

    def _unended(self, job_id: str) -> Job:
        """The job, which must exist and not have ended (JobError otherwise)."""
        job = self.jobs.get(job_id)
        if job is None:
            raise JobError("unknown_job", f"job {job_id!r} does not exist")
        if job.state.terminal:
            raise JobError("job_finished", f"job {job_id} already ended ({job.state.value})")
        return job

    def stop(self, job_id: str, end_as: JobState, reason: str, now: float
             ) -> tuple[Transition | None, list[str]]:
        """End a job in ``end_as`` (cancelled, timeout): at once if queued; a starting or
        running one once its parts, stopped on the nodes returned, have exited."""
        if not end_as.terminal:
            raise ValueError(f"a job cannot be stopped into {end_as.value}")
        job = self._unended(job_id)
        if job.state is JobState.QUEUED:
            if job_id in self._blocked:
                del self._blocked[job_id]
            else:
                self._dequeue(job_id)
            if self.admission is not None:
                self.admission.dequeued(job)
            job.state = end_as
            job.end_time = now
            job.reason = reason
            job.wait = ""
            return Transition(job_id, end_as, reason), []
        job.reason = reason
        job.end_as = end_as.value
        job.stopping = True
        return None, [n for n, s in job.node_states.items() if s != "exited"]

    def requeue(self, job_id: str, reason: str, now: float
                ) -> tuple[Transition | None, list[str]]:
        """Take a starting or running job off its nodes and queue it again once its parts,
        stopped on the nodes returned, have exited (its node was lost, a GPU of it failed).
        It goes back to the place its own key gives it (its priority and submission time:
        not the head-of-array place of a preempted job), with ``restarts`` one higher.
        Journalled through ``end_as`` = queued, so a restarted master still requeues it.
        A queued job is left as it is; a job being stopped already keeps the end it was
        given (a cancel stands, a preempted job goes to the head of its array)."""
        job = self._unended(job_id)
        if job.state is JobState.QUEUED:
            return None, []
        live = [n for n, s in job.node_states.items() if s != "exited"]
        if job.stopping:
            return None, live
        job.reason = reason
        job.end_as = JobState.QUEUED.value
        job.stopping = True
        if not live:
            return self._finish(job, now), []
        return None, live

    def _requeue(self, job: Job) -> Transition:
        job.end_as = ""
        job.placement = None
        job.node_states = {}
        job.start_time = None
        job.exit_code = job.signal = None
        job.restarts += 1
        self._enqueue(job)
        return Transition(job.id, JobState.QUEUED, job.reason, event="requeued")

    def lost_parts(self, node: str, reported: Iterable[str], now: float) -> list[Transition]:
        """A node re-registered without some jobs the master thought it ran: they ended unseen."""
        seen = set(reported)
        transitions = []
        for job_id in self.cluster.jobs_on(node):
            job = self._active.get(job_id)
            if job is None or job_id in seen:
                continue
            if job.node_states.get(node) == "preparing":
                continue  # the start command may still be in flight
            job.reason = job.reason or f"lost on node {node}"
            transition, _ = self.node_exited(job_id, node, None, None, now)
            if transition is not None:
                transitions.append(transition)
        return transitions

    def cores_changed(self, job_id: str, node: str, cpus: tuple[int, ...]) -> None:
        """Record a live re-pin of a running job's cores (raises AllocationError if bogus)."""
        job = self._active.get(job_id)
        if job is None:
            raise JobError("unknown_job", f"job {job_id!r} is not running")
        self.cluster.resize_cpus(job_id, node, cpus)
        job.placement = self.cluster.allocation(job_id)

    def placement_of(self, job_id: str) -> Placement | None:
        return self.cluster.allocation(job_id)

    def enter_post_phase(self, job_id: str) -> bool:
        """A running job entered its post phase (Liquid §6.1: its GPU utilisation fell after
        training; it is saving its model). Its GPUs are held shared from then on, so a policy
        that pre-schedules may start the next job on them. False when the job is not running
        or was lent already."""
        job = self._active.get(job_id)
        if job is None or job.state is not JobState.RUNNING or job.stopping:
            return False
        before = self.cluster.allocation(job_id)
        held = self.cluster.lend(job_id)
        if held is None or held == before:
            return False
        job.placement = held
        return True
