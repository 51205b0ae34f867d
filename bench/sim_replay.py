"""Replay all of Philly through the scheduling core under FIFO and SWAF; time each replay.

    /work/venv/bin/python bench/sim_replay.py [--trace DIR] [--limit N] [--policies fifo,swaf]
        [--progress]

Prints one line per replay and, last, one JSON line: jobs, seconds_fifo, seconds_swaf (null
when "swaf" is not in the policy registry yet), events_per_s (all replays together). Each
replay line also gives the share of its wall time spent inside ``SchedulingCore.schedule``
(the core and the policy) against the simulator's own work, measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

# Run from a checkout without installing: the simulator and the core of *this* tree.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from masterd.core.policies import REGISTRY, make_policy
from sim.engine import SimConfig, Simulator
from sim.metrics import summarise
from sim.progress import ProgressBar
from sim.truth import TruthModel
from sim.workloads import philly
from sim.workloads.base import LoadOptions


def timed_replay(workload, name: str, seed: int, progress: bool) -> dict:
    config = SimConfig(seed=seed)
    bar = ProgressBar(f"philly {name}") if progress else None
    sim = Simulator(workload, make_policy(name), config, bar)
    inner = sim.core.schedule
    spent = [0.0]

    def schedule(now: float):  # instrumentation only: same call, timed
        t0 = time.perf_counter()
        try:
            return inner(now)
        finally:
            spent[0] += time.perf_counter() - t0

    sim.core.schedule = schedule  # type: ignore[method-assign]
    t0 = time.perf_counter()
    result = sim.run()
    seconds = time.perf_counter() - t0
    if bar is not None:
        bar.close(result.end_time, len(result.records), len(result.records))
    summary = summarise(result)
    return {
        "policy": name,
        "seconds": seconds,
        "core_seconds": spent[0],
        "core_share": spent[0] / seconds if seconds else None,
        "events": result.events,
        "passes": result.passes,
        "finished": summary["finished"],
        "avg_jct_s": summary["avg_jct_s"],
        "avg_queue_s": summary["avg_queue_s"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trace", default=str(Path(__file__).resolve().parents[2]
                                               / "shared" / "traces"))
    parser.add_argument("--limit", type=int)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--policies", default="fifo,swaf")
    parser.add_argument("--progress", action="store_true")
    args = parser.parse_args(argv)

    t0 = time.perf_counter()
    workload = philly.load(Path(args.trace), LoadOptions(seed=args.seed, limit=args.limit),
                           TruthModel(seed=args.seed))
    load_s = time.perf_counter() - t0
    print(f"loaded {len(workload.jobs)} jobs on {len(workload.nodes)} nodes in {load_s:.1f} s",
          file=sys.stderr)
    seconds: dict[str, float | None] = {}
    events = 0
    wall = 0.0
    for name in [p.strip() for p in args.policies.split(",") if p.strip()]:
        if name not in REGISTRY:
            print(f"policy {name!r} is not registered (have: {', '.join(sorted(REGISTRY))}); "
                  "not timed", file=sys.stderr)
            seconds[name] = None
            continue
        row = timed_replay(workload, name, args.seed, args.progress)
        print(json.dumps(row))
        seconds[name] = row["seconds"]
        events += row["events"]
        wall += row["seconds"]
    print(json.dumps({
        "jobs": len(workload.jobs),
        "load_seconds": load_s,
        "seconds_fifo": seconds.get("fifo"),
        "seconds_swaf": seconds.get("swaf"),
        "events_per_s": events / wall if wall else None,
        # Ratio against the FIFO baseline replayed in this same process.
        "swaf_over_fifo": (seconds["swaf"] / seconds["fifo"]
                           if seconds.get("swaf") and seconds.get("fifo") else None),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
