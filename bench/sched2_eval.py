"""SCHED² against its baselines and the hold rule, paired per episode, and the agent's
decision latency at scale. Training is not part of it.

    .venv/bin/python bench/sched2_eval.py [--model FILE] [--scorer FILE] [--trace DIR]
        [--episodes 30] [--load 0.69] [--sweep 0.5,0.8,1.0,1.2] [--other-scorers F,F]
        [--workers 2]
        [--latency-servers 1000] [--latency-jobs 3000]

1. **Evaluation**: the held-out episodes (30–59) of the paper's mix (68% one-GPU jobs, mean gap
   172 s, 15 servers × 8 GPUs, 1,000 jobs, durations scaled to the offered load the paper's
   figures imply, 0.69; ``sim.workloads.sched2``) under the trained agent (the shipped model
   unless ``--model``), the per-job scorer over the whole queue (``sched2-scorer``, beyond the
   paper; ``--scorer``), the paper's six (SIF, DSIF, SAF, LRF, SPF, FIFO), SWAF with the GPUs
   asked, QSSF, and the hold rule (``sched2-hold``) at J = 10 and over the whole queue. Replays
   are the ``sched2`` study's (``sim.studies.sched2.replay_cell``), spread over ``--workers``
   processes. Comparisons are paired per episode with bootstrap 95% intervals (``sim.paired``):
   effectiveness as a ratio (higher is better), JCT and makespan as speed-ups (the other's mean
   ÷ ours). ``agent_vs_hold_*``: the agent against the hold rule at J = 10 — the agent counts as
   working only where these exceed 1 with the interval; ``scorer_vs_hold_*`` the same for the
   scorer, ``scorer_vs_hold_all_*`` against the rule over the whole queue, which sees what the
   scorer sees. ``--sweep``: the same at more loads (``sweep`` in the JSON), the implied load's
   keys staying at the top level. ``best_heuristic``: the heuristic with the best mean
   effectiveness (the paper's objective); ``jct_speedup_vs_best`` etc.: against the best
   heuristic of each metric.
2. **Decision latency**: J = 10 on ``--latency-servers`` servers × 8 GPUs (a network of that
   shape and the evaluated model's state — packing feature, server order — with seeded
   random weights: the time does not depend on the values), a workload of
   the same mix with arrivals sped up to keep the per-GPU load, replayed through the core. A
   decision is one action of the agent: from the start of the pass (or the previous action)
   to the agent's answer — the state, the forward pass, and placing the job picked before.
   The same for the scorer with its own (trained) weights: ``scorer_decision_ms_p99``.

Prints progress lines, then one JSON object on the last line. Targets: decisions p99 ≤ 10 ms;
evaluation under 10 minutes. The paper's figures (JCT 4.6×, makespan 2.1×, effectiveness
1.6×) are quoted, never tuned toward.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from masterd.core.policies.sched2 import DEFAULT_MODEL, Sched2Policy
from masterd.core.policies.sched2_scorer import DEFAULT_SCORER, Sched2ScorerPolicy
from masterd.core.sched2.agent import GreedyAgent
from masterd.core.sched2.network import QNetwork, Shape, random_network
from masterd.core.sched2.scorer import ScorerNetwork
from sim.engine import SimConfig, simulate
from sim.oracle import oracle_modeldb
from sim.paired import paired_ratio, speedup
from sim.studies import sched2 as study
from sim.truth import TruthModel
from sim.workloads import sched2 as workload

PAPER = {"jct_speedup": 4.6, "makespan_speedup": 2.1, "effectiveness": 1.6}
HOLDS = study.HOLD_RULES
BASELINES = (*study.PAPER_BASELINES, "swaf-exact", "qssf", *HOLDS)
METRICS = ("jct_s", "makespan_s", "effectiveness", "good_locality", "fragmentation", "wait_s",
           "run_s")


LEARNED = ("sched2", study.SCORER)


def evaluate(model: str, scorer: str, trace: Path, episodes: list[int], workers: int,
             load: float) -> dict[str, Any]:
    base = study.Cell("mix", 0.68, 1.0, 0, "sched2", model, str(trace), load=load)
    cells = [replace(base, episode=e, policy=p, model=scorer if p == study.SCORER else model)
             for e in episodes for p in (*LEARNED, *BASELINES)]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        results = list(pool.map(study.replay_cell, cells))
    res = study.Results(results)
    per: dict[str, dict[str, list[float]]] = {}
    for p in (*LEARNED, *BASELINES):
        runs = sorted(res.runs("mix", 0.68, 1.0, p), key=lambda r: r.cell.episode)
        per[p] = {m: [getattr(r.metrics, m) for r in runs] for m in METRICS}
    means = {p: {m: (math.fsum(v) / len(v) if v and None not in v else None)
                 for m, v in rows.items()} for p, rows in per.items()}
    unfinished = sum(r.metrics.unfinished for r in results)
    loads = [r.offered_load for r in results if r.cell.policy == "sched2"]
    return {"per": per, "means": means, "unfinished": unfinished,
            "offered_load": math.fsum(loads) / len(loads),
            "replay_seconds": math.fsum(r.wall_s for r in results)}


def compare(per: dict[str, dict[str, list[float]]], a: str, b: str) -> dict[str, Any]:
    """``a`` against ``b`` on the same episodes: effectiveness a ÷ b, JCT and makespan
    speed-ups b ÷ a, each with its paired bootstrap 95% interval."""
    eff = paired_ratio(per[a]["effectiveness"], per[b]["effectiveness"])
    jct = speedup(per[a]["jct_s"], per[b]["jct_s"])
    mk = speedup(per[a]["makespan_s"], per[b]["makespan_s"])
    return {"effectiveness": eff.ratio, "effectiveness_ci": eff.as_list(),
            "jct_speedup": jct.ratio, "jct_speedup_ci": jct.as_list(),
            "makespan_speedup": mk.ratio, "makespan_speedup_ci": mk.as_list()}


class TimedAgent:
    """The greedy agent (or scorer), timing every decision from the previous mark: wall-clock
    time, and this thread's CPU time (what the code costs when the host's cores are taken by
    others)."""

    def __init__(self, inner: GreedyAgent) -> None:
        self.inner = inner
        self.decisions: list[float] = []
        self.cpu: list[float] = []
        self.passes: list[float] = []
        self.mark = self._pass_start = time.perf_counter()
        self.cpu_mark = time.thread_time()
        self._in_pass = 0

    def start_pass(self) -> None:
        self._pass_start = self.mark = time.perf_counter()
        self.cpu_mark = time.thread_time()
        self._in_pass = 0

    def end_pass(self) -> None:
        now, cpu = time.perf_counter(), time.thread_time()
        if self._in_pass:  # placing the last job picked belongs to the last decision
            self.decisions[-1] += now - self.mark
            self.cpu[-1] += cpu - self.cpu_mark
        self.passes.append(now - self._pass_start)

    def act(self, observation: Any) -> int:
        action = self.inner.act(observation)
        now, cpu = time.perf_counter(), time.thread_time()
        self.decisions.append(now - self.mark)
        self.cpu.append(cpu - self.cpu_mark)
        self.mark, self.cpu_mark = now, cpu
        self._in_pass += 1
        return action

    def reward(self, value: float) -> None:
        self.inner.reward(value)


class TimedPolicy:
    def __init__(self, policy: Sched2Policy | Sched2ScorerPolicy, agent: TimedAgent) -> None:
        self.policy = policy
        self.agent = agent
        self.name = policy.name

    def plan(self, snapshot, queue, now):  # type: ignore[no-untyped-def]
        self.agent.start_pass()
        try:
            return self.policy.plan(snapshot, queue, now)
        finally:
            self.agent.end_pass()

    def decide(self, snapshot, queue, now):  # type: ignore[no-untyped-def]
        return self.plan(snapshot, queue, now).decisions


def latency(trace: Path, servers: int, jobs: int, like: Shape,
            scorer: ScorerNetwork | None = None) -> dict[str, Any]:
    """Decision times at ``servers`` servers with a network of the evaluated model's state
    (``like``: its packing feature and server order cost time too); with ``scorer``, that
    per-job scorer's (whose size does not depend on the cluster's)."""
    opts = replace(workload.Sched2Options(), servers=servers, jobs=jobs,
                   mean_gap_s=workload.Sched2Options().mean_gap_s * 15 / servers)
    truth = TruthModel(study.TRUTH)
    w = workload.episode(trace, opts, 30, truth)
    db = oracle_modeldb(study.TRUTH, workload.GPU_MODEL)
    policy: Sched2Policy | Sched2ScorerPolicy
    if scorer is not None:
        agent = TimedAgent(GreedyAgent(scorer))
        policy = Sched2ScorerPolicy(model=scorer, modeldb=db, agent=agent)
    else:
        network = random_network(Shape(servers, opts.gpus_per_server, 10, like.profiles,
                                       packing=like.packing, canonical=like.canonical), seed=1)
        agent = TimedAgent(GreedyAgent(network))
        policy = Sched2Policy(model=network, modeldb=db, agent=agent)
    started = time.perf_counter()
    result = simulate(w, TimedPolicy(policy, agent), SimConfig(seed=1, truth=study.TRUTH,
                                                               sample_interval=1e12))
    ms = sorted(1000 * d for d in agent.decisions)
    cpu = sorted(1000 * d for d in agent.cpu)
    passes = sorted(1000 * p for p in agent.passes)
    return {
        "servers": servers, "gpus": servers * opts.gpus_per_server, "jobs": jobs,
        "decisions": len(ms), "passes": len(passes),
        "decision_ms_p50": _pct(ms, 50), "decision_ms_p99": _pct(ms, 99),
        "decision_ms_max": ms[-1] if ms else None,
        "decision_cpu_ms_p50": _pct(cpu, 50), "decision_cpu_ms_p99": _pct(cpu, 99),
        "pass_ms_p50": _pct(passes, 50), "pass_ms_p99": _pct(passes, 99),
        "finished": sum(r.state == "finished" for r in result.records),
        "seconds": time.perf_counter() - started,
    }


def _pct(values: list[float], p: float) -> float | None:
    if not values:
        return None
    return values[max(0, math.ceil(p / 100 * len(values)) - 1)]


def other_scorers(paths: list[str], trace: Path, episodes: list[int], workers: int,
                  load: float, per: dict[str, dict[str, list[float]]]) -> dict[str, Any]:
    """More scorer models (other training seeds) against both hold rules, on the episodes
    ``per`` already holds the rules' replays of."""
    base = study.Cell("mix", 0.68, 1.0, 0, study.SCORER, "", str(trace), load=load)
    out: dict[str, Any] = {}
    for path in paths:
        cells = [replace(base, episode=e, model=path) for e in episodes]
        with ProcessPoolExecutor(max_workers=workers) as pool:
            runs = sorted(pool.map(study.replay_cell, cells), key=lambda r: r.cell.episode)
        rows = {**per, path: {m: [getattr(r.metrics, m) for r in runs] for m in METRICS}}
        out[path] = {f"vs_{b}": compare(rows, path, b) for b in HOLDS}
        for b in HOLDS:
            v = out[path][f"vs_{b}"]
            print(f"{Path(path).name} vs {b}: effectiveness {v['effectiveness']:.3f} "
                  f"[{v['effectiveness_ci'][0]:.3f}, {v['effectiveness_ci'][1]:.3f}]  JCT "
                  f"{v['jct_speedup']:.3f}x  makespan {v['makespan_speedup']:.3f}x", flush=True)
    return out


