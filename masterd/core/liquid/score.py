"""A plan's score (the smaller the better), Eq. 3–6 as Liquid's code computes it.

For one job placed as plan κ::

    Score_κ = w_net · Cost_κ + Σ_{j ∈ β_κ} Fitness_j / tasks + |β_κ| / tasks

* ``Cost_κ``: every worker talks to the job's parameter server; each pair on different nodes
  costs the worker's bandwidth (in units of 100 MB/s) times the distance between the nodes
  (:mod:`.network`). Before the PS is placed, the node with most of the job's workers
  stands in for it.
* ``Fitness_j`` (Eq. 6): ``-(ReqGPU_j + UsedGPU_j) / TotalGPU_j`` for the node's workers, so
  workers pack onto busy nodes; the PS term is ``+(PS already there + 1) / TotalGPU_j``, so
  parameter servers spread (as Liquid's code does).
* ``|β_κ| / tasks``: fewer nodes first when the rest ties.

Eq. 7's batch goal sums the scores of the batch's jobs; Eq. 8's genetic fitness is its
negation minus the nodes the batch uses (:mod:`.ga`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from masterd.core.liquid.demand import Demand
from masterd.core.liquid.network import Distances
from masterd.core.liquid.nodes import NodeCap

BANDWIDTH_UNIT_MBPS = 100.0


@dataclass(frozen=True)
class ScoreWeights:
    network: float = 1.0  # λ-like weight of the network cost against the packing terms
    distances: Distances = field(default_factory=Distances)


def job_score(
    demand: Demand,
    workers_on: Mapping[str, int],
    ps_on: str | None,
    caps: Mapping[str, NodeCap],
    gpus_used: Mapping[str, int],
    weights: ScoreWeights,
    ps_added: Mapping[str, int] | None = None,
) -> float:
    """Score of one job whose workers are on ``workers_on`` (node -> count) and whose PS is on
    ``ps_on`` (None: not placed, or the job has none). ``gpus_used``: GPUs the plan takes on
    each node besides what the node had in use already (this job's included); ``ps_added``:
    other jobs' parameter servers the plan puts on each node."""
    tasks = len(demand.tasks)
    hub = ps_on
    if hub is None and workers_on:
        # Most workers first; the name breaks ties so the score is deterministic.
        hub = min(workers_on, key=lambda n: (-workers_on[n], n))
    cost = 0.0
    if demand.has_ps and hub is not None:
        rack, domain = caps[hub].where
        dist = weights.distances
        for node, count in workers_on.items():
            if node != hub:
                other = caps[node].where
                cost += count * (dist.other_domain if other[1] != domain else
                                 dist.same_domain if other[0] != rack else dist.same_rack)
        cost *= demand.bandwidth / BANDWIDTH_UNIT_MBPS
    fitness = 0.0
    nodes = set(workers_on)
    for node in workers_on:
        cap = caps[node]
        total = max(cap.total_gpus, 1)
        fitness -= (cap.used_gpus + gpus_used.get(node, 0)) / total
    if ps_on is not None:
        nodes.add(ps_on)
        cap = caps[ps_on]
        others = (ps_added or {}).get(ps_on, 0)
        fitness += (cap.ps_tasks + others + 1) / max(cap.total_gpus, 1)
    return weights.network * cost + fitness / tasks + len(nodes) / tasks
