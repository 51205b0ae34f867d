"""SODA's multi-array scheduler (§V-C) as a policy wrapping any inner ordering policy.

One pass, given the snapshot, the queue (in the core's order: re-queued jobs first, then by
submit time) and ``now``:

1. **Home passes.** Each queued job belongs to one job array (``large:M``, ``small:M`` or
   ``cpu``; see :meth:`ArrayMap.home`). For every array in turn the array's inner policy
   decides over a restricted snapshot holding only the array's units (minus what earlier
   arrays took in this pass), the running jobs cut down to what they hold there, and only the
   array's queued jobs. Jobs over their tenant's quota are withheld; if an inner policy starts
   two jobs that together pass a quota, the later one is withheld and the inner policy asked
   again. Decisions outside the array, or reusing a unit, are dropped and logged, so no unit
   is ever given twice whatever the inner policy does.
2. **Borrowing.** A job whose array cannot host it now may borrow, unless reclaiming the
   array's own loans would host it (step 3 then reclaims them: an owner waits for its own
   array rather than becoming a borrower elsewhere, and a large job keeps whole nodes). It is
   packed onto its own free units plus the idle units of its lender arrays (small <-> large of
   the same model, any model for jobs naming none, the GPU-job cores for CPU jobs). With
   ``lending = "idle"`` an array lends only while none of its owners waits for it (a waiting
   owner that could fit the array at all), so a loan is never preempted in the pass right
   after it was made; with ``"free"`` (SODA §V-C) it lends unless a waiting owner could start
   on its free units with its loans taken back, which step 3 then does. Arrays whose
   jobs borrowed get their home pass again (a FIFO head that borrowed no longer blocks the
   jobs behind it).
3. **Preemption.** For each array, its waiting owner jobs (in queue order, within quota) that
   do not fit the free units are checked against the borrowers holding the array's units:
   borrowers are released in a what-if pool, most recently started first, until the owner fits;
   the set is then pruned of borrowers not needed (oldest first) and each is preempted.
   Borrowers already being preempted are counted on first, so repeated passes while they exit
   ask for nothing new. The owner starts in a later pass, once the core has seen them exit.

Jobs over quota are not owners: they neither trigger preemption nor stop their array lending.
Borrowed placements are made with ``placement.pack`` (the inner policy only orders its array).

Whether a running job borrows is read from its placement against the array map, so nothing of
this survives in the policy between passes except caches keyed on the node inventories.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, TypeVar

from masterd.core.arrays.accounting import (
    Holding,
    allocs,
    borrowers_of,
    holdings,
    home_units,
    tenant_usage,
)
from masterd.core.arrays.config import JOB_ARRAY_KINDS, ArrayConfig, ArrayConfigError
from masterd.core.arrays.layout import (
    CPU_ARRAY,
    GPU_CPU,
    GPU_KINDS,
    ArrayId,
    ArrayMap,
    Home,
    build_array_map,
)
from masterd.core.arrays.summary import ArraySummary, summarise
from masterd.core.arrays.views import Scratch, ViewBuilder, within
from masterd.core.cluster import ClusterSnapshot
from masterd.core.placement import FreePool, pack
from masterd.core.policy import Decision, Policy, Preempt, Start
from shared.model import Job, NodeInventory, Placement

K = TypeVar("K")

log = logging.getLogger("trellis.arrays")

InnerFactory = Callable[[], Policy]


@dataclass(frozen=True)
class PassResult:
    decisions: list[Decision]
    # job id -> why it borrowed, waits, or was preempted (for job.reason and the logs).
    notes: Mapping[str, str] = field(default_factory=dict)


class ArrayPolicy:
    """Multi-array pools around per-array inner policies; registered as ``soda-arrays``."""

    name = "soda-arrays"

    def __init__(
        self,
        config: ArrayConfig | Mapping[str, Any] | None = None,
        *,
        registry: Mapping[str, Callable[..., Policy]],
        inner_factories: Mapping[str, InnerFactory] | None = None,
        **table: Any,
    ) -> None:
        """``registry``: the policies an array may be ordered by, by name (given, not
        imported: the policy registry lists this policy too)."""
        if isinstance(config, ArrayConfig):
            if table:
                raise ArrayConfigError(
                    f"give either an ArrayConfig or table options, not both ({sorted(table)})"
                )
        else:
            config = ArrayConfig.from_table({**(config or {}), **table})
        self._registry = {name: factory for name, factory in registry.items()
                          if name != self.name}
        self._factories = dict(inner_factories or {})
        for kind in self._factories:
            if kind not in JOB_ARRAY_KINDS:
                raise ArrayConfigError(
                    f"inner_factories: {kind!r} is not an array kind "
                    f"(one of {', '.join(JOB_ARRAY_KINDS)})"
                )
        self._config = config
        self._check_inner_names(config)
        self._inner: dict[ArrayId, Policy] = {}
        self._views = ViewBuilder()
        self._map: ArrayMap | None = None
        self._map_key: list[tuple[str, NodeInventory]] = []

    # -- configuration -------------------------------------------------------------------
    @property
    def config(self) -> ArrayConfig:
        return self._config

    def reconfigure(self, config: ArrayConfig) -> None:
        """Adopt new sizes (for example from :func:`resize`); the map is re-derived."""
        self._check_inner_names(config)
        if config.inner != self._config.inner or config.tenants != self._config.tenants:
            self._inner.clear()
        self._config = config
        self._map = None

    def _check_inner_names(self, config: ArrayConfig) -> None:
        registry = self._registry
        for kind, spec in config.inner.items():
            if spec.name == self.name:
                raise ArrayConfigError(f"inner.{kind}: {self.name} cannot nest inside itself")
            if spec.name not in registry:
                known = ", ".join(sorted(n for n in registry if n != self.name))
                raise ArrayConfigError(
                    f"inner.{kind}: unknown policy {spec.name!r}; known: {known}"
                )

    def inner_for(self, array: ArrayId) -> Policy:
        """The policy that orders one array's jobs (made on first use)."""
        policy = self._inner.get(array)
        if policy is not None:
            return policy
        factory = self._factories.get(array.kind)
        if factory is not None:
            policy = factory()
        else:
            registry = self._registry
            spec = self._config.inner.get(array.kind)
            if spec is None:
                if array.kind in GPU_KINDS:
                    name = "swaf" if "swaf" in registry else "fifo"
                else:
                    name = "drf"
                options: dict[str, Any] = {}
            else:
                name, options = spec.name, dict(spec.options)
            if name == "drf" and "weights" not in options:
                weights = {t: c.weight for t, c in self._config.tenants.items() if c.weight != 1}
                if weights:
                    options["weights"] = weights
            policy = registry[name](**options)
        self._inner[array] = policy
        return policy

    # -- the array map -------------------------------------------------------------------
    def array_map(self, snapshot: ClusterSnapshot) -> ArrayMap:
        key = [(name, view.inventory) for name, view in snapshot.nodes.items()]
        if (
            self._map is not None
            and len(key) == len(self._map_key)
            and all(
                a == c and b is d for (a, b), (c, d) in zip(key, self._map_key, strict=True)
            )
        ):
            return self._map
        self._map = build_array_map(snapshot.nodes, self._config)
        self._map_key = key
        return self._map

    # -- Policy --------------------------------------------------------------------------
    def decide(
        self, snapshot: ClusterSnapshot, queue: Sequence[Job], now: float
    ) -> list[Decision]:
        return self.plan(snapshot, queue, now).decisions

    def plan(self, snapshot: ClusterSnapshot, queue: Sequence[Job], now: float) -> PassResult:
        """``decide`` plus a note per affected job saying why (borrowing, quota, preemption)."""
        return _Pass(self, snapshot, queue, now).run()

    def summary(self, snapshot: ClusterSnapshot, queue: Sequence[Job]) -> list[ArraySummary]:
        """Per array: size, use and loans, for ``trellisctl pools``."""
        return summarise(self.array_map(snapshot), snapshot, queue)


