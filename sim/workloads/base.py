"""What every workload loader produces, and the row validation they share."""

from __future__ import annotations

import csv
import logging
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shared.model import JobSpec, NodeInventory
from sim.truth import TruthParams

log = logging.getLogger("trellis.sim.workloads")


class TraceError(ValueError):
    """A trace row (or file) that cannot be used; names the file and the line."""

    def __init__(self, path: Path | str, line: int | None, message: str) -> None:
        where = f"{path}:{line}" if line is not None else str(path)
        super().__init__(f"{where}: {message}")
        self.path = str(path)
        self.line = line
        self.reason = message


class RowError(ValueError):
    """Raised by a row parser; the reader adds the file and line."""


@dataclass(frozen=True)
class SimJob:
    """One job of a workload: what the scheduler is told (``spec``) and what is true."""

    id: str
    spec: JobSpec
    submit: float  # seconds on the simulation clock
    truth: TruthParams
    # GENIE's ECT (relative to submit) from the truth model is computed by the engine; a
    # workload may instead fix an absolute deadline on the simulation clock.
    deadline: float | None = None
    # Annotations the job enters the core with (Job.annotations): predictions a replay fixes
    # in advance, e.g. QSSF's estimate under Helios' error model (sim/workloads/philly.py).
    annotations: dict[str, float] = field(default_factory=dict, hash=False, compare=False)


@dataclass
class Workload:
    name: str
    jobs: list[SimJob]
    nodes: list[NodeInventory]
    # Epoch seconds of simulation time 0 when the trace had wall-clock timestamps.
    origin: float | None = None
    # Documented assumptions and counts (e.g. fractional GPUs rounded up), shown in reports.
    notes: dict[str, Any] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)  # "file:line: reason" per skipped row

    def sort(self) -> None:
        # Stable: equal submit times keep file order, so replays are reproducible.
        self.jobs.sort(key=lambda j: j.submit)


@dataclass(frozen=True)
class LoadOptions:
    seed: int = 1
    skip_bad_rows: bool = False
    limit: int | None = None  # keep the first N jobs by submission time


def read_csv_rows(
    path: Path,
    required: tuple[str, ...],
    parse: Callable[[Mapping[str, str], int], Any],
    options: LoadOptions,
    skipped: list[str],
) -> Iterator[Any]:
    """Parse every data row of a CSV file with ``parse(row, line)``.

    A row that fails (wrong column count, a :class:`RowError` from ``parse``) stops the load
    with a :class:`TraceError` naming file and line, or is logged, recorded and skipped when
    ``options.skip_bad_rows`` is set.
    """
    try:
        handle = path.open(newline="", encoding="utf-8")
    except OSError as exc:
        raise TraceError(path, None, f"cannot open: {exc.strerror}") from None
    with handle:
        reader = csv.reader(handle)
        try:
            header = next(reader)
        except StopIteration:
            raise TraceError(path, 1, "file is empty (no header row)") from None
        except (csv.Error, UnicodeDecodeError) as exc:
            raise TraceError(path, 1, f"unreadable header: {exc}") from None
        header = [h.strip() for h in header]
        missing = [c for c in required if c not in header]
        if missing:
            raise TraceError(
                path, 1, f"missing column(s) {', '.join(missing)}; found {', '.join(header)}"
            )
        while True:
            try:
                values = next(reader)
            except StopIteration:
                return
            except (csv.Error, UnicodeDecodeError) as exc:
                _bad(path, reader.line_num, f"unreadable row: {exc}", options, skipped)
                continue
            line = reader.line_num
            if not values or all(not v.strip() for v in values):
                continue  # blank lines are not rows
            if len(values) != len(header):
                _bad(path, line, f"expected {len(header)} fields, found {len(values)}",
                     options, skipped)
                continue
            row = dict(zip(header, values, strict=True))
            try:
                yield parse(row, line)
            except RowError as exc:
                _bad(path, line, str(exc), options, skipped)


def _bad(path: Path, line: int, message: str, options: LoadOptions, skipped: list[str]) -> None:
    if not options.skip_bad_rows:
        raise TraceError(path, line, message)
    entry = f"{path}:{line}: {message}"
    log.warning("skipped_row where=%s:%d reason=%s", path, line, message)
    skipped.append(entry)


# -- field parsers: each raises RowError naming the column ---------------------------------


def parse_float(row: Mapping[str, str], column: str, *, min_value: float | None = None,
                allow_empty: bool = False) -> float | None:
    raw = row[column].strip()
    if not raw:
        if allow_empty:
            return None
        raise RowError(f"column {column} is empty")
    try:
        value = float(raw)
    except ValueError:
        raise RowError(f"column {column}: {raw!r} is not a number") from None
    if not math.isfinite(value):
        raise RowError(f"column {column}: {raw!r} is not a finite number")
    if min_value is not None and value < min_value:
        raise RowError(f"column {column}: {raw} is below the minimum {min_value:g}")
    return value


def parse_int(row: Mapping[str, str], column: str, *, min_value: int | None = None,
              allow_empty: bool = False) -> int | None:
    raw = row[column].strip()
    if not raw:
        if allow_empty:
            return None
        raise RowError(f"column {column} is empty")
    try:
        value = int(raw)
    except ValueError:
        try:
            as_float = float(raw)
        except ValueError:
            raise RowError(f"column {column}: {raw!r} is not an integer") from None
        if not as_float.is_integer():
            raise RowError(f"column {column}: {raw!r} is not an integer") from None
        value = int(as_float)
    if min_value is not None and value < min_value:
        raise RowError(f"column {column}: {raw} is below the minimum {min_value}")
    return value


def finish(workload: Workload, options: LoadOptions) -> Workload:
    workload.sort()
    if options.limit is not None:
        workload.jobs = workload.jobs[: options.limit]
    if workload.jobs:
        # Replays start at the first kept arrival so clocks and makespans stay readable.
        first = workload.jobs[0].submit
        if first:
            workload.jobs = [_shift(j, -first) for j in workload.jobs]
            if workload.origin is not None:
                workload.origin += first
    if workload.skipped:
        workload.notes["skipped_rows"] = len(workload.skipped)
    return workload


def _shift(job: SimJob, delta: float) -> SimJob:
    return SimJob(
        id=job.id,
        spec=job.spec,
        submit=job.submit + delta,
        truth=job.truth,
        deadline=None if job.deadline is None else job.deadline + delta,
        annotations=job.annotations,
    )
