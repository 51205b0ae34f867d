"""What the machine's RDT offers, read from resctrl's ``info/`` directory and /proc/mounts.

Absent features are simply absent (None): a machine may have monitoring without allocation,
CAT without MBA, and so on (resctrl.rst: "RDT features are orthogonal").
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from rdt.errors import DiscoveryError, ResctrlNotMounted
from rdt.schemata import MAX_MB_PERCENT, Schemata, parse_schemata
from shared.model import RdtCapabilities

log = logging.getLogger("trellis.rdt")

MON_DOMAIN_RE = re.compile(r"mon_L3_(\d+)")
_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")


@dataclass(frozen=True)
class CacheAllocation:
    """L3 CAT. With CDP the kernel exposes L3CODE and L3DATA instead of L3; both get the mask."""

    cbm_mask: int
    min_cbm_bits: int
    num_closids: int
    shareable_bits: int = 0
    domains: tuple[int, ...] = ()
    resources: tuple[str, ...] = ("L3",)

    @property
    def cbm_len(self) -> int:
        return self.cbm_mask.bit_length()

    @property
    def cdp(self) -> bool:
        return self.resources != ("L3",)


@dataclass(frozen=True)
class BandwidthAllocation:
    """MBA. ``mbps`` is True when mounted with mba_MBps: schemata values are MBps, not percent."""

    min_bandwidth: int
    bandwidth_gran: int
    num_closids: int
    delay_linear: bool
    mbps: bool = False
    domains: tuple[int, ...] = ()
    max_bandwidth: int = MAX_MB_PERCENT

    @property
    def unit(self) -> str:
        return "MBps" if self.mbps else "percent"


@dataclass(frozen=True)
class Monitoring:
    """L3_MON: RMIDs and the events (llc_occupancy, mbm_total_bytes, mbm_local_bytes)."""

    num_rmids: int
    features: frozenset[str] = frozenset()
    domains: tuple[int, ...] = ()

    @property
    def mbm(self) -> bool:
        return bool({"mbm_total_bytes", "mbm_local_bytes"} & self.features)

    @property
    def cmt(self) -> bool:
        return "llc_occupancy" in self.features


@dataclass(frozen=True)
class ResctrlCapabilities:
    root: Path
    mount_options: frozenset[str] = frozenset()
    l3: CacheAllocation | None = None
    mb: BandwidthAllocation | None = None
    l3_mon: Monitoring | None = None
    # Other resources the kernel lists (L2, SMBA, ...): named for the record, not managed.
    other_resources: tuple[str, ...] = field(default=())

    @property
    def can_allocate(self) -> bool:
        return self.l3 is not None or self.mb is not None

    @property
    def num_closids(self) -> int:
        """The kernel uses the smallest num_closids of all enabled resources as the limit."""
        counts = [r.num_closids for r in (self.l3, self.mb) if r is not None]
        return min(counts) if counts else 0

    @property
    def mba_mbps(self) -> bool:
        return "mba_MBps" in self.mount_options

    def to_model(self) -> RdtCapabilities:
        """The summary that travels to the master in NodeInventory."""
        return RdtCapabilities(
            cat=self.l3 is not None,
            mba=self.mb is not None,
            mbm=self.l3_mon is not None and self.l3_mon.mbm,
            mba_mbps=self.mb is not None and self.mb.mbps,
        )


# ---------------------------------------------------------------------------------------------
# /proc/mounts


@dataclass(frozen=True)
class MountEntry:
    source: str
    target: str
    fstype: str
    options: frozenset[str]


def _unescape(field_text: str) -> str:
    # The kernel escapes space, tab, newline and backslash in mount paths as \ooo.
    return _OCTAL_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field_text)


def parse_mounts(text: str) -> list[MountEntry]:
    entries: list[MountEntry] = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 4:
            continue
        entries.append(
            MountEntry(
                source=_unescape(parts[0]),
                target=_unescape(parts[1]),
                fstype=parts[2],
                options=frozenset(parts[3].split(",")),
            )
        )
    return entries


def _same_path(a: str | Path, b: str | Path) -> bool:
    return os.path.abspath(a) == os.path.abspath(b) or os.path.realpath(a) == os.path.realpath(b)


def resctrl_mount_options(root: Path, mounts: Path) -> frozenset[str]:
    """Mount options of the resctrl filesystem mounted at ``root``; ResctrlNotMounted if none."""
    try:
        text = mounts.read_text()
    except OSError as exc:
        raise ResctrlNotMounted(f"cannot read mount table {mounts}: {exc.strerror or exc}") from exc
    found: MountEntry | None = None
    for entry in parse_mounts(text):
        if entry.fstype == "resctrl" and _same_path(entry.target, root):
            found = entry  # the last one wins: later mounts shadow earlier ones
    if found is None:
        raise ResctrlNotMounted(f"no resctrl filesystem mounted at {root} (per {mounts})")
    return found.options


# ---------------------------------------------------------------------------------------------
# info/


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError as exc:
        raise DiscoveryError(f"cannot read {path}: {exc.strerror or exc}") from exc


def _read_int(path: Path, base: int = 10) -> int:
    text = _read(path)
    try:
        value = int(text, base)
    except ValueError:
        kind = "hex" if base == 16 else "decimal"
        raise DiscoveryError(f"{path} holds {text!r}, expected a {kind} number") from None
    if value < 0:
        raise DiscoveryError(f"{path} holds a negative number {value}")
    return value


def _optional_int(path: Path, default: int, base: int = 10) -> int:
    return _read_int(path, base) if path.exists() else default


def _root_schemata(root: Path) -> Schemata:
    path = root / "schemata"
    if not path.exists():
        return Schemata()
    try:
        return parse_schemata(_read(path))
    except ValueError as exc:
        raise DiscoveryError(f"{path}: {exc}") from exc


def _cache_allocation(info: Path, schemata: Schemata) -> CacheAllocation | None:
    if (info / "L3").is_dir():
        resources: tuple[str, ...] = ("L3",)
    elif (info / "L3CODE").is_dir() and (info / "L3DATA").is_dir():
        resources = ("L3CODE", "L3DATA")
    else:
        return None
    d = info / resources[0]
    cbm_mask = _read_int(d / "cbm_mask", 16)
    if cbm_mask == 0 or cbm_mask & (cbm_mask + 1):
        raise DiscoveryError(f"{d / 'cbm_mask'} is {cbm_mask:x}, expected contiguous low bits")
    num_closids = min(_read_int(info / r / "num_closids") for r in resources)
    for r in resources:
        if r not in schemata:
            raise DiscoveryError(f"info/{r} exists but the root schemata has no {r} line")
    return CacheAllocation(
        cbm_mask=cbm_mask,
        min_cbm_bits=_read_int(d / "min_cbm_bits"),
        num_closids=num_closids,
        shareable_bits=_optional_int(d / "shareable_bits", 0, 16),
        domains=schemata.domains(resources[0]),
        resources=resources,
    )


def _bandwidth_allocation(
    info: Path, schemata: Schemata, options: frozenset[str]
) -> BandwidthAllocation | None:
    d = info / "MB"
    if not d.is_dir():
        return None
    if "MB" not in schemata:
        raise DiscoveryError("info/MB exists but the root schemata has no MB line")
    return BandwidthAllocation(
        min_bandwidth=_read_int(d / "min_bandwidth"),
        bandwidth_gran=_read_int(d / "bandwidth_gran"),
        num_closids=_read_int(d / "num_closids"),
        delay_linear=_optional_int(d / "delay_linear", 1) != 0,
        mbps="mba_MBps" in options,
        domains=schemata.domains("MB"),
    )


def _monitoring(root: Path, info: Path) -> Monitoring | None:
    d = info / "L3_MON"
    if not d.is_dir():
        return None
    features = frozenset(line.strip() for line in _read(d / "mon_features").splitlines())
    domains: list[int] = []
    mon_data = root / "mon_data"
    if mon_data.is_dir():
        for entry in os.listdir(mon_data):
            m = MON_DOMAIN_RE.fullmatch(entry)
            if m:
                domains.append(int(m.group(1)))
    return Monitoring(
        num_rmids=_read_int(d / "num_rmids"),
        features=frozenset(f for f in features if f),
        domains=tuple(sorted(domains)),
    )


def discover(root: Path, mount_options: frozenset[str] = frozenset()) -> ResctrlCapabilities:
    """Read ``root/info`` and the root group into a ResctrlCapabilities."""
    info = root / "info"
    if not info.is_dir():
        raise DiscoveryError(f"{info} is missing: is {root} really a resctrl mount?")
    schemata = _root_schemata(root)
    known = {"L3", "L3CODE", "L3DATA", "MB"}
    return ResctrlCapabilities(
        root=root,
        mount_options=mount_options,
        l3=_cache_allocation(info, schemata),
        mb=_bandwidth_allocation(info, schemata, mount_options),
        l3_mon=_monitoring(root, info),
        other_resources=tuple(sorted(r for r in schemata.lines if r not in known)),
    )
