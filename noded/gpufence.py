"""Hard GPU isolation for host jobs: the kernel refuses a job the GPUs it was not given.

``CUDA_VISIBLE_DEVICES`` only asks CUDA to hide GPUs; any process may still open
``/dev/nvidiaN`` of another tenant's GPU. The fence puts rules on the job's own cgroup before
its first instruction runs (the shim joins the group before exec, and children inherit it):
the job's GPUs' device files and the control files may be opened, every other GPU device gets
EPERM, and a job holding no GPU can open none. The rules come from the GPU backend's
description of its device files (``GpuBackend.device_nodes()``) and go through the cgroup
backend (``CgroupManager.fence_devices``): cgroup v1's devices controller or a cgroup v2
device program. They go away with the job's group. See docs/gpu-isolation.md.

``gpu.fence``: ``auto`` fences where the node's cgroups can (and logs why not where they
cannot), ``devices`` / ``bpf`` require that kind (noded refuses to start without it), ``off``
never fences.
"""

from __future__ import annotations

import logging

from noded.cgroups import CgroupManager
from noded.cgroups.devrules import job_rules
from noded.gpu.base import GpuBackend

log = logging.getLogger("trellis.node.gpufence")

MODES = ("auto", "devices", "bpf", "off")


class GpuFenceError(RuntimeError):
    """The fence the configuration requires cannot be had on this node."""


class GpuFence:
    def __init__(self, mode: str, cgroups: CgroupManager, gpus: GpuBackend) -> None:
        if mode not in MODES:
            raise ValueError(f"gpu.fence {mode!r} is not one of {', '.join(MODES)}")
        self.cgroups = cgroups
        self.kind = "off"
        self.reason = "gpu.fence = off"
        if mode == "off":
            log.info("gpu_fence=off reason=%r", self.reason)
            return
        self.nodes = gpus.device_nodes()
        kind, why = cgroups.fence_support()
        if kind == "none":
            self.reason = why
        elif not (self.nodes.gpus or self.nodes.control):
            self.reason = f"the {gpus.name} GPU backend describes no device files"
        elif mode not in ("auto", kind):
            self.reason = f"this node's cgroups ({cgroups.kind}) fence with {kind}"
        else:
            self.kind, self.reason = kind, ""
        if self.kind == "off":
            if mode != "auto":
                raise GpuFenceError(f"gpu.fence = {mode!r} cannot be had: {self.reason}")
            log.warning("gpu_fence=off reason=%r (jobs are kept from other GPUs by "
                        "CUDA_VISIBLE_DEVICES only)", self.reason)
            return
        log.info("gpu_fence=%s cgroups=%s gpus=%d control=%s", self.kind, cgroups.kind,
                 len(self.nodes.gpus), [n.path for n in self.nodes.control])

    @property
    def on(self) -> bool:
        return self.kind != "off"

    def apply(self, job_id: str, gpus: tuple[int, ...]) -> None:
        """Fence the job's (existing) group so that it may open only ``gpus``' device files.
        Raises KeyError for a GPU with no known device file, and the cgroup backend's errors."""
        if not self.on:
            return
        rules = job_rules(self.nodes, tuple(gpus))
        self.cgroups.fence_devices(job_id, rules)
        log.info("job=%s gpu_fence=%s gpus=%s allowed=%d denied=%d", job_id, self.kind,
                 list(gpus), len(rules.allowed), len(rules.denied))
