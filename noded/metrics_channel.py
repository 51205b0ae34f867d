"""The metrics channel: how any training script tells Trellis how fast it runs.

Protocol (the whole of it, for people writing training scripts):

* Every job gets ``TRELLIS_METRICS_FILE=<node state>/metrics/<job id>/metrics`` in its
  environment. The directory exists and belongs to the job's user; the file does not exist
  until the job creates it.
* ``TRELLIS_PREEMPTED_FILE`` (beside it) appears when a priority class preempts the job: one
  line saying why, written just before its warning signal (docs/priority-classes.md).
* The job appends lines ``<name> <value>\\n``, e.g. ``samples_per_sec 612.5``: ``name`` is
  lower-case letters, digits and ``_`` (at most 32 characters, starting with a letter) and
  ``value`` a finite decimal number >= 0. ``samples_per_sec`` is the one Trellis's profiler
  reads: the whole job's training throughput (all its GPUs and nodes) over the last few
  seconds. In a multi-node job only the rank-0 process needs to write it (the master reads
  rank 0's node); the others may, and are ignored for profiling.
* Write whole lines (one ``write`` per line, opened in append mode). Anything else — a line
  longer than 256 bytes, an unknown format, a negative, infinite or NaN value, binary
  garbage — is skipped and counted, never fatal.

What the daemon does with it: every ``job_metrics_interval_s`` it reads what was appended since
its last read (at most ``MAX_READ`` bytes; a job writing faster loses its oldest lines, not
the newest), and sends the master at most one ``job_metric`` event per job and name: the mean
of the values read, the last one, and how many lines they came from. At most ``MAX_NAMES``
distinct names per job are relayed. The file is opened without following symlinks, and only
a regular file is read, so a job cannot make the root daemon read or block on anything else.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import re
import shutil
import stat
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shared.messages import METRIC_NAME_PATTERN, JobMetric
from shared.model import check_name, is_valid_name
from shared.schema import encode

log = logging.getLogger("trellis.node.metrics")

METRICS_ENV = "TRELLIS_METRICS_FILE"
METRICS_FILE_NAME = "metrics"
# Beside it, the other way: why the job is being preempted (a priority class took its
# resources), written before its warning signal; absent until then.
PREEMPTED_ENV = "TRELLIS_PREEMPTED_FILE"
PREEMPTED_FILE_NAME = "preempted"
MAX_LINE = 256  # bytes, newline included
MAX_READ = 64 * 1024  # bytes read per job per poll
MAX_NAMES = 8  # distinct metric names relayed per job
_LINE = re.compile(rf"({METRIC_NAME_PATTERN})[ \t]+([0-9eE.+\-]{{1,40}})")
_VALUE_MAX = 1e15  # JobMetric's bound


@dataclass
class _Sums:
    total: float = 0.0
    count: int = 0
    last: float = 0.0


@dataclass
class JobTail:
    """Where the daemon is in one job's metrics file, and what it read since the last event."""

    job_id: str
    path: Path
    uid: int | None
    offset: int = 0
    inode: tuple[int, int] | None = None
    partial: bytes = b""
    skipping: bool = False  # inside an over-long line: drop bytes up to the next newline
    bad_lines: int = 0
    sums: dict[str, _Sums] = field(default_factory=dict)
    names: set[str] = field(default_factory=set)
    # The directory is made just before the job's process exists: until the job has been
    # seen running (or a few polls passed), "not running" means "not yet", not "ended".
    seen_running: bool = False
    polls_not_running: int = 0

    # -- reading -------------------------------------------------------------------------
    def read(self) -> None:
        """Consume what was appended since the last read (bounded; never blocks)."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return  # not written yet, or not a file we are willing to open
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return
            if self.uid is not None and st.st_uid not in (self.uid, os.geteuid()):
                return  # someone else's file put in the job's place: not the job's word
            inode = (st.st_dev, st.st_ino)
            if inode != self.inode or st.st_size < self.offset:
                # A new file, or the job truncated it: start over at its beginning.
                self.inode, self.offset, self.partial, self.skipping = inode, 0, b"", False
            backlog = st.st_size - self.offset
            if backlog <= 0:
                return
            if backlog > MAX_READ:
                # Keep the newest lines: rates matter now, not a minute ago.
                self.offset = st.st_size - MAX_READ
                self.partial, self.skipping = b"", True
            data = os.pread(fd, min(backlog, MAX_READ), self.offset)
        except OSError:
            return
        finally:
            os.close(fd)
        self.offset += len(data)
        self._feed(data)

    def _feed(self, data: bytes) -> None:
        lines = data.split(b"\n")
        tail = lines.pop()  # after the last newline: an unfinished line
        for i, raw in enumerate(lines):
            if i == 0:
                if self.skipping:
                    self.skipping = False
                    self.bad_lines += 1
                    continue
                raw = self.partial + raw
                self.partial = b""
            self._line(raw)
        if lines:
            self.partial = b""
        if self.skipping:
            return
        self.partial += tail
        if len(self.partial) >= MAX_LINE:
            self.partial, self.skipping = b"", True

    def _line(self, raw: bytes) -> None:
        if len(raw) >= MAX_LINE:
            self.bad_lines += 1
            return
        try:
            text = raw.decode("ascii").strip()
        except UnicodeDecodeError:
            self.bad_lines += 1
            return
        if not text:
            return
        match = _LINE.fullmatch(text)
        if match is None:
            self.bad_lines += 1
            return
        name = match.group(1)
        try:
            value = float(match.group(2))
        except ValueError:
            self.bad_lines += 1
            return
        if not math.isfinite(value) or not 0.0 <= value <= _VALUE_MAX:
            self.bad_lines += 1
            return
        if name not in self.names:
            if len(self.names) >= MAX_NAMES:
                self.bad_lines += 1
                return
            self.names.add(name)
        sums = self.sums.setdefault(name, _Sums())
        sums.total += value
        sums.count += 1
        sums.last = value

    def drain(self) -> list[JobMetric]:
        """One event per name read since the last drain."""
        out = [
            JobMetric(job_id=self.job_id, name=name, value=min(_VALUE_MAX, s.total / s.count),
                      last=s.last, count=min(s.count, 1 << 32))
            for name, s in sorted(self.sums.items())
        ]
        self.sums.clear()
        return out


class MetricsChannel:
    """Creates each job's metrics directory and relays what jobs write there to the master."""

    def __init__(
        self,
        root: Path,
        send: Callable[[str, dict[str, Any]], Awaitable[None]],
        job_running: Callable[[str], bool],
        interval_s: float = 1.0,
    ) -> None:
        self.root = root
        self.send = send
        self.job_running = job_running
        self.interval_s = interval_s
        self.tails: dict[str, JobTail] = {}
        self._lock = threading.Lock()  # poll() runs on an executor thread
        root.mkdir(parents=True, exist_ok=True)
        # Job users must reach their own directory inside, but not list the others.
        os.chmod(root, 0o711)

    def job_env(self, job_id: str, owner_uid: int | None = None) -> dict[str, str]:
        """Make the job's directory (owned by its user) and name the file in its environment."""
        check_name(job_id, "job id")
        path = self.root / job_id
        target = path / METRICS_FILE_NAME
        with self._lock:
            # A directory left by an earlier attempt of this job holds stale lines: start clean.
            if path.is_symlink() or (path.exists() and not path.is_dir()):
                path.unlink()
            elif path.exists():
                shutil.rmtree(path)
            path.mkdir(mode=0o700)
            if owner_uid is not None and os.geteuid() == 0:
                os.chown(path, owner_uid, -1)
            self.tails[job_id] = JobTail(job_id, target, owner_uid)
        return {METRICS_ENV: str(target), PREEMPTED_ENV: str(path / PREEMPTED_FILE_NAME)}

    def note_preempted(self, job_id: str, reason: str) -> None:
        """Write why the job is preempted to its $TRELLIS_PREEMPTED_FILE. The directory is
        the job's user's, and this daemon is root: the file is opened without following a
        symbolic link, without blocking on a FIFO and without truncating, and emptied and
        written only if it is a regular file with no other name (a hard link the user made
        to someone else's file is left alone)."""
        if not is_valid_name(job_id):
            return
        path = self.root / job_id / PREEMPTED_FILE_NAME
        flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
        try:
            fd = os.open(path, flags, 0o644)
        except OSError as exc:  # the job's directory is gone, or a link stands there
            log.warning("job=%s preemption notice not written: %s", job_id, exc)
            return
        try:
            found = os.fstat(fd)
            if not stat.S_ISREG(found.st_mode) or found.st_nlink != 1:
                log.warning("job=%s preemption notice not written: %s is not a plain file",
                            job_id, path)
                return
            os.ftruncate(fd, 0)
            os.write(fd, (reason.replace("\n", " ") + "\n").encode()[:1024])
        finally:
            os.close(fd)

    def adopt(self) -> None:
        """After a noded restart: keep watching the directories of jobs still running."""
        for entry in sorted(self.root.iterdir()):
            if not is_valid_name(entry.name) or entry.name in self.tails:
                continue
            if self.job_running(entry.name):
                try:
                    uid = entry.lstat().st_uid
                except OSError:
                    continue
                with self._lock:
                    self.tails[entry.name] = JobTail(
                        entry.name, entry / METRICS_FILE_NAME, uid, seen_running=True)
            else:
                shutil.rmtree(entry, ignore_errors=True)

    def poll(self) -> list[JobMetric]:
        """Read every job's file once; forget jobs that have ended (after a last read)."""
        events: list[JobMetric] = []
        with self._lock:
            tails = list(self.tails.items())
        for job_id, tail in tails:
            running = self.job_running(job_id)
            if running:
                tail.seen_running = True
            else:
                tail.polls_not_running += 1
            bad_before = tail.bad_lines
            tail.read()
            if tail.bad_lines != bad_before:
                log.info("job=%s metrics_lines_skipped=%d total_skipped=%d", job_id,
                         tail.bad_lines - bad_before, tail.bad_lines)
            events.extend(tail.drain())
            if not running and (tail.seen_running or tail.polls_not_running > 3):
                with self._lock:
                    if self.tails.get(job_id) is not tail:
                        continue  # the job id was started again meanwhile
                    del self.tails[job_id]
                    shutil.rmtree(self.root / job_id, ignore_errors=True)
        return events

    async def run(self, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        while not stop.is_set():
            try:
                # File reads are bounded but still I/O: keep them off the event loop.
                events = await loop.run_in_executor(None, self.poll)
            except Exception:  # never let a job's file take the daemon down
                log.exception("metrics poll failed")
                events = []
            for event in events:
                await self.send("job_metric", encode(event))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.interval_s)
