"""cgroup v1 backend: one directory per controller hierarchy.

Layout: ``<mount of C>/<parent>/<job>`` for C in cpuset (required), cpu, memory and net_cls
(each used when mounted). What v1 needs from us that v2 does not:

* A new cpuset group starts with empty ``cpuset.cpus``/``cpuset.mems`` and the kernel refuses
  tasks (ENOSPC) until both are set; a child's sets must lie within its parent's. So our parent
  group is populated from the hierarchy root before any job group is made. With the
  ``cpuset_v2_mode`` mount option an empty ``cpuset.cpus`` means "inherit", so reads fall back to
  ``cpuset.effective_cpus`` when the configured list is empty.
* Writing ``cpuset.cpus`` of a populated group re-pins every thread of every member at once
  (the kernel rewrites each task's allowed mask), which is what a live ``update`` relies on.
  A thread that narrowed its own affinity inside the group (an OpenMP runtime pinning its
  workers) is forced onto the new set when its choice no longer fits; when it fits again,
  kernels >= 6.2 give it back its own choice rather than the whole set.
* ``cpuset.memory_migrate`` is set so that moving a job to other NUMA nodes moves its pages too.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path

from noded.cgroups.base import (
    check_job,
    check_parent,
    check_pid,
    check_writer_covers,
    limits_summary,
    parse_oom_kill,
    quiet_read,
    remove_subgroups,
    rmdir_group,
    signal_members,
    subgroups,
    subtree_pids,
    write_pid,
)
from noded.cgroups.devrules import DeviceRules, v1_deny_lines
from noded.cgroups.errors import (
    CgroupUnavailableError,
    GroupBusyError,
    GroupNotFoundError,
    LimitsError,
)
from noded.cgroups.limits import GroupLimits
from noded.cgroups.mounts import V1_CONTROLLERS
from shared.cpulist import format_cpu_list, parse_cpu_list
from shared.kernelfs import KernelWriter
from shared.model import is_valid_name

log = logging.getLogger("trellis.cgroups.v1")

UNLIMITED_MEMORY_FLOOR = 1 << 62  # the kernel reports "no limit" as PAGE_COUNTER_MAX pages
MIN_CFS_QUOTA_US = 1000


class V1CgroupManager:
    kind = "v1"

    def __init__(
        self, parent: str, mounts: dict[str, Path], writer: KernelWriter | None = None,
        others: Sequence[Path] = (),
    ) -> None:
        """``others``: the v1 hierarchies noded configures nothing in, where a container
        runtime nests the job's group too (podman's --cgroup-parent with cgroupfs makes it
        in every hierarchy): removing a job or the parent removes those as well."""
        self.parent = check_parent(parent)
        if "cpuset" not in mounts:
            raise CgroupUnavailableError(
                "cgroup v1 needs the cpuset hierarchy mounted; found only "
                f"{sorted(mounts) or 'no v1 controllers'}"
            )
        # cpuset first: it is the hierarchy that defines membership and must be joined first
        self.mounts = {c: Path(mounts[c]) for c in V1_CONTROLLERS if c in mounts}
        self.others = tuple(Path(p) for p in others if Path(p) not in self.mounts.values())
        roots = sorted({*self.mounts.values(), *self.others})
        self.writer = writer or KernelWriter(roots)
        check_writer_covers(self.writer, roots)
        self.page_size = os.sysconf("SC_PAGE_SIZE")

    # -- paths ---------------------------------------------------------------------------------

    def _parent_dir(self, ctl: str) -> Path:
        return self.mounts[ctl] / self.parent

    def _dir(self, ctl: str, job_id: str) -> Path:
        return self.mounts[ctl] / self.parent / job_id

    def _exists(self, job_id: str) -> bool:
        return self._dir("cpuset", job_id).is_dir()

    def _require(self, job_id: str) -> str:
        check_job(job_id)
        if not self._exists(job_id):
            raise GroupNotFoundError(
                f"job {job_id!r} has no cgroup under {self._parent_dir('cpuset')}"
            )
        return job_id

    # -- cpuset population ---------------------------------------------------------------------

    def _read_set(self, group: Path, name: str, effective: str) -> tuple[int, ...]:
        configured = parse_cpu_list(self.writer.read(group / name))
        if configured:
            return configured
        text = quiet_read(self.writer, group / effective)
        return parse_cpu_list(text) if text is not None else ()

    def _populate_parent(self, limits: GroupLimits) -> None:
        """Give our parent cpuset the root's CPUs/nodes when it lacks what a job asks for."""
        top = self.mounts["cpuset"]
        pdir = self._parent_dir("cpuset")
        for name, effective, want in (
            ("cpuset.mems", "cpuset.effective_mems", limits.mems),
            ("cpuset.cpus", "cpuset.effective_cpus", limits.cpus),
        ):
            have = parse_cpu_list(self.writer.read(pdir / name))
            if have and set(want) <= set(have):
                continue
            source = self._read_set(top, name, effective)
            self.writer.write(
                pdir / name, format_cpu_list(source), what=f"populate parent {self.parent}"
            )

    def _check_grantable(self, limits: GroupLimits) -> None:
        pdir = self._parent_dir("cpuset")
        for what, name, effective, want in (
            ("cpus", "cpuset.cpus", "cpuset.effective_cpus", limits.cpus),
            ("mems", "cpuset.mems", "cpuset.effective_mems", limits.mems),
        ):
            avail = self._read_set(pdir, name, effective)
            missing = sorted(set(want) - set(avail))
            if missing:
                raise LimitsError(
                    f"{what} {format_cpu_list(missing)} not available: cgroup parent "
                    f"{self.parent} has {what} {format_cpu_list(avail) or 'none'}"
                )

    def _check_supported(self, job_id: str, limits: GroupLimits) -> None:
        for ctl, wanted in (
            ("memory", limits.memory_bytes is not None),
            ("cpu", limits.cpu_quota_cores is not None),
        ):
            if wanted and ctl not in self.mounts:
                raise CgroupUnavailableError(
                    f"job {job_id!r} asks for a {ctl} limit but the v1 {ctl} controller is not "
                    "mounted"
                )

    def _ensure_parent(self, limits: GroupLimits) -> None:
        for ctl in self.mounts:
            self.writer.mkdir(self._parent_dir(ctl), what=f"noded parent group ({ctl})")
        self._populate_parent(limits)
        self._check_grantable(limits)

    # -- limits --------------------------------------------------------------------------------

    def _apply(self, job_id: str, limits: GroupLimits) -> None:
        why = f"job {job_id} limits"
        cs = self._dir("cpuset", job_id)
        # mems before cpus: both must be non-empty before tasks can join, and neither order
        # matters for an update.
        nested = subgroups(cs)
        if nested:
            self._widen_nested(cs, nested, limits, why)
        self.writer.write(cs / "cpuset.mems", format_cpu_list(limits.mems), what=why)
        self.writer.write(cs / "cpuset.cpus", format_cpu_list(limits.cpus), what=why)
        if "memory" in self.mounts:
            self._write_memory(self._dir("memory", job_id) / "memory.limit_in_bytes", limits, why)
        if "cpu" in self.mounts:
            self._write_quota(self._dir("cpu", job_id), limits, why)
        if "net_cls" in self.mounts:
            classid = str(limits.net_classid or 0)
            self.writer.write(self._dir("net_cls", job_id) / "net_cls.classid", classid, what=why)
        elif limits.net_classid is not None:
            log.debug("net_cls not mounted job=%s classid=%s ignored", job_id, limits.net_classid)
        log.info("cgroup limits applied kind=v1 job=%s %s", job_id, limits_summary(limits))

    def _widen_nested(self, cs: Path, nested: list[Path], limits: GroupLimits,
                      why: str) -> None:
        """A v1 cpuset must hold its children's CPUs, and a child does not follow its parent:
        to re-pin a job whose container runtime nested a group below its own, the job's group
        takes the union first, then every nested group (top down) the new set; the caller
        then narrows the job's group."""
        for name, new in (("cpuset.mems", limits.mems), ("cpuset.cpus", limits.cpus)):
            union = sorted(set(parse_cpu_list(self.writer.read(cs / name))) | set(new))
            self.writer.write(cs / name, format_cpu_list(tuple(union)), what=why)
            for group in reversed(nested):
                self.writer.write(group / name, format_cpu_list(new), what=why)

    def _write_memory(self, path: Path, limits: GroupLimits, why: str) -> None:
        if limits.memory_bytes is None:
            # "-1" reads back as a huge number, so compare ourselves to keep no-op writes quiet
            current = int(self.writer.read(path).strip())
            if current < UNLIMITED_MEMORY_FLOOR:
                self.writer.write(path, "-1", what=why, compare=False)
            return
        # the kernel rounds down to a page; doing it here makes the read-back match the write
        value = limits.memory_bytes - limits.memory_bytes % self.page_size
        self.writer.write(path, str(value), what=why)

    def _write_quota(self, cpu_dir: Path, limits: GroupLimits, why: str) -> None:
        if limits.cpu_quota_cores is None:
            quota = -1
        else:
            period = int(self.writer.read(cpu_dir / "cpu.cfs_period_us").strip())
            quota = max(MIN_CFS_QUOTA_US, round(limits.cpu_quota_cores * period))
        self.writer.write(cpu_dir / "cpu.cfs_quota_us", str(quota), what=why)

    # -- public API ----------------------------------------------------------------------------

    def create(self, job_id: str, limits: GroupLimits) -> None:
        check_job(job_id)
        self._check_supported(job_id, limits)
        self._ensure_parent(limits)
        for ctl in self.mounts:
            self.writer.mkdir(self._dir(ctl, job_id), what=f"job {job_id} group ({ctl})")
        migrate = self._dir("cpuset", job_id) / "cpuset.memory_migrate"
        if migrate.exists():
            self.writer.write(migrate, "1", what=f"job {job_id}: pages follow a NUMA re-pin")
        self._apply(job_id, limits)

    def update(self, job_id: str, limits: GroupLimits) -> None:
        self._require(job_id)
        self._check_supported(job_id, limits)
        self._ensure_parent(limits)
        self._apply(job_id, limits)

    def attach_files(self, job_id: str) -> list[Path]:
        self._require(job_id)
        return [self._dir(ctl, job_id) / "cgroup.procs" for ctl in self.mounts]

    def add_pid(self, job_id: str, pid: int) -> None:
        self._require(job_id)
        check_pid(pid)
        for path in self.attach_files(job_id):
            write_pid(self.writer, path, pid, job_id)

    def _procs(self, ctl: str, job_id: str) -> list[int] | None:
        # With the groups a container runtime nests below the job's (noded/containers).
        return subtree_pids(self.writer, self._dir(ctl, job_id))

    def oom_kills(self, job_id: str) -> int | None:
        check_job(job_id)
        if "memory" not in self.mounts:
            return None
        return parse_oom_kill(quiet_read(self.writer,
                                         self._dir("memory", job_id) / "memory.oom_control"))

    def pids(self, job_id: str) -> list[int]:
        check_job(job_id)
        found = self._procs("cpuset", job_id)
        if found is None:
            raise GroupNotFoundError(
                f"job {job_id!r} has no cgroup under {self._parent_dir('cpuset')}"
            )
        return found

    def list_jobs(self) -> list[str]:
        jobs: set[str] = set()
        for ctl in self.mounts:
            pdir = self._parent_dir(ctl)
            if pdir.is_dir():
                jobs.update(p.name for p in pdir.iterdir() if p.is_dir() and is_valid_name(p.name))
        return sorted(jobs)

    def limits(self, job_id: str) -> GroupLimits:
        self._require(job_id)
        cs = self._dir("cpuset", job_id)
        cpus = self._read_set(cs, "cpuset.cpus", "cpuset.effective_cpus")
        mems = self._read_set(cs, "cpuset.mems", "cpuset.effective_mems")
        memory: int | None = None
        if "memory" in self.mounts:
            raw = int(self.writer.read(self._dir("memory", job_id) / "memory.limit_in_bytes"))
            memory = None if raw >= UNLIMITED_MEMORY_FLOOR else raw
        quota: float | None = None
        if "cpu" in self.mounts:
            cpu_dir = self._dir("cpu", job_id)
            q = int(self.writer.read(cpu_dir / "cpu.cfs_quota_us"))
            if q > 0:
                quota = q / int(self.writer.read(cpu_dir / "cpu.cfs_period_us"))
        classid: int | None = None
        if "net_cls" in self.mounts:
            classid = (
                int(self.writer.read(self._dir("net_cls", job_id) / "net_cls.classid")) or None
            )
        return GroupLimits(
            cpus=cpus, mems=mems, memory_bytes=memory, cpu_quota_cores=quota, net_classid=classid
        )

    def signal_all(self, job_id: str, sig: int) -> int:
        self._require(job_id)
        return signal_members(lambda: self._procs("cpuset", job_id) or [], sig)

    def _job_dirs(self, job_id: str) -> list[Path]:
        """The job's group in every hierarchy where it exists, the runtime's ones too."""
        dirs = [self._dir(c, job_id) for c in self.mounts]
        dirs += [root / self.parent / job_id for root in self.others]
        return [d for d in dirs if d.is_dir()]

    def remove(self, job_id: str) -> None:
        check_job(job_id)
        present = self._job_dirs(job_id)
        members = sorted({p for d in present for p in (subtree_pids(self.writer, d) or [])})
        if members:
            raise GroupBusyError(
                f"job {job_id!r} still has processes {members}; signal and reap them before "
                "removing its cgroup",
                members,
            )
        for group in present:
            remove_subgroups(self.writer, group, job_id)
            rmdir_group(
                self.writer,
                group,
                f"job {job_id} removed",
                "a process joined while removing, or a child group exists",
            )

    def fence_support(self) -> tuple[str, str]:
        if "devices" in self.mounts:
            return "devices", ""
        return "none", "the cgroup v1 devices controller is not mounted"

    def fence_devices(self, job_id: str, rules: DeviceRules) -> None:
        self._require(job_id)
        if "devices" not in self.mounts:
            raise CgroupUnavailableError(
                f"job {job_id!r} needs a GPU device fence but the v1 devices controller is "
                "not mounted"
            )
        # One rule per write: the kernel parses one per write(2). The group starts from its
        # parent's "allow all", so the deny lines are the whole fence (see devrules).
        deny = self._dir("devices", job_id) / "devices.deny"
        for line in v1_deny_lines(rules):
            self.writer.write(deny, line, what=f"job {job_id} GPU device fence", compare=False)

    def remove_parent(self) -> None:
        jobs = self.list_jobs()
        if jobs:
            raise GroupBusyError(
                f"cgroup parent {self.parent} still has job groups {jobs}; remove them first"
            )
        for ctl in self.mounts:
            rmdir_group(
                self.writer,
                self._parent_dir(ctl),
                "noded parent group removed",
                "processes sit directly in the parent group",
            )
        for root in self.others:
            # What a container runtime left of jobs whose own groups are gone already (its
            # processes killed, e.g. a node's crash): empty groups, removed with the parent.
            parent = root / self.parent
            if not parent.is_dir():
                continue
            for job in sorted(d.name for d in parent.iterdir() if d.is_dir()):
                remove_subgroups(self.writer, parent / job, job)
                rmdir_group(self.writer, parent / job, f"job {job} removed",
                            "a process still runs in the container's group")
            rmdir_group(self.writer, parent, "noded parent group removed",
                        "processes sit directly in the parent group")
