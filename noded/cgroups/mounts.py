"""Where the cgroup hierarchies are mounted, read from /proc/mounts.

Controllers are found by mount options rather than by directory name because distributions
co-mount them differently (``cpu,cpuacct``, ``net_cls,net_prio``). Only mounts at or below
``root`` count, so a test can point detection at an emulated tree with its own mounts file.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

# devices: the GPU device fence (noded/cgroups/devrules.py), a group per job like the others.
V1_CONTROLLERS = ("cpuset", "cpu", "memory", "net_cls", "devices")
DEFAULT_ROOT = Path("/sys/fs/cgroup")
PROC_MOUNTS = Path("/proc/mounts")

_OCTAL = re.compile(r"\\([0-7]{3})")


def _unescape(field_text: str) -> str:
    # /proc/mounts escapes space, tab, newline and backslash as \ooo
    return _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), field_text)


@dataclass(frozen=True)
class CgroupMounts:
    v1: dict[str, Path] = field(default_factory=dict)  # controller -> mount point
    v2: Path | None = None  # the cgroup2 mount point
    # Every other v1 hierarchy (blkio, pids, freezer, ...): noded configures nothing there,
    # but a container runtime given a job's group as its cgroup parent makes the same path
    # in each of them, which must go with the job.
    v1_others: tuple[Path, ...] = ()


def _under(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def find_mounts(root: Path = DEFAULT_ROOT, mounts_file: Path = PROC_MOUNTS) -> CgroupMounts:
    root = Path(os.path.abspath(root))
    try:
        text = mounts_file.read_text()
    except FileNotFoundError:
        return CgroupMounts()
    v1: dict[str, Path] = {}
    v2: Path | None = None
    points: list[Path] = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 4:
            continue
        point = Path(_unescape(parts[1]))
        fstype, options = parts[2], parts[3].split(",")
        if not _under(point, root):
            continue
        if fstype == "cgroup2" and v2 is None:
            v2 = point
        elif fstype == "cgroup":
            points.append(point)
            for ctl in V1_CONTROLLERS:
                if ctl in options and ctl not in v1:
                    v1[ctl] = point
    managed = set(v1.values())
    others = tuple(dict.fromkeys(p for p in points if p not in managed))
    return CgroupMounts(v1=v1, v2=v2, v1_others=others)
