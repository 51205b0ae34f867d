"""The CDI spec that gives a container exactly its job's GPUs.

Written by noded at the job's start from the node's ``GpuDeviceNodes`` (noded/gpu/devices.py):
one device, named after the job, whose edits add the job's GPU device files, the control files
(nvidiactl, nvidia-uvm, ...) and the driver's user-space libraries bound read-only. podman
resolves ``--device trellis.dev/gpu=JOB`` through it; the GPUs the job was not given are not
in the container at all, and runc's device cgroup denies them even to a ``mknod``.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from noded.gpu.devices import GpuDeviceNodes
from noded.shim import write_atomic

VENDOR = "trellis.dev"
CLASS = "gpu"
# Where podman looks for CDI specs (its built-in directories; the per-file names keep a
# node's and a job's apart, and the spec is removed with the job).
SPEC_DIR = Path("/var/run/cdi")


def device_name(node: str, job_id: str, restarts: int) -> str:
    return f"{node}-{job_id}-{restarts}"


def spec_path(name: str, spec_dir: Path = SPEC_DIR) -> Path:
    return spec_dir / f"trellis-{name}.json"


def build_spec(name: str, nodes: GpuDeviceNodes, gpus: tuple[int, ...]) -> dict:
    """The CDI document for device ``name``: ``gpus``' device files and nothing else."""
    devices = []
    for node in nodes.for_job(gpus):
        # A GPU's file keeps its name in the container only if that name is /dev/nvidiaN;
        # an emulated node's scratch files become /dev/nvidia<minor> / their own base name.
        base = os.path.basename(node.path)
        target = node.path if node.path.startswith("/dev/") else f"/dev/{base}"
        devices.append({"path": target, "hostPath": node.path, "type": "c",
                        "major": node.major, "minor": node.minor,
                        "permissions": "rw"})
    mounts = [{"hostPath": lib, "containerPath": lib, "options": ["ro", "nosuid", "nodev",
                                                                  "bind"]}
              for lib in nodes.libraries]
    return {
        "cdiVersion": "0.5.0",
        "kind": f"{VENDOR}/{CLASS}",
        "devices": [{"name": name, "containerEdits": {"deviceNodes": devices,
                                                      "mounts": mounts}}],
    }


def write_spec(name: str, nodes: GpuDeviceNodes, gpus: tuple[int, ...],
               spec_dir: Path = SPEC_DIR) -> str:
    """Write the spec; returns the ``--device`` value naming it."""
    spec_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(spec_path(name, spec_dir), build_spec(name, nodes, gpus))
    return f"{VENDOR}/{CLASS}={name}"


def remove_spec(name: str, spec_dir: Path = SPEC_DIR) -> None:
    with contextlib.suppress(FileNotFoundError):
        spec_path(name, spec_dir).unlink()
