"""Async front of the store: one thread, ordered writes, group commit.

The store thread drives itself: whenever it finishes a transaction it takes everything that
queued up meanwhile and commits it as the next batch, without waiting for the event loop.
An earlier design let the loop start each batch once it had seen the previous one finish;
under load the loop took milliseconds to get round to that, so the disk sat idle between
batches and every submission waited for two or three such round trips.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from masterd.store import NewJobRows, Store, new_job_rows, update_rows
from masterd.wire import WireCache
from shared.model import Job

T = TypeVar("T")

log = logging.getLogger("trellis.master.journal")


@dataclass
class _Insert:
    rows: NewJobRows
    future: asyncio.Future[None]


@dataclass
class _Update:
    job_rows: list[tuple[Any, ...]]
    event_rows: list[tuple[Any, ...]]
    future: asyncio.Future[None]


@dataclass
class _Call:
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    future: asyncio.Future[Any]


@dataclass
class _Outcome:
    """Results for the loop to hand to waiting futures, in one callback per batch."""

    settled: list[tuple[asyncio.Future[Any], Any, BaseException | None]] = field(
        default_factory=list)


class JournalClosed(RuntimeError):
    pass


class Journal:
    """Runs every store call on one thread, in issue order.

    Submissions and job updates are batched: all submissions queued while the thread was busy
    go into one transaction, and all updates into the next, so N concurrent writers cost
    about one fsync rather than N. Other calls (reads, node and service records) run one by
    one where they were issued: work queued after a call waits for it, and vice versa.
    """

    def __init__(self, store: Store) -> None:
        self.store = store
        # Encoded specs and placements, shared with the node commands (see masterd.wire).
        self.wire = WireCache()
        self._queue: deque[_Insert | _Update | _Call] = deque()
        self._wake = threading.Condition()
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="store", daemon=True)
        self._thread.start()

    # -- loop side ------------------------------------------------------------------------
    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        fut: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._put(_Call(fn, args, fut))
        return await fut

    async def submit(self, seq: int, job: Job) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        # Encode here, on the loop thread, so the store thread runs mostly sqlite's C code.
        self._put(_Insert(new_job_rows(seq, job, self.wire.spec(job)), fut))
        await fut

    async def update(self, jobs: list[Job], events: list[tuple]) -> None:
        """Persist job state changes and events; concurrent callers share one commit.

        Without this every state change cost an fsync of its own, and under load (hundreds
        of jobs a second churning through placed/running/finished) the single store thread
        fell seconds behind, delaying every RPC that waited on it.
        """
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        job_rows, event_rows = update_rows(jobs, events, self.wire.placement)
        self._put(_Update(job_rows, event_rows, fut))
        await fut

    def _put(self, item: _Insert | _Update | _Call) -> None:
        with self._wake:
            if self._closing:
                raise JournalClosed("the journal is closed")
            self._queue.append(item)
            self._wake.notify()

    @staticmethod
    def _settle(outcome: _Outcome) -> None:
        for fut, result, exc in outcome.settled:
            if fut.done():  # the waiter was cancelled; the write happened regardless
                continue
            if exc is not None:
                fut.set_exception(exc)
            else:
                fut.set_result(result)

    def close(self) -> None:
        """Finish every queued write, then close the store."""
        with self._wake:
            self._closing = True
            self._wake.notify()
        self._thread.join()
        self.store.close()

    # -- store thread ---------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._queue and not self._closing:
                    self._wake.wait()
                if not self._queue:
                    return  # closing, and nothing left to write
                items = list(self._queue)
                self._queue.clear()
            try:
                self._process(items)
            except BaseException as exc:  # a bug here must fail its callers, not hang them
                log.exception("journal batch failed unexpectedly")
                self._deliver(_Outcome([(item.future, None, exc) for item in items]))

    def _process(self, items: list[_Insert | _Update | _Call]) -> None:
        # Calls are barriers; between two of them, submissions go first (an update can only
        # be about a job whose submission was already acknowledged), then updates.
        inserts: list[_Insert] = []
        updates: list[_Update] = []
        for item in items:
            if isinstance(item, _Insert):
                inserts.append(item)
            elif isinstance(item, _Update):
                updates.append(item)
            else:
                self._flush(inserts, updates)
                inserts, updates = [], []
                self._deliver(self._one_call(item))
        self._flush(inserts, updates)

    def _flush(self, inserts: list[_Insert], updates: list[_Update]) -> None:
        if inserts:
            self._deliver(self._insert(inserts))
        if updates:
            self._deliver(self._update(updates))

    def _one_call(self, item: _Call) -> _Outcome:
        try:
            result = item.fn(*item.args)
        except BaseException as exc:  # handed to the awaiting coroutine, never lost here
            return _Outcome([(item.future, None, exc)])
        return _Outcome([(item.future, result, None)])

    def _insert(self, batch: list[_Insert]) -> _Outcome:
        try:
            self.store.insert_rows([item.rows for item in batch])
        except Exception:
            # One bad row must not sink its neighbours: retry one by one to find it.
            outcome = _Outcome()
            for item in batch:
                try:
                    self.store.insert_rows([item.rows])
                except Exception as exc:
                    outcome.settled.append((item.future, None, exc))
                else:
                    outcome.settled.append((item.future, None, None))
            return outcome
        return _Outcome([(item.future, None, None) for item in batch])

    def _update(self, batch: list[_Update]) -> _Outcome:
        job_rows = [row for item in batch for row in item.job_rows]
        event_rows = [row for item in batch for row in item.event_rows]
        try:
            self.store.apply_updates(job_rows, event_rows)
        except Exception as exc:
            return _Outcome([(item.future, None, exc) for item in batch])
        return _Outcome([(item.future, None, None) for item in batch])

    def _deliver(self, outcome: _Outcome) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, _Outcome] = {}
        for settled in outcome.settled:  # one loop in a daemon; tests may use several
            by_loop.setdefault(settled[0].get_loop(), _Outcome()).settled.append(settled)
        for loop, part in by_loop.items():
            try:
                loop.call_soon_threadsafe(self._settle, part)
            except RuntimeError:  # the loop is closed: nobody is waiting any more
                log.debug("journal result dropped: the event loop is closed")
