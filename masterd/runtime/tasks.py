"""Supervised background tasks: every coroutine the master or a feature runs in the
background is owned here, its failure logged, and all of them cancelled at shutdown.

A task that nobody holds a reference to can be garbage-collected mid-flight, and one whose
exception nobody reads fails silently; both were real bugs before the master kept a set.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import Any

log = logging.getLogger("trellis.master.tasks")


class TaskSupervisor:
    def __init__(self) -> None:
        self._tasks: set[asyncio.Future[Any]] = set()
        self._closed = False

    def spawn(self, awaitable: Awaitable[Any], name: str | None = None) -> asyncio.Future[Any]:
        """Run a coroutine, or follow a future (a journal operation), in the background."""
        task = asyncio.ensure_future(awaitable)
        if name is not None and isinstance(task, asyncio.Task):
            task.set_name(name)
        if self._closed:  # shutting down: nothing new may start
            task.cancel()
            return task
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def every(self, interval_s: float, fn: Callable[[], Any], name: str) -> asyncio.Future[Any]:
        """Call ``fn`` (plain or async) every ``interval_s`` seconds until shutdown; a call
        that fails is logged and the next one still happens."""
        if interval_s <= 0:
            raise ValueError(f"{name}: interval must be positive, got {interval_s!r}")

        async def loop() -> None:
            while True:
                await asyncio.sleep(interval_s)
                try:
                    result = fn()
                    if inspect.isawaitable(result):
                        await result
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("periodic task %s failed; it runs again in %.0f s", name,
                                  interval_s)

        return self.spawn(loop(), name)

    def _done(self, task: asyncio.Future[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("background task failed", exc_info=task.exception())

    def __len__(self) -> int:
        return len(self._tasks)

    async def close(self) -> None:
        """Cancel every task and wait for them to finish."""
        self._closed = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
