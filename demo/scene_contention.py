"""SODA's contention eliminator in the demo (§V-E): a memory-hungry CPU job is throttled.

The job (demo/membw_job.py) really copies memory at 95 % of its node's configured peak
bandwidth for a while, then idles. The node daemon's contention loop reads the job's MBM
counters each interval, finds the node at or above 75 % of its peak and steps the job's MBA
level down until the node is below it; once the job idles it steps the level back up. This
machine has no RDT: demo/memctl.py plays the memory controller between the two (it counts the
job's real traffic into the emulated counters and holds the job to its MBA level).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import threading
from typing import Any

from demo.memctl import MemoryController, Reading, rate_mibps
from demo.stage import MEMBW_JOB, SceneResult, SceneTimeout, Stage

SCENE = "contention"
BUSY_S, IDLE_S = 8.0, 7.0
SHARE = 0.95  # of the node's peak the job draws unthrottled


async def contention(stage: Stage) -> SceneResult:
    title = "SODA contention eliminator"
    shared = stage.root / "memctl"
    shared.mkdir(exist_ok=True)
    os.chmod(shared, 0o777)  # the job runs as another user (nobody, as root)
    counter, allowance = shared / "etl-stream.bytes", shared / "etl-stream.allow"
    mibps = SHARE * stage.peak_mibps
    stage.say(SCENE, f"etl-stream: a CPU job that copies memory at {mibps:.0f} MiB/s "
                     f"({SHARE:.0%} of its node's {stage.peak_mibps:.0f} MiB/s peak) for "
                     f"{BUSY_S:g} s, then idles {IDLE_S:g} s")
    job_id = await stage.submit(SCENE, {
        "name": "etl-stream", "kind": "cpu", "gpus": 0, "cpus": 1, "tenant": "etl",
        "command": ["python3", MEMBW_JOB, "--mibps", f"{mibps:.0f}", "--busy-s", f"{BUSY_S:g}",
                    "--idle-s", f"{IDLE_S:g}", "--counter", str(counter),
                    "--allowance", str(allowance)]})
    try:
        jobs = await stage.until("etl-stream to run",
                                 lambda: stage.states([job_id], ("running",)), 60)
    except SceneTimeout as exc:
        return SceneResult(title, "not shown", str(exc), ok=False)
    node = jobs[job_id]["nodes"][0]
    ctl = MemoryController(stage.root / node / "resctrl", job_id, counter, allowance,
                           stage.peak_mibps)
    done = threading.Event()
    counting = asyncio.create_task(asyncio.to_thread(ctl.run, done))
    try:
        await stage.until("etl-stream to end",
                          lambda: stage.states([job_id], ("finished", "failed", "cancelled")),
                          60 + BUSY_S + IDLE_S)
    except SceneTimeout as exc:
        return SceneResult(title, "not shown", str(exc), ok=False)
    finally:
        done.set()
        await counting
    await stage.narrator.poll()
    events = [e for e in stage.narrator.events
              if e["kind"] == "contention" and e["job"] == job_id]
    return _result(title, stage, events, ctl.readings, jobs[job_id]["start_time"])


def _pressure(reason: str) -> str:
    """``pressure=0.95>=0.75`` out of a contention event's reason, as ``95%``."""
    for word in reason.split():
        if word.startswith("pressure="):
            digits = word[len("pressure="):].split(">")[0].split("<")[0]
            try:
                return f"{float(digits):.0%}"
            except ValueError:
                return digits
    return "?"


def _result(title: str, stage: Stage, events: list[dict[str, Any]],
            readings: list[Reading], started: float) -> SceneResult:
    throttles = [e for e in events if e["detail"]["action"] in ("mba", "cores")]
    last = events[-1]["detail"]
    restored = last["action"].startswith("restore") and last["value"] == 100
    if not throttles:
        drawn = rate_mibps(readings)
        return SceneResult(title, "no throttle", f"{len(readings)} counter readings, the job "
                           f"drew {drawn or 0:.0f} MiB/s on average", ok=False)
    levels = [events[0]["detail"]["previous"], *(e["detail"]["value"] for e in events)]
    peak = stage.peak_mibps
    # What the job drew over its last two busy seconds, and the level it was held at then.
    busy = [r for prev, r in itertools.pairwise(readings) if r.moved > prev.moved]
    held = busy[-1].mba if busy else None
    tail = [r for r in busy if r.t >= busy[-1].t - 2.0 and r.mba == held] if busy else []
    drawn = rate_mibps(tail)
    first = throttles[0]["time"] - started
    figures = (f"MBA levels {' -> '.join(map(str, levels))}%; first throttle {first:.1f} s "
               f"after the job started, the node at "
               f"{_pressure(throttles[0]['detail']['reason'])} of its peak bandwidth")
    if drawn is not None:
        figures += f"; held at MBA {held}%, the job drew {drawn / peak:.0%} of the peak"
    showed = "the node's contention loop throttled the memory-hungry CPU job with MBA"
    if restored:
        showed += " and restored it fully once it went quiet"
    return SceneResult(title, showed, figures)
