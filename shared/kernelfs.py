"""The one executor for every write Trellis makes to kernel pseudo-filesystems.

cgroupfs and resctrl are both "write a string to a file" interfaces. Routing every write through
one object gives one place that (1) refuses paths outside the roots it was given, (2) skips
writes that would not change anything (cheap, and keeps logs meaningful), and (3) logs each
change with what it was for. Tests point it at a fake tree with the kernel's layout.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

log = logging.getLogger("trellis.kernelfs")

T = TypeVar("T")


class KernelWriteError(OSError):
    """A write the kernel refused; the message names the file and the value."""


class KernelWriter:
    def __init__(self, roots: list[Path], logger: logging.Logger | None = None) -> None:
        self.roots = [Path(os.path.abspath(r)) for r in roots]
        self._root_prefixes = [
            (str(r), str(r) if str(r).endswith(os.sep) else str(r) + os.sep) for r in self.roots
        ]
        self.log = logger or log
        self.writes = 0  # changes actually made, for metrics and tests
        self.skipped = 0

    def _check(self, path: Path) -> Path:
        # abspath (not resolve) so a symlink inside the tree cannot smuggle a write elsewhere
        # unnoticed: '..' components are refused, then the prefix must match. String prefixes,
        # not Path.parents: this runs on every cgroup and resctrl read of every pass.
        text = os.fspath(path)
        if ".." in text.split(os.sep):
            raise PermissionError(f"refusing path with '..': {path}")
        full = os.path.abspath(text)
        if not any(full == root or full.startswith(prefix)
                   for root, prefix in self._root_prefixes):
            raise PermissionError(f"refusing to touch {full}: outside {self.roots}")
        return Path(full)

    def read(self, path: Path) -> str:
        return self._check(path).read_text()

    def write(self, path: Path, value: str, *, what: str, compare: bool = True) -> bool:
        """Write ``value`` unless the file already holds it; returns whether it changed.

        ``compare=False`` is for files whose read-back differs from what is written (cgroup
        ``tasks``/``cgroup.procs``, resctrl ``schemata`` line updates).
        """
        full = self._check(path)
        if compare:
            try:
                if full.read_text().strip() == value.strip():
                    self.skipped += 1
                    return False
            except OSError:
                pass
        try:
            with open(full, "w") as f:
                f.write(value)
        except OSError as exc:
            raise KernelWriteError(
                exc.errno or errno.EIO, f"writing {value.strip()!r} to {full} failed: "
                f"{exc.strerror or exc}"
            ) from exc
        self.writes += 1
        self.log.info("kernel write path=%s value=%r why=%s", full, value.strip(), what)
        return True

    def mkdir(self, path: Path, *, what: str) -> bool:
        full = self._check(path)
        try:
            full.mkdir()
        except FileExistsError:
            return False
        self.log.info("kernel mkdir path=%s why=%s", full, what)
        return True

    def rmdir(self, path: Path, *, what: str) -> bool:
        full = self._check(path)
        try:
            full.rmdir()
        except FileNotFoundError:
            return False
        self.log.info("kernel rmdir path=%s why=%s", full, what)
        return True

    def on_dir(self, path: Path, action: Callable[[int], T], *, what: str) -> T:
        """Run ``action`` on a directory descriptor of ``path`` (e.g. attaching a BPF program
        to a cgroup: a kernel change that is no file write), checked and logged like one."""
        full = self._check(path)
        fd = os.open(full, os.O_RDONLY | os.O_DIRECTORY)
        try:
            result = action(fd)
        finally:
            os.close(fd)
        self.writes += 1
        self.log.info("kernel change path=%s why=%s", full, what)
        return result
