"""Immediate mode: Liquid's best fit (§5.2, Algorithm 1).

For each task of the job in turn (workers first, the parameter server last), every node that
can take it is scored as if the task were placed there (:func:`masterd.core.liquid.score.
job_score`), and the task goes to the node with the smallest score; nodes tie in the order the
pass lists them. Nodes the job does not use yet and that look alike to the score (same GPU
counts, parameter servers, rack and domain) score alike, so one of each kind is scored: a
search over a thousand nodes costs a few dozen scores per task.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from masterd.core.liquid.demand import PS, Demand
from masterd.core.liquid.nodes import Load, NodeCap
from masterd.core.liquid.score import ScoreWeights, job_score


def best_fit(
    demand: Demand,
    candidates: Sequence[NodeCap],
    caps: Mapping[str, NodeCap],
    load: Load,
    weights: ScoreWeights,
    lent: bool = False,
    ps_added: Mapping[str, int] | None = None,
) -> dict[int, str] | None:
    """Task index -> node for every task of ``demand``, or None when some task fits nowhere.

    ``load`` holds what the pass placed before (it is updated with this job's tasks only on
    success); ``lent``: the job may use GPUs lent by jobs saving their model."""
    trial = load.copy()
    workers_on: dict[str, int] = {}
    ps_on: str | None = None
    placed: dict[int, str] = {}
    for task in demand.tasks:
        best: tuple[float, int, str] | None = None
        seen: set[tuple[object, ...]] = set()
        for order, cap in enumerate(candidates):
            name = cap.name
            fresh = name not in workers_on and name != ps_on
            if fresh and not (trial.gpus.get(name) or trial.cpus.get(name)
                              or trial.memory.get(name)):
                key = cap.key()
                if key in seen:
                    continue
            else:
                key = None
            if not trial.fits(cap, task, lent):
                continue
            if key is not None:
                seen.add(key)
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
            if best is None or (score, order) < best[:2]:
                best = (score, order, name)
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
