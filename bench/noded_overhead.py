"""Node daemon overhead: CPU and memory of a real trellis-noded running 16 jobs on 8 GPUs.

    python bench/noded_overhead.py [--seconds 60] [--rdt auto|off|emulated]

Starts a real ``trellis-noded`` process (emulated GPUs: 8; GPU sampling every 1 s; the
contention eliminator on at its default 1 s interval; resctrl as ``--rdt`` says) against a
minimal master endpoint in this process that speaks the node protocol: it accepts the hello,
acknowledges events and sends 16 ``prepare_job``/``start_job`` pairs for cheap jobs
(``sleep``) spread over the machine's cores: 8 training jobs holding one GPU each (so every
GPU sample has live job processes to check) and 8 CPU jobs (which the contention eliminator
watches, and with ``--rdt emulated`` puts in resctrl groups). After a 5 s warm-up it measures, over
``--seconds``, the CPU time (user + system) of the noded process alone -- not its jobs or their
shims, which are separate processes -- and its resident memory.

Baselines from the same run and window: an idle ``python`` process (interpreter floor), and an
idle python that has only imported ``noded.main`` (the import footprint noded cannot avoid).
Last line: JSON with cpu_pct_of_one_core and rss_mb (targets: <= 1 % and <= 80 MB).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import getpass
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import psutil
from aiohttp import WSMsgType, web

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from demo.cluster import free_port  # noqa: E402
from shared.messages import PrepareJob, StartJob, StopJob  # noqa: E402
from shared.model import JobKind, JobSpec, NodeAllocation  # noqa: E402
from shared.protocol import MAX_FRAME, decode_frame, encode_frame  # noqa: E402
from shared.schema import encode  # noqa: E402

JOBS = 16
GPUS = 8
WARMUP_S = 5.0


class StubMaster:
    """Just enough of the master's node endpoint to hand one node its jobs."""

    def __init__(self) -> None:
        self.ws: web.WebSocketResponse | None = None
        self.hello = asyncio.Event()
        self.events: Counter[str] = Counter()
        self.exited: set[str] = set()
        self._ids = 0
        self._waiting: dict[int, asyncio.Future[tuple[bool, Any]]] = {}

    async def handle(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(max_msg_size=MAX_FRAME)
        await ws.prepare(request)
        self.ws = ws
        async for msg in ws:
            if msg.type != WSMsgType.BINARY:
                break
            frame = decode_frame(msg.data)
            if frame.type in ("ack", "error"):
                fut = self._waiting.pop(frame.id, None)
                if fut is not None and not fut.done():
                    fut.set_result((frame.type == "ack", frame.body))
                continue
            self.events[frame.type] += 1
            if frame.type == "hello":
                self.hello.set()
            elif frame.type == "job_exited":
                self.exited.add(frame.body["job_id"])
            await ws.send_bytes(encode_frame("ack", frame.id, {}))
        return ws

    async def command(self, type_: str, body: dict[str, Any]) -> Any:
        assert self.ws is not None
        self._ids += 2  # even ids: master-initiated
        fut: asyncio.Future[tuple[bool, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[self._ids] = fut
        await self.ws.send_bytes(encode_frame(type_, self._ids, body))
        ok, reply = await asyncio.wait_for(fut, 30)
        if not ok:
            raise RuntimeError(f"node refused {type_}: {reply}")
        return reply


def node_config(path: Path, name: str, port: int, state: Path, parent: str, rdt: str) -> None:
    lines = [
        "[node]", f'name = "{name}"', f'master_url = "http://127.0.0.1:{port}"',
        f'state_dir = "{state}"', f'cgroup_parent = "{parent}"', "sample_interval_s = 1.0",
        'log_level = "warning"',
        "[gpu]", 'backend = "emulated"', f"count = {GPUS}",
        "[rdt]", f'mode = "{rdt}"',
        "[contention]", "enabled = true", "interval_s = 1.0",
    ]
    if rdt == "emulated":
        lines += ["peak_bandwidth_mbps = 10000"]  # no start-up measurement in the window
    path.write_text("\n".join(lines) + "\n")


def idle_python(code: str) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, "-c", code], env=env, cwd=str(ROOT),
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def cpu_s(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system  # the process's own threads; children are not included


async def bench(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:6]
    name = f"bench-{tag}"
    parent = f"trellis-test-bench-{tag}"
    state = work / "node"
    stub = StubMaster()
    app = web.Application()
    app.router.add_get("/v1/node", stub.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    cfg = work / "node.toml"
    node_config(cfg, name, port, state, parent, args.rdt)
    log_path = work / "noded.log"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    with open(log_path, "wb") as log:
        noded = subprocess.Popen([sys.executable, "-m", "noded.main", "-c", str(cfg)],
                                 env=env, cwd=str(ROOT), stdout=log, stderr=log,
                                 stdin=subprocess.DEVNULL, start_new_session=True)
    baselines = {
        "idle": idle_python("import time; time.sleep(3600)"),
        "import": idle_python("import noded.main, time; time.sleep(3600)"),
    }
    user = "nobody" if os.geteuid() == 0 else getpass.getuser()
    cpus = sorted(os.sched_getaffinity(0))
    job_ids = [f"{name}-j{i}" for i in range(JOBS)]
    try:
        try:
            await asyncio.wait_for(stub.hello.wait(), 30)
        except TimeoutError:
            raise RuntimeError("noded never connected:\n" + log_path.read_text()[-3000:]) from None
        for i, job_id in enumerate(job_ids):
            # Half hold a GPU each (training), half are CPU jobs: both sampling paths work.
            gpu = i < GPUS
            spec = JobSpec(name="sleeper", command=("sleep", "3600"), user=user,
                           kind=JobKind.TRAINING if gpu else JobKind.CPU,
                           gpus=1 if gpu else 0, cpus=1)
            alloc = NodeAllocation(node=name, cpus=(cpus[i % len(cpus)],),
                                   gpus=(i,) if gpu else ())
            await stub.command("prepare_job", encode(PrepareJob(job_id=job_id, spec=spec,
                                                                allocation=alloc)))
            await stub.command("start_job", encode(StartJob(job_id=job_id,
                                                            master_addr="127.0.0.1",
                                                            master_port=1)))
        proc = psutil.Process(noded.pid)
        base = {k: psutil.Process(p.pid) for k, p in baselines.items()}
        await asyncio.sleep(WARMUP_S)
        running = sum(1 for j in job_ids if (state / "jobs" / j / "child.json").exists())
        c0, b0, t0 = cpu_s(proc), {k: cpu_s(p) for k, p in base.items()}, time.monotonic()
        rss_max = 0
        end = t0 + args.seconds
        while time.monotonic() < end:
            rss_max = max(rss_max, proc.memory_info().rss)
            await asyncio.sleep(min(1.0, max(0.0, end - time.monotonic())))
        wall = time.monotonic() - t0
        c1, b1 = cpu_s(proc), {k: cpu_s(p) for k, p in base.items()}
        rss = proc.memory_info().rss
        base_rss = {k: p.memory_info().rss for k, p in base.items()}
        if noded.poll() is not None:
            raise RuntimeError("noded exited during the run:\n" + log_path.read_text()[-3000:])
        for job_id in job_ids:
            with contextlib.suppress(Exception):
                await stub.command("stop_job", encode(StopJob(job_id=job_id, grace_s=2.0)))
        deadline = time.monotonic() + 15
        while len(stub.exited) < JOBS and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
    finally:
        for p in baselines.values():
            p.kill()
            p.wait()
        if noded.poll() is None:
            noded.send_signal(signal.SIGTERM)
            try:
                noded.wait(15)
            except subprocess.TimeoutExpired:
                noded.kill()
                noded.wait()
        _kill_leftovers(state)
        await runner.cleanup()
        _remove_cgroups(parent, state)
    mib = 1 << 20
    cpu_pct = (c1 - c0) / wall * 100
    return {
        "cpu_pct_of_one_core": round(cpu_pct, 3),
        "rss_mb": round(rss / mib, 1),
        "rss_mb_max": round(rss_max / mib, 1),
        "baseline_idle_python_rss_mb": round(base_rss["idle"] / mib, 1),
        "baseline_import_noded_rss_mb": round(base_rss["import"] / mib, 1),
        "baseline_idle_python_cpu_pct": round((b1["idle"] - b0["idle"]) / wall * 100, 3),
        "rss_over_import_baseline": round(rss / base_rss["import"], 2),
        "target_cpu_pct": 1.0,
        "target_rss_mb": 80,
        "targets_met": cpu_pct <= 1.0 and rss / mib <= 80,
        "seconds": round(wall, 1),
        "jobs_running": running,
        "gpus": GPUS,
        "rdt": args.rdt,
        "events": dict(stub.events),
    }


def _kill_leftovers(state: Path) -> None:
    """Jobs outlive noded by design; end the ones this bench started."""
    jobs = state / "jobs"
    if not jobs.is_dir():
        return
    for jobdir in jobs.iterdir():
        for fname, group in (("child.json", True), ("shim.json", False)):
            with contextlib.suppress(OSError, ValueError, KeyError):
                pid = int(json.loads((jobdir / fname).read_text())["pid"])
                if group:
                    os.killpg(pid, signal.SIGKILL)
                else:
                    os.kill(pid, signal.SIGKILL)
    time.sleep(0.3)


def _remove_cgroups(parent: str, state: Path) -> None:
    from noded.cgroups import detect_cgroups

    with contextlib.suppress(Exception):
        cg = detect_cgroups(parent, state_dir=state / "cgroups")
        for job in cg.list_jobs():
            with contextlib.suppress(Exception):
                cg.remove(job)
        cg.remove_parent()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--rdt", choices=("auto", "off", "emulated"), default="auto")
    args = p.parse_args()
    if args.seconds <= 0:
        p.error("--seconds must be above zero")
    work = Path(tempfile.mkdtemp(prefix="trellis-test-bench-"))
    os.chmod(work, 0o755)
    try:
        result = asyncio.run(bench(args, work))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"noded: {result['cpu_pct_of_one_core']}% of one core, {result['rss_mb']} MB RSS "
          f"with {result['jobs_running']} jobs over {result['seconds']} s", file=sys.stderr)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
