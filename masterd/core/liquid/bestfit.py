"""Immediate mode: Liquid's best fit (§5.2, Algorithm 1).

For each task of the job in turn (workers first, the parameter server last), every node that
can take it is scored as if the task were placed there (:func:`masterd.core.liquid.score.
job_score`), and the task goes to the node with the smallest score; nodes tie in the order the
pass lists them. Nodes that nothing in this pass has touched and that look alike to the score
(same GPU counts, parameter servers, rack and domain) score alike, so one of each kind is
scored: a search over a thousand nodes costs a few dozen scores per task.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from masterd.core.liquid.demand import PS, Demand
from masterd.core.liquid.nodes import Load, NodeCap
from masterd.core.liquid.score import ScoreWeights, job_score


def similar_groups(candidates: Sequence[NodeCap]) -> list[list[tuple[int, NodeCap]]]:
    """Candidates grouped by :attr:`NodeCap.similar`, groups and members in list order."""
    groups: dict[tuple[object, ...], list[tuple[int, NodeCap]]] = {}
    for order, cap in enumerate(candidates):
        groups.setdefault(cap.similar, []).append((order, cap))
    return list(groups.values())


def best_fit(
    demand: Demand,
    candidates: Sequence[NodeCap],
    caps: Mapping[str, NodeCap],
    load: Load,
    weights: ScoreWeights,
    lent: bool = False,
    ps_added: Mapping[str, int] | None = None,
    groups: list[list[tuple[int, NodeCap]]] | None = None,
) -> dict[int, str] | None:
    """Task index -> node for every task of ``demand``, or None when some task fits nowhere.

    ``load`` holds what the pass placed before (it is updated with this job's tasks only on
    success); ``lent``: the job may use GPUs lent by jobs saving their model; ``groups``:
    :func:`similar_groups` of ``candidates``, if the caller keeps them."""
    if groups is None:
        groups = similar_groups(candidates)
    order_of = {cap.name: order for group in groups for order, cap in group}
    trial = load.copy()
    workers_on: dict[str, int] = {}
    ps_on: str | None = None
    placed: dict[int, str] = {}
    added = ps_added or {}

    for task in demand.tasks:
        best: tuple[float, int, str] | None = None
        plan = {*workers_on, *((ps_on,) if ps_on else ())}
        touched = trial.touched()
        # Which nodes to score: every node of the job's plan; of the others, one per kind
        # (GPUs in use, parameter servers, rack, domain) as they stand now, the first in the
        # pass's order that fits.
        looked: list[NodeCap] = [caps[n] for n in plan if n in order_of]
        kinds: set[tuple[object, ...]] = set()
        for name in sorted(touched - plan, key=lambda n: order_of.get(n, -1)):
            cap = caps.get(name)
            if cap is None or name not in order_of or not trial.fits(cap, task, lent):
                continue
            inv = cap.inventory
            kind = (cap.total_gpus, cap.free_gpus - trial.gpus.get(name, 0),
                    cap.ps_tasks + added.get(name, 0), inv.rack, inv.domain)
            if kind not in kinds:
                kinds.add(kind)
                looked.append(cap)
        for group in groups:
            for _, cap in group:
                if cap.name in touched or cap.name in plan or cap.similar in kinds:
                    continue
                if trial.fits(cap, task, lent):
                    kinds.add(cap.similar)
                    looked.append(cap)
                    break
        for cap in looked:
            name = cap.name
            if not trial.fits(cap, task, lent):
                continue
            if task.role == PS:
                score = job_score(demand, workers_on, name, caps, trial.gpus, weights, ps_added)
            else:
                workers_on[name] = workers_on.get(name, 0) + 1
                trial.add(name, task)
                score = job_score(demand, workers_on, ps_on, caps, trial.gpus, weights,
                                  ps_added)
                trial.add(name, task, -1)
                workers_on[name] -= 1
                if not workers_on[name]:
                    del workers_on[name]
            key = (score, order_of[name], name)
            if best is None or key < best:
                best = key
        if best is None:
            return None
        node = best[2]
        placed[task.index] = node
        trial.add(node, task)
        if task.role == PS:
            ps_on = node
        else:
            workers_on[node] = workers_on.get(node, 0) + 1
    for task in demand.tasks:
        load.add(placed[task.index], task)
    return placed
