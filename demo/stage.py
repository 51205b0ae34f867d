"""What every scene of the demo shares: the master, the timeline, the job user, the arrays'
sizes, and a way to wait for something the master reports.

A scene submits through :meth:`Stage.submit`, which tags the job with the scene so the
narrator can tell whose job is doing what, and ends with a :class:`SceneResult`: what it set out
to show, whether the master's reports showed it, and the measured figures. A scene that times
out waiting says so in its result; it does not stop the others.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from control.aclient import AsyncMasterClient
from demo.narrator import Narrator, Timeline

T = TypeVar("T")

# The emulated model every GPU job of the demo runs at (demo/trainer.py --emulate): GENIE's
# sPR(b) = K0 + K1 b + K2 b^2 samples/s per GPU at local batch b, and gamma, lambda of Eq. 8.
# The profiling scene must recover it from what the runs really did.
K0, K1, K2, GAMMA, LAMBDA = 100.0, 0.5, -0.002, 0.3, 0.2
TRUTH = (K0, K1, K2, GAMMA, LAMBDA)
EMULATE = ",".join(f"{x:g}" for x in TRUTH)
MODEL_TYPE = "demo-resnet"
# The demo's own job programs (standard library only: jobs cannot import Trellis).
DEMO_DIR = Path(__file__).resolve().parent
REPLICA = str(DEMO_DIR / "replica.py")
MEMBW_JOB = str(DEMO_DIR / "membw_job.py")


class SceneTimeout(Exception):
    """What a scene waited for did not happen in time; the message says what."""


@dataclass
class SceneResult:
    scene: str
    showed: str  # what the scene set out to show, as the master's reports bore it out
    figures: str  # the measured numbers
    ok: bool = True


@dataclass
class Stage:
    client: AsyncMasterClient
    timeline: Timeline
    narrator: Narrator
    user: str
    trainer: str  # demo/trainer.py
    root: Path  # the cluster's directory (node state directories are under it)
    sizes: dict[str, int]  # array kind -> size (gpus or cores), from the master's pools
    peak_mibps: float  # the nodes' configured peak memory bandwidth
    cues: dict[str, asyncio.Event] = field(default_factory=dict)
    large_nodes: set[str] = field(default_factory=set)  # where the large-job array's jobs ran

    def cue(self, name: str) -> asyncio.Event:
        """A rendezvous between scenes: one sets it, others wait for it."""
        return self.cues.setdefault(name, asyncio.Event())

    async def wait_cue(self, scene: str, name: str, timeout: float) -> None:
        """Wait for a cue; after ``timeout`` go on without it, and say so."""
        try:
            await asyncio.wait_for(self.cue(name).wait(), timeout)
        except TimeoutError:
            self.say(scene, f"(went on without {name.replace('_', ' ')} after {timeout:g} s)")

    def say(self, scene: str, text: str) -> None:
        self.timeline.say(scene, text)

    async def submit(self, scene: str, spec: dict[str, Any]) -> str:
        job = (await self.client.call("submit", {"job": {"user": self.user, **spec}}))["job"]
        self.narrator.cast[job["id"]] = scene
        return str(job["id"])

    async def job(self, job_id: str) -> dict[str, Any]:
        return dict(await self.client.call("job", {"id": job_id}))

    async def jobs(self) -> dict[str, dict[str, Any]]:
        return {j["id"]: j for j in (await self.client.call("jobs"))["jobs"]}

    async def until(self, what: str, check: Callable[[], Awaitable[T | None]],
                    timeout: float, period: float = 0.2) -> T:
        """Poll ``check`` until it returns something true; SceneTimeout after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while True:
            value = await check()
            if value:
                return value
            if time.monotonic() > deadline:
                raise SceneTimeout(f"timed out after {timeout:.0f} s waiting for {what}")
            await asyncio.sleep(period)

    async def states(self, ids: list[str], wanted: tuple[str, ...]) -> dict[str, Any] | None:
        """The jobs when every one of ``ids`` is in one of ``wanted`` states, else None."""
        jobs = await self.jobs()
        return jobs if all(jobs[i]["state"] in wanted for i in ids) else None

    def emulated(self, batch: int | str, iterations: int | str,
                 report_s: float = 0.2) -> list[str]:
        """The command of a training job that runs at the demo model's rate (``{batch}`` and
        ``{iterations}`` for a profiling campaign, which fills them in per run)."""
        return ["python3", self.trainer, "--emulate", EMULATE, "--batch", str(batch),
                "--iterations", str(iterations), "--report-s", f"{report_s:g}"]
