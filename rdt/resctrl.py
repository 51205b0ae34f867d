"""The resctrl API the node daemon uses: groups, schemata (MB, L3), tasks and monitoring."""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from rdt.capabilities import (
    MON_DOMAIN_RE,
    BandwidthAllocation,
    ResctrlCapabilities,
    discover,
    resctrl_mount_options,
)
from rdt.errors import (
    FeatureUnavailable,
    GroupNotFound,
    InvalidValue,
    KernelRejected,
    OutOfClosids,
    OutOfRmids,
    ProcessNotFound,
    ResctrlError,
    RmidsInLimbo,
)
from rdt.fs import LOCK_TIMEOUT_S, ResctrlFs
from rdt.monitor import EVENTS, parse_counter
from rdt.names import check_group_name, is_group_name
from rdt.schemata import (
    Schemata,
    check_mbps,
    diff_schemata,
    format_line,
    parse_schemata,
    round_mb_percent,
    ways_to_mask,
)
from shared.kernelfs import KernelWriteError, KernelWriter

log = logging.getLogger("trellis.rdt")

DEFAULT_ROOT = Path("/sys/fs/resctrl")
PROC_MOUNTS = Path("/proc/mounts")
# Directories in the resctrl root (and in groups) that are not groups.
RESERVED = frozenset({"info", "mon_groups", "mon_data"})


