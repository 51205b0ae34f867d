"""NUMA node of a GPU from its CPU affinity, for drivers without nvmlDeviceGetNumaNodeId."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

log = logging.getLogger("trellis.gpu.numa")

_NODE_DIR = re.compile(r"node(\d+)")


def parse_cpulist(text: str) -> set[int]:
    """The kernel's cpulist format: ``0-3,8,10-11``; raises ValueError on anything else."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        first, last = int(lo), int(hi) if sep else int(lo)
        if first < 0 or last < first:
            raise ValueError(f"bad cpulist range {part!r}")
        cpus.update(range(first, last + 1))
    return cpus


def cpu_nodes(sys_root: Path) -> dict[int, int]:
    """CPU id -> NUMA node from ``<sys_root>/devices/system/node/node*/cpulist``."""
    mapping: dict[int, int] = {}
    base = sys_root / "devices" / "system" / "node"
    try:
        entries = sorted(base.iterdir())
    except OSError:
        return mapping
    for entry in entries:
        m = _NODE_DIR.fullmatch(entry.name)
        if not m:
            continue
        try:
            cpus = parse_cpulist((entry / "cpulist").read_text())
        except (OSError, ValueError) as exc:
            log.warning("numa_cpulist_unreadable node=%s error=%r", entry.name, str(exc))
            continue
        for cpu in cpus:
            mapping[cpu] = int(m.group(1))
    return mapping


def cpus_from_mask(words: Iterable[int]) -> set[int]:
    """CPU ids set in an NVML affinity mask (an array of 64-bit words, CPU 0 = bit 0 of word 0)."""
    cpus: set[int] = set()
    for w, word in enumerate(words):
        value = int(word)
        bit = 0
        while value:
            if value & 1:
                cpus.add(w * 64 + bit)
            value >>= 1
            bit += 1
    return cpus


def node_of_cpus(cpus: Iterable[int], nodes: dict[int, int]) -> int:
    """The NUMA node holding all of ``cpus``, or -1 when they span nodes or are unmapped.

    An affinity covering every CPU means the driver knows no locality; picking one node then
    would invent a fact.
    """
    found = {nodes.get(cpu, -1) for cpu in cpus}
    if len(found) != 1:
        return -1
    return found.pop()


def mask_words(cpu_count: int) -> int:
    return max(1, -(-cpu_count // 64))


def affinity_node(words: Sequence[int], sys_root: Path) -> int:
    return node_of_cpus(cpus_from_mask(words), cpu_nodes(sys_root))
