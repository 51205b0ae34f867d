"""A job's own output files (sbatch's ``--output``/``--error``), opened by the shim.

The shim opens them before it forks the job, with the job's user's identity (effective uid,
gid and groups, set back afterwards: the shim is single-threaded), so a path the user could
not write is refused exactly as it would be for the job, and a symlink there leads nowhere the
user could not go. They are tees of the job's log (noded/shim.py's LogRelay copies each chunk
it moved into the log), so ``trellisctl logs`` and the file hold the same bytes and a slow or
failing file never blocks the job. A one-node job truncates the file; the parts of a
multi-node job only append to it (they may share it on a shared filesystem, and one part
truncating it could wipe what another already wrote).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def as_user(uid: int, gid: int, groups: list[int]) -> Iterator[None]:
    """Run the block with the user's effective identity (when root; else as we are)."""
    if os.geteuid() != 0 or uid == 0:
        yield
        return
    saved = os.getgroups()
    os.setgroups(groups)
    os.setegid(gid)
    os.seteuid(uid)
    try:
        yield
    finally:
        os.seteuid(0)
        os.setegid(0)
        os.setgroups(saved)


def open_output(path: str, truncate: bool) -> int:
    """The file for writing at its end, created 0644 (less the umask) if missing."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
    if truncate:
        flags |= os.O_TRUNC
    return os.open(path, flags, 0o644)


def open_outputs(spec: dict[str, Any]) -> tuple[int, int]:
    """The launch's ``stdout_file`` and ``stderr_file`` open (-1: none), as the job's user.
    OSError names the file that could not be opened."""
    truncate = not spec.get("append_output", False)
    fds = []
    try:
        with as_user(spec["uid"], spec["gid"], spec.get("groups", [])):
            for key in ("stdout_file", "stderr_file"):
                path = spec.get(key)
                if not path:
                    fds.append(-1)
                    continue
                try:
                    fds.append(open_output(path, truncate))
                except OSError as exc:
                    raise OSError(exc.errno, f"cannot open the output file {path}: "
                                             f"{exc.strerror}") from None
    except BaseException:
        for fd in fds:
            if fd >= 0:
                os.close(fd)
        raise
    return fds[0], fds[1]


class Tee:
    """Copies ranges of the log into an output file; stops (recording why) at the first
    error, the job unaware."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.error = ""

    def copy(self, log_fd: int, offset: int, count: int) -> None:
        if self.fd < 0 or count <= 0:
            return
        try:
            while count > 0:
                data = os.pread(log_fd, min(count, 1 << 20), offset)
                if not data:
                    return
                view = memoryview(data)
                while view:
                    view = view[os.write(self.fd, view):]
                offset += len(data)
                count -= len(data)
        except OSError as exc:
            self.error = exc.strerror or str(exc)
            self.close()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
