"""Control and monitor group lifecycle, name validation, and mkdir failures."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rdt import (
    GroupNotFound,
    InvalidGroupName,
    KernelRejected,
    LockTimeout,
    OutOfClosids,
    OutOfRmids,
    Resctrl,
    RmidsInLimbo,
    check_group_name,
    group_for_job,
)
from rdt.emulated import EmulatedFs, build_tree, drain_limbo, open_resctrl, set_counter
from shared.kernelfs import KernelWriter


@pytest.fixture
def rc(tmp_path: Path) -> Resctrl:
    return open_resctrl(build_tree(tmp_path / "resctrl", "full").root)


def test_group_lifecycle(rc: Resctrl) -> None:
    assert rc.groups() == []
    assert rc.create_group("trellis-a") is True
    assert rc.create_group("trellis-a") is False  # idempotent
    assert rc.create_group("trellis-b") is True
    assert rc.groups() == ["trellis-a", "trellis-b"]
    group = rc.root / "trellis-a"
    for name in ("schemata", "tasks", "cpus", "mode", "mon_groups"):
        assert (group / name).exists(), name
    assert sorted(os.listdir(group / "mon_data")) == ["mon_L3_00", "mon_L3_01"]
    assert rc.schemata("trellis-a").get("L3") == {0: 0x7FF, 1: 0x7FF}
    assert rc.schemata("trellis-a").get("MB") == {0: 100, 1: 100}
    assert rc.remove_group("trellis-a") is True
    assert rc.remove_group("trellis-a") is False
    assert rc.groups() == ["trellis-b"] and not group.exists()


def test_monitor_groups(rc: Resctrl) -> None:
    rc.create_group("trellis-a")
    assert rc.create_mon_group("trellis-m1", "trellis-a") is True
    assert rc.create_mon_group("trellis-m2", "trellis-a") is True
    assert rc.create_mon_group("trellis-m1", "trellis-a") is False
    assert rc.mon_groups("trellis-a") == ["trellis-m1", "trellis-m2"]
    assert rc.read_mbm("trellis-a", "trellis-m1") == {0: 0, 1: 0}
    assert rc.remove_mon_group("trellis-m2", "trellis-a") is True
    assert rc.mon_groups("trellis-a") == ["trellis-m1"]
    with pytest.raises(GroupNotFound):
        rc.create_mon_group("trellis-m", "trellis-nope")
    rc.remove_group("trellis-a")  # takes its monitor groups with it
    assert not (rc.root / "trellis-a").exists()


def test_foreign_groups_are_never_listed_or_touched(rc: Resctrl) -> None:
    rc.fs.mkdir(rc.root / "someone-else", what="another tool's group")
    rc.create_group("trellis-a")
    assert rc.groups() == ["trellis-a"]
    assert rc.all_groups() == ["someone-else", "trellis-a"]
    with pytest.raises(InvalidGroupName):
        rc.remove_group("someone-else")
    assert (rc.root / "someone-else").is_dir()


BAD_NAMES = [
    "..",
    "../etc",
    "trellis-../x",
    "trellis-a/b",
    "trellis-a\0b",
    "trellis-a\n",
    "trellis-" + "a" * 64,
    "x" * 300,
    "job1",
    "",
    "trellis-",
    "trellis-.hidden",
    "trellis-a b",
    "info",
    "mon_groups",
    "Trellis-a",
]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_bad_names_are_refused_before_any_path_is_touched(rc: Resctrl, name: str) -> None:
    before = sorted(os.listdir(rc.root))
    for call in (
        lambda: rc.create_group(name),
        lambda: rc.remove_group(name),
        lambda: rc.set_mb(name, 50),
        lambda: rc.assign_pid(name, os.getpid()),
        lambda: rc.create_mon_group(name),
        lambda: rc.read_mbm(name),
    ):
        with pytest.raises(InvalidGroupName, match=r"invalid|must be"):
            call()
    assert sorted(os.listdir(rc.root)) == before
    assert rc.writer.writes == 0


def test_non_string_names_are_refused(rc: Resctrl) -> None:
    with pytest.raises(InvalidGroupName, match="must be a string"):
        rc.create_group(7)  # type: ignore[arg-type]


def test_name_helpers() -> None:
    assert check_group_name("trellis-job_1") == "trellis-job_1"
    assert check_group_name("trellis-" + "a" * 63)  # the longest allowed
    assert group_for_job("resnet-50") == "trellis-resnet-50"
    with pytest.raises(InvalidGroupName):
        group_for_job("../x")
    with pytest.raises(ValueError):  # InvalidGroupName is also a ValueError
        group_for_job("a/b")


def test_out_of_closids_names_the_count(tmp_path: Path) -> None:
    rc = open_resctrl(build_tree(tmp_path / "r", "few_closids").root)
    for i in range(3):  # the default group holds the fourth CLOSID
        rc.create_group(f"trellis-g{i}")
    with pytest.raises(OutOfClosids, match=r"out of CLOSIDs \(4 in use of 4\)"):
        rc.create_group("trellis-g3")
    assert not (rc.root / "trellis-g3").exists()
    assert "Out of CLOSIDs" in rc.last_cmd_status()
    rc.remove_group("trellis-g0")
    assert rc.create_group("trellis-g3") is True


def test_foreign_groups_count_against_closids(tmp_path: Path) -> None:
    rc = open_resctrl(build_tree(tmp_path / "r", "few_closids").root)
    rc.fs.mkdir(rc.root / "other", what="another tool")
    rc.create_group("trellis-a")
    rc.create_group("trellis-b")
    with pytest.raises(OutOfClosids, match="4 in use"):
        rc.create_group("trellis-c")


def test_out_of_rmids(tmp_path: Path) -> None:
    rc = open_resctrl(build_tree(tmp_path / "r", "full", num_rmids=4).root)
    rc.create_group("trellis-a")
    rc.create_mon_group("trellis-m", "trellis-a")
    rc.create_mon_group("trellis-n")  # under the default group: root, a, m, n = 4 RMIDs
    with pytest.raises(OutOfRmids, match=r"out of RMIDs \(4 in use of 4\)"):
        rc.create_mon_group("trellis-o", "trellis-a")
    with pytest.raises(OutOfRmids):  # a control group needs an RMID too
        rc.create_group("trellis-b")


def test_rmids_in_limbo_then_drained(tmp_path: Path) -> None:
    tree = build_tree(tmp_path / "r", "full", num_rmids=2)
    rc = open_resctrl(tree.root)
    rc.create_group("trellis-a")
    # The group still has cache lines tagged with its RMID when removed: the RMID goes to limbo.
    set_counter(tree.root, "trellis-a", 0, "llc_occupancy", 8 << 20)
    rc.remove_group("trellis-a")
    with pytest.raises(RmidsInLimbo, match="RMIDs still in limbo"):
        rc.create_group("trellis-b")
    drain_limbo(tree.root)
    assert rc.create_group("trellis-b") is True


def test_a_file_in_the_way_is_reported(rc: Resctrl) -> None:
    (rc.root / "trellis-file").write_text("")
    with pytest.raises(KernelRejected, match="file is in the way"):
        rc.create_group("trellis-file")


def test_two_handles_share_one_emulated_mount(tmp_path: Path) -> None:
    tree = build_tree(tmp_path / "r", "few_closids")
    first, second = open_resctrl(tree.root), open_resctrl(tree.root)
    first.create_group("trellis-a")
    assert second.groups() == ["trellis-a"]
    second.create_group("trellis-b")
    second.create_group("trellis-c")
    with pytest.raises(OutOfClosids):
        first.create_group("trellis-d")


def test_writer_must_cover_the_root(tmp_path: Path) -> None:
    tree = build_tree(tmp_path / "r", "full")
    with pytest.raises(ValueError, match="do not cover"):
        EmulatedFs(tree.root, KernelWriter([tmp_path / "elsewhere"]))


def test_lock_is_reentrant_and_times_out_against_another_process(tmp_path: Path) -> None:
    tree = build_tree(tmp_path / "r", "full")
    rc = Resctrl(tree.root, tree.mounts, fs=EmulatedFs(tree.root, KernelWriter([tree.root])),
                 lock_timeout=0.3)
    with rc.lock():
        assert rc.create_group("trellis-a") is True  # nested lock: no self-deadlock
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import fcntl, os, sys, time\n"
         "fd = os.open(sys.argv[1], os.O_RDONLY)\n"
         "fcntl.flock(fd, fcntl.LOCK_EX)\n"
         "print('locked', flush=True)\n"
         "time.sleep(30)\n",
         str(tree.root)],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        with pytest.raises(LockTimeout, match="flock"):
            rc.create_group("trellis-b")
    finally:
        holder.kill()
        holder.wait()
    assert rc.create_group("trellis-b") is True  # released with the process
