"""Confinement on the real kernel: cgroup v1 hierarchies and the cgroup2 mount of this machine.

Every group is made under a parent named ``trellis-test-<uuid>`` and removed in a fixture's
finally block, processes included, even when a test fails.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from noded.cgroups import (
    CgroupUnavailableError,
    GroupBusyError,
    GroupLimits,
    V1CgroupManager,
    V2CgroupManager,
    detect_cgroups,
    find_mounts,
    join_group,
)
from tests.conftest import needs_root
from tests.unit.cgroups_procs import procs, spawn_sleeper, spawn_threaded, thread_cpus, wait_gone

__all__ = ["procs"]

pytestmark = needs_root

MOUNTS = find_mounts()
CPUS = sorted(os.sched_getaffinity(0))
needs_v1 = pytest.mark.skipif("cpuset" not in MOUNTS.v1, reason="no cgroup v1 cpuset hierarchy")
needs_v2 = pytest.mark.skipif(MOUNTS.v2 is None, reason="no cgroup2 mount")
needs_two_cpus = pytest.mark.skipif(len(CPUS) < 2, reason="needs two usable CPUs to re-pin")
LO, HI = CPUS[0], CPUS[-1]


def status_field(pid: int, name: str) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(name + ":"):
            return line.split(":", 1)[1].strip()
    raise AssertionError(f"{name} missing from /proc/{pid}/status")


def cgroup_of(pid: int) -> dict[str, str]:
    """controller (or "" for v2) -> path, from /proc/PID/cgroup."""
    out: dict[str, str] = {}
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, ctls, path = line.split(":", 2)
        for ctl in ctls.split(",") if ctls else [""]:
            out[ctl] = path
    return out


def _drain(group: Path) -> None:
    """Kill whatever is left in a group we made and wait for it to leave."""
    procs_file = group / "cgroup.procs"
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        with contextlib.suppress(FileNotFoundError):
            pids = [int(p) for p in procs_file.read_text().split()]
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)


def _scrub(dirs: list[Path]) -> None:
    """Remove our parent groups bottom-up, by hand, whatever state a failed test left."""
    for parent in dirs:
        if not parent.is_dir():
            continue
        for job in sorted((p for p in parent.rglob("*") if p.is_dir()), reverse=True):
            _drain(job)
            with contextlib.suppress(FileNotFoundError):
                job.rmdir()
        _drain(parent)
        with contextlib.suppress(FileNotFoundError):
            parent.rmdir()


@pytest.fixture
def v1(unique_name: str) -> Iterator[V1CgroupManager]:
    if "cpuset" not in MOUNTS.v1:
        pytest.skip("no cgroup v1 cpuset hierarchy")
    m = detect_cgroups(unique_name, prefer="v1")
    assert isinstance(m, V1CgroupManager)
    try:
        yield m
    finally:
        _scrub([mount / unique_name for mount in m.mounts.values()])
        leftovers = [mount / unique_name for mount in m.mounts.values()]
        assert not any(p.exists() for p in leftovers), f"cleanup left {leftovers}"


@pytest.fixture
def v2(unique_name: str) -> Iterator[V2CgroupManager]:
    if MOUNTS.v2 is None:
        pytest.skip("no cgroup2 mount")
    m = V2CgroupManager(unique_name, MOUNTS.v2, require_cpuset=False)
    try:
        yield m
    finally:
        _scrub([MOUNTS.v2 / unique_name])
        assert not (MOUNTS.v2 / unique_name).exists()


# -- cgroup v1 -------------------------------------------------------------------------------


@needs_v1
def test_detect_picks_v1_here(unique_name: str) -> None:
    m = detect_cgroups(unique_name)
    assert m.kind == "v1"
    assert not (MOUNTS.v1["cpuset"] / unique_name).exists()  # detection creates nothing


@needs_two_cpus
def test_v1_pinning_follows_create_and_live_update(v1: V1CgroupManager, procs) -> None:
    v1.create("job-a", GroupLimits(cpus=(HI,), memory_bytes=256 << 20, cpu_quota_cores=0.5))
    p = procs(spawn_sleeper())
    v1.add_pid("job-a", p.pid)
    where = cgroup_of(p.pid)
    for ctl in v1.mounts:
        assert where[ctl] == f"/{v1.parent}/job-a"
    assert status_field(p.pid, "Cpus_allowed_list") == str(HI)
    assert status_field(p.pid, "Mems_allowed_list") == "0"
    memdir = v1.mounts["memory"] / v1.parent / "job-a"
    assert (memdir / "memory.limit_in_bytes").read_text().strip() == str(256 << 20)
    assert v1.limits("job-a") == GroupLimits(
        cpus=(HI,), memory_bytes=256 << 20, cpu_quota_cores=0.5
    )

    v1.update("job-a", GroupLimits(cpus=(LO,), memory_bytes=128 << 20))
    assert status_field(p.pid, "Cpus_allowed_list") == str(LO)
    assert v1.limits("job-a") == GroupLimits(cpus=(LO,), memory_bytes=128 << 20)
    assert p.poll() is None  # re-pinned live, not restarted


@needs_two_cpus
def test_v1_update_repins_every_thread(v1: V1CgroupManager, procs) -> None:
    both = f"{LO}-{HI}" if HI == LO + 1 else f"{LO},{HI}"
    v1.create("job-a", GroupLimits(cpus=(LO, HI)))
    files = v1.attach_files("job-a")
    # joins before exec; one thread pins itself to HI; a child is forked after joining
    p = procs(spawn_threaded(4, own_cpu=HI, with_child=True, preexec_fn=lambda: join_group(files)))
    members = v1.pids("job-a")
    assert p.pid in members and len(members) == 2  # the worker and its sleep child
    child = next(m for m in members if m != p.pid)
    before = thread_cpus(p.pid)
    assert len(before) == 5 and sorted(before.values()).count(str(HI)) == 1

    v1.update("job-a", GroupLimits(cpus=(LO,)))
    assert set(thread_cpus(p.pid).values()) == {str(LO)}
    assert set(thread_cpus(child).values()) == {str(LO)}
    v1.update("job-a", GroupLimits(cpus=(HI,)))
    assert set(thread_cpus(p.pid).values()) == {str(HI)}
    assert set(thread_cpus(child).values()) == {str(HI)}
    v1.update("job-a", GroupLimits(cpus=(LO, HI)))
    after = thread_cpus(p.pid)
    # widening hands the new CPUs to every thread, except that kernels >= 6.2 give a thread
    # that pinned itself its own choice back when it fits the group again
    assert after[p.pid] == both
    assert set(after.values()) <= {both, str(HI)}
    assert list(after.values()).count(both) >= 4
    assert set(thread_cpus(child).values()) == {both}


@needs_v1
def test_v1_restarted_manager_readopts(v1: V1CgroupManager, procs) -> None:
    lim = GroupLimits(cpus=(HI,), memory_bytes=64 << 20)
    v1.create("job-a", lim)
    v1.create("job-b", GroupLimits(cpus=(LO,)))
    p = procs(spawn_sleeper())
    v1.add_pid("job-a", p.pid)
    again = detect_cgroups(v1.parent)  # a restarted noded
    assert again.list_jobs() == ["job-a", "job-b"]
    assert again.pids("job-a") == [p.pid]
    assert again.limits("job-a") == lim


@needs_v1
def test_v1_signal_all_then_remove(v1: V1CgroupManager, procs) -> None:
    v1.create("job-a", GroupLimits(cpus=(LO,)))
    files = v1.attach_files("job-a")
    ps = [procs(spawn_sleeper(preexec_fn=lambda: join_group(files))) for _ in range(3)]
    assert v1.pids("job-a") == sorted(p.pid for p in ps)
    with pytest.raises(GroupBusyError, match="still has processes"):
        v1.remove("job-a")
    with pytest.raises(GroupBusyError, match="still has job groups"):
        v1.remove_parent()
    assert v1.signal_all("job-a", signal.SIGTERM) == 3
    for p in ps:
        assert p.wait(timeout=5) == -signal.SIGTERM
    assert v1.pids("job-a") == []
    v1.remove("job-a")
    assert v1.list_jobs() == []
    v1.remove_parent()
    for mount in v1.mounts.values():
        assert not (mount / v1.parent).exists()


@needs_v1
def test_v1_add_missing_pid(v1: V1CgroupManager) -> None:
    v1.create("job-a", GroupLimits(cpus=(LO,)))
    with pytest.raises(ProcessLookupError, match="no such process"):
        v1.add_pid("job-a", 4194303)


# -- cgroup v2 (this machine's mount delegates no cpuset/cpu/memory) ---------------------------


@needs_v2
def test_v2_groups_and_membership_on_the_real_mount(v2: V2CgroupManager, procs) -> None:
    v2.create("job-a", GroupLimits(cpus=(LO,)))
    assert (v2.mount / v2.parent / "job-a").is_dir()
    p = procs(spawn_sleeper())
    v2.add_pid("job-a", p.pid)
    assert cgroup_of(p.pid)[""] == f"/{v2.parent}/job-a"
    files = v2.attach_files("job-a")
    q = procs(spawn_sleeper(preexec_fn=lambda: join_group(files)))
    assert v2.pids("job-a") == sorted([p.pid, q.pid])

    again = V2CgroupManager(v2.parent, v2.mount, require_cpuset=False)
    assert again.list_jobs() == ["job-a"]
    assert again.pids("job-a") == sorted([p.pid, q.pid])
    with pytest.raises(GroupBusyError, match="still has processes"):
        again.remove("job-a")
    assert again.signal_all("job-a", signal.SIGKILL) == 2
    p.wait(timeout=5)
    q.wait(timeout=5)
    assert wait_gone(p.pid) and wait_gone(q.pid)
    assert again.pids("job-a") == []
    again.remove("job-a")
    again.remove_parent()
    assert not (v2.mount / v2.parent).exists()


@needs_v2
def test_v2_detection_matches_what_the_mount_delegates(unique_name: str) -> None:
    assert MOUNTS.v2 is not None
    offered = (MOUNTS.v2 / "cgroup.controllers").read_text().split()
    if "cpuset" in offered:
        assert detect_cgroups(unique_name, prefer="v2").kind == "v2"
    else:
        with pytest.raises(CgroupUnavailableError, match="does not delegate the cpuset"):
            detect_cgroups(unique_name, prefer="v2")
        with pytest.raises(CgroupUnavailableError, match="does not delegate the cpuset"):
            V2CgroupManager(unique_name, MOUNTS.v2)
    assert not (MOUNTS.v2 / unique_name).exists()
