"""The node's half of Liquid: the post-phase detector, running statistics, reading a job's
cgroups, what jobs declare to the emulated GPUs (shared GPUs add up), CUDA MPS for shared
jobs, and the heartbeat-only mode benchmarks compare events with."""

from __future__ import annotations

import asyncio
import math
import os
import shutil
import stat
from pathlib import Path
from typing import Any

import pytest

from noded.agent import NodeAgent
from noded.gpu.declared import read_declared
from noded.gpu.emulated import EmulatedGpuBackend, EmulatedGpuConfig
from noded.mps import BINARY, MpsControl, MpsError, open_mps, share_env
from noded.policy.stats import Running
from noded.usage.cgroupstat import JobGroups, cpu_seconds, memory_bytes, parse_proc_cgroup
from noded.usage.phase import PhaseDetector
from shared.model import GpuInfo


def test_phase_detector_needs_training_then_a_lasting_fall() -> None:
    d = PhaseDetector(threshold_pct=15.0, samples=3)
    # Launching: low utilisation is not a post phase.
    assert not any(d.add(t, 5.0) for t in (0.0, 1.0, 2.0, 3.0))
    assert not d.add(4.0, 80.0)
    assert d.pre_s == 4.0
    # A dip of two samples (data loading) is not the end of training ...
    assert not d.add(5.0, 3.0) and not d.add(6.0, 3.0)
    assert not d.add(7.0, 90.0)
    # ... three in a row are, reported once.
    assert [d.add(t, 2.0) for t in (8.0, 9.0, 10.0, 11.0)] == [False, False, True, False]
    # The post phase began at the first sample of the fall that lasted.
    assert d.post_from == 8.0 and d.post_s(20.0) == 12.0


def test_running_statistics() -> None:
    r = Running()
    assert r.value() is None and r.std == 0.0
    for v in (1.0, 2.0, 3.0, 4.0):
        r.add(v)
    assert (r.count, r.mean, r.peak) == (4, 2.5, 4.0)
    assert math.isclose(r.std, math.sqrt(1.25))


def test_proc_cgroup_parsing_and_reads(tmp_path: Path) -> None:
    text = "12:cpu,cpuacct:/trellis/j1\n9:memory:/trellis/j1\n0::/trellis-acct/j1\n"
    assert parse_proc_cgroup(text) == ("/trellis-acct/j1", {
        "cpu": "/trellis/j1", "cpuacct": "/trellis/j1", "memory": "/trellis/j1"})
    v2, acct, mem = tmp_path / "v2", tmp_path / "acct", tmp_path / "mem"
    for d in (v2, acct, mem):
        d.mkdir()
    (v2 / "cpu.stat").write_text("usage_usec 2500000\nuser_usec 2000000\n")
    (v2 / "memory.peak").write_text("1048576\n")
    (acct / "cpuacct.usage").write_text("7000000000\n")
    (mem / "memory.max_usage_in_bytes").write_text("4096\n")
    assert cpu_seconds(JobGroups(v2=v2, cpuacct=acct)) == 2.5  # v2 first
    assert cpu_seconds(JobGroups(cpuacct=acct)) == 7.0
    assert memory_bytes(JobGroups(v2=v2, memory=mem)) == 1048576
    assert memory_bytes(JobGroups(memory=mem)) == 4096
    assert cpu_seconds(JobGroups()) is None and memory_bytes(JobGroups()) is None


def test_declared_numbers_are_read_safely(tmp_path: Path) -> None:
    f = tmp_path / "util"
    assert read_declared(f, 100) is None
    f.write_text("42.5\n")
    assert read_declared(f, 100) == 42.5
    for bad in ("", "x", "150", "-1", "nan", "9" * 40):
        f.write_text(bad)
        assert read_declared(f, 100) is None, bad
    link = tmp_path / "link"
    link.symlink_to(f)
    f.write_text("10")
    assert read_declared(link, 100) is None  # links are not followed
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert stat.S_ISFIFO(fifo.stat().st_mode) and read_declared(fifo, 100) is None


def test_emulated_gpus_add_up_jobs_sharing_one(tmp_path: Path) -> None:
    gpus = EmulatedGpuBackend(EmulatedGpuConfig(count=1, progress_dir=str(tmp_path / "p"),
                                                memory_mib=16000, uuid_seed="n"))
    try:
        for job, util, memory in (("a", 30, 2000), ("b", 45, 5000)):
            path = Path(gpus.job_env(job)["TRELLIS_PROGRESS_FILE"]).parent
            (path / "util").write_text(str(util))
            (path / "memory").write_text(str(memory))
            gpus.job_started(job, (0,), (os.getpid(),))
        [sample] = gpus.sample()
        assert sample.utilization_pct == 75 and sample.memory_used_mib == 7000
        assert (gpus.job_utilization("a"), gpus.job_memory("a")) == (30, 2000)
        assert (gpus.job_utilization("b"), gpus.job_memory("b")) == (45, 5000)
        gpus.job_ended("a")
        [sample] = gpus.sample()
        assert sample.utilization_pct == 45 and sample.memory_used_mib == 5000
    finally:
        gpus.close()


