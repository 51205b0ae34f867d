"""What a job really uses, measured on the real kernel: its cgroups' CPU and memory accounting,
nftables counters for its sockets, the emulated GPU's per-job utilisation and memory, and the
post-phase event — through the real JobRunner, shim and usage collector.

The job's groups are made under ``trellis-test-<uuid>`` (and its accounting group under
``trellis-test-<uuid>-acct``), the counters in a table of that name; all are removed in the
fixture's finally block, processes included.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import os
import socket
import threading
from pathlib import Path
from typing import Any

import pytest

from demo.harness import scratch_dir
from noded.cgroups import detect_cgroups
from noded.gpu.emulated import EmulatedGpuBackend, EmulatedGpuConfig
from noded.jobs import JobRunner
from noded.netshape.nft import find_cgroup2_mount
from noded.usage.acctgroup import AccountingGroups
from noded.usage.cgroupstat import Mounts
from noded.usage.collector import UsageCollector, UsageSettings
from noded.usage.netcount import NetCounters
from noded.usage.setup import sweep_usage, table_for
from shared.messages import JobPhase, JobUsage, PrepareJob, StartJob
from shared.model import JobSpec, NodeAllocation
from shared.schema import decode
from tests.conftest import needs_root

pytestmark = needs_root
NODE = "trellis-test-node"

# Loads, trains, saves: GPU utilisation and memory declared for the emulated GPU, real CPU
# burnt by two processes, real memory touched, real bytes sent to the test's server.
JOB = """
import multiprocessing, os, socket, sys, time
d = os.path.dirname(os.environ["TRELLIS_PROGRESS_FILE"])
def put(name, value):
    with open(os.path.join(d, name + ".tmp"), "w") as f:
        f.write(str(value))
    os.replace(os.path.join(d, name + ".tmp"), os.path.join(d, name))
put("util", 0); put("memory", 3000)
time.sleep(1.0)
ballast = bytearray(64 << 20)
for i in range(0, len(ballast), 4096):
    ballast[i] = 1
def burn(until):
    while time.monotonic() < until:
        pass
put("util", 80)
until = time.monotonic() + 2.0
burners = [multiprocessing.Process(target=burn, args=(until,)) for _ in range(2)]
[p.start() for p in burners]
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.sendall(b"x" * (2 << 20))
s.shutdown(socket.SHUT_WR)
got = 0
while True:
    b = s.recv(65536)
    if not b:
        break
    got += len(b)
[p.join() for p in burners]
burnt = os.times().children_user + os.times().children_system
put("util", 2)
time.sleep(1.5)
t = os.times()
print("cpu", t.user + t.system + t.children_user + t.children_system, "burnt", burnt)
"""


def job_user() -> str:
    return "nobody" if os.geteuid() == 0 else getpass.getuser()


class Sink:
    """A TCP server in the test process: reads all, answers with 300 kB."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.port = self.sock.getsockname()[1]
        self.received = 0
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            conn, _ = self.sock.accept()
            with conn:
                while data := conn.recv(65536):
                    self.received += len(data)
                conn.sendall(b"y" * 300_000)

    def close(self) -> None:
        self.sock.close()


async def wait_for(check: Any, timeout: float = 20.0, what: str = "") -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def test_usage_of_a_real_job(unique_name: str) -> None:
    mounts = Mounts.read()
    if mounts.v2 is None:
        pytest.skip("no cgroup v2 hierarchy mounted: no accounting group, no socket counters")
    # The job runs as nobody and must reach its progress directory: pytest's own temporary
    # directories are private to root.
    with scratch_dir(f"{unique_name}-") as root:
        await _measure(root / "state", unique_name, mounts)


