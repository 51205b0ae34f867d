"""The GENIE study's headline figures: SWAF against the best baseline, and prediction error.

    .venv/bin/python bench/genie_replay.py [--densities 5,10,20] [--seeds 1,2,3,4,5]
        [--lengths short] [--serial | --scheduler ADDRESS | --workers N]

Replays GENIE's workload (§7.1) as the study sets it up (``sim.studies.genie``): every
placement within the platform for SWAF, Tetris+Perf and Tetris+CER (``shape_mode="any"``), a
model database profiled on the simulated platform before each seed's replays, interference on,
SWAF as Algorithm 1 has it (an urgent task on the highest-CER placement, line 13) and the
paper's six baselines (Capacity keeping each model type to its own share), plus the two
ablation rows (SWAF with urgent tasks on their fastest placement, Capacity lending), on Dask (a
local cluster by default). Prints one line per density and, last, one JSON object: ``seeds``,
``offered_load`` (``{density: mean over seeds of Σ single-GPU latency ÷ (16 GPUs × 24 h)}``),
``qos_gain_pct`` and ``makespan_reduction_pct`` (each ``{density: SWAF's relative change
against the best baseline at that density}``, on means over seeds, positive = SWAF better),
``makespan_vs_tetris_cer_pct`` (``{density: SWAF's mean makespan against Tetris+CER's, %,
positive = longer}``) and the same for the ablation (``..._urgent_fastest``),
``capacity_qos_pct`` (``{density: {"own_share", "lending"}}``), ``pred_error_mean_pct`` and
``pred_error_p95_pct`` (Fig. 15's form: |predicted − measured| / measured latency of every
task SWAF ran, on its placement), ``pred_error_decomposition`` (``{density: {"noise=..,
interference=..": {mean_pct, p95_pct, bias_pct}}}``), ``seconds`` (wall time of the replays)
and the paper's targets beside each. The paper: QoS gain up to +67.4 %, makespan −28.2 %,
prediction error ≤ 5 % mean and ≤ 11 % at the 95th percentile.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

# Run from a checkout without installing: the simulator and the core of *this* tree.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sim.parallel import RunnerError, open_runner
from sim.studies.genie import (
    CAPACITY_LEND,
    GENIE_BASELINES,
    GENIE_PAPER,
    URGENT_FASTEST,
    GenieStudy,
    Results,
    best_baseline,
    cells,
    decomposition_key,
    error_decomposition,
    error_stats,
    makespan_vs,
    replay_cell,
)


def _numbers(text: str, convert: type, flag: str) -> tuple:
    try:
        values = tuple(convert(t) for t in text.split(",") if t.strip())
    except ValueError:
        raise SystemExit(f"genie_replay: {flag} {text!r} is not a comma-separated list") from None
    if not values:
        raise SystemExit(f"genie_replay: {flag} needs at least one value")
    return values


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--densities", default="5,10,20")
    parser.add_argument("--seeds", default="1,2,3,4,5")
    parser.add_argument("--lengths", default="short", choices=("short", "long"))
    parser.add_argument("--scheduler", help="an existing Dask scheduler's address")
    parser.add_argument("--workers", type=int, help="local Dask worker processes")
    parser.add_argument("--serial", action="store_true", help="no Dask: one process")
    args = parser.parse_args()
    study = GenieStudy(
        densities=_numbers(args.densities, float, "--densities"),
        seeds=_numbers(args.seeds, int, "--seeds"),
        lengths=(args.lengths,),
        policies=("swaf", *GENIE_BASELINES),
        defer_densities=(),
        compare_cap=False,
        compare_interference=False,
        compare_builtin_db=False,
        ablations=True,
        decompose_error=True,
    )
    todo = cells(study)
    started = time.monotonic()
    try:
        with open_runner(args.scheduler, args.workers, args.serial) as runner:
            results = runner.map(replay_cell, todo)
            where = getattr(runner, "description", "")
    except RunnerError as exc:
        raise SystemExit(f"genie_replay: {exc}") from None
    seconds = time.monotonic() - started
    res = Results(results)
    qos_gain: dict[str, float | None] = {}
    makespan: dict[str, float | None] = {}
    vs_tetris: dict[str, float | None] = {}
    vs_tetris_fastest: dict[str, float | None] = {}
    offered: dict[str, float | None] = {}
    capacity: dict[str, dict[str, float | None]] = {}
    decomposition: dict[str, dict[str, dict[str, float | None]]] = {}
    for density in study.densities:
        key = f"{density:g}"
        b = best_baseline(res, args.lengths, density, list(GENIE_BASELINES))
        qos_gain[key] = b["qos_change_pct"]
        makespan[key] = b["makespan_reduction_pct"]
        vs_tetris[key] = makespan_vs(res, args.lengths, density, "swaf")
        vs_tetris_fastest[key] = makespan_vs(res, args.lengths, density, URGENT_FASTEST)
        load = res.offered_ratio(args.lengths, density)
        offered[key] = load.mean if load else None
        capacity[key] = {}
        for name, label in (("own_share", "capacity"), ("lending", CAPACITY_LEND)):
            q = res.spread(res.runs(args.lengths, density, label), "qos_pct")
            capacity[key][name] = q.mean if q else None
        decomposition[key] = {decomposition_key(noise, interference): e for noise,
                              interference, e in error_decomposition(res, args.lengths, density)}
        print(f"density {density:g} (offered load {offered[key]:.2f}): SWAF QoS "
              f"{b['swaf_qos']:.1f} % vs {b['best_qos']} {b['best_qos_value']:.1f} % "
              f"({b['qos_change_pct']:+.1f} %); makespan {b['swaf_makespan_h']:.1f} h vs "
              f"{b['best_makespan']} {b['best_makespan_h']:.1f} h "
              f"({b['makespan_reduction_pct']:+.1f} %); vs Tetris+CER {vs_tetris[key]:+.1f} % "
              f"(urgent on fastest: {vs_tetris_fastest[key]:+.1f} %); Capacity QoS "
              f"{capacity[key]['own_share']:.1f} % (lending {capacity[key]['lending']:.1f} %)")
    latencies = [t for density in study.densities
                 for r in res.runs(args.lengths, density, "swaf") for t in r.latencies]
    tasks, mean_err, p95_err = error_stats(latencies)
    per_type: dict[str, list] = defaultdict(list)
    for t in latencies:
        per_type[t.model_type].append(t)
    by_type = {m: dict(zip(("tasks", "mean_pct", "p95_pct"), error_stats(ts), strict=True))
               for m, ts in sorted(per_type.items())}
    print(f"prediction error over {tasks} tasks: mean {mean_err:.1f} %, p95 {p95_err:.1f} % "
          f"({len(todo)} replays {where}, {seconds:.0f} s)")
    print(json.dumps({
        "seeds": list(study.seeds),
        "densities": list(study.densities),
        "lengths": args.lengths,
        "replays": len(todo),
        "runner": where,
        "offered_load": offered,
        "qos_gain_pct": qos_gain,
        "makespan_reduction_pct": makespan,
        "makespan_vs_tetris_cer_pct": vs_tetris,
        "makespan_vs_tetris_cer_pct_urgent_fastest": vs_tetris_fastest,
        "capacity_qos_pct": capacity,
        "pred_error_decomposition": decomposition,
        "pred_error_mean_pct": mean_err,
        "pred_error_p95_pct": p95_err,
        "pred_error_by_type": by_type,
        "pred_tasks": tasks,
        "seconds": seconds,
        "paper": {
            "qos_gain_pct_up_to": GENIE_PAPER["qos_improvement_pct"],
            "makespan_reduction_pct_up_to": GENIE_PAPER["makespan_reduction_pct"],
            "pred_error_mean_pct_at_most": GENIE_PAPER["prediction_error_mean_pct"],
            "pred_error_p95_pct_at_most": GENIE_PAPER["prediction_error_p95_pct"],
            "seconds_at_most": 600,
        },
    }, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
