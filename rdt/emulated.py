"""An emulated resctrl: a real directory tree with the kernel's layout, for machines without RDT.

``build_tree(root, profile)`` lays out what ``mount -t resctrl`` would show on a machine with that
profile (``info/``, the root group's ``schemata``/``tasks``/``mon_data``, ``mon_groups/``) plus a
mount-table file next to it (``<root>.emulation/mounts``) that names the tree as a resctrl mount,
with ``mba_MBps`` for the "mbps" profile. Tests and the demo advance the monitoring counters with
``advance_mbm`` / ``set_counter``.

A plain directory cannot refuse a mkdir or merge a partial schemata write, so the kernel's side
of those operations lives in ``EmulatedFs``, a subclass of the one filesystem seam Resctrl uses
(rdt.fs.ResctrlFs). Every change still goes through the KernelWriter; EmulatedFs only validates
first (as the kernel would, with its error numbers and ``info/last_cmd_status`` wording) and then
rewrites files to what the kernel would show afterwards. All its state is in the tree, so any
number of processes (a demo node daemon, a test) can share one emulated mount.

What the emulation does not do that the kernel does:
- no enforcement: nothing throttles bandwidth or partitions the cache; counters move only when
  advanced; a group's ``size`` file, ``bit_usage`` and exclusive/pseudo-locked modes are absent
  or static;
- the root group's ``tasks`` lists only ids moved back to it (the kernel lists every task not
  in another group), and ids of exited threads stay listed until moved;
- ``cpus``/``cpus_list`` are present but inert; ``tasks`` takes one id per write (older
  kernels; newer ones also accept comma-separated lists);
- RMIDs go to limbo on rmdir only if the group's llc_occupancy is above
  ``max_threshold_occupancy``, and stay there until ``drain_limbo`` (the kernel re-checks
  every second);
- an unknown cache id in a schemata write gets a last_cmd_status message (the kernel leaves it
  empty).
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import logging
import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rdt.capabilities import ResctrlCapabilities, discover, resctrl_mount_options
from rdt.errors import ResctrlError
from rdt.fs import ResctrlFs
from rdt.monitor import EVENTS, MBM_EVENTS
from rdt.resctrl import RESERVED, Resctrl
from rdt.schemata import (
    MAX_MB_PERCENT,
    MAX_MBPS,
    cbm_problem,
    format_value,
    is_cache_resource,
    parse_schemata,
    round_mb_percent,
)
from shared.kernelfs import KernelWriteError, KernelWriter

log = logging.getLogger("trellis.rdt.emulated")


@dataclass(frozen=True)
class Profile:
    """The hardware an emulated tree describes. build_tree's keyword arguments override fields."""

    domains: tuple[int, ...] = (0, 1)
    cat: bool = True
    cbm_mask: int = 0x7FF  # 11 ways, as on many Xeons
    min_cbm_bits: int = 1
    l3_closids: int = 16
    cdp: bool = False
    mba: bool = True
    mb_closids: int = 8
    min_bandwidth: int = 10
    bandwidth_gran: int = 10
    delay_linear: bool = True
    mbps: bool = False
    monitoring: bool = True
    num_rmids: int = 64
    mon_features: tuple[str, ...] = EVENTS
    max_threshold_occupancy: int = 1 << 20


PROFILES: dict[str, Profile] = {
    "full": Profile(),
    "no_mb": Profile(mba=False),
    "mbps": Profile(mbps=True),
    "gaps": Profile(domains=(0, 2), cbm_mask=0xFFF),
    "few_closids": Profile(l3_closids=4, mb_closids=4),
    "mon_only": Profile(cat=False, mba=False),
}


@dataclass(frozen=True)
class EmulatedTree:
    root: Path
    mounts: Path
    profile: Profile


def state_dir(root: Path) -> Path:
    """Where the emulation keeps what is not part of the kernel's tree (mount table, limbo)."""
    root = Path(os.path.abspath(root))
    return root.parent / f"{root.name}.emulation"


