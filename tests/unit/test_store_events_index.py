"""The journal finds a job's events through job_seq: new journals, journals written before
the column existed (migrated on open), and the query plan that makes it an index lookup."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from masterd.journal import store as store_module
from masterd.journal.store import Store, new_job_rows, update_rows
from shared.model import JobState
from tests.unit.helpers import job

# The events table and its index as journals before job_seq had them.
_OLD_EVENTS = """
CREATE TABLE jobs (id TEXT PRIMARY KEY, seq INTEGER NOT NULL, spec BLOB NOT NULL,
                   state TEXT NOT NULL, submit_time REAL NOT NULL, data BLOB NOT NULL);
CREATE TABLE events (seq INTEGER PRIMARY KEY AUTOINCREMENT, time REAL NOT NULL, job_id TEXT,
                     node TEXT, kind TEXT NOT NULL, detail TEXT NOT NULL);
CREATE INDEX events_job ON events(job_id);
"""


def _indexes(db: sqlite3.Connection) -> set[str]:
    return {r[0] for r in db.execute(
        "SELECT name FROM sqlite_master WHERE type='index' AND tbl_name='events'")}


def test_a_journal_from_before_job_seq_is_migrated_on_open(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    old = sqlite3.connect(path)
    old.executescript(_OLD_EVENTS)
    jobs = [job(f"j{n}") for n in range(5)]
    for seq, j in enumerate(jobs, start=10):
        rows = new_job_rows(seq, j)
        old.execute("INSERT INTO jobs VALUES (?,?,?,?,?,?)", rows.job)
        old.execute("INSERT INTO events (time, job_id, node, kind, detail) VALUES (?,?,?,?,?)",
                    rows.event[:5])
    old.execute("INSERT INTO events (time, job_id, node, kind, detail) "
                "VALUES (1.0, NULL, 'n1', 'node_joined', '{}')")
    old.execute("INSERT INTO events (time, job_id, node, kind, detail) "
                "VALUES (2.0, 'j2', 'n1', 'running', '{}')")
    old.commit()
    old.close()

    store = Store(path)
    try:
        assert _indexes(store.db) == {"events_job_seq"}
        assert [e.kind for e in store.events("j2")] == ["submitted", "running"]
        assert [e.kind for e in store.events("j4")] == ["submitted"]
        assert len(store.events()) == 7  # node events are kept, with no job_seq
        seqs = {r[0]: r[1] for r in store.db.execute(
            "SELECT job_id, job_seq FROM events WHERE kind='submitted'")}
        assert seqs == {f"j{n}": 10 + n for n in range(5)}
        # New events after the migration join the old ones.
        jobs[2].state = JobState.FAILED
        store.apply_updates(*update_rows([jobs[2]], [(3.0, "j2", "n1", "failed", {})]))
        assert [e.kind for e in store.events("j2")] == ["submitted", "running", "failed"]
        assert [e.kind for e in store.events_tail("j2", 2)] == ["running", "failed"]
    finally:
        store.close()
    again = Store(path)  # a second open finds nothing left to do
    try:
        assert _indexes(again.db) == {"events_job_seq"}
        assert [e.kind for e in again.events("j2")] == ["submitted", "running", "failed"]
    finally:
        again.close()


def test_a_jobs_events_are_an_index_lookup_not_a_scan(tmp_path: Path) -> None:
    store = Store(tmp_path / "m.db")
    try:
        store.insert_rows([new_job_rows(n + 1, job(f"j{n}")) for n in range(50)])
        plan = " ".join(r[-1] for r in store.db.execute(
            f"EXPLAIN QUERY PLAN SELECT * FROM events WHERE {store_module._OF_JOB} AND seq > ? "
            "ORDER BY seq LIMIT ?", ("j7", "j7", 0, 10)))
        assert "events_job_seq" in plan, plan
        assert [e.job_id for e in store.events("j7")] == ["j7"]
        assert store.events("nope") == []
    finally:
        store.close()


def test_an_event_about_a_job_not_in_the_journal_keeps_no_job_seq(tmp_path: Path) -> None:
    store = Store(tmp_path / "m.db")
    try:
        store.insert_rows([new_job_rows(1, job("known"))])
        store.apply_updates([], [(1.0, "known", "n1", "running", "{}"),
                                 (1.0, "ghost", "n1", "running", "{}")])
        rows = [tuple(r) for r in
                store.db.execute("SELECT job_id, job_seq FROM events ORDER BY seq")]
        assert rows == [("known", 1), ("known", 1), ("ghost", None)]
        assert len(store.events()) == 3
    finally:
        store.close()
