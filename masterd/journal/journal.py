"""Async front of the store: ordered writes and group commit, in a writer process.

Every journal operation goes, in issue order, to one writer process (masterd.journal.writer)
that owns the only writing SQLite connection; see that module for why a process and not a
thread, and for the protocol. Operations issued during one turn of the event loop leave in
one pipe write, and whatever the writer finds in the pipe when a transaction ends becomes
its next one, so N concurrent submissions cost about one fsync rather than N.

The writer's answers are read by the event loop itself (``add_reader``), which settles each
waiting future directly: no thread hands results across, so none waits for the loop to let go
of the GIL. If the writer dies, every operation in flight fails with a StoreError (which the
RPCs report as ``store_unavailable``: the caller was never told it was recorded) and the next
operation starts a new writer.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import pickle
import select
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import masterd
from masterd.journal.store import Store, StoreError, new_job_rows, update_rows
from masterd.journal.wire import WireCache
from masterd.journal.writer import STORE_ENV, FrameReader, frame_header
from shared.model import Job

T = TypeVar("T")

log = logging.getLogger("trellis.master.journal")

READY_TIMEOUT_S = 60.0  # a writer left over from a master that died holds the lock this long
_PICKLE = pickle.HIGHEST_PROTOCOL


class JournalClosed(RuntimeError):
    pass


class _WriterProcess:
    """One running writer and the master's ends of its two pipes."""

    def __init__(self, store: Store) -> None:
        to_child_r, self.to_child = os.pipe()
        self.from_child, from_child_w = os.pipe()
        env = dict(os.environ)
        where = ["--db", store.location]
        if store.backend != "sqlite":
            # A database URL may hold a password: in the environment (readable by this user
            # only), not on the command line (readable by everyone in ps).
            env[STORE_ENV] = store.location
            where = ["--store-env", STORE_ENV]
        if store.epoch is not None:
            where += ["--epoch", str(store.epoch)]
        # The writer imports masterd the way this process did, installed or from a checkout.
        package_root = str(Path(masterd.__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (package_root, env.get("PYTHONPATH", "")) if p)
        level = logging.getLevelName(logging.getLogger().getEffectiveLevel()).lower()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "masterd.journal.writer", *where,
                 "--in-fd", str(to_child_r), "--out-fd", str(from_child_w),
                 "--parent", str(os.getpid()), "--log-level", level],
                pass_fds=(to_child_r, from_child_w), stdin=subprocess.DEVNULL, env=env)
        except OSError as exc:
            os.close(self.to_child)
            os.close(self.from_child)
            raise StoreError(f"cannot start the journal writer: {exc}") from exc
        finally:  # the writer's ends: it has its own copies now (or never will)
            os.close(to_child_r)
            os.close(from_child_w)
        self.reader = FrameReader()
        self._await_ready()
        os.set_blocking(self.to_child, False)
        os.set_blocking(self.from_child, False)

    def _await_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.from_child], [], [], left)[0]:
                self.kill()
                raise StoreError(f"the journal writer did not start within {READY_TIMEOUT_S:g} s "
                                 "(another writer holds the store's lock)")
            data = os.read(self.from_child, 1 << 16)
            if not data:
                code = self.kill()
                raise StoreError(f"the journal writer exited at start (exit code {code}); "
                                 "its log says why")
            if self.reader.feed(data):  # the writer's first frame says it is ready
                return

    def close_input(self) -> None:
        """End of input: the writer finishes what it read and exits."""
        if self.to_child >= 0:
            os.close(self.to_child)
            self.to_child = -1

    def kill(self, grace: float = 0.0) -> int | None:
        """Stop the writer (after ``grace`` seconds to exit by itself), close the pipes;
        its exit code."""
        try:
            code = self.proc.wait(timeout=grace) if grace else self.proc.poll()
        except subprocess.TimeoutExpired:
            code = None
        if code is None:
            self.proc.kill()
            code = self.proc.wait()
        self.close_input()
        if self.from_child >= 0:
            os.close(self.from_child)
            self.from_child = -1
        return code


