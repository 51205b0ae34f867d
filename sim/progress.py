"""A plain-text progress bar on stderr for long replays (no dependency).

On a terminal it redraws one line; otherwise it prints a line every ``quiet_interval`` seconds
so logs of CI runs stay short. It reads the wall clock, which is fine: it observes the
simulator from outside and never feeds anything back into it.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


class ProgressBar:
    def __init__(
        self,
        label: str,
        stream: TextIO | None = None,
        width: int = 30,
        interval: float = 0.5,
        quiet_interval: float = 10.0,
    ) -> None:
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.width = width
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.interval = interval if self.tty else quiet_interval
        self.started = time.monotonic()
        self._last = -1e9
        self._drawn: tuple[int, int] | None = None  # (done, total) last drawn

    def __call__(self, now: float, done: int, total: int) -> None:
        wall = time.monotonic()
        if wall - self._last < self.interval and done < total:
            return
        self._last = wall
        self._draw(now, done, total, wall)

    def _draw(self, now: float, done: int, total: int, wall: float) -> None:
        share = done / total if total else 1.0
        filled = int(share * self.width)
        bar = "#" * filled + "-" * (self.width - filled)
        text = (
            f"{self.label} [{bar}] {share * 100:5.1f}% {done}/{total} jobs "
            f"sim {now / 86400:.2f} d  {wall - self.started:.0f} s"
        )
        if self.tty:
            self.stream.write("\r" + text)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()
        self._drawn = (done, total)

    def close(self, now: float, done: int, total: int) -> None:
        if self._drawn != (done, total):
            self._draw(now, done, total, time.monotonic())
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()
