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
