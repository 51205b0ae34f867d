"""Liquid's grouping GA on a batch of 100 tasks and 1,000 nodes, against best fit on the same
batch, same run:

    python bench/liquid_ga.py [--jobs 25] [--gpus 3] [--nodes 1000] [--rounds 3]

The cluster is ``--nodes`` nodes of 4 GPUs in racks of 20 and domains of 10 racks, a quarter
of them busy (seeded); the batch is ``--jobs`` training jobs of ``--gpus`` GPUs each (one
worker per GPU and one parameter server: 25 × 4 = 100 tasks). One scheduling pass of the
``liquid`` policy with the batch window closed places the batch with the GA (its reservation
by best fit included); the baseline is the same pass with batching off (best fit job by job).

The GA runs under Liquid's own stopping rule (30 + n generations without an improvement above
1e-6; no cap on the plans it evaluates), and, for comparison, under the live default cap of
3,000 plans. Reported: median seconds per pass — wall time and the process's CPU time (on a
shared machine the wall time includes waiting for a CPU) — their ratio to best fit's, the GA's
generations and plans, and ``ga_score_vs_bestfit``: the plan's cost as the GA minimises it
(Eq. 8 negated: Σ Score over the batch's jobs + nodes used), computed by the same code for
the GA's plan and best fit's, their ratio (below 1: the GA's plan is better) and the parts.
Liquid also stops a batch at 30 s of wall time: ``within_liquid_wall_bound`` says whether its
rule finished before that. Issue #21's target (at most 1 s for the batch) is judged on the
capped GA's CPU time and on Liquid's rule's. Last line: JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from masterd.core.cluster import ClusterSnapshot  # noqa: E402
from masterd.core.liquid.demand import PS  # noqa: E402
from masterd.core.liquid.ga import plan_fitness  # noqa: E402
from masterd.core.liquid.passes import LiquidPass  # noqa: E402
from masterd.core.liquid.sharing import SharingRule  # noqa: E402
from masterd.core.policies.liquid import LiquidPolicy  # noqa: E402
from masterd.core.policy import Decision, Start  # noqa: E402
from masterd.core.scheduler import SchedulingCore  # noqa: E402
from shared.model import Job, JobSpec, NodeAllocation, Placement  # noqa: E402
from sim.cluster import NodeGroup, build_node  # noqa: E402

TARGET_S = 1.0
LIQUID_WALL_BOUND_S = 30.0  # Liquid's code also stops a batch after 30 s
LIVE_CAP = 3000


def cluster(policy: LiquidPolicy, nodes: int, seed: int) -> SchedulingCore:
    core = SchedulingCore(policy)
    group = NodeGroup(count=1, gpus_per_node=4, gpu_model="T4", cpu_cores=32, sockets=2)
    rng = random.Random(seed)
    for i in range(nodes):
        node = replace(build_node(f"n{i:04d}", group), rack=f"r{i // 20}",
                       domain=f"d{i // 200}")
        core.node_up(node)
        busy = rng.random() < 0.25
        if busy:  # a job from before holds some of this node's GPUs
            gpus = tuple(range(rng.randint(1, 4)))
            core.cluster.allocate(f"old-{i}", Placement((NodeAllocation(node.name, gpus),)))
    return core


def plan_cost(policy: LiquidPolicy, snapshot: ClusterSnapshot, jobs: dict[str, Job],
              decisions: list[Decision]) -> dict[str, float]:
    """Eq. 8 negated for the batch as ``decisions`` placed it, by the GA's own evaluation:
    Σ Score over the jobs (Eq. 7) plus the nodes the batch uses."""
    state = LiquidPass(snapshot, 1.0, policy.weights, policy.bandwidth, SharingRule(), False)
    demands, placed = [], []
    for d in decisions:
        assert isinstance(d, Start)
        demand = state.demand(jobs[d.job_id])
        workers = [t for t in demand.tasks if t.role != PS]
        where: dict[int, str] = {}
        slots = [a.node for a in d.placement.allocations for _ in a.gpus]
        for task, node in zip(workers, slots, strict=True):
            where[task.index] = node
        for task in demand.tasks:
            if task.role == PS:  # rank 0: the placement's first allocation
                where[task.index] = d.placement.allocations[0].node
        demands.append(demand)
        placed.append(where)
    fitness = plan_fitness(demands, state.caps, state.load, policy.weights, placed)
    nodes = len({n for p in placed for n in p.values()})
    return {"cost": -fitness, "sum_score": -fitness - nodes, "nodes": nodes}


def one_pass(batch: bool, cap: int | None, args: argparse.Namespace
             ) -> tuple[float, float, LiquidPolicy, int, dict[str, float]]:
    policy = LiquidPolicy(batch=batch, batch_window_s=0.0, seed=args.seed,
                          ga={"max_evaluations": cap})
    core = cluster(policy, args.nodes, args.seed)
    jobs = {}
    for i in range(args.jobs):
        job = Job(id=f"j{i}", spec=JobSpec(name=f"j{i}", command=("train",), user="u",
                                            gpus=args.gpus, cpus=args.gpus), submit_time=0.0)
        jobs[job.id] = job
        core.submit(job)
    snapshot = core.snapshot()
    started, cpu = time.perf_counter(), time.process_time()
    decisions = core.schedule(1.0)
    wall, used = time.perf_counter() - started, time.process_time() - cpu
    return wall, used, policy, len(decisions), plan_cost(policy, snapshot, jobs, decisions)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=25)
    p.add_argument("--gpus", type=int, default=3)
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    if min(args.jobs, args.gpus, args.nodes, args.rounds) < 1:
        p.error("--jobs, --gpus, --nodes and --rounds must be positive")
    runs: dict[str, dict[str, list]] = {k: {"wall": [], "cpu": []}
                                        for k in ("liquid", "capped", "bestfit")}
    last: dict[str, tuple[LiquidPolicy, int, dict[str, float]]] = {}
    for _ in range(args.rounds):  # alternate, so all see the same machine load
        for key, batch, cap in (("liquid", True, None), ("capped", True, LIVE_CAP),
                                ("bestfit", False, LIVE_CAP)):
            wall, cpu, policy, placed, cost = one_pass(batch, cap, args)
            runs[key]["wall"].append(wall)
            runs[key]["cpu"].append(cpu)
            last[key] = (policy, placed, cost)
    med = {k: {m: statistics.median(v[m]) for m in ("wall", "cpu")} for k, v in runs.items()}
    best_cost = last["bestfit"][2]
    tasks = args.jobs * (args.gpus + (1 if args.gpus >= 2 else 0))

    def ratio(a: float, b: float) -> float | None:
        return round(a / b, 4) if b > 0 else None

    def ga(key: str) -> dict[str, object]:
        policy, placed, cost = last[key]
        stats = policy.last
        return {
            "s": round(med[key]["wall"], 4), "s_max": round(max(runs[key]["wall"]), 4),
            "cpu_s": round(med[key]["cpu"], 4),
            "over_bestfit_cpu": ratio(med[key]["cpu"], med["bestfit"]["cpu"]),
            "generations": stats.ga_generations, "evaluations": stats.ga_evaluations,
            "stopped_by": "cap" if stats.ga_capped else "liquid's rule",
            "jobs_placed": placed, "cost": round(cost["cost"], 4),
            "sum_score": round(cost["sum_score"], 4), "nodes": cost["nodes"],
        }

    liquid, capped = ga("liquid"), ga("capped")
    result = {
        "tasks": tasks,
        "nodes": args.nodes,
        "jobs_placed": last["bestfit"][1],
        "ga_score_vs_bestfit": {
            "ratio": ratio(last["liquid"][2]["cost"], best_cost["cost"]),
            "capped_ratio": ratio(last["capped"][2]["cost"], best_cost["cost"]),
            "ga_cost": liquid["cost"], "capped_cost": capped["cost"],
            "bestfit_cost": round(best_cost["cost"], 4),
            "ga_sum_score": liquid["sum_score"], "bestfit_sum_score":
                round(best_cost["sum_score"], 4),
            "ga_nodes": liquid["nodes"], "bestfit_nodes": best_cost["nodes"],
        },
        "ga_s": liquid["s"],
        "ga_cpu_s": liquid["cpu_s"],
        "ga_generations": liquid["generations"],
        "ga_evaluations": liquid["evaluations"],
        "ga_over_bestfit": liquid["over_bestfit_cpu"],
        "liquid_rule": liquid,
        "capped_3000": capped,
        "bestfit_s": round(med["bestfit"]["wall"], 4),
        "bestfit_cpu_s": round(med["bestfit"]["cpu"], 4),
        "within_liquid_wall_bound": max(runs["liquid"]["wall"]) <= LIQUID_WALL_BOUND_S,
        "target_s": TARGET_S,
        "target_met": med["liquid"]["cpu"] <= TARGET_S,
        "target_met_capped": med["capped"]["cpu"] <= TARGET_S,
        "rounds": args.rounds,
        "load_avg_1min": round(os.getloadavg()[0], 2),
        "cpus": os.cpu_count(),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
