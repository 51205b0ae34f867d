"""The contention loop against an emulated resctrl tree, with a real job process.

The job runs through the real JobRunner and shim (real cgroups as root, CPU affinity
otherwise); the test plays the memory controller by advancing the emulated MBM counters of the
job's resctrl group at a chosen rate, and watches what the loop writes to the kernel.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import json
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from noded.cgroups import detect_cgroups
from noded.enforcer import ContentionEnforcer, running_jobs
from noded.gpu.emulated import EmulatedGpuBackend, EmulatedGpuConfig
from noded.jobs import JobRunner
from rdt import group_for_job
from rdt.emulated import advance_mbm, build_tree, open_resctrl
from shared.config import ContentionConfig
from shared.messages import Contention, PrepareJob, StartJob
from shared.model import JobKind, JobSpec, NodeAllocation
from shared.schema import decode
from tests.conftest import needs_root

NODE = "trellis-test-node"
PEAK_MIBPS = 1000.0
PEAK_BPS = PEAK_MIBPS * (1 << 20)
# A job with a few threads and a child process: all of them must land in the group.
JOB_SCRIPT = (
    "import threading, time, subprocess\n"
    "p = subprocess.Popen(['sleep', '60'])\n"
    "for _ in range(3): threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
    "time.sleep(60)\n"
)


def job_user() -> str:
    return "nobody" if os.geteuid() == 0 else getpass.getuser()


@dataclass
class Rig:
    root: Path
    runner: JobRunner
    enforcer: ContentionEnforcer
    job_id: str
    events: list[Contention] = field(default_factory=list)

    @property
    def group(self) -> str:
        return group_for_job(self.job_id)

    def schemata(self) -> str:
        return (self.root / self.group / "schemata").read_text()

    def child_pid(self) -> int:
        return int(json.loads((self.runner.dir / self.job_id / "child.json").read_text())["pid"])


async def wait_for(predicate: Any, timeout: float = 8.0, what: str = "") -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def traffic(root: Path, group: str, rate: dict[str, float]) -> None:
    """Advance the group's counters at rate['bps'] (split over both L3 domains), forever."""
    loop = asyncio.get_running_loop()
    last = loop.time()
    while True:
        await asyncio.sleep(0.02)
        now = loop.time()
        nbytes = int(rate["bps"] * (now - last) / 2)
        last = now
        if nbytes and (root / group).is_dir():
            for domain in (0, 1):
                advance_mbm(root, group, domain, nbytes)


@contextlib.asynccontextmanager
async def rig(tmp_path: Path, unique_name: str, profile: str) -> AsyncIterator[Rig]:
    root = tmp_path / "resctrl"
    build_tree(root, profile)
    state = tmp_path / "state"
    state.mkdir()
    os.chmod(tmp_path, 0o755)
    cgroups = detect_cgroups(unique_name, state_dir=state / "cgroups")
    gpus = EmulatedGpuBackend(EmulatedGpuConfig(count=0, uuid_seed=NODE))
    runner = JobRunner(NODE, state, cgroups, gpus)
    job_id = f"test-{unique_name.rsplit('-', 1)[1]}"
    cpus = tuple(sorted(os.sched_getaffinity(0)))[:2]
    spec = JobSpec(name="hog", command=("python3", "-c", JOB_SCRIPT), user=job_user(),
                   kind=JobKind.CPU, cpus=len(cpus))
    config = ContentionConfig(interval_s=0.1, restore_intervals=2,
                              peak_bandwidth_mbps=PEAK_MIBPS)
    events: list[Contention] = []

    async def send(type_: str, body: dict[str, Any]) -> None:
        assert type_ == "contention"
        events.append(decode(Contention, body))

    enforcer = ContentionEnforcer(config, cgroups, open_resctrl(root),
                                  lambda: running_jobs(runner), lambda: [], send)
    stop = asyncio.Event()
    loop_task = asyncio.get_running_loop().create_task(enforcer.run(stop))
    try:
        runner.prepare(PrepareJob(job_id=job_id, spec=spec,
                                  allocation=NodeAllocation(node=NODE, cpus=cpus)))
        runner.start(StartJob(job_id=job_id, master_addr="127.0.0.1", master_port=1))
        yield Rig(root, runner, enforcer, job_id, events)
    finally:
        stop.set()
        await loop_task
        part = runner.parts.get(job_id)
        if part is not None and part.state == "running":
            runner.stop(job_id, 0.0, "test over")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(part.watcher, 10)  # type: ignore[arg-type]
        await runner.shutdown()
        with contextlib.suppress(Exception):
            cgroups.remove(job_id)
        with contextlib.suppress(Exception):
            cgroups.remove_parent()
        gpus.close()


