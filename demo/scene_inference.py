"""SODA's hardware-aware inference placer in the demo (§V-D), through the placement RPC.

An inference service registers its offline profile (``bs_gpu``: the largest batch one GPU
serves within the QoS target; ``cpu_batch`` on ``cpu_cores`` cores) and reports its load; the
master runs its replicas as jobs: on CPU cores of GPU nodes while the load is below ``bs_gpu``,
on GPUs above it, one more replica when the load stays above 80 % of what they carry, one
fewer when it falls — and, when no GPU is free, it preempts the most recently submitted
training job. Each replica (demo/replica.py) listens on its port; the scene connects to one
after every change to check that the endpoint ``place`` names answers as that replica.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from demo.stage import REPLICA, SceneResult, SceneTimeout, Stage

SCENE = "inference"
SERVICE = "resnet-serve"
# A CPU replica's memory bandwidth, to scale with the emulated nodes (a 400 MiB/s peak, about
# a hundredth of a real server's): the master places CPU replicas only where the node's
# measured bandwidth leaves this much under the contention threshold, so not beside the
# memory-hungry ETL job.
REPLICA_MBW_GBPS = 0.02
BS_GPU, CPU_BATCH = 16, 6


def ready(place: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [e for e in place["endpoints"] if e["ready"] and e["kind"] == kind]


async def probe(endpoint: dict[str, Any]) -> str:
    """The greeting of the replica at the endpoint, or why there is none."""
    for _ in range(20):  # the process may be a moment from listening after it is running
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(endpoint["address"], endpoint["port"]), 2)
            try:
                line = await asyncio.wait_for(reader.readline(), 2)
            finally:
                writer.close()
            if line:
                return line.decode(errors="replace").strip()
        except (OSError, TimeoutError):
            pass
        await asyncio.sleep(0.1)
    return f"nothing answers at {endpoint['address']}:{endpoint['port']}"


class InferenceScene:
    def __init__(self, stage: Stage, port: int) -> None:
        self.stage = stage
        self.port = port
        self.steps: list[str] = []  # "CPU 1", "GPU 2", ... as the master reported them
        self.latencies: list[tuple[str, float]] = []  # step -> report_load to replicas ready
        self.victims: list[str] = []

    async def place(self) -> dict[str, Any]:
        return dict(await self.stage.client.call("place", {"service": SERVICE}))

    async def step(self, load: float, what: str, cpu: int, gpu: int,
                   timeout: float = 30) -> dict[str, Any]:
        """Report ``load`` and wait until exactly ``cpu`` CPU and ``gpu`` GPU replicas are
        ready and no other replica is left."""
        self.stage.say(SCENE, f"{SERVICE} reports load {load:g} (queries per batching window; "
                              f"bs_gpu {BS_GPU}, a CPU replica carries {CPU_BATCH}): {what}")
        started = time.monotonic()
        await self.stage.client.call("report_load", {"service": SERVICE, "load": load})

        async def settled() -> dict[str, Any] | None:
            place = await self.place()
            ok = (len(ready(place, "cpu")) == cpu and len(ready(place, "gpu")) == gpu
                  and len(place["endpoints"]) == cpu + gpu)
            return place if ok else None

        place = await self.stage.until(f"{cpu} CPU + {gpu} GPU replicas of {SERVICE}",
                                       settled, timeout)
        took = time.monotonic() - started
        label = " + ".join(f"{k} {n}" for k, n in (("CPU", cpu), ("GPU", gpu)) if n)
        self.steps.append(label)
        self.latencies.append((label, took))
        endpoint = place["endpoints"][-1]
        self.stage.say(SCENE, f"{label} ready {took:.1f} s after the report; "
                              f"{endpoint['address']}:{endpoint['port']} answers: "
                              f"{await probe(endpoint)}")
        return place

    async def play(self) -> SceneResult:
        title = "SODA inference placer"
        stage = self.stage
        reply = await stage.client.call("register_service", {
            "service": SERVICE, "user": stage.user, "command": ["python3", REPLICA],
            "bs_gpu": BS_GPU, "cpu_batch": CPU_BATCH, "cpu_cores": 1,
            "cpu_mbw_gbps": REPLICA_MBW_GBPS,
            "port": self.port,
        })
        stage.say(SCENE, f"registered {SERVICE}: starts in {reply['mode'].upper()} mode")
        try:
            await self.step(3, "one CPU replica is enough", cpu=1, gpu=0)
            await self.step(5.5, "above 80% of one CPU replica: a second one", cpu=2, gpu=0)
            await stage.wait_cue(SCENE, "large_busy", 60)
            await self.step(20, "above bs_gpu: switch to GPU replicas", cpu=0,
                            gpu=2)
            stage.cue("gpu_mode").set()
            await stage.wait_cue(SCENE, "gpus_full", 45)
            seen = len(stage.narrator.events)
            await self.step(34, "more than two GPUs carry, and no GPU is free", cpu=0, gpu=3)
            await stage.narrator.poll()
            self.victims = [stage.narrator.jobs.get(e["job"], {}).get("name", e["job"])
                            for e in stage.narrator.events[seen:]
                            if e["kind"] == "preempted"
                            and SERVICE in e["detail"].get("reason", "")]
            await self.step(14, "two GPUs carry it again: one replica retires", cpu=0, gpu=2)
            await self.step(4, "below 75% of bs_gpu: back to a CPU replica", cpu=1, gpu=0)
        except SceneTimeout as exc:
            stage.cue("gpu_mode").set()  # whoever waits for it should not wait for ever
            return SceneResult(title, " -> ".join(self.steps) or "nothing", str(exc),
                               ok=False)
        switch = next((t for label, t in self.latencies if label == "GPU 2"), None)
        return SceneResult(
            title, f"{' -> '.join(self.steps)}; the third GPU replica preempted "
                   f"{', '.join(self.victims) or 'no job'}",
            f"replicas ready after each load report in "
            f"{', '.join(f'{t:.1f}' for _, t in self.latencies)} s"
            + (f" (CPU->GPU switch {switch:.1f} s)" if switch is not None else ""),
        )
