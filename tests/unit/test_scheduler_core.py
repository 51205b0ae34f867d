from __future__ import annotations

import pytest

from masterd.core.policies.fifo import FifoPolicy
from masterd.core.policy import Preempt, Start
from masterd.core.scheduler import JobError, SchedulingCore
from shared.model import JobState
from tests.unit.helpers import inventory, job


@pytest.fixture
def core() -> SchedulingCore:
    c = SchedulingCore(FifoPolicy())
    c.node_up(inventory("a", gpus=4, cpus=8))
    c.node_up(inventory("b", gpus=4, cpus=8))
    return c


def test_lifecycle_single_node(core: SchedulingCore) -> None:
    core.submit(job("j1", gpus=2, t=0))
    [d] = core.schedule(1)
    assert isinstance(d, Start)
    node = d.placement.nodes[0]
    assert core.jobs["j1"].state is JobState.STARTING
    t = core.node_started("j1", node, 2)
    assert t is not None and t.state is JobState.RUNNING
    t, stop = core.node_exited("j1", node, 0, None, 5)
    assert t is not None and t.state is JobState.FINISHED and stop == []
    assert core.jobs["j1"].queued_seconds == 2
    assert core.cluster.node(node).free_gpus == frozenset(range(4))  # type: ignore[union-attr]


def test_failed_rank_stops_the_others(core: SchedulingCore) -> None:
    core.submit(job("wide", gpus=8, t=0))
    [d] = core.schedule(1)
    assert isinstance(d, Start) and len(d.placement.nodes) == 2
    for n in d.placement.nodes:
        core.node_started("wide", n, 2)
    first, second = d.placement.nodes
    t, stop = core.node_exited("wide", first, 3, None, 4)
    assert t is None and stop == [second]
    t, stop = core.node_exited("wide", second, None, 15, 5)
    assert t is not None and t.state is JobState.FAILED
    assert core.jobs["wide"].exit_code == 3


def test_start_failure_requeues_at_the_head(core: SchedulingCore) -> None:
    core.submit(job("j1", gpus=8, t=0))
    core.submit(job("j2", gpus=1, t=1))
    [d] = core.schedule(1)
    assert d.job_id == "j1"
    core.start_failed("j1", "node refused", 2)
    assert [j.id for j in core.queue()] == ["j1", "j2"]
    assert core.cluster.node("a").free_gpus == frozenset(range(4))  # type: ignore[union-attr]


def test_preemption_requeues_ahead_of_older_jobs(core: SchedulingCore) -> None:
    core.submit(job("old", gpus=8, t=0))
    [d] = core.schedule(1)
    for n in d.placement.nodes:  # type: ignore[union-attr]
        core.node_started("old", n, 1)
    core.submit(job("waiting", gpus=1, t=0.5))
    core.policy = type("P", (), {"name": "p", "decide": lambda s, *a: [Preempt("old", "x")]})()
    assert core.schedule(2) == [Preempt("old", "x")]
    for n in ("a", "b"):
        t, _ = core.node_exited("old", n, None, 15, 3)
    assert t is not None and t.state is JobState.QUEUED
    assert [j.id for j in core.queue()] == ["old", "waiting"]


def test_cancel(core: SchedulingCore) -> None:
    core.submit(job("q", gpus=8, t=0))
    core.submit(job("r", gpus=1, t=1))
    core.schedule(1)
    t, stop = core.cancel("r", 2)
    assert t is not None and t.state is JobState.CANCELLED and stop == []
    t, stop = core.cancel("q", 2)
    assert t is None and sorted(stop) == ["a", "b"]
    for n in stop:
        t, _ = core.node_exited("q", n, None, 15, 3)
    assert t is not None and t.state is JobState.CANCELLED
    with pytest.raises(JobError, match="already ended"):
        core.cancel("q", 4)
    with pytest.raises(JobError, match="does not exist"):
        core.cancel("nope", 4)


def test_unsatisfiable_jobs_are_refused(core: SchedulingCore) -> None:
    with pytest.raises(JobError, match="asks for 9 GPUs but the cluster has 8"):
        core.check_submittable(job("x", gpus=9).spec)
    with pytest.raises(JobError, match="cannot be split evenly"):
        core.check_submittable(job("x", gpus=7).spec)


def test_node_down_keeps_jobs_but_places_nothing(core: SchedulingCore) -> None:
    core.submit(job("j1", gpus=4, t=0))
    [d] = core.schedule(1)
    node = d.placement.nodes[0]  # type: ignore[union-attr]
    other = "b" if node == "a" else "a"
    core.node_down(other)
    core.submit(job("j2", gpus=4, t=1))
    assert core.schedule(2) == []
    assert core.cluster.allocation("j1") is not None
    core.node_up(inventory(other, gpus=4, cpus=8))
    assert [d.job_id for d in core.schedule(3)] == ["j2"]


def test_cores_change_while_running(core: SchedulingCore) -> None:
    from masterd.core.cluster import AllocationError

    core.submit(job("t", gpus=1, cpus=4, t=0))
    [d] = core.schedule(1)
    node = d.placement.nodes[0]  # type: ignore[union-attr]
    held = d.placement.allocations[0].cpus  # type: ignore[union-attr]
    core.node_started("t", node, 1)
    core.cores_changed("t", node, held[:2])
    view = core.cluster.node(node)
    assert view is not None and set(held[2:]) <= view.free_cpus
    assert core.jobs["t"].placement.allocations[0].cpus == held[:2]  # type: ignore[union-attr]
    core.submit(job("u", gpus=1, cpus=6, t=2))
    core.schedule(3)  # takes the freed cores
    with pytest.raises(AllocationError, match="not free"):
        core.cores_changed("t", node, tuple(range(8)))


def test_repeated_start_failures_fail_the_job(core: SchedulingCore) -> None:
    core.submit(job("j", gpus=1, t=0))
    for attempt in range(1, 4):
        assert len(core.schedule(attempt)) == 1
        t = core.start_failed("j", "user refused", attempt)
        assert t is not None
    assert t.state is JobState.FAILED and "gave up after 3 failed starts" in t.reason
    assert core.schedule(10) == [] and not core.queue()


def test_a_job_that_finishes_while_being_preempted_is_finished(core: SchedulingCore) -> None:
    core.submit(job("j", gpus=1, t=0))
    [d] = core.schedule(1)
    node = d.placement.nodes[0]  # type: ignore[union-attr]
    core.node_started("j", node, 1)
    core.policy = type("P", (), {"name": "p", "decide": lambda s, *a: [Preempt("j", "x")]})()
    core.submit(job("k", gpus=1, t=1))
    core.schedule(2)
    t, _ = core.node_exited("j", node, 0, None, 3)
    assert t is not None and t.state is JobState.FINISHED
    assert "finished before its preemption" in core.jobs["j"].reason
