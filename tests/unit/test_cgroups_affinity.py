"""The affinity fallback on real processes and real sched_setaffinity (no root needed)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from noded.cgroups import (
    AffinityManager,
    CgroupError,
    GroupBusyError,
    GroupLimits,
    GroupNotFoundError,
    LimitsError,
    format_cpu_list,
)
from tests.unit.cgroups_procs import (
    children_of,
    procs,
    spawn_sleeper,
    spawn_threaded,
    thread_cpus,
    wait_gone,
)

__all__ = ["procs"]

PARENT = "trellis-node1"
AVAIL = sorted(os.sched_getaffinity(0))
needs_two_cpus = pytest.mark.skipif(len(AVAIL) < 2, reason="needs two usable CPUs to re-pin")
A, B = (AVAIL[0], AVAIL[-1])


@needs_two_cpus
def test_every_thread_and_child_follows_a_live_update(tmp_path: Path, procs) -> None:
    m = AffinityManager(PARENT, tmp_path)
    m.create("job-a", GroupLimits(cpus=(A,)))
    # one thread pinned itself to B: a re-pin must override that too
    p = procs(spawn_threaded(4, own_cpu=B, with_child=True))
    assert len(thread_cpus(p.pid)) == 5
    m.add_pid("job-a", p.pid)
    kids = children_of(p.pid)
    assert len(kids) == 1
    assert sorted(m.pids("job-a")) == sorted([p.pid, *kids])
    assert set(thread_cpus(p.pid).values()) == {str(A)}
    assert set(thread_cpus(kids[0]).values()) == {str(A)}

    m.update("job-a", GroupLimits(cpus=(B,)))
    assert set(thread_cpus(p.pid).values()) == {str(B)}
    assert set(thread_cpus(kids[0]).values()) == {str(B)}
    both = format_cpu_list((A, B))
    m.update("job-a", GroupLimits(cpus=(A, B)))
    assert set(thread_cpus(p.pid).values()) == {both}
    assert m.limits("job-a") == GroupLimits(cpus=(A, B))


@needs_two_cpus
def test_restarted_manager_finds_jobs_and_pids(tmp_path: Path, procs) -> None:
    m = AffinityManager(PARENT, tmp_path)
    lim = GroupLimits(cpus=(B,), memory_bytes=1 << 30)  # memory recorded, not enforced
    m.create("job-a", lim)
    p = procs(spawn_sleeper())
    m.add_pid("job-a", p.pid)
    again = AffinityManager(PARENT, tmp_path)
    assert again.list_jobs() == ["job-a"]
    assert again.pids("job-a") == [p.pid]
    assert again.limits("job-a") == lim
    again.update("job-a", GroupLimits(cpus=(A,)))
    assert set(thread_cpus(p.pid).values()) == {str(A)}
    # another noded's state is separate
    assert AffinityManager("trellis-node2", tmp_path).list_jobs() == []


def test_recycled_pid_is_not_a_member(tmp_path: Path, procs) -> None:
    m = AffinityManager(PARENT, tmp_path)
    m.create("job-a", GroupLimits(cpus=(A,)))
    p = procs(spawn_sleeper())
    m.add_pid("job-a", p.pid)
    state = json.loads(m.state_file.read_text())
    state["jobs"]["job-a"]["members"][str(p.pid)] -= 1000.0  # as if an older process had it
    m.state_file.write_text(json.dumps(state))
    assert AffinityManager(PARENT, tmp_path).pids("job-a") == []


def test_signal_all_and_remove(tmp_path: Path, procs) -> None:
    m = AffinityManager(PARENT, tmp_path)
    m.create("job-a", GroupLimits(cpus=(A,)))
    p = procs(spawn_threaded(2, with_child=True))
    m.add_pid("job-a", p.pid)
    kid = children_of(p.pid)[0]
    with pytest.raises(GroupBusyError, match="still has processes"):
        m.remove("job-a")
    with pytest.raises(GroupBusyError, match=r"still tracks jobs \['job-a'\]"):
        m.remove_parent()
    assert m.signal_all("job-a", signal.SIGKILL) == 2
    p.wait(timeout=5)
    assert wait_gone(kid)
    assert m.pids("job-a") == []
    m.remove("job-a")
    m.remove("job-a")
    assert m.list_jobs() == []
    m.remove_parent()
    assert not m.state_file.exists()


def test_move_between_jobs(tmp_path: Path, procs) -> None:
    m = AffinityManager(PARENT, tmp_path)
    m.create("job-a", GroupLimits(cpus=(A,)))
    m.create("job-b", GroupLimits(cpus=(B,)))
    p = procs(spawn_sleeper())
    m.add_pid("job-a", p.pid)
    m.add_pid("job-b", p.pid)
    assert m.pids("job-a") == []
    assert m.pids("job-b") == [p.pid]
    assert set(thread_cpus(p.pid).values()) == {str(B)}


def test_errors_are_clear(tmp_path: Path) -> None:
    m = AffinityManager(PARENT, tmp_path)
    with pytest.raises(GroupNotFoundError, match="job 'nope' is not tracked"):
        m.update("nope", GroupLimits(cpus=(A,)))
    with pytest.raises(LimitsError, match="cpus 4000 not available to job 'job-a'"):
        m.create("job-a", GroupLimits(cpus=(4000,)))
    m.create("job-a", GroupLimits(cpus=(A,)))
    assert m.attach_files("job-a") == []
    with pytest.raises(ProcessLookupError, match="cannot add pid 4194303"):
        m.add_pid("job-a", 4194303)


def test_corrupt_state_is_reported_not_dropped(tmp_path: Path) -> None:
    (tmp_path / f"{PARENT}.affinity.json").write_text("{not json")
    with pytest.raises(CgroupError, match="cannot read affinity state"):
        AffinityManager(PARENT, tmp_path)
    (tmp_path / f"{PARENT}.affinity.json").write_text(
        json.dumps(
            {"version": 1, "parent": PARENT, "jobs": {"../x": {"limits": {}, "members": {}}}}
        )
    )
    with pytest.raises(CgroupError, match=r"malformed: job id '\.\./x' is not a valid name"):
        AffinityManager(PARENT, tmp_path)