def at_load(ev: dict[str, Any]) -> dict[str, Any]:
    """The comparisons of one load's evaluation."""
    means, per = ev["means"], ev["per"]

    def top(names: tuple[str, ...]) -> str:
        return max(names, key=lambda b: means[b]["effectiveness"] or -1.0)

    best_paper, best = top(study.PAPER_BASELINES), top(BASELINES)
    versus = {f"{a}_vs_{b}": compare(per, a, b) for a in LEARNED
              for b in dict.fromkeys((best_paper, "swaf-exact", "qssf", *HOLDS))}
    versus |= {f"{study.HOLD}_vs_{b}": compare(per, study.HOLD, b)
               for b in dict.fromkeys((best_paper, "swaf-exact", "qssf", study.HOLD_ALL))}
    # The paper's form: against the best heuristic of each metric, on episode means.
    best_of = {m: (min if m != "effectiveness" else max)(
        BASELINES, key=lambda b, m=m: means[b][m]) for m in ("jct_s", "makespan_s",
                                                            "effectiveness")}
    ours = means["sched2"]
    return {"best_heuristic": best, "best_paper_baseline": best_paper, "versus": versus,
            "best_heuristic_per_metric": best_of,
            "jct_speedup_vs_best": means[best_of["jct_s"]]["jct_s"] / ours["jct_s"],
            "makespan_speedup_vs_best": means[best_of["makespan_s"]]["makespan_s"]
            / ours["makespan_s"],
            "effectiveness_vs_best": ours["effectiveness"]
            / means[best_of["effectiveness"]]["effectiveness"],
            "offered_load_measured": ev["offered_load"], "unfinished_jobs": ev["unfinished"],
            "means": means}


