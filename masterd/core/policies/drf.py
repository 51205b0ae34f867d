"""Dominant resource fairness among tenants (Ghodsi et al.; SODA uses it inside each array)."""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence

from masterd.core.cluster import ClusterSnapshot
from masterd.core.fairorder import fair_key
from masterd.core.placement import FreePool, pack
from masterd.core.policy import Decision, Start
from shared.model import Job, Placement


class DrfPolicy:
    """Repeatedly start the oldest fitting job of the tenant with the smallest dominant share.

    A tenant's dominant share is its largest share of the snapshot's schedulable capacity over
    GPUs, cores and memory, divided by its weight (default 1). Shares count what the tenant's
    running jobs hold on the snapshot's nodes plus what this pass starts. "Oldest" is queue
    order, which puts re-queued jobs first. A job that does not fit is passed over for the rest
    of the pass (free resources only shrink within a pass), so the pass makes O(jobs) packing
    attempts.
    """

    name = "drf"

    def __init__(self, weights: Mapping[str, float] | None = None) -> None:
        self.weights: dict[str, float] = {}
        for tenant, weight in (weights or {}).items():
            if isinstance(weight, bool) or not isinstance(weight, int | float) or weight <= 0:
                raise ValueError(
                    f"drf weight of tenant {tenant!r} must be a positive number, got {weight!r}"
                )
            self.weights[tenant] = float(weight)

    def decide(
        self, snapshot: ClusterSnapshot, queue: Sequence[Job], now: float
    ) -> list[Decision]:
        pool = FreePool(snapshot)
        capacity = [0.0, 0.0, 0.0]
        for view in pool.views.values():
            inv = view.inventory
            capacity[0] += sum(1 for g in inv.gpus if g.healthy)
            capacity[1] += len(inv.cpus)
            capacity[2] += inv.memory_mib
        usage: dict[str, list[float]] = {}
        for job in snapshot.running.values():
            if job.placement is not None:
                self._add(usage.setdefault(job.spec.tenant, [0.0, 0.0, 0.0]),
                          job.placement, snapshot)
        pending: dict[str, deque[Job]] = {}
        for job in queue:
            pending.setdefault(job.spec.tenant, deque()).append(job)
        for tenant in pending:
            usage.setdefault(tenant, [0.0, 0.0, 0.0])

        # With fair share ordering on, the tenant's fair-share band comes first (the same for
        # all its jobs: masterd/core/fairorder.py).
        band = {tenant: fair_key(jobs[0])[2:] for tenant, jobs in pending.items()}

        def share(tenant: str) -> tuple[tuple[int, ...], float, str]:
            used = usage[tenant]
            dominant = max(
                (u / c for u, c in zip(used, capacity, strict=True) if c > 0), default=0.0
            )
            return (band[tenant], dominant / self.weights.get(tenant, 1.0), tenant)

        decisions: list[Decision] = []
        while pending:
            progressed = False
            for tenant in sorted(pending, key=share):
                jobs = pending[tenant]
                while jobs:
                    job = jobs.popleft()
                    placement = pack(job.spec, pool)
                    if placement is not None:
                        pool.take(placement)
                        decisions.append(Start(job.id, placement))
                        self._add(usage[tenant], placement, snapshot)
                        progressed = True
                        break
                if not jobs:
                    del pending[tenant]
                if progressed:
                    break
            if not progressed:
                break
        return decisions

    @staticmethod
    def _add(used: list[float], placement: Placement, snapshot: ClusterSnapshot) -> None:
        for alloc in placement.allocations:
            view = snapshot.nodes.get(alloc.node)
            if view is None:
                continue  # held outside this snapshot (another array): not this capacity
            gpus = {g.index for g in view.inventory.gpus}
            cpus = {c.id for c in view.inventory.cpus}
            used[0] += sum(1 for g in alloc.gpus if g in gpus)
            used[1] += sum(1 for c in alloc.cpus if c in cpus)
            used[2] += alloc.memory_mib
