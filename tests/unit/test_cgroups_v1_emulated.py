"""v1 logic against an emulated v1 tree (runs without root; the real thing is in
tests/integration/test_cgroups_real.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from noded.cgroups import (
    CgroupUnavailableError,
    GroupLimits,
    LimitsError,
    V1CgroupManager,
    detect_cgroups,
)
from tests.unit.cgroups_procs import procs, spawn_sleeper
from tests.unit.cgroups_tree import ALL_V1, ALL_V2, PAGE, EmulatedCgroupFs

__all__ = ["procs"]

PARENT = "trellis-node1"


def text(path: Path) -> str:
    return path.read_text().strip()


def make(
    tmp_path: Path, v1: tuple[str, ...] = ALL_V1, **kw
) -> tuple[EmulatedCgroupFs, V1CgroupManager]:
    fs = EmulatedCgroupFs(tmp_path / "cg", v1=v1, **kw)
    return fs, V1CgroupManager(PARENT, {c: fs.base / c for c in v1}, fs)


def test_parent_cpuset_is_populated_before_the_job(tmp_path: Path, procs) -> None:
    fs, m = make(tmp_path)
    m.create("job-a", GroupLimits(cpus=(1,)))
    cs = fs.base / "cpuset"
    assert text(cs / PARENT / "cpuset.cpus") == "0-1"
    assert text(cs / PARENT / "cpuset.mems") == "0"
    assert text(cs / PARENT / "job-a" / "cpuset.cpus") == "1"
    assert text(cs / PARENT / "job-a" / "cpuset.memory_migrate") == "1"
    p = procs(spawn_sleeper())
    m.add_pid("job-a", p.pid)  # the emulator refuses tasks in an unpopulated cpuset (ENOSPC)
    for ctl in ALL_V1:
        assert text(fs.base / ctl / PARENT / "job-a" / "cgroup.procs") == str(p.pid)
    assert m.pids("job-a") == [p.pid]


def test_unpopulated_cpuset_refuses_tasks_in_the_emulator(tmp_path: Path, procs) -> None:
    # guards the emulator itself: without population the kernel says ENOSPC
    fs, _ = make(tmp_path)
    fs.mkdir(fs.base / "cpuset" / "raw", what="test")
    p = procs(spawn_sleeper())
    with pytest.raises(OSError, match="No space left"):
        fs.write(fs.base / "cpuset" / "raw" / "cgroup.procs", str(p.pid), what="t", compare=False)


def test_limits_written_and_read_back(tmp_path: Path) -> None:
    fs, m = make(tmp_path)
    lim = GroupLimits(
        cpus=(0, 1), memory_bytes=(1 << 30) + 7, cpu_quota_cores=0.25, net_classid=0x10003
    )
    m.create("job-a", lim)
    assert text(fs.base / "memory" / PARENT / "job-a" / "memory.limit_in_bytes") == str(1 << 30)
    assert text(fs.base / "cpu" / PARENT / "job-a" / "cpu.cfs_quota_us") == "25000"
    assert text(fs.base / "net_cls" / PARENT / "job-a" / "net_cls.classid") == str(0x10003)
    assert m.limits("job-a") == GroupLimits(
        cpus=(0, 1), memory_bytes=1 << 30, cpu_quota_cores=0.25, net_classid=0x10003
    )
    m.update("job-a", GroupLimits(cpus=(0,)))
    assert text(fs.base / "memory" / PARENT / "job-a" / "memory.limit_in_bytes") == str(
        (1 << 63) - PAGE
    )
    assert text(fs.base / "cpu" / PARENT / "job-a" / "cpu.cfs_quota_us") == "-1"
    assert m.limits("job-a") == GroupLimits(cpus=(0,))


def test_update_without_change_writes_nothing(tmp_path: Path) -> None:
    fs, m = make(tmp_path)
    lim = GroupLimits(cpus=(1,), memory_bytes=(64 << 20) + 3, cpu_quota_cores=0.5)
    m.create("job-a", lim)
    writes = fs.writes
    m.update("job-a", lim)
    m.create("job-a", lim)
    m.update("job-a", GroupLimits(cpus=(1,)))
    writes_unlimited = fs.writes
    m.update("job-a", GroupLimits(cpus=(1,)))  # "-1" reads back as a huge number: still a no-op
    assert fs.writes == writes_unlimited
    assert writes_unlimited == writes + 2  # memory and quota back to unlimited


def test_narrow_parent_is_widened_for_a_job(tmp_path: Path) -> None:
    fs, m = make(tmp_path, cpus="0-3")
    m.create("job-a", GroupLimits(cpus=(0,)))
    fs.write(fs.base / "cpuset" / PARENT / "cpuset.cpus", "0", what="test: shrink parent")
    m.create("job-b", GroupLimits(cpus=(2, 3)))
    assert text(fs.base / "cpuset" / PARENT / "cpuset.cpus") == "0-3"
    assert m.limits("job-b").cpus == (2, 3)


def test_cpus_beyond_the_root_refused(tmp_path: Path) -> None:
    fs, m = make(tmp_path)
    with pytest.raises(
        LimitsError, match="cpus 4 not available: cgroup parent trellis-node1 has cpus 0-1"
    ):
        m.create("job-a", GroupLimits(cpus=(1, 4)))
    assert not (fs.base / "cpuset" / PARENT / "job-a").exists()


def test_cpuset_v2_mode_reads_effective_sets(tmp_path: Path) -> None:
    fs, m = make(tmp_path, cpuset_v2_mode=True)
    m.create("job-a", GroupLimits(cpus=(1,)))
    # an operator clears the configured list: the job now inherits the parent's effective set
    fs.write(fs.base / "cpuset" / PARENT / "job-a" / "cpuset.cpus", "", what="test: inherit")
    assert text(fs.base / "cpuset" / PARENT / "job-a" / "cpuset.cpus") == ""
    assert m.limits("job-a").cpus == (0, 1)


def test_missing_controllers(tmp_path: Path) -> None:
    fs, m = make(tmp_path, v1=("cpuset",))
    with pytest.raises(CgroupUnavailableError, match="v1 memory controller is not mounted"):
        m.create("job-a", GroupLimits(cpus=(0,), memory_bytes=1 << 30))
    with pytest.raises(CgroupUnavailableError, match="v1 cpu controller is not mounted"):
        m.create("job-a", GroupLimits(cpus=(0,), cpu_quota_cores=1))
    m.create("job-a", GroupLimits(cpus=(0,), net_classid=5))  # classid ignored without net_cls
    assert m.limits("job-a") == GroupLimits(cpus=(0,))
    with pytest.raises(CgroupUnavailableError, match="needs the cpuset hierarchy"):
        V1CgroupManager(PARENT, {"cpu": fs.base / "cpuset"}, fs)


def test_list_jobs_remove_and_parent(tmp_path: Path) -> None:
    fs, m = make(tmp_path)
    m.create("job-a", GroupLimits(cpus=(0,)))
    m.create("job-b", GroupLimits(cpus=(1,)))
    assert V1CgroupManager(PARENT, m.mounts, fs).list_jobs() == ["job-a", "job-b"]
    m.remove("job-a")
    assert m.list_jobs() == ["job-b"]
    for ctl in ALL_V1:
        assert not (fs.base / ctl / PARENT / "job-a").exists()
    m.remove("job-b")
    m.remove_parent()
    for ctl in ALL_V1:
        assert not (fs.base / ctl / PARENT).exists()


def test_detect_prefers_v1_on_a_hybrid_tree(tmp_path: Path) -> None:
    fs = EmulatedCgroupFs(tmp_path / "cg", v1=("cpuset", "cpu", "memory"), v2=ALL_V2)
    m = detect_cgroups(PARENT, fs, root=fs.base, mounts_file=fs.mounts_file)
    assert m.kind == "v1"
    assert (
        detect_cgroups(PARENT, fs, root=fs.base, prefer="v2", mounts_file=fs.mounts_file).kind
        == "v2"
    )
    assert (
        detect_cgroups(
            PARENT,
            fs,
            root=fs.base,
            prefer="affinity",
            mounts_file=fs.mounts_file,
            state_dir=tmp_path / "st",
        ).kind
        == "affinity"
    )


def test_a_container_runtimes_groups_in_other_hierarchies_go_with_the_job(
        tmp_path: Path) -> None:
    """podman, given a job's group as its cgroup parent, makes that path (and a conmon group
    below it) in every v1 hierarchy, blkio and pids too, where noded configures nothing. Left
    there they outlived the job and the node (the chaos soak's nodes left them behind)."""
    fs = EmulatedCgroupFs(tmp_path / "cg", v1=(*ALL_V1, "blkio", "pids"))
    others = (fs.base / "blkio", fs.base / "pids")
    m = V1CgroupManager(PARENT, {c: fs.base / c for c in ALL_V1}, fs, others=others)
    for job in ("job-a", "job-b"):
        m.create(job, GroupLimits(cpus=(1,)))
        for root in others:  # as podman does
            for path in (root / PARENT, root / PARENT / job, root / PARENT / job / "conmon"):
                fs.mkdir(path, what="test: the runtime")
    m.remove("job-a")
    assert not any((root / PARENT / "job-a").exists() for root in others)
    # job-b's own groups went some other way (its processes killed, a node's crash): what
    # the runtime left goes with the parent.
    for ctl in ALL_V1:
        fs.rmdir(fs.base / ctl / PARENT / "job-b", what="test")
    m.remove_parent()
    assert not any((root / PARENT).exists() for root in others)
    assert not (fs.base / "cpuset" / PARENT).exists()


def test_detection_finds_the_hierarchies_it_does_not_manage(tmp_path: Path) -> None:
    from noded.cgroups.mounts import find_mounts

    fs = EmulatedCgroupFs(tmp_path / "cg", v1=(*ALL_V1, "blkio", "pids"))
    mounts = find_mounts(fs.base, fs.mounts_file)
    assert set(mounts.v1) == set(ALL_V1)
    assert set(mounts.v1_others) == {fs.base / "blkio", fs.base / "pids"}
