"""Batched SQL in masterd.journal.store: power-of-two slices, multi-row INSERT, UPDATE ... FROM
(and its executemany fallback for SQLite before 3.33), on a real SQLite file."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from masterd.journal import store as store_module
from masterd.journal.store import (
    Store,
    _slices,
    insert_many,
    new_job_rows,
    update_jobs_many,
    update_rows,
)
from shared.model import Job, JobState, NodeAllocation, Placement
from tests.unit.helpers import job

JOBS_INSERT = "INSERT INTO jobs (id, seq, spec, state, submit_time, data)"
EVENTS_INSERT = "INSERT INTO events (time, job_id, node, kind, detail, job_seq)"


@pytest.fixture(params=[True, False], ids=["update-from", "executemany"])
def update_from(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """Both update branches: UPDATE ... FROM, and the fallback for SQLite before 3.33."""
    monkeypatch.setattr(store_module, "_UPDATE_FROM", request.param)
    return bool(request.param)


def _table(db: sqlite3.Connection, name: str) -> list[tuple[Any, ...]]:
    return [tuple(r) for r in db.execute(f"SELECT * FROM {name} ORDER BY rowid")]


@pytest.mark.parametrize("n", [*range(0, 70), 127, 128, 129, 255, 256, 257, 511, 512, 513, 600,
                               1000, 1025])
def test_slices_cover_every_row_in_order_in_as_few_statements_as_fit(n: int) -> None:
    rows = [(i,) for i in range(n)]
    parts = list(_slices(rows))
    assert [r for part in parts for r in part] == rows
    assert len(parts) == -(-n // 256)  # one statement per 256 rows, no more
    assert all(len(part) == 256 for part in parts[:-1])


def test_slices_of_600_rows() -> None:
    assert [len(p) for p in _slices([(i,) for i in range(600)])] == [256, 256, 88]


def test_slices_honour_a_smaller_cap() -> None:
    assert [len(p) for p in _slices([(i,) for i in range(10)], 4)] == [4, 4, 2]


@pytest.mark.parametrize("n", [0, 1, 3, 257, 600])
def test_insert_many_writes_exactly_the_rows(tmp_path: Path, n: int) -> None:
    db = sqlite3.connect(tmp_path / "t.db", isolation_level=None)
    try:
        db.execute("CREATE TABLE t (a INTEGER, b TEXT, c BLOB, d REAL)")
        db.execute("INSERT INTO t VALUES (-1, 'before', NULL, 0.0)")
        rows = [(i, f"row{i}", bytes([i % 256]) * 3, i / 7) for i in range(n)]
        insert_many(db, "INSERT INTO t (a, b, c, d)", rows)
        assert _table(db, "t") == [(-1, "before", None, 0.0), *rows]
    finally:
        db.close()


def _jobs_table(path: Path, ids: list[str]) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None)
    db.executescript(store_module.SCHEMA)
    insert_many(db, JOBS_INSERT, [(i, n, b"spec", "queued", float(n), b"d0")
                                  for n, i in enumerate(ids)])
    return db


def _states(db: sqlite3.Connection) -> dict[str, tuple[str, bytes]]:
    return {r[0]: (r[1], r[2]) for r in db.execute("SELECT id, state, data FROM jobs")}


def test_update_keeps_the_last_row_of_a_job(tmp_path: Path, update_from: bool) -> None:
    db = _jobs_table(tmp_path / "t.db", ["a", "b", "c"])
    try:
        update_jobs_many(db, [("running", b"r", "a"), ("starting", b"s", "b"),
                              ("finished", b"f", "a")])
        assert _states(db) == {"a": ("finished", b"f"), "b": ("starting", b"s"),
                               "c": ("queued", b"d0")}
        update_jobs_many(db, [])
        assert _states(db)["a"] == ("finished", b"f")
    finally:
        db.close()


def test_update_across_slices(tmp_path: Path, update_from: bool) -> None:
    ids = [f"j{i}" for i in range(700)]
    db = _jobs_table(tmp_path / "t.db", ids)
    try:
        # 600 distinct jobs (several slices), 100 of them twice: the second row must win
        # even when the first is in another slice.
        rows = [("running", f"r{i}".encode(), f"j{i}") for i in range(600)]
        rows += [("finished", f"f{i}".encode(), f"j{i}") for i in range(0, 600, 6)]
        rows.append(("failed", b"ghost", "nope"))  # an unknown job updates nothing
        update_jobs_many(db, rows)
        expected = {i: ("queued", b"d0") for i in ids}
        for state, data, job_id in rows:
            if job_id in expected:
                expected[job_id] = (state, data)
        assert _states(db) == expected
        assert expected["j0"] == ("finished", b"f0") and expected["j1"] == ("running", b"r1")
    finally:
        db.close()


def test_both_update_branches_reach_the_same_state(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ids = [f"j{i}" for i in range(300)]
    rows = [("running", f"r{i}".encode(), f"j{(i * 7) % 300}") for i in range(450)]
    ends = []
    for flag in (True, False):
        monkeypatch.setattr(store_module, "_UPDATE_FROM", flag)
        db = _jobs_table(tmp_path / f"{flag}.db", ids)
        try:
            update_jobs_many(db, rows)
            ends.append(_table(db, "jobs"))
        finally:
            db.close()
    assert ends[0] == ends[1]


# -- Store end to end --------------------------------------------------------------------

def _reference_insert(db: sqlite3.Connection, jobs: list[tuple[int, Job]]) -> None:
    """What Store.insert_rows did before batching: one step per row."""
    rows = [new_job_rows(seq, j) for seq, j in jobs]
    db.executemany(f"{JOBS_INSERT} VALUES (?, ?, ?, ?, ?, ?)", [r.job for r in rows])
    db.executemany(f"{EVENTS_INSERT} VALUES (?,?,?,?,?,?)", [r.event for r in rows])


def _reference_update(db: sqlite3.Connection, job_rows: list[tuple[Any, ...]],
                      event_rows: list[tuple[Any, ...]]) -> None:
    """What Store.apply_updates did before batching."""
    db.executemany("UPDATE jobs SET state=?, data=? WHERE id=?", job_rows)
    db.executemany(f"{EVENTS_INSERT} VALUES (?,?,?,?,?,(SELECT seq FROM jobs WHERE id=?))",
                   [(*row, row[1]) for row in event_rows])


def _batches(jobs: list[Job]) -> list[tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]]:
    """Two callers' worth of updates, as the journal hands them over: some jobs placed and
    running, then a few of the same jobs finished, in one apply_updates call."""
    running, finished = [], []
    events: list[tuple[Any, ...]] = []
    for n, j in enumerate(jobs[:300]):
        j.state = JobState.RUNNING
        j.placement = Placement((NodeAllocation(f"n{n % 5}", (n % 8,), (n % 16,), 64),))
        j.start_time = 10.0 + n
        j.node_states = {f"n{n % 5}": "running"}
        running.append(j)
        events.append((10.0 + n, j.id, f"n{n % 5}", "running", {"attempt": 1}))
    first = update_rows(running, events)
    # Encoded now: the jobs change again below, like Job objects on the event loop do.
    for j in jobs[:300:7]:
        j.state = JobState.FINISHED
        j.end_time = 500.0
        j.exit_code = 0
        finished.append(j)
    second = update_rows(finished, [(500.0, j.id, None, "finished", {"code": 0})
                                    for j in finished])
    return [first, second]


def test_store_batches_match_the_row_by_row_journal(tmp_path: Path, update_from: bool) -> None:
    made = [(n + 1, job(f"job{n}", gpus=1 + n % 4, t=float(n))) for n in range(400)]
    store = Store(tmp_path / "batched" / "m.db")
    reference = Store(tmp_path / "reference" / "m.db")
    try:
        store.insert_rows([new_job_rows(seq, j) for seq, j in made])
        reference.transaction(_reference_insert, reference.db, made)
        assert _table(store.db, "jobs") == _table(reference.db, "jobs")

        batches = _batches([j for _, j in made])
        job_rows = [r for rows, _ in batches for r in rows]
        event_rows = [r for _, rows in batches for r in rows]
        store.apply_updates(job_rows, event_rows)
        reference.transaction(_reference_update, reference.db, job_rows, event_rows)

        assert _table(store.db, "jobs") == _table(reference.db, "jobs")
        assert _table(store.db, "events") == _table(reference.db, "events")
        # Every event about a job carries that job's seq.
        assert store.db.execute("SELECT COUNT(*) FROM events JOIN jobs ON jobs.id = "
                                "events.job_id WHERE events.job_seq = jobs.seq").fetchone()[0] \
            == 400 + 300 + len(range(0, 300, 7))
        loaded = store.load_jobs()
        assert loaded == [j for _, j in made]
        assert loaded == reference.load_jobs()
        assert loaded[0].state is JobState.FINISHED and loaded[1].state is JobState.RUNNING
        assert loaded[350].state is JobState.QUEUED
        assert [e.kind for e in store.events("job0")] == ["submitted", "running", "finished"]
        assert json.loads(json.dumps(store.events("job1")[-1].detail)) == {"attempt": 1}
        assert len(store.events(limit=10_000)) == 400 + 300 + len(range(0, 300, 7))
    finally:
        store.close()
        reference.close()


def test_a_batch_with_a_duplicate_id_records_nothing(tmp_path: Path) -> None:
    store = Store(tmp_path / "m.db")
    try:
        store.insert_rows([new_job_rows(1, job("keep"))])
        rows = [new_job_rows(n + 2, job(f"j{n}")) for n in range(300)]
        rows.append(new_job_rows(999, job("keep")))
        with pytest.raises(Exception, match="UNIQUE"):
            store.insert_rows(rows)
        assert [j.id for j in store.load_jobs()] == ["keep"]
        assert len(store.events(limit=10_000)) == 1
    finally:
        store.close()


def test_batches_fit_the_variable_limit_of_sqlite_before_3_32(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SQLite before 3.32 allows at most 999 bound variables per statement by default: the
    store's own fallback (SQLite < 3.33) exists for such versions, so a batch must work there.

    A 256-row slice binds 256 x 6 = 1,536 variables for jobs and 1,280 for events, so on such
    an SQLite a group commit of 167 or more submissions (200 or more events) fails outright.
    """
    monkeypatch.setattr(store_module, "_UPDATE_FROM", False)
    store = Store(tmp_path / "m.db")
    try:
        store.db.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 999)
        jobs = [job(f"j{n}") for n in range(300)]
        store.insert_rows([new_job_rows(n + 1, j) for n, j in enumerate(jobs)])
        for j in jobs:
            j.state = JobState.FAILED
        store.apply_updates(*update_rows(jobs, [(1.0, j.id, None, "failed", {}) for j in jobs]))
        assert [j.state for j in store.load_jobs()] == [JobState.FAILED] * 300
    finally:
        store.close()
