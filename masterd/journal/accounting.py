"""The journal's ``accounting`` table: one compact row per ended job, derived from its rows.

An ended job never changes again, so what accounting needs of it (account, user, shape, each
run's times and resources, how it ended) is derived once — by
:func:`masterd.journal.history.read_history`, from the job's row and, for a job that ran more
than once, its events — and kept here in plain columns. A report over a year then reads
numbers instead of decoding 365,000 specs (bench/governance_report.py). The table is an
index, not a source: every row can be derived again from the jobs and events tables, and
:func:`read_jobs` derives any that are missing (a master stopped before it wrote them, a
journal from before the table existed) on the fly, so a report is never short of a job.

The fair-share feature records ended jobs in batches through the journal writer
(:func:`record_ended`) and fills the table for older journals in the background
(:func:`backfill`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from masterd.journal.history import (
    JobHistory,
    Run,
    attach_utilisation,
    read_history,
    read_nodes,
)
from masterd.journal.store import Store
from shared.model import JobState

SCHEMA = """
CREATE TABLE IF NOT EXISTS accounting (
    job_id TEXT PRIMARY KEY,
    job_seq INTEGER NOT NULL,
    account TEXT NOT NULL,
    username TEXT NOT NULL,
    kind TEXT NOT NULL,
    gpu_model TEXT,
    gpus INTEGER NOT NULL,
    cpus INTEGER NOT NULL,
    memory_mib INTEGER NOT NULL,
    submit_time REAL NOT NULL,
    end_time REAL,
    state TEXT NOT NULL,
    run_start REAL,
    run_end REAL,
    run_gpus INTEGER,
    run_cpus INTEGER,
    run_memory_mib INTEGER,
    runs TEXT,
    requeued_at TEXT
);
CREATE INDEX IF NOT EXISTS accounting_end ON accounting(end_time);
"""

ENDED = tuple(s.value for s in JobState if s.terminal)
ACTIVE = tuple(s.value for s in JobState if not s.terminal)
_COLUMNS = ("job_id, job_seq, account, username, kind, gpu_model, gpus, cpus, memory_mib, "
            "submit_time, end_time, state, run_start, run_end, run_gpus, run_cpus, "
            "run_memory_mib, runs, requeued_at")
_MISSING = (f"SELECT id FROM jobs WHERE state IN ({','.join('?' * len(ENDED))}) AND NOT EXISTS "
            "(SELECT 1 FROM accounting a WHERE a.job_id = jobs.id)")


def create_tables(store: Store) -> None:
    store.db.executescript(SCHEMA)


def _row(job: JobHistory, seq: int) -> tuple[Any, ...]:
    single = job.runs[0] if len(job.runs) == 1 else None
    runs = (json.dumps([[r.start, r.end, r.gpus, r.cpus, r.memory_mib] for r in job.runs])
            if len(job.runs) > 1 else None)
    return (job.id, seq, job.account, job.user, job.kind, job.gpu_model, job.gpus, job.cpus,
            job.memory_mib, job.submit, job.end, job.state,
            single.start if single else None, single.end if single else None,
            single.gpus if single else None, single.cpus if single else None,
            single.memory_mib if single else None, runs,
            json.dumps(job.requeued_at) if job.requeued_at else None)


def _insert(store: Store, ids: list[str]) -> int:
    """Derive and insert the rows of these ended jobs (those already there are kept)."""
    if not ids:
        return 0
    history = read_history(store.db, ids=ids, states=ENDED, utilisation=False)
    seqs: dict[str, int] = {}
    for start in range(0, len(ids), 500):
        part = ids[start:start + 500]
        seqs.update(store.db.execute(
            f"SELECT id, seq FROM jobs WHERE id IN ({','.join('?' * len(part))})",
            part).fetchall())
    rows = [_row(job, seqs[job.id]) for job in history.jobs]
    store.db.executemany(f"INSERT INTO accounting ({_COLUMNS}) VALUES "
                         f"({','.join('?' * 19)}) ON CONFLICT (job_id) DO NOTHING", rows)
    return len(rows)


def record_ended(store: Store, ids: list[str]) -> int:
    """Journal writer: the accounting rows of jobs that just ended (one transaction)."""
    have = set()
    for start in range(0, len(ids), 500):
        part = ids[start:start + 500]
        have.update(r[0] for r in store.db.execute(
            f"SELECT job_id FROM accounting WHERE job_id IN ({','.join('?' * len(part))})",
            part).fetchall())
    todo = [i for i in dict.fromkeys(ids) if i not in have]
    return store.transaction(_insert, store, todo) if todo else 0


def backfill(store: Store, limit: int) -> int:
    """Journal writer: derive up to ``limit`` missing rows; how many it wrote (0: done)."""
    ids = [r[0] for r in store.db.execute(f"{_MISSING} LIMIT ?", (*ENDED, limit)).fetchall()]
    return store.transaction(_insert, store, ids) if ids else 0


def _from_row(row: Any) -> JobHistory:
    (job_id, _, account, user, kind, gpu_model, gpus, cpus, memory, submit, end, state,
     run_start, run_end, run_gpus, run_cpus, run_memory, runs, requeued) = row
    job = JobHistory(id=job_id, account=account, user=user, name="", kind=kind, gpus=gpus,
                     cpus=cpus, memory_mib=memory, gpu_model=gpu_model, submit=submit,
                     state=state, end=end)
    if run_start is not None:
        job.runs.append(Run(run_start, run_end, run_gpus, run_cpus, run_memory))
    elif runs:
        job.runs.extend(Run(s, e, g, c, m) for s, e, g, c, m in json.loads(runs))
    if requeued:
        job.requeued_at.extend(json.loads(requeued))
    return job


def read_jobs(db: Any, ended_since: float | None = None,
              submitted_until: float | None = None, utilisation: bool = True,
              users: Iterable[str] | None = None) -> list[JobHistory]:
    """The jobs accounting needs: every ended job that ended at or after ``ended_since`` and
    was submitted by ``submitted_until`` (from the table; rows missing from it derived now),
    plus every job not ended yet. ``users``: only their jobs."""
    where, args = [], []
    if ended_since is not None:
        where.append("end_time >= ?")
        args.append(ended_since)
    if submitted_until is not None:
        where.append("submit_time <= ?")
        args.append(submitted_until)
    sql = f"SELECT {_COLUMNS} FROM accounting"
    if where:
        sql += " WHERE " + " AND ".join(where)
    try:
        jobs = [_from_row(row) for row in db.execute(sql, args).fetchall()]
        ended = db.execute(
            f"SELECT COUNT(*) FROM jobs WHERE state IN ({','.join('?' * len(ENDED))})",
            ENDED).fetchone()[0]
        if ended != db.execute("SELECT COUNT(*) FROM accounting").fetchone()[0]:
            missing = [r[0] for r in db.execute(_MISSING, ENDED).fetchall()]
        else:
            missing = []
    except Exception as exc:
        if "accounting" not in str(exc):
            raise
        jobs = []  # a journal the table was never created in: derive everything
        missing = [r[0] for r in db.execute(
            f"SELECT id FROM jobs WHERE state IN ({','.join('?' * len(ENDED))})",
            ENDED).fetchall()]
    if missing:
        derived = read_history(db, ids=missing, states=ENDED, utilisation=False).jobs
        jobs += [j for j in derived
                 if (ended_since is None or (j.end is not None and j.end >= ended_since))
                 and (submitted_until is None or j.submit <= submitted_until)]
    live = read_history(db, states=ACTIVE, submitted_until=submitted_until,
                        utilisation=False).jobs
    jobs += live
    if users is not None:
        wanted = set(users)
        jobs = [j for j in jobs if j.user in wanted]
    if any(j.gpu_model is None and j.gpus for j in jobs):
        _fill_models(db, jobs)
    if utilisation:
        attach_utilisation(db, jobs)
    return jobs


def _fill_models(db: Any, jobs: list[JobHistory]) -> None:
    """A job that asked for no GPU model ran on its nodes' (single-run rows keep no nodes:
    the table stores the model read at derivation time, so this only fills live ones)."""
    nodes = read_nodes(db)
    for job in jobs:
        if job.gpu_model is None and job.runs and job.runs[-1].nodes:
            for node in job.runs[-1].nodes:
                view = nodes.get(node)
                if view is not None and view.gpu_model:
                    job.gpu_model = view.gpu_model
                    break
