"""A job's cgroups and the kernel's accounting in them.

``/proc/PID/cgroup`` of any process of the job names its groups: ``0::/path`` for cgroup v2
and ``N:controllers:/path`` for each v1 hierarchy. CPU time comes from v2 ``cpu.stat``
(``usage_usec``, present in every v2 group) or v1 ``cpuacct.usage`` (nanoseconds); the
memory peak from v2 ``memory.peak`` (``memory.current`` where the kernel lacks it) or v1
``memory.max_usage_in_bytes``. A group at the root ("/") is not the job's own and is not read.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
PROC_MOUNTS = Path("/proc/mounts")


@dataclass(frozen=True)
class JobGroups:
    """Files of a job's own groups (None where the job has no group of that kind)."""

    v2: Path | None = None  # the job's v2 group directory
    cpuacct: Path | None = None  # v1 group directory in the cpuacct hierarchy
    memory: Path | None = None  # v1 group directory in the memory hierarchy
    # The v2 group as a hierarchy path ("/a/b"), for nft's socket cgroupv2 match.
    v2_path: str | None = None


@dataclass(frozen=True)
class Mounts:
    v2: Path | None
    v1: dict[str, Path]  # controller -> mount point

    @classmethod
    def read(cls, mounts_file: Path = PROC_MOUNTS) -> Mounts:
        v2: Path | None = None
        v1: dict[str, Path] = {}
        try:
            text = mounts_file.read_text()
        except OSError:
            return cls(None, {})
        for line in text.splitlines():
            parts = line.split()
            if len(parts) < 4:
                continue
            point, fstype, options = Path(parts[1]), parts[2], parts[3].split(",")
            if fstype == "cgroup2" and v2 is None:
                v2 = point
            elif fstype == "cgroup":
                for ctl in ("cpuacct", "memory"):
                    if ctl in options and ctl not in v1:
                        v1[ctl] = point
        return cls(v2, v1)


def parse_proc_cgroup(text: str) -> tuple[str | None, dict[str, str]]:
    """(v2 path, {v1 controller: path}) from a ``/proc/PID/cgroup`` file."""
    v2: str | None = None
    v1: dict[str, str] = {}
    for line in text.splitlines():
        hid, sep, rest = line.partition(":")
        controllers, sep2, path = rest.partition(":")
        if not sep or not sep2:
            continue
        if hid == "0" and controllers == "":
            v2 = path
        else:
            for ctl in controllers.split(","):
                v1[ctl] = path
    return v2, v1


def groups_of(pid: int, mounts: Mounts, proc: Path = PROC) -> JobGroups | None:
    """The job groups ``pid`` is in, or None when the process is gone."""
    try:
        text = (proc / str(pid) / "cgroup").read_text()
    except OSError:
        return None
    v2, v1 = parse_proc_cgroup(text)

    def under(mount: Path | None, path: str | None) -> Path | None:
        if mount is None or not path or path == "/":
            return None
        found = mount / path.lstrip("/")
        return found if found.is_dir() else None

    v2_dir = under(mounts.v2, v2)
    return JobGroups(
        v2=v2_dir,
        cpuacct=under(mounts.v1.get("cpuacct"), v1.get("cpuacct")),
        memory=under(mounts.v1.get("memory"), v1.get("memory")),
        v2_path=v2 if v2_dir is not None else None,
    )


def _read(path: Path) -> str | None:
    with contextlib.suppress(OSError):
        return path.read_text()
    return None


def cpu_seconds(groups: JobGroups) -> float | None:
    """CPU time the job's group has used, in seconds."""
    if groups.v2 is not None:
        text = _read(groups.v2 / "cpu.stat")
        if text:
            for line in text.splitlines():
                key, _, value = line.partition(" ")
                if key == "usage_usec":
                    return int(value) / 1e6
    if groups.cpuacct is not None:
        text = _read(groups.cpuacct / "cpuacct.usage")
        if text and text.strip().isdigit():
            return int(text) / 1e9
    return None


def memory_bytes(groups: JobGroups) -> int | None:
    """The job's group's memory peak (or current use where the kernel keeps no peak)."""
    if groups.v2 is not None:
        for name in ("memory.peak", "memory.current"):
            text = _read(groups.v2 / name)
            if text and text.strip().isdigit():
                return int(text)
    if groups.memory is not None:
        text = _read(groups.memory / "memory.max_usage_in_bytes")
        if text and text.strip().isdigit():
            return int(text)
    return None


def processes_usage(pids: list[int]) -> tuple[float, int]:
    """CPU seconds (of the live processes, children they waited for included) and resident
    memory of ``pids``: the figures for a job without groups of its own (affinity mode)."""
    import psutil

    cpu, rss = 0.0, 0
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            times = proc.cpu_times()
            cpu += times.user + times.system + times.children_user + times.children_system
            rss += proc.memory_info().rss
        except (psutil.Error, OSError):
            continue
    return cpu, rss


def online_cpus() -> int:
    return os.cpu_count() or 1
