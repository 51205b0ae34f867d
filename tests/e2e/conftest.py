from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from demo.cluster import LocalCluster


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory every job user can write to (pytest's tmp_path is private to root)."""
    root = Path(tempfile.mkdtemp(prefix="trellis-test-"))
    os.chmod(root, 0o777)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def make_cluster(shared_dir: Path) -> Iterator:
    made: list[LocalCluster] = []

    def make(**kw: object) -> LocalCluster:
        prefix = f"trellis-test-{uuid.uuid4().hex[:6]}"
        cluster = LocalCluster(shared_dir / prefix, prefix=prefix, **kw)  # type: ignore[arg-type]
        made.append(cluster)
        cluster.start()
        return cluster

    yield make
    for cluster in made:
        cluster.close()
