"""Names that reach a cgroup path are refused with a clear error, on every backend."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from noded.cgroups import (
    AffinityManager,
    CgroupError,
    CgroupManager,
    GroupLimits,
    V1CgroupManager,
    V2CgroupManager,
    detect_cgroups,
    find_mounts,
)
from shared.kernelfs import KernelWriter
from tests.unit.cgroups_tree import ALL_V1, ALL_V2, EmulatedCgroupFs

BAD_NAMES = ["", "..", "../etc", "a/b", "x\0y", ".hidden", "-dash", "a" * 64, "sp ace", "é"]
LIM = GroupLimits(cpus=(0,))


def managers(tmp_path: Path) -> list:
    v1fs = EmulatedCgroupFs(tmp_path / "v1", v1=ALL_V1)
    v2fs = EmulatedCgroupFs(tmp_path / "v2", v2=ALL_V2)
    return [
        V1CgroupManager("trellis-node1", {c: v1fs.base / c for c in ALL_V1}, v1fs),
        V2CgroupManager("trellis-node1", v2fs.base, v2fs),
        AffinityManager("trellis-node1", tmp_path / "state"),
    ]


def entries(tree: Path) -> set[Path]:
    return set(tree.rglob("*"))


def test_every_backend_implements_the_protocol(tmp_path: Path) -> None:
    kinds = []
    for m in managers(tmp_path):
        assert isinstance(m, CgroupManager)
        kinds.append(m.kind)
    assert kinds == ["v1", "v2", "affinity"]


@pytest.mark.parametrize("bad", BAD_NAMES)
def test_bad_job_ids_refused_everywhere(tmp_path: Path, bad: str) -> None:
    ms = managers(tmp_path)
    before = entries(tmp_path)
    calls: list[Callable[[object], object]] = [
        lambda m: m.create(bad, LIM),
        lambda m: m.update(bad, LIM),
        lambda m: m.attach_files(bad),
        lambda m: m.add_pid(bad, os.getpid()),
        lambda m: m.pids(bad),
        lambda m: m.limits(bad),
        lambda m: m.signal_all(bad, 0),
        lambda m: m.remove(bad),
    ]
    for m in ms:
        for call in calls:
            with pytest.raises(ValueError, match=r"job id .* is not a valid name"):
                call(m)
    assert entries(tmp_path) == before  # nothing was created anywhere


@pytest.mark.parametrize("bad", BAD_NAMES)
def test_bad_parent_names_refused(tmp_path: Path, bad: str) -> None:
    fs = EmulatedCgroupFs(tmp_path / "cg", v1=ALL_V1, v2=ALL_V2)
    with pytest.raises(ValueError, match=r"cgroup parent name .* is not a valid name"):
        detect_cgroups(bad, fs, root=fs.base, mounts_file=fs.mounts_file)
    with pytest.raises(ValueError, match="cgroup parent name"):
        V1CgroupManager(bad, {"cpuset": fs.base / "cpuset"}, fs)
    with pytest.raises(ValueError, match="cgroup parent name"):
        V2CgroupManager(bad, fs.base / "unified", fs)
    with pytest.raises(ValueError, match="cgroup parent name"):
        AffinityManager(bad, tmp_path / "state")


@pytest.mark.parametrize("pid", [0, -1, True, "12", 1.0])
def test_bad_pids_refused(tmp_path: Path, pid: object) -> None:
    for m in managers(tmp_path):
        m.create("job-a", LIM)
        with pytest.raises(ValueError, match="pid must be a positive integer"):
            m.add_pid("job-a", pid)  # type: ignore[arg-type]


def test_unknown_prefer_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="prefer='v3' is not one of v1, v2, affinity"):
        detect_cgroups("trellis-node1", prefer="v3", state_dir=tmp_path)


def test_writer_must_cover_the_mounts(tmp_path: Path) -> None:
    fs = EmulatedCgroupFs(tmp_path / "cg", v1=ALL_V1)
    elsewhere = KernelWriter([tmp_path / "other"])
    with pytest.raises(CgroupError, match="do not include the cgroup mount"):
        V1CgroupManager("trellis-node1", {c: fs.base / c for c in ALL_V1}, elsewhere)


def test_find_mounts_parses_options_and_escapes(tmp_path: Path) -> None:
    mounts = tmp_path / "mounts"
    mounts.write_text(
        "proc /proc proc rw 0 0\n"
        "cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,nosuid,cpu,cpuacct 0 0\n"
        "cgroup /sys/fs/cgroup/cpuset cgroup rw,cpuset 0 0\n"
        "cgroup /sys/fs/cgroup/net_cls,net_prio cgroup rw,net_cls,net_prio 0 0\n"
        "cgroup2 /sys/fs/cgroup/uni\\040fied cgroup2 rw 0 0\n"
        "cgroup /elsewhere/memory cgroup rw,memory 0 0\n"
    )
    found = find_mounts(Path("/sys/fs/cgroup"), mounts)
    assert found.v1 == {
        "cpu": Path("/sys/fs/cgroup/cpu,cpuacct"),
        "cpuset": Path("/sys/fs/cgroup/cpuset"),
        "net_cls": Path("/sys/fs/cgroup/net_cls,net_prio"),
    }
    assert found.v2 == Path("/sys/fs/cgroup/uni fied")
    assert find_mounts(Path("/sys/fs/cgroup"), tmp_path / "absent").v1 == {}
