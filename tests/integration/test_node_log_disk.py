"""A node whose log directory is a disk of its own: an ended part's output is moved there
across the filesystem boundary (a rename cannot cross it), and when that disk is full the
part is still forgotten, its output dropped with a warning (the soak, bench/chaos.py, found
both: forgetting raised EXDEV and the part's state stayed behind)."""

from __future__ import annotations

import dataclasses
import logging
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from noded.jobs import JobRunner
from shared.messages import PrepareJob, StartJob
from tests.integration.partrunner import part_runner
from tests.unit.master_fakes import until
from tests.unit.test_fencing import ALLOC, SPEC

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs and runs a part")


@pytest.fixture
def runner(tmp_path: Path) -> Iterator[JobRunner]:
    state = tmp_path / "state"
    logs = state / "logs"
    logs.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "trellis-test-logdisk",
                    str(logs)], check=True, capture_output=True, timeout=30)
    try:
        with part_runner(state, "logdisk") as runner:
            yield runner
    finally:
        if subprocess.run(["umount", str(logs)], capture_output=True, timeout=30).returncode:
            subprocess.run(["umount", "-l", str(logs)], capture_output=True, timeout=30)


async def run_part(runner: JobRunner, job_id: str, text: str) -> None:
    spec = dataclasses.replace(SPEC, command=("sh", "-c", f"echo {text}"))
    runner.prepare(PrepareJob(job_id=job_id, spec=spec, allocation=ALLOC, grace_s=1.0))
    runner.start(StartJob(job_id=job_id, master_addr="127.0.0.1", master_port=1))
    await until(f"{job_id} exited", lambda: runner.parts[job_id].state == "exited", 30)


async def test_an_ended_parts_output_crosses_to_the_log_disk(runner: JobRunner) -> None:
    await run_part(runner, "crossing", "hello")
    runner.forget("crossing")
    assert "crossing" not in runner.parts
    assert (runner.logs / "crossing.log").read_text() == "hello\n"
    assert not (runner.dir / "crossing").exists()


async def test_a_full_log_disk_drops_the_output_and_still_forgets_the_part(
        runner: JobRunner, caplog: pytest.LogCaptureFixture) -> None:
    await run_part(runner, "dropped", "x" * 1000)
    with open(runner.logs / "filler", "wb", buffering=0) as f, pytest.raises(OSError):
        while True:
            f.write(b"\0" * 4096)
    with caplog.at_level(logging.WARNING, "trellis.node.jobs"):
        runner.forget("dropped")
    assert "dropped" not in runner.parts and not (runner.dir / "dropped").exists()
    assert not (runner.logs / "dropped.log").exists()  # no half-written copy left
    assert "output not kept" in caplog.text
