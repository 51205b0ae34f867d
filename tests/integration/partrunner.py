"""A real JobRunner on a temporary state directory, for tests that run job parts as root
(CPU affinity as the confinement, one emulated GPU); every part still running is killed on
the way out."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

from noded.cgroups import detect_cgroups
from noded.gpu.emulated import EmulatedGpuBackend, EmulatedGpuConfig
from noded.jobs import JobRunner


@contextlib.contextmanager
def part_runner(state: Path, name: str) -> Iterator[JobRunner]:
    """``name``: the tail of the affinity group's parent (``trellis-test-NAME-PID``)."""
    state.mkdir(parents=True, exist_ok=True)
    cgroups = detect_cgroups(f"trellis-test-{name}-{os.getpid()}", prefer="affinity",
                             state_dir=state / "cgroups")
    gpus = EmulatedGpuBackend(EmulatedGpuConfig(count=1, uuid_seed="n1"))
    runner = JobRunner("n1", state, cgroups, gpus, allow_root_jobs=True, numa_of={0: 0})
    try:
        yield runner
    finally:
        for part in list(runner.parts.values()):
            if part.state == "running":
                runner._signal(part, signal.SIGKILL)
        gpus.close()