def mounts_path(root: Path) -> Path:
    return state_dir(root) / "mounts"


# ---------------------------------------------------------------------------------------------
# Building a tree


def build_tree(root: Path, profile: str = "full", **overrides: object) -> EmulatedTree:
    """Create an emulated resctrl mount at ``root`` (which must be absent or empty)."""
    if profile not in PROFILES:
        raise ValueError(f"unknown resctrl profile {profile!r}: choose from {sorted(PROFILES)}")
    fields = {f.name for f in dataclasses.fields(Profile)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise TypeError(f"unknown profile setting(s) {unknown}: known are {sorted(fields)}")
    prof = dataclasses.replace(PROFILES[profile], **overrides)  # type: ignore[arg-type]
    _check_profile(prof)
    root = Path(os.path.abspath(root))
    if root.exists() and any(root.iterdir()):
        raise FileExistsError(f"{root} is not empty; emulated trees are built in a fresh directory")
    root.mkdir(parents=True, exist_ok=True)

    info = root / "info"
    _put(info / "last_cmd_status", "ok")
    cat_resources = ("L3CODE", "L3DATA") if prof.cdp else ("L3",)
    if prof.cat:
        for res in cat_resources:
            d = info / res
            _put(d / "cbm_mask", f"{prof.cbm_mask:x}")
            _put(d / "min_cbm_bits", str(prof.min_cbm_bits))
            # CDP uses two CLOSIDs' worth of masks per group, so the kernel halves the count.
            _put(d / "num_closids", str(prof.l3_closids // 2 if prof.cdp else prof.l3_closids))
            _put(d / "shareable_bits", "0")
            _put(d / "sparse_masks", "0")
            _put(d / "bit_usage", ";".join(f"{i}={'S' * prof.cbm_mask.bit_length()}"
                                           for i in prof.domains))
    if prof.mba:
        d = info / "MB"
        _put(d / "min_bandwidth", str(prof.min_bandwidth))
        _put(d / "bandwidth_gran", str(prof.bandwidth_gran))
        _put(d / "num_closids", str(prof.mb_closids))
        _put(d / "delay_linear", "1" if prof.delay_linear else "0")
        _put(d / "thread_throttle_mode", "max")
    if prof.monitoring:
        d = info / "L3_MON"
        _put(d / "num_rmids", str(prof.num_rmids))
        _put(d / "mon_features", "".join(f + "\n" for f in prof.mon_features))
        _put(d / "max_threshold_occupancy", str(prof.max_threshold_occupancy))

    schemata: dict[str, dict[int, int]] = {}
    if prof.cat:
        for res in cat_resources:
            schemata[res] = dict.fromkeys(prof.domains, prof.cbm_mask)
    if prof.mba:
        schemata["MB"] = dict.fromkeys(prof.domains, MAX_MBPS if prof.mbps else MAX_MB_PERCENT)
    _populate_group(root, schemata, prof.monitoring, prof.domains, prof.mon_features,
                    ctrl=True, mbps_event=prof.mbps)

    options = "rw,relatime" + (",mba_MBps" if prof.mbps else "") + (",cdp" if prof.cdp else "")
    state = state_dir(root)
    state.mkdir(exist_ok=True)
    mounts = state / "mounts"
    escaped = str(root).replace("\\", "\\134").replace(" ", "\\040").replace("\t", "\\011")
    mounts.write_text(
        "proc /proc proc rw,nosuid,nodev,noexec,relatime 0 0\n"
        f"resctrl {escaped} resctrl {options} 0 0\n"
    )
    (state / "limbo_rmids").write_text("0\n")
    log.info("emulated resctrl built root=%s profile=%s", root, profile)
    return EmulatedTree(root=root, mounts=mounts, profile=prof)


def _check_profile(p: Profile) -> None:
    if not p.domains or any(d < 0 for d in p.domains) or len(set(p.domains)) != len(p.domains):
        raise ValueError(f"domains must be distinct non-negative cache ids, got {p.domains}")
    if p.cbm_mask <= 0 or p.cbm_mask & (p.cbm_mask + 1) or p.cbm_mask.bit_length() > 32:
        raise ValueError(f"cbm_mask must be contiguous low bits (<=32), got {p.cbm_mask:#x}")
    if not 0 <= p.min_cbm_bits <= p.cbm_mask.bit_length():
        raise ValueError(f"min_cbm_bits {p.min_cbm_bits} does not fit cbm_mask {p.cbm_mask:#x}")
    for name in ("l3_closids", "mb_closids", "num_rmids", "bandwidth_gran"):
        if getattr(p, name) < 1:
            raise ValueError(f"{name} must be at least 1")
    unknown = set(p.mon_features) - set(EVENTS)
    if unknown:
        raise ValueError(f"unknown monitoring features {sorted(unknown)}")
    if p.mbps and not (p.mba and p.monitoring and set(MBM_EVENTS) & set(p.mon_features)):
        raise ValueError("mba_MBps needs MBA and MBM (the kernel refuses the mount otherwise)")


def _put(path: Path, text: str) -> None:
    """Kernel-side file update: atomic so a concurrent reader never sees half a value."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}.{threading.get_ident()}")
    tmp.write_text(text if text.endswith("\n") or not text else text + "\n")
    os.replace(tmp, path)


def _render_schemata(lines: dict[str, dict[int, int]]) -> str:
    width = max((len(r) for r in lines), default=0)
    out = []
    for res, vals in lines.items():
        body = ";".join(f"{d}={format_value(res, v)}" for d, v in sorted(vals.items()))
        out.append(f"{res:>{width}}:{body}\n")
    return "".join(out)


def _populate_group(
    path: Path,
    schemata: dict[str, dict[int, int]] | None,
    monitoring: bool,
    domains: Sequence[int],
    features: Sequence[str],
    *,
    ctrl: bool,
    mbps_event: bool = False,
) -> None:
    _put(path / "tasks", "")
    _put(path / "cpus", "0")
    _put(path / "cpus_list", "")
    if ctrl and schemata:
        _put(path / "schemata", _render_schemata(schemata))
        _put(path / "mode", "shareable")
    if ctrl and mbps_event:
        _put(path / "mba_MBps_event", "mbm_local_bytes")
    if monitoring:
        for d in domains:
            for event in features:
                _put(path / "mon_data" / f"mon_L3_{d:02d}" / event, "0")
        if ctrl:
            (path / "mon_groups").mkdir(exist_ok=True)


# ---------------------------------------------------------------------------------------------
# The kernel's side of mkdir, rmdir and writes


class EmulatedFs(ResctrlFs):
    """ResctrlFs over an emulated tree: validates like the kernel, then updates like it."""

    # ---- helpers ------------------------------------------------------------------------------
    def _caps(self) -> ResctrlCapabilities:
        try:
            options = resctrl_mount_options(self.root, mounts_path(self.root))
        except ResctrlError:
            options = frozenset()
        return discover(self.root, options)

    def _rel(self, path: Path) -> tuple[str, ...]:
        full = Path(os.path.abspath(path))
        if ".." in Path(path).parts or not (full == self.root or self.root in full.parents):
            raise PermissionError(f"refusing to touch {full}: outside {self.root}")
        return full.relative_to(self.root).parts

    def _status(self, text: str) -> None:
        _put(self.root / "info" / "last_cmd_status", text)

    def _fail(self, err: int, status: str, path: Path, *, write: str | None = None) -> OSError:
        if status:
            self._status(status)
        if write is not None:
            return KernelWriteError(
                err, f"writing {write.strip()!r} to {path} failed: {os.strerror(err)}"
            )
        return OSError(err, os.strerror(err), str(path))

    def _ctrl_dirs(self) -> list[Path]:
        return [
            self.root / n for n in sorted(os.listdir(self.root))
            if n not in RESERVED and (self.root / n).is_dir()
        ]

    def _all_groups(self) -> list[Path]:
        """Every group directory: root, control groups, and the monitor groups of each."""
        groups: list[Path] = []
        for ctrl in [self.root, *self._ctrl_dirs()]:
            groups.append(ctrl)
            mg = ctrl / "mon_groups"
            if mg.is_dir():
                groups.extend(mg / n for n in sorted(os.listdir(mg)) if (mg / n).is_dir())
        return groups

    def _group_kind(self, parts: tuple[str, ...]) -> str | None:
        """'root', 'ctrl' or 'mon' for a group directory's relative path parts, else None."""
        if not parts:
            return "root"
        if len(parts) == 1 and parts[0] not in RESERVED:
            return "ctrl"
        if len(parts) == 2 and parts[0] == "mon_groups":
            return "mon"
        if len(parts) == 3 and parts[1] == "mon_groups" and parts[0] not in RESERVED:
            return "mon"
        return None

    def _limbo(self) -> int:
        try:
            return int((state_dir(self.root) / "limbo_rmids").read_text().strip() or 0)
        except (OSError, ValueError):
            return 0

    def _set_limbo(self, n: int) -> None:
        _put(state_dir(self.root) / "limbo_rmids", str(max(0, n)))

    # ---- mkdir -------------------------------------------------------------------------------
    def mkdir(self, path: Path, *, what: str) -> bool:
        parts = self._rel(path)
        full = self.root.joinpath(*parts)
        kind = self._group_kind(parts)
        if full.exists():
            return self.writer.mkdir(full, what=what)  # EEXIST: the writer reports False
        if kind not in ("ctrl", "mon") or not full.parent.is_dir():
            err = errno.ENOENT if not full.parent.is_dir() else errno.EPERM
            raise self._fail(err, "", full)
        caps = self._caps()
        if kind == "ctrl" and not caps.can_allocate:
            raise self._fail(errno.EPERM, "", full)
        if kind == "mon" and caps.l3_mon is None:
            raise self._fail(errno.EPERM, "", full)
        if kind == "ctrl" and 1 + len(self._ctrl_dirs()) >= caps.num_closids:
            raise self._fail(errno.ENOSPC, "Out of CLOSIDs", full)
        if caps.l3_mon is not None:
            free = caps.l3_mon.num_rmids - len(self._all_groups()) - self._limbo()
            if free <= 0:
                if self._limbo() > 0:
                    raise self._fail(errno.EBUSY, "", full)
                raise self._fail(errno.ENOSPC, "Out of RMIDs", full)
        schemata: dict[str, dict[int, int]] | None = None
        if kind == "ctrl":
            schemata = {}
            if caps.l3 is not None:
                for res in caps.l3.resources:
                    schemata[res] = dict.fromkeys(caps.l3.domains, caps.l3.cbm_mask)
            if caps.mb is not None:
                default = MAX_MBPS if caps.mb.mbps else MAX_MB_PERCENT
                schemata["MB"] = dict.fromkeys(caps.mb.domains, default)
        mon = caps.l3_mon
        # The kernel's mkdir makes the group with every file in it at once: built aside and
        # renamed into place, so no reader (noded's monitor, a test advancing counters) ever
        # sees a group without its mon_data, as one did under load.
        staging = state_dir(self.root) / "staging"
        staging.mkdir(parents=True, exist_ok=True)
        stage = Path(tempfile.mkdtemp(prefix=f"{full.name}-", dir=staging))
        try:
            _populate_group(
                stage, schemata, mon is not None, mon.domains if mon else (),
                sorted(mon.features) if mon else (), ctrl=kind == "ctrl",
                mbps_event=kind == "ctrl" and caps.mba_mbps,
            )
            os.rename(stage, full)
        except OSError as exc:
            shutil.rmtree(stage, ignore_errors=True)
            if full.exists():  # made meanwhile by another writer: EEXIST, as the kernel says
                return False
            raise self._fail(exc.errno or errno.EIO, "", full) from None
        self.writer.log.info("kernel mkdir path=%s why=%s", full, what)
        self._status("ok")
        return True

    # ---- rmdir -------------------------------------------------------------------------------
    def rmdir(self, path: Path, *, what: str) -> bool:
        parts = self._rel(path)
        full = self.root.joinpath(*parts)
        if not full.exists():
            return self.writer.rmdir(full, what=what)  # ENOENT: the writer reports False
        kind = self._group_kind(parts)
        if kind not in ("ctrl", "mon"):
            raise self._fail(errno.EPERM, "", full)
        parent = self.root if kind == "ctrl" or len(parts) == 2 else self.root / parts[0]
        members = [full, *self._mon_groups_of(full)] if kind == "ctrl" else [full]
        moved = [t for g in members for t in _read_tasks(g)]
        if moved:
            _put(parent / "tasks", _tasks_text(_read_tasks(parent) + moved))
        caps = self._caps()
        if caps.l3_mon is not None:
            threshold = _int_or(self.root / "info" / "L3_MON" / "max_threshold_occupancy", 0)
            dirty = sum(1 for g in members if _occupancy(g) > threshold)
            if dirty:
                self._set_limbo(self._limbo() + dirty)
        for child in list(full.iterdir()):
            if child.is_dir():
                shutil.rmtree(child)
            else:
                child.unlink()
        removed = self.writer.rmdir(full, what=what)
        self._status("ok")
        return removed

    def _mon_groups_of(self, ctrl: Path) -> list[Path]:
        mg = ctrl / "mon_groups"
        return [mg / n for n in sorted(os.listdir(mg)) if (mg / n).is_dir()] if mg.is_dir() else []

    # ---- writes --------------------------------------------------------------------------------
    def write(self, path: Path, value: str, *, what: str, compare: bool = True) -> bool:
        parts = self._rel(path)
        full = self.root.joinpath(*parts)
        kind = self._group_kind(parts[:-1]) if parts else None
        if parts and parts[-1] == "schemata" and kind in ("root", "ctrl"):
            return self._write_schemata(full, value, what)
        if parts and parts[-1] == "tasks" and kind is not None:
            return self._write_tasks(full, kind, value, what)
        if "mon_data" in parts:
            raise self._fail(errno.EACCES, "", full, write=value)  # counters are read-only
        return self.writer.write(full, value, what=what, compare=compare)

    def _write_schemata(self, path: Path, value: str, what: str) -> bool:
        if not value.endswith("\n"):
            raise self._fail(errno.EINVAL, "", path, write=value)  # kernel: needs a newline
        caps = self._caps()
        current = {r: dict(v) for r, v in parse_schemata(path.read_text()).lines.items()}
        staged: dict[str, dict[int, int]] = {}
        for line in value[:-1].split("\n"):
            resource, sep, body = line.partition(":")
            resource = resource.strip()
            if not sep:
                raise self._fail(errno.EINVAL, "Missing ':'", path, write=value)
            if not body:
                raise self._fail(errno.EINVAL, f"Missing '{resource}' value", path, write=value)
            if resource not in current:
                raise self._fail(
                    errno.EINVAL, f"Unknown or unsupported resource name '{resource}'",
                    path, write=value,
                )
            for item in filter(None, body.split(";")):
                dom_text, eq, val_text = item.partition("=")
                if not eq or not dom_text.strip().isdigit():
                    raise self._fail(
                        errno.EINVAL, "Missing '=' or non-numeric domain", path, write=value
                    )
                domain = int(dom_text)
                if domain not in current[resource]:
                    raise self._fail(errno.EINVAL, f"Unknown domain id {domain}", path, write=value)
                if domain in staged.get(resource, {}):
                    raise self._fail(errno.EINVAL, f"Duplicate domain {domain}", path, write=value)
                problem, parsed = self._check_value(caps, resource, val_text.strip())
                if problem:
                    raise self._fail(errno.EINVAL, problem, path, write=value)
                staged.setdefault(resource, {})[domain] = parsed
        changed = self.writer.write(path, value, what=what, compare=False)
        for resource, vals in staged.items():
            current[resource].update(vals)
        _put(path, _render_schemata(current))
        self._status("ok")
        return changed

    def _check_value(self, caps: ResctrlCapabilities, resource: str, text: str) -> tuple[str, int]:
        if is_cache_resource(resource):
            try:
                mask = int(text, 16)
            except ValueError:
                return f"Non-hex character in the mask {text}", 0
            assert caps.l3 is not None
            problem = cbm_problem(mask, cbm_mask=caps.l3.cbm_mask,
                                  min_cbm_bits=caps.l3.min_cbm_bits)
            return problem or "", mask
        mb = caps.mb
        assert mb is not None and resource == "MB"
        if not text.isdigit() or int(text) > MAX_MBPS:
            return f"Invalid MB value {text}", 0
        bw = int(text)
        if mb.mbps:
            return "", bw
        if not mb.min_bandwidth <= bw <= mb.max_bandwidth:
            return f"MB value {bw} out of range [{mb.min_bandwidth},{mb.max_bandwidth}]", 0
        return "", round_mb_percent(bw, min_bandwidth=mb.min_bandwidth,
                                    bandwidth_gran=mb.bandwidth_gran,
                                    max_bandwidth=mb.max_bandwidth)

    def _write_tasks(self, path: Path, kind: str, value: str, what: str) -> bool:
        text = value.strip()
        if not text.isdigit():
            raise self._fail(errno.EINVAL, "", path, write=value)
        tid = int(text)
        if not os.path.exists(f"/proc/{tid}"):
            raise self._fail(errno.ESRCH, f"No task {tid}", path, write=value)
        group = path.parent
        owner = self._ctrl_owner(tid)
        if kind == "mon":
            parent = group.parent.parent
            if owner != parent:
                raise self._fail(
                    errno.EINVAL, "Can't move task to different control group", path, write=value
                )
            targets = self._mon_groups_of(parent)
        else:
            targets = self._all_groups()
        for g in targets:
            if g != group and tid in (tids := _read_tasks(g)):
                _put(g / "tasks", _tasks_text([t for t in tids if t != tid]))
        # Read before the writer's write: a plain file would be left holding only this id.
        mine = [t for t in _read_tasks(group) if t != tid]
        changed = self.writer.write(path, value, what=what, compare=False)
        _put(path, _tasks_text([*mine, tid]))
        self._status("ok")
        return changed

    def _ctrl_owner(self, tid: int) -> Path:
        """The control group a task belongs to (the root unless another one lists it)."""
        for ctrl in self._ctrl_dirs():
            if tid in _read_tasks(ctrl):
                return ctrl
        return self.root


def _read_tasks(group: Path) -> list[int]:
    try:
        return [int(t) for t in (group / "tasks").read_text().split() if t.isdigit()]
    except FileNotFoundError:
        return []


def _tasks_text(tids: Sequence[int]) -> str:
    return "".join(f"{t}\n" for t in dict.fromkeys(tids))


def _int_or(path: Path, default: int) -> int:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return default


def _occupancy(group: Path) -> int:
    mon_data = group / "mon_data"
    if not mon_data.is_dir():
        return 0
    return max((_int_or(d / "llc_occupancy", 0) for d in mon_data.iterdir()), default=0)


# ---------------------------------------------------------------------------------------------
# Driving the emulation (what the hardware would do)


def _group_dir(root: Path, group: str | None, mon_group: str | None) -> Path:
    root = Path(os.path.abspath(root))
    path = root if not group else root / group
    if mon_group:
        path = path / "mon_groups" / mon_group
    for name in (group, mon_group):
        if name and ("/" in name or name in (".", "..") or "\0" in name or name in RESERVED):
            raise ValueError(f"bad group name {name!r}")
    if not path.is_dir():
        raise FileNotFoundError(f"no emulated resctrl group at {path}")
    return path


def _counter_file(group_dir: Path, domain: int, event: str) -> Path:
    path = group_dir / "mon_data" / f"mon_L3_{domain:02d}" / event
    if not path.exists():
        raise FileNotFoundError(f"no counter {event} for cache id {domain} in {group_dir}")
    return path


def _add(path: Path, nbytes: int) -> None:
    current = _int_or(path, 0)  # "Unavailable"/"Error" read as 0: the count restarts
    _put(path, str(current + nbytes))


def advance_mbm(
    root: Path,
    group: str | None,
    domain: int,
    total_bytes: int,
    *,
    local_bytes: int | None = None,
    mon_group: str | None = None,
) -> None:
    """Count ``total_bytes`` of memory traffic (``local_bytes`` of it local; default all) for a
    group on one L3 domain. A monitor group's traffic also shows in its control group's
    counters, as the kernel sums them there."""
    if total_bytes < 0 or (local_bytes is not None and not 0 <= local_bytes <= total_bytes):
        raise ValueError("traffic must be non-negative and local_bytes <= total_bytes")
    local = total_bytes if local_bytes is None else local_bytes
    target = _group_dir(root, group, mon_group)
    dirs = [target] if mon_group is None else [target, _group_dir(root, group, None)]
    for d in dirs:
        for event, amount in (("mbm_total_bytes", total_bytes), ("mbm_local_bytes", local)):
            path = d / "mon_data" / f"mon_L3_{domain:02d}" / event
            if path.exists():
                _add(path, amount)
            elif event == "mbm_total_bytes" and not (d / "mon_data").is_dir():
                raise FileNotFoundError(f"{d} has no mon_data: monitoring is not emulated")


def set_counter(
    root: Path,
    group: str | None,
    domain: int,
    event: str,
    value: int | str,
    *,
    mon_group: str | None = None,
) -> None:
    """Set one counter file to a number or to the kernel's ``Unavailable``/``Error`` text."""
    if isinstance(value, str) and value not in ("Unavailable", "Error", "Unassigned"):
        raise ValueError(f"counter text must be Unavailable, Error or Unassigned, got {value!r}")
    if isinstance(value, int) and value < 0:
        raise ValueError("counters are unsigned")
    _put(_counter_file(_group_dir(root, group, mon_group), domain, event), str(value))


def drain_limbo(root: Path) -> None:
    """Release every RMID in limbo (the kernel does this once occupancy has drained)."""
    _put(state_dir(root) / "limbo_rmids", "0")


def open_resctrl(root: Path, writer: KernelWriter | None = None) -> Resctrl:
    """A Resctrl over an emulated tree built by build_tree (the demo's entry point)."""
    root = Path(os.path.abspath(root))
    fs = EmulatedFs(root, writer or KernelWriter([root]))
    return Resctrl(root, mounts_path(root), fs=fs)


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: ``build ROOT [--profile P]`` or ``advance ROOT GROUP DOMAIN BYTES``."""
    parser = argparse.ArgumentParser(prog="python -m rdt.emulated",
                                     description="emulated resctrl trees for demos and tests")
    sub = parser.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="create an emulated resctrl mount")
    b.add_argument("root", type=Path)
    b.add_argument("--profile", default="full", choices=sorted(PROFILES))
    a = sub.add_parser("advance", help="count memory traffic for a group")
    a.add_argument("root", type=Path)
    a.add_argument("group", help="group name, or '' for the default group")
    a.add_argument("domain", type=int)
    a.add_argument("bytes", type=int)
    args = parser.parse_args(argv)
    try:
        if args.cmd == "build":
            tree = build_tree(args.root, args.profile)
            print(f"root={tree.root} mounts={tree.mounts}")
        else:
            advance_mbm(args.root, args.group or None, args.domain, args.bytes)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
