"""Shared test fixtures. Tests that need root use ``needs_root``; CI runs as root."""

from __future__ import annotations

import os
import uuid

import pytest

from tests.pgfixtures import pg_url, postgres, store_factory  # noqa: F401  (PostgreSQL journal)

needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="needs root: creates real cgroups / network namespaces"
)


@pytest.fixture
def unique_name() -> str:
    """A name for anything a test creates on the system: always prefixed trellis-test-."""
    return f"trellis-test-{uuid.uuid4().hex[:8]}"
