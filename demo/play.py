"""The demo's choreography: which scenes run together, in what order, and the summary table.

Four threads of action share the cluster, cued by what the master reports:

* GENIE: a profiling campaign, then the SWAF queue in the large-job array (cue ``large_busy``
  once the queue's first job holds the array).
* Inference: CPU replicas at low load; on ``large_busy`` the load rises past ``bs_gpu`` and
  the service moves to GPUs (cue ``gpu_mode``); on ``gpus_full`` it surges, so its third GPU
  replica must preempt a training job; then it cools down back to a CPU replica.
* Arrays: on ``large_busy`` and ``gpu_mode``, training jobs fill the small-job array until
  every GPU is allocated (cue ``gpus_full``), then ETL jobs start in the CPU-job array.
* Contention: from the start, a memory-hungry CPU job is throttled and later restored.
"""

from __future__ import annotations

import asyncio
import textwrap
from collections.abc import Awaitable, Callable
from typing import Any

from control.client import RpcError, Unreachable
from demo.scene_arrays import cpu_array
from demo.scene_contention import contention
from demo.scene_genie import profile, swaf
from demo.scene_inference import InferenceScene
from demo.stage import SceneResult, SceneTimeout, Stage

ORDER = ("GENIE profiling", "SWAF QoS ordering", "SODA CPU-job array", "SODA inference placer",
         "SODA contention eliminator")


async def play(stage: Stage, service_port: int, timeout: float) -> list[SceneResult]:
    """Run every scene; a scene that fails or runs out of time says so in its result."""
    results: dict[str, SceneResult] = {}

    async def guarded(title: str, scene: Callable[[], Awaitable[SceneResult]]) -> None:
        try:
            result = await scene()
        except (RpcError, Unreachable, OSError) as exc:
            result = SceneResult(title, "not shown", f"stopped by an error: {exc}", ok=False)
        results[result.scene] = result

    async def genie_then_swaf() -> None:
        await guarded(ORDER[0], lambda: profile(stage))
        await guarded(ORDER[1], lambda: swaf(stage))

    inference = InferenceScene(stage, service_port)
    tasks = [
        asyncio.create_task(genie_then_swaf()),
        asyncio.create_task(guarded(ORDER[2], lambda: cpu_array(stage))),
        asyncio.create_task(guarded(ORDER[3], inference.play)),
        asyncio.create_task(guarded(ORDER[4], lambda: contention(stage))),
    ]
    done, pending = await asyncio.wait(tasks, timeout=timeout)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    for task in done:
        task.result()  # a bug in a scene is not a result: let it show
    await settle(stage, 30)
    return [results.get(t) or SceneResult(t, "not shown", f"still running after the demo's "
                                          f"{timeout:g} s limit", ok=False) for t in ORDER]


async def settle(stage: Stage, timeout: float) -> None:
    """Let the scenes' remaining jobs (the service's replica aside) finish, so the timeline
    tells how everything ended."""
    async def quiet() -> bool:
        jobs = await stage.jobs()
        return not [j for i, j in jobs.items() if i in stage.narrator.cast
                    and j["state"] in ("queued", "starting", "running")]

    try:
        await stage.until("the last jobs", quiet, timeout, period=0.5)
    except SceneTimeout:
        jobs = await stage.jobs()
        left = [j["name"] for i, j in jobs.items() if i in stage.narrator.cast
                and j["state"] in ("queued", "starting", "running")]
        stage.say("-", f"still running after {timeout:g} s: {', '.join(left)}")


def summary_table(results: list[SceneResult], width: int = 100) -> str:
    """Scene, whether the master's reports showed it, what they showed and the figures."""
    left = 28
    body = width - left - 8
    rows = [f"{'SCENE':<{left}}{'SHOWN':<8}WHAT THE MASTER REPORTED / MEASURED",
            "-" * width]
    for r in results:
        text = textwrap.wrap(r.showed, body) + textwrap.wrap(r.figures, body)
        for i, line in enumerate(text or [""]):
            head = f"{r.scene:<{left}}{'yes' if r.ok else 'NO':<8}" if i == 0 else " " * (
                left + 8)
            rows.append(head + line)
    return "\n".join(rows)


def record(results: list[SceneResult], stage: Stage, extra: dict[str, Any]) -> dict[str, Any]:
    """Everything the demo saw, for --record (JSON)."""
    return {
        **extra,
        "results": [r.__dict__ for r in results],
        "timeline": [{"t": t, "scene": s, "text": x} for t, s, x in stage.timeline.lines],
        "events": stage.narrator.events,
        "services": stage.narrator.service_log,
        "profiles": list(stage.narrator.profiles.values()),
    }
