"""The emulated backend beyond the shared contract: configuration, topology, process liveness
and the progress channel that lets a job drive its own utilisation."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from noded.gpu import EmulatedGpuBackend, EmulatedGpuConfig, GpuBackendError
from noded.gpu.emulated import emulated_topology
from noded.gpu.progress import PROGRESS_ENV, ProgressMeter, read_counter
from shared.schema import SchemaError, decode
from tests.conftest import needs_root


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["sleep", "60"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def backend(tmp_path: Path, clock: Clock) -> Iterator[EmulatedGpuBackend]:
    cfg = EmulatedGpuConfig(count=2, busy_util=80.0, busy_memory_mib=1000, uuid_seed="n1",
                            progress_dir=str(tmp_path / "progress"), rate_window_s=2.0,
                            min_rate_interval_s=0.5)
    b = EmulatedGpuBackend(cfg, clock=clock)
    try:
        yield b
    finally:
        b.close()


def _write(path: str, text: str) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


# -- configuration and inventory ----------------------------------------------------------------


def test_uuids_are_deterministic_per_seed_and_differ_between_nodes() -> None:
    def uuids(seed: str) -> list[str]:
        b = EmulatedGpuBackend(EmulatedGpuConfig(count=3, uuid_seed=seed))
        try:
            return [g.uuid for g in b.inventory()[0]]
        finally:
            b.close()

    a1, a2, b1 = uuids("node-a"), uuids("node-a"), uuids("node-b")
    assert a1 == a2
    assert not set(a1) & set(b1)
    assert all(u.startswith("GPU-") and len(u) == 40 for u in a1)


def test_topology_follows_switches_and_numa_nodes() -> None:
    cfg = EmulatedGpuConfig(count=8, gpus_per_switch=2, numa_nodes=2)
    b = EmulatedGpuBackend(cfg)
    try:
        gpus, topo = b.inventory()
    finally:
        b.close()
    assert [g.pcie_switch for g in gpus] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert [g.numa_node for g in gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert (topo[0][1], topo[0][2], topo[0][4], topo[5][7]) == (10, 40, 50, 40)
    assert len({g.pci_bus_id for g in gpus}) == 8


def test_uneven_numa_layout_with_explicit_gpus_per_numa() -> None:
    topo = emulated_topology(EmulatedGpuConfig(count=6, gpus_per_switch=2, gpus_per_numa=4,
                                               numa_nodes=2))
    assert topo[3][4] == 50 and topo[4][5] == 10


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"count": 6, "numa_nodes": 2}, "cannot span NUMA nodes"),
        ({"count": 8, "gpus_per_numa": 2, "numa_nodes": 2}, "less than count"),
        ({"busy_util": 0.0}, "busy_util"),
        ({"busy_memory_mib": 50000}, "exceeds memory_mib"),
        ({"uuid_seed": ""}, "uuid_seed"),
        ({"min_rate_interval_s": 20.0}, "shorter than"),
    ],
)
def test_bad_config_is_named(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        EmulatedGpuConfig(**kwargs)


def test_config_decodes_from_wire_data_with_field_errors() -> None:
    cfg = decode(EmulatedGpuConfig, {"count": 2, "uuid_seed": "gpu-node-7", "busy_util": 75})
    assert (cfg.count, cfg.uuid_seed, cfg.busy_util) == (2, "gpu-node-7", 75.0)
    with pytest.raises(SchemaError, match="count"):
        decode(EmulatedGpuConfig, {"count": -1})
    with pytest.raises(SchemaError, match="gpus_per_switch"):
        decode(EmulatedGpuConfig, {"gpus_per_switch": "two"})


def test_zero_gpus_is_a_cpu_node() -> None:
    b = EmulatedGpuBackend(EmulatedGpuConfig(count=0))
    try:
        assert b.inventory() == ((), ())
        assert b.sample() == []
        with pytest.raises(ValueError, match="no GPUs"):
            b.job_started("j", (0,), ())
    finally:
        b.close()


# -- processes ----------------------------------------------------------------------------------


def test_busy_only_while_a_process_lives(backend: EmulatedGpuBackend,
                                         sleeper: subprocess.Popen[bytes]) -> None:
    backend.job_started("job-a", (0,), (sleeper.pid,))
    s = backend.sample()[0]
    assert (s.utilization_pct, s.memory_used_mib, s.processes) == (80.0, 1000,
                                                                    ((sleeper.pid, 1000),))
    sleeper.kill()
    sleeper.wait()
    s = backend.sample()[0]
    assert (s.utilization_pct, s.memory_used_mib, s.processes) == (0.0, 0, ())


def test_zombie_process_counts_as_dead(backend: EmulatedGpuBackend,
                                       sleeper: subprocess.Popen[bytes]) -> None:
    backend.job_started("job-z", (1,), (sleeper.pid,))
    sleeper.kill()
    os.waitid(os.P_PID, sleeper.pid, os.WEXITED | os.WNOWAIT)  # exited, not yet reaped
    assert backend.sample()[1].utilization_pct == 0.0


def test_job_pids_replaces_the_process_set(backend: EmulatedGpuBackend,
                                           sleeper: subprocess.Popen[bytes]) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    backend.job_started("job-p", (1,), (dead.pid,))
    assert backend.sample()[1].utilization_pct == 0.0
    backend.job_pids("job-p", (sleeper.pid, os.getpid()))
    s = backend.sample()[1]
    assert s.utilization_pct == 80.0
    assert sorted(pid for pid, _ in s.processes) == sorted([sleeper.pid, os.getpid()])
    assert sum(mem for _, mem in s.processes) == 1000
    with pytest.raises(ValueError, match="not running"):
        backend.job_pids("no-such-job", (1,))


def test_shared_gpu_adds_up_and_caps(tmp_path: Path, sleeper: subprocess.Popen[bytes]) -> None:
    b = EmulatedGpuBackend(EmulatedGpuConfig(count=1, busy_util=60.0, memory_mib=1000,
                                             busy_memory_mib=700))
    try:
        b.job_started("a", (0,), (sleeper.pid,))
        b.job_started("b", (0,), (os.getpid(),))
        s = b.sample()[0]
        assert (s.utilization_pct, s.memory_used_mib, len(s.processes)) == (100.0, 1000, 2)
        b.job_ended("a")
        assert b.sample()[0].utilization_pct == 60.0
    finally:
        b.close()


# -- progress channel ---------------------------------------------------------------------------


def test_progress_file_drives_utilisation(backend: EmulatedGpuBackend, clock: Clock) -> None:
    env = backend.job_env("job-r")
    path = env[PROGRESS_ENV]
    assert path.endswith("/job-r/progress") and os.path.isdir(os.path.dirname(path))
    backend.job_started("job-r", (0, 1), (os.getpid(),))
    assert backend.sample()[0].utilization_pct == 80.0  # no counter yet: plain busy

    def at(t: float, counter: int) -> float:
        clock.now = 1000.0 + t
        _write(path, f"{counter}\n")
        samples = backend.sample()
        assert samples[0].utilization_pct == samples[1].utilization_pct
        return samples[0].utilization_pct

    assert at(0, 0) == 80.0  # one reading: no rate yet
    assert at(1, 100) == 100.0  # 100 it/s, the peak so far
    assert at(2, 200) == 100.0
    assert at(3, 250) == 75.0  # last 2 s: 150 iterations
    assert at(4, 300) == 50.0  # slowed to half speed
    assert at(5, 400) == 75.0
    assert at(6, 500) == 100.0  # back at full speed
    for t in (7, 8):
        last = at(t, 500)
    assert last == 0.0  # stalled
    # A counter that goes backwards is a restarted job: history and peak start over.
    assert at(9, 0) == 80.0
    assert at(10, 30) == 100.0


def test_torn_or_hostile_progress_files_are_skipped(backend: EmulatedGpuBackend, clock: Clock,
                                                    tmp_path: Path) -> None:
    path = Path(backend.job_env("job-h")[PROGRESS_ENV])
    backend.job_started("job-h", (0,), (os.getpid(),))
    for content in ("", "12a", "-5", "9" * 100):
        path.write_text(content)
        assert backend.sample()[0].utilization_pct == 80.0
    path.unlink()
    os.mkfifo(path)  # would block a naive open() forever
    assert backend.sample()[0].utilization_pct == 80.0
    path.unlink()
    secret = tmp_path / "secret"
    secret.write_text("42")
    path.symlink_to(secret)
    assert read_counter(path) is None
    assert read_counter(secret) == 42


def test_meter_needs_the_minimum_interval() -> None:
    meter = ProgressMeter(Path("/nonexistent"), window_s=10, min_interval_s=1)
    meter.update(0.0)
    assert not meter.seen and meter.utilization() is None


def test_job_env_validates_and_cleans_up(backend: EmulatedGpuBackend) -> None:
    with pytest.raises(ValueError, match="job id"):
        backend.job_env("../etc")
    path = Path(backend.job_env("job-c")[PROGRESS_ENV])
    assert backend.job_env("job-c")[PROGRESS_ENV] == str(path)
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    path.write_text("1")
    backend.job_started("job-c", (0,), ())
    backend.job_ended("job-c")
    assert not path.parent.exists()
    backend.job_ended("job-c")  # idempotent


@needs_root
def test_job_env_hands_the_directory_to_the_job_user(backend: EmulatedGpuBackend) -> None:
    path = Path(backend.job_env("job-u", owner_uid=65534)[PROGRESS_ENV])
    assert path.parent.stat().st_uid == 65534
    assert stat.S_IMODE(path.parent.parent.stat().st_mode) == 0o711


def test_private_progress_root_is_removed_on_close() -> None:
    b = EmulatedGpuBackend(EmulatedGpuConfig(count=1))
    root = Path(b.job_env("job-t")[PROGRESS_ENV]).parent.parent
    assert root.is_dir()
    b.close()
    assert not root.exists()
    with pytest.raises(GpuBackendError, match="closed"):
        b.sample()


def test_a_configured_progress_root_outlives_the_daemon_and_its_jobs_are_re_adopted(
        tmp_path: Path, clock: Clock) -> None:
    """noded restarts while its jobs run: each keeps writing where it was told, and the next
    daemon's meter reads it (no job_env for a re-adopted job, only job_started)."""
    cfg = EmulatedGpuConfig(count=1, busy_util=80.0, uuid_seed="n1",
                            progress_dir=str(tmp_path / "progress"), rate_window_s=2.0,
                            min_rate_interval_s=0.5)
    first = EmulatedGpuBackend(cfg, clock=clock)
    path = Path(first.job_env("job-a")[PROGRESS_ENV])
    first.job_started("job-a", (0,), (os.getpid(),))
    first.close()
    assert path.parent.is_dir()  # the job is still running: its channel stays

    second = EmulatedGpuBackend(cfg, clock=clock)
    try:
        second.job_started("job-a", (0,), (os.getpid(),))
        _write(str(path), "0\n")
        second.sample()
        clock.now += 1.0
        _write(str(path), "50\n")
        assert second.sample()[0].utilization_pct == 100.0  # metered, not the plain 80
        clock.now += 1.0
        _write(str(path), "75\n")
        assert second.sample()[0].utilization_pct == 75.0
        second.job_ended("job-a")
        assert not path.parent.exists()
    finally:
        second.close()


