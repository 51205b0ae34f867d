"""Helios' journal pieces on both backends: the power tables (a node's state with its event,
busy-node history keeping each step's maximum), and the finished jobs a worker process reads
beside the writer to train QSSF's duration model — SQLite, or PostgreSQL for an HA master."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from masterd.features.helios.trainer import MODEL_FILE, train_duration
from masterd.journal.backends import open_reader
from masterd.journal.helios import (
    create_tables,
    finished_jobs,
    load_history,
    load_power,
    save_history,
    save_power,
)
from masterd.journal.store import Store
from tests.unit.test_helios_estimator import finished_jobs as some_finished_jobs


def test_power_tables_on_both_backends(store_factory: Callable[[], Store]) -> None:
    store = store_factory()
    try:
        create_tables(store)
        save_history(store, 7, busy=3, total=10)
        save_history(store, 7, busy=5, total=9)  # a step keeps its maximum
        save_history(store, 7, busy=4, total=10)
        save_history(store, 8, busy=1, total=10)
        assert load_history(store, 10) == [(7, 5, 10), (8, 1, 10)]
        assert load_history(store, 1) == [(8, 1, 10)]
        save_power(store, "g1", "powered_down", 100.0, "idle",
                   (100.0, None, "g1", "powered_down", {}))
        save_power(store, "g2", "powering_up", 101.0, "a job needs it",
                   (101.0, None, "g2", "powering_up", {}))
        save_power(store, "g1", None, 102.0, "", (102.0, None, "g1", "powered_up", {}))
        assert load_power(store) == {"g2": ("powering_up", 101.0, "a job needs it")}
        assert [e.kind for e in store.events()] == ["powered_down", "powering_up",
                                                    "powered_up"]
    finally:
        store.close()


def test_a_worker_reads_and_trains_from_either_journal(store_factory: Callable[[], Store],
                                                       tmp_path: Path) -> None:
    store = store_factory()
    try:
        store.insert_jobs(some_finished_jobs(60))
        reader = open_reader(store.location)
        try:
            rows = finished_jobs(reader, 50)
        finally:
            reader.close()
        assert len(rows) == 50 and {r.duration_s for r in rows} == {60.0, 7200.0}
        assert rows[0].submit_time < rows[-1].submit_time  # oldest first
        result = train_duration(store.location, str(tmp_path), 100, 10, [])
        assert result["meta"]["jobs"] == 60 and (tmp_path / MODEL_FILE).exists()
    finally:
        store.close()
