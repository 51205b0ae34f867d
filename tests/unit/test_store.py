from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from masterd.journal.journal import Journal
from masterd.journal.store import Store
from shared.model import JobState, NodeAllocation, Placement
from tests.unit.helpers import inventory, job


def test_jobs_survive_reopen(tmp_path: Path) -> None:
    store = Store(tmp_path / "m.db")
    j = job("j1", gpus=2, t=5.0)
    store.insert_jobs([(1, j)])
    j.state = JobState.RUNNING
    j.placement = Placement((NodeAllocation("a", (0, 1), (2, 3), 10),))
    j.node_states = {"a": "running"}
    store.update_jobs([j], [(6.0, "j1", "a", "running", {"x": 1})])
    store.save_node(inventory("a"), True, 7.0)
    store.close()

    again = Store(tmp_path / "m.db")
    [loaded] = again.load_jobs()
    assert loaded == j
    assert again.next_seq() == 2
    [(inv, drained, _)] = again.load_nodes()
    assert inv == inventory("a") and drained
    kinds = [e.kind for e in again.events("j1")]
    assert kinds == ["submitted", "running"]


def test_duplicate_id_is_refused(tmp_path: Path) -> None:
    store = Store(tmp_path / "m.db")
    store.insert_jobs([(1, job("j1"))])
    with pytest.raises(Exception, match="UNIQUE"):
        store.insert_jobs([(2, job("j1"))])


async def test_group_commit_isolates_a_bad_row(tmp_path: Path) -> None:
    store = Store(tmp_path / "m.db")
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
            "node_states", "requeue_priority", "stopping", "start_failures")}

    variants = [{}, {"attempts": 1}, {"stopping": True}, {"start_failures": 1},
                {"reason": "no node has 8 free GPUs"}, {"end_time": 12.5, "exit_code": 1},
                {"end_time": 12.0, "exit_code": 0, "signal": 9}, {"requeue_priority": 2}]
    for _ in range(2):  # second round: from the cache
        for fields in variants:
            j = job("cache-probe")
            for name, value in fields.items():
                setattr(j, name, value)
            decoded = msgpack.unpackb(_job_data(j))
            assert decoded == {"placement": None, **full(j)}
            # True and 1 hash alike; the stored value must keep its type.
            assert type(decoded["stopping"]) is bool and type(decoded["attempts"]) is int
