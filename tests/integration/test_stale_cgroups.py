"""Cgroups a killed run left are swept at the next run's start; live or new ones are not."""

from __future__ import annotations

import contextlib
import subprocess
import uuid
from pathlib import Path

import pytest

from demo.harness import sweep_stale_cgroups
from noded.cgroups.mounts import find_mounts
from tests.conftest import needs_root

pytestmark = needs_root


def test_empty_old_groups_go_and_groups_with_a_process_stay() -> None:
    mounts = find_mounts()
    hierarchy = mounts.v2 or mounts.v1.get("cpu")
    if hierarchy is None:
        pytest.skip("no cgroup hierarchy mounted under /sys/fs/cgroup")
    prefix = f"trellis-test-{uuid.uuid4().hex[:8]}-"
    dead, live = hierarchy / f"{prefix}dead", hierarchy / f"{prefix}live"
    made: list[Path] = [dead, dead / "job-1", live]
    proc = None
    try:
        for group in made:
            group.mkdir()
        proc = subprocess.Popen(["sleep", "30"])
        (live / "cgroup.procs").write_text(str(proc.pid))
        # Made a moment ago: it may be another run's, just created.
        assert sweep_stale_cgroups(prefix) == []
        assert dead.is_dir()
        assert sweep_stale_cgroups(prefix, min_age_s=0) == [dead / "job-1", dead]
        assert not dead.exists() and live.is_dir()
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()  # an exited process leaves its cgroup
        for group in reversed(made):
            with contextlib.suppress(FileNotFoundError):
                group.rmdir()
