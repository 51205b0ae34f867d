"""The cluster's history read back from the journal: each job's runs, for accounting.

Fair share (its usage rebuilt at start), ``trellisctl report`` and ``trellis-sim whatif`` all
need the same facts: which account and user a job was charged to, on what resources each of
its runs ran, from when to when, and how it ended. The journal has them:

* the job's row: its spec (account = ``tenant``, user, shape), its state, submission time and,
  for its last run, ``start_time``/``end_time`` and the placement;
* for a job that ran more than once (requeued after a node loss, preempted), its events:
  ``placed`` (the placement's GPUs and cores), ``running``, and what ended each run
  (``queued``/``requeued``: back to the queue; a terminal state). Only those jobs' events are
  read, so a year of history costs one pass over the jobs table;
* ``liquid_usage`` final rows: the GPU utilisation each part measured (noded's ``job_usage``),
  where nodes report it.

Works on any connection that runs the journal's ``?``-placeholder queries: the master's own
store (``Store.db``), a read-only SQLite connection or a PostgreSQL session
(``masterd.journal.backends.open_reader``), so it runs in a thread or another process.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import msgpack

from masterd.core.accounting import JobHistory, Run
from shared.model import JobState

log = logging.getLogger("trellis.journal.history")

_ACTIVE = tuple(s.value for s in JobState if not s.terminal)
# Event kinds that end a run (a requeue, a preemption's requeue, or an end).
_RUN_ENDS = frozenset({"queued", "requeued", *(s.value for s in JobState if s.terminal)})
_REQUEUES = frozenset({"queued", "requeued"})


def unpack(blob: bytes) -> Any:
    """A journal blob. The journal holds the master's own writes, so the hostile-input checks
    of shared.protocol.unpack (nesting depth, sizes) are skipped: they were half the cost of
    reading a year of jobs."""
    return msgpack.unpackb(blob, raw=False)


@dataclass
class NodeHistory:
    name: str
    gpu_model: str | None
    gpus: int
    inventory: dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class History:
    jobs: list[JobHistory]
    nodes: dict[str, NodeHistory]


def _alloc_totals(allocations: Iterable[dict[str, Any]]) -> tuple[int, int, int, tuple[str, ...]]:
    gpus = cpus = memory = 0
    nodes: list[str] = []
    for alloc in allocations:
        gpus += len(alloc.get("gpus") or ())
        cpus += len(alloc.get("cpus") or ())
        memory += int(alloc.get("memory_mib") or 0)
        nodes.append(alloc["node"])
    return gpus, cpus, memory, tuple(nodes)


def read_nodes(db: Any) -> dict[str, NodeHistory]:
    out: dict[str, NodeHistory] = {}
    for name, blob in db.execute("SELECT name, inventory FROM nodes").fetchall():
        inventory = unpack(bytes(blob))
        gpus = inventory.get("gpus") or []
        models = sorted({g.get("model") for g in gpus if g.get("model")})
        out[name] = NodeHistory(name, models[0] if models else None, len(gpus), inventory)
    return out


def read_history(db: Any, submitted_since: float | None = None,
                 submitted_until: float | None = None, utilisation: bool = True,
                 keep_spec: bool = False, ids: list[str] | None = None,
                 states: tuple[str, ...] | None = None) -> History:
    """Every job submitted in ``[submitted_since, submitted_until]`` (None: unbounded) plus
    every job still queued or running, with its runs; and the nodes as last registered.
    ``ids``: only these jobs; ``states``: only jobs in these states."""
    nodes = read_nodes(db)
    where: list[str] = []
    args: list[Any] = []
    if submitted_since is not None:
        where.append(f"(submit_time >= ? OR state IN ({','.join('?' * len(_ACTIVE))}))")
        args += [submitted_since, *_ACTIVE]
    if submitted_until is not None:
        where.append("submit_time <= ?")
        args.append(submitted_until)
    if states is not None:
        where.append(f"state IN ({','.join('?' * len(states))})")
        args += states
    sql = "SELECT id, seq, spec, state, submit_time, data FROM jobs"
    rows: list[Any] = []
    if ids is not None:
        for start in range(0, len(ids), 500):
            part = ids[start:start + 500]
            clause = " AND ".join([*where, f"id IN ({','.join('?' * len(part))})"])
            rows += db.execute(f"{sql} WHERE {clause}", [*args, *part]).fetchall()
        rows.sort(key=lambda row: row[1])
    else:
        if where:
            sql += " WHERE " + " AND ".join(where)
        rows = db.execute(sql + " ORDER BY seq", args).fetchall()
    jobs = [_job_of(db, row, keep_spec) for row in rows]
    for record in jobs:
        if record.gpu_model is None and record.runs and record.gpus:
            for node in record.runs[-1].nodes:
                model = nodes[node].gpu_model if node in nodes else None
                if model:
                    record.gpu_model = model
                    break
    if utilisation:
        attach_utilisation(db, jobs)
    return History(jobs, nodes)


def _job_of(db: Any, row: Any, keep_spec: bool) -> JobHistory:
    job_id, seq, spec_blob, state, submit, data_blob = row
    spec = unpack(bytes(spec_blob))
    data = unpack(bytes(data_blob))
    record = JobHistory(
        id=job_id, account=spec.get("tenant") or "default", user=spec.get("user") or "",
        name=spec.get("name") or "", kind=spec.get("kind") or "training",
        gpus=int(spec.get("gpus") or 0), cpus=int(spec.get("cpus") or 0),
        memory_mib=int(spec.get("memory_mib") or 0), gpu_model=spec.get("gpu_model"),
        submit=float(submit), state=state, end=data.get("end_time"),
        spec=spec if keep_spec else {})
    if data.get("restarts") or data.get("requeue_priority"):
        # It ran (or was placed) more than once: its events tell each run.
        _runs_from_events(db, record, int(seq))
        return record
    start = data.get("start_time")
    if start is None:
        return record
    placement = data.get("placement") or {}
    gpus, cpus, memory, where_ran = _alloc_totals(placement.get("allocations") or ())
    end = data.get("end_time") if state not in _ACTIVE else None
    record.runs.append(Run(float(start), end, gpus, cpus, memory or record.memory_mib,
                           where_ran))
    return record


def _runs_from_events(db: Any, record: JobHistory, seq: int) -> None:
    rows = db.execute(
        "SELECT time, kind, detail FROM events WHERE job_seq = ? AND job_id = ? "
        "AND kind IN ('placed', 'running', 'queued', 'requeued', 'finished', 'failed', "
        "'cancelled', 'timeout', 'node_lost') ORDER BY seq", (seq, record.id)).fetchall()
    placed: tuple[int, int, tuple[str, ...]] = (record.gpus, record.cpus, ())
    start: float | None = None
    for time, kind, detail in rows:
        if kind == "placed":
            allocations = json.loads(detail).get("placement") or []
            gpus, cpus, _, where_ran = _alloc_totals(allocations)
            placed = (gpus, cpus, where_ran)
        elif kind == "running":
            start = float(time)
        elif kind in _RUN_ENDS:
            if start is not None:
                record.runs.append(Run(start, float(time), placed[0], placed[1],
                                       record.memory_mib, placed[2]))
                if kind in _REQUEUES:
                    record.requeued_at.append(float(time))
            start = None
    if start is not None:
        record.runs.append(Run(start, None, placed[0], placed[1], record.memory_mib,
                               placed[2]))


def attach_utilisation(db: Any, jobs: list[JobHistory]) -> None:
    """Each job's ``gpu_util`` from :func:`utilisation_map`."""
    if not jobs:
        return
    found = utilisation_map(db, [job.id for job in jobs] if len(jobs) <= 20_000 else None)
    for record in jobs:
        util = found.get(record.id)
        if util is not None:
            record.gpu_util = util


