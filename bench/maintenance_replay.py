"""A planned maintenance window against draining by hand, replayed on Philly.

    python bench/maintenance_replay.py [--trace DIR] [--seeds 1,2,3] [--policy fifo]

The study, fixed before its results were looked at:

* **Platform and workload**: the Philly trace (``philly-jobs.csv``) on its whole pool, 352
  nodes × 8 GPUs, jobs submitted in days 28 to 56 of the trace, replayed by the simulator
  through the scheduling core under ``--policy`` (FIFO by default).
* **Time limits**: the trace has none; each job is given what a user would ask for, twice
  its recorded duration rounded up to the hour, at most ``MAX_TIME`` (7 days: a site's
  longest limit). Jobs recorded longer than that are stopped at it, the same in every run.
* **Window**: 4 hours on 10 % of the nodes (35, the first by name), beginning on day 49
  (21 days into the slice, the cluster loaded).
* **Runs** per seed: *reference* (no window), *maint* (the window planned, as
  ``trellisctl maintenance plan`` does: the master's own stamps, sim/calendar.py), *drain*
  (the same nodes drained by hand at the window's start minus the longest time limit, as an
  operator without windows must to be sure nothing runs into it, until the window's end).
* **Metrics**: ``maint_running_at_start`` (jobs on the window's nodes when it begins; target
  0), the GPUs busy there then in each run (``*_gpus_busy_at_start``);
  ``maint_util_lost_pct`` and ``drain_util_lost_pct``: GPU-time the window's nodes did not
  serve in the ``MAX_TIME`` before the window that they served in the reference run, as a
  percentage of their GPU capacity over that time; the average JCT of the three runs beside
  them. Mean and a 95 % t interval over the seeds.

Last line, JSON: the metrics (means and intervals), ``seeds``, ``jobs``, ``targets_met``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from masterd.core.policies import make_policy
from shared.maintenance import Window
from sim.calendar import Drain, gpu_seconds
from sim.engine import SimConfig, simulate
from sim.metrics import summarise
from sim.truth import TruthModel
from sim.workloads import philly
from sim.workloads.base import LoadOptions, Workload

DAY = 86_400.0
SLICE = (28 * DAY, 56 * DAY)
MAX_TIME = 7 * DAY
WINDOW_START = 49 * DAY - SLICE[0]  # on the slice's clock
WINDOW_LENGTH = 4 * 3600.0
NODE_SHARE = 0.10
# Two-sided 95 % t quantiles by degrees of freedom (seeds - 1).
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
       9: 2.262}


def requested_limit(duration: float) -> float:
    """What a user asks for: twice the run, rounded up to the hour, at most MAX_TIME."""
    return min(MAX_TIME, math.ceil(2 * max(duration, 1.0) / 3600.0) * 3600.0)


def sliced(workload: Workload) -> tuple[Workload, int]:
    """The slice's jobs, on its own clock, each with its requested limit; and how many are
    recorded longer than MAX_TIME."""
    jobs, cut = [], 0
    for job in workload.jobs:
        if not SLICE[0] <= job.submit < SLICE[1]:
            continue
        duration = float(job.truth.known_duration or 0.0)
        cut += duration > MAX_TIME
        spec = dataclasses.replace(job.spec, time_limit_s=requested_limit(duration))
        jobs.append(dataclasses.replace(job, spec=spec, submit=job.submit - SLICE[0]))
    return Workload(workload.name, jobs, workload.nodes, notes=dict(workload.notes)), cut


def interval(values: list[float]) -> dict[str, float]:
    mean = statistics.fmean(values)
    if len(values) < 2:
        return {"mean": round(mean, 3), "ci95": float("nan")}
    half = T95.get(len(values) - 1, 1.96) * statistics.stdev(values) / math.sqrt(len(values))
    return {"mean": round(mean, 3), "ci95": round(half, 3)}


def one_seed(trace: Path, seed: int, policy: str) -> dict[str, Any]:
    loaded = philly.load(trace, LoadOptions(seed=seed), TruthModel(seed=seed))
    workload, cut = sliced(loaded)
    names = sorted(n.name for n in workload.nodes)
    chosen = tuple(names[:round(NODE_SHARE * len(names))])
    gpus = sum(len(n.gpus) for n in workload.nodes if n.name in chosen)
    start, end = WINDOW_START, WINDOW_START + WINDOW_LENGTH
    base = SimConfig(seed=seed, watch_nodes=chosen)
    runs = {
        "reference": base,
        "maint": dataclasses.replace(base, windows=(
            Window("maint", ",".join(chosen), start, end, "replayed window"),)),
        "drain": dataclasses.replace(base, drains=(Drain(chosen, start - MAX_TIME, end),)),
    }
    out: dict[str, Any] = {"seed": seed, "jobs": len(workload.jobs), "jobs_cut": cut,
                           "nodes": len(chosen)}
    served: dict[str, float] = {}
    for name, config in runs.items():
        t0 = time.perf_counter()
        result = simulate(workload, make_policy(policy), config)
        served[name] = gpu_seconds(result.watched_usage, start - MAX_TIME, start)
        out[f"{name}_avg_jct_s"] = round(summarise(result)["avg_jct_s"], 1)
        out[f"{name}_seconds"] = round(time.perf_counter() - t0, 1)
        if name == "maint":
            out["maint_running_at_start"] = result.running_at_window_start["maint"]
        out[f"{name}_gpus_busy_at_start"] = _held_at(result.watched_usage, start)
    capacity = gpus * MAX_TIME
    for name in ("maint", "drain"):
        out[f"{name}_util_lost_pct"] = round(
            100.0 * (served["reference"] - served[name]) / capacity, 3)
    out["reference_util_pct"] = round(100.0 * served["reference"] / capacity, 3)
    return out


def _held_at(series: list[tuple[float, int]], moment: float) -> int:
    """GPUs held on the watched nodes at ``moment``."""
    held = 0
    for t, gpus in series:
        if t > moment:
            break
        held = gpus
    return held


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trace", default=str(Path(__file__).resolve().parents[2]
                                               / "shared" / "traces"))
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--policy", default="fifo")
    args = parser.parse_args(argv)
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        parser.error(f"--seeds {args.seeds!r}: give seeds as 1,2,3")
    if not seeds:
        parser.error("--seeds: give at least one seed")
    rows = []
    for seed in seeds:
        row = one_seed(Path(args.trace), seed, args.policy)
        print(json.dumps(row), flush=True)
        rows.append(row)
    summary: dict[str, Any] = {"policy": args.policy, "seeds": seeds, "jobs": rows[0]["jobs"],
                               "window_nodes": rows[0]["nodes"]}
    for key in ("maint_running_at_start", "maint_gpus_busy_at_start",
                "drain_gpus_busy_at_start", "reference_gpus_busy_at_start", "maint_util_lost_pct",
                "drain_util_lost_pct", "reference_util_pct", "reference_avg_jct_s",
                "maint_avg_jct_s", "drain_avg_jct_s"):
        summary[key] = interval([float(r[key]) for r in rows])
    summary["targets_met"] = all(r["maint_running_at_start"] == 0 for r in rows)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
