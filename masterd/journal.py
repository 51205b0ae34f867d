"""Async front of the store: one thread, ordered writes, group commit for submissions."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable
from typing import Any, TypeVar

from masterd.store import NewJobRows, Store, new_job_rows, update_rows
from masterd.wire import WireCache
from shared.model import Job

T = TypeVar("T")


class Journal:
    """Runs every store call on one thread, in issue order.

    Submissions are batched: while one commit is on disk, newly arriving submissions wait in a
    list and all go into the next transaction, so N concurrent submitters cost about one fsync
    rather than N.
    """

    def __init__(self, store: Store) -> None:
        self.store = store
        # Encoded specs and placements, shared with the node commands (see masterd.wire).
        self.wire = WireCache()
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="store")
        self._pending: list[tuple[NewJobRows, asyncio.Future[None]]] = []
        self._flushing = False
        self._flusher: asyncio.Task[None] | None = None
        self._updates: list[tuple[list[tuple[Any, ...]], list[tuple[Any, ...]],
                                  asyncio.Future[None]]] = []
        self._updating = False
        self._updater: asyncio.Task[None] | None = None

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, fn, *args)

    async def submit(self, seq: int, job: Job) -> None:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        # Encode here, on the loop thread, so the store thread runs only sqlite's C code.
        self._pending.append((new_job_rows(seq, job, self.wire.spec(job)), fut))
        if not self._flushing:
            self._flushing = True
            self._flusher = loop.create_task(self._flush())
        await fut

    async def update(self, jobs: list[Job], events: list[tuple]) -> None:
        """Persist job state changes and events; concurrent callers share one commit.

        Without this every state change cost an fsync of its own, and under load (hundreds
        of jobs a second churning through placed/running/finished) the single store thread
        fell seconds behind, delaying every RPC that waited on it.
        """
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        job_rows, event_rows = update_rows(jobs, events, self.wire.placement)
        self._updates.append((job_rows, event_rows, fut))
        if not self._updating:
            self._updating = True
            self._updater = loop.create_task(self._flush_updates())
        await fut

    async def _flush_updates(self) -> None:
        try:
            while self._updates:
                batch, self._updates = self._updates, []
                job_rows = [r for rows, _, _ in batch for r in rows]
                event_rows = [r for _, rows, _ in batch for r in rows]
                try:
                    await self.call(self.store.apply_updates, job_rows, event_rows)
                except Exception as exc:
                    for _, _, fut in batch:
                        if not fut.done():
                            fut.set_exception(exc)
                    continue
                for _, _, fut in batch:
                    if not fut.done():
                        fut.set_result(None)
        finally:
            self._updating = False

    async def _flush(self) -> None:
        try:
            while self._pending:
                batch, self._pending = self._pending, []
                try:
                    await self.call(self.store.insert_rows, [rows for rows, _ in batch])
                except Exception:
                    # One bad row must not sink its neighbours: retry one by one to find it.
                    for rows, fut in batch:
                        try:
                            await self.call(self.store.insert_rows, [rows])
                        except Exception as exc:
                            if not fut.done():
                                fut.set_exception(exc)
                        else:
                            if not fut.done():
                                fut.set_result(None)
                    continue
                for _, fut in batch:
                    if not fut.done():
                        fut.set_result(None)
        finally:
            self._flushing = False

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self.store.close()
