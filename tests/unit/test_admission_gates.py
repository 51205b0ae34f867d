"""The core's admission gates and its stop path: the layer holds, dependencies, time-limit
caps and quotas share, and the ``end_as`` rule by which a stopped job ends in its own
state (cancelled, timeout)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from masterd.core.policies.fifo import FifoPolicy
from masterd.core.policy import Start
from masterd.core.scheduler import JobError, SchedulingCore
from shared.model import JobState, WaitReason
from tests.unit.helpers import inventory, job


def core_with_node(gpus: int = 2) -> SchedulingCore:
    core = SchedulingCore(FifoPolicy())
    core.node_up(inventory("n1", gpus=gpus, cpus=8))
    return core


def started(decisions: list) -> list[str]:
    return [d.job_id for d in decisions if isinstance(d, Start)]


def test_a_gated_job_is_out_of_the_policys_queue_until_every_gate_opens() -> None:
    core = core_with_node()
    core.submit(job("a", gpus=1, t=1))
    core.submit(job("b", gpus=1, t=2))
    core.set_gate("a", WaitReason.HELD, "held by nobody")
    core.set_gate("a", WaitReason.DEPENDENCY, "waits for x")
    a = core.jobs["a"]
    assert a.state is JobState.QUEUED
    assert [j.id for j in core.queue()] == ["b"]
    assert set(core.blocked()) == {"a"}
    # The first gate in the vocabulary's order is the one reported.
    assert (a.wait, a.reason) == ("held", "held by nobody")
    core.set_gate("a", WaitReason.HELD, None)
    assert (a.wait, a.reason) == ("dependency", "waits for x")
    assert [j.id for j in core.queue()] == ["b"]
    core.set_gate("a", WaitReason.DEPENDENCY, None)
    assert (a.wait, a.reason) == ("", "")
    # Back at its place by submission time, ahead of b.
    assert [j.id for j in core.queue()] == ["a", "b"]
    assert started(core.schedule(10)) == ["a", "b"]


def test_opening_a_gate_that_is_not_closed_changes_nothing() -> None:
    core = core_with_node()
    core.submit(job("a", gpus=1))
    core.set_gate("a", WaitReason.HELD, None)
    assert [j.id for j in core.queue()] == ["a"]


def test_only_a_queued_job_can_be_gated_and_only_by_a_known_reason() -> None:
    core = core_with_node()
    core.submit(job("a", gpus=1))
    core.schedule(0)
    with pytest.raises(JobError, match="only a queued job"):
        core.set_gate("a", WaitReason.HELD, "no")
    with pytest.raises(JobError, match="does not exist"):
        core.set_gate("zz", WaitReason.HELD, "no")
    core.submit(job("b", gpus=1))
    with pytest.raises(ValueError, match="not a wait reason"):
        core.set_gate("b", "whim", "no")


def test_a_gated_job_can_be_cancelled_and_then_forgotten() -> None:
    core = core_with_node()
    core.submit(job("a", gpus=1))
    core.set_gate("a", WaitReason.HELD, "held")
    transition, nodes = core.cancel("a", 5)
    assert transition is not None and transition.state is JobState.CANCELLED
    assert nodes == [] and not core.blocked()
    assert core.forget("a").id == "a"


def test_a_job_stopped_as_timeout_ends_timeout_however_it_exits() -> None:
    core = core_with_node()
    core.submit(job("a", gpus=1))
    core.schedule(0)
    core.node_started("a", "n1", 1)
    transition, nodes = core.stop("a", JobState.TIMEOUT, "time limit 0:01:00 reached", 61)
    assert transition is None and nodes == ["n1"]
    # SIGTERM made it exit 0: still a timeout, not finished.
    transition, _ = core.node_exited("a", "n1", 0, None, 62)
    assert transition is not None
    assert transition.state is JobState.TIMEOUT
    assert transition.reason == "time limit 0:01:00 reached"
    assert JobState.TIMEOUT.terminal
    assert core.cluster.allocation("a") is None


def test_a_queued_job_stopped_ends_at_once_and_a_live_state_is_refused() -> None:
    core = core_with_node()
    core.submit(job("a", gpus=1))
    with pytest.raises(ValueError):
        core.stop("a", JobState.RUNNING, "no", 1)
    transition, _ = core.stop("a", JobState.TIMEOUT, "limit", 1)
    assert transition is not None and transition.state is JobState.TIMEOUT
    assert not core.queue()


def test_priority_orders_the_queue_and_reorder_follows_a_change() -> None:
    core = core_with_node(gpus=0)
    core.submit(job("a", gpus=0, cpus=1, t=1))
    core.submit(job("b", gpus=0, cpus=1, t=2, priority=5))
    assert [j.id for j in core.queue()] == ["b", "a"]
    a = core.jobs["a"]
    a.spec = replace(a.spec, priority=10)
    core.reorder("a")
    assert [j.id for j in core.queue()] == ["a", "b"]
