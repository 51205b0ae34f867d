"""Registered inference services in the master's journal, so a restarted master keeps serving.

A service's registration (profile, command, user) is one row; its replicas are ordinary jobs
of kind ``inference`` in the jobs table. Like every store access, these functions run on the
journal's thread (``Journal.call``) or before the event loop starts.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from masterd.journal.store import Store, StoreError
from shared.protocol import pack, unpack

SCHEMA = """
CREATE TABLE IF NOT EXISTS inference_services (
    name TEXT PRIMARY KEY,
    registration BLOB NOT NULL,
    updated REAL NOT NULL
);
"""


def _run(store: Store, sql: str, args: tuple[Any, ...]) -> None:
    try:
        store.db.execute(sql, args)
    except sqlite3.OperationalError as exc:
        if "full" in str(exc).lower():
            raise StoreError("the master's disk is full; the service was not recorded") from exc
        raise StoreError(f"the store could not record the service: {exc}") from exc


def ensure_schema(store: Store) -> None:
    try:
        store.db.executescript(SCHEMA)
    except sqlite3.Error as exc:
        raise StoreError(f"cannot create the inference services table: {exc}") from exc


def save_service(store: Store, name: str, registration: dict[str, Any], now: float) -> None:
    _run(store,
         "INSERT INTO inference_services (name, registration, updated) VALUES (?,?,?) "
         "ON CONFLICT(name) DO UPDATE SET registration=excluded.registration, "
         "updated=excluded.updated", (name, pack(registration), now))


def delete_service(store: Store, name: str) -> None:
    _run(store, "DELETE FROM inference_services WHERE name=?", (name,))


def load_services(store: Store) -> dict[str, dict[str, Any]]:
    ensure_schema(store)
    rows = store.db.execute(
        "SELECT name, registration FROM inference_services ORDER BY name").fetchall()
    return {r["name"]: unpack(r["registration"]) for r in rows}
