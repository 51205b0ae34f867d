"""Pseudo-terminals of the jobs that asked for one (``launch.pty``: ``trellisctl run --pty``).

noded allocates the pair as it starts the part: the slave side goes to the shim, which makes
it the job's controlling terminal (noded/shim.py, ``run_on_terminal``); the master side stays
here, where the relay reads and writes it (noded/relays.py) while a client is attached. When
nobody is attached nothing reads it: the kernel's terminal buffer fills and the job blocks
on its next write, as a shell does on a terminal nobody reads.

The master side lives in noded's memory only: a noded restart closes it, which hangs the
terminal up (the job's session gets SIGHUP, as when an ssh connection drops).
"""

from __future__ import annotations

import fcntl
import logging
import os
import struct
import termios

log = logging.getLogger("trellis.node.terminals")

DEFAULT_ROWS, DEFAULT_COLS = 24, 80


def set_size(fd: int, rows: int, cols: int) -> None:
    """Set a terminal's window size; the kernel sends SIGWINCH to its foreground group."""
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


class Terminals:
    """job id -> the master side of its pseudo-terminal."""

    def __init__(self) -> None:
        self._masters: dict[str, int] = {}

    def allocate(self, job_id: str, uid: int, gid: int) -> int:
        """A new pseudo-terminal for the job; returns its slave side (the caller passes it
        to the shim and closes its own copy). The slave belongs to the job's user, as
        login(1) makes a user's terminal theirs (mesg, write, opening /dev/tty)."""
        self.close(job_id)
        master, slave = os.openpty()
        try:
            os.set_inheritable(master, False)
            set_size(master, DEFAULT_ROWS, DEFAULT_COLS)
            if os.geteuid() == 0:
                os.fchown(slave, uid, gid)
                os.fchmod(slave, 0o620)
        except OSError:
            os.close(master)
            os.close(slave)
            raise
        self._masters[job_id] = master
        log.info("job=%s terminal %s allocated", job_id, os.ttyname(slave))
        return slave

    def master(self, job_id: str) -> int | None:
        return self._masters.get(job_id)

    def close(self, job_id: str) -> None:
        """Close noded's master side (the part is gone; a relay reading a copy of it still
        drains what the job wrote last)."""
        fd = self._masters.pop(job_id, None)
        if fd is not None:
            os.close(fd)

    def close_all(self) -> None:
        for job_id in list(self._masters):
            self.close(job_id)
