"""Helios' Philly replay (Tables 3-4): FIFO against QSSF at the VC scale where FIFO's node
utilisation equals the 69.0% Helios reports for Philly, with Helios' rules (consolidated
placement, no backfill, per-VC scheduling, QSSF's seeded error model), and the FIFO ÷ QSSF
ratios as a band over error-model seeds and the VC scales nearest that utilisation.

    python bench/helios_replay.py [--trace DIR] [--vc-scale S] [--seed N] [--band-seeds 1,2,3]
        [--band-scales 3] [--sjf]

Without ``--vc-scale`` the scale is searched (bisection on FIFO's node utilisation, the
Philly study's search); the band then spans every ``--band-seeds`` seed at each of the
``--band-scales`` probed scales whose FIFO utilisation came nearest the target (with
``--vc-scale``: that scale only). ``--sjf`` also replays SJF by recorded duration at the
point estimate's scale. Prints a line per replay and, last, one JSON line:
fifo_over_qssf_jct and fifo_over_qssf_queue (the point estimate: ``--seed`` at the found
scale), fifo_over_qssf_jct_band and fifo_over_qssf_queue_band ([low, high] over the band),
band (every replay behind it), qssf_queued_jobs, fifo_queued_jobs, vc_scale, node_util_pct,
seconds (plus the averages behind the ratios). Paper (Helios §4.2.3, Philly): 2.3x, 7.3x,
22,026 against 30,282.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sim.studies.philly import (
    HELIOS_PHILLY,
    PhillyStudy,
    band,
    ratio_band,
    scales_of_band,
    search_scale,
    seeded_setup,
    stats,
)


def _seeds(text: str) -> tuple[int, ...]:
    try:
        seeds = tuple(int(t) for t in text.split(",") if t.strip())
    except ValueError:
        raise SystemExit(f"helios_replay: --band-seeds {text!r} is not a list of "
                         "integers") from None
    if not seeds:
        raise SystemExit("helios_replay: --band-seeds needs at least one seed")
    return seeds


def main() -> dict[str, object]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default=str(Path(__file__).resolve().parents[2] / "shared"
                                               / "traces"))
    parser.add_argument("--vc-scale", type=float, help="skip the search")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--band-seeds", default="1,2,3")
    parser.add_argument("--band-scales", type=int, default=3)
    parser.add_argument("--sjf", action="store_true", help="also replay SJF")
    args = parser.parse_args()
    if args.band_scales < 1:
        raise SystemExit("helios_replay: --band-scales must be at least 1")
    started = time.monotonic()
    trace = Path(args.trace)
    study = replace(PhillyStudy(), seed=args.seed, fixed_scale=args.vc_scale,
                    band_seeds=_seeds(args.band_seeds), band_scales=args.band_scales)
    setup = seeded_setup(study, trace, args.seed)
    probes: list[dict[str, Any]] = []
    scale = args.vc_scale if args.vc_scale is not None else search_scale(setup, probes)
    for probe in probes:
        print(f"probe vc_scale={probe['vc_scale']} nodes={probe['nodes']} "
              f"fifo node util={probe['node_util_pct']:.1f}%", flush=True)
    scales = scales_of_band(probes, study, scale)
    out: dict[str, dict[str, Any]] = {}
    searched = [p for p in probes if p["vc_scale"] == scale]
    if searched:  # the search already replayed FIFO there
        out["fifo"] = searched[0]
    for name in ("fifo", "qssf", *(("sjf",) if args.sjf else ())):
        if name in out:
            continue
        result, wall = setup.run(name, scale)
        out[name] = stats(result, setup.workload(scale))
        print(f"{name} vc_scale={scale:g}: avg JCT {out[name]['avg_jct_s']:.0f} s, avg queueing "
              f"{out[name]['avg_queue_s']:.0f} s, queued {out[name]['queued_jobs']}, node util "
              f"{out[name]['node_util_pct']:.1f}% ({wall:.0f} s)", flush=True)
    known = {(args.seed, p["vc_scale"]): {"fifo": p} for p in probes}
    known[(args.seed, scale)] = {"fifo": out["fifo"], "qssf": out["qssf"]}

    def show(row: dict[str, Any]) -> None:
        print(f"band seed={row['seed']} vc_scale={row['vc_scale']:g}: FIFO node util "
              f"{row['fifo_node_util_pct']:.1f}%, FIFO/QSSF JCT {row['fifo_over_qssf_jct']:.2f}x, "
              f"queueing {row['fifo_over_qssf_queue']:.2f}x", flush=True)

    rows = ratio_band(study, trace, scales, known, progress=show)
    fifo, qssf = out["fifo"], out["qssf"]
    paper = HELIOS_PHILLY
    print(f"paper: FIFO/QSSF JCT {paper['avg_jct_s']['fifo'] / paper['avg_jct_s']['qssf']:.1f}x, "
          f"queueing {paper['avg_queue_s']['fifo'] / paper['avg_queue_s']['qssf']:.1f}x, "
          f"queued {paper['queued_jobs']['qssf']} vs {paper['queued_jobs']['fifo']}")
    jct_band = band([r["fifo_over_qssf_jct"] for r in rows])
    queue_band = band([r["fifo_over_qssf_queue"] for r in rows])
    return {
        "fifo_over_qssf_jct": fifo["avg_jct_s"] / qssf["avg_jct_s"],
        "fifo_over_qssf_queue": fifo["avg_queue_s"] / qssf["avg_queue_s"],
        "fifo_over_qssf_jct_band": list(jct_band) if jct_band else None,
        "fifo_over_qssf_queue_band": list(queue_band) if queue_band else None,
        "band_seeds": list(study.band_seeds),
        "band_vc_scales": scales,
        "band": rows,
        "qssf_queued_jobs": qssf["queued_jobs"],
        "fifo_queued_jobs": fifo["queued_jobs"],
        "vc_scale": scale,
        "node_util_pct": fifo["node_util_pct"],
        "seconds": time.monotonic() - started,
        "fifo_avg_jct_s": fifo["avg_jct_s"], "qssf_avg_jct_s": qssf["avg_jct_s"],
        "fifo_avg_queue_s": fifo["avg_queue_s"], "qssf_avg_queue_s": qssf["avg_queue_s"],
        "probes": len(probes),
        "paper": {"fifo_over_qssf_jct": paper["avg_jct_s"]["fifo"] / paper["avg_jct_s"]["qssf"],
                  "fifo_over_qssf_queue":
                      paper["avg_queue_s"]["fifo"] / paper["avg_queue_s"]["qssf"],
                  "seconds_at_most": 600},
        **({"sjf_avg_jct_s": out["sjf"]["avg_jct_s"], "sjf_queued_jobs": out["sjf"]["queued_jobs"]}
           if "sjf" in out else {}),
    }


if __name__ == "__main__":
    print(json.dumps(main()))
