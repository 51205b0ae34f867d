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
Last line: JSON with cpu_pct_of_one_core, rss_mb (the last sample) and rss_mb_max (the peak);
targets_met: at most 1 % of one core and a peak RSS of at most 80 MB.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from aiohttp import WSMsgType, web

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from demo.cluster import Daemon, default_job_user, free_port  # noqa: E402
from demo.harness import exit_on_signals, run, scratch_dir, shielded, sweep_node  # noqa: E402
from shared.messages import PrepareJob, StartJob, StopJob  # noqa: E402
from shared.model import JobKind, JobSpec, NodeAllocation  # noqa: E402
from shared.protocol import MAX_FRAME, decode_frame, encode_frame  # noqa: E402
from shared.schema import encode  # noqa: E402

JOBS = 16
GPUS = 8
WARMUP_S = 5.0
TARGET_CPU_PCT = 1.0
TARGET_RSS_MB = 80
MIB = 1 << 20


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


def targets_met(cpu_pct: float, rss_peak_bytes: int) -> bool:
    """The verdict: noded's CPU over the window and its *peak* resident memory within the
    targets (a daemon that swells between samples and shrinks back still needs the memory)."""
    return cpu_pct <= TARGET_CPU_PCT and rss_peak_bytes / MIB <= TARGET_RSS_MB


@dataclass
class Window:
    """What one measurement window saw of noded and the baseline processes."""

    seconds: float
    cpu_s: float
    baseline_cpu_s: dict[str, float]
    rss_last: int
    rss_peak: int
    baseline_rss: dict[str, int]


async def measure(proc: psutil.Process, base: dict[str, psutil.Process],
                  seconds: float) -> Window:
    c0, b0, t0 = cpu_s(proc), {k: cpu_s(p) for k, p in base.items()}, time.monotonic()
    rss_peak = 0
    end = t0 + seconds
    while time.monotonic() < end:
        rss_peak = max(rss_peak, proc.memory_info().rss)
        await asyncio.sleep(min(1.0, max(0.0, end - time.monotonic())))
    wall = time.monotonic() - t0
    c1, b1 = cpu_s(proc), {k: cpu_s(p) for k, p in base.items()}
    rss = proc.memory_info().rss
    return Window(seconds=wall, cpu_s=c1 - c0, baseline_cpu_s={k: b1[k] - b0[k] for k in b1},
                  rss_last=rss, rss_peak=max(rss_peak, rss),
                  baseline_rss={k: p.memory_info().rss for k, p in base.items()})


async def start_jobs(stub: StubMaster, node: str, job_ids: list[str]) -> None:
    """Half hold a GPU each (training), half are CPU jobs: both sampling paths work."""
    user = default_job_user()
    cpus = sorted(os.sched_getaffinity(0))
    for i, job_id in enumerate(job_ids):
        gpu = i < GPUS
        spec = JobSpec(name="sleeper", command=("sleep", "3600"), user=user,
                       kind=JobKind.TRAINING if gpu else JobKind.CPU,
                       gpus=1 if gpu else 0, cpus=1)
        alloc = NodeAllocation(node=node, cpus=(cpus[i % len(cpus)],),
                               gpus=(i,) if gpu else ())
        await stub.command("prepare_job", encode(PrepareJob(job_id=job_id, spec=spec,
                                                            allocation=alloc)))
        await stub.command("start_job", encode(StartJob(job_id=job_id, master_addr="127.0.0.1",
                                                        master_port=1)))


async def stop_jobs(stub: StubMaster, job_ids: list[str]) -> None:
    for job_id in job_ids:
        with contextlib.suppress(Exception):
            await stub.command("stop_job", encode(StopJob(job_id=job_id, grace_s=2.0)))
    deadline = time.monotonic() + 15
    while len(stub.exited) < len(job_ids) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)


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
    cfg = work / "node.toml"
    noded = Daemon("noded", [sys.executable, "-m", "noded.main", "-c", str(cfg)],
                   work / "noded.log")
    baselines: dict[str, subprocess.Popen[bytes]] = {}
    job_ids = [f"{name}-j{i}" for i in range(JOBS)]
    try:
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        node_config(cfg, name, port, state, parent, args.rdt)
        noded.start(dict(os.environ, PYTHONPATH=str(ROOT)))
        baselines["idle"] = idle_python("import time; time.sleep(3600)")
        baselines["import"] = idle_python("import noded.main, time; time.sleep(3600)")
        try:
            await asyncio.wait_for(stub.hello.wait(), 30)
        except TimeoutError:
            raise RuntimeError("noded never connected:\n" + noded.log_tail(3000)) from None
        await start_jobs(stub, name, job_ids)
        assert noded.proc is not None
        proc = psutil.Process(noded.proc.pid)
        base = {k: psutil.Process(p.pid) for k, p in baselines.items()}
        await asyncio.sleep(WARMUP_S)
        running = sum(1 for j in job_ids if (state / "jobs" / j / "child.json").exists())
        window = await measure(proc, base, args.seconds)
        if not noded.running:
            raise RuntimeError("noded exited during the run:\n" + noded.log_tail(3000))
        await stop_jobs(stub, job_ids)
    finally:
        with shielded():
            for p in baselines.values():
                p.kill()
                p.wait()
            noded.stop(timeout=15)
            sweep_node(parent, state)  # jobs outlive noded by design
            await runner.cleanup()
    return result(args, window, running, dict(stub.events))


def result(args: argparse.Namespace, w: Window, running: int,
           events: dict[str, int]) -> dict[str, Any]:
    cpu_pct = w.cpu_s / w.seconds * 100
    return {
        "cpu_pct_of_one_core": round(cpu_pct, 3),
        "rss_mb": round(w.rss_last / MIB, 1),
        "rss_mb_max": round(w.rss_peak / MIB, 1),
        "baseline_idle_python_rss_mb": round(w.baseline_rss["idle"] / MIB, 1),
        "baseline_import_noded_rss_mb": round(w.baseline_rss["import"] / MIB, 1),
        "baseline_idle_python_cpu_pct": round(w.baseline_cpu_s["idle"] / w.seconds * 100, 3),
        "rss_over_import_baseline": round(w.rss_last / w.baseline_rss["import"], 2),
        "target_cpu_pct": TARGET_CPU_PCT,
        "target_rss_mb": TARGET_RSS_MB,
        "targets_met": targets_met(cpu_pct, w.rss_peak),
        "seconds": round(w.seconds, 1),
        "jobs_running": running,
        "gpus": GPUS,
        "rdt": args.rdt,
        "events": events,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--rdt", choices=("auto", "off", "emulated"), default="auto")
    args = p.parse_args()
    if args.seconds <= 0:
        p.error("--seconds must be above zero")
    with exit_on_signals(), scratch_dir("trellis-test-bench-") as work:
        out = run(bench(args, work))
    print(f"noded: {out['cpu_pct_of_one_core']}% of one core, {out['rss_mb']} MB RSS "
          f"with {out['jobs_running']} jobs over {out['seconds']} s", file=sys.stderr)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
