"""The NVIDIA driver's device files and user-space libraries on a real GPU server.

What the NVML backend's ``device_nodes()`` is made of, kept apart from NVML so that it can be
tested on machines without a GPU: the text of ``/proc/devices`` and of ``ldconfig -p`` in,
a :class:`~noded.gpu.devices.GpuDeviceNodes` out.

* ``/dev/nvidiaN``: major 195, minor = the GPU's minor number (``nvmlDeviceGetMinorNumber``,
  which is *not* always its NVML index).
* ``/dev/nvidiactl``: 195:255, opened by every CUDA process.
* ``/dev/nvidia-uvm`` (minor 0) and ``/dev/nvidia-uvm-tools`` (minor 1): the unified-memory
  driver's major is allocated at module load, read from ``/proc/devices`` ("nvidia-uvm");
  absent while nvidia-uvm is not loaded (CUDA loads it on first use through
  nvidia-modprobe), in which case there is nothing to describe yet.
* The driver's libraries: the compute set nvidia-container-toolkit mounts into containers
  (libcuda, libnvidia-ml, the PTX JIT compiler...), as the dynamic linker's cache lists them
  for this machine's architecture.
"""

from __future__ import annotations

import logging
import platform
import re
import subprocess
from pathlib import Path

from noded.gpu.devices import NVIDIA_MAJOR, NVIDIACTL_MINOR, DeviceNode, GpuDeviceNodes

log = logging.getLogger("trellis.gpu.nvml")

PROC_DEVICES = Path("/proc/devices")
UVM_NAME = "nvidia-uvm"
UVM_MINOR, UVM_TOOLS_MINOR = 0, 1
# The driver's compute libraries (prefixes of their sonames), as nvidia-container-toolkit's
# "compute" and "utility" capabilities select them.
DRIVER_LIBRARIES = (
    "libcuda.so",
    "libcudadebugger.so",
    "libnvidia-allocator.so",
    "libnvidia-cfg.so",
    "libnvidia-gpucomp.so",
    "libnvidia-ml.so",
    "libnvidia-nvvm.so",
    "libnvidia-opencl.so",
    "libnvidia-pkcs11.so",
    "libnvidia-ptxjitcompiler.so",
)
# ldconfig's name of each machine's 64-bit ABI, as printed in "(libc6,x86-64)".
_LDCONFIG_ABI = {"x86_64": "x86-64", "aarch64": "AArch64", "ppc64le": "64bit"}
_LDCONFIG_LINE = re.compile(r"^\s*(\S+)\s+\(([^)]*)\)\s+=>\s+(\S+)\s*$")


def char_majors(proc_devices: str) -> dict[str, int]:
    """Driver name -> major of the character devices listed in ``/proc/devices``."""
    majors: dict[str, int] = {}
    section = ""
    for line in proc_devices.splitlines():
        text = line.strip()
        if text.endswith(":"):
            section = text
            continue
        number, _, name = text.partition(" ")
        if section == "Character devices:" and number.isdigit() and name:
            majors.setdefault(name.strip(), int(number))
    return majors


def driver_libraries(ldconfig: str, machine: str | None = None) -> tuple[str, ...]:
    """Paths of the driver's libraries for this machine's ABI in ``ldconfig -p`` output."""
    abi = _LDCONFIG_ABI.get(machine or platform.machine(), "")
    found: list[str] = []
    for line in ldconfig.splitlines():
        match = _LDCONFIG_LINE.match(line)
        if match is None:
            continue
        name, flags, path = match.groups()
        if abi and abi not in flags.split(","):
            continue  # a 32-bit or foreign-architecture copy
        if name.startswith(DRIVER_LIBRARIES) and path not in found:
            found.append(path)
    return tuple(sorted(found))


def nvidia_device_nodes(minors: dict[int, int], proc_devices: str, ldconfig: str,
                        dev: Path = Path("/dev"), machine: str | None = None) -> GpuDeviceNodes:
    """The device files of GPUs with NVML index -> ``minors``, plus the control files."""
    gpus = {i: DeviceNode(str(dev / f"nvidia{m}"), NVIDIA_MAJOR, m) for i, m in minors.items()}
    control = [DeviceNode(str(dev / "nvidiactl"), NVIDIA_MAJOR, NVIDIACTL_MINOR)]
    uvm = char_majors(proc_devices).get(UVM_NAME)
    if uvm is not None:
        control += [DeviceNode(str(dev / "nvidia-uvm"), uvm, UVM_MINOR),
                    DeviceNode(str(dev / "nvidia-uvm-tools"), uvm, UVM_TOOLS_MINOR)]
    return GpuDeviceNodes(gpus, tuple(control), driver_libraries(ldconfig, machine))


def read_proc_devices(path: Path = PROC_DEVICES) -> str:
    try:
        return path.read_text()
    except OSError as exc:
        log.warning("gpu_devices_unread file=%s error=%s", path, exc)
        return ""


def run_ldconfig() -> str:
    """``ldconfig -p`` (the linker cache), or "" with a warning where it cannot run."""
    for binary in ("/sbin/ldconfig", "/usr/sbin/ldconfig", "ldconfig"):
        try:
            done = subprocess.run([binary, "-p"], capture_output=True, text=True, timeout=30,
                                  check=True)
        except FileNotFoundError:
            continue
        except (OSError, subprocess.SubprocessError) as exc:
            log.warning("gpu_libraries_unknown error=%s", exc)
            return ""
        return done.stdout
    log.warning("gpu_libraries_unknown error=%r", "ldconfig not found")
    return ""
