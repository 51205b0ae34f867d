"""MBM/CMT counters and bandwidth from them.

``mon_data/mon_L3_XX/mbm_total_bytes`` and ``mbm_local_bytes`` are cumulative byte counts since
the group's RMID was allocated; bandwidth is the difference of two reads over the time between
them. ``llc_occupancy`` is a current level (bytes), not a counter.

Wrap: the hardware counters are 24 to 62 bits wide (MBM_CNTR_WIDTH_BASE 24 plus a CPUID offset of
at most 62-24), but the kernel never shows them raw: its overflow handler samples every RMID at
least once a second (MBM_OVERFLOW_INTERVAL) and accumulates the deltas into a 64-bit byte count,
which is what the file prints. That value does not wrap in practice (2^64 bytes is ~580 years at
1 TB/s), so a read smaller than the previous one means the count was reset -- the group was
removed and re-created with a fresh RMID, or the BMEC event configuration changed. We treat a
decrease as a reset: no bandwidth for that interval, and the new value starts the next one.

The kernel prints ``Unavailable`` (the hardware could not read the counter, e.g. right after a
BMEC change or for an RMID not yet counted), ``Error`` (the read failed) or, with counter
assignment, ``Unassigned`` instead of a number. Those reads yield None, and because the count
may have restarted underneath, the previous reading for that domain is dropped too.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

log = logging.getLogger("trellis.rdt")

UNREADABLE = frozenset({"Unavailable", "Error", "Unassigned"})
MBM_EVENTS = ("mbm_total_bytes", "mbm_local_bytes")
EVENTS = ("llc_occupancy", *MBM_EVENTS)


def parse_counter(text: str, *, where: str = "") -> int | None:
    """The number in a mon_data file, or None when the kernel reports no value."""
    value = text.strip()
    if value.isdigit():
        return int(value)
    if value in UNREADABLE:
        log.debug("rdt counter unreadable where=%s status=%s", where, value)
    else:
        log.warning("rdt counter unparseable where=%s text=%r", where, value[:40])
    return None


@dataclass(frozen=True)
class _Last:
    value: int
    at: float


class BandwidthMeter:
    """Turns successive cumulative counter reads into bytes per second, per group and domain.

    Keeps the last reading and its time for every (group, domain); ``update`` returns the
    bandwidth for each domain where the previous and current reads are both valid and the
    counter did not go backwards.
    """

    def __init__(self) -> None:
        self._last: dict[tuple[str, int], _Last] = {}
        self.resets = 0  # decreases seen: how often a counter restarted under us

    def update(
        self, group: str, readings: Mapping[int, int | None], now: float
    ) -> dict[int, float]:
        rates: dict[int, float] = {}
        for domain, value in readings.items():
            key = (group, domain)
            prev = self._last.get(key)
            if value is None:
                self._last.pop(key, None)
                continue
            if prev is None:
                self._last[key] = _Last(value, now)
                continue
            if now <= prev.at:
                # Same instant (or a clock step back): no interval to divide by; keep the
                # older reading so the next update measures a real interval.
                continue
            self._last[key] = _Last(value, now)
            if value < prev.value:
                self.resets += 1
                log.info(
                    "rdt counter reset group=%s domain=%d before=%d after=%d",
                    group, domain, prev.value, value,
                )
                continue
            rates[domain] = (value - prev.value) / (now - prev.at)
        # Domains that vanished from the read (CPU offline) must not pair with a later read.
        for key in [k for k in self._last if k[0] == group and k[1] not in readings]:
            del self._last[key]
        return rates

    def forget(self, group: str) -> None:
        """Drop a group's history (call when the group is removed)."""
        for key in [k for k in self._last if k[0] == group]:
            del self._last[key]

    def groups(self) -> list[str]:
        return sorted({g for g, _ in self._last})
