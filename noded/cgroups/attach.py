"""Joining a group from inside a starting process, before it execs the job's command."""

from __future__ import annotations

import os
from pathlib import Path


def join_group(files: list[Path]) -> None:
    """Write our own pid into each file from ``CgroupManager.attach_files``.

    Meant for a child between fork and exec (``subprocess.Popen(preexec_fn=...)`` or a small
    launcher), so the job's first instruction already runs confined. It is the one write to
    cgroupfs that does not go through KernelWriter: the paths came from the manager, which
    checked them, and the child must not log or allocate more than it has to.
    """
    pid = str(os.getpid()).encode()
    for path in files:
        fd = os.open(path, os.O_WRONLY)
        try:
            os.write(fd, pid)
        finally:
            os.close(fd)
