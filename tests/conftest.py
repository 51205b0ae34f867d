"""Shared test fixtures. Tests that need root use ``needs_root``; CI runs as root."""

from __future__ import annotations

import os
import uuid

import pytest

from demo.harness import sweep_stale_cgroups
from tests.pgfixtures import pg_url, postgres, store_factory  # noqa: F401  (PostgreSQL journal)

needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="needs root: creates real cgroups / network namespaces"
)


@pytest.fixture(scope="session", autouse=True)
def no_stale_test_cgroups() -> None:
    """A run killed outright (SIGKILL, a restarted machine) cannot remove its cgroups; the
    next run removes those that hold no process and are older than a few minutes. A test's
    own groups are its fixtures' to remove, so a leak of this run still shows."""
    if os.geteuid() == 0:
        sweep_stale_cgroups("trellis-test-")


@pytest.fixture
def unique_name() -> str:
    """A name for anything a test creates on the system: always prefixed trellis-test-."""
    return f"trellis-test-{uuid.uuid4().hex[:8]}"
