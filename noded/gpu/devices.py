"""The device files a job must be given to use its GPUs, and nothing more.

One description serves both fences: the device cgroup that keeps a host job from opening the
GPUs it was not given (``noded/cgroups``), and the CDI spec that puts exactly the job's GPUs
into its container (``noded/containers``). Each GPU backend says where its device files are:
NVML from the driver's minor numbers and ``/proc/devices``, the emulation from character
devices it creates with NVIDIA's major number in a scratch directory.
"""

from __future__ import annotations

from dataclasses import dataclass

# NVIDIA's character-device major number (/dev/nvidia0..N and /dev/nvidiactl).
NVIDIA_MAJOR = 195
# nvidiactl's minor number on that major.
NVIDIACTL_MINOR = 255


@dataclass(frozen=True)
class DeviceNode:
    """One character device file."""

    path: str
    major: int
    minor: int


@dataclass(frozen=True)
class GpuDeviceNodes:
    """Every device file of a node's GPUs: one per GPU (by index), the control files every
    job using a GPU needs (nvidiactl, nvidia-uvm, nvidia-uvm-tools, ...), and the driver's
    user-space libraries a container must be given to reach them."""

    gpus: dict[int, DeviceNode]
    control: tuple[DeviceNode, ...] = ()
    libraries: tuple[str, ...] = ()

    def for_job(self, gpus: tuple[int, ...]) -> tuple[DeviceNode, ...]:
        """The device files a job holding ``gpus`` may open: its GPUs' and, if it holds any,
        the control files."""
        if not gpus:
            return ()
        missing = [i for i in gpus if i not in self.gpus]
        if missing:
            raise KeyError(f"no device file known for GPU {missing[0]}")
        return tuple(self.gpus[i] for i in sorted(gpus)) + self.control
