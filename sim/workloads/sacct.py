"""Slurm accounting history (``sacct -P``) into the simulator's job-file format.

Expected input: the pipe-separated output, with its header line, of

    sacct -a -X -P -S 2024-01-01 -E 2024-02-01 \\
          --format=JobID,User,Account,Submit,Start,End,State,AllocTRES

Jobs that never started (Start is Unknown/None) or have not ended yet are skipped with a
reason: the simulator needs how long a job really ran. AllocTRES gives gpus (``gres/gpu``,
with or without a type), cpus and memory.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path

from sim.workloads.base import LoadOptions, RowError, TraceError, _bad

REQUIRED = ("JobID", "User", "Account", "Submit", "Start", "End", "State", "AllocTRES")
OUTPUT_COLUMNS = ("name", "user", "tenant", "submit", "duration", "gpus", "cpus", "memory_mib")
_UNSET = frozenset({"", "Unknown", "None", "N/A"})
_MEM_UNITS = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}
_SANITISE = re.compile(r"[^A-Za-z0-9_-]")


class SkipRow(Exception):
    """A well-formed row the simulator cannot replay (never ran); skipped, not an error."""


def _time(raw: str, column: str) -> datetime:
    try:
        stamp = datetime.fromisoformat(raw.strip())
    except ValueError:
        raise RowError(f"column {column}: {raw!r} is not a time") from None
    return stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)


def _tres(raw: str) -> tuple[int, int, int]:
    gpus = cpus = mem = 0
    for item in filter(None, raw.split(",")):
        key, sep, value = item.partition("=")
        if not sep:
            raise RowError(f"column AllocTRES: {item!r} is not key=value")
        try:
            if key == "cpu":
                cpus = int(value)
            elif key == "gres/gpu" or key.startswith("gres/gpu:"):
                gpus += int(value)
            elif key == "mem":
                unit = value[-1:].upper()
                number = float(value[:-1]) if unit in _MEM_UNITS else float(value)
                mem = round(number * _MEM_UNITS.get(unit, 1))
        except ValueError:
            raise RowError(f"column AllocTRES: {item!r} has a non-numeric value") from None
    return gpus, cpus, mem


def _convert(row: Mapping[str, str]) -> dict[str, object]:
    if row["Start"].strip() in _UNSET:
        raise SkipRow(f"job {row['JobID']} never started")
    if row["End"].strip() in _UNSET:
        raise SkipRow(f"job {row['JobID']} has not ended")
    submit = _time(row["Submit"], "Submit")
    start = _time(row["Start"], "Start")
    end = _time(row["End"], "End")
    if end < start:
        raise RowError(f"End {row['End']} is before Start {row['Start']}")
    gpus, cpus, mem = _tres(row["AllocTRES"])
    name = "slurm-" + _SANITISE.sub("-", row["JobID"].strip())[:56]
    tenant = _SANITISE.sub("-", row["Account"].strip() or "default")[:63].lstrip("-_")
    return {
        "name": name,
        "user": row["User"].strip().lower(),
        "tenant": tenant or "default",
        "submit": submit.isoformat(),
        "duration": (end - start).total_seconds(),
        "gpus": gpus,
        "cpus": cpus if cpus or gpus else 1,
        "memory_mib": mem,
    }


def read(path: Path, options: LoadOptions, skipped: list[str]) -> Iterator[dict[str, object]]:
    try:
        handle = path.open(newline="", encoding="utf-8")
    except OSError as exc:
        raise TraceError(path, None, f"cannot open: {exc.strerror}") from None
    with handle:
        reader = csv.reader(handle, delimiter="|")
        try:
            header = [h.strip() for h in next(reader)]
        except StopIteration:
            raise TraceError(path, 1, "file is empty (no header row)") from None
        missing = [c for c in REQUIRED if c not in header]
        if missing:
            raise TraceError(path, 1, f"missing sacct field(s) {', '.join(missing)}")
        for values in reader:
            line = reader.line_num
            if not values:
                continue
            # sacct -P ends lines with a trailing '|' on some versions.
            if len(values) == len(header) + 1 and values[-1] == "":
                values = values[:-1]
            if len(values) != len(header):
                _bad(path, line, f"expected {len(header)} fields, found {len(values)}",
                     options, skipped)
                continue
            try:
                yield _convert(dict(zip(header, values, strict=True)))
            except SkipRow as exc:
                skipped.append(f"{path}:{line}: {exc}")
            except RowError as exc:
                _bad(path, line, str(exc), options, skipped)


def convert(source: Path, target: Path, options: LoadOptions) -> tuple[int, list[str]]:
    """Write ``source`` (sacct -P) as a simulator job CSV; returns rows written and skips."""
    skipped: list[str] = []
    count = 0
    with target.open("w", newline="", encoding="utf-8") as out:
        writer = csv.DictWriter(out, fieldnames=OUTPUT_COLUMNS)
        writer.writeheader()
        for row in read(source, options, skipped):
            writer.writerow(row)
            count += 1
    return count, skipped
