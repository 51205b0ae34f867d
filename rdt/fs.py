"""The one seam between Resctrl and the mount: reads, writes, mkdir/rmdir and the flock.

Writes, mkdir and rmdir go through shared.kernelfs.KernelWriter (path-root checks, no-op skip,
logging). On a real mount the kernel gives these operations their meaning (mkdir allocates a
CLOSID, a schemata write updates only the named cache ids, ...). rdt.emulated.EmulatedFs
subclasses this to add that meaning on a plain directory tree; nothing else differs.
"""

from __future__ import annotations

import errno
import fcntl
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rdt.errors import LockTimeout
from shared.kernelfs import KernelWriter

LOCK_TIMEOUT_S = 10.0
_LOCK_POLL_S = 0.01


class ResctrlFs:
    def __init__(self, root: Path, writer: KernelWriter) -> None:
        self.root = Path(os.path.abspath(root))
        if not any(self.root == r or r in self.root.parents for r in writer.roots):
            raise ValueError(f"KernelWriter roots {writer.roots} do not cover {self.root}")
        self.writer = writer
        self._mutex = threading.RLock()
        self._lock_fd: int | None = None
        self._lock_depth = 0

    # Reads -----------------------------------------------------------------------------------
    def read_text(self, path: Path) -> str:
        return self.writer.read(path)

    def listdir(self, path: Path) -> list[str]:
        return sorted(os.listdir(path))

    def is_dir(self, path: Path) -> bool:
        return path.is_dir()

    # Changes ---------------------------------------------------------------------------------
    def mkdir(self, path: Path, *, what: str) -> bool:
        return self.writer.mkdir(path, what=what)

    def rmdir(self, path: Path, *, what: str) -> bool:
        return self.writer.rmdir(path, what=what)

    def write(self, path: Path, value: str, *, what: str, compare: bool = True) -> bool:
        return self.writer.write(path, value, what=what, compare=compare)

    # Locking ---------------------------------------------------------------------------------
    @contextmanager
    def lock(self, timeout: float = LOCK_TIMEOUT_S) -> Iterator[None]:
        """Exclusive flock on the resctrl root, as resctrl.rst recommends for multi-step changes.

        Re-entrant within this object: flock locks belong to an open file description, so a
        nested second open+flock from the same process would wait on itself forever.
        """
        if not self._mutex.acquire(timeout=timeout):
            raise LockTimeout(f"waited {timeout:.1f}s for the resctrl lock held by another thread")
        try:
            if self._lock_depth == 0:
                self._lock_fd = self._flock(timeout)
            self._lock_depth += 1
            try:
                yield
            finally:
                self._lock_depth -= 1
                if self._lock_depth == 0 and self._lock_fd is not None:
                    fd, self._lock_fd = self._lock_fd, None
                    try:
                        fcntl.flock(fd, fcntl.LOCK_UN)
                    finally:
                        os.close(fd)
        finally:
            self._mutex.release()

    def _flock(self, timeout: float) -> int:
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        deadline = time.monotonic() + timeout
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    return fd
                except OSError as exc:
                    if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                        raise
                if time.monotonic() >= deadline:
                    raise LockTimeout(
                        f"another process held the flock on {self.root} for over {timeout:.1f}s"
                    )
                time.sleep(_LOCK_POLL_S)
        except BaseException:
            os.close(fd)
            raise
