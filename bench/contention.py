"""Contention eliminator reaction time: node bandwidth crosses 75 % of peak -> MBA schemata write.

    python bench/contention.py [--trials 100] [--lanes 4] [--interval 1.0]

Each lane is what one node runs: an emulated resctrl tree ("full" profile: MBA and MBM), a real
CPU job (``sleep`` through the real JobRunner, shim and cgroups), and the real
ContentionEnforcer loop at the default 1 s interval. This process plays the memory controller:
every 20 ms it advances the job group's MBM counters at the current traffic rate. A trial runs
low traffic (30 % of peak) for a random 1.2-2.2 s, so the step lands at a random phase of the
loop, then steps to 95 % of peak and waits for the throttling write to the group's schemata
file (timed inside the KernelWriter, after the write returns). Traffic then stops and the loop
restores (restore_intervals=1 only to shorten the gap between trials).

Two reaction times per trial:
- ``reaction_ms`` from the moment the counters cross the threshold -- the first instant at
  which the bytes they counted over the trailing interval reach 75 % of peak x interval, the
  measure the eliminator judges by (an interval's average, so that shorter bursts do not
  count) -- to the write;
- ``from_step_ms`` from the traffic step itself; the crossing follows it by ~0.7 interval
  here (the trailing window must fill past 75 % going from 30 % to 95 %).
A pass measures since the previous pass, which scheduling jitter can make a little shorter
than an interval, so an occasional reaction is slightly negative.
Baselines measured in the same run: the loop interval, and the duration of one enforcer pass
(measure MBM, decide, apply) across all passes of the run. ``--onset-checks 1`` turns the
loop's between-pass node reads off, for comparison with passes alone.
Last line: JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import sys
import time
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from demo.cluster import default_job_user  # noqa: E402
from demo.harness import exit_on_signals, run, scratch_dir, shielded, sweep_node  # noqa: E402
from noded.cgroups import detect_cgroups  # noqa: E402
from noded.enforcer import ContentionEnforcer, RunningJob, running_jobs  # noqa: E402
from noded.gpu.base import GpuSample  # noqa: E402
from noded.gpu.emulated import EmulatedGpuBackend, EmulatedGpuConfig  # noqa: E402
from noded.jobs import JobRunner  # noqa: E402
from noded.policy.contention import Decision  # noqa: E402
from rdt import group_for_job  # noqa: E402
from rdt.emulated import advance_mbm, build_tree, open_resctrl  # noqa: E402
from shared.config import ContentionConfig  # noqa: E402
from shared.kernelfs import KernelWriter  # noqa: E402
from shared.messages import PrepareJob, StartJob  # noqa: E402
from shared.model import JobKind, JobSpec, NodeAllocation  # noqa: E402

PEAK_MIBPS = 10_000.0
PEAK_BPS = PEAK_MIBPS * (1 << 20)
LOW, HIGH = 0.30, 0.95
TICK_S = 0.02
NODE = "bench-node"


class TimingWriter(KernelWriter):
    """A KernelWriter that notes when each schemata write returned."""

    def __init__(self, roots: list[Path], on_schemata: Callable[[float, str], None]) -> None:
        super().__init__(roots)
        self.on_schemata = on_schemata

    def write(self, path: Path, value: str, *, what: str, compare: bool = True) -> bool:
        changed = super().write(path, value, what=what, compare=compare)
        if Path(path).name == "schemata":
            self.on_schemata(time.monotonic(), value)
        return changed


class TimedEnforcer(ContentionEnforcer):
    """The real enforcer; each pass is timed for the baseline."""

    pass_s: list[float]

    def step(self, now: float, jobs: list[RunningJob],
             samples: Sequence[GpuSample]) -> list[Decision]:
        start = time.perf_counter()
        try:
            return super().step(now, jobs, samples)
        finally:
            self.pass_s.append(time.perf_counter() - start)


@dataclass
class Lane:
    index: int
    root: Path
    runner: JobRunner
    job_id: str
    enforcer: TimedEnforcer | None = None
    rate: float = 0.0
    cum: float = 0.0
    history: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=4000))
    writes: list[tuple[float, str]] = field(default_factory=list)

    @property
    def group(self) -> str:
        return group_for_job(self.job_id)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    # nearest rank: the smallest value with at least q of the values at or below it
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def crossing(history: Sequence[tuple[float, float]], after: float, window: float,
             rate: float) -> float | None:
    """First recorded instant >= after when the trailing-window byte count reaches rate."""
    points = list(history)

    def at(t: float) -> float:
        prev = points[0]
        for p in points:
            if p[0] >= t:
                if p[0] == prev[0]:
                    return p[1]
                return prev[1] + (p[1] - prev[1]) * (t - prev[0]) / (p[0] - prev[0])
            prev = p
        return points[-1][1]

    for t, c in points:
        if t >= after and (c - at(t - window)) / window >= rate:
            return t
    return None


async def traffic(lane: Lane) -> None:
    loop = asyncio.get_running_loop()
    last = loop.time()
    while True:
        await asyncio.sleep(TICK_S)
        now = loop.time()
        nbytes = lane.rate * (now - last)
        last = now
        half = int(nbytes / 2)
        if half and (lane.root / lane.group).is_dir():
            advance_mbm(lane.root, lane.group, 0, half)
            advance_mbm(lane.root, lane.group, 1, half)
            lane.cum += 2 * half
        lane.history.append((now, lane.cum))


async def wait_until(predicate: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.005)
    return True


def throttled_at(lane: Lane, since: float) -> float | None:
    for t, value in lane.writes:
        if t >= since and "MB:" in value and "=100" not in value:
            return t
    return None


async def run_lane(lane: Lane, trials: int, interval: float, out: list[dict[str, float]],
                   rng: random.Random, trace: bool) -> None:
    assert lane.enforcer is not None
    ok = await wait_until(lambda: (lane.root / lane.group).is_dir(), 10)
    if not ok:
        raise RuntimeError(f"lane {lane.index}: the job's resctrl group never appeared")
    for _ in range(trials):
        lane.rate = LOW * PEAK_BPS
        await asyncio.sleep(interval * rng.uniform(1.2, 2.2))
        t_step = time.monotonic()
        lane.rate = HIGH * PEAK_BPS
        if not await wait_until(lambda t=t_step: throttled_at(lane, t) is not None,
                                interval * 5):
            raise RuntimeError(f"lane {lane.index}: no throttle within {interval * 5:.1f} s")
        t_write = throttled_at(lane, t_step)
        assert t_write is not None
        # Keep the high traffic until the trailing window has filled, to find that instant.
        await asyncio.sleep(max(0.0, t_step + interval * 1.2 - time.monotonic()))
        t_cross = crossing(lane.history, t_step, interval, 0.75 * PEAK_BPS)
        if t_cross is None:
            raise RuntimeError(f"lane {lane.index}: the counters never crossed the threshold")
        out.append({"reaction_s": t_write - t_cross, "from_step_s": t_write - t_step})
        if trace:
            print(f"lane={lane.index} crossing_after_step_ms={(t_cross - t_step) * 1000:.0f} "
                  f"write_after_step_ms={(t_write - t_step) * 1000:.0f}", file=sys.stderr)
        lane.rate = 0.0
        controller = lane.enforcer.controller
        if not await wait_until(lambda c=controller: not c.throttled(), interval * 10):
            raise RuntimeError(f"lane {lane.index}: the throttle was never restored")
        lane.writes.clear()


async def stop_lanes(stop: asyncio.Event, tasks: list[asyncio.Task[None]], runner: JobRunner,
                     lanes: list[Lane]) -> None:
    """End the loops, then each lane's job through its shim, as a node stops a job."""
    stop.set()
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
    for lane in lanes:
        part = runner.parts.get(lane.job_id)
        if part is not None and part.state == "running":
            runner.stop(lane.job_id, 2.0, "bench over")
            with contextlib.suppress(Exception):
                await asyncio.wait_for(part.watcher, 10)  # type: ignore[arg-type]
    await runner.shutdown()


