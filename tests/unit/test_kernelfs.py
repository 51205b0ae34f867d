from __future__ import annotations

from pathlib import Path

import pytest

from shared.kernelfs import KernelWriter


def test_writes_stay_inside_the_roots(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    root.mkdir()
    (tmp_path / "cgx").mkdir()
    writer = KernelWriter([root])
    assert writer.mkdir(root / "job", what="t")
    assert writer.write(root / "job" / "cpus", "0-1", what="t")
    assert not writer.write(root / "job" / "cpus", "0-1\n", what="t")  # no-op skipped
    assert (writer.writes, writer.skipped) == (1, 1)
    for bad in (tmp_path / "cgx" / "f", root / ".." / "cgx" / "f", Path("/etc/passwd")):
        with pytest.raises(PermissionError):
            writer.write(bad, "x", what="t")
    with pytest.raises(PermissionError, match=r"'\.\.'"):
        writer.read(root / "job" / ".." / "job" / "cpus")


def test_root_of_filesystem_as_root(tmp_path: Path) -> None:
    writer = KernelWriter([Path("/")])
    assert writer.read(Path("/proc/self/status"))
