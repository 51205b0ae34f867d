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

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from masterd.core.cluster import ClusterSnapshot
from masterd.core.placement import FreePool, pack
from masterd.core.policy import Preempt
from shared.accounts import AccountTree, Resources
from shared.model import Job, JobSpec, WaitReason

if TYPE_CHECKING:
    from masterd.core.scheduler import SchedulingCore

GATE = WaitReason.QUOTA.value
# Resources in the order of a usage vector (index 0 is the job count).
RESOURCES = ("gpus", "cpus", "memory_mib")
UNITS = {"gpus": "GPUs", "cpus": "CPU cores", "memory_mib": "MiB of memory"}
# GPUs are counted in thousandths: a job sharing a GPU (Liquid's gpu_milli) charges its share.
SCALE = (1000, 1, 1)
UNBOUNDED = 1 << 62
# Owners tried for reclaim per pass: each costs a packing search, and a pass must stay cheap
# with thousands waiting; the next pass tries the next ones.
RECLAIMS_PER_PASS = 4

Vector = tuple[int, int, int]


def demand(spec: JobSpec) -> Vector:
    """What a job charges its accounts while it holds resources (GPUs in thousandths)."""
    gpus = spec.gpu_milli if spec.gpu_milli is not None and spec.gpus == 1 \
        else spec.gpus * 1000
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
    constrained: bool  # any cap or finite ceiling: a change of its use may change admission


