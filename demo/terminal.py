"""A command on a pseudo-terminal of our own, as a user's shell runs it: its controlling
terminal, so it may go raw and gets SIGWINCH when we resize. tests/e2e/test_interactive.py
and bench/interactive.py drive ``trellisctl run --pty`` through it."""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import signal
import struct
import subprocess
import termios
import time
from pathlib import Path

# How long expect and wait look by default before they fail. Long: a loaded machine is slow
# to show anything, and a condition met returns at once, however long the deadline.
DEADLINE_S = 120.0


class Terminal:
    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path,
                 rows: int = 24, cols: int = 80) -> None:
        self.master, slave = os.openpty()
        fcntl.ioctl(self.master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        self.before = termios.tcgetattr(self.master)  # the pair's settings, before the command

        def controlling() -> None:
            os.setsid()
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)

        try:
            self.proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave,
                                         cwd=cwd, env=env, preexec_fn=controlling)
        except BaseException:
            os.close(self.master)
            raise
        finally:
            os.close(slave)
        self.seen = b""
        self.pos = 0  # where the next expect looks from

    def expect(self, token: bytes, timeout: float = DEADLINE_S) -> bytes:
        """What the terminal showed since the last expect, up to and with ``token``."""
        deadline = time.monotonic() + timeout
        while token not in self.seen[self.pos:]:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self.master], [], [], max(0.0, left))
            if not ready:
                raise AssertionError(f"no {token!r} within {timeout} s; the terminal shows "
                                     f"{self.seen[-2000:]!r}")
            try:
                self.seen += os.read(self.master, 65536)
            except OSError:
                raise AssertionError(f"the terminal closed before {token!r}; it showed "
                                     f"{self.seen[-2000:]!r}") from None
        start, self.pos = self.pos, self.seen.index(token, self.pos) + len(token)
        return self.seen[start:self.pos]

    def type(self, text: bytes) -> None:
        os.write(self.master, text)

    def resize(self, rows: int, cols: int) -> None:
        # The kernel sends the command SIGWINCH: it is this terminal's foreground process.
        fcntl.ioctl(self.master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

    def wait(self, timeout: float = DEADLINE_S) -> int:
        """The command's exit status, once it exited and everything it wrote before is in
        ``seen``."""
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None:  # keep reading: a full terminal would block it
            if time.monotonic() > deadline:
                raise AssertionError(f"the command still runs; the terminal shows "
                                     f"{self.seen[-2000:]!r}")
            ready, _, _ = select.select([self.master], [], [], 0.1)
            if ready:
                with contextlib.suppress(OSError):
                    self.seen += os.read(self.master, 65536)
        # What it wrote just before it exited may not have been read yet (a loaded machine
        # hands it on late): read up to the end of the terminal, which Linux reports (EIO)
        # only once the last writer is gone and all it wrote was read.
        while True:
            ready, _, _ = select.select([self.master], [], [],
                                        max(0.0, deadline - time.monotonic()))
            if not ready:
                break  # someone else still holds the terminal open: what came is all
            try:
                more = os.read(self.master, 65536)
            except OSError:
                break
            if not more:
                break
            self.seen += more
        return self.proc.returncode

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        if self.master >= 0:
            os.close(self.master)
            self.master = -1

    def __enter__(self) -> Terminal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
