"""Quota admission: which queued jobs the policy may see, given what their accounts use.

Kueue's split: admission comes before the policy orders jobs. A queued job is *admitted*
(in the queue the policy sees) only while, for its account and every ancestor:

* fewer than ``caps.running_jobs`` of the account's (subtree's) jobs are starting or running;
* its use plus the job's demand stays within ``quota + borrowing_limit`` for each resource
  (GPUs, CPU cores, memory). An unset quota guarantees nothing and an unset borrowing limit
  bounds nothing but the cluster (see :func:`ceiling`);
* no reclaim is pending (below) when the job would borrow.

A job not admitted waits behind the ``quota`` admission gate (``SchedulingCore.set_gate``)
with a sentence naming the account and the limit; the gate opens when the account's use
falls (a job of it ends) or the tree changes.

*Borrowing*: a job that takes an account over its nominal quota runs on resources another
account is entitled to but leaves idle. *Reclaim*: when an account within its quota has an
admitted job that the policy could not place, and running jobs of borrowing accounts hold
what it needs, the borrowers are preempted (newest first: least work lost) until the job
fits, and nothing else may borrow until it has started. Preempted borrowers are requeued
through the ordinary preemption path, stopped with their grace.

The counters are incremental (a job charges its lineage when it starts and is released when
it leaves its resources); a pass pays only for the accounts whose use changed. Plain
synchronous code: the master and the simulator (sim/engine.py) both drive it through
:class:`masterd.core.scheduler.SchedulingCore`.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from masterd.core.cluster import ClusterSnapshot
from masterd.core.placement import FreePool
from masterd.core.policy import Preempt
from masterd.core.scheduler import Reorder
from masterd.core.whatif import fewest_nodes_shape, fits_now, free_until_fits
from shared.accounts import AccountTree, Resources
from shared.model import Job, JobSpec, Placement, WaitReason

if TYPE_CHECKING:
    from masterd.core.scheduler import SchedulingCore

GATE = WaitReason.QUOTA.value
# Resources in the order of a usage vector (index 0 is the job count).
RESOURCES = ("gpus", "cpus", "memory_mib")
UNITS = {"gpus": "GPUs", "cpus": "CPU cores", "memory_mib": "MiB of memory"}
# GPUs are counted in thousandths: a job sharing a GPU (Liquid's gpu_milli) charges its share.
SCALE = (1000, 1, 1)
UNBOUNDED = 1 << 62
# Owners tried for reclaim per pass: each costs packing searches, and a pass must stay cheap
# with thousands waiting; the next pass starts from the next account (round robin).
RECLAIMS_PER_PASS = 1
# Passes before an owner whose reclaim found nothing to do (it fits already, or freeing every
# borrower would not make it fit) is tried again.
RETRY_PASSES = 16

Vector = tuple[int, int, int]


def demand(spec: JobSpec, placement: Placement | None = None) -> Vector:
    """What a job charges its accounts while it holds resources (GPUs in thousandths).

    A job asking for a share of one GPU charges its share where it is granted one (a shared
    allocation) and the whole GPU where a policy gives it one of its own: a policy that does
    not share (fifo, drf) once charged 0.25 for a GPU nobody else could use. Without a
    placement (a queued job), what it asks for."""
    gpus = spec.gpus * 1000
    if spec.gpu_milli is not None and spec.gpus == 1 and (
            placement is None or any(a.shared for a in placement.allocations)):
        gpus = spec.gpu_milli
    return (gpus, spec.cpus, spec.memory_mib)


def shown(index: int, value: int) -> int | float:
    """A counted amount in its resource's unit (GPUs back from thousandths)."""
    if value >= UNBOUNDED:
        return value
    scaled = value / SCALE[index]
    return int(scaled) if scaled == int(scaled) else scaled


def _vector(resources: Resources, unset: int) -> Vector:
    return tuple(unset if getattr(resources, r) is None else getattr(resources, r) * k
                 for r, k in zip(RESOURCES, SCALE, strict=True))  # type: ignore[return-value]


