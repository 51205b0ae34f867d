"""Worker processes for CPU-heavy work: the one way a feature trains, forecasts or fits off
the master's event loop.

"Training and other CPU-heavy work never runs on an event loop": estimators and agents
(LightGBM, random forests, DQN, forecasting, GENIE fitting) are trained from the journal's
history in a worker process, and the master only sends the call and receives the result::

    async with WorkerPool(processes=1, max_queued=2) as pool:
        try:
            model = await pool.run(fit_model, history_path, name="genie-fit")
        except WorkerBusy:
            pass  # a periodic retrainer skips this round

``fn`` must be a top-level (importable) function and its arguments and result picklable; pass
a journal path or a row range rather than the rows themselves, because the call and its
result are pickled and unpickled on the loop (cheap for a model of a few MB, not for a whole
history).

Design. Each worker is a ``multiprocessing`` process started with the ``spawn`` method (a
fresh interpreter: forking a process that has an event loop and threads copies locks held by
other threads) with two one-way pipes. Calls and results travel as length-prefixed pickles.
The master's ends are non-blocking: it writes with ``os.write`` (``add_writer`` finishes a
partial write) and reads with ``add_reader``, so the loop never waits on a worker, not even
on one that is descheduled halfway through writing a large result. ``process.sentinel`` in
``add_reader`` reports a worker's death at once; a call running in a worker that dies
(segfault, ``os._exit``, OOM kill) fails with :class:`WorkerDied` naming the function, and the
slot gets a fresh process when the next call needs one. Replacement is lazy on purpose: a
worker that cannot start (a broken import) fails the call that needed it instead of being
restarted in a loop. Cancelling a call that runs kills its worker (SIGKILL: the work is
abandoned and a worker holds nothing the master needs); ``close()`` fails queued calls with
:class:`WorkerClosed`, kills busy workers, lets idle ones exit on end-of-file and reaps all of
them, so a 30-s training does not delay shutdown. At most ``max_queued`` calls wait for a
worker; one more raises :class:`WorkerBusy` instead of queueing without bound.

A worker lowers its priority (``nice``, 10 by default) on every thread, so that it only takes
CPU the master leaves, and dies with the master: ``PR_SET_PDEATHSIG`` (Linux, SIGKILL when
the master dies, even by SIGKILL) plus a thread that polls ``getppid()`` once a second as the
portable fallback. Workers are daemonic, so an interpreter exit without ``close()`` still
terminates them (multiprocessing's exit hook); the price is that ``fn`` cannot start
``multiprocessing`` children of its own (threads, BLAS and OpenMP are fine). ``spawn`` also
starts multiprocessing's resource-tracker helper once per master; it exits with the master.

Rejected:
- ``concurrent.futures.ProcessPoolExecutor`` with ``loop.run_in_executor`` (Python 3.11): a
  running call cannot be cancelled (``Future.cancel`` only works before it starts) and there
  is no public way to kill one worker; killing it anyway, or a worker dying on its own,
  breaks the whole executor (``BrokenProcessPool`` fails every queued and running call, and
  the executor must be rebuilt); ``shutdown(cancel_futures=True)`` still waits for, or leaves
  running, the call in progress. Its queue is unbounded (a counter could fix that, the rest
  not). Killing running workers arrives only in Python 3.14 (``terminate_workers``).
- ``multiprocessing.Pool``: a call whose worker dies never completes (it hangs), and
  ``terminate()`` stops every worker at once.
- ``asyncio.create_subprocess_exec`` of a worker module: asyncio's pipes are fine, but the
  child would not get the master's ``sys.path`` and main module, so functions defined in a
  script (benchmarks, tools) could not be unpickled; spawn does that bootstrap already.
- ``forkserver``: its server is a process-wide singleton shared with any other
  multiprocessing user, and workers would be its children rather than the master's, so
  dying with the master would depend on the server dying first.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ctypes
import functools
import itertools
import logging
import multiprocessing
import os
import pickle
import signal
import struct
import sys
import threading
import time
import traceback
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from types import TracebackType
from typing import Any, TypeVar

log = logging.getLogger("trellis.master.workers")

T = TypeVar("T")

# Every message either way: payload length, call id, kind; then the payload (a pickle).
_HEADER = struct.Struct("!QQB")
_RUN = 1  # master -> worker: (fn, args)
_READY = 2  # worker -> master: set up, waiting for calls
_RESULT = 3  # worker -> master: fn's pickled result
_FAILURE = 4  # worker -> master: a pickled _Failure

# One read per readable event: a 64-KiB pipe rarely holds more, and a bounded read keeps any
# single callback short when a large result streams in.
_READ_CHUNK = 1 << 20
_PARENT_POLL_S = 1.0
_REAP_POLL_S = 0.005
# After SIGKILL a process normally exits within milliseconds; one stuck in the kernel (an
# NFS hang) must not hold shutdown forever.
_KILL_WAIT_S = 5.0
_PR_SET_PDEATHSIG = 1
_ORPHANED_EXIT = 70


class WorkerError(Exception):
    """The worker pool could not run a call (the base of the pool's own errors)."""


class WorkerBusy(WorkerError):
    """Every worker is busy and ``max_queued`` calls already wait: skip this round."""


class WorkerClosed(WorkerError):
    """The pool is closed, or closed before or while the call ran."""


class WorkerDied(WorkerError):
    """The worker process running a call died (signal, ``os._exit``, OOM kill)."""

    def __init__(self, message: str, *, name: str, pid: int | None,
                 exitcode: int | None) -> None:
        super().__init__(message)
        self.name = name
        self.pid = pid
        self.exitcode = exitcode


class RemoteTraceback(Exception):
    """The worker-side traceback, attached as ``__cause__`` of an exception ``fn`` raised."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True)
class WorkerPoolStats:
    """What the pool has done since it started; ``running`` and ``queued`` are current."""

    processes: int
    running: int = 0
    queued: int = 0
    completed: int = 0  # fn returned
    failed: int = 0  # fn raised
    died: int = 0  # the worker died under the call
    cancelled: int = 0
    refused: int = 0  # WorkerBusy
    processes_started: int = 0


@dataclass(frozen=True)
class _Failure:
    """An exception raised by ``fn``, as the worker sends it: the exception itself when it
    survives a pickle round trip (custom exceptions with extra ``__init__`` arguments often
    do not), otherwise its type name and message."""

    type_name: str
    message: str
    traceback: str
    exception: bytes | None


@dataclass(eq=False)  # identity: a call is found in the queue by ``is``, not by its fields
class _Job:
    id: int
    name: str
    payload: bytes
    future: asyncio.Future[Any]
    worker: _Worker | None = None


class _Worker:
    """One worker process and the master's non-blocking ends of its two pipes."""

    def __init__(self, slot: int, process: BaseProcess, request_fd: int, result_fd: int,
                 loop: asyncio.AbstractEventLoop,
                 on_frame: Callable[[_Worker, int, int, bytes], None],
                 on_exit: Callable[[_Worker], None]) -> None:
        self.slot = slot
        self.process = process
        self.pid: int = process.pid or 0
        self.job: _Job | None = None
        self.ready = False
        self.exited = False  # exited on its own (not killed by the pool)
        self.exitcode: int | None = None  # known once reaped
        self.ready_waiter: asyncio.Future[None] = loop.create_future()
        self._loop = loop
        self._request_fd: int | None = request_fd
        self._result_fd: int | None = result_fd
        self._on_frame = on_frame
        self._on_exit = on_exit
        self._outgoing = bytearray()
        self._incoming = bytearray()
        self._sentinel = process.sentinel
        os.set_blocking(request_fd, False)
        os.set_blocking(result_fd, False)
        loop.add_reader(result_fd, self._on_readable)
        loop.add_reader(self._sentinel, self._on_sentinel)

    def send(self, job: _Job) -> None:
        self.job = job
        job.worker = self
        self._write(_HEADER.pack(len(job.payload), job.id, _RUN) + job.payload)

    def _write(self, data: bytes) -> None:
        if self._request_fd is None:
            return
        if self._outgoing:  # a partial write is pending; keep the order
            self._outgoing += data
            return
        try:
            sent = os.write(self._request_fd, data)
        except BlockingIOError:
            sent = 0
        except BrokenPipeError:
            return  # the worker is dying; its sentinel reports it
        if sent < len(data):
            self._outgoing += data[sent:]
            self._loop.add_writer(self._request_fd, self._flush)

    def _flush(self) -> None:
        assert self._request_fd is not None
        try:
            sent = os.write(self._request_fd, self._outgoing)
        except BlockingIOError:
            return
        except BrokenPipeError:
            sent = len(self._outgoing)
        del self._outgoing[:sent]
        if not self._outgoing:
            self._loop.remove_writer(self._request_fd)

    def _on_readable(self) -> None:
        assert self._result_fd is not None
        try:
            chunk = os.read(self._result_fd, _READ_CHUNK)
        except BlockingIOError:
            return
        if not chunk:
            # End of file: the worker is exiting; its sentinel reports the exit.
            self._loop.remove_reader(self._result_fd)
            return
        self._incoming += chunk
        self._parse()

    def _parse(self) -> None:
        while len(self._incoming) >= _HEADER.size:
            length, job_id, kind = _HEADER.unpack_from(self._incoming)
            end = _HEADER.size + length
            if len(self._incoming) < end:
                return
            body = bytes(self._incoming[_HEADER.size:end])
            del self._incoming[:end]
            self._on_frame(self, job_id, kind, body)

    def _on_sentinel(self) -> None:
        # The process is gone, so everything it wrote is already in the pipe: read it all
        # before judging the call, or a result written just before exiting would be lost.
        # Marked first: a result parsed here frees the slot, and the next call must get a
        # fresh process, not this dead one.
        self.exited = True
        fd = self._result_fd
        if fd is not None:
            while True:
                try:
                    chunk = os.read(fd, _READ_CHUNK)
                except (BlockingIOError, OSError):
                    break
                if not chunk:
                    break
                self._incoming += chunk
            self._parse()
        self.detach()
        self._on_exit(self)

    def detach(self) -> None:
        """Stop watching the process and close the master's pipe ends (idempotent). An idle
        worker reads end-of-file on its request pipe and exits by itself."""
        with contextlib.suppress(ValueError, OSError):  # ValueError: the loop is closed
            self._loop.remove_reader(self._sentinel)
        if self._result_fd is not None:
            with contextlib.suppress(ValueError, OSError):
                self._loop.remove_reader(self._result_fd)
            os.close(self._result_fd)
            self._result_fd = None
        if self._request_fd is not None:
            if self._outgoing:
                with contextlib.suppress(ValueError, OSError):
                    self._loop.remove_writer(self._request_fd)
            os.close(self._request_fd)
            self._request_fd = None
        if not self.ready_waiter.done():
            self.ready_waiter.set_result(None)

    def kill(self) -> None:
        self.detach()
        with contextlib.suppress(OSError, ValueError):  # already exited and reaped
            self.process.kill()

    async def reap(self, grace_s: float) -> None:
        """Wait for the process to exit (SIGKILL after ``grace_s``) and collect its status,
        so that no zombie is left behind. Polls: this runs only while a worker exits."""
        loop = asyncio.get_running_loop()
        kill_at = loop.time() + grace_s
        give_up_at: float | None = None
        while self.process.exitcode is None:  # waitpid(WNOHANG)
            now = loop.time()
            if give_up_at is None and now >= kill_at:
                log.warning("worker process %d did not exit within %.1f s; killing it",
                            self.pid, grace_s)
                with contextlib.suppress(OSError, ValueError):
                    self.process.kill()
                give_up_at = now + _KILL_WAIT_S
            elif give_up_at is not None and now >= give_up_at:
                log.error("worker process %d survives SIGKILL; leaving it", self.pid)
                return
            await asyncio.sleep(_REAP_POLL_S)
        self.exitcode = self.process.exitcode
        self.process.close()


class WorkerPool:
    """Runs picklable top-level functions in worker processes; see the module docstring.

    ``processes`` calls run at once, at most ``max_queued`` more wait (one more raises
    :class:`WorkerBusy`). ``nice`` is added to the master's own niceness for the workers.
    ``start_timeout_s`` bounds the first start (interpreter start and the main module's
    imports); ``shutdown_timeout_s`` is how long an idle worker gets to exit at ``close()``
    before it is killed (a busy one is killed at once).
    """

    def __init__(self, processes: int = 1, max_queued: int = 4, *, nice: int = 10,
                 start_timeout_s: float = 60.0, shutdown_timeout_s: float = 1.0,
                 name: str = "trellis-worker") -> None:
        if processes < 1:
            raise ValueError(f"processes must be at least 1, got {processes}")
        if max_queued < 0:
            raise ValueError(f"max_queued must not be negative, got {max_queued}")
        if not 0 <= nice <= 19:
            raise ValueError(f"nice must be 0-19, got {nice}")
        self._processes = processes
        self._max_queued = max_queued
        self._nice = nice
        self._start_timeout_s = start_timeout_s
        self._shutdown_timeout_s = shutdown_timeout_s
        self._name = name
        self._context = multiprocessing.get_context("spawn")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._niceness = 0
        self._slots: list[_Worker | None] = [None] * processes
        self._queue: collections.deque[_Job] = collections.deque()
        self._ids = itertools.count(1)
        self._reaping: set[asyncio.Task[None]] = set()
        self._closed = False
        self._stats = WorkerPoolStats(processes=processes)

    async def __aenter__(self) -> WorkerPool:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.close()

    async def start(self) -> None:
        """Start the worker processes and wait until each is ready; raises
        :class:`WorkerError` (and closes the pool) if one cannot start."""
        if self._loop is not None:
            raise RuntimeError("WorkerPool.start() called twice")
        self._loop = asyncio.get_running_loop()
        self._niceness = min(19, os.getpriority(os.PRIO_PROCESS, 0) + self._nice)
        try:
            workers = [self._spawn(slot) for slot in range(self._processes)]
            await asyncio.wait([w.ready_waiter for w in workers], timeout=self._start_timeout_s)
        except BaseException:
            await self.close()
            raise
        failed = [w for w in workers if not w.ready]
        if failed:
            await self.close()
            causes = ", ".join(
                f"pid {w.pid} {_describe_exit(w.exitcode)}" if w.exited
                else f"pid {w.pid} not ready after {self._start_timeout_s:g} s"
                for w in failed)
            raise WorkerError(f"{len(failed)} of {self._processes} worker processes did not "
                              f"start ({causes}); see their stderr")
        log.info("worker pool %s started: %d process(es), niceness %d", self._name,
                 self._processes, self._niceness)

    async def run(self, fn: Callable[..., T], *args: Any, name: str | None = None) -> T:
        """Call ``fn(*args)`` in a worker process and return its result.

        Raises what ``fn`` raised (its type and message, with the worker's traceback as
        ``__cause__``), :class:`WorkerBusy` when ``max_queued`` calls already wait,
        :class:`WorkerDied` when the worker died under the call, :class:`WorkerClosed` when
        the pool closes first, and ``TypeError`` when ``fn`` or ``args`` cannot be pickled.
        Cancelling the caller stops the call; a running one by killing its worker.
        """
        label = name if name is not None else _describe(fn)
        if self._loop is None:
            raise RuntimeError(f"{label}: WorkerPool.run() before start()")
        if self._closed:
            raise WorkerClosed(f"{label}: the worker pool is closed")
        slot = self._free_slot()
        if slot is None and len(self._queue) >= self._max_queued:
            self._count(refused=1)
            raise WorkerBusy(f"{label}: all {self._processes} worker process(es) are busy and "
                             f"{len(self._queue)} call(s) already wait (max_queued="
                             f"{self._max_queued}); skip this round")
        try:
            payload = pickle.dumps((fn, args), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:
            raise TypeError(f"{label}: cannot send it to a worker process ({exc}); pass a "
                            f"top-level function and picklable arguments") from exc
        job = _Job(next(self._ids), label, payload, self._loop.create_future())
        job.future.add_done_callback(functools.partial(self._job_done, job))
        if slot is None:
            self._queue.append(job)
        else:
            self._start_job(slot, job)
        return await job.future

    async def close(self) -> None:
        """Fail queued and running calls with :class:`WorkerClosed`, kill busy workers, let
        idle ones exit, and wait until every worker process has been reaped."""
        if not self._closed:
            self._closed = True
            while self._queue:
                job = self._queue.popleft()
                _fail(job, WorkerClosed(f"{job.name}: the worker pool closed before it ran"))
            for slot, worker in enumerate(self._slots):
                if worker is None:
                    continue
                self._slots[slot] = None
                job, worker.job = worker.job, None
                if job is not None:
                    _fail(job, WorkerClosed(f"{job.name}: the worker pool closed while it ran;"
                                            f" its worker process {worker.pid} was killed"))
                    worker.kill()
                else:
                    worker.detach()
                self._track(worker.reap(self._shutdown_timeout_s))
        while self._reaping:
            await asyncio.gather(*self._reaping, return_exceptions=True)

    def pids(self) -> list[int]:
        """Process ids of the current worker processes."""
        return [w.pid for w in self._slots if w is not None]

    def stats(self) -> WorkerPoolStats:
        running = sum(1 for w in self._slots if w is not None and w.job is not None)
        return replace(self._stats, running=running, queued=len(self._queue))

    def _count(self, **increments: int) -> None:
        self._stats = replace(self._stats, **{
            key: getattr(self._stats, key) + value for key, value in increments.items()})

    def _free_slot(self) -> int | None:
        """An idle running worker's slot first (no start-up wait), else an empty slot."""
        empty = None
        for slot, worker in enumerate(self._slots):
            if worker is None or worker.exited:
                empty = slot if empty is None else empty
            elif worker.job is None:
                return slot
        return empty

    def _spawn(self, slot: int) -> _Worker:
        assert self._loop is not None
        request_r, request_w = self._context.Pipe(duplex=False)
        result_r, result_w = self._context.Pipe(duplex=False)
        process = self._context.Process(
            target=_worker_main, args=(request_r, result_w, self._niceness, os.getpid()),
            name=f"{self._name}-{slot}", daemon=True)
        try:
            process.start()
        except BaseException:
            request_w.close()
            result_r.close()
            raise
        finally:
            # The child has its own copies; ours would hide its death (no end-of-file).
            request_r.close()
            result_w.close()
        # Lower the child's main thread now, before its interpreter gets to importing the
        # main module: threads it starts then (a BLAS pool) inherit the lower priority.
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, process.pid or 0, self._niceness)
        worker = _Worker(slot, process, _take_fd(request_w), _take_fd(result_r), self._loop,
                         self._on_frame, self._on_exit)
        self._slots[slot] = worker
        self._count(processes_started=1)
        log.debug("worker process %d started in slot %d", worker.pid, slot)
        return worker

    def _start_job(self, slot: int, job: _Job) -> None:
        worker = self._slots[slot]
        if worker is None or worker.exited:
            try:
                worker = self._spawn(slot)
            except Exception as exc:
                log.exception("could not start a worker process for %s", job.name)
                _fail(job, WorkerError(f"{job.name}: could not start a worker process: {exc}"))
                return
        worker.send(job)

    def _dispatch(self) -> None:
        while self._queue and not self._closed:
            slot = self._free_slot()
            if slot is None:
                return
            job = self._queue.popleft()
            if not job.future.done():  # cancelled while queued, callback not yet run
                self._start_job(slot, job)

    def _on_frame(self, worker: _Worker, job_id: int, kind: int, body: bytes) -> None:
        if kind == _READY:
            worker.ready = True
            if not worker.ready_waiter.done():
                worker.ready_waiter.set_result(None)
            return
        job = worker.job
        if job is None or job.id != job_id or kind not in (_RESULT, _FAILURE):
            log.error("worker process %d sent an unexpected message (kind %d, call %d); "
                      "killing it", worker.pid, kind, job_id)
            self._replace(worker)
            return
        worker.job = None
        job.worker = None
        if kind == _RESULT:
            try:
                result = pickle.loads(body)
            except Exception as exc:
                self._count(failed=1)
                _fail(job, WorkerError(f"{job.name}: its result could not be unpickled in the "
                                       f"master: {exc!r}"))
            else:
                self._count(completed=1)
                if not job.future.done():
                    job.future.set_result(result)
        else:
            self._count(failed=1)
            _fail(job, _rebuild_exception(job.name, pickle.loads(body)))
        self._dispatch()

    def _on_exit(self, worker: _Worker) -> None:
        if self._slots[worker.slot] is worker:
            self._slots[worker.slot] = None
        job, worker.job = worker.job, None
        if job is not None:
            self._count(died=1)
            log.warning("worker process %d died while running %s", worker.pid, job.name)
        else:
            log.warning("worker process %d exited while idle", worker.pid)
        self._track(self._after_exit(worker, job))
        self._dispatch()

    async def _after_exit(self, worker: _Worker, job: _Job | None) -> None:
        # The sentinel fires as the process closes its files; its exit status is readable a
        # moment later, and the error should carry it.
        await worker.reap(self._shutdown_timeout_s)
        if job is None:
            return
        exitcode = worker.exitcode
        state = "running" if worker.ready else "starting up, before it could run"
        message = (f"worker process {worker.pid} died while {state} {job.name}: "
                   f"{_describe_exit(exitcode)}")
        _fail(job, WorkerDied(message, name=job.name, pid=worker.pid, exitcode=exitcode))

    def _job_done(self, job: _Job, future: asyncio.Future[Any]) -> None:
        if not future.cancelled():
            return
        if job in self._queue:  # identity (_Job has eq=False)
            self._queue.remove(job)
            self._count(cancelled=1)
            return
        worker = job.worker
        if worker is not None and worker.job is job and self._slots[worker.slot] is worker:
            self._count(cancelled=1)
            log.info("%s cancelled while running: killing worker process %d", job.name,
                     worker.pid)
            self._replace(worker)

    def _replace(self, worker: _Worker) -> None:
        """Kill a worker; the next call that needs its slot starts a fresh process."""
        if self._slots[worker.slot] is worker:
            self._slots[worker.slot] = None
        worker.job = None
        worker.kill()
        self._track(worker.reap(self._shutdown_timeout_s))
        self._dispatch()

    def _track(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._reaping.add(task)
        task.add_done_callback(self._tracked_done)

    def _tracked_done(self, task: asyncio.Task[None]) -> None:
        self._reaping.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("reaping a worker process failed", exc_info=task.exception())


def _fail(job: _Job, exc: BaseException) -> None:
    if not job.future.done():
        job.future.set_exception(exc)


def _take_fd(connection: Connection) -> int:
    """The connection's pipe as a bare descriptor owned by the caller (Connection has no
    detach(); its blocking reads are what the master must not use)."""
    fd = os.dup(connection.fileno())
    connection.close()
    return fd


def _describe(fn: Callable[..., Any]) -> str:
    target = fn.func if isinstance(fn, functools.partial) else fn
    module = getattr(target, "__module__", None) or "?"
    qualname = getattr(target, "__qualname__", None) or type(target).__name__
    return f"{module}.{qualname}"


def _describe_exit(exitcode: int | None) -> str:
    if exitcode is None:
        return "exit status unknown"
    if exitcode < 0:
        try:
            signame = signal.Signals(-exitcode).name
        except ValueError:
            signame = f"signal {-exitcode}"
        hint = " (out of memory? the OOM killer sends SIGKILL)" if -exitcode == 9 else ""
        return f"killed by {signame}{hint}"
    return f"exited with code {exitcode}"


def _rebuild_exception(name: str, failure: _Failure) -> Exception:
    exc: object = None
    if failure.exception is not None:
        with contextlib.suppress(Exception):
            exc = pickle.loads(failure.exception)
    if not isinstance(exc, Exception):
        # Not picklable, or a BaseException (SystemExit) that must not unwind the master.
        exc = WorkerError(f"{name} raised {failure.type_name}: {failure.message}")
    exc.__cause__ = RemoteTraceback(failure.traceback)
    return exc


# ---- the worker process -------------------------------------------------------------------


def _worker_main(requests: Connection, results: Connection, niceness: int,
                 master_pid: int) -> None:
    """A worker's whole life: run calls one at a time until the master closes the pipe."""
    # The connections stay referenced for the whole function, so their descriptors stay open.
    request_fd = requests.fileno()
    result_fd = results.fileno()
    _die_with_master(master_pid)
    # Ctrl-C in the master's terminal reaches the whole process group; the master decides
    # what stops, through close() or cancellation.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _lower_priority(niceness)
    _write_frame(result_fd, 0, _READY, b"")
    while True:
        frame = _read_frame(request_fd)
        if frame is None:
            return  # end of file: the master closed the pool
        job_id, payload = frame
        kind, body = _execute(payload)
        _write_frame(result_fd, job_id, kind, body)


def _execute(payload: bytes) -> tuple[int, bytes]:
    try:
        fn, args = pickle.loads(payload)
        result = fn(*args)
    except BaseException as exc:  # SystemExit from fn too: reported, the worker carries on
        return _FAILURE, _pack_failure(exc)
    try:
        return _RESULT, pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        error = TypeError(f"the result ({type(result).__name__}) could not be pickled: {exc}")
        return _FAILURE, _pack_failure(error)


def _pack_failure(exc: BaseException) -> bytes:
    blob: bytes | None
    try:
        blob = pickle.dumps(exc, protocol=pickle.HIGHEST_PROTOCOL)
        pickle.loads(blob)  # some exceptions pickle but cannot be rebuilt
    except Exception:
        blob = None
    failure = _Failure(type_name=f"{type(exc).__module__}.{type(exc).__qualname__}",
                       message=str(exc), traceback="".join(traceback.format_exception(exc)),
                       exception=blob)
    return pickle.dumps(failure, protocol=pickle.HIGHEST_PROTOCOL)


def _die_with_master(master_pid: int) -> None:
    # PR_SET_PDEATHSIG fires when the *thread* that started us ends, not the process: the
    # pool starts workers from its event loop's thread, which lives as long as the master.
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, ctypes.c_ulong(signal.SIGKILL), ctypes.c_ulong(0),
                      ctypes.c_ulong(0), ctypes.c_ulong(0)) != 0:
            log.warning("prctl(PR_SET_PDEATHSIG) failed: %s",
                        os.strerror(ctypes.get_errno()))
    # The master may have died before prctl took effect; then we are already orphaned.
    if os.getppid() != master_pid:
        os._exit(_ORPHANED_EXIT)
    threading.Thread(target=_watch_master, args=(master_pid,), name="master-watch",
                     daemon=True).start()


def _watch_master(master_pid: int) -> None:
    while True:
        time.sleep(_PARENT_POLL_S)
        if os.getppid() != master_pid:  # reparented: the master is gone
            os._exit(_ORPHANED_EXIT)


def _lower_priority(niceness: int) -> None:
    # On Linux niceness belongs to each thread, and threads started while spawn imported the
    # master's main module (OpenBLAS starts its pool when numpy is imported) would keep the
    # master's priority and compete with its loop; so every thread is lowered.
    try:
        threads = [int(tid) for tid in os.listdir("/proc/self/task")]
    except OSError:
        threads = [0]  # elsewhere the priority belongs to the process
    for tid in threads:
        with contextlib.suppress(OSError):  # a thread that already ended, or is lower
            os.setpriority(os.PRIO_PROCESS, tid, niceness)


def _read_exactly(fd: int, size: int) -> bytes | None:
    chunks = bytearray()
    while len(chunks) < size:
        chunk = os.read(fd, size - len(chunks))
        if not chunk:
            return None
        chunks += chunk
    return bytes(chunks)


def _read_frame(fd: int) -> tuple[int, bytes] | None:
    header = _read_exactly(fd, _HEADER.size)
    if header is None:
        return None
    length, job_id, kind = _HEADER.unpack(header)
    if kind != _RUN:
        raise RuntimeError(f"unexpected message kind {kind} from the master")
    payload = _read_exactly(fd, length)
    return None if payload is None else (job_id, payload)


def _write_frame(fd: int, job_id: int, kind: int, body: bytes) -> None:
    view = memoryview(_HEADER.pack(len(body), job_id, kind) + body)
    while view:
        written = os.write(fd, view)
        view = view[written:]
