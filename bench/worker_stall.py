"""Event-loop stall while a CPU-heavy training runs in masterd.runtime.workers' pool.

    python bench/worker_stall.py [--seconds 30] [--baseline-seconds S] [--rows 20000]
                                 [--features 200]

A 1-ms ticker on the event loop records how late each wake-up is (the stall: time asleep
minus the 1 ms asked for). Three phases in one run: the ticker alone for
``--baseline-seconds`` (default: ``--seconds``), the ticker while the pool starts its worker,
and the ticker while the worker trains for ``--seconds``. The training is a ridge regression
on a random ``rows x features`` matrix, refitted round after round on bootstrap resamples of
the rows (gradient descent, then the closed-form solution to check it), the way a retrainer
refits on windows of the journal's history; numpy's BLAS may use every core.

Target: longest stall <= 20 ms while the 30-s training runs. Last line: JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from masterd.runtime.workers import WorkerPool

TICK_S = 0.001
TARGET_MS = 20.0


def train_regression(seconds: float, rows: int, features: int, seed: int) -> dict[str, float]:
    """Refit a ridge regression on bootstrap resamples until ``seconds`` have passed."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, features))
    true_w = rng.standard_normal(features)
    y = x @ true_w + 0.1 * rng.standard_normal(rows)
    alpha = 1e-3
    started = time.perf_counter()
    rounds = steps = 0
    w = np.zeros(features)
    gap = 0.0
    while time.perf_counter() - started < seconds:
        sample = rng.integers(0, rows, rows)
        xs, ys = x[sample], y[sample]
        w = np.zeros(features)
        for _ in range(50):
            grad = xs.T @ (xs @ w - ys) / rows + alpha * w
            w -= 0.5 * grad
            steps += 1
        exact = np.linalg.solve(xs.T @ xs / rows + alpha * np.eye(features), xs.T @ ys / rows)
        gap = float(np.max(np.abs(w - exact)))
        rounds += 1
    return {"rounds": rounds, "steps": steps, "gd_vs_exact_max_abs": gap,
            "weight_error_max_abs": float(np.max(np.abs(w - true_w))),
            "seconds": time.perf_counter() - started}


@dataclass
class Ticker:
    """Records, for each 1-ms sleep, how much later than asked the loop woke up."""

    stalls: list[float]
    running: bool = True

    async def run(self) -> None:
        while self.running:
            before = time.perf_counter()
            await asyncio.sleep(TICK_S)
            self.stalls.append(max(0.0, time.perf_counter() - before - TICK_S))

    def summary(self) -> tuple[float, float, int]:
        """Longest and p99 stall in ms, and the number of ticks."""
        if not self.stalls:
            return 0.0, 0.0, 0
        ms = np.array(self.stalls) * 1000.0
        return float(ms.max()), float(np.percentile(ms, 99)), len(ms)


async def tick_for(seconds: float) -> Ticker:
    ticker = Ticker([])
    task = asyncio.ensure_future(ticker.run())
    await asyncio.sleep(seconds)
    ticker.running = False
    await task
    return ticker


async def main(args: argparse.Namespace) -> dict[str, object]:
    # The machine may be shared: its load says how much of a stall others may have caused.
    load_before = round(os.getloadavg()[0], 2)
    baseline = await tick_for(args.baseline_seconds)
    baseline_longest, baseline_p99, baseline_ticks = baseline.summary()
    print(f"baseline: longest {baseline_longest:.2f} ms, p99 {baseline_p99:.3f} ms over "
          f"{baseline_ticks} ticks", flush=True)

    async with WorkerPool(processes=1, max_queued=0) as pool:
        starting = Ticker([])
        # The pool above is already started; a second one measures what starting costs.
        start_ticks = asyncio.ensure_future(starting.run())
        async with WorkerPool(processes=1, max_queued=0, name="trellis-bench-start"):
            pass
        starting.running = False
        await start_ticks
        start_longest, _, _ = starting.summary()

        training = Ticker([])
        ticks = asyncio.ensure_future(training.run())
        began = time.perf_counter()
        result = await pool.run(train_regression, args.seconds, args.rows, args.features, 1,
                                name="bench-ridge-training")
        train_seconds = time.perf_counter() - began
        training.running = False
        await ticks
    longest, p99, count = training.summary()
    print(f"training: {result['rounds']:.0f} rounds, {result['steps']:.0f} steps in "
          f"{train_seconds:.1f} s; loop longest stall {longest:.2f} ms, p99 {p99:.3f} ms over "
          f"{count} ticks", flush=True)
    return {
        "longest_stall_ms": round(longest, 3),
        "p99_stall_ms": round(p99, 3),
        "baseline_longest_stall_ms": round(baseline_longest, 3),
        "baseline_p99_stall_ms": round(baseline_p99, 3),
        "pool_start_stop_longest_stall_ms": round(start_longest, 3),
        "train_seconds": round(train_seconds, 2),
        "ticks": count,
        "baseline_ticks": baseline_ticks,
        "training": {k: round(v, 6) for k, v in result.items()},
        "rows": args.rows,
        "features": args.features,
        "cpus": os.cpu_count(),
        "loadavg_1m_before": load_before,
        "loadavg_1m_after": round(os.getloadavg()[0], 2),
        "target_ms": TARGET_MS,
        "target_met": longest <= TARGET_MS,
    }


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="training duration")
    parser.add_argument("--baseline-seconds", type=float, default=None,
                        help="ticker-only duration (default: --seconds)")
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--features", type=int, default=200)
    args = parser.parse_args()
    if args.baseline_seconds is None:
        args.baseline_seconds = args.seconds
    return args


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(parse_args()))))