class _Pass:
    """The state of one scheduling pass; thrown away afterwards."""

    def __init__(
        self, policy: ArrayPolicy, snapshot: ClusterSnapshot, queue: Sequence[Job], now: float
    ) -> None:
        self.policy = policy
        self.config = policy.config
        self.snapshot = snapshot
        self.now = now
        self.amap = policy.array_map(snapshot)
        self.scratch = Scratch(snapshot)
        self.empty = Scratch.empty(snapshot)
        self.held = holdings(self.amap, snapshot.running)
        self.usage = tenant_usage(self.amap, self.held)
        self.decisions: list[Decision] = []
        self.notes: dict[str, str] = {}
        self.preempted: set[str] = set()
        self.homes: dict[str, Home] = {}
        self.waiting: dict[ArrayId, list[Job]] = {}
        self.position: dict[str, int] = {}
        for pos, job in enumerate(queue):
            home = self.amap.home(job.spec)
            if home is None:
                self.notes[job.id] = (
                    f"waiting: no node of GPU model {job.spec.gpu_model or '(any)'} is known"
                )
                continue
            self.homes[job.id] = home
            self.position[job.id] = pos
            self.waiting.setdefault(home.job_array, []).append(job)
        self._pools: dict[ArrayId, tuple[int, FreePool]] = {}
        self._empty_fit: dict[str, bool] = {}
        self._empty_pools: dict[ArrayId, FreePool] = {}
        self._blocking: dict[ArrayId, bool] = {}  # reset whenever a job starts
        self._reclaim_pools: dict[ArrayId, tuple[int, FreePool]] = {}
        self._loan_pools: dict[tuple[frozenset[ArrayId], bool], tuple[int, FreePool]] = {}

    # -- helpers -------------------------------------------------------------------------
    def job_arrays(self) -> list[ArrayId]:
        return [a for a in self.amap.arrays if a.kind != GPU_CPU and a in self.waiting]

    @staticmethod
    def home_allowed(array: ArrayId) -> frozenset[ArrayId]:
        if array == CPU_ARRAY:
            return frozenset({CPU_ARRAY})
        return frozenset({array, ArrayId(GPU_CPU, array.gpu_model)})

    def home_view(
        self, array: ArrayId, scratch: Scratch | None = None, for_inner: bool = False
    ) -> ClusterSnapshot:
        """The array as its inner policy sees it (``for_inner``) or as ``pack`` needs it."""
        return self.policy._views.view(
            self.snapshot,
            self.amap,
            self.home_allowed(array),
            scratch or self.scratch,
            self.snapshot.running if for_inner else MappingProxyType({}),
            gpu_view=array.holds_gpus,
        )

    def _current(self, cache: dict[K, tuple[int, FreePool]], key: K,
                 build: Callable[[], FreePool]) -> FreePool:
        """``cache[key]`` while no start changed the scratch since it was built."""
        cached = cache.get(key)
        if cached is not None and cached[0] == self.scratch.version:
            return cached[1]
        pool = build()
        cache[key] = (self.scratch.version, pool)
        return pool

    def home_pool(self, array: ArrayId) -> FreePool:
        return self._current(self._pools, array, lambda: FreePool(self.home_view(array)))

    def loan_pool(self, allowed: frozenset[ArrayId], gpu_view: bool) -> FreePool:
        """Free units of ``allowed`` for a job that may borrow them (pack reads no running
        jobs): jobs of one array try the same pool until a start."""
        return self._current(self._loan_pools, (allowed, gpu_view), lambda: FreePool(
            self.policy._views.view(self.snapshot, self.amap, allowed, self.scratch,
                                    MappingProxyType({}), gpu_view=gpu_view)))

    def relevant_borrowers(self, array: ArrayId) -> list[Holding]:
        """Borrowers holding units of ``array``'s own nodes, most recently started first."""
        pool = self.home_pool(array)
        return [
            h for h in borrowers_of(self.held, self.home_allowed(array))
            if self._touches(h, pool)
        ]

    def reclaim_pool(self, array: ArrayId) -> FreePool:
        """The array's free units plus everything its borrowers hold there."""
        def build() -> FreePool:
            pool = FreePool(self.home_view(array))
            for h in self.relevant_borrowers(array):
                if h.job.id not in self.preempted:
                    _release(pool, h, +1)
            return pool

        return self._current(self._reclaim_pools, array, build)

    def quota_state(self, job: Job) -> str:
        """"ok" (within quota), "borrow" (over, may borrow) or "wait" (over quota)."""
        array = self.homes[job.id].job_array
        tenant = self.config.tenant(job.spec.tenant)
        quota = tenant.quota_for(array.name, array.kind)
        used = self.usage.get((job.spec.tenant, array), [0, 0])
        if quota.allows(used[0], used[1], job.spec.gpus, job.spec.cpus):
            return "ok"
        if tenant.borrow_over_quota and self.config.borrowing:
            self.notes[job.id] = f"over quota of tenant {job.spec.tenant} in {array.name}"
            return "borrow"
        self.notes[job.id] = (
            f"waiting: over quota of tenant {job.spec.tenant} in {array.name} "
            f"(holds {used[0]} GPUs/{used[1]} cores, quota {quota.gpus} GPUs/{quota.cores} "
            f"cores, asks {job.spec.gpus}/{job.spec.cpus})"
        )
        return "wait"

    def fits_when_empty(self, job: Job) -> bool:
        """Whether the job's own array could ever host it (all of its units free)."""
        cached = self._empty_fit.get(job.id)
        if cached is None:
            array = self.homes[job.id].job_array
            pool = self._empty_pools.get(array)
            if pool is None:
                pool = self._empty_pools[array] = FreePool(self.home_view(array, self.empty))
            cached = pack(job.spec, pool) is not None
            self._empty_fit[job.id] = cached
        return cached

    def blocking(self, array: ArrayId) -> bool:
        """Whether an owner of ``array`` waits for it, which stops the array lending."""
        cached = self._blocking.get(array)
        if cached is None:
            if self.config.lending == "free":  # it could start with the loans back
                def waits(job: Job, owner: ArrayId) -> bool:
                    return pack(job.spec, self.reclaim_pool(owner)) is not None
            else:  # it could ever fit its array
                def waits(job: Job, owner: ArrayId) -> bool:
                    return self.fits_when_empty(job)
            cached = any(
                self.quota_state(job) == "ok" and waits(job, owner)
                for owner in self.amap.owners_of(array)
                for job in self.waiting.get(owner, ())
            )
            self._blocking[array] = cached
        return cached

    def add_usage(self, job: Job, placement: Placement) -> None:
        array = self.homes[job.id].job_array
        g, c = home_units(self.amap, array, placement)
        entry = self.usage.setdefault((job.spec.tenant, array), [0, 0])
        entry[0] += g
        entry[1] += c

    def start(self, job: Job, start: Start) -> None:
        self.notes.pop(job.id, None)  # whatever kept it waiting earlier in the pass
        self.scratch.take(start.placement)
        self.decisions.append(start)
        self.add_usage(job, start.placement)
        self.waiting[self.homes[job.id].job_array].remove(job)
        self._blocking.clear()

    # -- the three phases ----------------------------------------------------------------
    def run(self) -> PassResult:
        dirty = set(self.job_arrays())
        while dirty:
            for array in self.job_arrays():
                if array in dirty:
                    self.home_pass(array)
            dirty = self.borrow_pass() if self.config.borrowing else set()
        self.preempt_pass()
        self.note_too_big()
        return PassResult(self.decisions, self.notes)

    def note_too_big(self) -> None:
        """A job its own array could not hold even empty waits for something else than its
        turn: say what (the wait explainer would otherwise call it first in line)."""
        for array, jobs in self.waiting.items():
            for job in jobs:
                if job.id in self.notes or self.fits_when_empty(job):
                    continue
                size = self.amap.size(array)
                asks = job.spec.gpus if array.holds_gpus else job.spec.cpus
                way = ("it runs only on what other arrays lend it" if self.config.borrowing
                       else "with borrowing off it runs only once the array grows "
                            "(trellisctl pools --resize, or the configuration)")
                unit = "GPUs" if array.holds_gpus else "cores"
                self.notes[job.id] = (f"waiting: array {array.name} holds {size} {unit}, "
                                      f"fewer than the {asks} this job asks; {way}")

    def home_pass(self, array: ArrayId) -> None:
        inner = self.policy.inner_for(array)
        excluded: set[str] = set()
        while True:
            queue = [
                j for j in self.waiting.get(array, [])
                if j.id not in excluded and self.quota_state(j) == "ok"
            ]
            if not queue:
                return
            ids = {j.id: j for j in queue}
            view = self.home_view(array, for_inner=True)
            trial = self.scratch.copy()
            usage = {k: list(v) for k, v in self.usage.items()}
            starts: list[tuple[Job, Start]] = []
            preempts: list[Preempt] = []
            over_quota: str | None = None
            for decision in inner.decide(view, queue, self.now):
                if isinstance(decision, Preempt):
                    if decision.job_id in view.running and decision.job_id not in self.preempted:
                        preempts.append(decision)
                    continue
                job = ids.get(decision.job_id)
                if job is None:
                    log.warning(
                        "inner_decision_dropped policy=%s array=%s job=%s reason=%s",
                        inner.name, array.name, decision.job_id,
                        "not queued in this array or started twice",
                    )
                    continue
                why = within(view, decision.placement) or trial.covers(decision.placement)
                if why is not None:
                    log.warning(
                        "inner_decision_dropped policy=%s array=%s job=%s reason=%r",
                        inner.name, array.name, job.id, why,
                    )
                    continue
                g, c = home_units(self.amap, array, decision.placement)
                entry = usage.setdefault((job.spec.tenant, array), [0, 0])
                quota = self.config.tenant(job.spec.tenant).quota_for(array.name, array.kind)
                if not quota.allows(entry[0], entry[1], g, c):
                    over_quota = job.id
                    break
                entry[0] += g
                entry[1] += c
                trial.take(decision.placement)
                starts.append((job, decision))
                del ids[job.id]
            if over_quota is not None:
                # Together with jobs started before it the job passes its tenant's quota:
                # withhold it and let the inner policy choose again without it.
                excluded.add(over_quota)
                self.notes[over_quota] = (
                    f"waiting: would pass the quota of its tenant in {array.name}"
                )
                continue
            for job, start in starts:
                self.start(job, start)
            for preempt in preempts:
                self.preempted.add(preempt.job_id)
                self.decisions.append(preempt)
            return

    def borrow_pass(self) -> set[ArrayId]:
        borrowed_for: set[ArrayId] = set()
        pending = sorted(
            (j for jobs in self.waiting.values() for j in jobs),
            key=lambda j: self.position[j.id],
        )
        for job in pending:
            home = self.homes[job.id]
            state = self.quota_state(job)
            if state == "wait":
                continue
            if state == "ok":
                if pack(job.spec, self.home_pool(home.job_array)) is not None:
                    continue  # its array can host it: the inner policy chose to hold it back
                if pack(job.spec, self.reclaim_pool(home.job_array)) is not None:
                    continue  # its array's loans can be reclaimed for it (preempt_pass)
            groups = [
                g for g in self.amap.lenders(job.spec, home)
                if not any(self.blocking(a) for a in g)
            ]
            if not groups:
                self.notes.setdefault(job.id, f"waiting: {home.job_array.name} is full")
                continue
            lent = frozenset().union(*groups)
            own = home.allowed if state == "ok" else home.allowed - {home.job_array}
            placement = pack(job.spec, self.loan_pool(own | lent, home.job_array.holds_gpus))
            if placement is None:
                self.notes.setdefault(
                    job.id, f"waiting: {home.job_array.name} is full and no lender has room"
                )
                continue
            borrowed = self.amap.borrowed_units(allocs(placement), home)
            self.start(job, Start(job.id, placement))
            if borrowed:
                what = ", ".join(f"{n} {a.unit} of {a.name}" for a, n in sorted(
                    borrowed.items(), key=lambda item: item[0].sort_key()
                ))
                self.notes[job.id] = f"borrowing {what}"
                log.info(
                    "borrow job=%s array=%s lenders=%s units=%r",
                    job.id, home.job_array.name,
                    ",".join(sorted(a.name for a in borrowed)), what,
                )
            borrowed_for.add(home.job_array)
        return borrowed_for

    def preempt_pass(self) -> None:
        for array in self.job_arrays():
            owners = [j for j in self.waiting[array] if self.quota_state(j) == "ok"]
            if not owners:
                continue
            candidates = self.relevant_borrowers(array)
            if not candidates:
                continue
            # Jobs already on their way out are used first: their units come back anyway.
            candidates.sort(key=lambda h: not h.job.reason.startswith("preempted"))
            hyp = FreePool(self.home_view(array))
            for owner in owners:
                fits = pack(owner.spec, hyp)
                if fits is not None:
                    hyp.take(fits)
                    continue
                chosen = self._reclaim(owner, hyp, candidates)
                if not chosen:
                    continue
                names = ", ".join(h.job.id for h in chosen)
                self.notes[owner.id] = f"waiting: {array.name} reclaims it from {names}"
                for h in chosen:
                    reason = f"{array.name} needs its resources back for job {owner.id}"
                    self.preempted.add(h.job.id)
                    self.decisions.append(Preempt(h.job.id, reason))
                    self.notes[h.job.id] = f"preempted: {reason}"
                    log.info(
                        "preempt job=%s array=%s owner=%s borrowed=%s",
                        h.job.id, array.name, owner.id,
                        ",".join(sorted(a.name for a in h.borrowed)),
                    )

    def _reclaim(self, owner: Job, hyp: FreePool, candidates: list[Holding]) -> list[Holding]:
        """Borrowers to preempt so ``owner`` fits ``hyp`` (released into it), or []."""
        chosen: list[Holding] = []
        for h in candidates:
            if h.job.id in self.preempted:
                # Chosen for an earlier owner in this pass: its units were released already.
                continue
            _release(hyp, h, +1)
            chosen.append(h)
            if pack(owner.spec, hyp) is not None:
                break
        else:
            for h in chosen:
                _release(hyp, h, -1)
            return []
        # Drop borrowers the owner does not need, oldest first, keeping the most recent.
        for h in list(reversed(chosen)):
            _release(hyp, h, -1)
            if pack(owner.spec, hyp) is None:
                _release(hyp, h, +1)
            else:
                chosen.remove(h)
        placement = pack(owner.spec, hyp)
        assert placement is not None
        hyp.take(placement)
        return chosen

    @staticmethod
    def _touches(h: Holding, pool: FreePool) -> bool:
        assert h.job.placement is not None
        for alloc in h.job.placement.allocations:
            view = pool.views.get(alloc.node)
            if view is None:
                continue
            if set(alloc.gpus) & {g.index for g in view.inventory.gpus}:
                return True
            if set(alloc.cpus) & {c.id for c in view.inventory.cpus}:
                return True
        return False


def _release(pool: FreePool, h: Holding, sign: int) -> None:
    """Add (+1) or remove (-1) a running job's units inside the pool's views."""
    assert h.job.placement is not None
    for alloc in h.job.placement.allocations:
        view = pool.views.get(alloc.node)
        if view is None:
            continue
        gpus = set(alloc.gpus) & {g.index for g in view.inventory.gpus if g.healthy}
        cpus = set(alloc.cpus) & {c.id for c in view.inventory.cpus}
        if sign > 0:
            pool.gpus[alloc.node] |= gpus
            pool.cpus[alloc.node] |= cpus
        else:
            pool.gpus[alloc.node] -= gpus
            pool.cpus[alloc.node] -= cpus
        pool.memory[alloc.node] += sign * alloc.memory_mib