def ceiling(quota: Resources, borrowing_limit: Resources) -> Vector:
    """The most an account may use of each resource: quota + borrowing limit. No borrowing
    limit: no bound but the cluster. No quota but a borrowing limit: the limit alone."""
    out = []
    for r, k in zip(RESOURCES, SCALE, strict=True):
        q, b = getattr(quota, r), getattr(borrowing_limit, r)
        out.append(UNBOUNDED if b is None else ((q or 0) + b) * k)
    return tuple(out)  # type: ignore[return-value]


@dataclass
class _Limits:
    """One account's limits, as flat vectors (read per job per check)."""

    running_jobs: int
    ceiling: Vector
    # Its nominal quota; a resource without one counts as UNBOUNDED for the guarantee test
    # and is never "borrowed" (see Ledger.borrowing).
    quota: Vector
    has_quota: bool
    # A running_jobs cap or a finite ceiling: a change of its use may change admission.
    constrained: bool


def _limits(tree: AccountTree, name: str) -> _Limits:
    account = tree[name]
    cap = account.caps.running_jobs
    top = ceiling(account.quota, account.borrowing_limit)
    has_quota = any(getattr(account.quota, r) is not None for r in RESOURCES)
    return _Limits(UNBOUNDED if cap is None else cap, top,
                   _vector(account.quota, UNBOUNDED), has_quota,
                   cap is not None or any(v < UNBOUNDED for v in top))


@dataclass
class Ledger:
    """Per-account use (jobs, GPUs, cores, memory) of starting and running jobs, each
    account charged for its whole subtree."""

    tree: AccountTree = field(default_factory=AccountTree)
    usage: dict[str, list[int]] = field(default_factory=dict)
    # job -> (its account, its demand), while it holds resources.
    charged: dict[str, tuple[str, Vector]] = field(default_factory=dict)
    # account -> its own jobs holding resources (not its sub-accounts'), for reclaim.
    holders: dict[str, dict[str, None]] = field(default_factory=dict)
    limits: dict[str, _Limits] = field(default_factory=dict)
    lineages: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # Accounts using more than their nominal quota now (kept as use changes).
    over: set[str] = field(default_factory=set)

    def set_tree(self, tree: AccountTree) -> None:
        self.tree = tree
        self.limits = {name: _limits(tree, name) for name in tree.accounts}
        self.lineages = {name: tree.lineage(name) for name in tree.accounts}
        charged = self.charged
        self.usage, self.charged, self.holders, self.over = {}, {}, {}, set()
        for job_id, (account, need) in charged.items():
            self.charge(job_id, account, need)

    def _note_over(self, lineage: tuple[str, ...]) -> None:
        for name in lineage:
            if self.borrowing(name):
                self.over.add(name)
            else:
                self.over.discard(name)

    def lineage(self, account: str) -> tuple[str, ...]:
        """The accounts a job of ``account`` is charged to; () for one not in the tree
        (a job from before accounts existed, or of a removed account: unconstrained)."""
        return self.lineages.get(account, ())

    def charge(self, job_id: str, account: str, need: Vector) -> None:
        if job_id in self.charged:
            return
        self.charged[job_id] = (account, need)
        self.holders.setdefault(account, {})[job_id] = None
        lineage = self.lineage(account)
        for name in lineage:
            use = self.usage.setdefault(name, [0, 0, 0, 0])
            use[0] += 1
            use[1] += need[0]
            use[2] += need[1]
            use[3] += need[2]
        self._note_over(lineage)

    def release(self, job_id: str) -> str | None:
        entry = self.charged.pop(job_id, None)
        if entry is None:
            return None
        account, need = entry
        self.holders.get(account, {}).pop(job_id, None)
        lineage = self.lineage(account)
        for name in lineage:
            use = self.usage[name]
            use[0] -= 1
            use[1] -= need[0]
            use[2] -= need[1]
            use[3] -= need[2]
        self._note_over(lineage)
        return account

    def used(self, account: str) -> Vector:
        use = self.usage.get(account)
        return (0, 0, 0) if use is None else (use[1], use[2], use[3])

    def running_own(self, account: str) -> int:
        """Jobs of ``account`` itself (not its sub-accounts') holding resources."""
        return len(self.holders.get(account, ()))

    def running(self, account: str) -> int:
        use = self.usage.get(account)
        return 0 if use is None else use[0]

    def never(self, account: str, need: Vector) -> str | None:
        """Why a job of ``account`` needing ``need`` can never be admitted under today's
        limits (it alone is over a quota + borrowing limit along its lineage), or None."""
        for name in self.lineage(account):
            limit = self.limits[name]
            if not limit.constrained:
                continue
            for i, r in enumerate(RESOURCES):
                if need[i] > limit.ceiling[i]:
                    return (f"asks for {shown(i, need[i])} {UNITS[r]}, more than account "
                            f"{name!r} may ever use (its quota + borrowing limit is "
                            f"{shown(i, limit.ceiling[i])})")
        return None

    def refusal(self, account: str, need: Vector) -> str | None:
        """Why a job of ``account`` needing ``need`` may not be admitted now, or None."""
        never = self.never(account, need)
        if never is not None:  # no end of other jobs lets it in: say so, and what would
            return f"it {never}; it runs only once that limit is raised"
        for name in self.lineage(account):
            limit = self.limits[name]
            if not limit.constrained:
                continue
            use = self.usage.get(name)
            if use is None:
                use = [0, 0, 0, 0]
            if use[0] >= limit.running_jobs:
                return (f"account {name!r} runs {use[0]} job(s), its running_jobs cap "
                        f"({limit.running_jobs})")
            for i, r in enumerate(RESOURCES):
                if need[i] and use[i + 1] + need[i] > limit.ceiling[i]:
                    return (f"account {name!r} would use "
                            f"{shown(i, use[i + 1] + need[i])} {UNITS[r]}, over its quota + "
                            f"borrowing limit ({shown(i, limit.ceiling[i])})")
        return None

    def guaranteed(self, account: str, need: Vector) -> bool:
        """Whether the job fits within its account's nominal quota (and every ancestor's
        that sets one): what entitles it to reclaim borrowed resources."""
        lineage = self.lineage(account)
        if not lineage or not self.limits[account].has_quota:
            return False
        for name in lineage:
            limit = self.limits[name]
            if not limit.has_quota:
                continue
            use = self.used(name)
            for i in range(3):
                if need[i] and use[i] + need[i] > limit.quota[i]:
                    return False
        return True

    def borrowing(self, account: str, freed: Mapping[str, list[int]] | None = None) -> bool:
        """Whether ``account`` uses more than its nominal quota of a resource it has one
        for (an account without any quota borrows everything it uses). ``freed``: use
        already taken off by chosen victims."""
        limit = self.limits.get(account)
        if limit is None:
            return False
        use = list(self.used(account))
        if freed and account in freed:
            use = [u - f for u, f in zip(use, freed[account], strict=True)]
        if not limit.has_quota:
            return any(u > 0 for u in use)
        return any(use[i] > limit.quota[i] for i in range(3))


