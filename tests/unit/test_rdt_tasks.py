"""Assigning a real process's threads to groups: one id per write, new threads picked up."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rdt import InvalidValue, ProcessNotFound, Resctrl
from rdt.emulated import EmulatedFs, build_tree, open_resctrl
from shared.kernelfs import KernelWriteError, KernelWriter

THREADED = """
import sys, threading
stop = threading.Event()
def start():
    threading.Thread(target=stop.wait, daemon=True).start()
for _ in range(3):
    start()
print("ready", flush=True)
for line in sys.stdin:
    if line.strip() == "spawn":
        start()
        print("spawned", flush=True)
"""


@pytest.fixture
def threaded() -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", THREADED], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        yield proc
    finally:
        proc.kill()
        proc.wait()


def _tids(pid: int) -> list[int]:
    return sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))


def _spawn(proc: subprocess.Popen[str]) -> None:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("spawn\n")
    proc.stdin.flush()
    assert proc.stdout.readline().strip() == "spawned"


@pytest.fixture
def rc(tmp_path: Path) -> Resctrl:
    rc = open_resctrl(build_tree(tmp_path / "resctrl", "full").root)
    rc.create_group("trellis-a")
    return rc


def test_every_thread_is_written_one_id_at_a_time(
    rc: Resctrl, threaded: subprocess.Popen[str]
) -> None:
    tids = _tids(threaded.pid)
    assert len(tids) == 4 and threaded.pid in tids
    assert rc.assign_pid("trellis-a", threaded.pid) == tids
    assert rc.writer.writes == 4  # one write per thread id, as the kernel requires
    assert sorted(rc.tasks("trellis-a")) == tids


def test_reassign_picks_up_only_new_threads(rc: Resctrl, threaded: subprocess.Popen[str]) -> None:
    before = _tids(threaded.pid)
    rc.assign_pid("trellis-a", threaded.pid)
    _spawn(threaded)
    new = sorted(set(_tids(threaded.pid)) - set(before))
    assert len(new) == 1
    writes = rc.writer.writes
    assert rc.assign_pid("trellis-a", threaded.pid) == new
    assert rc.writer.writes == writes + 1
    assert rc.assign_pid("trellis-a", threaded.pid) == []  # nothing new: nothing written
    assert sorted(rc.tasks("trellis-a")) == _tids(threaded.pid)


def test_moving_between_groups_and_back_on_removal(
    rc: Resctrl, threaded: subprocess.Popen[str]
) -> None:
    tids = _tids(threaded.pid)
    rc.assign_pid("trellis-a", threaded.pid)
    rc.create_group("trellis-b")
    rc.assign_pid("trellis-b", threaded.pid)
    assert rc.tasks("trellis-a") == [] and sorted(rc.tasks("trellis-b")) == tids
    rc.remove_group("trellis-b")
    assert sorted(rc.tasks(None)) == tids  # back in the default group


def test_monitor_group_assignment(rc: Resctrl, threaded: subprocess.Popen[str]) -> None:
    rc.create_mon_group("trellis-m", "trellis-a")
    tids = _tids(threaded.pid)
    assert rc.assign_pid("trellis-a", threaded.pid, mon_group="trellis-m") == tids
    assert sorted(rc.tasks("trellis-a")) == tids
    assert sorted(rc.tasks("trellis-a", "trellis-m")) == tids
    # The kernel refuses a task in a monitor group of a control group it is not in.
    rc.create_group("trellis-b")
    rc.create_mon_group("trellis-n", "trellis-b")
    with pytest.raises(KernelWriteError):
        rc.fs.write(rc.root / "trellis-b" / "mon_groups" / "trellis-n" / "tasks",
                    f"{threaded.pid}\n", what="test", compare=False)
    assert rc.last_cmd_status() == "Can't move task to different control group"
    assert rc.tasks("trellis-b", "trellis-n") == []


def test_missing_process_and_bad_pids(rc: Resctrl) -> None:
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    with pytest.raises(ProcessNotFound, match=f"process {pid_max + 1} does not exist"):
        rc.assign_pid("trellis-a", pid_max + 1)
    for bad in (0, -3, "12", True, 1.5):
        with pytest.raises(InvalidValue, match="pid"):
            rc.assign_pid("trellis-a", bad)  # type: ignore[arg-type]
    assert rc.writer.writes == 0


def test_threads_that_exit_before_their_write_are_skipped(
    tmp_path: Path, threaded: subprocess.Popen[str]
) -> None:
    # /proc/PID/task can list a thread that has exited by the time its id is written (ESRCH);
    # a process table with one live and one dead id reproduces that race deterministically.
    tree = build_tree(tmp_path / "resctrl", "full")
    rc = Resctrl(tree.root, tree.mounts, fs=EmulatedFs(tree.root, KernelWriter([tree.root])),
                 proc=tmp_path / "proc")
    rc.create_group("trellis-a")
    dead = int(Path("/proc/sys/kernel/pid_max").read_text()) + 7
    task_dir = tmp_path / "proc" / str(threaded.pid) / "task"
    for tid in (threaded.pid, dead):
        (task_dir / str(tid)).mkdir(parents=True)
    assert rc.assign_pid("trellis-a", threaded.pid) == [threaded.pid]
    assert rc.tasks("trellis-a") == [threaded.pid]
