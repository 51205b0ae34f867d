"""The store's contract, on both backends (``store_factory``: SQLite and PostgreSQL)."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable

import pytest

from masterd.journal.journal import Journal
from masterd.journal.store import Store
from shared.model import JobState, NodeAllocation, Placement
from tests.unit.helpers import inventory, job


def test_jobs_survive_reopen(store_factory: Callable[[], Store]) -> None:
    store = store_factory()
    j = job("j1", gpus=2, t=5.0)
    store.insert_jobs([(1, j)])
    j.state = JobState.RUNNING
    j.placement = Placement((NodeAllocation("a", (0, 1), (2, 3), 10),))
    j.node_states = {"a": "running"}
    store.update_jobs([j], [(6.0, "j1", "a", "running", {"x": 1})])
    store.save_node(inventory("a"), True, 7.0)
    store.close()

    again = store_factory()
    [loaded] = again.load_jobs()
    assert loaded == j
    assert again.next_seq() == 2
    [(inv, drained, _)] = again.load_nodes()
    assert inv == inventory("a") and drained
    kinds = [e.kind for e in again.events("j1")]
    assert kinds == ["submitted", "running"]


def test_duplicate_id_is_refused(store_factory: Callable[[], Store]) -> None:
    store = store_factory()
    store.insert_jobs([(1, job("j1"))])
    with pytest.raises(sqlite3.IntegrityError, match="UNIQUE"):
        store.insert_jobs([(2, job("j1"))])


async def test_group_commit_isolates_a_bad_row(store_factory: Callable[[], Store]) -> None:
    store = store_factory()
    store.insert_jobs([(1, job("dup"))])
    journal = Journal(store)
    results = await asyncio.gather(
        *(journal.submit(i + 2, job(f"j{i}")) for i in range(50)),
        journal.submit(99, job("dup")),
        return_exceptions=True,
    )
    assert sum(r is None for r in results) == 50
    assert isinstance(results[-1], Exception)
    assert len(store.load_jobs()) == 51
    journal.close()


def test_unplaced_job_rows_match_a_full_encoding_of_the_job() -> None:
    """The cached row data of jobs without placement is byte for byte what encoding every
    field gives, whatever the field values (a cached row for one job never serves another)."""
    import msgpack

    from masterd.journal.store import _job_data

    def full(j: object) -> dict[str, object]:
        return {name: getattr(j, name) for name in (
            "start_time", "end_time", "exit_code", "signal", "reason", "attempts",
            "node_states", "requeue_priority", "stopping", "start_failures", "held", "wait",
            "end_as", "restarts")}

    variants = [{}, {"attempts": 1}, {"stopping": True}, {"start_failures": 1},
                {"reason": "no node has 8 free GPUs"}, {"end_time": 12.5, "exit_code": 1},
                {"end_time": 12.0, "exit_code": 0, "signal": 9}, {"requeue_priority": 2},
                {"held": "user", "wait": "held"}, {"end_as": "timeout"},
                {"restarts": 2}]
    for _ in range(2):  # second round: from the cache
        for fields in variants:
            j = job("cache-probe")
            for name, value in fields.items():
                setattr(j, name, value)
            decoded = msgpack.unpackb(_job_data(j))
            assert decoded == {"placement": None, **full(j)}
            # True and 1 hash alike; the stored value must keep its type.
            assert type(decoded["stopping"]) is bool and type(decoded["attempts"]) is int


def test_restore_and_events_queries(store_factory: Callable[[], Store]) -> None:
    """What a restarting master reads: active jobs plus the newest ended ones, a job's
    events, the tail of the event log, ended jobs in a window, the next sequence number."""
    store = store_factory()
    jobs = [job(f"r{i}", t=float(i)) for i in range(6)]
    store.insert_jobs([(i + 1, j) for i, j in enumerate(jobs)])
    for j, state in zip(jobs, (JobState.FINISHED, JobState.FAILED, JobState.CANCELLED,
                               JobState.RUNNING, JobState.QUEUED, JobState.FINISHED),
                        strict=True):
        j.state = state
    store.update_jobs(jobs, [(10.0 + i, j.id, None, j.state.value, {"i": i})
                             for i, j in enumerate(jobs)])
    restored = [j.id for j in store.restore_jobs(ended=2)]
    assert restored == ["r2", "r3", "r4", "r5"]
    assert [e.kind for e in store.events("r3")] == ["submitted", "running"]
    tail = store.events_tail(None, 3)
    assert [e.job_id for e in tail] == ["r3", "r4", "r5"] and tail[0].detail == {"i": 3}
    assert sorted(j.id for j in store.ended_jobs(submitted_since=1.0)) == ["r1", "r2", "r5"]
    assert store.next_seq() == 7
    assert store.load_job("r4") is not None and store.load_job("nope") is None
    assert store.job_exists("r0") and not store.job_exists("nope")


def test_feature_tables(store_factory: Callable[[], Store]) -> None:
    """The feature tables' queries (upserts, the core history's larger-of) on this backend."""
    from masterd.journal import cores, services

    store = store_factory()
    cores.ensure_schema(store)
    assert cores.remember_cores(store, "alice", "cv", 3, 1.0) == 3
    assert cores.remember_cores(store, "alice", "cv", 2, 2.0) == 3  # the row keeps the largest
    assert cores.remember_cores(store, "alice", "cv", 5, 3.0) == 5
    assert cores.load_history(store) == {("alice", "cv"): 5}
    services.ensure_schema(store)
    services.save_service(store, "svc", {"bs_gpu": 8}, 1.0)
    services.save_service(store, "svc", {"bs_gpu": 16}, 2.0)
    assert services.load_services(store) == {"svc": {"bs_gpu": 16}}
    services.delete_service(store, "svc")
    assert services.load_services(store) == {}
