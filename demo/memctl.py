"""The demo's stand-in for a memory controller with Intel RDT, which this machine lacks.

A node daemon configured with ``rdt.mode = "emulated"`` keeps a resctrl tree with the kernel's
layout in its state directory; nothing in it moves by itself (rdt/emulated.py). The hardware's
two parts are played here, for one job:

* **MBM**: the memory-hungry job (demo/membw_job.py) really copies memory and writes how many
  bytes it has moved; every tick the difference goes into its resctrl group's
  ``mbm_total_bytes`` counters, spread over the L3 domains, as the kernel would count it.
* **MBA**: the group's ``schemata`` holds the throttle the node's contention eliminator wrote
  (``MB:0=80;1=80``); the job is told the bandwidth that level lets through (level % of the
  node's peak) and keeps to it, as a throttled core would be slowed.

So the eliminator's decisions are the real node daemon's, judged on counters that follow what
the job really did; only the silicon between them is emulated.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from rdt import group_for_job
from rdt.emulated import advance_mbm
from rdt.errors import SchemataParseError
from rdt.schemata import MAX_MB_PERCENT, parse_schemata

# Short against the node's contention interval: a tick's worth of bytes counted a tick late
# is the error the node sees in its rate.
TICK_S = 0.02
MIB = 1 << 20


@dataclass(frozen=True)
class Reading:
    t: float  # monotonic
    moved: int  # bytes counted so far
    mba: int  # the group's MBA level, percent


def rate_mibps(readings: list[Reading]) -> float | None:
    """Mean MiB/s over consecutive readings (None for fewer than two)."""
    if len(readings) < 2 or readings[-1].t <= readings[0].t:
        return None
    return (readings[-1].moved - readings[0].moved) / MIB / (readings[-1].t - readings[0].t)


@dataclass
class MemoryController:
    resctrl_root: Path  # the node's emulated resctrl tree
    job_id: str
    counter: Path  # bytes the job has moved, written by the job
    allowance: Path  # MiB/s the job may draw, written here
    peak_mibps: float  # the node's peak, as its contention configuration says
    readings: list[Reading] = field(default_factory=list)

    @property
    def group(self) -> Path:
        return self.resctrl_root / group_for_job(self.job_id)

    def domains(self) -> list[int]:
        mon = self.group / "mon_data"
        return sorted(int(d.name.rsplit("_", 1)[1]) for d in mon.glob("mon_L3_*"))

    def mba_level(self) -> int:
        try:
            levels = parse_schemata((self.group / "schemata").read_text()).get("MB")
        except (OSError, SchemataParseError):
            return MAX_MB_PERCENT
        return min(levels.values()) if levels else MAX_MB_PERCENT

    def moved(self) -> int:
        try:
            return int(self.counter.read_text().strip() or 0)
        except (OSError, ValueError):
            return 0

    def allow(self, level: int) -> None:
        """Tell the job what the MBA level lets through (nothing to say at 100 %)."""
        if level >= MAX_MB_PERCENT:
            with contextlib.suppress(FileNotFoundError):
                self.allowance.unlink()
            return
        tmp = self.allowance.with_suffix(".tmp")
        tmp.write_text(f"{self.peak_mibps * level / 100:.1f}\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, self.allowance)

    def run(self, until: threading.Event) -> None:
        """Count the job's traffic until ``until`` is set or its group is gone. Runs in a
        thread of its own: counters advanced in bursts whenever a busy event loop got round
        to it would show the node rates the job never drew."""
        # The node creates the group once the job runs; its counters appear just after it.
        while not (domains := self.domains() if self.group.is_dir() else []):
            if until.wait(TICK_S):
                return
        counted = self.moved()
        while not until.wait(TICK_S) and self.group.is_dir():
            moved, now = self.moved(), time.monotonic()
            delta = max(0, moved - counted)
            counted = max(counted, moved)
            try:
                for i, domain in enumerate(domains):
                    share = delta // len(domains) + (1 if i < delta % len(domains) else 0)
                    advance_mbm(self.resctrl_root, group_for_job(self.job_id), domain, share)
            except FileNotFoundError:
                return  # the job ended and its group went between two looks
            level = self.mba_level()
            self.allow(level)
            self.readings.append(Reading(now, counted, level))