def show(load: float, ev: dict[str, Any], summary: dict[str, Any]) -> None:
    print(f"-- expected offered load {load:g} (measured {ev['offered_load']:.3f})", flush=True)
    for p, m in ev["means"].items():
        print(f"{p:16s} JCT {m['jct_s'] / 3600:7.2f} h  makespan {m['makespan_s'] / 3600:6.1f} h"
              f"  effectiveness {m['effectiveness']:.3f}  wait {m['wait_s'] / 3600:6.2f} h"
              f"  good locality {100 * (m['good_locality'] or 0):5.1f}%", flush=True)
    for name, v in summary["versus"].items():
        print(f"{name:34s} effectiveness {v['effectiveness']:.3f} "
              f"[{v['effectiveness_ci'][0]:.3f}, {v['effectiveness_ci'][1]:.3f}]  JCT "
              f"{v['jct_speedup']:.3f}x [{v['jct_speedup_ci'][0]:.3f}, "
              f"{v['jct_speedup_ci'][1]:.3f}]  makespan {v['makespan_speedup']:.3f}x "
              f"[{v['makespan_speedup_ci'][0]:.3f}, {v['makespan_speedup_ci'][1]:.3f}]",
              flush=True)


def headline(summary: dict[str, Any]) -> dict[str, Any]:
    """The issue's keys: the agent and the scorer against the hold rule at J = 10."""
    v = summary["versus"]
    agent, scorer = v[f"sched2_vs_{study.HOLD}"], v[f"{study.SCORER}_vs_{study.HOLD}"]
    scorer_all = v[f"{study.SCORER}_vs_{study.HOLD_ALL}"]
    out: dict[str, Any] = {}
    for prefix, row in (("agent_vs_hold", agent), ("scorer_vs_hold", scorer),
                        ("scorer_vs_hold_all", scorer_all)):
        for key, name in (("effectiveness", "effectiveness"), ("jct_speedup", "jct"),
                          ("makespan_speedup", "makespan")):
            out[f"{prefix}_{name}"] = row[key]
            out[f"{prefix}_{name}_ci"] = row[f"{key}_ci"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(DEFAULT_MODEL))
    parser.add_argument("--scorer", default=str(DEFAULT_SCORER),
                        help="the per-job scorer's model (default: the shipped one)")
    parser.add_argument("--trace", default=str(Path(__file__).resolve().parents[2]
                                               / "shared" / "traces"))
    parser.add_argument("--episodes", type=int, default=30)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--load", type=float, default=workload.IMPLIED_LOAD,
                        help="expected offered load (default: the paper's implied %(default)s)")
    parser.add_argument("--sweep", default="",
                        help="more loads to evaluate after --load, comma-separated (the "
                        "study's sweep: 0.5,0.8,1.0,1.2); each adds about two minutes")
    parser.add_argument("--other-scorers", default="", metavar="FILE,FILE",
                        help="more scorer models (other seeds) to pair with the hold rules at "
                        "--load")
    parser.add_argument("--latency-servers", type=int, default=1000)
    parser.add_argument("--latency-jobs", type=int, default=3000)
    args = parser.parse_args()
    try:
        sweep = [float(x) for x in args.sweep.split(",") if x.strip()]
    except ValueError:
        parser.error(f"--sweep {args.sweep!r}: comma-separated loads, e.g. 0.5,0.8,1.0,1.2")
    trace = Path(args.trace)
    episodes = list(workload.TEST_EPISODES)[:args.episodes]
    started = time.monotonic()
    ev = evaluate(args.model, args.scorer, trace, episodes, args.workers, args.load)
    eval_seconds = time.monotonic() - started
    summary = at_load(ev)
    show(args.load, ev, summary)
    seeds = other_scorers([p for p in args.other_scorers.split(",") if p], trace, episodes,
                          args.workers, args.load, ev["per"])
    by_load: dict[str, Any] = {}
    for load in sweep:
        other = evaluate(args.model, args.scorer, trace, episodes, args.workers, load)
        row = at_load(other)
        show(load, other, row)
        by_load[f"{load:g}"] = {**headline(row), "best_heuristic": row["best_heuristic"],
                                "offered_load_measured": row["offered_load_measured"],
                                "means": {p: {m: row["means"][p][m] for m in
                                              ("effectiveness", "jct_s", "makespan_s")}
                                          for p in row["means"]}}
    lat = latency(trace, args.latency_servers, args.latency_jobs,
                  QNetwork.load(args.model).shape)
    scorer_lat = latency(trace, args.latency_servers, args.latency_jobs,
                         QNetwork.load(args.model).shape, ScorerNetwork.load(args.scorer))
    for name, row in (("agent", lat), ("scorer", scorer_lat)):
        print(f"latency ({name}): {row['decisions']} decisions on {row['servers']} servers: "
              f"p50 {row['decision_ms_p50']:.2f} ms, p99 {row['decision_ms_p99']:.2f} ms (CPU "
              f"p99 {row['decision_cpu_ms_p99']:.2f} ms); passes p99 "
              f"{row['pass_ms_p99']:.2f} ms", flush=True)
    out = {
        "load": args.load,
        **headline(summary),
        **{k: summary[k] for k in ("offered_load_measured", "best_heuristic",
                                   "best_paper_baseline", "jct_speedup_vs_best",
                                   "makespan_speedup_vs_best", "effectiveness_vs_best",
                                   "best_heuristic_per_metric", "versus", "unfinished_jobs",
                                   "means")},
        "sweep": by_load,
        "other_scorers": seeds,
        "paper": PAPER,
        "decision_ms_p99": lat["decision_ms_p99"],
        "decision_ms_p50": lat["decision_ms_p50"],
        "decision_cpu_ms_p99": lat["decision_cpu_ms_p99"],
        "pass_ms_p99": lat["pass_ms_p99"],
        "scorer_decision_ms_p99": scorer_lat["decision_ms_p99"],
        "scorer_decision_cpu_ms_p99": scorer_lat["decision_cpu_ms_p99"],
        "latency": lat,
        "scorer_latency": scorer_lat,
        "episodes": len(episodes),
        "model": args.model,
        "scorer": args.scorer,
        "evaluation_seconds": eval_seconds,
        "seconds": time.monotonic() - started,
    }
    print(json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    main()
