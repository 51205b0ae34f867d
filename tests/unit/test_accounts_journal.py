"""The journalled account tree (masterd/journal/accounts.py) on both journals: nothing until
written, then exactly what was written, replaced whole by the next write (with its event)."""

from __future__ import annotations

from pathlib import Path

from masterd.journal.accounts import create_tables, read_tree, write_tree
from masterd.journal.pgstore import PgStore
from masterd.journal.store import Store
from shared.accounts import Account, AccountCaps, Resources
from tests.pgfixtures import Leadership

TREE = [Account("org", quota=Resources(gpus=8)),
        Account("vision", parent="org", users=("alice",), borrowing_limit=Resources(gpus=4),
                caps=AccountCaps(running_jobs=3, time_limit_s=3600))]


def round_trip(store: Store) -> None:
    create_tables(store)
    create_tables(store)  # idempotent: every start runs it
    assert read_tree(store) is None
    write_tree(store, TREE, 1.0, None)
    assert read_tree(store) == TREE
    write_tree(store, TREE[:1], 2.0, (2.0, None, None, "account_changed", {"action": "remove"}))
    assert read_tree(store) == TREE[:1]
    assert [e.kind for e in store.events(None, 0, 10)] == ["account_changed"]


def test_sqlite(tmp_path: Path) -> None:
    store = Store(tmp_path / "master.db")
    try:
        round_trip(store)
    finally:
        store.close()


def test_postgresql(pg_url: str) -> None:
    leader = Leadership(pg_url)
    store = PgStore(pg_url, leader.epoch)
    try:
        round_trip(store)
    finally:
        store.close()
        leader.close()
