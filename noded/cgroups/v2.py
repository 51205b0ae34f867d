"""cgroup v2 backend: one unified hierarchy, groups at ``<cgroup2 mount>/<parent>/<job>``.

What v2 needs from the machine and from us:

* Controllers must be delegated down the chain. A group only has ``cpuset.*``/``cpu.*``/
  ``memory.*`` files when its parent lists the controller in ``cgroup.subtree_control``, and a
  group may only enable what its own ``cgroup.controllers`` offers. We enable cpuset, cpu and
  memory (whichever are offered) at the mount root and at our parent; a systemd host must
  delegate them to the unit (``Delegate=yes``) or mount cgroup2 with them available.
* The "no internal processes" rule: a non-root group with controllers enabled in
  ``cgroup.subtree_control`` may not hold processes itself. Our parent only ever holds job
  groups, and processes only ever join leaf job groups, so the rule never bites us.
* Unlike v1, an empty ``cpuset.cpus`` means "inherit", so no parent population is needed; the
  value in force is ``cpuset.cpus.effective``. Writing ``cpuset.cpus`` of a populated group
  re-pins every thread of every member.
* Limits: ``memory.max`` ("max" = unlimited), ``cpu.max`` ("$QUOTA $PERIOD" or "max $PERIOD").
  There is no net_cls in v2 (traffic is classified by cgroup path instead), so ``net_classid``
  is ignored here and reads back as None.

``require_cpuset=False`` makes a manager for a hierarchy without the cpuset controller (the
hybrid ``/sys/fs/cgroup/unified`` mount on many hosts): it still groups, tracks and signals
processes, but cannot pin them; ``detect_cgroups`` never picks such a manager.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from noded.cgroups import bpfdev
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
    subtree_pids,
    write_pid,
)
from noded.cgroups.devrules import DeviceRules
from noded.cgroups.errors import (
    CgroupUnavailableError,
    GroupBusyError,
    GroupNotFoundError,
    LimitsError,
)
from noded.cgroups.limits import GroupLimits
from shared.cpulist import format_cpu_list, parse_cpu_list
from shared.kernelfs import KernelWriteError, KernelWriter
from shared.model import is_valid_name

log = logging.getLogger("trellis.cgroups.v2")

WANTED_CONTROLLERS = ("cpuset", "cpu", "memory")
DEFAULT_CFS_PERIOD_US = 100_000
MIN_CFS_QUOTA_US = 1000
SYS_CPU_ONLINE = Path("/sys/devices/system/cpu/online")
SYS_NODE_ONLINE = Path("/sys/devices/system/node/online")


def controllers_of(writer: KernelWriter, group: Path) -> set[str]:
    text = quiet_read(writer, group / "cgroup.controllers")
    return set(text.split()) if text is not None else set()


def _online(path: Path, fallback: tuple[int, ...]) -> tuple[int, ...]:
    try:
        return parse_cpu_list(path.read_text()) or fallback
    except OSError:
        return fallback


class V2CgroupManager:
    kind = "v2"

    def __init__(
        self,
        parent: str,
        mount: Path,
        writer: KernelWriter | None = None,
        *,
        require_cpuset: bool = True,
    ) -> None:
        self.parent = check_parent(parent)
        self.mount = Path(os.path.abspath(mount))
        self.writer = writer or KernelWriter([self.mount])
        check_writer_covers(self.writer, [self.mount])
        if not (self.mount / "cgroup.controllers").exists():
            raise CgroupUnavailableError(f"{self.mount} is not a cgroup v2 hierarchy")
        self.require_cpuset = require_cpuset
        offered = controllers_of(self.writer, self.mount)
        if require_cpuset and "cpuset" not in offered:
            raise CgroupUnavailableError(
                f"cgroup v2 at {self.mount} does not delegate the cpuset controller "
                f"(cgroup.controllers: {' '.join(sorted(offered)) or 'none'})"
            )
        self.page_size = os.sysconf("SC_PAGE_SIZE")

    # -- paths ---------------------------------------------------------------------------------

    @property
    def parent_dir(self) -> Path:
        return self.mount / self.parent

    def _dir(self, job_id: str) -> Path:
        return self.mount / self.parent / job_id

    def _require(self, job_id: str) -> Path:
        check_job(job_id)
        group = self._dir(job_id)
        if not group.is_dir():
            raise GroupNotFoundError(f"job {job_id!r} has no cgroup under {self.parent_dir}")
        return group

    # -- controller delegation ----------------------------------------------------------------

    def _enable(self, group: Path) -> None:
        """Enable the wanted controllers that ``group`` offers for its children, one at a time
        so that one refusal (e.g. EBUSY from processes in a non-root group) does not block
        the others."""
        offered = controllers_of(self.writer, group)
        enabled = set(self.writer.read(group / "cgroup.subtree_control").split())
        for ctl in WANTED_CONTROLLERS:
            if ctl in offered and ctl not in enabled:
                try:
                    self.writer.write(
                        group / "cgroup.subtree_control",
                        f"+{ctl}",
                        what=f"delegate {ctl} to {self.parent} job groups",
                        compare=False,
                    )
                except KernelWriteError as exc:
                    log.warning("cannot enable controller=%s group=%s error=%s", ctl, group, exc)

    def _ensure_parent(self) -> set[str]:
        """Create the parent with delegation; returns the controllers job groups will get."""
        self.writer.mkdir(self.parent_dir, what="noded parent group")
        self._enable(self.mount)
        self._enable(self.parent_dir)
        return set(self.writer.read(self.parent_dir / "cgroup.subtree_control").split())

    def _check_supported(self, job_id: str, limits: GroupLimits, have: set[str]) -> None:
        needs = [
            ("memory", limits.memory_bytes is not None),
            ("cpu", limits.cpu_quota_cores is not None),
            ("cpuset", self.require_cpuset),
        ]
        for ctl, wanted in needs:
            if wanted and ctl not in have:
                raise CgroupUnavailableError(
                    f"job {job_id!r} needs the {ctl} controller but it is not delegated to "
                    f"{self.parent_dir} (enabled for its children: "
                    f"{' '.join(sorted(have)) or 'none'})"
                )
        if "cpuset" in have:
            avail = parse_cpu_list(self.writer.read(self.parent_dir / "cpuset.cpus.effective"))
            nodes = parse_cpu_list(self.writer.read(self.parent_dir / "cpuset.mems.effective"))
            for what, want, got in (("cpus", limits.cpus, avail), ("mems", limits.mems, nodes)):
                missing = sorted(set(want) - set(got))
                if missing:
                    raise LimitsError(
                        f"{what} {format_cpu_list(missing)} not available: cgroup parent "
                        f"{self.parent} has {what} {format_cpu_list(got) or 'none'}"
                    )

    # -- limits --------------------------------------------------------------------------------

    def _apply(self, job_id: str, group: Path, limits: GroupLimits) -> None:
        why = f"job {job_id} limits"
        have = controllers_of(self.writer, group)
        if "cpuset" in have:
            self.writer.write(group / "cpuset.mems", format_cpu_list(limits.mems), what=why)
            self.writer.write(group / "cpuset.cpus", format_cpu_list(limits.cpus), what=why)
        else:
            log.warning("cpuset not delegated job=%s cpus=%s not enforced", job_id, limits.cpus)
        if "memory" in have:
            if limits.memory_bytes is None:
                value = "max"
            else:
                value = str(limits.memory_bytes - limits.memory_bytes % self.page_size)
            self.writer.write(group / "memory.max", value, what=why)
        if "cpu" in have:
            current = self.writer.read(group / "cpu.max").split()
            period = int(current[1]) if len(current) == 2 else DEFAULT_CFS_PERIOD_US
            if limits.cpu_quota_cores is None:
                quota = "max"
            else:
                quota = str(max(MIN_CFS_QUOTA_US, round(limits.cpu_quota_cores * period)))
            self.writer.write(group / "cpu.max", f"{quota} {period}", what=why)
        if limits.net_classid is not None:
            log.debug(
                "no net_cls on cgroup v2 job=%s classid=%s ignored", job_id, limits.net_classid
            )
        log.info("cgroup limits applied kind=v2 job=%s %s", job_id, limits_summary(limits))

    # -- public API ----------------------------------------------------------------------------

    def create(self, job_id: str, limits: GroupLimits) -> None:
        check_job(job_id)
        have = self._ensure_parent()
        self._check_supported(job_id, limits, have)
        group = self._dir(job_id)
        self.writer.mkdir(group, what=f"job {job_id} group")
        self._apply(job_id, group, limits)

    def update(self, job_id: str, limits: GroupLimits) -> None:
        group = self._require(job_id)
        self._check_supported(job_id, limits, controllers_of(self.writer, group))
        self._apply(job_id, group, limits)

    def attach_files(self, job_id: str) -> list[Path]:
        return [self._require(job_id) / "cgroup.procs"]

    def add_pid(self, job_id: str, pid: int) -> None:
        group = self._require(job_id)
        write_pid(self.writer, group / "cgroup.procs", check_pid(pid), job_id)

    def pids(self, job_id: str) -> list[int]:
        group = self._require(job_id)
        found = subtree_pids(self.writer, group)  # with a container runtime's nested groups
        if found is None:
            raise GroupNotFoundError(f"job {job_id!r} has no cgroup under {self.parent_dir}")
        return found

    def list_jobs(self) -> list[str]:
        if not self.parent_dir.is_dir():
            return []
        return sorted(
            p.name for p in self.parent_dir.iterdir() if p.is_dir() and is_valid_name(p.name)
        )

    def limits(self, job_id: str) -> GroupLimits:
        group = self._require(job_id)
        have = controllers_of(self.writer, group)
        if "cpuset" in have:
            cpus = parse_cpu_list(self.writer.read(group / "cpuset.cpus")) or parse_cpu_list(
                self.writer.read(group / "cpuset.cpus.effective")
            )
            mems = parse_cpu_list(self.writer.read(group / "cpuset.mems")) or parse_cpu_list(
                self.writer.read(group / "cpuset.mems.effective")
            )
        else:
            # unconfined: the group may run wherever the machine can
            cpus = _online(SYS_CPU_ONLINE, tuple(sorted(os.sched_getaffinity(0))))
            mems = _online(SYS_NODE_ONLINE, (0,))
        memory: int | None = None
        if "memory" in have:
            raw = self.writer.read(group / "memory.max").strip()
            memory = None if raw == "max" else int(raw)
        quota: float | None = None
        if "cpu" in have:
            q, period = self.writer.read(group / "cpu.max").split()
            quota = None if q == "max" else int(q) / int(period)
        return GroupLimits(cpus=cpus, mems=mems, memory_bytes=memory, cpu_quota_cores=quota)

    def oom_kills(self, job_id: str) -> int | None:
        return parse_oom_kill(quiet_read(self.writer, self._require(job_id) / "memory.events"))

    def signal_all(self, job_id: str, sig: int) -> int:
        group = self._require(job_id)

        def members() -> list[int]:
            return subtree_pids(self.writer, group) or []

        return signal_members(members, sig)

    def remove(self, job_id: str) -> None:
        check_job(job_id)
        group = self._dir(job_id)
        if not group.is_dir():
            return
        members = self.pids(job_id)
        if members:
            raise GroupBusyError(
                f"job {job_id!r} still has processes {members}; signal and reap them before "
                "removing its cgroup",
                members,
            )
        remove_subgroups(self.writer, group, job_id)
        rmdir_group(self.writer, group, f"job {job_id} removed", "a process joined while removing")

    def fence_support(self) -> tuple[str, str]:
        problem = bpfdev.probe()
        return ("none", problem) if problem else ("bpf", "")

    def fence_devices(self, job_id: str, rules: DeviceRules) -> None:
        group = self._require(job_id)
        self.writer.on_dir(group, lambda fd: bpfdev.fence(fd, rules),
                           what=f"job {job_id} GPU device fence (device program)")

    def remove_parent(self) -> None:
        jobs = self.list_jobs()
        if jobs:
            raise GroupBusyError(
                f"cgroup parent {self.parent} still has job groups {jobs}; remove them first"
            )
        # the controllers we enabled at the mount root stay: other groups may rely on them
        rmdir_group(
            self.writer,
            self.parent_dir,
            "noded parent group removed",
            "processes sit directly in the parent group",
        )