async def _measure(state: Path, unique_name: str, mounts: Mounts) -> None:
    state.mkdir()
    cgroups = detect_cgroups(unique_name, state_dir=state / "cgroups")
    gpus = EmulatedGpuBackend(EmulatedGpuConfig(count=1, uuid_seed=NODE, memory_mib=16000,
                                                busy_memory_mib=0, busy_util=1.0,
                                                progress_dir=str(state / "gpu-progress")))
    runner = JobRunner(NODE, state, cgroups, gpus)
    accounting = (AccountingGroups(mounts.v2, unique_name) if cgroups.kind != "v2" else None)
    counters = NetCounters(find_cgroup2_mount(), table_for(unique_name))
    events: list[tuple[str, Any]] = []

    async def send(type_: str, body: dict[str, Any]) -> None:
        events.append((type_, decode(JobUsage if type_ == "job_usage" else JobPhase, body)))

    collector = UsageCollector(runner, gpus, gpus.sample, send,
                               UsageSettings(interval_s=0.2, report_s=1.0, phase_samples=2),
                               accounting, counters, mounts)
    sink = Sink()
    stop = asyncio.Event()
    loop_task = asyncio.get_running_loop().create_task(collector.run(stop))
    job_id = f"test-{unique_name.rsplit('-', 1)[1]}"
    try:
        spec = JobSpec(name="usage", command=("python3", "-c", JOB, str(sink.port)),
                       user=job_user(), gpus=1, cpus=2)
        cpus = tuple(sorted(os.sched_getaffinity(0)))[:2]
        runner.prepare(PrepareJob(job_id=job_id, spec=spec,
                                  allocation=NodeAllocation(node=NODE, gpus=(0,), cpus=cpus)))
        runner.start(StartJob(job_id=job_id, master_addr="127.0.0.1", master_port=1))
        part = runner.parts[job_id]
        await asyncio.wait_for(part.watcher, 60)  # type: ignore[arg-type]
        await wait_for(lambda: any(t == "job_usage" and e.final for t, e in events),
                       what="the final usage report")
    finally:
        stop.set()
        await loop_task
        collector.close()
        part = runner.parts.get(job_id)
        if part is not None and part.state == "running":
            runner.stop(job_id, 0.0, "test over")
            with contextlib.suppress(TimeoutError, TypeError):
                await asyncio.wait_for(part.watcher, 10)  # type: ignore[arg-type]
        await runner.shutdown()
        with contextlib.suppress(Exception):
            cgroups.remove(job_id)
        with contextlib.suppress(Exception):
            cgroups.remove_parent()
        sweep_usage(unique_name)
        gpus.close()
        sink.close()
    output = state / "jobs" / job_id / "output.log"
    assert part is not None and part.exit_code == 0, (
        output.read_text() if output.exists() else "no output")
    final = [e for t, e in events if t == "job_usage" and e.final][-1]
    periodic = [e for t, e in events if t == "job_usage" and not e.final]
    phases = [e for t, e in events if t == "job_phase"]
    assert periodic, "a running part reports every report_s"
    # The cgroup's accounting against the job's own (os.times): how much CPU it took in all,
    # and at least the burners' rate (two processes spinning for two seconds, as much as a
    # loaded machine gives them) at the peak.
    words = output.read_text().split()
    total, burnt = float(words[words.index("cpu") + 1]), float(words[words.index("burnt") + 1])
    assert final.cpu_mean is not None and final.cpu_peak is not None, final
    assert abs(final.cpu_mean * final.seconds - total) <= 0.25 * total + 0.3, (final, total)
    assert final.cpu_peak >= 0.8 * burnt / 2.0 and final.cpu_peak > final.cpu_mean, (
        final, burnt)
    assert final.memory_peak_mib is not None and final.memory_peak_mib >= 64, final
    assert final.gpu_memory_peak_mib == 3000
    assert final.gpu_util_mean is not None and 10 < final.gpu_util_mean < 80
    assert final.gpu_util_std is not None and final.gpu_util_std > 10
    assert final.net_tx_bytes is not None and final.net_tx_bytes >= 2 << 20
    assert final.net_rx_bytes is not None and final.net_rx_bytes >= 300_000
    assert sink.received == 2 << 20
    assert final.seconds >= 4.0
    assert [p.phase for p in phases] == ["post"]
    assert phases[0].pre_s is not None and 0.5 <= phases[0].pre_s <= 2.5
    # Nothing left behind: the accounting group and the counters' table are gone.
    assert accounting is None or not accounting.root.exists()
    assert not counters.runner.table_exists("inet", counters.table)