def test_a_job_that_ended_while_the_daemon_was_down_loses_its_progress_directory(
        tmp_path: Path) -> None:
    cfg = EmulatedGpuConfig(count=1, progress_dir=str(tmp_path / "progress"))
    first = EmulatedGpuBackend(cfg)
    path = Path(first.job_env("job-gone")[PROGRESS_ENV])
    path.write_text("7")
    first.close()
    second = EmulatedGpuBackend(cfg)
    try:
        second.job_ended("job-gone")  # collected at start-up, never started here
        assert not path.parent.exists()
        assert (tmp_path / "progress").is_dir()
        with pytest.raises(ValueError, match="job id"):
            second.job_ended("../progress")
    finally:
        second.close()


# -- faults -------------------------------------------------------------------------------------


def test_fault_injection_arguments_are_checked(backend: EmulatedGpuBackend) -> None:
    with pytest.raises(ValueError, match="GPU index 5"):
        backend.inject_fault(5, 79)
    with pytest.raises(ValueError, match="xid"):
        backend.inject_fault(0, -3)


def test_non_lost_xid_keeps_reporting_values_but_unhealthy(
    backend: EmulatedGpuBackend, sleeper: subprocess.Popen[bytes]
) -> None:
    backend.job_started("job-x", (0,), (sleeper.pid,))
    assert backend.inject_fault(0, 48) is True
    assert backend.inject_fault(0, 48) is False  # already out of service
    assert backend.inject_fault(1, 31) is False  # application error
    s = backend.sample()
    assert (s[0].healthy, s[0].error, s[0].utilization_pct) == (
        False, "Xid 48 (Double Bit ECC Error)", 80.0)
    assert s[1].healthy
    backend.recover(0)
    assert backend.sample()[0].healthy
    events = backend.poll_health()
    assert [(e.index, e.healthy) for e in events] == [(0, False), (0, True)]


