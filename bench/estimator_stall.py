"""Event-loop stall while QSSF's estimator retrains on 100,000 finished jobs.

    python bench/estimator_stall.py [--jobs 100000] [--queued 2000] [--seconds 5]

Builds a journal of ``--jobs`` finished jobs (names, users and durations of a few job
families) and ``--queued`` waiting ones, starts a real Master on it (policy qssf: the
estimator reads the history back, and trains once at start) with the daemon's garbage
collector policy (masterd.gcpause), then measures with a 1-ms ticker
(bench/worker_stall.py's) the loop alone for ``--seconds`` and the loop during one more
retrain: the worker reads the journal, fits LightGBM, writes the model file and predicts the
waiting jobs; the master loads the model in a thread and refreshes the estimates.

Target: longest stall during the retrain <= 20 ms. Last line: JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from worker_stall import TARGET_MS, Ticker, tick_for

from masterd.gcpause import GcPausePolicy
from masterd.journal.store import Store
from masterd.service.master import Master
from shared.config import EstimatorConfig, MasterConfig
from shared.model import Job, JobSpec, JobState

FAMILIES = (("eval", 120.0), ("train", 7200.0), ("sweep", 900.0), ("pretrain", 86400.0))


def build_journal(path: Path, jobs: int, queued: int, seed: int = 1) -> None:
    rng = random.Random(seed)
    store = Store(path)
    batch: list[tuple[int, Job]] = []
    t0 = 1.6e9
    for i in range(jobs + queued):
        family, base = FAMILIES[i % len(FAMILIES)]
        user = f"user{rng.randrange(200)}"
        spec = JobSpec(name=f"{family}-{user}-{rng.randrange(30)}", command=("true",),
                       user=user, tenant=f"vc{rng.randrange(12)}",
                       gpus=rng.choice((1, 1, 1, 2, 4, 8)), cpus=4)
        job = Job(id=f"j{i}", spec=spec, submit_time=t0 + 30 * i)
        if i < jobs:
            job.state = JobState.FINISHED
            job.start_time = job.submit_time + 10
            job.end_time = job.start_time + base * rng.lognormvariate(0, 0.5)
        batch.append((i + 1, job))
        if len(batch) == 5000:
            store.insert_jobs(batch)
            batch = []
    if batch:
        store.insert_jobs(batch)
    store.close()


async def run(args: argparse.Namespace) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="trellis-test-estimator-") as tmp:
        started = time.monotonic()
        build_journal(Path(tmp) / "master.db", args.jobs, args.queued)
        built = time.monotonic() - started
        config = MasterConfig(state_dir=tmp, policy="qssf", finished_jobs_in_memory=0,
                              estimator=EstimatorConfig(retrain_interval_s=0,
                                                        max_jobs=args.jobs,
                                                        history_jobs=args.jobs))
        master = Master(config)
        gc_policy: GcPausePolicy | None = None
        try:
            t = time.monotonic()
            master.restore()  # before serving: history read back (not on a serving loop)
            restore_s = time.monotonic() - t
            # As trellis-masterd does after its restore: long-lived objects frozen out of
            # full collections, so a collection does not walk the whole history.
            gc_policy = GcPausePolicy(config.gc_young_threshold, config.gc_refreeze_s)
            gc_policy.install()
            estimator = master.features.estimator
            deadline = time.monotonic() + 600
            while estimator.last_training is None and time.monotonic() < deadline:
                await asyncio.sleep(0.2)  # the start-up training
            startup = estimator.last_training
            while estimator._training and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
            baseline = await tick_for(args.seconds)
            ticker = Ticker([])
            ticks = asyncio.ensure_future(ticker.run())
            t = time.monotonic()
            result = await estimator.retrain()
            retrain_s = time.monotonic() - t
            ticker.running = False
            await ticks
            waiting = list(master.core.queue())
            with_ml = sum(1 for j in waiting if "duration_ml_s" in j.annotations)
        finally:
            if gc_policy is not None:
                gc_policy.uninstall()
            await master.close()
    longest, p99, n = ticker.summary()
    base_longest, base_p99, _ = baseline.summary()
    return {"jobs": args.jobs, "queued": args.queued, "journal_build_s": built,
            "restore_s": restore_s, "retrain_s": retrain_s, "training": result,
            "startup_training": startup,
            "queued_with_ml_estimate": with_ml, "ticks": n,
            "longest_stall_ms": longest, "p99_stall_ms": p99,
            "baseline_longest_stall_ms": base_longest, "baseline_p99_stall_ms": base_p99,
            "target_ms": TARGET_MS, "met": longest <= TARGET_MS,
            "loadavg": os.getloadavg()[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--queued", type=int, default=2000)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(run(args)), default=str))


if __name__ == "__main__":
    main()
