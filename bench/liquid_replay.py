"""Liquid's replays (sim/studies/liquid.py) as a benchmark, with the figures issues #21 and #32
name:

    python bench/liquid_replay.py [--testbed-nodes 20] [--no-soda] [--out DIR]

Runs the Liquid study: its testbed in batch mode (Liquid against random, even spread, a
Kubernetes-like least-requested spread and a HiveD-like buddy-cell allocator), the resource
model's held-out R² on Lucid's measured co-location pairs, and openb with its fractional GPU
requests honoured (whole-GPU rounding, Liquid's sharing, SODA's arrays). Prints the study's
tables on stderr and, last, one JSON line: ``makespan_reduction_pct`` and
``jct_reduction_pct`` (Liquid's cut against each baseline on the largest testbed, with the
parameter servers' traffic calibrated to the paper's measured VGG-16 worker),
``calibrated_worker_mb_per_s`` (what a lone VGG-16 worker exchanges in the calibrated traffic
model), the same cuts uncalibrated (``uncalibrated``: full model-size exchanges), the resource
model's held-out R² on the metered testbed history (``history_r2``), Liquid's batch mode
against its immediate mode (``immediate_makespan_cut_pct``),
``rf_r2`` (mean over labels and splits, measured pairs), ``openb_gpu_alloc_pct``
(``whole``, ``shared``), the paper's figures beside them, and ``seconds``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sim.studies.liquid import LIQUID_PAPER, LiquidStudy, run  # noqa: E402

TRACES = ROOT.parent / "shared" / "traces"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--testbed-nodes", default="20", help="comma-separated, multiples of 5")
    p.add_argument("--no-soda", action="store_true", help="leave SODA's arrays out of openb")
    p.add_argument("--trace", type=Path, default=TRACES)
    args = p.parse_args()
    try:
        nodes = tuple(int(t) for t in args.testbed_nodes.split(","))
    except ValueError:
        p.error(f"--testbed-nodes: {args.testbed_nodes!r} is not a list of integers")
    if any(n < 5 or n % 5 for n in nodes):
        p.error("--testbed-nodes: each must be a multiple of 5")
    started = time.monotonic()
    study = replace(LiquidStudy(), testbed_nodes=nodes, openb_soda=not args.no_soda)
    with tempfile.TemporaryDirectory(prefix="trellis-test-bench-liquid-") as out:
        section = run(study, args.trace, Path(out), False)
    print(section.generated_markdown(), file=sys.stderr)
    data = section.data
    largest = str(max(nodes))
    cuts = data["reductions"][largest]
    runs = data["openb"]["runs"]

    def r1(x: float | None) -> float | None:
        return None if x is None else round(x, 1)

    calibration = data["calibration"]
    full = data["uncalibrated"]
    result = {
        "calibrated_worker_mb_per_s": calibration["lone_worker_mb_per_s"]["vgg16"],
        "makespan_reduction_pct": {b: r1(c["makespan"]) for b, c in cuts.items()},
        "jct_reduction_pct": {b: r1(c["jct"]) for b, c in cuts.items()},
        "immediate_makespan_cut_pct": {b: r1(c["makespan"]) for b, c in
                                       data["immediate_reductions"][largest].items()},
        "calibration": {"source": "Liquid §5.1, Fig. 4: a VGG-16 worker 'can reach 200 MB/s'",
                        "bytes_scale": round(calibration["bytes_scale"], 4),
                        "exchanged_mb_per_iteration":
                            calibration["exchanged_mb_per_iteration"]},
        "uncalibrated": {
            "worker_mb_per_s": full["traffic"]["lone_worker_mb_per_s"]["vgg16"],
            "makespan_reduction_pct": {b: r1(c["makespan"])
                                       for b, c in full["reductions"].items()},
            "jct_reduction_pct": {b: r1(c["jct"]) for b, c in full["reductions"].items()},
        },
        "history_r2": data["history"]["r2"],
        "testbed_nodes": int(largest),
        "rf_r2": round(data["rf_pairs"]["mean_r2"], 3),
        "rf_r2_by_label": {k: (None if v is None else round(v["mean"], 3))
                           for k, v in data["rf_pairs"]["r2"].items()},
        "openb_gpu_alloc_pct": {"whole": r1(runs["whole"]["gpu_alloc_pct"]),
                                "shared": r1(runs["sharing"]["gpu_alloc_pct"])},
        "openb_gpu_util_pct": {"whole": r1(runs["whole"]["gpu_util_pct"]),
                               "shared": r1(runs["sharing"]["gpu_util_pct"])},
        "openb_queue_avg_s": {k: r1(v["queue_avg_s"]) for k, v in runs.items()},
        "paper": {k: v for k, v in LIQUID_PAPER.items() if k != "source"},
        "seconds": round(time.monotonic() - started, 1),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