class Resctrl:
    """One resctrl mount. Raises ResctrlNotMounted / DiscoveryError if it is not usable.

    Group arguments are Trellis group names (``trellis-...``, see rdt.names); ``None`` where a
    parameter allows it means the default (root) group, which is only ever read, never changed.
    """

    def __init__(
        self,
        root: Path = DEFAULT_ROOT,
        mounts: Path = PROC_MOUNTS,
        writer: KernelWriter | None = None,
        *,
        fs: ResctrlFs | None = None,
        proc: Path = Path("/proc"),
        lock_timeout: float = LOCK_TIMEOUT_S,
    ) -> None:
        self.root = Path(os.path.abspath(root))
        options = resctrl_mount_options(self.root, mounts)
        self.capabilities: ResctrlCapabilities = discover(self.root, options)
        if fs is None:
            fs = ResctrlFs(self.root, writer or KernelWriter([self.root]))
        elif writer is not None and fs.writer is not writer:
            raise ValueError("pass either writer or fs (whose writer is used), not both")
        if fs.root != self.root:
            raise ValueError(f"fs is for {fs.root}, not {self.root}")
        self.fs = fs
        self.writer = fs.writer
        self.proc = proc
        self.lock_timeout = lock_timeout

    # ------------------------------------------------------------------------------ basics
    @contextmanager
    def lock(self) -> Iterator[None]:
        """Hold the resctrl flock across several steps (re-entrant)."""
        with self.fs.lock(self.lock_timeout):
            yield

    def last_cmd_status(self) -> str:
        try:
            return self.fs.read_text(self.root / "info" / "last_cmd_status").strip()
        except OSError:
            return ""

    def _ctrl_path(self, name: str | None) -> Path:
        return self.root if name is None else self.root / check_group_name(name)

    def _group_path(self, name: str | None, mon_group: str | None = None) -> Path:
        path = self._ctrl_path(name)
        if mon_group is not None:
            path = path / "mon_groups" / check_group_name(mon_group, "resctrl monitor group")
        return path

    def _require_group(self, path: Path) -> Path:
        if not self.fs.is_dir(path):
            raise GroupNotFound(f"resctrl group {path.relative_to(self.root)} does not exist")
        return path

    def _subdirs(self, path: Path) -> list[str]:
        try:
            names = self.fs.listdir(path)
        except FileNotFoundError:
            return []
        return [n for n in names if n not in RESERVED and self.fs.is_dir(path / n)]

    # ------------------------------------------------------------------------------ groups
    def groups(self) -> list[str]:
        """Trellis's control groups (others' groups are never listed, so never touched)."""
        return [n for n in self._subdirs(self.root) if is_group_name(n)]

    def all_groups(self) -> list[str]:
        """Every control group on the machine, ours or not (for read-only node totals)."""
        return self._subdirs(self.root)

    def mon_groups(self, parent: str | None = None) -> list[str]:
        self._require_group(self._ctrl_path(parent))
        return [
            n for n in self._subdirs(self._ctrl_path(parent) / "mon_groups") if is_group_name(n)
        ]

    def create_group(self, name: str) -> bool:
        """Create control group ``name``; False if it already exists."""
        name = check_group_name(name)
        if not self.capabilities.can_allocate:
            raise FeatureUnavailable(
                "this machine has no RDT allocation (no L3 CAT, no MBA): control groups cannot "
                "be created; use create_mon_group for monitoring"
            )
        with self.lock():
            return self._mkdir(self.root / name, ctrl=True)

    def create_mon_group(self, name: str, parent: str | None = None) -> bool:
        """Create monitor group ``name`` under control group ``parent`` (None: the root)."""
        name = check_group_name(name, "resctrl monitor group")
        if self.capabilities.l3_mon is None:
            raise FeatureUnavailable("this machine has no RDT monitoring (no info/L3_MON)")
        with self.lock():
            parent_path = self._require_group(self._ctrl_path(parent))
            return self._mkdir(parent_path / "mon_groups" / name, ctrl=False)

    def remove_group(self, name: str) -> bool:
        """Remove control group ``name``; its tasks return to the default group. False if absent."""
        name = check_group_name(name)
        with self.lock():
            return self._rmdir(self.root / name)

    def remove_mon_group(self, name: str, parent: str | None = None) -> bool:
        path = self._group_path(parent, check_group_name(name, "resctrl monitor group"))
        with self.lock():
            return self._rmdir(path)

    def _mkdir(self, path: Path, *, ctrl: bool) -> bool:
        kind = "control group" if ctrl else "monitor group"
        rel = path.relative_to(self.root)
        try:
            created = self.fs.mkdir(path, what=f"resctrl {kind}")
        except OSError as exc:
            raise self._mkdir_error(exc, rel, ctrl) from exc
        if not created and not self.fs.is_dir(path):
            raise KernelRejected(f"cannot create resctrl {kind} {rel}: a file is in the way")
        return created

    def _mkdir_error(self, exc: OSError, rel: Path, ctrl: bool) -> ResctrlError:
        status = self.last_cmd_status()
        if exc.errno == errno.ENOSPC and ctrl and "rmid" not in status.lower():
            return OutOfClosids(
                f"cannot create resctrl group {rel}: out of CLOSIDs "
                f"({self._closids_in_use()} in use of {self.capabilities.num_closids})"
            )
        if exc.errno == errno.ENOSPC:
            rmids = self.capabilities.l3_mon.num_rmids if self.capabilities.l3_mon else 0
            return OutOfRmids(
                f"cannot create resctrl group {rel}: out of RMIDs "
                f"({self._rmids_in_use()} in use of {rmids})"
            )
        if exc.errno == errno.EBUSY:
            return RmidsInLimbo(
                f"cannot create resctrl group {rel}: RMIDs still in limbo (recently freed "
                "monitoring IDs wait until their cache occupancy drains); retry later"
            )
        return KernelRejected(
            f"cannot create resctrl group {rel}: {exc.strerror or exc}"
            + (f" (kernel: {status})" if status and status != "ok" else ""),
            errno=exc.errno,
            status=status,
        )

    def _rmdir(self, path: Path) -> bool:
        try:
            return self.fs.rmdir(path, what="resctrl group removed")
        except OSError as exc:
            status = self.last_cmd_status()
            raise KernelRejected(
                f"cannot remove resctrl group {path.relative_to(self.root)}: "
                f"{exc.strerror or exc}" + (f" (kernel: {status})" if status != "ok" else ""),
                errno=exc.errno,
                status=status,
            ) from exc

    def _closids_in_use(self) -> int:
        return 1 + len(self.all_groups())  # the default group holds CLOSID 0

    def _rmids_in_use(self) -> int:
        count = 0
        for ctrl in [None, *self.all_groups()]:
            base = self.root if ctrl is None else self.root / ctrl
            count += 1 + len(self._subdirs(base / "mon_groups"))
        return count

    # ------------------------------------------------------------------------------ schemata
    def schemata(self, name: str | None) -> Schemata:
        path = self._require_group(self._ctrl_path(name)) / "schemata"
        try:
            return parse_schemata(self.fs.read_text(path))
        except FileNotFoundError:
            raise FeatureUnavailable(f"{path} is missing: no RDT allocation here") from None

    def set_schemata(
        self, name: str, desired: Mapping[str, Mapping[int, int]]
    ) -> dict[str, dict[int, int]]:
        """Make the group's schemata hold ``desired``; write only the values that differ.

        Returns the changes written (resource -> cache id -> value), empty if none were needed.
        Values must already be what the kernel stores (see set_mb/set_l3 for the rounding).
        """
        path = self._ctrl_path(check_group_name(name))
        with self.lock():
            changes = diff_schemata(self.schemata(name), desired)
            if changes:
                text = "".join(format_line(r, v) + "\n" for r, v in changes.items())
                self._write(path / "schemata", text, what=f"resctrl schemata {name}")
        return changes

    def mb_value(self, value: int) -> int:
        """What the kernel stores for an MB request: rounded percent, or MBps as is."""
        return _mb_value(self._mb(), value)

    def _mb(self) -> BandwidthAllocation:
        if self.capabilities.mb is None:
            raise FeatureUnavailable("this machine has no memory bandwidth allocation (MBA)")
        return self.capabilities.mb

    def set_mb(self, name: str, value: int | Mapping[int, int]) -> dict[int, int]:
        """Throttle a group's memory bandwidth: percent, or MBps when mounted with mba_MBps.

        ``value`` applies to every cache id, or give a mapping cache id -> value. Returns the
        values in effect afterwards for the ids named.
        """
        mb = self._mb()
        if isinstance(value, Mapping):
            targets = {_domain(d): _mb_value(mb, v) for d, v in value.items()}
        else:
            targets = {d: _mb_value(mb, value) for d in mb.domains}
        self.set_schemata(name, {"MB": targets})
        return targets

    def set_l3(
        self, name: str, ways: int, *, start: int = 0, domains: list[int] | None = None
    ) -> int:
        """Give a group ``ways`` contiguous L3 ways from bit ``start``; returns the mask."""
        l3 = self.capabilities.l3
        if l3 is None:
            raise FeatureUnavailable("this machine has no L3 cache allocation (CAT)")
        mask = ways_to_mask(ways, cbm_len=l3.cbm_len, min_cbm_bits=l3.min_cbm_bits, start=start)
        ids = l3.domains if domains is None else [_domain(d) for d in domains]
        self.set_schemata(name, {r: dict.fromkeys(ids, mask) for r in l3.resources})
        return mask

    # ------------------------------------------------------------------------------ tasks
    def tasks(self, name: str | None, mon_group: str | None = None) -> list[int]:
        path = self._require_group(self._group_path(name, mon_group)) / "tasks"
        return [int(t) for t in self.fs.read_text(path).split() if t.isdigit()]

    def threads_of(self, pid: int) -> list[int]:
        """Thread ids of process ``pid`` (from /proc/PID/task)."""
        if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
            raise InvalidValue(f"pid must be a positive integer, got {pid!r}")
        try:
            return sorted(int(t) for t in os.listdir(self.proc / str(pid) / "task") if t.isdigit())
        except FileNotFoundError:
            raise ProcessNotFound(f"process {pid} does not exist") from None

    def assign_pid(self, name: str, pid: int, mon_group: str | None = None) -> list[int]:
        """Move every thread of ``pid`` into the group; returns the thread ids newly written.

        Safe to call again to pick up threads the process started since: ids already in the
        group are not rewritten. The kernel takes one id per write to ``tasks``.
        """
        name = check_group_name(name)
        with self.lock():
            tids = self.threads_of(pid)
            written = self._assign(self._ctrl_path(name), tids)
            if mon_group is not None:
                mon_path = self._group_path(name, mon_group)
                written = sorted(set(written) | set(self._assign(mon_path, tids)))
        return written

    def _assign(self, group: Path, tids: list[int]) -> list[int]:
        self._require_group(group)
        present = set(int(t) for t in self.fs.read_text(group / "tasks").split() if t.isdigit())
        written: list[int] = []
        for tid in tids:
            if tid in present:
                continue
            try:
                self._write(group / "tasks", f"{tid}\n", what="resctrl task assignment")
            except KernelRejected as exc:
                if exc.errno == errno.ESRCH:
                    log.debug("rdt thread gone before assignment tid=%d", tid)
                    continue
                raise
            written.append(tid)
        return written

    # ------------------------------------------------------------------------------ monitoring
    def read_counters(
        self, name: str | None, event: str, mon_group: str | None = None
    ) -> dict[int, int | None]:
        """One event for every L3 domain: cache id -> value, None where the kernel has none."""
        self._check_event(event)
        return self._read_counters_at(self._group_path(name, mon_group), event)

    def _check_event(self, event: str) -> None:
        mon = self.capabilities.l3_mon
        if event not in EVENTS:
            raise InvalidValue(f"unknown monitoring event {event!r} (known: {', '.join(EVENTS)})")
        if mon is None or event not in mon.features:
            raise FeatureUnavailable(f"this machine does not monitor {event}")

    def _read_counters_at(self, group: Path, event: str) -> dict[int, int | None]:
        mon_data = self._require_group(group) / "mon_data"
        values: dict[int, int | None] = {}
        for entry in self.fs.listdir(mon_data):
            m = MON_DOMAIN_RE.fullmatch(entry)
            if not m:
                continue
            path = mon_data / entry / event
            try:
                text = self.fs.read_text(path)
            except OSError as exc:
                log.warning("rdt counter read failed path=%s error=%s", path, exc)
                values[int(m.group(1))] = None
                continue
            values[int(m.group(1))] = parse_counter(text, where=str(path))
        return values

    def read_mbm(
        self, name: str | None, mon_group: str | None = None, *, event: str = "mbm_total_bytes"
    ) -> dict[int, int | None]:
        """Cumulative memory-bandwidth bytes per L3 domain (feed to a BandwidthMeter)."""
        return self.read_counters(name, event, mon_group)

    def read_llc_occupancy(
        self, name: str | None, mon_group: str | None = None
    ) -> dict[int, int | None]:
        return self.read_counters(name, "llc_occupancy", mon_group)

    def read_node_mbm(self, event: str = "mbm_total_bytes") -> dict[int, int | None]:
        """The node's total per domain: the default group plus every control group.

        A control group's mon_data already includes its monitor groups, so those are not added
        again. A domain is None if any part of it was unreadable.
        """
        self._check_event(event)
        total: dict[int, int | None] = {}
        # Names come from the kernel's own listing (other tools' groups included) and are only
        # read, so they are not held to the Trellis naming rule.
        for path in [self.root, *(self.root / g for g in self.all_groups())]:
            try:
                part = self._read_counters_at(path, event)
            except (GroupNotFound, FileNotFoundError):
                continue  # removed while we were summing
            for domain, value in part.items():
                prev = total.get(domain, 0)
                total[domain] = None if prev is None or value is None else prev + value
        return total

    # ------------------------------------------------------------------------------ writes
    def _write(self, path: Path, value: str, *, what: str) -> None:
        try:
            self.fs.write(path, value, what=what, compare=False)
        except KernelWriteError as exc:
            status = self.last_cmd_status()
            raise KernelRejected(
                f"{what}: kernel refused {value.strip()!r} in {path.relative_to(self.root)}"
                + (f": {status}" if status and status != "ok" else f": {exc.strerror or exc}"),
                errno=exc.errno,
                status=status,
            ) from exc


def _domain(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidValue(f"cache id must be a non-negative integer, got {value!r}")
    return value


def _mb_value(mb: BandwidthAllocation, value: int) -> int:
    if mb.mbps:
        return check_mbps(value)
    return round_mb_percent(
        value,
        min_bandwidth=mb.min_bandwidth,
        bandwidth_gran=mb.bandwidth_gran,
        max_bandwidth=mb.max_bandwidth,
    )


def detect_resctrl(
    root: Path = DEFAULT_ROOT,
    mounts: Path = PROC_MOUNTS,
    writer: KernelWriter | None = None,
    *,
    fs: ResctrlFs | None = None,
) -> Resctrl | None:
    """The Resctrl for ``root``, or None (with the reason logged) when it is not usable."""
    try:
        rc = Resctrl(root, mounts, writer, fs=fs)
    except ResctrlError as exc:
        log.info("rdt unavailable root=%s reason=%s", root, exc)
        return None
    caps = rc.capabilities
    log.info(
        "rdt detected root=%s l3=%s mb=%s mon=%s closids=%d",
        root, caps.l3 is not None, caps.mb.unit if caps.mb else None,
        sorted(caps.l3_mon.features) if caps.l3_mon else None, caps.num_closids,
    )
    return rc