class QuotaAdmission:
    """The ``quota`` admission gate and reclaim, attached to one SchedulingCore
    (``SchedulingCore.set_admission``). The core calls the hooks below as jobs enter and
    leave the queue and their resources.

    Kept cheap with thousands waiting: each account's *room* (whether it or an ancestor is at
    its running_jobs cap, and the least headroom under a ceiling along its lineage) is
    recomputed only for the accounts a change of use may affect, and only the jobs that may
    flip are re-checked: the admitted ones when the room shrank, the gated ones when it grew.
    A pending reclaim pauses borrowing lazily: a job that would borrow is held back when the
    policy picks it, not every such job at once.
    """

    def __init__(self, tree: AccountTree) -> None:
        self.ledger = Ledger()
        self.ledger.set_tree(tree)
        self._core: SchedulingCore | None = None
        # account -> its queued jobs, admitted (open) or behind the quota gate (gated), each
        # with its demand.
        self._open: dict[str, dict[str, tuple[Job, Vector]]] = {}
        self._gated: dict[str, dict[str, tuple[Job, Vector]]] = {}
        # account -> heap of (queue key, job) of its admitted jobs, stale entries skipped:
        # reclaim looks at each account's first waiting job.
        self._heads: dict[str, list[tuple[Any, str]]] = {}
        # account -> (jobs it may still start, headroom) as last checked (see _room).
        self._rooms: dict[str, tuple[int, Vector]] = {}
        # Accounts whose use changed since the last re-check.
        self._touched: set[str] = set()
        # owner job -> the borrowers preempted for it, while it waits: nothing else borrows.
        self.reclaiming: dict[str, set[str]] = {}
        # Jobs held back because a reclaim was pending: let go when it ends.
        self._paused: set[str] = set()
        self._recheck_all = False
        # Every account whose room a change of ``name``'s use may change.
        self._affected: dict[str, tuple[str, ...]] = {}
        self._turn = 0  # where reclaim's round robin over accounts starts
        self._passes = 0
        # owner job -> the pass from which it may be tried again (see RETRY_PASSES).
        self._retry: dict[str, int] = {}
        self._index_tree()

    @property
    def tree(self) -> AccountTree:
        return self.ledger.tree

    def _index_tree(self) -> None:
        tree = self.ledger.tree
        self._affected = {}
        for name in tree.accounts:
            out: dict[str, None] = {name: None}
            for anc in tree.lineage(name):
                if self.ledger.limits[anc].constrained:
                    out.update(dict.fromkeys(tree.subtree(anc)))
            self._affected[name] = tuple(out)
        self._rooms = {}

    def set_tree(self, tree: AccountTree) -> None:
        """The account tree changed (trellisctl account ...): every queued job re-checked."""
        self.ledger.set_tree(tree)
        self._index_tree()
        self._recheck_all = True
        self.recheck()

    def restored(self) -> None:
        """After a restore: the running jobs in the order they started (a restore charges
        them in the journal's order), which is the order reclaim reads newest first."""
        core = self._core
        if core is None:
            return
        charged = self.ledger.charged
        order = sorted(charged, key=lambda j: _started_at(core.jobs[j]) if j in core.jobs
                       else (float("inf"), j))
        self.ledger.charged = {j: charged[j] for j in order}

    def queued_in(self, account: str) -> Mapping[str, Any]:
        """The queued jobs of ``account`` itself (gated or admitted), by id."""
        return {**self._open.get(account, {}), **self._gated.get(account, {})}

    def queued_count(self, account: str) -> int:
        return len(self._open.get(account, ())) + len(self._gated.get(account, ()))

    def _file(self, job: Job, need: Vector, gated: bool) -> None:
        account = job.spec.tenant
        if gated:
            self._open.get(account, {}).pop(job.id, None)
            self._gated.setdefault(account, {})[job.id] = (job, need)
        else:
            self._gated.get(account, {}).pop(job.id, None)
            self._open.setdefault(account, {})[job.id] = (job, need)

    def _unfile(self, job: Job) -> None:
        account = job.spec.tenant
        self._open.get(account, {}).pop(job.id, None)
        self._gated.get(account, {}).pop(job.id, None)

    def _gate(self, job: Job, need: Vector, why: str | None) -> None:
        """Close (``why``) or open the job's quota gate, and file it so."""
        assert self._core is not None
        self._core.set_gate(job.id, GATE, why)
        self._file(job, need, why is not None)

    # -- hooks the core calls ------------------------------------------------------------
    def bind(self, core: SchedulingCore) -> None:
        self._core = core
        # In the order they started: reclaim takes the newest first (the ledger's order).
        for job in sorted(core.active_jobs().values(), key=_started_at):
            self.ledger.charge(job.id, job.spec.tenant, demand(job.spec, job.placement))
        for job in [*core.queue(), *core.blocked().values()]:
            self._file(job, demand(job.spec), GATE in job.gates)
        for key, job_id in core.queue_keys():
            job = core.jobs[job_id]
            self._heads.setdefault(job.spec.tenant, []).append((key, job_id))
        for heap in self._heads.values():
            heapq.heapify(heap)
        self._recheck_all = True
        self.recheck()

    def queued(self, job: Job) -> None:
        """A job (re-)enters the queue: close its gate now if it may not be admitted (the
        core files it among the blocked jobs)."""
        need = demand(job.spec)
        why = self.ledger.refusal(job.spec.tenant, need)
        if why is not None:
            job.gates[GATE] = why
        else:
            job.gates.pop(GATE, None)
        self._file(job, need, why is not None)

    def ordered(self, job: Job, key: Any) -> None:
        """An admitted job took its place in the queue under ``key``."""
        heapq.heappush(self._heads.setdefault(job.spec.tenant, []), (key, job.id))

    def dequeued(self, job: Job) -> None:
        """A queued job left the queue without starting (cancelled)."""
        self._unfile(job)
        self._paused.discard(job.id)
        self._owner_done(job.id)

    def admit(self, job: Job, placement: Placement) -> str | None:
        """None when a job the policy chose may start now on ``placement``; otherwise its
        gate closes and the answer says why: "limit" (a cap or ceiling), "pause" (it would
        borrow while a reclaim is pending). The charge is the placement's (a share of a GPU
        only where it is granted a share)."""
        need = demand(job.spec, placement)
        why = self.ledger.refusal(job.spec.tenant, need)
        kind = "limit"
        if why is None and self.reclaiming and job.id not in self.reclaiming:
            why = self._pause_refusal(job.spec.tenant, need)
            if why is not None:
                self._paused.add(job.id)
                kind = "pause"
        if why is None:
            return None
        self._gate(job, need, why)
        return kind

    def within_quota(self, job: Job) -> bool:
        """Whether stopping ``job`` would take its account (or an ancestor) below what it
        is guaranteed: none of them uses more than its quota. A priority class's preemption
        spares such a job."""
        lineage = self.ledger.lineage(job.spec.tenant)
        return bool(lineage) and not any(self.ledger.borrowing(a) for a in lineage)

    def permits(self, job: Job, placement: Placement) -> str | None:
        """Why a job that bypasses the queue (an inference replica on its given placement)
        may not take ``placement`` now, or None; nothing is gated or filed."""
        return self.ledger.refusal(job.spec.tenant, demand(job.spec, placement))

    def started(self, job: Job) -> None:
        """A job took its resources (or was restored holding them)."""
        self._unfile(job)
        self.ledger.charge(job.id, job.spec.tenant, demand(job.spec, job.placement))
        self._touched.add(job.spec.tenant)
        self._owner_done(job.id)

    def released(self, job: Job) -> None:
        """A job gave its resources back (ended, requeued, failed to start)."""
        account = self.ledger.release(job.id)
        if account is not None:
            self._touched.add(account)
        for victims in self.reclaiming.values():
            victims.discard(job.id)

    def _owner_done(self, job_id: str) -> None:
        self._retry.pop(job_id, None)
        if self.reclaiming.pop(job_id, None) is not None and not self.reclaiming:
            self._resume()

    def _resume(self) -> None:
        """The reclaim ended: jobs held back for it may borrow again."""
        core = self._core
        paused, self._paused = self._paused, set()
        if core is None:
            return
        for job_id in paused:
            job = core.jobs.get(job_id)
            if job is None or GATE not in job.gates:
                continue
            need = demand(job.spec)
            self._gate(job, need, self.ledger.refusal(job.spec.tenant, need))

    # -- decisions -----------------------------------------------------------------------
    def _pause_refusal(self, account: str, need: Vector) -> str | None:
        """Why a job may not borrow while a reclaim is pending, or None."""
        if not self.ledger.lineage(account) or self.ledger.guaranteed(account, need):
            return None
        owners = ", ".join(sorted(self.reclaiming))
        return (f"account {account!r} would borrow while borrowed resources are being "
                f"reclaimed (for {owners})")

    def _room(self, account: str) -> tuple[int, Vector]:
        """How many more jobs ``account`` may run (its and its ancestors' running_jobs caps)
        and the least headroom under a ceiling along its lineage: a job is admitted iff the
        first is positive and its demand is within the headroom (where it asks for a
        resource at all)."""
        ledger = self.ledger
        n = g = c = m = UNBOUNDED
        for name in ledger.lineage(account):
            limit = ledger.limits[name]
            if not limit.constrained:
                continue
            use = ledger.usage.get(name) or (0, 0, 0, 0)
            top = limit.ceiling
            n = min(n, limit.running_jobs - use[0])
            g = min(g, top[0] - use[1])
            c = min(c, top[1] - use[2])
            m = min(m, top[2] - use[3])
        return n, (g, c, m)

    def recheck(self) -> None:
        """Open or close the gates of queued jobs whose accounts' room changed.

        When the room grew, gated jobs are let in in their order of arrival only while
        they fit what the room leaves beside the jobs already admitted: a job ending frees
        room for the next few, not for the hundreds an account may have waiting (which
        would open and close again at the next start)."""
        if self._core is None:
            return
        if self._recheck_all:
            accounts: Iterable[str] = {*self._open, *self._gated}
            self._recheck_all = False
            self._rooms = {}
        else:
            seen: dict[str, None] = {}
            for name in self._touched:
                seen.update(dict.fromkeys(self._affected.get(name, ())))
            accounts = seen
        self._touched.clear()
        for account in accounts:
            room = self._room(account)
            before = self._rooms.get(account)
            if before == room:
                continue
            self._rooms[account] = room
            n, (g, c, m) = room
            if before is None:
                tighter = looser = True
            else:
                (n0, (g0, c0, m0)) = before
                tighter = n < n0 or g < g0 or c < c0 or m < m0
                looser = n > n0 or g > g0 or c > c0 or m > m0
            if tighter:
                for job, need in list(self._open.get(account, {}).values()):
                    if n <= 0 or (need[0] and need[0] > g) or (need[1] and need[1] > c) \
                            or (need[2] and need[2] > m):
                        self._gate(job, need, self.ledger.refusal(account, need))
            if looser and n > 0 and self._gated.get(account):
                self._let_in(account, n, g, c, m)

    def _let_in(self, account: str, n: int, g: int, c: int, m: int) -> None:
        """Open gated jobs of ``account`` in arrival order while they fit the room left
        beside its admitted jobs."""
        for _, need in self._open.get(account, {}).values():
            n -= 1
            g, c, m = g - need[0], c - need[1], m - need[2]
        for job, need in list(self._gated[account].values()):
            if n <= 0:
                return
            if job.id in self._paused:
                continue
            if (need[0] and need[0] > g) or (need[1] and need[1] > c) \
                    or (need[2] and need[2] > m):
                return  # in order: a job that does not fit keeps the later ones waiting
            self._gate(job, need, None)
            n -= 1
            g, c, m = g - need[0], c - need[1], m - need[2]

    def _head(self, account: str, queue_order: Mapping[str, Any]) -> str | None:
        """The first admitted job of ``account`` in the queue's order, or None."""
        heap = self._heads.get(account)
        while heap:
            key, job_id = heap[0]
            if queue_order.get(job_id) == key:
                return job_id
            heapq.heappop(heap)  # started, gated or re-queued under a new key since
        return None

    def reclaim(self, snapshot: ClusterSnapshot, queue_order: Mapping[str, Any]
                ) -> list[Preempt | Reorder]:
        """Preempt borrowers for admitted jobs within their accounts' quotas that the
        policy could not place. ``queue_order``: each admitted job's key in the queue.

        The owner moves to the head of the queue, ahead of its victims (which a preemption
        requeues at the head), so that the policy gives it what is freed."""
        ledger = self.ledger
        self._passes += 1
        # An owner whose victims have all exited had this pass to start; still waiting (the
        # policy placed others, or its placement rules differ from the what-if's), it stops
        # pausing borrowing and backs off.
        for owner_id, victims in list(self.reclaiming.items()):
            if not victims:
                del self.reclaiming[owner_id]
                self._retry[owner_id] = self._passes + RETRY_PASSES
        if not self.reclaiming and self._paused:
            self._resume()
        assert self._core is not None
        queue = self._core.queue()
        first = queue[0] if len(queue) else None
        # The first job of the queue would borrow: it may keep owners behind it waiting.
        blocking = first is not None and bool(ledger.lineage(first.spec.tenant)) \
            and not ledger.guaranteed(first.spec.tenant, demand(first.spec))
        if not ledger.over and not blocking:
            return []
        assert self._core is not None
        decisions: list[Preempt | Reorder] = []
        tried = 0
        accounts = list(self._heads)
        self._turn = (self._turn + 1) % max(1, len(accounts))
        for account in accounts[self._turn:] + accounts[:self._turn]:
            heap = self._heads[account]
            if tried >= RECLAIMS_PER_PASS:
                break
            limit = ledger.limits.get(account)
            if not heap or account in ledger.over or limit is None or not limit.has_quota:
                continue
            head = self._head(account, queue_order)
            if head is None or self.reclaiming.get(head) \
                    or self._retry.get(head, 0) > self._passes:
                continue  # nothing waits, its victims are still stopping, or it backs off
            owner = self._core.jobs[head]
            if not ledger.guaranteed(account, demand(owner.spec)):
                continue
            tried += 1
            victims = self._victims(owner, snapshot)
            if victims is None and blocking and self._jump(owner, first):  # type: ignore[arg-type]
                decisions.append(Reorder(owner.id))
                continue
            if not victims:
                self._retry[head] = self._passes + RETRY_PASSES
                continue
            self._retry.pop(head, None)
            self.reclaiming[owner.id] = set(victims)
            reason = (f"reclaimed: account {account!r} needs its quota back for job "
                      f"{owner.id}")
            decisions.extend(Preempt(v, reason) for v in victims)
            running = snapshot.running
            owner.requeue_priority = max(
                owner.requeue_priority,
                *(running[v].requeue_priority + 2 for v in victims if v in running))
            decisions.append(Reorder(owner.id))
        return decisions

    def _candidates(self, owner: Job, running: Mapping[str, Job]) -> Iterator[Job]:
        """Running jobs of borrowing accounts outside the owner's lineage, newest first: in
        the reverse of the order they took their resources (the ledger keeps it), so the
        search stops at the first few instead of sorting every running job."""
        ledger = self.ledger
        mine = set(ledger.lineage(owner.spec.tenant))
        eligible: dict[str, bool] = {}
        for job_id in reversed(ledger.charged):
            account = ledger.charged[job_id][0]
            ok = eligible.get(account)
            if ok is None:
                # Not the owner's own lineage: inside an account, order is the policy's.
                ok = eligible[account] = account not in mine and any(
                    a in ledger.over for a in ledger.lineage(account) if a not in mine)
            if ok:
                job = running.get(job_id)
                if job is not None:
                    yield job

    def _jump(self, owner: Job, head: Job) -> bool:
        """An owner that fits the free resources but waits while the first job of the queue
        would borrow (a FIFO head that does not fit blocks all behind it): the owner goes
        ahead of it. Owners within their quotas come before borrowers; among themselves
        they keep the policy's order."""
        if head.id == owner.id or head.spec.tenant in self.ledger.lineage(owner.spec.tenant):
            return False
        owner.requeue_priority = max(owner.requeue_priority, head.requeue_priority + 1)
        return True

    def _victims(self, owner: Job, snapshot: ClusterSnapshot) -> list[str] | None:
        """Running jobs of borrowing accounts, newest first, whose resources would let the
        owner fit; None when it fits already, [] when they would not make it fit.

        The what-if is kept cheap on a large cluster: the owner's shape is the fewest nodes
        it can use, and a placement is searched only among the nodes that have (or were
        given back) enough free GPUs for it, once there are enough of them. Victims on nodes
        the placement does not use, or not needed on the nodes it uses, keep running."""
        spec = owner.spec
        pool = FreePool(snapshot)
        if fits_now(spec, pool):
            return None  # it fits: the policy chose not to start it (its order)
        shape = fewest_nodes_shape(spec, pool)
        if shape is None:
            return []
        ledger = self.ledger
        mine = set(ledger.lineage(spec.tenant))
        freed: dict[str, list[int]] = {}

        def borrowers() -> Iterator[Job]:
            for job in self._candidates(owner, snapshot.running):
                if job.stopping or job.placement is None:
                    continue
                # Only while it (or an ancestor the owner does not share) still borrows once
                # earlier victims are gone: an account is never pushed below its own quota.
                if any(ledger.borrowing(a, freed) for a in ledger.lineage(job.spec.tenant)
                       if a not in mine):
                    yield job

        def given_back(job: Job) -> None:
            need = demand(job.spec, job.placement)  # what stopping it gives back
            for a in ledger.lineage(job.spec.tenant):
                f = freed.setdefault(a, [0, 0, 0])
                for i in range(3):
                    f[i] += need[i]

        found = free_until_fits(spec, snapshot, pool, shape, borrowers(), chosen=given_back)
        return [] if found is None else [j.id for j in found[0]]


def _started_at(job: Job) -> tuple[float, str]:
    # A job still starting has no start time yet: it is the newest.
    return (job.start_time if job.start_time is not None else float("inf"), job.id)
