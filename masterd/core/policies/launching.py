"""Starting jobs in a given order: the loop shared by the GENIE baseline policies.

Within one pass resources only shrink, so once a demand failed to fit, every later job with
the same demand fails too and is skipped without another search of the cluster.
"""

from __future__ import annotations

from collections.abc import Iterable

from masterd.core.cluster import ClusterSnapshot
from masterd.core.eligibility import placement_key
from masterd.core.genie.plan import Candidate
from masterd.core.placement import FreePool, pack, per_node_share, realise
from masterd.core.policy import Decision, Start
from shared.model import Job


def start_packed(
    snapshot: ClusterSnapshot, jobs: Iterable[Job], pool: FreePool | None = None
) -> list[Decision]:
    """Black-box placement: each job as asked (``spec.gpus``), packed; misfits are skipped."""
    pool = pool if pool is not None else FreePool(snapshot)
    decisions: list[Decision] = []
    failed: set[tuple[object, ...]] = set()
    for job in jobs:
        s = job.spec
        demand = placement_key(s)
        if demand in failed:
            continue
        placement = pack(s, pool)
        if placement is None:
            failed.add(demand)
            continue
        pool.take(placement)
        decisions.append(Start(job.id, placement))
    return decisions


def start_shapes(
    snapshot: ClusterSnapshot,
    choices: Iterable[tuple[Job, Candidate]],
    pool: FreePool | None = None,
) -> list[Decision]:
    """Each job on its chosen ``<d_node, d_gpn>`` with best locality; misfits are skipped."""
    pool = pool if pool is not None else FreePool(snapshot)
    by_model: dict[str, list[str]] = {}
    for name, view in pool.views.items():
        if view.gpu_model is not None:
            by_model.setdefault(view.gpu_model, []).append(name)
    decisions: list[Decision] = []
    failed: set[tuple[object, ...]] = set()
    for job, c in choices:
        s = job.spec
        demand = (c.gpu_model, c.d_node, c.d_gpn, per_node_share(s.cpus, c.d_node),
                  per_node_share(s.memory_mib, c.d_node), s.selector)
        if demand in failed:
            continue
        placement = realise(s, pool, c.d_node, c.d_gpn, by_model.get(c.gpu_model, []))
        if placement is None:
            failed.add(demand)
            continue
        pool.take(placement)
        decisions.append(Start(job.id, placement))
    return decisions
