"""Fixtures for the PostgreSQL journal: one private server per test session (started on first
use, stopped at the end or on interruption) and a fresh database per test.

Tests that use them skip, naming the reason, where no server can be run (PostgreSQL not
installed, or no postgres user to run it as root).
"""

from __future__ import annotations

import atexit
from collections.abc import Iterator

import pytest

from demo.pgserver import PgServer, PgUnavailable


@pytest.fixture(scope="session")
def postgres() -> Iterator[PgServer]:
    server = PgServer()
    atexit.register(server.stop)  # an interrupted session still removes it
    try:
        server.start()
    except (PgUnavailable, OSError) as exc:
        server.stop()
        pytest.skip(f"no PostgreSQL server for the HA journal tests: {exc}")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def pg_url(postgres: PgServer) -> str:
    """A new, empty database on the session's server."""
    return postgres.create_database()


class Leadership:
    """This test as the leader of a PostgreSQL journal: the advisory lock held on a
    connection of its own, the lease taken, ``epoch`` the one writes must carry."""

    def __init__(self, url: str) -> None:
        from masterd.journal import lease
        from masterd.journal.pgstore import connect

        self.conn = connect(url, "trellis-test-leader")
        lease.ensure_schema(self.conn)
        assert lease.try_lock(self.conn), "another test holds this database's leader lock"
        self.epoch = lease.take_over(self.conn, "test", "http://test").epoch

    def close(self) -> None:
        self.conn.close()


@pytest.fixture(params=["sqlite", "postgresql"])
def store_factory(request: pytest.FixtureRequest, tmp_path: object):  # type: ignore[no-untyped-def]
    """``() -> Store``: the same journal opened again on each call, on either backend (the
    store's contract tests run on both)."""
    from pathlib import Path

    from masterd.journal.store import Store

    if request.param == "sqlite":
        path = Path(str(tmp_path)) / "m.db"
        return lambda: Store(path)
    from masterd.journal.pgstore import PgStore

    url = request.getfixturevalue("pg_url")
    leader = Leadership(url)
    request.addfinalizer(leader.close)
    return lambda: PgStore(url, leader.epoch)
