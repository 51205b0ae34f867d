"""Jobs' output on this node: reading it in bounded chunks for the master, and removing it once
it is old.

The shim writes a running part's output to ``STATE/jobs/JOB/output.log`` (capped, see
noded/shim.py); when the master has recorded the exit (``forget_job``) noded moves it to
``STATE/logs/JOB.log``, where it stays ``log_retention_h`` after that move. Both survive a
restart of noded: they are plain files.

``read_log`` answers one chunk from an offset (``os.pread`` of at most one chunk: a log is
never read whole). With ``wait_s`` and nothing new at the offset while the part may still
write, the read waits until the file grows (inotify; a timed stat where inotify is missing),
the part ends, or the wait is over: ``trellisctl logs -f`` is a long poll, not a busy loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import logging
import os
import struct
import time
from collections.abc import Callable
from pathlib import Path

from noded.jobs import JobRefused, JobRunner
from shared.messages import LogData, ReadLog

log = logging.getLogger("trellis.node.logs")

TAIL_BLOCK = 64 * 1024  # bytes read per step when looking for the tail's start
MAX_READERS = 64  # read_log commands served at once; more are refused (busy)
POLL_S = 0.1  # where inotify is unavailable: how often a waiting read looks at the file


def tail_offset(fd: int, size: int, lines: int, block: int = TAIL_BLOCK) -> int:
    """Where the last ``lines`` lines of the file ``fd`` (``size`` bytes) begin.

    A final line without a newline counts as a line; 0 lines is the end of the file; a file
    with fewer lines gives 0. Reads backwards ``block`` bytes at a time, so a tail of a huge
    log costs the bytes of its lines, not the log.
    """
    if lines <= 0 or size <= 0:
        return size if lines <= 0 else 0
    # A newline as the very last byte ends the last line; it does not start another one.
    end = size - 1 if os.pread(fd, 1, size - 1) == b"\n" else size
    seen = 0
    while end > 0:
        start = max(0, end - block)
        data = os.pread(fd, end - start, start)
        pos = len(data)
        while True:
            pos = data.rfind(b"\n", 0, pos)
            if pos < 0:
                break
            seen += 1
            if seen == lines:
                return start + pos + 1
        end = start
    return 0


class LogReader:
    """Serves ``read_log`` from the runner's job directories and the logs directory."""

    def __init__(self, runner: JobRunner, retention_s: float = 0.0,
                 clock: Callable[[], float] = time.time) -> None:
        self.runner = runner
        self.retention_s = retention_s
        self.clock = clock
        self.active = 0
        # Reads waiting for a part to end: job id -> events to set when it does.
        self._ended: dict[str, set[asyncio.Event]] = {}
        runner.cleanup_hooks.append(self._part_ended)

    # -- where a part's output is -----------------------------------------------------------
    def _open(self, job_id: str) -> int | None:
        """An open descriptor of the job's log, or None. The running part's file first: once
        open, a move to the logs directory (forget) does not disturb the read."""
        for path in (self.runner.dir / job_id / "output.log", self.runner.logs / f"{job_id}.log"):
            with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        return None

    def _writing(self, job_id: str) -> bool:
        """Whether the part may still add output: prepared (its shim not started yet) or
        running. Looked at *before* the file's size, so a part seen ended has its final size."""
        part = self.runner.parts.get(job_id)
        return part is not None and part.state in ("prepared", "running")

    # -- read_log ---------------------------------------------------------------------------
    async def read(self, cmd: ReadLog) -> LogData:
        if self.active >= MAX_READERS:
            raise JobRefused("busy", f"node {self.runner.node} is serving {self.active} log "
                             "reads already; try again shortly")
        self.active += 1
        try:
            return await self._read(cmd)
        finally:
            self.active -= 1

    async def _read(self, cmd: ReadLog) -> LogData:
        job_id = cmd.job_id
        offset = cmd.offset
        deadline = time.monotonic() + cmd.wait_s
        while True:
            writing = self._writing(job_id)  # before the size: see _writing
            fd = self._open(job_id)
            if fd is None:
                if not (writing or cmd.pending):
                    raise JobRefused(
                        "no_output", f"node {self.runner.node} has no output of job {job_id}: "
                        "the job never ran here, or its log was removed after the node's "
                        "log_retention_h")
                # Placed here but not started yet: no output so far, more to come.
                writing = True
                size = start = 0
                data = b""
            else:
                try:
                    size = os.fstat(fd).st_size
                    if offset is None:
                        offset = (tail_offset(fd, size, cmd.tail) if cmd.tail is not None
                                  else 0)
                    # Past the end (a log begun again by a new attempt): from its end.
                    start = min(offset, size)
                    want = min(cmd.max_bytes, size - start)
                    data = os.pread(fd, want, start) if want > 0 else b""
                finally:
                    os.close(fd)
            left = deadline - time.monotonic()
            grown = cmd.max_bytes == 0 and size > start  # a wait-only read's answer
            if data or grown or not writing or left <= 0:
                return LogData(data=data, offset=start, size=size,
                               done=not writing and start + len(data) >= size)
            offset = start
            await self._wait(job_id, size, left)

    async def _wait(self, job_id: str, size: int, timeout: float) -> None:
        """Until the log grows past ``size``, the part ends, or ``timeout`` seconds."""
        ended = asyncio.Event()
        self._ended.setdefault(job_id, set()).add(ended)
        watch = _Inotify.watch(self.runner.dir / job_id / "output.log")
        try:
            if self._writing(job_id) and not _grown(self.runner.dir / job_id / "output.log",
                                                    size):
                waits = [asyncio.ensure_future(ended.wait())]
                if watch is not None:
                    waits.append(asyncio.ensure_future(watch.changed()))
                else:
                    waits.append(asyncio.ensure_future(
                        _poll_growth(self.runner.dir / job_id / "output.log", size)))
                try:
                    await asyncio.wait(waits, timeout=timeout,
                                       return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for waiter in waits:
                        waiter.cancel()
        finally:
            if watch is not None:
                watch.close()
            waiting = self._ended.get(job_id)
            if waiting is not None:
                waiting.discard(ended)
                if not waiting:
                    del self._ended[job_id]

    def _part_ended(self, part: object) -> None:
        job_id = getattr(part, "job_id", "")
        for event in self._ended.get(job_id, ()):
            event.set()

    # -- retention --------------------------------------------------------------------------
    def sweep(self) -> list[str]:
        """Remove finished jobs' logs older than ``retention_s`` (0: keep them); returns the
        job ids whose logs went."""
        if self.retention_s <= 0:
            return []
        cutoff = self.clock() - self.retention_s
        removed: list[str] = []
        try:
            entries = list(os.scandir(self.runner.logs))
        except FileNotFoundError:
            return []
        for entry in entries:
            if not entry.name.endswith(".log"):
                continue
            try:
                if entry.stat(follow_symlinks=False).st_mtime >= cutoff:
                    continue
                os.unlink(entry.path)
            except FileNotFoundError:
                continue
            except OSError as exc:
                log.warning("log %s not removed: %s", entry.path, exc)
                continue
            removed.append(entry.name[:-4])
        if removed:
            log.info("logs removed after log_retention_h=%g count=%d jobs=%s",
                     self.retention_s / 3600, len(removed), ",".join(sorted(removed)[:20]))
        return removed

    async def run_sweeps(self, stop: asyncio.Event) -> None:
        """Sweep now and then every tenth of the retention (at least every second, at most
        hourly): a log outlives its retention by at most that much."""
        if self.retention_s <= 0:
            return
        period = min(3600.0, max(1.0, self.retention_s / 10))
        while not stop.is_set():
            try:
                await asyncio.get_running_loop().run_in_executor(None, self.sweep)
            except Exception:  # a sweep must never take the daemon down
                log.exception("log sweep failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), period)


def _grown(path: Path, size: int) -> bool:
    try:
        return os.stat(path).st_size > size
    except OSError:
        return False


async def _poll_growth(path: Path, size: int) -> None:
    while not _grown(path, size):
        await asyncio.sleep(POLL_S)


# -- inotify ---------------------------------------------------------------------------------
_IN_MODIFY = 0x002
_IN_ATTRIB = 0x004
_IN_CLOSE_WRITE = 0x008
_IN_MOVE_SELF = 0x800
_IN_DELETE_SELF = 0x400
_IN_NONBLOCK = 0o4000
_IN_CLOEXEC = 0o2000000
_MASK = _IN_MODIFY | _IN_ATTRIB | _IN_CLOSE_WRITE | _IN_MOVE_SELF | _IN_DELETE_SELF


class _Inotify:
    """One inotify watch of one file: ``changed()`` returns at its next change."""

    _libc: ctypes.CDLL | None = None
    _missing = False

    def __init__(self, fd: int) -> None:
        self.fd = fd
        # The loop ``changed()`` registered the fd with, while it is registered. ``close()``
        # unregisters it first: closing a registered fd left its number in the selector's
        # map, and when the kernel reused the number (a shim's pidfd, noded/jobs.py) the new
        # fd's reader silently replaced the stale entry, was never armed in epoll, and the
        # job's exit was never seen.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready: asyncio.Future[None] | None = None

    @classmethod
    def watch(cls, path: Path) -> _Inotify | None:
        """A watch of ``path``, or None (no inotify here, out of watches, no such file)."""
        if cls._missing:
            return None
        if cls._libc is None:
            name = ctypes.util.find_library("c")
            try:
                libc = ctypes.CDLL(name or "libc.so.6", use_errno=True)
            except OSError:
                libc = None
            if libc is None or not hasattr(libc, "inotify_init1"):
                cls._missing = True
                return None
            cls._libc = libc
        libc = cls._libc
        fd = libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if fd < 0:
            return None
        if libc.inotify_add_watch(fd, os.fsencode(path), _MASK) < 0:
            os.close(fd)
            return None
        return cls(fd)

    async def changed(self) -> None:
        """Until the file changes, or until ``close()`` (which may come from another task
        while this one waits)."""
        if self.fd < 0:
            return
        loop = asyncio.get_running_loop()
        ready = loop.create_future()
        loop.add_reader(self.fd, lambda: ready.done() or ready.set_result(None))
        self._loop, self._ready = loop, ready
        try:
            await ready
        finally:
            self._unregister()
        if self.fd >= 0:
            with contextlib.suppress(BlockingIOError):
                os.read(self.fd, 4096 * struct.calcsize("iIII"))

    def _unregister(self) -> None:
        loop, ready = self._loop, self._ready
        self._loop = self._ready = None
        if loop is not None and self.fd >= 0:
            loop.remove_reader(self.fd)
        if ready is not None and not ready.done():
            ready.set_result(None)

    def close(self) -> None:
        """Unregister the fd from the loop (a ``changed()`` still waiting returns), then
        close it."""
        self._unregister()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
