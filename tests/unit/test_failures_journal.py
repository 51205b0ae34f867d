"""The failure features' tables on both backends (SQLite, and PostgreSQL for an HA master):
nodes down and GPU faults, each written with its event in one transaction, read back whole
after the journal is opened again."""

from __future__ import annotations

from collections.abc import Callable

from masterd.journal.failures import (
    GpuFault,
    clear_down,
    clear_fault,
    ensure_schema,
    load_down,
    load_faults,
    save_down,
    save_fault,
)
from masterd.journal.store import Store


def test_failure_tables_on_both_backends(store_factory: Callable[[], Store]) -> None:
    store = store_factory()
    try:
        ensure_schema(store)
        save_down(store, "g1", 10.0, "node g1 lost", (10.0, None, "g1", "node_down",
                                                      {"jobs": ["a"]}))
        save_down(store, "g2", 11.0, "node g2 lost", (11.0, None, "g2", "node_down", {}))
        clear_down(store, "g2", (12.0, None, "g2", "node_returned", {"down_s": 1.0}))
        fatal = GpuFault(79, "Xid 79 (GPU has fallen off the bus)", True, 13.0)
        save_fault(store, "g1", 3, fatal, (13.0, None, "g1", "gpu_fault", {"gpu": 3}))
        save_fault(store, "g1", 1, GpuFault(None, "GPU is lost", True, 14.0),
                   (14.0, None, "g1", "gpu_fault", {"gpu": 1}))
        save_fault(store, "g2", 0, GpuFault(63, "Xid 63", False, 15.0),
                   (15.0, None, "g2", "gpu_fault", {"gpu": 0}))
        clear_fault(store, "g2", 0, (16.0, None, "g2", "gpu_reset", {"gpu": 0}))
    finally:
        store.close()
    again = store_factory()
    try:
        assert load_down(again) == {"g1": (10.0, "node g1 lost")}
        assert load_faults(again) == {("g1", 3): fatal,
                                      ("g1", 1): GpuFault(None, "GPU is lost", True, 14.0)}
        assert [e.kind for e in again.events()] == [
            "node_down", "node_down", "node_returned", "gpu_fault", "gpu_fault", "gpu_fault",
            "gpu_reset"]
    finally:
        again.close()
