"""EASY backfill against plain backfill and strict FIFO on Philly, per VC, at the Helios
study's VC scale, with time limits drawn as duration × U(1.2, 3) (sim/studies/backfill.py).

    python bench/easy_backfill.py [--trace DIR] [--vc-scale S] [--seed N] [--limit N]
                                  [--variants strict,plain,easy]

Prints a line per replay and, last, one JSON line: per variant the head-of-queue wait (max,
p99, mean, over jobs that were ever first in their VC's queue after a pass), average JCT and
queueing, node and GPU utilisation, timeouts; ``easy_over_plain_head_max``,
``easy_over_plain_head_p99`` and the same of the time at the head (``..._at_head_max``,
``..._at_head_p99``; below 1: EASY bounds it better than plain backfill), ``seconds``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sim.studies.backfill import HELIOS_VC_SCALE, VARIANTS, BackfillStudy, run


def _fmt(value: float | None, spec: str = ".0f") -> str:
    return "-" if value is None else format(value, spec)


def show(variant: str, st: dict[str, Any]) -> None:
    print(f"{variant:>6}: head wait max {_fmt(st['head_wait_max_s'])} s, p99 "
          f"{_fmt(st['head_wait_p99_s'])} s, mean {_fmt(st['head_wait_avg_s'])} s over "
          f"{st['head_jobs']} head jobs ({st['head_never_started']} never started); at the "
          f"head max {_fmt(st['at_head_max_s'])} s, p99 {_fmt(st['at_head_p99_s'])} s; avg JCT "
          f"{_fmt(st['avg_jct_s'])} s, avg queueing {_fmt(st['avg_queue_s'])} s; node util "
          f"{_fmt(st['node_util_pct'], '.1f')} %, GPU active {_fmt(st['gpu_active_pct'], '.1f')}"
          f" %; finished {st['finished']}, timeout {st['timeout']}, unfinished "
          f"{st['unfinished']} ({st['wall_s']:.0f} s)", flush=True)


def main() -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default=str(Path(__file__).resolve().parents[2] / "shared"
                                               / "traces"))
    parser.add_argument("--vc-scale", type=float, default=HELIOS_VC_SCALE)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--limit", type=int, help="replay only the first N jobs")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    args = parser.parse_args()
    variants = tuple(v.strip() for v in args.variants.split(",") if v.strip())
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        parser.error(f"--variants: unknown {', '.join(unknown)}; known: {', '.join(VARIANTS)}")
    study = BackfillStudy(vc_scale=args.vc_scale, seed=args.seed, limit=args.limit,
                          variants=variants)
    out = run(study, Path(args.trace), progress=show)
    runs = out["runs"]
    summary: dict[str, Any] = {"setup": out["setup"], "seconds": out["seconds"]}
    for variant, st in runs.items():
        for key in ("head_wait_max_s", "head_wait_p99_s", "head_wait_avg_s", "at_head_max_s",
                    "at_head_p99_s", "at_head_avg_s", "head_jobs",
                    "head_never_started", "avg_jct_s", "avg_queue_s", "node_util_pct",
                    "gpu_active_pct", "timeout", "finished", "unfinished", "wall_s"):
            summary[f"{variant}_{key}"] = st[key]
    if "easy" in runs and "plain" in runs:
        for key, name in (("head_wait_max_s", "max"), ("head_wait_p99_s", "p99"),
                          ("at_head_max_s", "at_head_max"), ("at_head_p99_s", "at_head_p99")):
            easy, plain = runs["easy"][key], runs["plain"][key]
            summary[f"easy_over_plain_head_{name}"] = easy / plain if easy is not None \
                and plain else None
    return summary


if __name__ == "__main__":
    print(json.dumps(main()))
