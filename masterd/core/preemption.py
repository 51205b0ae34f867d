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

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import islice

from masterd.core.cluster import ClusterSnapshot
from masterd.core.eligibility import eligible
from masterd.core.placement import FreePool, model_scope, realise
from masterd.core.policy import Preempt
from masterd.core.whatif import fewest_nodes_shape, fits_now, give_back, needed_victims
from shared.model import Job, Placement
from shared.priorityclasses import ClassTable, PriorityClass

# Waiting jobs looked at per pass (the queue's first that may preempt), and running jobs
# tried as victims for each: a pass stays cheap on a large cluster.
PREEMPTORS_PER_PASS = 4
CANDIDATES_PER_JOB = 512
# Passes a preemptor keeps its nodes once its victims are gone.
NOMINATION_PASSES = 3


@dataclass
class Nomination:
    """Nodes held for a preemptor while its victims stop."""

    job_id: str
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

    # -- the permit ----------------------------------------------------------------------
    def permit(self, job: Job, placement: Placement) -> str | None:
        """The preemptor that holds a node of ``placement`` (None: the start may go on)."""
        for node in placement.nodes:
            holder = self._holder.get(node)
            if holder is not None and holder != job.id:
                return holder
        return None

    def holder_of(self, node: str) -> str | None:
        return self._holder.get(node)

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
    def plan(self, queue: Sequence[Job], snapshot: ClusterSnapshot,
             active: Mapping[str, Job], now: float) -> list[Preempt]:
        queued = {job.id for job in queue}
        for job_id, nomination in list(self.nominations.items()):
            nomination.victims.intersection_update(active)
            if job_id not in queued:
                self.forget(job_id)
            elif not nomination.victims:
                nomination.passes_left -= 1
                if nomination.passes_left <= 0:
                    self.forget(job_id)
        decisions: list[Preempt] = []
        tried = 0
        for job in queue:
            if tried >= PREEMPTORS_PER_PASS:
                break
            mine = self.table.of_job(job.spec.priority_class)
            if mine is None or not mine.preempts or job.id in self.nominations:
                continue
            tried += 1
            found = self._victims(job, mine, snapshot, now)
            if not found:
                continue
            victims, nodes = found
            self.nominations[job.id] = Nomination(job.id, nodes, {v.id for v in victims})
            for node in nodes:
                self._holder.setdefault(node, job.id)
            for victim in victims:
                theirs = self.table.of_job(victim.spec.priority_class)
                assert theirs is not None
                decisions.append(Preempt(
                    victim.id, f"for job {job.id} of priority class {mine.name}",
                    grace_s=float(theirs.preempt_grace_s), in_place=True))
        return decisions

    def _candidates(self, job: Job, mine: PriorityClass, running: Mapping[str, Job],
                    now: float) -> Iterator[Job]:
        """Running jobs it may preempt, fewest GPU-hours lost first."""
        found: list[tuple[float, float, str, Job]] = []
        for other in running.values():
            if other.stopping or other.placement is None or other.id == job.id:
                continue
            theirs = self.table.of_job(other.spec.priority_class)
            if theirs is None or theirs.name not in mine.preempts:
                continue
            ran = now - other.start_time if other.start_time is not None else 0.0
            if ran < theirs.min_runtime_s:
                continue
            if mine.within_account and other.spec.tenant != job.spec.tenant:
                continue
            if self.protected(other):
                continue
            started = other.start_time if other.start_time is not None else now
            found.append((other.placement.gpu_count * ran, -started, other.id, other))
        found.sort(key=lambda entry: entry[:3])
        return (entry[3] for entry in found)

    def _victims(self, job: Job, mine: PriorityClass, snapshot: ClusterSnapshot,
                 now: float) -> tuple[list[Job], frozenset[str]] | None:
        """The victims that make ``job`` fit and the nodes it would use; None: it fits
        already (the policy's order keeps it waiting) or no victims would make it fit."""
        spec = job.spec
        pool = FreePool(snapshot)
        if fits_now(spec, pool):
            return None
        shape = fewest_nodes_shape(spec, pool)
        if shape is None:
            return None
        d_node, d_gpn = shape
        held = {n for n, holder in self._holder.items() if holder != job.id}
        ok = {n for n in pool.ranked(model_scope(spec), d_gpn, 0, 0, spec) if n not in held}
        chosen: list[Job] = []
        for victim in islice(self._candidates(job, mine, snapshot.running, now),
                             CANDIDATES_PER_JOB):
            assert victim.placement is not None
            nodes = [a.node for a in victim.placement.allocations
                     if a.node in pool.views and a.node not in held
                     and eligible(spec, pool.views[a.node].inventory)]
            if not nodes:
                continue
            chosen.append(victim)
            give_back(pool, victim)
            ok.update(n for n in nodes if len(pool.gpus[n]) >= d_gpn)
            if len(ok) < d_node:
                continue
            placement = realise(spec, pool, d_node, d_gpn, candidates=sorted(ok))
            if placement is not None:
                needed = needed_victims(spec, snapshot, chosen, placement.nodes, d_gpn)
                return needed, frozenset(placement.nodes)
        return None
