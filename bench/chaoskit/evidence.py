"""What the soak's jobs wrote about themselves (bench/chaoskit/job.py), read back."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

_NAME = re.compile(r"^(?P<job>.+)\.r(?P<restarts>\d+)\.n(?P<rank>\d+)\.(?P<pid>\d+)$")


@dataclass
class Part:
    """One process of one incarnation of a job on one node rank, as it recorded itself."""

    job: str
    restarts: int
    rank: int
    pid: int
    node: str = ""
    start: float = 0.0
    # The last moment it surely lived: its last heartbeat (the file's mtime) or its end line.
    alive_until: float = 0.0
    overlap: bool = False  # another live part of the same job and rank held the lock
    end: float | None = None  # when it recorded its own end ...
    code: int | None = None  # ... and the exit code it then exited with
    stopped: bool = False  # it was asked to stop (SIGTERM or SIGHUP) before it ended
    warned: int = 0

    @property
    def ended_on_its_own(self) -> bool:
        return self.end is not None and not self.stopped


@dataclass
class Evidence:
    parts: dict[str, list[Part]] = field(default_factory=dict)  # job -> its parts, by start
    unreadable: list[str] = field(default_factory=list)

    def of(self, job: str) -> list[Part]:
        return self.parts.get(job, [])

    @property
    def jobs(self) -> list[str]:
        return sorted(self.parts)


def read_evidence(root: Path) -> Evidence:
    found = Evidence()
    if not root.exists():
        return found
    for entry in os.scandir(root):
        m = _NAME.match(entry.name)
        if m is None:
            continue
        part = Part(m["job"], int(m["restarts"]), int(m["rank"]), int(m["pid"]))
        try:
            mtime = entry.stat().st_mtime
            lines = Path(entry.path).read_text(errors="replace").splitlines()
        except OSError as exc:
            found.unreadable.append(f"{entry.name}: {exc}")
            continue
        for line in lines:
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a line cut short by SIGKILL
            event = record.get("ev")
            if event == "start":
                # When the kernel created the process (the part's start, before its program's
                # own start-up), else when the program first ran.
                part.start = float(record.get("spawned") or record["t"])
                part.node = str(record.get("node", ""))
                part.overlap = bool(record.get("overlap"))
            elif event == "warned":
                part.warned += 1
            elif event == "term":
                part.stopped = True
            elif event == "end":
                part.end = float(record["t"])
                part.code = int(record["code"])
        if not part.start:
            found.unreadable.append(f"{entry.name}: no start line")
            continue
        part.alive_until = max(part.start, mtime if part.end is None else part.end)
        found.parts.setdefault(part.job, []).append(part)
    for parts in found.parts.values():
        parts.sort(key=lambda p: p.start)
    return found
