"""The hold rule (``sched2-hold``): the shortest window job packing places on its fewest
servers, else "no job"."""

from __future__ import annotations

import pytest

from masterd.core.cluster import ClusterState
from masterd.core.policies import make_policy
from masterd.core.policy import Start
from shared.model import Job
from tests.unit.helpers import inventory, job
from tests.unit.test_sched2_baselines import _on, modeldb, timed


def started(jobs: list[Job], free: dict[str, int], **options: object) -> list[str]:
    policy = make_policy("sched2-hold", modeldb=modeldb(), **options)
    state = ClusterState()
    for node, count in free.items():
        state.upsert_node(inventory(node, gpus=8))
        if count < 8:
            state.allocate(f"hold-{node}", _on(node, 8 - count))
    return [d.job_id for d in policy.decide(state.snapshot({}), jobs, 10.0)
            if isinstance(d, Start)]


def test_the_shortest_job_with_its_best_locality_goes_first() -> None:
    jobs = [timed("long1", 1, 9000, t=0), timed("short4", 4, 100, t=1),
            timed("mid2", 2, 1000, t=2)]
    # 4 + 4 free: short4 packs on one server, then mid2 fits the other, then long1 does.
    assert started(jobs, {"a": 4, "b": 4}) == ["short4", "mid2", "long1"]


def test_a_job_packing_would_spread_is_held_and_gpus_stay_free() -> None:
    # 2 + 2 free: the 4-GPU job would span two servers; the rule says "no job" for it ...
    assert started([timed("four", 4, 100, model="sensitive")], {"a": 2, "b": 2}) == []
    # ... but still starts the jobs that do get their best locality.
    jobs = [timed("four", 4, 100, t=0), timed("two", 2, 5000, t=1)]
    assert started(jobs, {"a": 2, "b": 2}) == ["two"]


def test_the_window_limits_the_choice_and_zero_means_the_whole_queue() -> None:
    jobs = [timed(f"big{i}", 8, 10, t=i) for i in range(3)] + [timed("one", 1, 50, t=9)]
    assert started(jobs, {"a": 4}, window=3) == []  # "one" is outside the window
    assert started(jobs, {"a": 4}, window=4) == ["one"]
    assert started(jobs, {"a": 4}, window=0) == ["one"]


def test_cpu_jobs_start_first_come_first_served() -> None:
    assert started([job("cpu", gpus=0, cpus=2)], {"a": 0}) == ["cpu"]


@pytest.mark.parametrize("bad", [-1, 1.5, True, "10"])
def test_a_bad_window_is_refused_in_one_sentence(bad: object) -> None:
    with pytest.raises(ValueError, match="window must be a whole number >= 0"):
        make_policy("sched2-hold", window=bad)