def _limits(tree: AccountTree, name: str) -> _Limits:
    account = tree[name]
    cap = account.caps.running_jobs
    top = ceiling(account.quota, account.borrowing_limit)
    has_quota = any(getattr(account.quota, r) is not None for r in RESOURCES)
    return _Limits(UNBOUNDED if cap is None else cap, top,
                   _vector(account.quota, UNBOUNDED), has_quota,
                   cap is not None or any(v < UNBOUNDED for v in top) or has_quota)


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

    def set_tree(self, tree: AccountTree) -> None:
        self.tree = tree
        self.limits = {name: _limits(tree, name) for name in tree.accounts}
        self.lineages = {name: tree.lineage(name) for name in tree.accounts}
        charged = self.charged
        self.usage, self.charged, self.holders = {}, {}, {}
        for job_id, (account, need) in charged.items():
            self.charge(job_id, account, need)

    def lineage(self, account: str) -> tuple[str, ...]:
        """The accounts a job of ``account`` is charged to; () for one not in the tree
        (a job from before accounts existed, or of a removed account: unconstrained)."""
        return self.lineages.get(account, ())

    def charge(self, job_id: str, account: str, need: Vector) -> None:
        if job_id in self.charged:
            return
        self.charged[job_id] = (account, need)
        self.holders.setdefault(account, {})[job_id] = None
        for name in self.lineage(account):
            use = self.usage.setdefault(name, [0, 0, 0, 0])
            use[0] += 1
            use[1] += need[0]
            use[2] += need[1]
            use[3] += need[2]

    def release(self, job_id: str) -> str | None:
        entry = self.charged.pop(job_id, None)
        if entry is None:
            return None
        account, need = entry
        self.holders.get(account, {}).pop(job_id, None)
        for name in self.lineage(account):
            use = self.usage[name]
            use[0] -= 1
            use[1] -= need[0]
            use[2] -= need[1]
            use[3] -= need[2]
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

    def refusal(self, account: str, need: Vector, within: Vector | None = None) -> str | None:
        """Why a job of ``account`` needing ``need`` may not be admitted now, or None.
        ``within``: resources already freed by chosen victims (reclaim's what-if)."""
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
    leave the queue and their resources."""

    def __init__(self, tree: AccountTree) -> None:
        self.ledger = Ledger()
        self.ledger.set_tree(tree)
        self._core: SchedulingCore | None = None
        # account -> its queued jobs (gated or admitted), for re-checking after a change.
        self._queued: dict[str, dict[str, Job]] = {}
        # Accounts whose use changed since the last re-check.
        self._touched: set[str] = set()
        # owner job -> the borrowers preempted for it, while it waits: nothing else borrows.
        self.reclaiming: dict[str, set[str]] = {}
        self._recheck_all = False
        # Every account whose queued jobs a change of ``name``'s use may affect.
        self._affected: dict[str, tuple[str, ...]] = {}
        self._index_tree()

    @property
    def tree(self) -> AccountTree:
        return self.ledger.tree

    def _index_tree(self) -> None:
        tree = self.ledger.tree
        self._affected = {}
        for name in tree.accounts:
            out: dict[str, None] = {}
            for anc in tree.lineage(name):
                if self.ledger.limits[anc].constrained:
                    out.update(dict.fromkeys(tree.subtree(anc)))
            self._affected[name] = tuple(out)

    def set_tree(self, tree: AccountTree) -> None:
        """The account tree changed (trellisctl account ...): every queued job re-checked."""
        self.ledger.set_tree(tree)
        self._index_tree()
        regrouped: dict[str, dict[str, Job]] = {}
        for jobs in self._queued.values():
            for job in jobs.values():
                regrouped.setdefault(job.spec.tenant, {})[job.id] = job
        self._queued = regrouped
        self._recheck_all = True
        self.recheck()

    def queued_in(self, account: str) -> Mapping[str, Job]:
        """The queued jobs of ``account`` itself (gated or admitted)."""
        return self._queued.get(account, {})

    # -- hooks the core calls ------------------------------------------------------------
    def bind(self, core: SchedulingCore) -> None:
        self._core = core
        for job in core.active_jobs().values():
            self.ledger.charge(job.id, job.spec.tenant, demand(job.spec))
        for job in [*core.queue(), *core.blocked().values()]:
            self._queued.setdefault(job.spec.tenant, {})[job.id] = job
        self._recheck_all = True
        self.recheck()

    def queued(self, job: Job) -> None:
        """A job (re-)enters the queue: close its gate now if it may not be admitted (the
        core files it among the blocked jobs)."""
        self._queued.setdefault(job.spec.tenant, {})[job.id] = job
        why = self.refusal(job)
        if why is not None:
            job.gates[GATE] = why
        else:
            job.gates.pop(GATE, None)

    def dequeued(self, job: Job) -> None:
        """A queued job left the queue without starting (cancelled)."""
        self._queued.get(job.spec.tenant, {}).pop(job.id, None)
        self._owner_done(job.id)

    def admit(self, job: Job) -> bool:
        """Whether a job the policy chose may start now; if not, its gate closes."""
        why = self.refusal(job)
        if why is None:
            return True
        assert self._core is not None
        self._core.set_gate(job.id, GATE, why)
        return False

    def started(self, job: Job) -> None:
        """A job took its resources (or was restored holding them)."""
        self._queued.get(job.spec.tenant, {}).pop(job.id, None)
        self.ledger.charge(job.id, job.spec.tenant, demand(job.spec))
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
        if self.reclaiming.pop(job_id, None) is not None and not self.reclaiming:
            self._recheck_all = True  # borrowing may resume

    # -- decisions -----------------------------------------------------------------------
    def refusal(self, job: Job) -> str | None:
        account, need = job.spec.tenant, demand(job.spec)
        why = self.ledger.refusal(account, need)
        if why is None and self.reclaiming and job.id not in self.reclaiming \
                and self.ledger.lineage(account) and not self.ledger.guaranteed(account, need):
            owners = ", ".join(sorted(self.reclaiming))
            why = (f"account {account!r} would borrow while borrowed resources are being "
                   f"reclaimed (for {owners})")
        return why

    def recheck(self) -> None:
        """Open or close the gates of queued jobs whose accounts' use changed."""
        core = self._core
        if core is None:
            return
        if self._recheck_all:
            accounts: Iterable[str] = list(self._queued)
            self._recheck_all = False
        else:
            seen: dict[str, None] = {}
            for name in self._touched:
                seen.update(dict.fromkeys(self._affected.get(name, ())))
            accounts = seen
        self._touched.clear()
        for account in accounts:
            jobs = self._queued.get(account)
            if not jobs:
                continue
            for job in list(jobs.values()):
                why = self.refusal(job)
                if why != job.gates.get(GATE):
                    core.set_gate(job.id, GATE, why)

    def reclaim(self, snapshot: ClusterSnapshot, queue_order: Mapping[str, object]
                ) -> list[Preempt]:
        """Preempt borrowers for admitted jobs within their accounts' quotas that the
        policy could not place. ``queue_order``: each admitted job's key in the queue."""
        ledger = self.ledger
        borrowers = [a for a in ledger.holders if ledger.holders[a] and ledger.borrowing(a)]
        if not borrowers:
            return []
        decisions: list[Preempt] = []
        tried = 0
        for account, jobs in self._queued.items():
            if tried >= RECLAIMS_PER_PASS:
                break
            if account in borrowers or not ledger.limits.get(account, None) \
                    or not ledger.limits[account].has_quota:
                continue
            waiting = [j for j in jobs.values() if j.id in queue_order]
            if not waiting:
                continue
            # Its first job in the queue's order.
            owner = min(waiting, key=lambda j: queue_order[j.id])  # type: ignore[arg-type,return-value]
            if self.reclaiming.get(owner.id):
                continue  # its victims are still stopping
            need = demand(owner.spec)
            if not ledger.guaranteed(account, need):
                continue
            tried += 1
            victims = self._victims(owner, snapshot)
            if not victims:
                continue
            self.reclaiming[owner.id] = set(victims)
            reason = (f"reclaimed: account {account!r} needs its quota back for job "
                      f"{owner.id}")
            decisions.extend(Preempt(v, reason) for v in victims)
            self._recheck_all = True  # borrowing pauses until the owner starts
        if decisions:
            self.recheck()
        return decisions

    def _victims(self, owner: Job, snapshot: ClusterSnapshot) -> list[str]:
        """Running jobs of borrowing accounts, newest first, whose resources would let the
        owner fit; [] when the owner fits already or they would not make it fit."""
        pool = FreePool(snapshot)
        if pack(owner.spec, pool) is not None:
            return []  # it fits: the policy chose not to start it (its order), no reclaim
        ledger = self.ledger
        mine = set(ledger.lineage(owner.spec.tenant))
        running = snapshot.running
        candidates: list[Job] = []
        for account, holders in ledger.holders.items():
            # Not the owner's own lineage: inside an account, order is the policy's business.
            if not holders or account in mine or not any(
                    ledger.borrowing(a) for a in ledger.lineage(account) if a not in mine):
                continue
            for job_id in holders:
                job = running.get(job_id)
                if job is not None and not job.stopping and job.placement is not None:
                    candidates.append(job)
        candidates.sort(key=lambda j: (j.start_time or 0.0, j.id), reverse=True)
        freed: dict[str, list[int]] = {}
        chosen: list[Job] = []
        for job in candidates:
            lineage = ledger.lineage(job.spec.tenant)
            # Only while it (or an ancestor the owner does not share) still borrows once
            # earlier victims are gone: an account is never pushed below its own quota.
            if not any(ledger.borrowing(a, freed) for a in lineage if a not in mine):
                continue
            if owner.spec.gpu_model is not None and owner.spec.gpus and not any(
                    snapshot.nodes[a.node].gpu_model == owner.spec.gpu_model
                    for a in job.placement.allocations  # type: ignore[union-attr]
                    if a.node in snapshot.nodes):
                continue
            need = demand(job.spec)
            for a in lineage:
                f = freed.setdefault(a, [0, 0, 0])
                for i in range(3):
                    f[i] += need[i]
            chosen.append(job)
            _give_back(pool, job)
            if pack(owner.spec, pool) is not None:
                return [j.id for j in _pruned(owner, snapshot, chosen)]
        return []


def _give_back(pool: FreePool, job: Job) -> None:
    """What-if: ``job``'s resources free in ``pool``."""
    for alloc in job.placement.allocations:  # type: ignore[union-attr]
        if alloc.node not in pool.views:
            continue
        pool.assign(alloc.node, gpus=pool.gpus[alloc.node] | frozenset(alloc.gpus),
                    cpus=pool.cpus[alloc.node] | frozenset(alloc.cpus))
        pool.memory.store(alloc.node, pool.memory[alloc.node] + alloc.memory_mib)


def _pruned(owner: Job, snapshot: ClusterSnapshot, chosen: list[Job]) -> list[Job]:
    """``chosen`` without the victims the owner fits without, oldest first (the newest
    chosen made it fit): a borrower on another node than the one the owner lands on
    keeps running."""
    kept = list(chosen)
    for job in reversed(chosen[:-1]):
        trial = [j for j in kept if j is not job]
        pool = FreePool(snapshot)
        for other in trial:
            _give_back(pool, other)
        if pack(owner.spec, pool) is not None:
            kept = trial
    return kept