JOB_SCRIPT = """
import os, sys, time
path = os.environ["TRELLIS_PROGRESS_FILE"]
stall = os.path.join(os.path.dirname(path), "stall")
i = 0
while True:
    if os.path.exists(stall):
        time.sleep(0.05)
        continue
    i += 1
    with open(path + ".tmp", "w") as f:
        f.write(str(i))
    os.replace(path + ".tmp", path)
    time.sleep(0.005)
"""


def test_real_job_drives_utilisation_through_its_environment() -> None:
    """End to end with a real process and the real clock: the job finds the channel in its
    environment, full speed shows as a measured rate, a stall drops it to 0."""
    cfg = EmulatedGpuConfig(count=1, busy_util=37.0, rate_window_s=0.5, min_rate_interval_s=0.1)
    b = EmulatedGpuBackend(cfg)
    env = b.job_env("job-e2e")
    proc = subprocess.Popen([sys.executable, "-c", JOB_SCRIPT], env={**os.environ, **env})
    try:
        b.job_started("job-e2e", (0,), (proc.pid,))

        def wait_for(pred: Callable[[float], bool]) -> float:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                util = b.sample()[0].utilization_pct
                if pred(util):
                    return util
                time.sleep(0.05)
            raise AssertionError(f"utilisation stuck at {util}")

        wait_for(lambda u: u >= 50 and u != 37.0)  # a measured rate, not the busy default
        Path(env[PROGRESS_ENV]).with_name("stall").touch()
        wait_for(lambda u: u == 0.0)
        assert b.sample()[0].processes[0][0] == proc.pid  # stalled, not dead
    finally:
        proc.kill()
        proc.wait()
        b.close()


def test_noded_keeps_the_emulated_progress_channels_in_its_state_directory(
        tmp_path: Path) -> None:
    from noded.main import make_gpu_backend
    from shared.config import NodeConfig

    backend = make_gpu_backend(NodeConfig(name="n1", state_dir=str(tmp_path / "state")))
    try:
        path = Path(backend.job_env("job-s")[PROGRESS_ENV])
        assert path.parent == tmp_path / "state" / "gpu-progress" / "job-s"
    finally:
        backend.close()
    assert path.parent.is_dir()  # a daemon that stops leaves its running jobs' channels
