"""Batch mode: Liquid's grouping genetic algorithm (§5.3, Eq. 7–8).

A chromosome is a whole plan for a batch of jobs: which node every task of every job goes
to. Genes are tasks and a group of genes is a node (Falkenauer's grouping encoding, Fig. 7),
so crossover and mutation move whole nodes:

* crossover (probability 0.7): node *c* of parent Y, with its tasks, is copied into parent
  X; X's nodes that held any of those tasks are deleted, and the tasks they and *c* held
  besides are re-placed first-fit (Fig. 8);
* mutation (probability 0.5): a node of the plan is deleted and its tasks re-placed
  first-fit on the others (Fig. 9).

First fit tries the nodes the plan already uses, in the order it came to use them, then the
rest of the pass's nodes. Fitness is Eq. 8, ``-Σ Score - NumNU``; a plan that cannot place a
task is invalid and never chosen. Parents are picked by tournaments of three; the best plan
always survives. The first population is the first-fit plan, the plan best fit makes job by
job, and random-fit plans, ``30 + n/2`` in all for ``n`` tasks (Liquid's code).

It stops after ``30 + n`` generations without an improvement above 1e-6 (Liquid's code), or
when it has evaluated ``max_evaluations`` plans (``None`` or 0: no cap, Liquid's rule alone).
Liquid also bounds a batch by 30 seconds of wall time; a budget of evaluations bounds it
instead (``bench/liquid_ga.py`` measures how long Liquid's own rule takes, and what the cap
costs in plan quality) and keeps the decision the same on every run and in the simulator.
The random generator is seeded from the policy's seed and the batch's job ids.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from masterd.core.liquid.bestfit import best_fit
from masterd.core.liquid.demand import PS, Demand, Task
from masterd.core.liquid.nodes import Load, NodeCap
from masterd.core.liquid.score import BANDWIDTH_UNIT_MBPS, ScoreWeights

INVALID = float("-inf")


@dataclass(frozen=True)
class GaSettings:
    crossover: float = 0.7
    mutation: float = 0.5
    tournament: int = 3
    population_base: int = 30  # population = base + tasks / 2
    patience_base: int = 30  # stop after base + tasks generations without improvement
    min_improvement: float = 1e-6
    max_evaluations: int | None = 3000  # None or 0: no cap (Liquid's stopping rule alone)

    def __post_init__(self) -> None:
        for name in ("crossover", "mutation"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"ga {name} probability must be in [0, 1], got {value}")
        if self.tournament < 1 or self.population_base < 1:
            raise ValueError("ga tournament and population_base must be >= 1")
        if self.max_evaluations is not None and self.max_evaluations < 0:
            raise ValueError("ga max_evaluations must be >= 0 (0: no cap)")

    @property
    def budget(self) -> float:
        return float(self.max_evaluations) if self.max_evaluations else math.inf


@dataclass(frozen=True)
class GaResult:
    placed: list[dict[int, str]]  # per job of the batch: task index -> node
    fitness: float
    generations: int
    evaluations: int
    capped: bool = False  # stopped by max_evaluations, not by Liquid's patience rule


class _Problem:
    """The batch, flattened: task k belongs to job ``owner[k]``."""

    def __init__(self, demands: Sequence[Demand], candidates: Sequence[Sequence[NodeCap]],
                 caps: Mapping[str, NodeCap], base: Load, weights: ScoreWeights,
                 base_ps: Mapping[str, int]) -> None:
        self.demands = demands
        self.caps = caps
        self.base = base
        self.weights = weights
        self.base_ps = base_ps
        self.tasks: list[Task] = []
        self.owner: list[int] = []
        self.tasks_of: list[list[int]] = []
        for j, demand in enumerate(demands):
            self.tasks_of.append([])
            for task in demand.tasks:
                self.tasks_of[j].append(len(self.tasks))
                self.tasks.append(task)
                self.owner.append(j)
        self.is_ps = [t.role == PS for t in self.tasks]
        self.tasks_per_job = [len(d.tasks) for d in demands]
        self.bandwidth = [d.bandwidth / BANDWIDTH_UNIT_MBPS for d in demands]
        # node -> (GPUs for the packing term, GPUs in use, PSs, rack, domain)
        self.info = {name: (max(c.total_gpus, 1), c.used_gpus, c.ps_tasks, c.inventory.rack,
                            c.inventory.domain) for name, c in caps.items()}
        self.candidates = [list(candidates[j]) for j in range(len(demands))]
        self.allowed = [{c.name for c in cands} for cands in self.candidates]


class _Plan:
    __slots__ = ("assign", "fitness", "load", "order")

    def __init__(self, n: int, base: Load) -> None:
        self.assign: list[str | None] = [None] * n
        self.load = base.copy()
        self.order: list[str] = []  # nodes in the order the plan came to use them
        self.fitness = INVALID

    def copy(self) -> _Plan:
        other = _Plan.__new__(_Plan)
        other.assign = list(self.assign)
        other.load = self.load.copy()
        other.order = list(self.order)
        other.fitness = self.fitness
        return other

    def place(self, k: int, node: str, task: Task) -> None:
        self.assign[k] = node
        self.load.add(node, task)
        if node not in self.order:
            self.order.append(node)

    def unplace(self, k: int, task: Task) -> None:
        node = self.assign[k]
        if node is not None:
            self.load.add(node, task, -1)
            self.assign[k] = None

    def prune(self) -> None:
        used = set(self.assign)
        self.order = [n for n in self.order if n in used]


def _first_fit(problem: _Problem, plan: _Plan, ks: Sequence[int],
               banned: frozenset[str] = frozenset()) -> bool:
    caps = problem.caps
    for k in ks:
        task = problem.tasks[k]
        job = problem.owner[k]
        allowed = problem.allowed[job]
        node = next((n for n in plan.order if n not in banned and n in allowed
                     and plan.load.fits(caps[n], task)), None)
        if node is None:
            node = next((c.name for c in problem.candidates[job]
                         if c.name not in banned and plan.load.fits(c, task)), None)
        if node is None:
            return False
        plan.place(k, node, task)
    return True


def _random_fit(problem: _Problem, plan: _Plan, ks: Sequence[int], rng: random.Random) -> bool:
    for k in ks:
        task = problem.tasks[k]
        cands = problem.candidates[problem.owner[k]]
        node = None
        for _ in range(8):
            cap = cands[rng.randrange(len(cands))]
            if plan.load.fits(cap, task):
                node = cap.name
                break
        if node is None:
            node = next((c.name for c in cands if plan.load.fits(c, task)), None)
            if node is None:
                return False
        plan.place(k, node, task)
    return True


def _evaluate(problem: _Problem, plan: _Plan) -> float:
    """Eq. 8 for a plan: the same sums as :func:`~masterd.core.liquid.score.job_score` per
    job, over arrays built once per batch (this runs for every plan the GA makes)."""
    assign = plan.assign
    if None in assign:
        return INVALID
    gpus_used = plan.load.gpus
    owner, is_ps, info = problem.owner, problem.is_ps, problem.info
    jobs = len(problem.demands)
    workers: list[dict[str, int]] = [{} for _ in range(jobs)]
    ps_of: list[str | None] = [None] * jobs
    plan_ps: dict[str, int] = {}
    for k, node in enumerate(assign):
        j = owner[k]
        if is_ps[k]:
            ps_of[j] = node
            plan_ps[node] = plan_ps.get(node, 0) + 1  # type: ignore[index]
        else:
            w = workers[j]
            w[node] = w.get(node, 0) + 1  # type: ignore[index]
    dist = problem.weights.distances
    same_rack, same_domain, other = dist.same_rack, dist.same_domain, dist.other_domain
    total = 0.0
    for j in range(jobs):
        w = workers[j]
        ps = ps_of[j]
        tasks = problem.tasks_per_job[j]
        hub = ps if ps is not None else (min(w, key=lambda n: (-w[n], n)) if w else None)
        cost = 0.0
        if ps is not None and hub is not None:
            rack, domain = info[hub][3], info[hub][4]
            for node, count in w.items():
                if node != hub:
                    r, d = info[node][3], info[node][4]
                    cost += count * (other if d != domain else
                                     same_domain if r != rack else same_rack)
            cost *= problem.bandwidth[j]
        fitness = 0.0
        for node in w:
            size, used = info[node][0], info[node][1]
            fitness -= (used + gpus_used.get(node, 0)) / size
        nodes = len(w)
        if ps is not None:
            size, _, ps_tasks = info[ps][0], info[ps][1], info[ps][2]
            fitness += (ps_tasks + problem.base_ps.get(ps, 0) + plan_ps[ps]) / size
            nodes += ps not in w
        total += problem.weights.network * cost + fitness / tasks + nodes / tasks
    return -(total + len(set(assign)))


def grouping_ga(
    demands: Sequence[Demand],
    candidates: Sequence[Sequence[NodeCap]],
    caps: Mapping[str, NodeCap],
    base: Load,
    weights: ScoreWeights,
    settings: GaSettings,
    seed: str,
    base_ps: Mapping[str, int] | None = None,
    seeds: Sequence[Sequence[Mapping[int, str]]] = (),
) -> GaResult | None:
    """Place a batch of jobs together; None when no plan places them all.

    ``candidates[j]``: the nodes job ``j`` may use, in the pass's order; ``base``: what the
    pass placed already (updated with the batch on success); ``seeds``: known plans (per job,
    task index -> node) to start the population with."""
    problem = _Problem(demands, candidates, caps, base, weights, base_ps or {})
    n = len(problem.tasks)
    if n == 0:
        return GaResult([], 0.0, 0, 0)
    rng = random.Random(seed)
    everything = list(range(n))

    population: list[_Plan] = []
    for known in seeds:
        plan = _Plan(n, base)
        offset = 0
        for demand, placed in zip(demands, known, strict=True):
            for task in demand.tasks:
                plan.place(offset + task.index, placed[task.index], task)
            offset += len(demand.tasks)
        plan.fitness = _evaluate(problem, plan)
        population.append(plan)
    first = _Plan(n, base)
    if _first_fit(problem, first, everything):
        first.fitness = _evaluate(problem, first)
        population.append(first)
    # Liquid's immediate mode, job after job: a plan the batch must at least match (the
    # caller's seeds are that plan already when it reserved room by best fit).
    greedy = _Plan(n, base)
    greedy_load = base.copy()
    offset = 0
    ok = not seeds
    for j, demand in enumerate(demands if ok else ()):
        placed = best_fit(demand, problem.candidates[j], caps, greedy_load, weights)
        if placed is None:
            ok = False
            break
        for task in demand.tasks:
            greedy.place(offset + task.index, placed[task.index], task)
        offset += len(demand.tasks)
    if ok:
        greedy.fitness = _evaluate(problem, greedy)
        population.append(greedy)
    if all(p.fitness == INVALID for p in population):
        return None
    size = settings.population_base + n // 2
    evaluations = len(population)
    budget = settings.budget
    while len(population) < size and evaluations < budget:
        plan = _Plan(n, base)
        order = everything[:]
        rng.shuffle(order)
        if _random_fit(problem, plan, order, rng):
            plan.fitness = _evaluate(problem, plan)
        evaluations += 1
        population.append(plan)

    def tournament() -> _Plan:
        return max((population[rng.randrange(len(population))]
                    for _ in range(settings.tournament)), key=lambda p: p.fitness)

    best = max(population, key=lambda p: p.fitness)
    patience = settings.patience_base + n
    stale = generations = 0
    while stale < patience and evaluations < budget:
        generations += 1
        offspring = [best]
        while len(offspring) < size and evaluations < budget:
            child = tournament().copy()
            if rng.random() < settings.crossover:
                _crossover(problem, child, tournament(), rng)
            if rng.random() < settings.mutation:
                _mutate(problem, child, rng)
            child.fitness = _evaluate(problem, child)
            evaluations += 1
            offspring.append(child)
        population = offspring
        champion = max(population, key=lambda p: p.fitness)
        if champion.fitness > best.fitness + settings.min_improvement:
            best, stale = champion, 0
        else:
            stale += 1
    if best.fitness == INVALID:
        return None
    placed: list[dict[int, str]] = [{} for _ in demands]
    for k, node in enumerate(best.assign):
        assert node is not None
        placed[problem.owner[k]][problem.tasks[k].index] = node
    for k, node in enumerate(best.assign):
        assert node is not None
        base.add(node, problem.tasks[k])
    return GaResult(placed, best.fitness, generations, evaluations, capped=stale < patience)


def _crossover(problem: _Problem, child: _Plan, other: _Plan, rng: random.Random) -> None:
    if child.fitness == INVALID or other.fitness == INVALID:
        return
    nodes = sorted({n for n in other.assign if n is not None})
    c = nodes[rng.randrange(len(nodes))]
    moving = [k for k, n in enumerate(other.assign) if n == c]
    moving_set = set(moving)
    doomed = {child.assign[k] for k in moving} | {c}
    displaced = [k for k, n in enumerate(child.assign) if n in doomed and k not in moving_set]
    tasks = problem.tasks
    for k, n in enumerate(child.assign):
        if n in doomed:
            child.unplace(k, tasks[k])
    child.prune()
    for k in moving:
        child.place(k, c, tasks[k])
    if not _first_fit(problem, child, displaced):
        child.fitness = INVALID
        return
    child.prune()


def _mutate(problem: _Problem, child: _Plan, rng: random.Random) -> None:
    if child.fitness == INVALID:
        return
    nodes = sorted({n for n in child.assign if n is not None})
    victim = nodes[rng.randrange(len(nodes))]
    tasks = problem.tasks
    displaced = [k for k, n in enumerate(child.assign) if n == victim]
    for k in displaced:
        child.unplace(k, tasks[k])
    child.prune()
    if not _first_fit(problem, child, displaced, frozenset({victim})):
        child.fitness = INVALID
        return
    child.prune()


def plan_fitness(
    demands: Sequence[Demand],
    caps: Mapping[str, NodeCap],
    base: Load,
    weights: ScoreWeights,
    placed: Sequence[Mapping[int, str]],
    base_ps: Mapping[str, int] | None = None,
) -> float:
    """Eq. 8 for a given plan of a batch (per job: task index -> node)."""
    candidates = [list(caps.values()) for _ in demands]
    problem = _Problem(demands, candidates, caps, base, weights, base_ps or {})
    plan = _Plan(len(problem.tasks), base)
    offset = 0
    for demand, where in zip(demands, placed, strict=True):
        for task in demand.tasks:
            plan.place(offset + task.index, where[task.index], task)
        offset += len(demand.tasks)
    return _evaluate(problem, plan)
