"""The interface every confinement backend implements, plus helpers they share."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from noded.cgroups.errors import CgroupError, GroupBusyError
from noded.cgroups.limits import GroupLimits
from shared.kernelfs import KernelWriteError, KernelWriter
from shared.model import check_name

if TYPE_CHECKING:
    from noded.cgroups.devrules import DeviceRules

log = logging.getLogger("trellis.cgroups")

SIGNAL_PASSES = 5  # re-read membership this often so children forked mid-signal are caught too


@runtime_checkable
class CgroupManager(Protocol):
    """Per-job CPU/memory confinement under one parent group owned by this noded.

    All methods are synchronous and quick (a few small file writes); callers on an event loop
    may call them directly or through ``asyncio.to_thread``.
    """

    kind: str  # "v1", "v2" or "affinity"

    def create(self, job_id: str, limits: GroupLimits) -> None:
        """Create the job's group with ``limits``; calling it again just re-applies them."""
        ...

    def update(self, job_id: str, limits: GroupLimits) -> None:
        """Change the limits of an existing group; every thread of every member follows."""
        ...

    def attach_files(self, job_id: str) -> list[Path]:
        """Files a starting process writes its own pid into (before exec) to join the group."""
        ...

    def add_pid(self, job_id: str, pid: int) -> None:
        """Move an existing process, with all its threads, into the group."""
        ...

    def oom_kills(self, job_id: str) -> int | None:
        """How often the kernel's OOM killer killed a member of the job's group at its memory
        limit (None: the kernel does not say, e.g. without a memory controller)."""
        ...

    def pids(self, job_id: str) -> list[int]:
        """Processes currently in the group, sorted."""
        ...

    def list_jobs(self) -> list[str]:
        """Job groups existing under our parent, sorted."""
        ...

    def limits(self, job_id: str) -> GroupLimits:
        """The limits in force, read back from the kernel (or the state file for affinity)."""
        ...

    def signal_all(self, job_id: str, sig: int) -> int:
        """Send ``sig`` to every process of the group; returns how many were signalled."""
        ...

    def remove(self, job_id: str) -> None:
        """Remove the group; raises GroupBusyError while processes remain. No-op if absent."""
        ...

    def remove_parent(self) -> None:
        """Remove our parent group; raises GroupBusyError while job groups remain."""
        ...

    def fence_support(self) -> tuple[str, str]:
        """Which GPU device fence this backend enforces: ("devices", "") for cgroup v1's
        devices controller, ("bpf", "") for a cgroup v2 device program, ("none", why not)."""
        ...

    def fence_devices(self, job_id: str, rules: DeviceRules) -> None:
        """Make ``rules`` the job group's device fence (noded.cgroups.devrules); applying it
        again is harmless. Raises CgroupUnavailableError where fence_support says none."""
        ...


def check_parent(parent: str) -> str:
    return check_name(parent, "cgroup parent name")


def check_job(job_id: str) -> str:
    return check_name(job_id, "job id")


def check_pid(pid: int) -> int:
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        raise ValueError(f"pid must be a positive integer, got {pid!r}")
    return pid


def parse_pid_lines(text: str) -> list[int]:
    return sorted({int(tok) for tok in text.split()})


def signal_members(list_pids: Callable[[], list[int]], sig: int) -> int:
    """Signal every member once, re-reading membership so that processes forked while we were
    signalling (a shell spawning a child) are signalled too. Returns how many were signalled."""
    done: set[int] = set()
    for _ in range(SIGNAL_PASSES):
        fresh = [p for p in list_pids() if p not in done]
        if not fresh:
            break
        for pid in fresh:
            done.add(pid)
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                done.discard(pid)  # exited before the signal: not counted
    return len(done)


def check_writer_covers(writer: KernelWriter, paths: list[Path]) -> None:
    """Fail at construction, not at the first write, when a caller's writer cannot reach us."""
    for p in paths:
        full = Path(os.path.abspath(p))
        if not any(full == r or r in full.parents for r in writer.roots):
            raise CgroupError(
                f"KernelWriter roots {[str(r) for r in writer.roots]} do not include the cgroup "
                f"mount {full}; build the writer with the cgroup mount points as roots"
            )


def read_int_or_none(text: str, unlimited: tuple[str, ...] = ("max", "-1")) -> int | None:
    text = text.strip()
    if text in unlimited:
        return None
    return int(text)


def parse_oom_kill(text: str | None) -> int | None:
    """``oom_kill N`` from memory.oom_control (v1) or memory.events (v2); None if absent."""
    for line in (text or "").splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill" and value.strip().isdigit():
            return int(value)
    return None


def quiet_read(writer: KernelWriter, path: Path) -> str | None:
    """Read a file that may legitimately be absent (an unmounted controller, a racing rmdir)."""
    with contextlib.suppress(FileNotFoundError):
        return writer.read(path)
    return None


def limits_summary(limits: GroupLimits) -> str:
    return (
        f"cpus={limits.cpus} mems={limits.mems} memory_bytes={limits.memory_bytes} "
        f"cpu_quota_cores={limits.cpu_quota_cores} net_classid={limits.net_classid}"
    )


def write_pid(writer: KernelWriter, procs_file: Path, pid: int, job_id: str) -> None:
    """Move ``pid`` (the whole thread group) into the group owning ``procs_file``."""
    try:
        writer.write(procs_file, str(pid), what=f"job {job_id} member", compare=False)
    except KernelWriteError as exc:
        if exc.errno == errno.ESRCH:
            raise ProcessLookupError(
                f"cannot add pid {pid} to job {job_id!r}: no such process"
            ) from exc
        raise


def rmdir_group(writer: KernelWriter, group: Path, what: str, busy_hint: str) -> None:
    try:
        writer.rmdir(group, what=what)
    except OSError as exc:
        if exc.errno in (errno.EBUSY, errno.ENOTEMPTY):
            raise GroupBusyError(f"cannot remove {group}: {exc.strerror} ({busy_hint})") from exc
        raise


def subgroups(group: Path) -> list[Path]:
    """The groups below ``group``, deepest first (the order they can be removed in). A job's
    own group gets children when its container runtime nests one there (noded/containers)."""
    found: list[Path] = []
    for top, dirs, _files in os.walk(group):
        found.extend(Path(top) / d for d in dirs)
    return sorted(found, key=lambda p: len(p.parts), reverse=True)


def subtree_pids(writer: KernelWriter, group: Path) -> list[int] | None:
    """The processes of ``group`` and of every group below it; None if it does not exist."""
    text = quiet_read(writer, group / "cgroup.procs")
    if text is None:
        return None
    found = parse_pid_lines(text)
    for sub in subgroups(group):
        found.extend(parse_pid_lines(quiet_read(writer, sub / "cgroup.procs") or ""))
    return found


def remove_subgroups(writer: KernelWriter, group: Path, job_id: str) -> None:
    """Remove the (empty) groups a container runtime left below a job's group."""
    for sub in subgroups(group):
        rmdir_group(writer, sub, f"job {job_id} subgroup removed",
                    "a process still runs in the container's group")
