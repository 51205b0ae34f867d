"""One enforcer pass at a time (a scripted clock) over emulated resctrl trees and real processes.

Confinement is the CPU-affinity backend (no root needed, real sched_setaffinity on real
processes); the counters are advanced by exact byte counts between passes, so rates are exact.
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from noded.cgroups import AffinityManager, GroupLimits
from noded.enforcer import GB, ContentionEnforcer, RunningJob
from noded.gpu.base import GpuSample
from rdt import group_for_job
from rdt.emulated import advance_mbm, build_tree, open_resctrl
from shared.config import ContentionConfig
from shared.messages import MEM_BANDWIDTH_REPORT_EVERY_S, MemBandwidth
from shared.schema import decode

MIB = 1 << 20
PEAK_MIBPS = 1000.0
PEAK = PEAK_MIBPS * MIB


@dataclass
class Node:
    root: Path
    cgroups: AffinityManager
    procs: dict[str, subprocess.Popen[bytes]]
    jobs: list[RunningJob]
    samples: list[GpuSample]

    def add_job(self, job_id: str, kind: str = "cpu", cpus: tuple[int, ...] = (0,),
                gpus: tuple[int, ...] = ()) -> None:
        proc = subprocess.Popen(["sleep", "60"])
        self.procs[job_id] = proc
        self.cgroups.create(job_id, GroupLimits(cpus=cpus))
        self.cgroups.add_pid(job_id, proc.pid)
        self.jobs.append(RunningJob(job_id, kind, cpus, gpus))

    def enforcer(self, **config: object) -> ContentionEnforcer:
        settings = {"peak_bandwidth_mbps": PEAK_MIBPS, "restore_intervals": 2, **config}
        return ContentionEnforcer(ContentionConfig(**settings),  # type: ignore[arg-type]
                                  self.cgroups, open_resctrl(self.root) if self.root else None,
                                  lambda: list(self.jobs), lambda: list(self.samples))

    def traffic(self, group: str | None, mibps: float, seconds: float = 1.0) -> None:
        nbytes = int(mibps * MIB * seconds / 2)
        for domain in (0, 1):
            advance_mbm(self.root, group, domain, nbytes)

    def mb(self, job_id: str) -> str:
        text = (self.root / group_for_job(job_id) / "schemata").read_text()
        return next(line for line in text.splitlines() if line.startswith("MB:"))


def make_node(base: Path, unique_name: str, profile: str | None) -> Node:
    root = base / "resctrl"
    if profile is not None:
        build_tree(root, profile)
    cgroups = AffinityManager(unique_name, base / "affinity")
    return Node(root if profile else None, cgroups, {}, [], [])  # type: ignore[arg-type]


@pytest.fixture
def node_factory(tmp_path: Path, unique_name: str) -> Iterator:
    made: list[Node] = []

    def make(profile: str | None = "full") -> Node:
        node = make_node(tmp_path / f"node{len(made)}", unique_name, profile)
        made.append(node)
        return node

    yield make
    for node in made:
        for job_id, proc in node.procs.items():
            proc.kill()
            proc.wait()
            node.cgroups.remove(job_id)


def step(enf: ContentionEnforcer, node: Node, t: float) -> list[tuple[str, str, int]]:
    return [(d.job_id, d.action, d.value) for d in enf.step(t, list(node.jobs), node.samples)]


def test_pass_creates_groups_assigns_and_throttles_the_heaviest(node_factory) -> None:
    node = node_factory("full")
    node.add_job("test-heavy")
    node.add_job("test-light", cpus=(0,))
    node.add_job("test-train", kind="training", gpus=(0,))
    enf = node.enforcer()
    assert step(enf, node, 0.0) == []
    # Only the jobs that may be throttled get a (scarce) control group.
    assert (node.root / "trellis-test-heavy").is_dir()
    assert (node.root / "trellis-test-light").is_dir()
    assert not (node.root / "trellis-test-train").exists()
    tasks = (node.root / "trellis-test-heavy" / "tasks").read_text().split()
    assert str(node.procs["test-heavy"].pid) in tasks
    node.traffic("trellis-test-heavy", 600)
    node.traffic("trellis-test-light", 50)
    node.traffic(None, 150)  # the training job and everything else: the default group
    assert step(enf, node, 1.0) == [("test-heavy", "mba", 80)]
    assert node.mb("test-heavy") == "MB:0=80;1=80" and node.mb("test-light") == "MB:0=100;1=100"
    # Calm below 60 % for two intervals: one step back up.
    node.traffic("trellis-test-heavy", 100)
    assert step(enf, node, 2.0) == []
    node.traffic("trellis-test-heavy", 100)
    assert step(enf, node, 3.0) == [("test-heavy", "restore_mba", 100)]
    # A job that is gone loses its group.
    node.jobs = [j for j in node.jobs if j.job_id != "test-light"]
    step(enf, node, 4.0)
    assert not (node.root / "trellis-test-light").exists()


def test_foreign_control_groups_count_towards_the_node_total(node_factory) -> None:
    node = node_factory("full")
    node.add_job("test-cpu")
    enf = node.enforcer()
    rc = enf.resctrl
    assert rc is not None
    rc.fs.mkdir(node.root / "other-tool", what="another tool's group")
    step(enf, node, 0.0)
    node.traffic("other-tool", 900)
    assert step(enf, node, 1.0) == [("test-cpu", "mba", 80)]


def test_out_of_closids_falls_back_to_cores(node_factory) -> None:
    node = node_factory("few_closids")  # 4 CLOSIDs: the default group and three more
    for i in range(4):
        node.add_job(f"test-j{i}", cpus=(0, 1))
    enf = node.enforcer()
    step(enf, node, 0.0)
    grouped = [j for j in range(4) if (node.root / f"trellis-test-j{j}").is_dir()]
    assert grouped == [0, 1, 2]
    node.traffic(None, 900)
    decisions = step(enf, node, 1.0)
    assert ("test-j3", "cores", 1) in decisions  # no control group: no MBA for this one
    assert node.cgroups.limits("test-j3").cpus == (0,)
    assert all(action == "mba" for job, action, _ in decisions if job != "test-j3")


def test_throttles_left_by_an_earlier_daemon_are_reset(node_factory) -> None:
    node = node_factory("full")
    node.add_job("test-old", cpus=(0, 1))
    rc = open_resctrl(node.root)
    rc.create_group("trellis-test-old")
    rc.set_mb("trellis-test-old", 40)
    node.cgroups.update("test-old", GroupLimits(cpus=(0,)))
    enf = node.enforcer()
    step(enf, node, 0.0)
    assert node.mb("test-old") == "MB:0=100;1=100"
    assert node.cgroups.limits("test-old").cpus == (0, 1)


def test_monitoring_only_node_halves_cores_from_the_node_total(node_factory) -> None:
    node = node_factory("mon_only")
    node.add_job("test-cpu", cpus=(0, 1))
    enf = node.enforcer()
    step(enf, node, 0.0)
    assert not (node.root / "trellis-test-cpu").exists()  # no allocation: no control groups
    node.traffic(None, 800)
    assert step(enf, node, 1.0) == [("test-cpu", "cores", 1)]
    assert node.cgroups.limits("test-cpu").cpus == (0,)


def test_onset_read_between_passes_is_judged_over_an_interval(node_factory) -> None:
    node = node_factory("full")
    node.add_job("test-cpu")
    enf = node.enforcer(interval_s=1.0)
    step(enf, node, 0.0)
    node.traffic("trellis-test-cpu", 300)
    step(enf, node, 1.0)  # 30 %: calm
    # 1000 MiB in the next quarter interval: the trailing second counted 1225 MiB.
    node.traffic("trellis-test-cpu", 4000, seconds=0.25)
    rate = enf.check_onset(1.25)
    assert rate is not None and rate >= 0.75 * PEAK
    assert step(enf, node, 1.26) == [("test-cpu", "mba", 80)]
    # Half as much: the trailing second counted 725 MiB, under 75 % of peak: no onset.
    node2 = node_factory("full")
    node2.add_job("test-cpu2")
    enf2 = node2.enforcer(interval_s=1.0)
    step(enf2, node2, 0.0)
    node2.traffic("trellis-test-cpu2", 300)
    step(enf2, node2, 1.0)
    node2.traffic("trellis-test-cpu2", 2000, seconds=0.25)
    assert enf2.check_onset(1.25) is None


def test_without_mbm_a_gpu_utilisation_drop_halves_cpu_job_cores(node_factory) -> None:
    node = node_factory(None)  # no resctrl at all
    node.add_job("test-cpu", cpus=(0, 1))
    node.add_job("test-train", kind="training", gpus=(0,))
    enf = node.enforcer(gpu_warmup_intervals=3, gpu_drop_intervals=2)
    assert not enf.mbm

    def util(pct: float) -> None:
        node.samples[:] = [GpuSample(0, pct, 1000, 40960, (), True)]

    util(92)
    for t in range(4):
        assert step(enf, node, float(t)) == []
    util(60)
    assert step(enf, node, 4.0) == []
    assert step(enf, node, 5.0) == [("test-cpu", "cores", 1)]
    assert node.cgroups.limits("test-cpu").cpus == (0,)


def test_node_bandwidth_is_reported_when_it_moves_and_every_half_minute(node_factory) -> None:
    node = node_factory("full")
    node.add_job("test-cpu")
    enf = node.enforcer()
    sent: list[MemBandwidth] = []

    async def send(kind: str, body: dict) -> None:  # type: ignore[type-arg]
        assert kind == "mem_bandwidth"
        sent.append(decode(MemBandwidth, body))

    enf.send = send

    def measure(t: float, mibps: float) -> list[MemBandwidth]:
        node.traffic(None, mibps)
        step(enf, node, t)
        asyncio.run(enf._report_bandwidth())
        out = list(sent)
        sent.clear()
        return out

    assert measure(0.0, 0) == []  # no interval measured yet
    (first,) = measure(1.0, 300)
    assert first.used_gbps == pytest.approx(300 * MIB / GB, rel=1e-3)
    assert first.limit_gbps == pytest.approx(0.75 * PEAK / GB, rel=1e-3)
    assert first.window_s == 1.0
    # Within a twentieth of the limit (37.5 MiB/s here): nothing new to say.
    assert measure(2.0, 320) == []
    (moved,) = measure(3.0, 400)
    assert moved.used_gbps == pytest.approx(400 * MIB / GB, rel=1e-3)
    # Unchanged, but the master hears again within MEM_BANDWIDTH_REPORT_EVERY_S.
    t = 3.0
    while t < 3.0 + MEM_BANDWIDTH_REPORT_EVERY_S - 1:
        t += 1.0
        assert measure(t, 400) == []
    assert len(measure(t + 1.0, 400)) == 1
