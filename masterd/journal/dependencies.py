"""What job dependencies need from the journal: which jobs make up each array, and the
outcome of jobs the master no longer keeps in memory.

``array_tasks`` maps an array id and index to the task's job id; a task's state is always
read from its row in ``jobs`` (joined), so this table is written once per task, at
submission, and never updated. Rows of a batch are written just after the batch itself; a
master that crashed between the two writes re-inserts them on restore from the tasks it
restores (they are queued, or among the newest ended jobs, by then).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from masterd.journal.store import Store
from shared.model import JobState

SCHEMA = """
CREATE TABLE IF NOT EXISTS array_tasks (
    array_id TEXT NOT NULL,
    idx INTEGER NOT NULL,
    job_id TEXT NOT NULL,
    PRIMARY KEY (array_id, idx)
);
"""


@dataclass
class Looked:
    """What the journal says of some ids: jobs' states, and arrays' tasks as
    ``(index, job id, state)``."""

    jobs: dict[str, JobState] = field(default_factory=dict)
    arrays: dict[str, list[tuple[int, str, JobState]]] = field(default_factory=dict)


def ensure_schema(store: Store) -> None:
    store.db.executescript(SCHEMA)


def add_array_tasks(store: Store, rows: Sequence[tuple[str, int, str]]) -> None:
    """Record array tasks ``(array id, index, job id)``; rows already there are kept (a
    restore re-inserts what a crash may have lost)."""

    def run() -> None:
        store.db.executemany("INSERT INTO array_tasks (array_id, idx, job_id) VALUES (?,?,?) "
                             "ON CONFLICT DO NOTHING", list(rows))

    store.transaction(run)


def look_up(store: Store, job_ids: Sequence[str], array_ids: Sequence[str]) -> Looked:
    """The journalled state of each of ``job_ids`` that is a job, and the tasks of each of
    ``array_ids`` that is an array (ids that are neither are left out)."""
    found = Looked()
    for job_id in dict.fromkeys(job_ids):
        row = store.db.execute("SELECT state FROM jobs WHERE id=?", (job_id,)).fetchone()
        if row is not None:
            found.jobs[job_id] = JobState(row[0])
    for array_id in dict.fromkeys(array_ids):
        rows = store.db.execute(
            "SELECT a.idx, a.job_id, j.state FROM array_tasks a JOIN jobs j ON j.id = a.job_id "
            "WHERE a.array_id = ? ORDER BY a.idx", (array_id,)).fetchall()
        if rows:
            found.arrays[array_id] = [(int(r[0]), str(r[1]), JobState(r[2])) for r in rows]
    return found
