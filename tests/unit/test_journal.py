"""masterd.journal.journal.Journal and its writer process, on a real SQLite file: acknowledged means
committed, group commit, issue order across calls, one bad row sinks only itself, errors reach
their callers, a dead writer fails what was in flight and is replaced, close drains, and the
writer never outlives its master."""

from __future__ import annotations

import asyncio
import fcntl
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

import masterd.journal.journal
from masterd.journal.journal import Journal, JournalClosed
from masterd.journal.store import Store, StoreError
from shared.model import Job, JobSpec, JobState
from tests.unit.helpers import wait_for, wait_for_async, writer_fails, writer_sleep

SPEC = JobSpec(name="j", command=("true",), user="nobody", gpus=1, cpus=1)
ROOT = Path(__file__).resolve().parents[2]


def job(job_id: str) -> Job:
    return Job(id=job_id, spec=SPEC, submit_time=1.0)


def committed_ids(where: Path | str) -> set[str]:
    """What another connection sees: only committed rows (a SQLite file or a database URL)."""
    if isinstance(where, str) and where.startswith("postgresql://"):
        import psycopg

        with psycopg.connect(where) as conn:
            return {row[0] for row in conn.execute("SELECT id FROM jobs")}
    db = sqlite3.connect(where)
    try:
        return {row[0] for row in db.execute("SELECT id FROM jobs")}
    finally:
        db.close()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purposes (its parent has not reaped it yet).
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[Journal]:
    j = Journal(Store(tmp_path / "master.db"))
    try:
        yield j
    finally:
        j.close()


@pytest.fixture
def any_journal(store_factory) -> Iterator[Journal]:  # type: ignore[no-untyped-def]
    """A journal on either backend (SQLite, PostgreSQL): the contract both keep."""
    j = Journal(store_factory())
    try:
        yield j
    finally:
        j.close()


async def test_a_submission_is_committed_when_its_await_returns(any_journal: Journal) -> None:
    await any_journal.submit(1, job("a"))
    assert committed_ids(any_journal.store.location) == {"a"}


async def test_concurrent_submissions_share_transactions(any_journal: Journal) -> None:
    journal = any_journal
    await asyncio.gather(*(journal.submit(i, job(f"j{i}")) for i in range(200)))
    assert committed_ids(journal.store.location) == {f"j{i}" for i in range(200)}
    assert 1 <= journal.commits < 200, "every submission paid for its own transaction"


async def test_calls_keep_issue_order_with_writes(any_journal: Journal) -> None:
    journal = any_journal
    first = asyncio.ensure_future(journal.submit(1, job("before")))
    seen = asyncio.ensure_future(journal.call(Store.job_exists, "before"))
    not_yet = asyncio.ensure_future(journal.call(Store.job_exists, "after"))
    second = asyncio.ensure_future(journal.submit(2, job("after")))
    await asyncio.gather(first, second)
    assert await seen is True
    assert await not_yet is False


async def test_one_duplicate_fails_alone_with_the_sqlite_error(any_journal: Journal) -> None:
    journal = any_journal
    await journal.submit(1, job("taken"))
    results = await asyncio.gather(
        journal.submit(2, job("fresh-1")), journal.submit(3, job("taken")),
        journal.submit(4, job("fresh-2")), return_exceptions=True)
    assert results[0] is None and results[2] is None
    # The master tells a duplicate id from other failures by this type.
    assert isinstance(results[1], sqlite3.IntegrityError)
    assert committed_ids(journal.store.location) == {"taken", "fresh-1", "fresh-2"}


async def test_updates_are_committed_and_failures_reach_their_callers(journal: Journal) -> None:
    j = job("u")
    await journal.submit(1, j)
    j.state = JobState.RUNNING
    await journal.update([j], [(2.0, "u", "n1", "started", {})])
    assert journal.store.load_jobs()[0].state is JobState.RUNNING

    journal.store.db.execute(
        "CREATE TRIGGER trellis_test_refuse BEFORE UPDATE ON jobs WHEN NEW.id = 'u' "
        "BEGIN SELECT RAISE(ABORT, 'refused by the test'); END")
    j.state = JobState.FINISHED
    with pytest.raises(sqlite3.IntegrityError, match="refused by the test"):
        await journal.update([j], [(3.0, "u", "n1", "finished", {})])
    assert journal.store.load_jobs()[0].state is JobState.RUNNING  # rolled back, events too
    assert [e.kind for e in journal.store.events("u")] == ["submitted", "started"]


