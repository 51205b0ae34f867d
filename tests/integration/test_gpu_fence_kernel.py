"""The GPU device fence on this kernel's own cgroups, both kinds, with real processes.

cgroup v2: this machine mounts the unified hierarchy beside the v1 controllers (hybrid), with
no cpuset to delegate, so noded's job groups are v1 here; the device program is tested on a
group under the unified mount (a V2CgroupManager that does not require cpuset), which is what
a v2 node's job group is. The kernel runs device programs for a task's v2 group whatever the
v1 hierarchies say, so the answer is the program's. cgroup v1: the same through the devices
controller. The device files are the emulated GPUs' (character devices 195:N, no driver).
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from demo.gpu_escape import open_answer
from noded.cgroups import GroupLimits, V1CgroupManager, V2CgroupManager, bpfdev, join_group
from noded.cgroups.base import CgroupManager
from noded.cgroups.devrules import job_rules
from noded.cgroups.mounts import find_mounts
from noded.gpu.devices import GpuDeviceNodes
from noded.gpu.emudevices import make_device_files
from tests.conftest import needs_root

pytestmark = [needs_root, pytest.mark.root]

PROBE = "import sys, demo.gpu_escape as g; g.main(sys.argv[1:])"
TREE = Path(__file__).resolve().parents[2]


@pytest.fixture
def nodes(tmp_path: Path) -> GpuDeviceNodes:
    made = make_device_files(tmp_path / "dev", 3)
    assert made.gpus, "cannot create device files here"
    return made


def _answers(manager: CgroupManager, job_id: str, paths: list[str]) -> dict[str, str]:
    """What a process of the job's group is told when it opens ``paths``."""
    files = manager.attach_files(job_id)
    done = subprocess.run([sys.executable, "-c", PROBE, *paths], cwd=TREE, capture_output=True,
                          text=True, timeout=30, preexec_fn=lambda: join_group(files),
                          check=True)
    return dict(line.split(" ", 1) for line in done.stdout.splitlines()[:-1])


@contextlib.contextmanager
def _cleaned(manager: CgroupManager, jobs: list[str]) -> Iterator[None]:
    try:
        yield
    finally:
        for job in jobs:
            with contextlib.suppress(Exception):
                manager.remove(job)
        with contextlib.suppress(Exception):
            manager.remove_parent()


# What a file the fence lets through answers: the driver's absence (ENXIO, or ENODEV for a
# minor no GPU has) or, on a server whose NVIDIA driver is loaded, the real device (OK: the
# scratch files carry the driver's own numbers, 195:N and nvidiactl's 195:255).
LET_THROUGH = ("ENXIO", "ENODEV", "OK")


def _expect(answers: dict[str, str], nodes: GpuDeviceNodes, gpus: tuple[int, ...]) -> None:
    for index, node in nodes.gpus.items():
        if index in gpus:
            assert answers[node.path] in LET_THROUGH, answers
        else:
            assert answers[node.path] == "EPERM", answers
    ctl = nodes.control[0].path
    if gpus:
        assert answers[ctl] in LET_THROUGH, answers
    else:
        assert answers[ctl] == "EPERM", answers
    assert answers["/dev/null"] == "OK"


def _paths(nodes: GpuDeviceNodes) -> list[str]:
    return [n.path for n in (*nodes.gpus.values(), *nodes.control)] + ["/dev/null"]


def test_v2_device_program_fences_a_group_and_goes_with_it(nodes: GpuDeviceNodes) -> None:
    mount = find_mounts().v2
    if mount is None:
        pytest.skip("no cgroup2 hierarchy is mounted")
    problem = bpfdev.probe()
    if problem:
        pytest.skip(problem)
    manager = V2CgroupManager(f"trellis-test-fence-{uuid.uuid4().hex[:6]}", mount,
                              require_cpuset=False)
    assert manager.fence_support() == ("bpf", "")
    with _cleaned(manager, ["job-a", "job-none"]):
        manager.create("job-a", GroupLimits(cpus=(0,)))
        manager.create("job-none", GroupLimits(cpus=(0,)))
        manager.fence_devices("job-a", job_rules(nodes, (1,)))
        manager.fence_devices("job-none", job_rules(nodes, ()))
        _expect(_answers(manager, "job-a", _paths(nodes)), nodes, (1,))
        _expect(_answers(manager, "job-none", _paths(nodes)), nodes, ())
        # Fenced again (noded re-adopting the job): the new program replaces the old one.
        group = manager.parent_dir / "job-a"
        with open_dir(group) as fd:
            [first] = bpfdev.attached(fd)
        manager.fence_devices("job-a", job_rules(nodes, (1,)))
        with open_dir(group) as fd:
            [second] = bpfdev.attached(fd)
        assert second != first
        _expect(_answers(manager, "job-a", _paths(nodes)), nodes, (1,))
        # The group goes, and its program with it (released asynchronously by the kernel).
        manager.remove("job-a")
        deadline = time.monotonic() + 10
        while _program_exists(second):
            assert time.monotonic() < deadline, f"device program {second} outlived its group"
            time.sleep(0.05)
    # Outside any fenced group nothing is refused.
    assert {open_answer(n.path) for n in nodes.gpus.values()} <= set(LET_THROUGH)


def test_v1_devices_group_fences_a_job(nodes: GpuDeviceNodes) -> None:
    v1 = find_mounts().v1
    if "devices" not in v1 or "cpuset" not in v1:
        pytest.skip("the v1 devices and cpuset controllers are not both mounted")
    manager = V1CgroupManager(f"trellis-test-fence-{uuid.uuid4().hex[:6]}", v1)
    assert manager.fence_support() == ("devices", "")
    with _cleaned(manager, ["job-b"]):
        manager.create("job-b", GroupLimits(cpus=(0,)))
        manager.fence_devices("job-b", job_rules(nodes, (0, 2)))
        _expect(_answers(manager, "job-b", _paths(nodes)), nodes, (0, 2))
        manager.remove("job-b")
        assert not (v1["devices"] / manager.parent / "job-b").exists()


@contextlib.contextmanager
def open_dir(path: Path) -> Iterator[int]:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield fd
    finally:
        os.close(fd)


def _program_exists(prog_id: int) -> bool:
    try:
        with bpfdev._prog_fd(prog_id):
            return True
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return False
        raise
