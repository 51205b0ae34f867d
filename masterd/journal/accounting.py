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

from masterd.core.accounting import END_STATES, Aggregate, Fact, JobHistory, Run, fact_of
from masterd.journal.history import (
    attach_utilisation,
    read_history,
    read_nodes,
    utilisation_map,
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
    requeued_at TEXT,
    gpu_util REAL
);
CREATE INDEX IF NOT EXISTS accounting_end ON accounting(end_time);
"""

ENDED = tuple(s.value for s in JobState if s.terminal)
ACTIVE = tuple(s.value for s in JobState if not s.terminal)
_COLUMNS = ("job_id, job_seq, account, username, kind, gpu_model, gpus, cpus, memory_mib, "
            "submit_time, end_time, state, run_start, run_end, run_gpus, run_cpus, "
            "run_memory_mib, runs, requeued_at, gpu_util")
_MISSING = (f"SELECT id, seq FROM jobs WHERE state IN ({','.join('?' * len(ENDED))}) "
            "AND NOT EXISTS (SELECT 1 FROM accounting a WHERE a.job_id = jobs.id)")


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
            json.dumps(job.requeued_at) if job.requeued_at else None, job.gpu_util)


def _insert(store: Store, ids: list[str]) -> int:
    """Derive and insert the rows of these ended jobs (those already there are kept)."""
    if not ids:
        return 0
    history = read_history(store.db, ids=ids, states=ENDED)
    seqs: dict[str, int] = {}
    for start in range(0, len(ids), 500):
        part = ids[start:start + 500]
        seqs.update(store.db.execute(
            f"SELECT id, seq FROM jobs WHERE id IN ({','.join('?' * len(part))})",
            part).fetchall())
    rows = [_row(job, seqs[job.id]) for job in history.jobs]
    store.db.executemany(f"INSERT INTO accounting ({_COLUMNS}) VALUES "
                         f"({','.join('?' * 20)}) ON CONFLICT (job_id) DO NOTHING", rows)
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


def refresh_utilisation(store: Store, job_id: str) -> None:
    """Journal writer: a job's final usage report came in after its row was written (a
    node's report and its exit race): its utilisation again, from every report so far."""
    util = utilisation_map(store.db, [job_id]).get(job_id)
    if util is not None:
        store.transaction(lambda: store.db.execute(
            "UPDATE accounting SET gpu_util = ? WHERE job_id = ?", (util, job_id)))


def backfill(store: Store, limit: int, after_seq: int = 0) -> tuple[int, int | None]:
    """Journal writer: derive the missing rows of up to ``limit`` ended jobs past job seq
    ``after_seq``; (rows written, the seq to go on after, None when none is left). Walking
    by seq keeps each call's search where the last one stopped."""
    found = store.db.execute(
        f"{_MISSING} AND seq > ? ORDER BY seq LIMIT ?", (*ENDED, after_seq, limit)).fetchall()
    if not found:
        return 0, None
    ids = [r[0] for r in found]
    return store.transaction(_insert, store, ids), int(found[-1][1])


def _from_row(row: Any) -> JobHistory:
    (job_id, _, account, user, kind, gpu_model, gpus, cpus, memory, submit, end, state,
     run_start, run_end, run_gpus, run_cpus, run_memory, runs, requeued, util) = row
    job = JobHistory(id=job_id, account=account, user=user, name="", kind=kind, gpus=gpus,
                     cpus=cpus, memory_mib=memory, gpu_model=gpu_model, submit=submit,
                     state=state, end=end, gpu_util=util)
    if run_start is not None:
        job.runs.append(Run(run_start, run_end, run_gpus, run_cpus, run_memory))
    elif runs:
        job.runs.extend(Run(s, e, g, c, m) for s, e, g, c, m in json.loads(runs))
    if requeued:
        job.requeued_at.extend(json.loads(requeued))
    return job


_FACT_COLUMNS = ("a.job_id, a.account, a.username, a.gpu_model, a.gpus, a.submit_time, "
                 "a.end_time, a.state, a.run_start, a.run_end, a.run_gpus, a.runs, "
                 "a.requeued_at, a.gpu_util")