def test_mps_variables_of_a_shared_job(tmp_path: Path) -> None:
    env = share_env(tmp_path / "pipe", tmp_path / "log", 470, 16000)
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "47"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=7520M"
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == str(tmp_path / "pipe")
    assert share_env(tmp_path, tmp_path, 1, 16000)["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "1"


def test_mps_is_used_only_where_it_can_be(tmp_path: Path) -> None:
    gpus = (GpuInfo(index=0, uuid="GPU-0", model="T4", memory_mib=16000),)
    assert open_mps("off", "nvml", tmp_path, gpus) is None
    assert open_mps("auto", "emulated", tmp_path, gpus) is None
    if shutil.which(BINARY) is None:
        assert open_mps("auto", "nvml", tmp_path, gpus) is None
        with pytest.raises(MpsError, match="not installed"):
            open_mps("on", "nvml", tmp_path, gpus)


def test_mps_daemon_start_and_quit_are_the_documented_commands(tmp_path: Path) -> None:
    # A stand-in for the binary that records how it is called: what MPS itself does is tested
    # on a GPU server (tests/hardware), this checks the calls noded makes.
    record = tmp_path / "calls"
    fake = tmp_path / BINARY
    fake.write_text(f"#!/bin/sh\necho \"$@|$CUDA_MPS_PIPE_DIRECTORY|$(cat)\" >> {record}\n"
                    "[ \"$1\" = -d ] && mkdir -p \"$CUDA_MPS_PIPE_DIRECTORY\" && "
                    "touch \"$CUDA_MPS_PIPE_DIRECTORY/control\"\nexit 0\n")
    fake.chmod(0o755)
    gpus = (GpuInfo(index=0, uuid="GPU-0", model="T4", memory_mib=16000),)
    mps = MpsControl(tmp_path / "state", gpus, binary=str(fake))
    mps.ensure_daemon()
    mps.ensure_daemon()  # running: not started twice
    mps.close()
    calls = record.read_text().splitlines()
    pipe = str(tmp_path / "state" / "mps" / "pipe")
    assert calls == [f"-d|{pipe}|", f"|{pipe}|quit"]


class _Ws:
    closed = False

    def __init__(self) -> None:
        self.frames: list[bytes] = []

    async def send_bytes(self, data: bytes) -> None:
        self.frames.append(data)


async def test_heartbeat_only_mode_holds_events_until_the_beat() -> None:
    class Runner:
        on_exited: Any = None
        parts: dict[str, Any] = {}

    agent = NodeAgent("http://127.0.0.1:1", lambda: None, Runner(), None,  # type: ignore[arg-type]
                      heartbeat_only_s=0.2)
    ws = _Ws()
    agent.ws = ws  # type: ignore[assignment]
    await agent.send_event("job_exited", {"job_id": "j"})
    await agent._send("ack", {}, 2)  # replies to the master's commands are never held
    assert len(ws.frames) == 1
    stop = asyncio.Event()
    beats = asyncio.get_running_loop().create_task(agent._heartbeats(stop))
    await asyncio.sleep(0.35)
    assert len(ws.frames) == 2
    stop.set()
    await beats


async def test_a_part_requeued_onto_the_node_keeps_its_accounting_group(tmp_path: Path) -> None:
    """The old part's last report is still being sent when the job's next incarnation starts
    on the same node (a GPU failure's requeue): the group of the job's name is the new
    part's, and is not removed from under it (its shim could not join it)."""
    from noded.usage.acctgroup import AccountingGroups
    from noded.usage.cgroupstat import Mounts
    from noded.usage.collector import UsageCollector, UsageSettings

    sending = asyncio.Event()
    sent = asyncio.Event()

    async def send(type_: str, body: dict[str, Any]) -> None:
        sending.set()
        await sent.wait()

    class Cgroups:
        def pids(self, job_id: str) -> list[int]:
            return []

    class Runner:
        parts: dict[str, Any] = {}
        attach_providers: list[Any] = []
        cleanup_hooks: list[Any] = []
        cgroups = Cgroups()

    accounting = AccountingGroups(tmp_path, "n1")
    collector = UsageCollector(Runner(), None, list, send,  # type: ignore[arg-type]
                               UsageSettings(), accounting=accounting,
                               mounts=Mounts(tmp_path, {}))
    group = accounting.root / "train"
    collector.attach("train")  # incarnation 0 starts
    assert group.is_dir()
    old = type("Part", (), {"job_id": "train"})()
    collector.cleanup(old)  # ... exits; its final report is on its way
    await asyncio.wait_for(sending.wait(), 5)
    collector.attach("train")  # incarnation 1 starts meanwhile
    sent.set()
    await asyncio.wait_for(asyncio.gather(*collector._tasks), 5)
    assert group.is_dir()
    await collector.tick()  # nor later
    assert group.is_dir()
    collector.cleanup(old)  # the new part ends: now the group goes
    await asyncio.wait_for(asyncio.gather(*collector._tasks), 5)
    assert not group.exists()
