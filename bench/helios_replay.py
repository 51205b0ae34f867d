"""Helios' Philly replay (Tables 3-4): FIFO against QSSF at the VC scale where FIFO's node
utilisation equals the 69.0% Helios reports for Philly, with Helios' rules (consolidated
placement, no backfill, per-VC scheduling, QSSF's seeded error model).

    python bench/helios_replay.py [--trace DIR] [--vc-scale S] [--seed N] [--sjf]

Without ``--vc-scale`` the scale is searched (bisection on FIFO's node utilisation, the
Philly study's search). ``--sjf`` also replays SJF by recorded duration. Prints a line per
replay and, last, one JSON line: fifo_over_qssf_jct, fifo_over_qssf_queue, qssf_queued_jobs,
fifo_queued_jobs, vc_scale, node_util_pct, seconds (plus the averages behind the ratios).
Paper (Helios §4.2.3, Philly): 2.3x, 7.3x, 22,026 against 30,282.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sim.engine import SimConfig
from sim.studies.philly import HELIOS_PHILLY, PhillyStudy, Setup, _day, search_scale, stats
from sim.truth import TruthConfig, TruthModel


def main() -> dict[str, object]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default=str(Path(__file__).resolve().parents[2] / "shared"
                                               / "traces"))
    parser.add_argument("--vc-scale", type=float, help="skip the search")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--sjf", action="store_true", help="also replay SJF")
    args = parser.parse_args()
    started = time.monotonic()
    study = replace(PhillyStudy(), seed=args.seed, fixed_scale=args.vc_scale)
    truth = TruthConfig(noise_sigma=0.0, interference=False)
    setup = Setup(study, Path(args.trace), TruthModel(truth, args.seed),
                  SimConfig(seed=args.seed, truth=truth), _day(study.since, "since"),
                  _day(study.until, "until"), False, {})
    probes: list[dict[str, object]] = []
    scale = args.vc_scale if args.vc_scale is not None else search_scale(setup, probes)
    for probe in probes:
        print(f"probe vc_scale={probe['vc_scale']} nodes={probe['nodes']} "
              f"fifo node util={probe['node_util_pct']:.1f}%", flush=True)
    out: dict[str, dict[str, object]] = {}
    for name in ("fifo", "qssf", *(("sjf",) if args.sjf else ())):
        result, wall = setup.run(name, scale)
        out[name] = stats(result, setup.workload(scale))
        print(f"{name} vc_scale={scale:g}: avg JCT {out[name]['avg_jct_s']:.0f} s, avg queueing "
              f"{out[name]['avg_queue_s']:.0f} s, queued {out[name]['queued_jobs']}, node util "
              f"{out[name]['node_util_pct']:.1f}% ({wall:.0f} s)", flush=True)
    fifo, qssf = out["fifo"], out["qssf"]
    paper = HELIOS_PHILLY
    print(f"paper: FIFO/QSSF JCT {paper['avg_jct_s']['fifo'] / paper['avg_jct_s']['qssf']:.1f}x, "
          f"queueing {paper['avg_queue_s']['fifo'] / paper['avg_queue_s']['qssf']:.1f}x, "
          f"queued {paper['queued_jobs']['qssf']} vs {paper['queued_jobs']['fifo']}")
    return {
        "fifo_over_qssf_jct": fifo["avg_jct_s"] / qssf["avg_jct_s"],
        "fifo_over_qssf_queue": fifo["avg_queue_s"] / qssf["avg_queue_s"],
        "qssf_queued_jobs": qssf["queued_jobs"],
        "fifo_queued_jobs": fifo["queued_jobs"],
        "vc_scale": scale,
        "node_util_pct": fifo["node_util_pct"],
        "seconds": time.monotonic() - started,
        "fifo_avg_jct_s": fifo["avg_jct_s"], "qssf_avg_jct_s": qssf["avg_jct_s"],
        "fifo_avg_queue_s": fifo["avg_queue_s"], "qssf_avg_queue_s": qssf["avg_queue_s"],
        "probes": len(probes),
        **({"sjf_avg_jct_s": out["sjf"]["avg_jct_s"], "sjf_queued_jobs": out["sjf"]["queued_jobs"]}
           if "sjf" in out else {}),
    }


if __name__ == "__main__":
    print(json.dumps(main()))
