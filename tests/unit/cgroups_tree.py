"""An emulated cgroupfs for tests: a real directory tree with the kernel's file layout.

``EmulatedCgroupFs`` is a ``KernelWriter`` (the interface every cgroup write goes through) whose
``mkdir``/``rmdir``/``write``/``read`` also do what the kernel does on cgroupfs: populate a new
group's interface files, refuse a child cpuset outside its parent, refuse tasks in an empty v1
cpuset, honour ``cgroup.subtree_control`` delegation and the v2 "no internal processes" rule,
move a pid out of its old group, round memory limits to a page, and hide exited pids. It only
emulates bookkeeping: no real process is confined by it.

Used for what this machine lacks (a cgroup2 hierarchy with cpuset/cpu/memory delegated) and to
test v1 logic without root.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from shared.cpulist import format_cpu_list, parse_cpu_list
from shared.kernelfs import KernelWriteError, KernelWriter

PAGE = os.sysconf("SC_PAGE_SIZE")
V1_UNLIMITED = (1 << 63) - PAGE  # what v1 memory.limit_in_bytes reads when unlimited
ALL_V1 = ("cpuset", "cpu", "memory", "net_cls")
# One devices.deny rule as the kernel parses it: type, major, minor, access.
_DEVICE_RULE = re.compile(r"([abc]) (\*|\d+):(\*|\d+) ([rwm]{1,3})")
ALL_V2 = ("cpuset", "cpu", "io", "memory", "pids")


def _err(code: int, what: str) -> OSError:
    return OSError(code, f"{os.strerror(code)}: {what}")


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # zombies have left their cgroup


@dataclass(frozen=True)
class _Where:
    kind: str  # "v1" or "v2"
    ctl: str  # v1 controller name ("" for v2)
    mount: Path


class EmulatedCgroupFs(KernelWriter):
    """Build the tree under ``base`` and act as the kernel for writes into it.

    ``v1``: v1 controllers to mount at ``base/<ctl>``. ``v2``: controllers the cgroup2 root
    offers (None = no cgroup2 mount); mounted at ``base/unified`` when v1 controllers exist,
    else at ``base`` itself. ``cpuset_v2_mode`` emulates that v1 mount option (empty cpuset
    means inherit). ``mounts_file`` lists the mounts in /proc/mounts format.
    """

    def __init__(
        self,
        base: Path,
        *,
        v1: tuple[str, ...] = (),
        v2: tuple[str, ...] | None = None,
        cpus: str = "0-1",
        mems: str = "0",
        cpuset_v2_mode: bool = False,
    ) -> None:
        self.base = Path(os.path.abspath(base))
        self.cpus, self.mems = cpus, mems
        self.cpuset_v2_mode = cpuset_v2_mode
        self.where: dict[Path, _Where] = {}
        # v1 devices groups' deny exceptions: (type, major, minor, access), '*' as the kernel's.
        self.device_denied: dict[Path, list[tuple[str, str, str, str]]] = {}
        lines: list[str] = []
        for ctl in v1:
            mount = self.base / ctl
            mount.mkdir(parents=True)
            self.where[mount] = _Where("v1", ctl, mount)
            self._populate_v1(mount, ctl, root=True)
            opts = (
                "rw,relatime,"
                + ctl
                + (",cpuset_v2_mode" if ctl == "cpuset" and cpuset_v2_mode else "")
            )
            lines.append(f"cgroup {mount} cgroup {opts} 0 0")
        if v2 is not None:
            mount = self.base / "unified" if v1 else self.base
            mount.mkdir(parents=True, exist_ok=True)
            self.where[mount] = _Where("v2", "", mount)
            self._populate_v2_root(mount, v2)
            lines.append(f"cgroup2 {mount} cgroup2 rw,relatime 0 0")
        self.mounts_file = self.base.parent / f"{self.base.name}.mounts"
        self.mounts_file.write_text("\n".join(lines) + "\n")
        super().__init__(list(self.where))

    # -- helpers -------------------------------------------------------------------------------

    def _locate(self, path: Path) -> _Where:
        for mount, where in self.where.items():
            if path == mount or mount in path.parents:
                return where
        raise _err(errno.ENOENT, f"{path} is not in an emulated cgroup mount")

    @staticmethod
    def _get(path: Path) -> str:
        return path.read_text().strip()

    @staticmethod
    def _put(path: Path, value: str) -> None:
        path.write_text(value + "\n" if value else "")

    def _groups(self, mount: Path) -> list[Path]:
        return [mount, *[p for p in mount.rglob("*") if p.is_dir()]]

    def _live(self, group: Path) -> list[int]:
        text = (group / "cgroup.procs").read_text()
        return [p for p in (int(t) for t in text.split()) if _alive(p)]

    # -- layouts -------------------------------------------------------------------------------

    def _populate_v1(self, group: Path, ctl: str, root: bool = False) -> None:
        for name in ("cgroup.procs", "tasks"):
            self._put(group / name, "")
        self._put(group / "notify_on_release", "0")
        if root:
            self._put(group / "cgroup.clone_children", "0")
        if ctl == "cpuset":
            parent = group.parent
            clone = not root and self._get(parent / "cgroup.clone_children") == "1"
            for conf, eff, full in (
                ("cpuset.cpus", "cpuset.effective_cpus", self.cpus),
                ("cpuset.mems", "cpuset.effective_mems", self.mems),
            ):
                if root:
                    value = full
                elif clone:
                    value = self._get(parent / conf)
                else:
                    value = ""
                self._put(group / conf, value)
                inherit = self.cpuset_v2_mode and not value and not root
                self._put(group / eff, self._get(parent / eff) if inherit else value)
            self._put(group / "cpuset.memory_migrate", "0")
            if not root:
                self._put(group / "cgroup.clone_children", "0")
        elif ctl == "cpu":
            self._put(group / "cpu.cfs_period_us", "100000")
            self._put(group / "cpu.cfs_quota_us", "-1")
            self._put(group / "cpu.shares", "1024")
        elif ctl == "memory":
            self._put(group / "memory.limit_in_bytes", str(V1_UNLIMITED))
            self._put(group / "memory.usage_in_bytes", "0")
        elif ctl == "net_cls":
            self._put(group / "net_cls.classid", "0")
        elif ctl == "devices":
            # A new group copies its parent's rules; ours start from the root's "allow all",
            # which devices.list shows as such whatever deny exceptions are added.
            self._put(group / "devices.allow", "")
            self._put(group / "devices.deny", "")
            self._put(group / "devices.list", "a *:* rwm")
            if not root:
                self.device_denied[group] = list(self.device_denied.get(group.parent, []))

    def _populate_v2_root(self, mount: Path, offered: tuple[str, ...]) -> None:
        self._put(mount / "cgroup.controllers", " ".join(offered))
        for name in ("cgroup.subtree_control", "cgroup.procs", "cgroup.threads"):
            self._put(mount / name, "")
        self._put(mount / "cgroup.max.depth", "max")
        if "cpuset" in offered:
            self._put(mount / "cpuset.cpus.effective", self.cpus)
            self._put(mount / "cpuset.mems.effective", self.mems)

    def _v2_controller_files(self, group: Path, ctl: str, on: bool) -> None:
        files: dict[str, str] = {}
        parent = group.parent
        if ctl == "cpuset":
            files = {
                "cpuset.cpus": "",
                "cpuset.mems": "",
                "cpuset.cpus.effective": self._get(parent / "cpuset.cpus.effective"),
                "cpuset.mems.effective": self._get(parent / "cpuset.mems.effective"),
                "cpuset.cpus.partition": "member",
            }
        elif ctl == "cpu":
            files = {"cpu.max": "max 100000", "cpu.weight": "100"}
        elif ctl == "memory":
            files = {"memory.max": "max", "memory.high": "max", "memory.current": "0"}
        elif ctl == "pids":
            files = {"pids.max": "max", "pids.current": "0"}
        elif ctl == "io":
            files = {"io.max": "", "io.weight": "default 100"}
        for name, value in files.items():
            if on:
                self._put(group / name, value)
            else:
                (group / name).unlink(missing_ok=True)

    def _populate_v2(self, group: Path) -> None:
        enabled = self._get(group.parent / "cgroup.subtree_control").split()
        self._put(group / "cgroup.controllers", " ".join(enabled))
        for name in ("cgroup.subtree_control", "cgroup.procs", "cgroup.threads"):
            self._put(group / name, "")
        self._put(group / "cgroup.type", "domain")
        self._put(group / "cgroup.events", "populated 0\nfrozen 0")
        self._put(group / "cgroup.kill", "")
        for ctl in enabled:
            self._v2_controller_files(group, ctl, on=True)

    # -- KernelWriter interface ----------------------------------------------------------------

    def read(self, path: Path) -> str:
        full = self._check(path)
        text = full.read_text()
        if full.name in ("cgroup.procs", "tasks"):
            return "".join(f"{p}\n" for p in (int(t) for t in text.split()) if _alive(p))
        return text

    def mkdir(self, path: Path, *, what: str) -> bool:
        full = self._check(path)
        if full.exists():
            return False
        where = self._locate(full)
        if not full.parent.is_dir():
            raise _err(errno.ENOENT, str(full.parent))
        full.mkdir()
        if where.kind == "v1":
            self._populate_v1(full, where.ctl)
        else:
            self._populate_v2(full)
        self.log.info("emulated mkdir path=%s why=%s", full, what)
        return True

    def rmdir(self, path: Path, *, what: str) -> bool:
        full = self._check(path)
        if not full.is_dir():
            return False
        if full in self.where:
            raise _err(errno.EBUSY, f"{full} is a mount root")
        if any(p.is_dir() for p in full.iterdir()) or self._live(full):
            raise _err(errno.EBUSY, str(full))
        shutil.rmtree(full)  # the kernel's interface files vanish with the group
        self.device_denied.pop(full, None)
        self.log.info("emulated rmdir path=%s why=%s", full, what)
        return True

    def write(self, path: Path, value: str, *, what: str, compare: bool = True) -> bool:
        full = self._check(path)
        if compare and full.exists() and self._get(full) == value.strip():
            self.skipped += 1
            return False
        try:
            if not full.is_file():
                raise _err(errno.ENOENT, str(full))
            where = self._locate(full)
            if where.kind == "v1":
                self._write_v1(where, full, value.strip())
            else:
                self._write_v2(where, full, value.strip())
        except OSError as exc:
            raise KernelWriteError(
                exc.errno or errno.EIO, f"writing {value.strip()!r} to {full} failed: {exc}"
            ) from exc
        self.writes += 1
        self.log.info("emulated write path=%s value=%r why=%s", full, value.strip(), what)
        return True

    # -- v1 semantics --------------------------------------------------------------------------

    def _parse_set(self, value: str) -> tuple[int, ...]:
        try:
            return parse_cpu_list(value)
        except ValueError:
            raise _err(errno.EINVAL, value) from None

    def _move_pid(self, mount: Path, group: Path, value: str) -> None:
        try:
            pid = int(value)
        except ValueError:
            raise _err(errno.EINVAL, value) from None
        if pid == 0:
            raise _err(errno.EINVAL, "pid 0 is the writer itself; the emulator has no writer")
        if not _alive(pid):
            raise _err(errno.ESRCH, value)
        for other in self._groups(mount):
            procs = other / "cgroup.procs"
            kept = [p for p in procs.read_text().split() if int(p) != pid]
            self._put(procs, "\n".join(kept))
        self._put(
            group / "cgroup.procs",
            "\n".join([*self._get(group / "cgroup.procs").split(), str(pid)]),
        )

    def _write_v1(self, where: _Where, full: Path, value: str) -> None:
        group, name = full.parent, full.name
        if name in ("cgroup.procs", "tasks"):
            if where.ctl == "cpuset" and (
                not self._get(group / "cpuset.effective_cpus")
                or not self._get(group / "cpuset.effective_mems")
            ):
                raise _err(errno.ENOSPC, f"{group} has no cpus or mems")
            self._move_pid(where.mount, group, value)
        elif name in ("cpuset.cpus", "cpuset.mems"):
            if group == where.mount:
                raise _err(errno.EACCES, "the root cpuset is read-only")
            new = self._parse_set(value)
            eff = "cpuset.effective_cpus" if name == "cpuset.cpus" else "cpuset.effective_mems"
            parent_set = set(
                self._parse_set(self._get(group.parent / name))
                or self._parse_set(self._get(group.parent / eff))
            )
            if not set(new) <= parent_set:
                raise _err(errno.EINVAL, f"{value} not within parent {format_cpu_list(parent_set)}")
            for child in (p for p in group.iterdir() if p.is_dir()):
                if not set(self._parse_set(self._get(child / name))) <= set(new):
                    raise _err(errno.EBUSY, f"child {child.name} uses more than {value}")
            if not new and self._live(group) and not self.cpuset_v2_mode:
                raise _err(errno.ENOSPC, f"{group} has tasks")
            self._put(full, format_cpu_list(new))
            inherit = self.cpuset_v2_mode and not new
            self._put(
                group / eff, self._get(group.parent / eff) if inherit else format_cpu_list(new)
            )
        elif name == "memory.limit_in_bytes":
            number = int(value)
            self._put(full, str(V1_UNLIMITED if number == -1 else number - number % PAGE))
        elif name == "cpu.cfs_quota_us":
            quota = int(value)
            if quota != -1 and quota < 1000:
                raise _err(errno.EINVAL, value)
            self._put(full, str(quota))
        elif name == "cpu.cfs_period_us":
            if not 1000 <= int(value) <= 1_000_000:
                raise _err(errno.EINVAL, value)
            self._put(full, value)
        elif name == "net_cls.classid":
            if not 0 <= int(value) <= 0xFFFFFFFF:
                raise _err(errno.EINVAL, value)
            self._put(full, str(int(value)))
        elif name == "devices.deny":
            if group == where.mount:
                raise _err(errno.EINVAL, "the root devices group cannot be changed")
            match = _DEVICE_RULE.fullmatch(value)
            if match is None:
                raise _err(errno.EINVAL, f"not a device rule: {value!r} (one rule per write)")
            self.device_denied.setdefault(group, []).append(match.groups())  # type: ignore[arg-type]
        elif name in ("cpuset.memory_migrate", "cgroup.clone_children", "notify_on_release"):
            if value not in ("0", "1"):
                raise _err(errno.EINVAL, value)
            self._put(full, value)
        else:
            raise _err(errno.EACCES, f"{name} is read-only")

    def device_permitted(self, group: Path, major: int, minor: int, access: str = "rw") -> bool:
        """Whether a task of v1 devices ``group`` may access character device major:minor:
        the kernel's check of an allow-all group with deny exceptions, ancestors included."""
        for kind, mj, mn, acc in self.device_denied.get(Path(os.path.abspath(group)), []):
            if (kind in ("a", "c") and mj in ("*", str(major)) and mn in ("*", str(minor))
                    and set(acc) & set(access)):
                return False
        return True

    # -- v2 semantics --------------------------------------------------------------------------

    def _recompute_effective(self, group: Path) -> None:
        for conf, eff in (
            ("cpuset.cpus", "cpuset.cpus.effective"),
            ("cpuset.mems", "cpuset.mems.effective"),
        ):
            if not (group / conf).exists():
                continue
            parent_eff = set(self._parse_set(self._get(group.parent / eff)))
            mine = set(self._parse_set(self._get(group / conf)))
            # v2: the effective set is what the parent can give; empty falls back to the parent
            self._put(group / eff, format_cpu_list((mine & parent_eff) or parent_eff))
        for child in (p for p in group.iterdir() if p.is_dir()):
            self._recompute_effective(child)

    def _write_v2(self, where: _Where, full: Path, value: str) -> None:
        group, name = full.parent, full.name
        is_root = group == where.mount
        if name == "cgroup.subtree_control":
            offered = set(self._get(group / "cgroup.controllers").split())
            enabled = set(self._get(full).split())
            for token in value.split():
                sign, ctl = token[:1], token[1:]
                if sign not in "+-" or not ctl:
                    raise _err(errno.EINVAL, token)
                if sign == "+":
                    if ctl not in offered:
                        raise _err(errno.ENOENT, f"controller {ctl} not available in {group}")
                    if not is_root and self._live(group):
                        raise _err(errno.EBUSY, f"{group} has processes (no internal processes)")
                    enabled.add(ctl)
                else:
                    for child in (p for p in group.iterdir() if p.is_dir()):
                        if ctl in self._get(child / "cgroup.subtree_control").split():
                            raise _err(errno.EBUSY, f"{child} still delegates {ctl}")
                    enabled.discard(ctl)
            self._put(full, " ".join(c for c in ALL_V2 if c in enabled))
            for child in (p for p in group.iterdir() if p.is_dir()):
                had = set(self._get(child / "cgroup.controllers").split())
                self._put(child / "cgroup.controllers", " ".join(c for c in ALL_V2 if c in enabled))
                for ctl in enabled - had:
                    self._v2_controller_files(child, ctl, on=True)
                for ctl in had - enabled:
                    self._v2_controller_files(child, ctl, on=False)
        elif name == "cgroup.procs":
            if not is_root and self._get(group / "cgroup.subtree_control"):
                raise _err(errno.EBUSY, f"{group} delegates controllers (no internal processes)")
            self._move_pid(where.mount, group, value)
        elif name in ("cpuset.cpus", "cpuset.mems"):
            self._put(full, format_cpu_list(self._parse_set(value)))
            self._recompute_effective(group)
        elif name == "memory.max" or name == "memory.high":
            if value == "max":
                self._put(full, "max")
            else:
                number = int(value)
                if number < 0:
                    raise _err(errno.EINVAL, value)
                self._put(full, str(number - number % PAGE))
        elif name == "cpu.max":
            parts = value.split()
            if not 1 <= len(parts) <= 2:
                raise _err(errno.EINVAL, value)
            period = int(parts[1]) if len(parts) == 2 else int(self._get(full).split()[1])
            if not 1000 <= period <= 1_000_000:
                raise _err(errno.EINVAL, value)
            if parts[0] != "max" and int(parts[0]) < 1000:
                raise _err(errno.EINVAL, value)
            self._put(full, f"{parts[0]} {period}")
        elif name in ("cpu.weight", "pids.max", "io.max", "io.weight", "cgroup.kill"):
            self._put(full, value)
        else:
            raise _err(errno.EACCES, f"{name} is read-only")