async def bench(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    rng = random.Random(args.seed)
    tag = uuid.uuid4().hex[:6]
    parent = f"trellis-test-bench-{tag}"
    state = work / "state"
    state.mkdir(parents=True)
    cgroups = detect_cgroups(parent, state_dir=state / "cgroups")
    gpus = EmulatedGpuBackend(EmulatedGpuConfig(count=0, uuid_seed=NODE))
    runner = JobRunner(NODE, state, cgroups, gpus)
    config = ContentionConfig(interval_s=args.interval, restore_intervals=1,
                              onset_checks=args.onset_checks, peak_bandwidth_mbps=PEAK_MIBPS)
    cpus = tuple(sorted(os.sched_getaffinity(0)))
    lanes: list[Lane] = []
    stop = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []
    pass_s: list[float] = []
    results: list[dict[str, float]] = []
    loop = asyncio.get_running_loop()
    try:
        for i in range(args.lanes):
            job_id = f"bench-{tag}-{i}"
            spec = JobSpec(name="hog", command=("sleep", "3600"), user=default_job_user(),
                           kind=JobKind.CPU, cpus=1)
            runner.prepare(PrepareJob(job_id=job_id, spec=spec, allocation=NodeAllocation(
                node=NODE, cpus=(cpus[i % len(cpus)],))))
            runner.start(StartJob(job_id=job_id, master_addr="127.0.0.1", master_port=1))
            root = work / f"resctrl-{i}"
            build_tree(root, "full")
            lane = Lane(i, root, runner, job_id)
            writer = TimingWriter([root], lambda t, v, lane=lane: lane.writes.append((t, v)))
            rc = open_resctrl(root, writer)
            # Each lane sees only its own job, as each node daemon does.
            enforcer = TimedEnforcer(
                config, cgroups, rc,
                lambda job_id=job_id: [j for j in running_jobs(runner) if j.job_id == job_id],
                lambda: [])
            enforcer.pass_s = pass_s
            lane.enforcer = enforcer
            lanes.append(lane)
            tasks.append(loop.create_task(traffic(lane)))
            tasks.append(loop.create_task(enforcer.run(stop)))
            # Start the lanes' loops at different phases, as independent nodes would be.
            await asyncio.sleep(args.interval * rng.random())
        per_lane = [args.trials // args.lanes + (1 if i < args.trials % args.lanes else 0)
                    for i in range(args.lanes)]
        await asyncio.gather(*(run_lane(lane, n, args.interval, results, rng, args.trace)
                               for lane, n in zip(lanes, per_lane, strict=True)))
    finally:
        with shielded():
            await stop_lanes(stop, tasks, runner, lanes)
            sweep_node(parent, state)  # what a lane could not stop gracefully
            gpus.close()
    reaction = [r["reaction_s"] * 1000 for r in results]
    step = [r["from_step_s"] * 1000 for r in results]
    passes = [p * 1000 for p in pass_s]
    p99 = percentile(reaction, 0.99)
    return {
        "reaction_ms_p50": round(percentile(reaction, 0.50), 1),
        "reaction_ms_p99": round(p99, 1),
        "reaction_ms_min": round(min(reaction), 1),
        "reaction_ms_max": round(max(reaction), 1),
        "from_step_ms_p50": round(percentile(step, 0.50), 1),
        "from_step_ms_p99": round(percentile(step, 0.99), 1),
        "interval_ms": round(args.interval * 1000, 1),
        "pass_ms_p50": round(percentile(passes, 0.50), 3),
        "pass_ms_p99": round(percentile(passes, 0.99), 3),
        "reaction_p99_over_interval": round(p99 / (args.interval * 1000), 3),
        "target_p99_ms": 1000,
        "target_met": p99 <= 1000,
        "trials": len(results),
        "lanes": args.lanes,
        "onset_checks": args.onset_checks,
        "passes": len(passes),
        "cgroups": cgroups.kind,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--trials", type=int, default=100)
    p.add_argument("--lanes", type=int, default=4, help="independent node loops in parallel")
    p.add_argument("--interval", type=float, default=ContentionConfig().interval_s)
    p.add_argument("--onset-checks", type=int, default=ContentionConfig().onset_checks)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--trace", action="store_true", help="print each trial on stderr")
    args = p.parse_args()
    if args.trials < 1 or args.lanes < 1 or args.interval <= 0:
        p.error("--trials and --lanes must be positive, --interval above zero")
    with exit_on_signals(), scratch_dir("trellis-test-bench-") as work:
        result = run(bench(args, work))
    print(f"{result['trials']} trials over {result['lanes']} lanes, "
          f"{result['passes']} enforcer passes", file=sys.stderr)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
