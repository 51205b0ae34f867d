"""The v2 backend against an emulated cgroup2 tree with cpuset/cpu/memory delegated.

This machine's real cgroup2 mount delegates none of those controllers, so limit writes are
tested here; group creation and membership on the real mount are in
tests/integration/test_cgroups_real.py.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from noded.cgroups import (
    CgroupUnavailableError,
    GroupBusyError,
    GroupLimits,
    GroupNotFoundError,
    LimitsError,
    V2CgroupManager,
    detect_cgroups,
)
from tests.unit.cgroups_procs import procs, spawn_sleeper, wait_gone
from tests.unit.cgroups_tree import ALL_V2, PAGE, EmulatedCgroupFs

__all__ = ["procs"]  # the fixture, imported for use here

PARENT = "trellis-node1"


def make(tmp_path: Path, offered: tuple[str, ...] = ALL_V2, cpus: str = "0-1"):
    fs = EmulatedCgroupFs(tmp_path / "cg", v2=offered, cpus=cpus)
    return fs, V2CgroupManager(PARENT, fs.base, fs)


def text(path: Path) -> str:
    return path.read_text().strip()


def test_create_delegates_controllers_down_the_chain(tmp_path: Path) -> None:
    fs, m = make(tmp_path)
    m.create("job-a", GroupLimits(cpus=(1,)))
    # root enables for our parent, our parent for its jobs; io/pids are not ours to turn on
    assert text(fs.base / "cgroup.subtree_control") == "cpuset cpu memory"
    assert text(fs.base / PARENT / "cgroup.subtree_control") == "cpuset cpu memory"
    job = fs.base / PARENT / "job-a"
    assert text(job / "cgroup.controllers") == "cpuset cpu memory"
    assert text(job / "cpuset.cpus") == "1"
    assert text(job / "cpuset.cpus.effective") == "1"
    assert text(job / "cpuset.mems") == "0"
    assert text(job / "memory.max") == "max"
    assert text(job / "cpu.max") == "max 100000"
    assert m.kind == "v2"


def test_limits_written_and_read_back(tmp_path: Path) -> None:
    fs, m = make(tmp_path)
    lim = GroupLimits(cpus=(0, 1), memory_bytes=(512 << 20) + 100, cpu_quota_cores=1.5)
    m.create("job-a", lim)
    job = fs.base / PARENT / "job-a"
    assert text(job / "cpuset.cpus") == "0-1"
    assert text(job / "memory.max") == str(512 << 20)  # rounded down to a page
    assert text(job / "cpu.max") == "150000 100000"
    back = m.limits("job-a")
    assert back == GroupLimits(cpus=(0, 1), memory_bytes=512 << 20, cpu_quota_cores=1.5)


def test_update_changes_limits_and_back_to_unlimited(tmp_path: Path) -> None:
    fs, m = make(tmp_path, cpus="0-3")
    m.create("job-a", GroupLimits(cpus=(0, 1), memory_bytes=1 << 30, cpu_quota_cores=2))
    m.update("job-a", GroupLimits(cpus=(2, 3)))
    job = fs.base / PARENT / "job-a"
    assert text(job / "cpuset.cpus") == "2-3"
    assert text(job / "memory.max") == "max"
    assert text(job / "cpu.max") == "max 100000"
    assert m.limits("job-a") == GroupLimits(cpus=(2, 3))


def test_cpu_max_keeps_the_configured_period(tmp_path: Path) -> None:
    fs, m = make(tmp_path)
    m.create("job-a", GroupLimits(cpus=(0,)))
    fs.write(fs.base / PARENT / "job-a" / "cpu.max", "max 50000", what="test: operator period")
    m.update("job-a", GroupLimits(cpus=(0,), cpu_quota_cores=0.5))
    assert text(fs.base / PARENT / "job-a" / "cpu.max") == "25000 50000"
    assert m.limits("job-a").cpu_quota_cores == 0.5


def test_create_is_idempotent(tmp_path: Path) -> None:
    fs, m = make(tmp_path)
    # an unaligned limit too: the kernel keeps it page-rounded, which must still compare equal
    lim = GroupLimits(cpus=(1,), memory_bytes=(256 << 20) + 10, cpu_quota_cores=1)
    m.create("job-a", lim)
    writes = fs.writes
    m.create("job-a", lim)
    m.update("job-a", lim)
    assert fs.writes == writes  # nothing changed, nothing written
    assert m.limits("job-a") == GroupLimits(cpus=(1,), memory_bytes=256 << 20, cpu_quota_cores=1)


def test_cpus_outside_the_machine_refused(tmp_path: Path) -> None:
    fs, m = make(tmp_path)
    with pytest.raises(
        LimitsError, match=r"cpus 2-3 not available: cgroup parent trellis-node1 has cpus 0-1"
    ):
        m.create("job-a", GroupLimits(cpus=(0, 2, 3)))
    with pytest.raises(LimitsError, match="mems 1 not available"):
        m.create("job-a", GroupLimits(cpus=(0,), mems=(1,)))
    assert not (fs.base / PARENT / "job-a").exists()


def test_missing_cpuset_delegation_is_refused_up_front(tmp_path: Path) -> None:
    fs = EmulatedCgroupFs(tmp_path / "cg", v2=("cpu", "memory", "pids"))
    with pytest.raises(CgroupUnavailableError, match="does not delegate the cpuset controller"):
        V2CgroupManager(PARENT, fs.base, fs)


def test_limit_needing_an_undelegated_controller_is_refused(tmp_path: Path) -> None:
    fs, m = make(tmp_path, offered=("cpuset", "cpu", "pids"))
    with pytest.raises(CgroupUnavailableError, match="needs the memory controller"):
        m.create("job-a", GroupLimits(cpus=(0,), memory_bytes=1 << 30))
    assert not (fs.base / PARENT / "job-a").exists()
    m.create("job-a", GroupLimits(cpus=(0,), cpu_quota_cores=1))  # what is delegated works
    assert text(fs.base / PARENT / "job-a" / "cpu.max") == "100000 100000"


def test_membership_move_and_remove(tmp_path: Path, procs) -> None:
    fs, m = make(tmp_path)
    m.create("job-a", GroupLimits(cpus=(0,)))
    m.create("job-b", GroupLimits(cpus=(1,)))
    p = procs(spawn_sleeper())
    m.add_pid("job-a", p.pid)
    assert m.pids("job-a") == [p.pid]
    m.add_pid("job-b", p.pid)  # a process lives in one group: moving it leaves job-a
    assert m.pids("job-a") == []
    assert m.pids("job-b") == [p.pid]
    assert m.attach_files("job-b") == [fs.base / PARENT / "job-b" / "cgroup.procs"]
    with pytest.raises(GroupBusyError, match=rf"job 'job-b' still has processes \[{p.pid}\]"):
        m.remove("job-b")
    with pytest.raises(GroupBusyError, match="still has job groups"):
        m.remove_parent()
    assert m.signal_all("job-b", signal.SIGKILL) == 1
    p.wait(timeout=5)
    assert wait_gone(p.pid)
    assert m.pids("job-b") == []
    m.remove("job-b")
    m.remove("job-b")  # removing twice is harmless
    m.remove("job-a")
    m.remove_parent()
    assert not (fs.base / PARENT).exists()
    assert text(fs.base / "cgroup.subtree_control") == "cpuset cpu memory"  # left for others


def test_add_missing_pid_is_a_clear_error(tmp_path: Path) -> None:
    _, m = make(tmp_path)
    m.create("job-a", GroupLimits(cpus=(0,)))
    with pytest.raises(ProcessLookupError, match="cannot add pid 4194303 to job 'job-a'"):
        m.add_pid("job-a", 4194303)


def test_restarted_manager_readopts_groups(tmp_path: Path, procs) -> None:
    fs, m = make(tmp_path)
    m.create("job-a", GroupLimits(cpus=(1,), memory_bytes=64 << 20))
    p = procs(spawn_sleeper())
    m.add_pid("job-a", p.pid)
    again = V2CgroupManager(PARENT, fs.base, fs)
    assert again.list_jobs() == ["job-a"]
    assert again.pids("job-a") == [p.pid]
    assert again.limits("job-a") == GroupLimits(cpus=(1,), memory_bytes=64 << 20)


def test_unknown_job_is_a_clear_error(tmp_path: Path) -> None:
    _, m = make(tmp_path)
    for call in (
        lambda: m.update("nope", GroupLimits(cpus=(0,))),
        lambda: m.pids("nope"),
        lambda: m.limits("nope"),
        lambda: m.attach_files("nope"),
        lambda: m.add_pid("nope", 1),
        lambda: m.signal_all("nope", 0),
    ):
        with pytest.raises(GroupNotFoundError, match="job 'nope' has no cgroup"):
            call()
    assert m.list_jobs() == []


def test_detect_picks_v2_when_cpuset_is_delegated(tmp_path: Path) -> None:
    fs = EmulatedCgroupFs(tmp_path / "cg", v2=ALL_V2)
    m = detect_cgroups(PARENT, fs, root=fs.base, mounts_file=fs.mounts_file)
    assert m.kind == "v2"
    m.create("job-a", GroupLimits(cpus=(0,), memory_bytes=PAGE * 1000))
    assert text(fs.base / PARENT / "job-a" / "memory.max") == str(PAGE * 1000)
    with pytest.raises(CgroupUnavailableError, match="v1 requested but the cgroup v1 cpuset"):
        detect_cgroups(PARENT, fs, root=fs.base, prefer="v1", mounts_file=fs.mounts_file)


def test_detect_falls_back_to_affinity_without_cpuset(tmp_path: Path) -> None:
    fs = EmulatedCgroupFs(tmp_path / "cg", v2=("cpu", "memory"))
    with pytest.raises(
        CgroupUnavailableError, match=r"v2 requested but .*cgroup.controllers: cpu memory"
    ):
        detect_cgroups(PARENT, fs, root=fs.base, prefer="v2", mounts_file=fs.mounts_file)
    m = detect_cgroups(
        PARENT, fs, root=fs.base, mounts_file=fs.mounts_file, state_dir=tmp_path / "state"
    )
    assert m.kind == "affinity"