class Journal:
    """Runs every store operation in the writer process, in issue order.

    ``store`` is this process's own connection to the same file, kept for reads at start-up
    (the master's restore) and for tests: after start-up every write goes through here.
    ``commits`` counts the transactions the writer reported, ``writer_restarts`` the
    writers started after one died and ``write_errors`` the operations the store failed
    (StoreError: disk full, read-only, the writer gone; not a duplicate key) - all for
    /metrics.
    """

    def __init__(self, store: Store) -> None:
        self.store = store
        # Encoded specs and placements, shared with the node commands (see masterd.journal.wire).
        self.wire = WireCache()
        self.commits = 0
        self.writer_restarts = 0
        self.write_errors = 0
        self._writer: _WriterProcess | None = _WriterProcess(store)
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._ids = itertools.count(1)
        self._out = bytearray()  # sealed frames not yet taken by the pipe
        self._batch: list[tuple[Any, ...]] = []  # operations issued since the last frame
        self._loop: asyncio.AbstractEventLoop | None = None
        self._flush_pending = False
        self._writing = False  # waiting for the pipe to take more (add_writer)
        self._closed = False

    # -- operations -----------------------------------------------------------------------
    # Each operation is issued when the method is called (it returns the future to await),
    # not when a coroutine first runs: issue order is call order, and a submission costs no
    # coroutine frame of its own.
    def call(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """``fn(store, *args)`` in the writer, after everything issued before it; ``fn`` must
        be importable by name (a module-level function or a Store method)."""
        try:
            # Pickled on its own, so a function the writer cannot import (one defined in
            # __main__, say) fails this call there, not the writer's whole batch.
            call = pickle.dumps((fn, args), protocol=_PICKLE)
        except Exception as exc:
            raise TypeError(f"journal operation cannot be sent to the writer: {exc}") from None
        return self._put("c", call, None)

    def submit(self, seq: int, job: Job) -> asyncio.Future[None]:
        """Insert a submitted job."""
        rows = new_job_rows(seq, job, self.wire.spec(job))
        return self._put("i", rows.job, rows.event)

    def update(self, jobs: list[Job], events: list[tuple]) -> asyncio.Future[None]:
        """Persist job state changes and events; concurrent callers share one commit.

        The rows are encoded now: the Job objects keep changing on the event loop while the
        write waits for its turn.
        """
        job_rows, event_rows = update_rows(jobs, events, self.wire.placement)
        return self._put("u", job_rows, event_rows)

    def _put(self, kind: str, a: Any, b: Any) -> asyncio.Future[Any]:
        if self._closed:
            raise JournalClosed("the journal is closed")
        loop = asyncio.get_running_loop()
        op_id = next(self._ids)
        if self._writer is None:
            log.warning("starting a new journal writer")
            self._writer = _WriterProcess(self.store)
            self.writer_restarts += 1
        self._bind(loop)
        fut = loop.create_future()
        self._pending[op_id] = fut
        self._batch.append((kind, op_id, a, b))
        if not self._flush_pending and not self._writing:
            self._flush_pending = True
            loop.call_soon(self._flush)  # everything issued this turn leaves in one write
        return fut

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def in_flight(self) -> int:
        """Operations sent or queued whose answer has not come back yet."""
        return len(self._pending)

    # -- pipe I/O on the event loop -------------------------------------------------------
    def _bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Read the writer's answers on ``loop`` (a daemon has one; tests may use several)."""
        if self._loop is loop:
            return
        assert self._writer is not None
        self._unbind(self._writer)
        self._loop = loop
        # A flush scheduled on the old loop never ran: the next _put schedules one here.
        self._flush_pending = False
        self._writing = False
        loop.add_reader(self._writer.from_child, self._on_readable)

    def _unbind(self, writer: _WriterProcess) -> None:
        """Stop watching ``writer``'s pipes (before they close, or on another loop)."""
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(writer.from_child)
            self._loop.remove_writer(writer.to_child)

    def _seal(self) -> None:
        """The operations issued since the last frame become one frame: one pickle per
        loop turn, not one per operation. Rows are scalars and bytes, and a call comes
        pickled already: this cannot fail."""
        if self._batch:
            payload = pickle.dumps(self._batch, protocol=_PICKLE)
            self._batch = []
            self._out += frame_header(len(payload))
            self._out += payload

    def _flush(self) -> None:
        self._flush_pending = False
        writer = self._writer
        self._seal()
        if writer is None or not self._out:
            return
        try:
            written = os.write(writer.to_child, self._out)
        except BlockingIOError:
            written = 0
        except OSError as exc:  # the writer is gone
            self._writer_died(f"cannot write to it: {exc}")
            return
        del self._out[:written]
        if self._out and not self._writing:
            self._writing = True
            assert self._loop is not None
            self._loop.add_writer(writer.to_child, self._on_writable)

    def _on_writable(self) -> None:
        self._flush()
        if not self._out and self._writing and self._writer is not None:
            self._writing = False
            assert self._loop is not None
            self._loop.remove_writer(self._writer.to_child)

    def _on_readable(self) -> None:
        writer = self._writer
        if writer is None:
            return
        try:
            data = os.read(writer.from_child, 1 << 20)
        except BlockingIOError:
            return
        except OSError as exc:
            self._writer_died(f"cannot read from it: {exc}")
            return
        if not data:
            self._writer_died("it closed its pipe")
            return
        self._settle_frames(writer, data)

    def _settle_frames(self, writer: _WriterProcess, data: bytes) -> None:
        for payload in writer.reader.feed(data):
            commits, outcomes = pickle.loads(payload)
            self.commits += commits
            for op_id, error, result in outcomes:
                if isinstance(error, StoreError):
                    self.write_errors += 1
                fut = self._pending.pop(op_id, None)
                if fut is not None:
                    _settle(fut, error, result)

    def _writer_died(self, why: str) -> None:
        writer = self._writer
        if writer is None:
            return
        self._writer = None
        self._unbind(writer)
        self._loop = None
        self._writing = False
        code = writer.kill()
        log.error("journal writer failed (%s; exit code %s): %d operations in flight fail",
                  why, code, len(self._pending))
        self._fail_pending(StoreError(
            f"the journal writer failed (exit code {code}); the change may not be recorded"))

    def _fail_pending(self, error: BaseException) -> None:
        self._out.clear()
        self._batch = []
        pending, self._pending = self._pending, {}
        if isinstance(error, StoreError):
            self.write_errors += len(pending)
        for fut in pending.values():
            _settle(fut, error, None)

    # -- shutdown -------------------------------------------------------------------------
    def close(self) -> None:
        """Write everything queued, wait for the writer to commit it and stop, close the
        store. Blocking: the master calls it last, when nothing else is left to serve."""
        if self._closed:
            return
        self._closed = True
        writer, self._writer = self._writer, None
        if writer is not None:
            self._unbind(writer)
            try:
                self._drain(writer)
            except OSError as exc:
                log.error("journal writer failed while closing: %s", exc)
                writer.proc.kill()
            code = writer.kill(grace=READY_TIMEOUT_S)
            if code != 0:
                log.error("journal writer exited with code %s", code)
        self._fail_pending(JournalClosed("the journal closed before the writer answered"))
        self.store.close()

    def _drain(self, writer: _WriterProcess) -> None:
        """Hand the writer what is still queued, then read its answers until it exits.
        Reading and writing interleave: a writer blocked on a full answer pipe stops
        reading, and a blocking write here would then wait for ever."""
        self._seal()
        input_open = True
        while True:
            wants_write = [writer.to_child] if input_open else []
            readable, writable, _ = select.select([writer.from_child], wants_write, [])
            if writable:
                with contextlib.suppress(BlockingIOError):
                    del self._out[:os.write(writer.to_child, self._out)]
                if not self._out:
                    writer.close_input()
                    input_open = False
            if readable:
                try:
                    data = os.read(writer.from_child, 1 << 20)
                except BlockingIOError:
                    continue
                if not data:
                    return
                self._settle_frames(writer, data)


def _settle(fut: asyncio.Future[Any], error: BaseException | None, result: Any) -> None:
    if fut.done():  # the waiter was cancelled; the write happened regardless
        return
    try:
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(result)
    except RuntimeError:  # its event loop is closed: nobody is waiting any more
        pass
