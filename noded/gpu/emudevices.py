"""Device files for emulated GPUs: real character devices with NVIDIA's numbers, no driver.

The emulated backend creates, in a scratch directory (``dev_dir``), ``nvidiaN`` as character
device 195:N for each GPU index N and ``nvidiactl`` as 195:255, mode 0666 like the driver's.
No driver answers to major 195 on such a machine, so opening one fails with ENXIO ("no such
device or address") — unless the GPU device fence refuses it first, with EPERM. That
difference is what lets tests prove the fence with the kernel itself, on machines without
GPUs. Creating device files needs CAP_MKNOD (root) and a filesystem not mounted ``nodev``.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

from noded.gpu.devices import NVIDIA_MAJOR, NVIDIACTL_MINOR, DeviceNode, GpuDeviceNodes

log = logging.getLogger("trellis.gpu.emulated")

MODE = 0o666  # what the NVIDIA driver (and nvidia-modprobe) gives /dev/nvidia*


def _ensure_node(node: DeviceNode) -> None:
    """Make ``node`` a character device with its numbers, replacing whatever else is there
    (a left-over of another configuration: regular file, other numbers)."""
    want = os.makedev(node.major, node.minor)
    try:
        st = os.lstat(node.path)
        if stat.S_ISCHR(st.st_mode) and st.st_rdev == want:
            os.chmod(node.path, MODE)
            return
        os.unlink(node.path)
    except FileNotFoundError:
        pass
    os.mknod(node.path, MODE | stat.S_IFCHR, want)
    os.chmod(node.path, MODE)  # mknod's mode is filtered by the umask


def make_device_files(dev_dir: str | Path, count: int) -> GpuDeviceNodes:
    """Create the device files of ``count`` emulated GPUs in ``dev_dir``; a description with
    no GPUs (and a warning saying why) where they cannot be made."""
    root = Path(dev_dir)
    gpus = {i: DeviceNode(str(root / f"nvidia{i}"), NVIDIA_MAJOR, i) for i in range(count)}
    control = (DeviceNode(str(root / "nvidiactl"), NVIDIA_MAJOR, NVIDIACTL_MINOR),)
    try:
        root.mkdir(parents=True, exist_ok=True)
        os.chmod(root, 0o755)  # jobs (other users) must reach the files
        for node in (*gpus.values(), *control):
            _ensure_node(node)
    except OSError as exc:
        log.warning("gpu_device_files=none dev_dir=%s reason=%r (creating character devices "
                    "needs root and a filesystem without nodev; no GPU device fence)",
                    root, f"{exc.strerror or exc}: {exc.filename or root}")
        return GpuDeviceNodes({})
    log.info("gpu_device_files dev_dir=%s gpus=%d major=%d", root, count, NVIDIA_MAJOR)
    return GpuDeviceNodes(gpus, control)
