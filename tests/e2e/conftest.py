from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from demo.cluster import LocalCluster
from demo.harness import scratch_dir


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory every job user can write to (pytest's tmp_path is private to root)."""
    with scratch_dir("trellis-test-", mode=0o777) as root:
        yield root


@pytest.fixture
def make_cluster(shared_dir: Path) -> Iterator:
    with contextlib.ExitStack() as clusters:

        def make(**kw: object) -> LocalCluster:
            prefix = f"trellis-test-{uuid.uuid4().hex[:6]}"
            cluster = clusters.enter_context(
                LocalCluster(shared_dir / prefix, prefix=prefix, **kw))  # type: ignore[arg-type]
            cluster.start()
            return cluster

        yield make
