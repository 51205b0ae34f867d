"""The schemata file: parsing the kernel's text, formatting lines, and the kernel's value rules.

Format (Documentation/arch/x86/resctrl.rst, "Schemata files"): one line per resource,
``NAME:<id>=<value>;<id>=<value>...``. Cache resources (L3, L2, L3CODE/L3DATA with CDP) carry
hex capacity bitmasks; MB (and AMD's SMBA) carry decimal bandwidth. Kernels have printed these
differently over the years -- names right-aligned to a common width (``"    MB:"``), values
zero-padded (``0=000ff``) or space-padded (``1=  16``) -- so parsing strips whitespace around every
token. Cache ids are whatever the kernel lists (they may have gaps, e.g. ``L3:0=fff;2=fff``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from rdt.errors import InvalidValue, SchemataParseError

MAX_MB_PERCENT = 100  # Intel's MAX_MBA_BW; the percent scale tops out at 100
MAX_MBPS = 2**32 - 1  # mba_sc stores MBps in a u32; this is also its "unlimited" default

_RESOURCE_RE = re.compile(r"[A-Z][A-Z0-9_]{0,15}")


def is_cache_resource(resource: str) -> bool:
    """Cache resources take hex bitmasks; everything else (MB, SMBA) takes decimal numbers."""
    return resource.startswith(("L2", "L3"))


@dataclass(frozen=True)
class Schemata:
    """A parsed schemata file: resource -> cache id -> value (masks as ints)."""

    lines: Mapping[str, Mapping[int, int]] = field(default_factory=dict)

    def __contains__(self, resource: object) -> bool:
        return resource in self.lines

    def get(self, resource: str) -> dict[int, int]:
        return dict(self.lines.get(resource, {}))

    def domains(self, resource: str) -> tuple[int, ...]:
        return tuple(sorted(self.lines.get(resource, {})))


def parse_schemata(text: str) -> Schemata:
    """Parse the text read from a ``schemata`` file; raise SchemataParseError naming the line."""
    lines: dict[str, dict[int, int]] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        resource, sep, rest = line.partition(":")
        resource = resource.strip()
        if not sep or not _RESOURCE_RE.fullmatch(resource):
            raise SchemataParseError(f"schemata line {raw!r}: expected 'RESOURCE:id=value;...'")
        if resource in lines:
            raise SchemataParseError(f"schemata line {raw!r}: resource {resource} listed twice")
        values: dict[int, int] = {}
        rest = rest.strip()
        # A group in cache pseudo-lock setup prints "L3:uninitialized": no values to report.
        if rest != "uninitialized":
            for item in rest.split(";"):
                item = item.strip()
                if not item:
                    continue  # tolerate a trailing ';'
                dom_text, eq, value_text = item.partition("=")
                dom_text, value_text = dom_text.strip(), value_text.strip()
                if not eq or not dom_text.isdigit() or not value_text:
                    raise SchemataParseError(
                        f"schemata line {raw!r}: item {item!r} is not 'cache_id=value'"
                    )
                domain = int(dom_text)
                if domain in values:
                    raise SchemataParseError(f"schemata line {raw!r}: cache id {domain} twice")
                values[domain] = _parse_value(resource, value_text, raw)
        lines[resource] = values
    return Schemata(lines)


def _parse_value(resource: str, text: str, raw: str) -> int:
    try:
        if is_cache_resource(resource):
            return int(text.removeprefix("0x").removeprefix("0X"), 16)
        if not text.isdigit():
            raise ValueError(text)
        return int(text, 10)
    except ValueError:
        kind = "hex mask" if is_cache_resource(resource) else "decimal number"
        raise SchemataParseError(
            f"schemata line {raw!r}: value {text!r} is not a {kind}"
        ) from None


def format_value(resource: str, value: int) -> str:
    return f"{value:x}" if is_cache_resource(resource) else str(value)


def format_line(resource: str, values: Mapping[int, int]) -> str:
    """One schemata line without its newline, cache ids in ascending order."""
    body = ";".join(f"{d}={format_value(resource, values[d])}" for d in sorted(values))
    return f"{resource}:{body}"


def diff_schemata(
    current: Schemata, desired: Mapping[str, Mapping[int, int]]
) -> dict[str, dict[int, int]]:
    """The (resource, cache id) values in ``desired`` that differ from ``current``.

    Only these are written: the kernel keeps unspecified ids as they are, so writing a partial
    line is both correct and the smallest change.
    """
    changes: dict[str, dict[int, int]] = {}
    for resource, values in desired.items():
        if resource not in current:
            raise InvalidValue(
                f"resource {resource!r} is not in this group's schemata "
                f"(it has {sorted(current.lines)})"
            )
        have = current.lines[resource]
        for domain, value in values.items():
            if domain not in have:
                raise InvalidValue(
                    f"{resource} has no cache id {domain} on this machine "
                    f"(cache ids: {sorted(have)})"
                )
            if have[domain] != value:
                changes.setdefault(resource, {})[domain] = value
    return changes


# ---------------------------------------------------------------------------------------------
# Value rules


def _check_int(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidValue(f"{what} must be an integer, got {value!r}")
    return value


def round_mb_percent(
    value: int, *, min_bandwidth: int, bandwidth_gran: int, max_bandwidth: int = MAX_MB_PERCENT
) -> int:
    """The percentage the kernel will store for a request of ``value`` percent.

    The kernel (fs/resctrl/ctrlmondata.c, bw_validate) refuses values outside
    [min_bandwidth, max] and otherwise stores ``roundup(value, bandwidth_gran)``. We clamp first
    so a request below the hardware minimum means "as little as possible" rather than an error,
    then round exactly as the kernel does so the read-back matches and re-applying is a no-op.
    (The documentation phrases the steps as min_bandwidth + N*bandwidth_gran; on Intel parts
    min_bandwidth is a multiple of the granularity and both agree.)
    """
    value = _check_int(value, "MB percentage")
    if value < 0:
        raise InvalidValue(f"MB percentage must not be negative, got {value}")
    gran = max(1, bandwidth_gran)
    clamped = min(max(value, min_bandwidth), max_bandwidth)
    return -(-clamped // gran) * gran


def check_mbps(value: int) -> int:
    """A bandwidth in MBps for the mba_MBps software controller (the kernel takes any u32)."""
    value = _check_int(value, "MB bandwidth in MBps")
    if not 0 <= value <= MAX_MBPS:
        raise InvalidValue(f"MB bandwidth {value} MBps is outside [0, {MAX_MBPS}]")
    return value


def ways_to_mask(ways: int, *, cbm_len: int, min_cbm_bits: int, start: int = 0) -> int:
    """A contiguous capacity bitmask of ``ways`` bits starting at bit ``start``.

    Intel requires contiguous 1-bits and at least min_cbm_bits of them, so a request below the
    minimum is raised to it; a request above the cache's width is clamped to the whole cache.
    """
    ways = _check_int(ways, "L3 ways")
    start = _check_int(start, "L3 start bit")
    if ways < 1:
        raise InvalidValue(f"L3 ways must be at least 1, got {ways}")
    if cbm_len < 1:
        raise InvalidValue("the L3 cache reports an empty capacity bitmask")
    ways = min(max(ways, min_cbm_bits, 1), cbm_len)
    if start < 0 or start + ways > cbm_len:
        raise InvalidValue(
            f"{ways} L3 ways starting at bit {start} do not fit the {cbm_len}-bit mask"
        )
    return ((1 << ways) - 1) << start


def cbm_problem(mask: int, *, cbm_mask: int, min_cbm_bits: int) -> str | None:
    """Why the kernel would refuse ``mask`` (its last_cmd_status wording), or None if valid."""
    if (min_cbm_bits > 0 and mask == 0) or mask & ~cbm_mask:
        return "Mask out of range"
    low = mask & -mask
    if mask and (mask + low) & mask:
        return f"The mask {mask:x} has non-consecutive 1-bits"
    if mask.bit_count() < min_cbm_bits:
        return f"Need at least {min_cbm_bits} bits in the mask"
    return None