def cpus_allowed(pid: int) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return line.split(":", 1)[1].strip()
    raise AssertionError("no Cpus_allowed_list")


async def test_mba_throttles_and_restores_a_cpu_job(tmp_path: Path, unique_name: str) -> None:
    async with rig(tmp_path, unique_name, "full") as r:
        await wait_for(lambda: (r.root / r.group).is_dir() and r.runner.parts[r.job_id]
                       .state == "running", what="the job's resctrl group")
        # Every thread of the job's processes (shim, python with 3 threads, sleep) joins it.
        def assigned() -> bool:
            tasks = {int(t) for t in (r.root / r.group / "tasks").read_text().split()}
            pids = r.runner.cgroups.pids(r.job_id)
            tids = {int(t) for p in pids for t in os.listdir(f"/proc/{p}/task")}
            return len(pids) >= 3 and tids <= tasks and len(tids) >= 6
        await wait_for(assigned, what="the job's threads in its group")
        assert "MB:0=100;1=100" in r.schemata()

        rate = {"bps": 0.5 * PEAK_BPS}  # under the 75 % threshold: nothing happens
        gen = asyncio.get_running_loop().create_task(traffic(r.root, r.group, rate))
        try:
            await asyncio.sleep(0.6)
            assert "MB:0=100;1=100" in r.schemata() and r.events == []
            rate["bps"] = 0.9 * PEAK_BPS
            await wait_for(lambda: "MB:0=80;1=80" in r.schemata(), what="MB 80")
            rate["bps"] = 0.05 * PEAK_BPS  # the throttle worked; pressure falls away
            await wait_for(lambda: "MB:0=100;1=100" in r.schemata(), what="MB back to 100")
        finally:
            gen.cancel()
        throttles = [e for e in r.events if e.action == "mba"]
        restores = [e for e in r.events if e.action == "restore_mba"]
        assert throttles and throttles[0].job_id == r.job_id
        assert (throttles[0].value, throttles[0].previous) == (80, 100)
        pressure = float(throttles[0].reason.split("pressure=")[1].split(">=")[0])
        assert pressure >= 0.75 and "peak_mibps=1000" in throttles[0].reason
        assert restores[-1].value == 100
        assert r.enforcer.controller.throttled() == {}

        # The job ends: its group goes with it.
        r.runner.stop(r.job_id, 0.0, "done")
        await wait_for(lambda: not (r.root / r.group).exists(), what="group removal")


@needs_root
async def test_without_mba_cores_are_halved_and_restored(tmp_path: Path,
                                                          unique_name: str) -> None:
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two cores to halve")
    async with rig(tmp_path, unique_name, "no_mb") as r:
        assert r.runner.cgroups.kind in ("v1", "v2")
        await wait_for(lambda: (r.root / r.group).is_dir() and (
            r.runner.dir / r.job_id / "child.json").exists(), what="group and job")
        child = r.child_pid()
        cpus = sorted(os.sched_getaffinity(0))[:2]
        full = f"{cpus[0]}-{cpus[1]}" if cpus[1] == cpus[0] + 1 else f"{cpus[0]},{cpus[1]}"
        assert cpus_allowed(child) == full
        assert "MB" not in r.schemata()
        rate = {"bps": 0.95 * PEAK_BPS}
        gen = asyncio.get_running_loop().create_task(traffic(r.root, r.group, rate))
        try:
            await wait_for(lambda: cpus_allowed(child) == str(cpus[0]), what="cores halved")
            assert [(e.action, e.value, e.previous) for e in r.events][:1] == [("cores", 1, 2)]
            assert "mba=absent" in r.events[0].reason
            rate["bps"] = 0.0
            await wait_for(lambda: cpus_allowed(child) == full, what="cores restored")
        finally:
            gen.cancel()
        assert r.events[-1].action == "restore_cores" and r.events[-1].value == 2
        assert set(r.runner.cgroups.limits(r.job_id).cpus) == set(cpus)
