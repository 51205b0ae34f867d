"""How the fair-share factor orders jobs: one helper every policy shares.

With fair share ordering on (``[master.fairshare] order = true``, or a replay's
``--fairshare``), :class:`FairShareOrdering` wraps the configured policy. Before each pass it
writes each queued job's account factor into ``job.annotations["fairshare.factor"]`` (the
channel through which features hand numbers to policies) and hands the policy the queue sorted
by :func:`fair_key`, stably: re-queued jobs first, then the job's ``priority``, then the
factor's band (higher first), then the order the queue had (submission time).

* ``fifo`` starts jobs in exactly that order;
* ``qssf`` and ``sjf`` sort by ``fair_key`` first and their own rank (GPU time, predicted
  latency) second: within a band of fair-share factor their paper's rule decides;
* ``drf`` visits tenants by band first, then by smallest dominant share;
* every other policy sees the queue in that order, so the factor breaks its ties (those that
  fall back on queue order) without changing its rule.

The factor is banded (``BANDS`` steps of 0.05) so that accounts whose usage barely differs
interleave by the policy's rule instead of by noise in the fourth decimal. Without the
annotation (fair share ordering off) :func:`fair_key` is empty and nothing changes.
"""

from __future__ import annotations

from collections.abc import Sequence

from masterd.core.arrays.policy import PassResult
from masterd.core.cluster import ClusterSnapshot
from masterd.core.fairshare import FairShare
from masterd.core.policy import Decision, Policy
from shared.model import Job

FACTOR_KEY = "fairshare.factor"
BANDS = 20


def fair_band(factor: float) -> int:
    """The factor's band: 0 (factor near 0) to BANDS (factor 1)."""
    return int(min(1.0, max(0.0, factor)) * BANDS)


def fair_key(job: Job) -> tuple[int, ...]:
    """The fair-share part of a job's rank (smaller first); empty while ordering is off."""
    factor = job.annotations.get(FACTOR_KEY)
    if factor is None:
        return ()
    return (-job.requeue_priority, -job.spec.priority, -fair_band(factor))


def fair_sorted(queue: Sequence[Job]) -> Sequence[Job]:
    """The queue in fair order (stable: queue order within a key)."""
    return sorted(queue, key=fair_key)


class FairShareOrdering:
    """The configured policy, handed the queue in fair-share order (see the module doc).

    Factors are recomputed at most every ``recalc_s`` of the pass clock (Slurm's
    PriorityCalcPeriod): a pass per event must not cost a walk of the account tree each.
    """

    def __init__(self, inner: Policy, fairshare: FairShare, recalc_s: float = 60.0) -> None:
        self.inner = inner
        self.name = inner.name
        self.fairshare = fairshare
        self.recalc_s = recalc_s
        self._factors: dict[str, float] = {}
        self._computed_at: float | None = None

    def refresh(self) -> None:
        """Recompute at the next pass (the tree or the weights changed)."""
        self._computed_at = None

    def factors(self, now: float) -> dict[str, float]:
        if self._computed_at is None or not (0 <= now - self._computed_at < self.recalc_s):
            self._factors = self.fairshare.factors(now)
            self._computed_at = now
        return self._factors

    def _ordered(self, queue: Sequence[Job], now: float) -> Sequence[Job]:
        factors = self.factors(now)
        for job in queue:
            job.annotations[FACTOR_KEY] = factors.get(job.spec.tenant, 1.0)
        return fair_sorted(queue)

    def decide(
        self, snapshot: ClusterSnapshot, queue: Sequence[Job], now: float
    ) -> list[Decision]:
        return self.inner.decide(snapshot, self._ordered(queue, now), now)

    def plan(self, snapshot: ClusterSnapshot, queue: Sequence[Job], now: float) -> PassResult:
        ordered = self._ordered(queue, now)
        plan = getattr(self.inner, "plan", None)
        if plan is not None:
            return plan(snapshot, ordered, now)
        return PassResult(list(self.inner.decide(snapshot, ordered, now)))