async def test_call_errors_propagate_and_the_writer_keeps_serving(journal: Journal) -> None:
    with pytest.raises(ValueError, match="no such thing"):
        await journal.call(writer_fails, "no such thing")
    with pytest.raises(TypeError, match="cannot be sent to the writer"):
        await journal.call(lambda store: 42)  # not importable by name: refused here, alone
    await journal.submit(1, job("after-errors"))
    assert await journal.call(Store.job_exists, "after-errors") is True


async def test_a_call_the_writer_cannot_import_fails_alone(
        journal: Journal, monkeypatch: pytest.MonkeyPatch) -> None:
    """A function only this process has (like one defined in __main__) pickles here but not
    there: its caller gets the error, the submissions sent beside it are committed."""
    module = types.ModuleType("trellis_test_parent_only")
    exec("def count(store):\n    return 1\n", module.__dict__)
    monkeypatch.setitem(sys.modules, module.__name__, module)
    results = await asyncio.gather(
        journal.submit(1, job("beside-1")), journal.call(module.count),
        journal.submit(2, job("beside-2")), return_exceptions=True)
    assert results[0] is None and results[2] is None
    assert isinstance(results[1], ModuleNotFoundError)
    assert committed_ids(journal.store.path) == {"beside-1", "beside-2"}
    assert await journal.call(Store.job_exists, "beside-2") is True


async def test_a_dead_writer_fails_what_was_in_flight_and_is_replaced(journal: Journal,
                                                                      tmp_path: Path) -> None:
    await journal.submit(1, job("before"))
    writer = journal._writer
    assert writer is not None
    started = tmp_path / "writer-busy"
    busy = asyncio.ensure_future(journal.call(writer_sleep, 5, str(started)))
    # Issued in the same turn as the call, so sent to the writer in the same frame.
    queued = asyncio.ensure_future(journal.submit(2, job("in-flight")))
    await wait_for_async(started.exists, what="the writer to be inside the blocking call")
    os.kill(writer.proc.pid, signal.SIGKILL)
    for fut in (busy, queued):
        with pytest.raises(StoreError, match="journal writer failed"):
            await asyncio.wait_for(fut, timeout=10)
    # The next operation starts a new writer; nothing acknowledged was lost.
    await asyncio.wait_for(journal.submit(3, job("after")), timeout=10)
    assert journal._writer is not None and journal._writer.proc.pid != writer.proc.pid
    assert committed_ids(journal.store.path) == {"before", "after"}


async def test_close_finishes_queued_writes_and_refuses_new_ones(tmp_path: Path) -> None:
    j = Journal(Store(tmp_path / "master.db"))
    busy = asyncio.ensure_future(j.call(writer_sleep, 0.3))  # writes pile up behind it
    pending = [asyncio.ensure_future(j.submit(i, job(f"q{i}"))) for i in range(2000)]
    await asyncio.sleep(0)  # let every operation reach the queue
    j.close()
    assert committed_ids(tmp_path / "master.db") == {f"q{i}" for i in range(2000)}
    await asyncio.gather(busy, *pending)  # every one acknowledged
    with pytest.raises(JournalClosed):
        await j.submit(99, job("late"))


def test_a_second_writer_waits_for_the_first(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A writer left over from a master that died holds the store's lock: the next master
    does not write beside it, and says why it cannot start."""
    monkeypatch.setattr(masterd.journal.journal, "READY_TIMEOUT_S", 1.0)
    store = Store(tmp_path / "master.db")
    with open(tmp_path / "master.db.writer", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(StoreError, match="did not start within 1 s"):
            Journal(store)
    Journal(store).close()  # lock released: starts


def test_the_writer_dies_with_a_killed_master(tmp_path: Path) -> None:
    """Even in the middle of a transaction: the writer must not commit behind the back of
    the master restarted after it (the end of input alone would wait for the call)."""
    started = tmp_path / "writer-busy"
    script = textwrap.dedent(f"""
        import asyncio, sys
        sys.path.insert(0, {str(ROOT)!r})
        from pathlib import Path
        from masterd.journal.journal import Journal
        from masterd.journal.store import Store
        from tests.unit.helpers import writer_sleep
        async def main():
            j = Journal(Store(Path({str(tmp_path / "master.db")!r})))
            busy = asyncio.ensure_future(j.call(writer_sleep, 60, {str(started)!r}))
            print(j._writer.proc.pid, flush=True)
            await busy
        asyncio.run(main())
    """)
    master = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert master.stdout is not None
        writer = int(master.stdout.readline())
        wait_for(started.exists, what="the writer to be inside the blocking call")
        assert alive(writer)
        master.kill()
        master.wait()
        wait_for(lambda: not alive(writer), timeout=5, interval=0.05,
                 what="the writer to die with its master")
    finally:
        master.kill()
        master.wait()