def _window(ended_since: float | None, submitted_until: float | None
            ) -> tuple[list[str], list[Any]]:
    """The WHERE terms (and their arguments) of a report's window over the table."""
    where: list[str] = []
    args: list[Any] = []
    if ended_since is not None:
        where.append("end_time >= ?")
        args.append(ended_since)
    if submitted_until is not None:
        where.append("submit_time <= ?")
        args.append(submitted_until)
    return where, args


def read_facts(db: Any, ended_since: float | None = None,
               submitted_until: float | None = None,
               users: Iterable[str] | None = None) -> list[Fact]:
    """What a report needs (masterd.core.accounting.Fact) of the same jobs as
    :func:`read_jobs`, read as plain tuples: the table's rows become facts without an object
    per job, which is what keeps a year of journal within seconds."""
    where, args = _window(ended_since, submitted_until)
    wanted = None if users is None else set(users)
    try:
        complete = _complete(db)
    except Exception as exc:
        if "accounting" not in str(exc):
            raise
        complete = False  # never created here: read_jobs derives everything
    if not complete:
        return [fact_of(job) for job in read_jobs(db, ended_since, submitted_until,
                                                   users=wanted)]
    sql = f"SELECT {_FACT_COLUMNS} FROM accounting a"
    if where:
        sql += " WHERE " + " AND ".join(where)
    rows = db.execute(sql, args)
    if wanted is not None:
        rows = (row for row in rows if row[2] in wanted)
    facts = _facts(rows)
    live = read_history(db, states=ACTIVE, submitted_until=submitted_until).jobs
    if wanted is not None:
        live = [j for j in live if j.user in wanted]
    facts += [fact_of(job) for job in live]
    return facts


def _facts(rows: Iterable[Any]) -> list[Fact]:
    """Table rows (``_FACT_COLUMNS``) as facts."""
    facts: list[Fact] = []
    append = facts.append
    loads = json.loads
    for (_, account, user, gpu_model, gpus, submit, end, state, run_start, run_end,
         run_gpus, runs, requeued, util) in rows:
        if run_start is not None:
            job_runs: tuple[Any, ...] = ((run_start, run_end, run_gpus),)
        elif runs:
            job_runs = tuple((r[0], r[1], r[2]) for r in loads(runs))
        else:
            job_runs = ()
        label = gpu_model or ("cpu" if gpus == 0 else "any")  # model_label, inlined
        append((account, user, label, submit, end, state, job_runs,
                tuple(loads(requeued)) if requeued else (), util))
    return facts


def _complete(db: Any) -> bool:
    """Whether every ended job has its row (two counts over indexes)."""
    ended = db.execute(f"SELECT COUNT(*) FROM jobs WHERE state IN "
                       f"({','.join('?' * len(ENDED))})", ENDED).fetchone()[0]
    return bool(ended == db.execute("SELECT COUNT(*) FROM accounting").fetchone()[0])


def read_jobs(db: Any, ended_since: float | None = None,
              submitted_until: float | None = None, utilisation: bool = True,
              users: Iterable[str] | None = None) -> list[JobHistory]:
    """The jobs accounting needs: every ended job that ended at or after ``ended_since`` and
    was submitted by ``submitted_until`` (from the table; rows missing from it derived now),
    plus every job not ended yet. ``users``: only their jobs."""
    where, args = _window(ended_since, submitted_until)
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


# Rows of jobs that ran at most once and were never requeued: the database sums them.
_ONCE = "a.runs IS NULL AND a.requeued_at IS NULL"


def _group_sql(by: str) -> str:
    if by == "account":
        return "a.account"
    if by == "user":
        return "a.username"
    if by == "gpu-model":  # masterd.core.accounting.model_label
        return ("CASE WHEN a.gpu_model IS NOT NULL THEN a.gpu_model WHEN a.gpus = 0 "
                "THEN 'cpu' ELSE 'any' END")
    raise ValueError(f"--by must be one of account, user, gpu-model, got {by!r}")


