"""The progress channel: how a job drives the emulated GPU utilisation it reports.

Protocol (the whole of it):

* The daemon puts ``TRELLIS_PROGRESS_FILE=<dir>/<job id>/progress`` in the job's environment
  (from ``GpuBackend.job_env``). The directory exists and is writable by the job.
* The job writes its iteration counter there as decimal text, e.g. ``1234\\n``, rewriting the
  whole file after each iteration (or every few). Writing to a temporary file and renaming it
  over ``progress`` avoids torn reads, but a torn or empty read is simply skipped.
* Each time the daemon samples, it reads the counter. The job's *rate* is the counter increase
  over the last ``window_s`` seconds divided by the time between the two readings (measured only
  once the readings are at least ``min_interval_s`` apart). Its *peak* is the highest rate seen
  so far. Utilisation = 100 * rate / peak, which lies in 0..100.
* A counter that goes backwards means the job restarted counting: history and peak reset.

So a job running at full speed reports ~100%, one slowed to half speed (fewer CPU cores,
memory-bandwidth contention) reports ~50%, and a stalled one 0%: the signal SODA's CPU tuner
and contention detector read from a real GPU. A job that never writes the file is treated as
busy at the backend's ``busy_util`` while its processes live.
"""

from __future__ import annotations

import os
import stat
from collections import deque
from pathlib import Path

PROGRESS_ENV = "TRELLIS_PROGRESS_FILE"
PROGRESS_FILE_NAME = "progress"
MAX_PROGRESS_BYTES = 64  # an integer counter; anything longer is not one


def read_job_file(path: Path, max_bytes: int) -> bytes | None:
    """At most ``max_bytes`` of a file a job writes, or None when absent, unreadable, not a
    regular file or longer.

    The file belongs to the job, i.e. to an untrusted user: no symlinks followed, nothing but a
    regular file read (a FIFO would block the daemon), and at most a few bytes.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = os.read(fd, max_bytes + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    return data if len(data) <= max_bytes else None


def read_counter(path: Path) -> int | None:
    """The counter in ``path``, or None when absent, unreadable or not a counter."""
    data = read_job_file(path, MAX_PROGRESS_BYTES)
    if data is None:
        return None
    text = data.strip()
    if not text.isdigit():
        return None
    return int(text)


class ProgressMeter:
    """Windowed iteration rate and peak rate of one job (see the module docstring)."""

    def __init__(self, path: Path, window_s: float = 10.0, min_interval_s: float = 1.0) -> None:
        self.path = path
        self.window_s = window_s
        self.min_interval_s = min_interval_s
        self._readings: deque[tuple[float, int]] = deque(maxlen=4096)
        self.rate: float | None = None
        self.peak = 0.0

    @property
    def seen(self) -> bool:
        """Whether the job has ever written a counter."""
        return bool(self._readings)

    def update(self, now: float) -> None:
        counter = read_counter(self.path)
        if counter is None:
            return
        readings = self._readings
        if readings and counter < readings[-1][1]:
            readings.clear()
            self.rate = None
            self.peak = 0.0
        readings.append((now, counter))
        # Keep as anchor the newest reading at or before the window start.
        while len(readings) > 2 and readings[1][0] <= now - self.window_s:
            readings.popleft()
        t0, c0 = readings[0]
        dt = now - t0
        if dt >= self.min_interval_s:
            self.rate = (counter - c0) / dt
            self.peak = max(self.peak, self.rate)

    def utilization(self) -> float | None:
        """0..100, or None before a rate could be measured."""
        if self.rate is None:
            return None
        if self.peak <= 0:
            return 0.0
        return max(0.0, min(100.0, 100.0 * self.rate / self.peak))
