"""The kernel's CPU/NUMA-node list text format ("0-3,8,10-11")."""

from __future__ import annotations

from collections.abc import Iterable


def parse_cpu_list(text: str) -> tuple[int, ...]:
    """Parse the kernel list format (``"0-3,8,10-11"``, possibly empty) into sorted ids."""
    out: set[int] = set()
    text = text.strip()
    if not text:
        return ()
    for part in text.split(","):
        part = part.strip()
        lo, sep, hi = part.partition("-")
        try:
            first = int(lo)
            last = int(hi) if sep else first
        except ValueError:
            raise ValueError(f"bad CPU/node list {text!r}: {part!r} is not N or N-M") from None
        if first < 0 or last < first:
            raise ValueError(f"bad CPU/node list {text!r}: range {part!r} is empty or negative")
        out.update(range(first, last + 1))
    return tuple(sorted(out))


def format_cpu_list(ids: Iterable[int]) -> str:
    """Format ids as the kernel writes them: sorted, consecutive runs collapsed to ``a-b``."""
    runs: list[str] = []
    ordered = sorted(set(ids))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        runs.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(runs)
