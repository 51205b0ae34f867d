"""Qualify the GPU device fence on a real GPU server: NVML's description of the device files
matches /dev, and behind the real driver a fenced process opens its own GPU and the control
files and gets EPERM on the others; one given no GPU opens none.

Skips with the reason when NVML does not start here (no driver, no GPU), when noded could not
fence here (not root, no devices controller, no cgroup device programs).
"""

from __future__ import annotations

import os
import uuid

import pytest

from noded.cgroups import GroupLimits, V1CgroupManager, V2CgroupManager
from noded.cgroups.base import CgroupManager
from noded.cgroups.devrules import job_rules
from noded.cgroups.mounts import find_mounts
from noded.gpu.base import GpuBackendError, open_backend
from tests.integration.test_gpu_fence_kernel import _answers, _cleaned


def _manager() -> CgroupManager:
    if os.geteuid() != 0:
        pytest.skip("fencing needs root")
    mounts = find_mounts()
    parent = f"trellis-test-qualify-{uuid.uuid4().hex[:6]}"
    if "devices" in mounts.v1 and "cpuset" in mounts.v1:
        return V1CgroupManager(parent, mounts.v1)
    if mounts.v2 is not None:
        manager = V2CgroupManager(parent, mounts.v2, require_cpuset=False)
        kind, why = manager.fence_support()
        if kind == "bpf":
            return manager
        pytest.skip(why)
    pytest.skip("neither a v1 devices hierarchy nor cgroup v2 is mounted")


def test_the_fence_holds_behind_the_real_driver() -> None:
    try:
        backend = open_backend("nvml")
    except GpuBackendError as exc:
        pytest.skip(str(exc))
    try:
        nodes = backend.device_nodes()
    finally:
        backend.close()
    for node in (*nodes.gpus.values(), *nodes.control):
        rdev = os.stat(node.path).st_rdev  # the description is /dev's
        assert (os.major(rdev), os.minor(rdev)) == (node.major, node.minor), node
    assert any("libnvidia-ml.so" in lib for lib in nodes.libraries), nodes.libraries
    manager = _manager()
    paths = [n.path for n in (*nodes.gpus.values(), *nodes.control)]
    with _cleaned(manager, ["job-own", "job-none"]):
        manager.create("job-own", GroupLimits(cpus=(0,)))
        manager.create("job-none", GroupLimits(cpus=(0,)))
        manager.fence_devices("job-own", job_rules(nodes, (0,)))
        manager.fence_devices("job-none", job_rules(nodes, ()))
        own = _answers(manager, "job-own", paths)
        assert own[nodes.gpus[0].path] == "OK" and own[nodes.control[0].path] == "OK", own
        assert all(own[n.path] == "EPERM" for i, n in nodes.gpus.items() if i != 0), own
        assert set(_answers(manager, "job-none", paths).values()) == {"EPERM"}
