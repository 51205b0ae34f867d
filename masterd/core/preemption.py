"""Priority classes that preempt (shared/priorityclasses.py): the core's stage after the
policy's decisions and quota reclaim, plain code the master and the simulator both run.

For the first waiting jobs in queue order whose class may preempt and which the policy did
not start, it searches victims among running jobs of the classes named, so that the job fits
in the fewest-nodes shape every placement accepts (masterd/core/whatif.py):

* only jobs that have run their class's ``min_runtime_s``, of the preemptor's account when
  its class says ``within_account``, and never one the admission protects (an account
  within its guaranteed quota);
* the fewest GPU-hours lost first: GPUs held × time run, so a long-running job is the last
  to lose its work; then, on each node the placement uses, only as many as it needs.

The nodes of the placement are **nominated** to the preemptor: while its victims stop,
no other job may start on them (:meth:`PriorityPreemption.permit`), whatever the policy
decides, so the freed resources wait for it. The nomination ends when the preemptor
starts or leaves the queue, or a few passes after its victims are gone (it did not fit
after all: the next pass may preempt again).
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import islice

from masterd.core.cluster import ClusterSnapshot
from masterd.core.placement import FreePool, realise
from masterd.core.policy import Preempt
from masterd.core.whatif import fewest_nodes_shape, fits_now, free_until_fits
from shared.model import Job, Placement
from shared.priorityclasses import ClassTable, PriorityClass

# Waiting jobs looked at per pass (the queue's first that may preempt), and running jobs
# tried as victims for each: a pass stays cheap on a large cluster.
PREEMPTORS_PER_PASS = 4
CANDIDATES_PER_JOB = 512
# Passes a preemptor keeps its nodes once its victims are gone.
NOMINATION_PASSES = 3
# Passes before a preemptor whose search found nothing (it fits already, or no victims
# would make it fit) is searched for again.
RETRY_PASSES = 16


@dataclass
class Nomination:
    """Nodes held for a preemptor while its victims stop."""

    nodes: frozenset[str]
    victims: set[str]
    passes_left: int = NOMINATION_PASSES


@dataclass
class PriorityPreemption:
    table: ClassTable
    # Whether a running job may not be preempted whatever its class (the quota admission:
    # its account is within its guaranteed quota).
    protected: Callable[[Job], bool] = lambda job: False
    nominations: dict[str, Nomination] = field(default_factory=dict)
    _holder: dict[str, str] = field(default_factory=dict)  # node -> preemptor
    _passes: int = 0
    _retry: dict[str, int] = field(default_factory=dict)  # preemptor -> pass to try again
    # Jobs holding resources in a class some class may preempt: the victims' pool, kept as
    # jobs start and end so that a search does not walk every running job.
    _exposed: dict[str, Job] = field(default_factory=dict)
    # When the youngest spared victim comes of age (its class's min_runtime_s): preemptors
    # that found nothing are searched for again from then, and the core wakes for it.
    wake_at: float | None = None

    # -- the victims' pool ---------------------------------------------------------------
    def rebuild(self, active: Iterable[Job]) -> None:
        """The table changed: which running jobs may be victims, afresh."""
        self._exposed = {}
        for job in active:
            self.started(job)

    def started(self, job: Job) -> None:
        found = self.table.of_job(job.spec.priority_class)
        if found is not None and found.name in self.table.victim_classes:
            self._exposed[job.id] = job

    def released(self, job: Job) -> None:
        self._exposed.pop(job.id, None)

    # -- the permit ----------------------------------------------------------------------
    def permit(self, job: Job, placement: Placement) -> str | None:
        """The preemptor that holds a node of ``placement`` (None: the start may go on)."""
        for node in placement.nodes:
            holder = self._holder.get(node)
            if holder is not None and holder != job.id:
                return holder
        return None

    def forget(self, job_id: str) -> None:
        """The preemptor started, or left the queue: its nodes are free for anyone."""
        nomination = self.nominations.pop(job_id, None)
        if nomination is not None:
            for node in nomination.nodes:
                if self._holder.get(node) == job_id:
                    del self._holder[node]

    def placement(self, job: Job, snapshot: ClusterSnapshot) -> Placement | None:
        """Where a preemptor whose victims have all stopped fits on its nominated nodes
        (None: its victims still stop, or it does not fit there after all)."""
        nomination = self.nominations.get(job.id)
        if nomination is None or nomination.victims.intersection(snapshot.running):
            return None
        pool = FreePool(snapshot)
        shape = fewest_nodes_shape(job.spec, pool)
        if shape is None:
            return None
        return realise(job.spec, pool, *shape, candidates=sorted(nomination.nodes))

    # -- the stage -----------------------------------------------------------------------
    def plan(self, queue: Sequence[Job], queued: Container[str], snapshot: ClusterSnapshot,
             active: Mapping[str, Job], now: float) -> list[Preempt]:
        """``queue``: in order, higher classes first; ``queued``: its job ids."""
        self._passes += 1
        for job_id, nomination in list(self.nominations.items()):
            nomination.victims.intersection_update(active)
            if job_id not in queued:
                self.forget(job_id)
            elif not nomination.victims:
                nomination.passes_left -= 1
                if nomination.passes_left <= 0:
                    self.forget(job_id)
        for job_id in [j for j in self._retry if j not in queued]:
            del self._retry[job_id]
        if self.wake_at is not None and now >= self.wake_at:
            # A spared victim came of age: every preemptor may search again.
            self._retry.clear()
            self.wake_at = None
        # The queue is ordered by class first: below the lowest class that preempts, no
        # job may preempt, and the walk stops.
        floor = self.table.preempting_floor
        if floor is None:
            return []
        decisions: list[Preempt] = []
        candidates: list[tuple[Job, PriorityClass]] | None = None
        taken: set[str] = set()
        tried = 0
        for job in queue:
            mine = self.table.of_job(job.spec.priority_class)
            if mine is None or mine.priority < floor or tried >= PREEMPTORS_PER_PASS:
                break
            if not mine.preempts or job.id in self.nominations \
                    or self._retry.get(job.id, 0) > self._passes:
                continue
            tried += 1
            if candidates is None:  # once a pass, for every preemptor
                candidates = self._candidates(now)
            found = self._victims(job, mine, snapshot, candidates, taken)
            if not found:
                self._retry[job.id] = self._passes + RETRY_PASSES
                continue
            self._retry.pop(job.id, None)
            victims, nodes = found
            self.nominations[job.id] = Nomination(nodes, {v.id for v in victims})
            for node in nodes:
                self._holder.setdefault(node, job.id)
            for victim in victims:
                theirs = self.table.of_job(victim.spec.priority_class)
                assert theirs is not None
                decisions.append(Preempt(
                    victim.id, f"for job {job.id} of priority class {mine.name}",
                    grace_s=float(theirs.preempt_grace_s), in_place=True))
                taken.add(victim.id)  # the next preemptor of this pass looks past it
        return decisions

    def _candidates(self, now: float) -> list[tuple[Job, PriorityClass]]:
        """Running jobs some class may preempt, past their minimum run time and not
        protected, fewest GPU-hours lost first (GPUs held × time run; then the newest).
        Notes when the youngest spared one comes of age (``wake_at``)."""
        found: list[tuple[float, float, str, Job, PriorityClass]] = []
        for other in self._exposed.values():
            if other.stopping or other.placement is None:
                continue
            theirs = self.table.of_job(other.spec.priority_class)
            if theirs is None:
                continue
            ran = now - other.start_time if other.start_time is not None else 0.0
            if ran < theirs.min_runtime_s:
                started = other.start_time if other.start_time is not None else now
                of_age = started + theirs.min_runtime_s
                self.wake_at = of_age if self.wake_at is None else min(self.wake_at, of_age)
                continue
            if self.protected(other):
                continue
            started = other.start_time if other.start_time is not None else now
            found.append((other.placement.gpu_count * ran, -started, other.id, other, theirs))
        found.sort(key=lambda entry: entry[:3])
        return [(entry[3], entry[4]) for entry in found]

    @staticmethod
    def _eligible_victims(job: Job, mine: PriorityClass,
                          candidates: list[tuple[Job, PriorityClass]], taken: set[str]
                          ) -> Iterator[Job]:
        for other, theirs in candidates:
            if other.id in taken or theirs.name not in mine.preempts:
                continue
            if mine.within_account and other.spec.tenant != job.spec.tenant:
                continue
            yield other

    def _victims(self, job: Job, mine: PriorityClass, snapshot: ClusterSnapshot,
                 candidates: list[tuple[Job, PriorityClass]], taken: set[str]
                 ) -> tuple[list[Job], frozenset[str]] | None:
        """The victims that make ``job`` fit and the nodes it would use; None: it fits
        already (the policy's order keeps it waiting) or no victims would make it fit."""
        spec = job.spec
        pool = FreePool(snapshot)
        if fits_now(spec, pool):
            return None
        shape = fewest_nodes_shape(spec, pool)
        if shape is None:
            return None
        held = {n for n, holder in self._holder.items() if holder != job.id}
        found = free_until_fits(
            spec, snapshot, pool, shape,
            islice(self._eligible_victims(job, mine, candidates, taken), CANDIDATES_PER_JOB),
            usable=lambda node: node not in held)
        if found is None:
            return None
        victims, placement = found
        return victims, frozenset(placement.nodes)
