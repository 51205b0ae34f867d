"""masterd.journal.Journal on a real SQLite file: acknowledged means committed, group commit,
issue order across calls, one bad row sinks only itself, and no caller is ever left hanging."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from masterd.journal import Journal, JournalClosed
from masterd.store import Store
from shared.model import Job, JobSpec, JobState

SPEC = JobSpec(name="j", command=("true",), user="nobody", gpus=1, cpus=1)


def job(job_id: str) -> Job:
    return Job(id=job_id, spec=SPEC, submit_time=1.0)


def committed_ids(path: Path) -> set[str]:
    """What another connection sees: only committed rows."""
    db = sqlite3.connect(path)
    try:
        return {row[0] for row in db.execute("SELECT id FROM jobs")}
    finally:
        db.close()


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[Journal]:
    j = Journal(Store(tmp_path / "master.db"))
    try:
        yield j
    finally:
        j.close()


async def test_a_submission_is_committed_when_its_await_returns(journal: Journal) -> None:
    await journal.submit(1, job("a"))
    assert committed_ids(journal.store.path) == {"a"}


async def test_concurrent_submissions_share_transactions(journal: Journal,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    batches: list[int] = []
    insert_rows = journal.store.insert_rows

    def counting(rows):  # type: ignore[no-untyped-def]
        batches.append(len(rows))
        insert_rows(rows)

    monkeypatch.setattr(journal.store, "insert_rows", counting)
    await asyncio.gather(*(journal.submit(i, job(f"j{i}")) for i in range(200)))
    assert sum(batches) == 200
    assert len(batches) < 200, "every submission paid for its own transaction"
    assert committed_ids(journal.store.path) == {f"j{i}" for i in range(200)}


async def test_calls_keep_issue_order_with_writes(journal: Journal) -> None:
    first = asyncio.ensure_future(journal.submit(1, job("before")))
    seen = asyncio.ensure_future(journal.call(journal.store.job_exists, "before"))
    not_yet = asyncio.ensure_future(journal.call(journal.store.job_exists, "after"))
    second = asyncio.ensure_future(journal.submit(2, job("after")))
    await asyncio.gather(first, second)
    assert await seen is True
    assert await not_yet is False


async def test_one_duplicate_fails_alone(journal: Journal) -> None:
    await journal.submit(1, job("taken"))
    results = await asyncio.gather(
        journal.submit(2, job("fresh-1")), journal.submit(3, job("taken")),
        journal.submit(4, job("fresh-2")), return_exceptions=True)
    assert results[0] is None and results[2] is None
    assert isinstance(results[1], Exception)
    assert committed_ids(journal.store.path) == {"taken", "fresh-1", "fresh-2"}


async def test_updates_are_committed_and_failures_reach_their_callers(
        journal: Journal, monkeypatch: pytest.MonkeyPatch) -> None:
    j = job("u")
    await journal.submit(1, j)
    j.state = JobState.RUNNING
    await journal.update([j], [(2.0, "u", "n1", "started", {})])
    assert journal.store.load_jobs()[0].state is JobState.RUNNING

    def broken(*_: object) -> None:
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(journal.store, "apply_updates", broken)
    with pytest.raises(sqlite3.OperationalError):
        await journal.update([j], [])


async def test_call_errors_propagate(journal: Journal) -> None:
    def fails() -> None:
        raise ValueError("no such thing")

    with pytest.raises(ValueError, match="no such thing"):
        await journal.call(fails)
    assert await journal.call(lambda: 42) == 42  # the thread still serves


async def test_an_unexpected_failure_fails_callers_instead_of_hanging(
        journal: Journal, monkeypatch: pytest.MonkeyPatch) -> None:
    def explode(items: object) -> None:
        raise RuntimeError("bug in batching")

    monkeypatch.setattr(journal, "_process", explode)
    with pytest.raises(RuntimeError, match="bug in batching"):
        await asyncio.wait_for(journal.submit(1, job("x")), timeout=5)
    monkeypatch.undo()
    await asyncio.wait_for(journal.submit(2, job("y")), timeout=5)  # still alive
    assert committed_ids(journal.store.path) == {"y"}


async def test_close_finishes_queued_writes_and_refuses_new_ones(tmp_path: Path) -> None:
    j = Journal(Store(tmp_path / "master.db"))
    pending = [asyncio.ensure_future(j.submit(i, job(f"q{i}"))) for i in range(20)]
    await asyncio.sleep(0)  # let every submission reach the queue
    j.close()
    assert committed_ids(tmp_path / "master.db") == {f"q{i}" for i in range(20)}
    await asyncio.gather(*pending)  # their acknowledgements arrive after the commit
    with pytest.raises(JournalClosed):
        await j.submit(99, job("late"))
