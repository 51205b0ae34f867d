"""The GpuBackend contract, asserted identically against both backends.

``emulated`` is the emulation with real processes; ``nvml`` is NvmlGpuBackend driving the fake
pynvml. The harness only does what the world would do: for NVML the fake device becomes busy
because a job runs on it; for the emulation the backend learns it from job_started.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from noded.gpu import EmulatedGpuBackend, EmulatedGpuConfig, GpuBackend, NvmlGpuBackend
from noded.gpu.base import GPU_IS_LOST, check_topology, switch_groups
from shared.model import GpuInfo
from shared.schema import decode
from tests.unit.fake_pynvml import FakeNvml

COUNT = 4


@dataclass
class Harness:
    kind: str
    backend: GpuBackend
    xid: Callable[[int, int], None]
    lose: Callable[[int], None]
    busy: Callable[[tuple[int, ...], tuple[int, ...]], None]
    idle: Callable[[tuple[int, ...]], None]
    jobs: dict[str, tuple[int, ...]] = field(default_factory=dict)

    def start_job(self, job_id: str, gpus: tuple[int, ...], pids: tuple[int, ...]) -> None:
        self.busy(gpus, pids)  # what the job's processes do to a real GPU
        self.backend.job_started(job_id, gpus, pids)
        self.jobs[job_id] = gpus

    def end_job(self, job_id: str) -> None:
        self.idle(self.jobs.pop(job_id))
        self.backend.job_ended(job_id)


def _emulated(tmp_path: Path) -> Harness:
    backend = EmulatedGpuBackend(
        EmulatedGpuConfig(count=COUNT, gpus_per_switch=2, numa_nodes=2, uuid_seed="contract",
                          progress_dir=str(tmp_path / "progress"),
                          # Device files need CAP_MKNOD: without root the emulation has none.
                          dev_dir=str(tmp_path / "dev") if os.geteuid() == 0 else None)
    )
    return Harness(
        kind="emulated",
        backend=backend,
        xid=lambda i, x: backend.inject_fault(i, x),
        lose=lambda i: backend.inject_fault(i, 79),
        busy=lambda gpus, pids: None,
        idle=lambda gpus: None,
    )


def _nvml(tmp_path: Path) -> Harness:
    fake = FakeNvml.standard(COUNT, gpus_per_switch=2, numa_nodes=2)
    backend = NvmlGpuBackend(nvml=fake)
    return Harness(
        kind="nvml",
        backend=backend,
        xid=fake.inject_xid,
        lose=fake.lose_gpu,
        busy=fake.set_busy,
        idle=fake.set_idle,
    )


@pytest.fixture(params=["emulated", "nvml"])
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    h = _emulated(tmp_path) if request.param == "emulated" else _nvml(tmp_path)
    try:
        yield h
    finally:
        h.backend.close()


@pytest.fixture
def sleeper() -> Iterator[int]:
    proc = subprocess.Popen(["sleep", "60"])
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def test_name_matches_kind(harness: Harness) -> None:
    assert harness.backend.name == harness.kind
    assert isinstance(harness.backend, GpuBackend)


def test_inventory_shape_and_topology(harness: Harness) -> None:
    gpus, topology = harness.backend.inventory()
    assert [g.index for g in gpus] == list(range(COUNT))
    assert len({g.uuid for g in gpus}) == COUNT
    assert all(g.uuid.startswith("GPU-") and g.model and g.memory_mib > 0 for g in gpus)
    assert all(g.healthy for g in gpus)
    check_topology(topology, COUNT)  # square, symmetric, NVML levels, 0 on the diagonal
    assert tuple(g.pcie_switch for g in gpus) == switch_groups(topology) == (0, 0, 1, 1)
    assert [g.numa_node for g in gpus] == [0, 0, 1, 1]
    # GPUs behind one switch are close, across NUMA nodes far.
    assert topology[0][1] <= 20 < topology[0][2]
    assert topology[0][2] == 50
    # What goes on the wire passes the schema's bounds.
    for g in gpus:
        assert decode(GpuInfo, dataclasses.asdict(g)) == g


def test_device_files_describe_every_gpu(harness: Harness) -> None:
    nodes = harness.backend.device_nodes()
    if not nodes.gpus and harness.kind == "emulated":
        pytest.skip("emulated device files need root")
    assert sorted(nodes.gpus) == list(range(COUNT))
    assert {n.major for n in nodes.gpus.values()} == {195}
    assert len({n.minor for n in nodes.gpus.values()}) == COUNT
    assert (nodes.control[0].major, nodes.control[0].minor) == (195, 255)
    assert nodes.control[0].path.endswith("/nvidiactl")
    assert nodes.for_job((1,))[0] == nodes.gpus[1]


def test_sample_reports_every_gpu_idle(harness: Harness) -> None:
    gpus, _ = harness.backend.inventory()
    samples = harness.backend.sample()
    assert [s.index for s in samples] == list(range(COUNT))
    for s, g in zip(samples, gpus, strict=True):
        assert s.utilization_pct == 0.0
        assert s.memory_used_mib == 0
        assert s.memory_total_mib == g.memory_mib
        assert s.processes == ()
        assert s.healthy and s.error is None


def test_busy_while_job_runs_idle_after(harness: Harness, sleeper: int) -> None:
    harness.start_job("job-1", (1, 2), (sleeper,))
    samples = harness.backend.sample()
    for i in (1, 2):
        assert samples[i].utilization_pct >= 50.0
        assert 0 < samples[i].memory_used_mib <= samples[i].memory_total_mib
        assert sleeper in [pid for pid, _ in samples[i].processes]
    for i in (0, 3):
        assert samples[i].utilization_pct == 0.0 and samples[i].processes == ()
    harness.end_job("job-1")
    assert all(s.utilization_pct == 0.0 and s.processes == () for s in harness.backend.sample())


def test_xid_79_takes_gpu_out_until_recovered(harness: Harness) -> None:
    uuid = harness.backend.inventory()[0][1].uuid
    harness.xid(1, 79)
    events = harness.backend.poll_health(timeout_ms=2000)
    assert len(events) == 1
    event = events[0]
    assert (event.index, event.uuid, event.healthy) == (1, uuid, False)
    assert "Xid 79" in event.reason and "fallen off the bus" in event.reason
    samples = harness.backend.sample()
    assert not samples[1].healthy and samples[1].error
    assert all(samples[i].healthy for i in (0, 2, 3))
    assert [g.healthy for g in harness.backend.inventory()[0]] == [True, False, True, True]
    # Sticky, and reported once: only transitions are events.
    assert harness.backend.poll_health(timeout_ms=0) == []
    assert not harness.backend.sample()[1].healthy

    harness.backend.recover(1)
    events = harness.backend.poll_health(timeout_ms=0)
    assert [(e.index, e.healthy) for e in events] == [(1, True)]
    assert harness.backend.inventory()[0][1].healthy


def test_application_xid_13_is_ignored(harness: Harness) -> None:
    harness.xid(2, 13)
    assert harness.backend.poll_health(timeout_ms=50) == []
    assert harness.backend.sample()[2].healthy
    assert harness.backend.inventory()[0][2].healthy


def test_lost_gpu_is_a_state_not_an_exception(harness: Harness, sleeper: int) -> None:
    harness.start_job("job-2", (3,), (sleeper,))
    harness.lose(3)
    samples = harness.backend.sample()  # must not raise
    assert samples[3].healthy is False
    assert samples[3].error == GPU_IS_LOST
    assert samples[3].utilization_pct == 0.0 and samples[3].processes == ()
    assert all(samples[i].healthy and samples[i].error is None for i in (0, 1, 2))
    events = harness.backend.poll_health(timeout_ms=0)
    assert [(e.index, e.healthy) for e in events] == [(3, False)]
    assert not harness.backend.inventory()[0][3].healthy


def test_poll_health_wakes_for_an_event_from_another_thread(harness: Harness) -> None:
    got: list = []
    poller = threading.Thread(target=lambda: got.extend(harness.backend.poll_health(10_000)))
    poller.start()
    try:
        harness.xid(0, 48)
    finally:
        poller.join(timeout=10)
    assert not poller.is_alive()
    assert [(e.index, e.healthy, e.reason) for e in got] == [
        (0, False, "Xid 48 (Double Bit ECC Error)")
    ]


def test_poll_health_times_out_empty(harness: Harness) -> None:
    assert harness.backend.poll_health(timeout_ms=20) == []


def test_bad_arguments_are_named(harness: Harness) -> None:
    with pytest.raises(ValueError, match="GPU index 7"):
        harness.backend.job_started("job-3", (0, 7), ())
    with pytest.raises(ValueError, match="timeout_ms"):
        harness.backend.poll_health(-1)
    with pytest.raises(ValueError, match="GPU index 9"):
        harness.backend.recover(9)


def test_close_is_idempotent_and_stops_polling(harness: Harness) -> None:
    harness.backend.close()
    harness.backend.close()
    assert harness.backend.poll_health(timeout_ms=5000) == []
