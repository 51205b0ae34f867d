"""Fallback confinement without cgroups: CPU affinity of every thread of every job process.

Used when noded is not root or the machine offers no cpuset controller. It pins, nothing more:
``memory_bytes`` and ``cpu_quota_cores`` are recorded (``limits`` returns them) but cannot be
enforced, which is logged as a warning once per job. Membership is what we track: the pids
given to ``add_pid`` plus every descendant seen since, each remembered with its start time so a
recycled pid is never mistaken for a member. Tracking lives in memory and in
``<state_dir>/<parent>.affinity.json`` so a restarted noded re-adopts its jobs. A process that
daemonises (re-parents to init) before we have seen it escapes; cgroups do not have that gap.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from noded.cgroups.base import (
    check_job,
    check_parent,
    check_pid,
    limits_summary,
    signal_members,
)
from noded.cgroups.devrules import DeviceRules
from noded.cgroups.errors import (
    CgroupError,
    CgroupUnavailableError,
    GroupBusyError,
    GroupNotFoundError,
    LimitsError,
)
from noded.cgroups.limits import GroupLimits
from shared.cpulist import format_cpu_list
from shared.model import is_valid_name

log = logging.getLogger("trellis.cgroups.affinity")

STATE_VERSION = 1
PIN_PASSES = 10  # re-list threads until a pass finds none new (threads spawned while pinning)


@dataclass
class _Job:
    limits: GroupLimits
    members: dict[int, float] = field(default_factory=dict)  # pid -> process start time


def _start_time(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return None


def _process_table() -> dict[int, tuple[int, float, str]]:
    """pid -> (ppid, start time, status) for every process we can see."""
    table: dict[int, tuple[int, float, str]] = {}
    for proc in psutil.process_iter(["ppid", "create_time", "status"]):
        info = proc.info
        if info["ppid"] is not None and info["create_time"] is not None:
            table[proc.pid] = (info["ppid"], info["create_time"], info["status"])
    return table


def pin_process(pid: int, cpus: tuple[int, ...]) -> int:
    """Set the affinity of every thread of ``pid``; returns how many threads were pinned.

    Threads started while we walk /proc/PID/task inherit the mask of the thread that made
    them, which may not have been pinned yet, so we list again until nothing new appears.
    """
    mask = set(cpus)
    pinned: set[int] = set()
    for _ in range(PIN_PASSES):
        try:
            tids = {int(t) for t in os.listdir(f"/proc/{pid}/task")}
        except FileNotFoundError:
            return len(pinned)  # the process exited
        fresh = tids - pinned
        if not fresh:
            break
        for tid in sorted(fresh):
            try:
                os.sched_setaffinity(tid, mask)
            except ProcessLookupError:
                continue  # the thread exited
            except PermissionError as exc:
                raise CgroupError(
                    f"cannot set the CPU affinity of pid {pid} (thread {tid}): permission "
                    "denied; without root only processes of noded's own user can be pinned"
                ) from exc
            except OSError as exc:
                if exc.errno == errno.EINVAL:
                    raise LimitsError(
                        f"cpus {format_cpu_list(cpus)} are not allowed for pid {pid}: outside "
                        "the cpuset it runs in"
                    ) from exc
                raise
            pinned.add(tid)
    return len(pinned)


class AffinityManager:
    kind = "affinity"

    def __init__(self, parent: str, state_dir: Path) -> None:
        self.parent = check_parent(parent)
        self.state_dir = Path(state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        owner = self.state_dir.stat().st_uid
        if owner != os.geteuid():
            # the default lives in a shared temp dir: never trust one another user made
            raise CgroupError(
                f"affinity state dir {self.state_dir} belongs to uid {owner}, not to us "
                f"(uid {os.geteuid()}); pass a state_dir of our own"
            )
        self.state_file = self.state_dir / f"{self.parent}.affinity.json"
        self._jobs: dict[str, _Job] = self._load()

    # -- state file ----------------------------------------------------------------------------

    def _load(self) -> dict[str, _Job]:
        try:
            raw = json.loads(self.state_file.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise CgroupError(f"cannot read affinity state {self.state_file}: {exc}") from exc
        try:
            if raw.get("version") != STATE_VERSION or raw.get("parent") != self.parent:
                raise ValueError(
                    f"expected version {STATE_VERSION} for parent {self.parent}, got "
                    f"version {raw.get('version')!r} parent {raw.get('parent')!r}"
                )
            jobs: dict[str, _Job] = {}
            for job_id, entry in raw["jobs"].items():
                check_job(job_id)
                members = {check_pid(int(p)): float(t) for p, t in entry["members"].items()}
                jobs[job_id] = _Job(GroupLimits.from_dict(entry["limits"]), members)
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise CgroupError(f"affinity state {self.state_file} is malformed: {exc}") from exc
        return jobs

    def _save(self) -> None:
        data: dict[str, Any] = {
            "version": STATE_VERSION,
            "parent": self.parent,
            "jobs": {
                job_id: {
                    "limits": job.limits.to_dict(),
                    "members": {str(p): t for p, t in sorted(job.members.items())},
                }
                for job_id, job in sorted(self._jobs.items())
            },
        }
        tmp = self.state_file.with_name(self.state_file.name + ".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        os.replace(tmp, self.state_file)  # atomic: a crash leaves the old or the new file

    # -- membership ----------------------------------------------------------------------------

    def _job(self, job_id: str) -> _Job:
        check_job(job_id)
        job = self._jobs.get(job_id)
        if job is None:
            raise GroupNotFoundError(
                f"job {job_id!r} is not tracked by affinity parent {self.parent}"
            )
        return job

    def _refresh(self, job_id: str, job: _Job) -> list[int]:
        """Drop members that exited (or whose pid was recycled), adopt their descendants.

        One scan of the process table per call, not one per member: a job with many worker
        processes would otherwise cost members x processes reads.
        """
        table = _process_table()
        kids: dict[int, list[int]] = {}
        for pid, (ppid, _, _) in table.items():
            kids.setdefault(ppid, []).append(pid)
        current: dict[int, float] = {}
        todo = [
            pid
            for pid, started in job.members.items()
            if pid in table and table[pid][1] == started and table[pid][2] != psutil.STATUS_ZOMBIE
        ]
        while todo:
            pid = todo.pop()
            if pid in current:
                continue
            current[pid] = table[pid][1]
            todo.extend(k for k in kids.get(pid, ()) if table[k][2] != psutil.STATUS_ZOMBIE)
        if current != job.members:
            job.members = current
            self._save()
        return sorted(current)

    def _pin_all(self, job_id: str, job: _Job) -> None:
        for pid in self._refresh(job_id, job):
            pin_process(pid, job.limits.cpus)

    def _check_limits(self, job_id: str, limits: GroupLimits) -> None:
        avail = os.sched_getaffinity(0)
        missing = sorted(set(limits.cpus) - avail)
        if missing:
            raise LimitsError(
                f"cpus {format_cpu_list(missing)} not available to job {job_id!r}: noded may "
                f"only use cpus {format_cpu_list(avail)}"
            )
        unenforced = [
            name
            for name, value in (
                ("memory_bytes", limits.memory_bytes),
                ("cpu_quota_cores", limits.cpu_quota_cores),
            )
            if value is not None
        ]
        if unenforced:
            log.warning(
                "affinity confinement cannot enforce job=%s limits=%s", job_id, ",".join(unenforced)
            )

    # -- public API ----------------------------------------------------------------------------

    def create(self, job_id: str, limits: GroupLimits) -> None:
        check_job(job_id)
        self._check_limits(job_id, limits)
        job = self._jobs.get(job_id)
        if job is None:
            self._jobs[job_id] = job = _Job(limits)
        else:
            job.limits = limits
        self._save()
        self._pin_all(job_id, job)
        log.info("affinity group created job=%s %s", job_id, limits_summary(limits))

    def update(self, job_id: str, limits: GroupLimits) -> None:
        job = self._job(job_id)
        self._check_limits(job_id, limits)
        job.limits = limits
        self._save()
        self._pin_all(job_id, job)
        log.info("affinity group updated job=%s %s", job_id, limits_summary(limits))

    def attach_files(self, job_id: str) -> list[Path]:
        self._job(job_id)
        return []  # a starting process is pinned by add_pid once it exists

    def add_pid(self, job_id: str, pid: int) -> None:
        job = self._job(job_id)
        check_pid(pid)
        started = _start_time(pid)
        if started is None:
            raise ProcessLookupError(f"cannot add pid {pid} to job {job_id!r}: no such process")
        for other_id, other in self._jobs.items():
            if other_id != job_id and other.members.get(pid) == started:
                del other.members[pid]  # like a cgroup move: a process is in one group only
        job.members[pid] = started
        self._save()
        self._pin_all(job_id, job)

    def pids(self, job_id: str) -> list[int]:
        return self._refresh(job_id, self._job(job_id))

    def list_jobs(self) -> list[str]:
        return sorted(j for j in self._jobs if is_valid_name(j))

    def limits(self, job_id: str) -> GroupLimits:
        return self._job(job_id).limits

    def oom_kills(self, job_id: str) -> int | None:
        return None  # no memory controller: the kernel's global OOM killer says nothing per job

    def signal_all(self, job_id: str, sig: int) -> int:
        job = self._job(job_id)
        return signal_members(lambda: self._refresh(job_id, job), sig)

    def remove(self, job_id: str) -> None:
        check_job(job_id)
        job = self._jobs.get(job_id)
        if job is None:
            return
        members = self._refresh(job_id, job)
        if members:
            raise GroupBusyError(
                f"job {job_id!r} still has processes {members}; signal and reap them before "
                "removing it",
                members,
            )
        del self._jobs[job_id]
        self._save()

    def fence_support(self) -> tuple[str, str]:
        return "none", "CPU affinity confines no devices (the fence needs cgroups: run as root)"

    def fence_devices(self, job_id: str, rules: DeviceRules) -> None:
        raise CgroupUnavailableError(
            f"job {job_id!r}: no GPU device fence without cgroups ({self.fence_support()[1]})"
        )

    def remove_parent(self) -> None:
        if self._jobs:
            raise GroupBusyError(
                f"affinity parent {self.parent} still tracks jobs {sorted(self._jobs)}; remove "
                "them first"
            )
        with contextlib.suppress(FileNotFoundError):
            self.state_file.unlink()