def report_journal(db: Any, by: str, since: float, until: float,
                   users: Iterable[str] | None = None) -> list[dict[str, Any]]:
    """``masterd.core.accounting.report`` over the journal, the same rows, faster: the jobs
    that ran once (nearly all) are summed by the database from the accounting table, the
    others (requeued, preempted, still running) go through the core's own aggregation job by
    job. A journal whose table is not complete yet is reported the slow way."""
    aggregate = Aggregate(by, since, until)
    group = _group_sql(by)
    wanted = None if users is None else sorted(set(users))
    try:
        complete = _complete(db)
    except Exception as exc:
        if "accounting" not in str(exc):
            raise
        complete = False
    if not complete:
        for fact in read_facts(db, ended_since=since, submitted_until=until, users=wanted):
            aggregate.add(fact)
        return aggregate.rows()
    s, u = repr(float(since)), repr(float(until))  # floats: safe as SQL literals
    user_sql, user_args = "", []
    if wanted is not None:
        user_sql = f" AND a.username IN ({','.join('?' * len(wanted))})"
        user_args = wanted
    window = f"a.submit_time < {u} AND a.end_time >= {s}{user_sql}"
    end_c = f"(CASE WHEN a.run_end IS NULL OR a.run_end > {u} THEN {u} ELSE a.run_end END)"
    start_c = f"(CASE WHEN a.run_start < {s} THEN {s} ELSE a.run_start END)"
    alloc = (f"CASE WHEN a.run_start IS NOT NULL AND {end_c} > {start_c} "
             f"THEN a.run_gpus * ({end_c} - {start_c}) ELSE 0 END")
    running = (f"CASE WHEN a.run_start IS NOT NULL AND a.run_start < {u} AND "
               f"(a.run_end IS NULL OR a.run_end >= {u}) THEN 1 ELSE 0 END")
    sums = (f"SELECT g, SUM(alloc), SUM(alloc * util), SUM(CASE WHEN util IS NULL THEN 0 "
            f"ELSE alloc END), SUM(running) FROM (SELECT {group} AS g, {alloc} AS alloc, "
            f"{running} AS running, a.gpu_util AS util FROM accounting a "
            f"WHERE {_ONCE} AND {window}) AS x GROUP BY g")
    for g, gpu_s, busy_s, measured_s, run_count in db.execute(sums, user_args).fetchall():
        aggregate.add_sums(g, float(gpu_s or 0.0), float(busy_s or 0.0),
                           float(measured_s or 0.0), int(run_count or 0))
    ends = ",".join(f"'{state}'" for state in END_STATES)
    for g, state, count in db.execute(
            f"SELECT {group} AS g, a.state, COUNT(*) FROM accounting a WHERE {_ONCE} AND "
            f"{window} AND a.end_time < {u} AND a.state IN ({ends}) GROUP BY {group}, a.state",
            user_args).fetchall():
        aggregate.add_ended(g, state, int(count))
    waits: dict[str, list[float]] = {}
    for g, wait in db.execute(
            f"SELECT {group}, a.run_start - a.submit_time FROM accounting a WHERE {_ONCE} AND "
            f"{window} AND a.run_start >= {s} AND a.run_start < {u}", user_args):
        found = waits.get(g)
        if found is None:
            found = waits[g] = []
        found.append(wait)
    for g, found in waits.items():
        aggregate.add_waits(g, found)
    # The rest, job by job: runs more than once, requeues, and jobs not ended yet.
    rest = db.execute(f"SELECT {_FACT_COLUMNS} FROM accounting a WHERE NOT ({_ONCE}) AND "
                      f"{window}", user_args).fetchall()
    for fact in _facts(rest):
        aggregate.add(fact)
    for job in read_history(db, states=ACTIVE, submitted_until=until).jobs:
        if wanted is None or job.user in wanted:
            aggregate.add(fact_of(job))
    return aggregate.rows()
