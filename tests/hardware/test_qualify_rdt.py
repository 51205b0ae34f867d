"""Qualify a real server's Intel RDT: the resctrl contract against /sys/fs/resctrl.

Skips with the reason when resctrl is not mounted (or not root). The group it makes is named
``trellis-test-…`` and removed even when an assertion fails.
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from rdt import Resctrl, detect_resctrl


@pytest.fixture(params=["real", "emulated"])
def resctrl(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Resctrl]:
    """The real /sys/fs/resctrl when mounted; also an emulated tree with the kernel's layout,
    which proves these checks pass where the contract holds."""
    if request.param == "emulated":
        from rdt.emulated import build_tree, open_resctrl

        build_tree(tmp_path / "resctrl", "full")
        yield open_resctrl(tmp_path / "resctrl")
        return
    if os.geteuid() != 0:
        pytest.skip("needs root to create resctrl groups")
    found = detect_resctrl()
    if found is None:
        pytest.skip("resctrl is not mounted at /sys/fs/resctrl (no Intel RDT, or not mounted)")
    yield found


def test_capabilities_are_discovered(resctrl: Resctrl) -> None:
    caps = resctrl.capabilities
    assert caps.l3 or caps.mb or caps.l3_mon, "resctrl is mounted but offers nothing"


def test_group_lifecycle_schemata_tasks_and_monitoring(resctrl: Resctrl) -> None:
    name = f"trellis-test-{uuid.uuid4().hex[:8]}"
    worker = subprocess.Popen(["sh", "-c", "while :; do :; done"])
    try:
        assert resctrl.create_group(name)
        assert name in resctrl.groups()
        if resctrl.capabilities.mb:
            applied = resctrl.set_mb(name, resctrl.mb_value(50))
            assert applied and all(v == resctrl.mb_value(50) for v in applied.values())
        assert resctrl.assign_pid(name, worker.pid)
        assert worker.pid in resctrl.tasks(name)
        if resctrl.capabilities.l3_mon:
            first = resctrl.read_mbm(name)
            time.sleep(1.0)
            second = resctrl.read_mbm(name)
            assert first.keys() == second.keys()
    finally:
        worker.kill()
        worker.wait()
        resctrl.remove_group(name)
    assert name not in resctrl.groups()