def utilisation_map(db: Any, ids: list[str] | None = None) -> dict[str, float]:
    """job id -> mean of the final ``gpu_util_mean`` reports of its parts (0..1), weighted by
    how long each part ran; ``ids``: only these jobs (None: every job). A journal without
    Liquid's table has none. The JSON is taken apart by the database (SQLite's json_extract,
    PostgreSQL's ->>): a year of reports in Python's json module cost a second."""
    if isinstance(db, sqlite3.Connection):
        sql = ("SELECT job_id, json_extract(usage, '$.gpu_util_mean'), "
               "json_extract(usage, '$.seconds') FROM liquid_usage WHERE final = 1")
    else:
        sql = ("SELECT job_id, (usage::json->>'gpu_util_mean')::float8, "
               "(usage::json->>'seconds')::float8 FROM liquid_usage WHERE final = 1")
    try:
        if ids is not None:
            rows = []
            for start in range(0, len(ids), 500):
                part = ids[start:start + 500]
                rows += db.execute(f"{sql} AND job_id IN ({','.join('?' * len(part))})",
                                   part).fetchall()
        else:
            rows = db.execute(sql).fetchall()
    except Exception as exc:  # no such table: a journal written before usage was journalled
        log.debug("no utilisation in the journal: %s", exc)
        return {}
    sums: dict[str, list[float]] = {}
    for job_id, util, seconds in rows:
        if util is None:
            continue
        weight = max(float(seconds or 0.0), 1e-9)
        acc = sums.get(job_id)
        if acc is None:
            acc = sums[job_id] = [0.0, 0.0]
        acc[0] += float(util) / 100.0 * weight
        acc[1] += weight
    return {job_id: min(1.0, acc[0] / acc[1]) for job_id, acc in sums.items() if acc[1] > 0}
