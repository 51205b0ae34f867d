"""A stop that comes right after a start reaches the job's process: the start is acknowledged
only once the shim has forked it (JobRunner.until_forked). Before, a stop between the shim's
spawn and its fork signalled nobody, and the job ran on until the grace's SIGKILL (found by
the chaos soak: a cancelled job started after the cancel's acknowledgement)."""

from __future__ import annotations

import dataclasses
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from noded.jobs import JobRunner, _child_pid
from shared.messages import PrepareJob, StartJob
from tests.integration.partrunner import part_runner
from tests.unit.master_fakes import until
from tests.unit.test_fencing import ALLOC, SPEC

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs job parts as root")

GRACE_S = 20.0


@pytest.fixture
def runner(tmp_path: Path) -> Iterator[JobRunner]:
    with part_runner(tmp_path / "state", "stopstart") as runner:
        yield runner


async def test_a_stop_right_after_the_start_is_acknowledged_reaches_the_job(
        runner: JobRunner) -> None:
    spec = dataclasses.replace(SPEC, command=("sleep", "600"))
    runner.prepare(PrepareJob(job_id="quick", spec=spec, allocation=ALLOC, grace_s=GRACE_S))
    runner.start(StartJob(job_id="quick", master_addr="127.0.0.1", master_port=1))
    await runner.until_forked("quick")
    part = runner.parts["quick"]
    assert _child_pid(part.dir) is not None  # the job's process exists when start answers
    runner.stop("quick", GRACE_S, "cancelled")
    await until("the job stopped", lambda: part.state == "exited", GRACE_S / 2)
    assert part.signal == signal.SIGTERM  # by the stop, not by the grace's SIGKILL


async def test_a_stop_sent_again_does_not_redo_what_comes_before_the_first_signal(
        runner: JobRunner) -> None:
    """The master sends a preempted part's stop again when its start is reported late; the
    notice written before the warning signal was rewritten then (truncated, written) while
    the job's trap read it, which read it empty (found by bench/controls.py beside a CPU
    hog: 4 victims of 80 unwarned). What comes before the first signal runs once."""
    spec = dataclasses.replace(SPEC, command=("sleep", "600"))
    runner.prepare(PrepareJob(job_id="twice", spec=spec, allocation=ALLOC, grace_s=GRACE_S))
    runner.start(StartJob(job_id="twice", master_addr="127.0.0.1", master_port=1))
    await runner.until_forked("twice")
    notes: list[str] = []
    for _ in range(2):
        runner.stop("twice", GRACE_S, "preempted", warning="SIGTERM",
                    before=lambda: notes.append("note"))
    part = runner.parts["twice"]
    await until("the job stopped", lambda: part.state == "exited", GRACE_S / 2)
    assert notes == ["note"]


async def test_a_group_still_busy_at_the_exit_is_removed_later_and_the_exit_is_reported(
        runner: JobRunner, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by the soak: a container job's killed processes had not left its cgroup when
    the shim exited; the removal raised GroupBusyError out of the exit's collection, the
    part's exit was never reported and its group stayed behind."""
    from noded.cgroups import GroupBusyError

    real_remove = runner.cgroups.remove
    busy = [2]  # the first two removals find the group busy

    def remove(job_id: str) -> None:
        if busy[0]:
            busy[0] -= 1
            raise GroupBusyError(f"job {job_id!r} still has processes [1]", [1])
        real_remove(job_id)

    monkeypatch.setattr(runner.cgroups, "remove", remove)
    exits: list[str] = []

    async def on_exited(part: object) -> None:
        exits.append(getattr(part, "job_id", ""))

    runner.on_exited = on_exited
    spec = dataclasses.replace(SPEC, command=("true",))
    runner.prepare(PrepareJob(job_id="busy", spec=spec, allocation=ALLOC, grace_s=1.0))
    runner.start(StartJob(job_id="busy", master_addr="127.0.0.1", master_port=1))
    await until("the exit reported", lambda: exits == ["busy"], 30)
    await until("the group removed", lambda: busy[0] == 0
                and "busy" not in runner.cgroups.list_jobs(), 30)


def test_a_part_whose_prepare_was_cut_short_is_dropped_on_restart(tmp_path: Path) -> None:
    """noded killed between creating a part's cgroup and writing its prepare.json (found by
    the soak): the restarted noded removes the group and the directory instead of ignoring
    them forever; a directory whose shim once ran is left alone."""
    state = tmp_path / "state"
    with part_runner(state, "cutshort") as first:
        spec = dataclasses.replace(SPEC, command=("true",))
        first.prepare(PrepareJob(job_id="cut", spec=spec, allocation=ALLOC, grace_s=1.0))
        (first.dir / "cut" / "prepare.json").unlink()  # as if noded died before writing it
        (first.dir / "ran").mkdir()
        (first.dir / "ran" / "shim.json").write_text("{}")
        assert "cut" in first.cgroups.list_jobs()
    with part_runner(state, "cutshort") as again:
        again.adopt()
        assert not (again.dir / "cut").exists()
        assert "cut" not in again.cgroups.list_jobs()
        assert (again.dir / "ran").exists()  # a shim ran there: left, and logged


def test_an_image_jobs_start_waits_for_its_container(tmp_path: Path) -> None:
    """An image job's process is its container, which podman starts after the shim's fork:
    its start is ready once podman's pidfile exists, or its launch failed (the soak saw a
    container start after the cancel was acknowledged). A host job needs nothing more."""
    from noded.containers.launch import CONTAINER_PIDFILE, ERROR_FILE
    from noded.containers.launcher import ContainerLauncher
    from noded.jobs import JobPart
    from shared.model import LaunchSpec

    image = dataclasses.replace(SPEC, launch=LaunchSpec(image="registry.test/x:1"))
    for name in ("img", "host"):
        (tmp_path / name).mkdir()
    img = JobPart("img", PrepareJob(job_id="img", spec=image, allocation=ALLOC),
                  tmp_path / "img")
    host = JobPart("host", PrepareJob(job_id="host", spec=SPEC, allocation=ALLOC),
                   tmp_path / "host")
    assert ContainerLauncher.running(host)
    assert not ContainerLauncher.running(img)
    (img.dir / CONTAINER_PIDFILE).write_text("4242\n")
    assert ContainerLauncher.running(img)
    (img.dir / CONTAINER_PIDFILE).unlink()
    (img.dir / ERROR_FILE).write_text("{}")
    assert ContainerLauncher.running(img)
