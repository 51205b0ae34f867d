"""Operators' own job history: a CSV or JSON-lines file in the format of docs/simulator.md.

One job per row/line. ``submit`` is required (seconds, or an ISO-8601 timestamp; one style per
file); each job needs either ``duration`` (seconds it ran, on ``duration_gpus`` GPUs, default
its ``gpus``) or ``batch`` and ``iterations`` (run through the truth model). Every other column
is a :class:`~shared.model.JobSpec` field and is validated by the same schema code the master
uses for submissions.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from shared.dependency import DependencyError, parse_dependency
from shared.model import JobKind, JobSpec, NodeInventory
from shared.schema import SchemaError, decode
from sim.truth import TruthParams
from sim.workloads.base import (
    LoadOptions,
    RowError,
    SimJob,
    TraceError,
    Workload,
    _bad,
    finish,
    read_csv_rows,
)

INT_FIELDS = ("gpus", "cpus", "memory_mib", "batch", "iterations", "max_nodes", "duration_gpus")
FLOAT_FIELDS = ("model_params_m",)
TIME_FIELDS = ("submit", "deadline")
STR_FIELDS = ("name", "user", "tenant", "kind", "qos", "gpu_model", "model_type", "model_family")
KNOWN = frozenset(INT_FIELDS + FLOAT_FIELDS + TIME_FIELDS + STR_FIELDS
                  + ("duration", "id", "after"))


@dataclass
class _TimeStyle:
    iso: bool | None = None

    def parse(self, value: Any, column: str) -> float:
        if isinstance(value, bool):
            raise RowError(f"column {column}: {value!r} is not a time")
        if isinstance(value, int | float):
            iso = False
            seconds = float(value)
        else:
            text = str(value).strip()
            try:
                seconds = float(text)
                iso = False
            except ValueError:
                try:
                    stamp = datetime.fromisoformat(text)
                except ValueError:
                    raise RowError(
                        f"column {column}: {text!r} is neither seconds nor an ISO-8601 time"
                    ) from None
                if stamp.tzinfo is None:
                    stamp = stamp.replace(tzinfo=UTC)
                seconds = stamp.timestamp()
                iso = True
        if not math.isfinite(seconds) or seconds < 0:
            raise RowError(f"column {column}: {value!r} must be a finite, non-negative time")
        if self.iso is None:
            self.iso = iso
        elif self.iso != iso:
            raise RowError(
                f"column {column}: {value!r} mixes seconds and ISO-8601 times in one file"
            )
        return seconds


def _number(value: Any, column: str, integer: bool) -> float | int:
    if isinstance(value, bool):
        raise RowError(f"column {column}: {value!r} is not a number")
    if isinstance(value, int | float):
        number = value
    else:
        text = str(value).strip()
        try:
            number = float(text)
        except ValueError:
            raise RowError(f"column {column}: {text!r} is not a number") from None
    if not math.isfinite(number):
        raise RowError(f"column {column}: {value!r} is not a finite number")
    if integer:
        if float(number) != int(number):
            raise RowError(f"column {column}: {value!r} is not an integer")
        return int(number)
    return float(number)


def _row_to_job(
    row: Mapping[str, Any], line: int, style: _TimeStyle, seq: int
) -> SimJob:
    unknown = sorted(k for k in row if k not in KNOWN)
    if unknown:
        raise RowError(f"unknown column(s) {', '.join(unknown)}")
    values = {
        k: v for k, v in row.items() if not (v is None or (isinstance(v, str) and not v.strip()))
    }
    if "submit" not in values:
        raise RowError("column submit is required")
    submit = style.parse(values.pop("submit"), "submit")
    deadline = style.parse(values.pop("deadline"), "deadline") if "deadline" in values else None
    duration = None
    if "duration" in values:
        duration = float(_number(values.pop("duration"), "duration", integer=False))
        if duration < 0:
            raise RowError(f"column duration: {duration:g} is negative")
    duration_gpus = (
        int(_number(values.pop("duration_gpus"), "duration_gpus", integer=True))
        if "duration_gpus" in values else None
    )
    job_id = str(values.pop("id", "")).strip() or None
    after = str(values.pop("after", "")).strip()
    data: dict[str, Any] = {}
    if after:  # Slurm's --dependency syntax, read as trellisctl submit --after reads it
        try:
            data["after"] = [{"type": t.type, "jobs": list(t.jobs)}
                             for t in parse_dependency(after)]
        except DependencyError as exc:
            raise RowError(f"column after: {exc}") from None
    for key, value in values.items():
        if key in INT_FIELDS:
            data[key] = _number(value, key, integer=True)
        elif key in FLOAT_FIELDS:
            data[key] = _number(value, key, integer=False)
        else:
            data[key] = value if not isinstance(value, str) else value.strip()
    data.setdefault("name", f"job-{seq:06d}")
    data.setdefault("user", "sim")
    data.setdefault("command", ["sim-job"])
    if "kind" not in data:
        data["kind"] = JobKind.TRAINING.value if data.get("gpus", 0) else JobKind.CPU.value
    try:
        spec = decode(JobSpec, data)
    except SchemaError as exc:
        raise RowError(str(exc)) from None
    if duration is None:
        if spec.batch is None or spec.iterations is None:
            raise RowError("give either duration or both batch and iterations")
        if spec.kind is JobKind.CPU or spec.gpus == 0:
            raise RowError("a job without GPUs needs a duration")
    if duration_gpus is not None and duration_gpus < 0:
        raise RowError(f"column duration_gpus: {duration_gpus} is negative")
    truth = TruthParams(
        model_type=spec.model_type,
        batch=spec.batch,
        iterations=spec.iterations,
        known_duration=duration,
        known_gpus=duration_gpus if duration_gpus is not None else spec.gpus,
    )
    return SimJob(id=job_id or spec.name, spec=spec, submit=submit, truth=truth,
                  deadline=deadline)


def _jsonl_rows(
    path: Path, options: LoadOptions, skipped: list[str]
) -> Iterator[tuple[dict[str, Any], int]]:
    try:
        handle = path.open(encoding="utf-8")
    except OSError as exc:
        raise TraceError(path, None, f"cannot open: {exc.strerror}") from None
    with handle:
        line = 0
        while True:
            try:
                text = handle.readline()
            except UnicodeDecodeError as exc:
                _bad(path, line + 1, f"not UTF-8: {exc}", options, skipped)
                line += 1
                continue
            if not text:
                return
            line += 1
            if not text.strip():
                continue
            try:
                obj = json.loads(text)
            except ValueError as exc:
                _bad(path, line, f"not valid JSON: {exc}", options, skipped)
                continue
            if not isinstance(obj, dict):
                _bad(path, line, "each line must be a JSON object", options, skipped)
                continue
            yield obj, line


def load(path: Path, options: LoadOptions, nodes: list[NodeInventory]) -> Workload:
    skipped: list[str] = []
    style = _TimeStyle()
    jobs: list[SimJob] = []
    if path.suffix in (".jsonl", ".ndjson", ".json"):
        for obj, line in _jsonl_rows(path, options, skipped):
            try:
                jobs.append(_row_to_job(obj, line, style, line))
            except RowError as exc:
                _bad(path, line, str(exc), options, skipped)
    else:
        jobs.extend(
            read_csv_rows(
                path, ("submit",),
                lambda row, line: _row_to_job(row, line, style, line),
                options, skipped,
            )
        )
    if not jobs:
        raise TraceError(path, None, "no jobs")
    counts = Counter(j.id for j in jobs)
    dups = sorted(i for i, n in counts.items() if n > 1)
    if dups:
        raise TraceError(path, None, f"job id {dups[0]} appears more than once")
    workload = Workload(
        name=path.stem,
        jobs=jobs,
        nodes=nodes,
        origin=0.0 if style.iso else None,
        skipped=skipped,
    )
    return finish(workload, options)
