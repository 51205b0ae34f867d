"""The requeue rules (masterd/core/failures.py), SchedulingCore.requeue and the Xid
catalogue (shared/xid.py): plain code, shared by the master and the simulator."""

from __future__ import annotations

import pytest

from masterd.core.failures import (
    RequeueRules,
    jobs_on_gpu,
    jobs_on_node,
    may_requeue,
    verdict,
)
from masterd.core.policies.fifo import FifoPolicy
from masterd.core.policy import Preempt, Start
from masterd.core.scheduler import JobError, SchedulingCore
from shared.model import JobState, StopRules
from shared.xid import XidClass, classify, is_fatal, xid_reason
from tests.unit.helpers import inventory, job


@pytest.fixture
def core() -> SchedulingCore:
    c = SchedulingCore(FifoPolicy())
    c.node_up(inventory("a", gpus=4, cpus=8))
    c.node_up(inventory("b", gpus=4, cpus=8))
    return c


def run(core: SchedulingCore, job_id: str, now: float = 1.0) -> list[str]:
    """Start ``job_id`` (the next pass places it) and report every part running."""
    decisions = core.schedule(now)
    [start] = [d for d in decisions if isinstance(d, Start) and d.job_id == job_id]
    for node in start.placement.nodes:
        core.node_started(job_id, node, now)
    return list(start.placement.nodes)


# -- the verdict ---------------------------------------------------------------------------


def test_a_job_is_requeued_by_default_and_counts_its_restart() -> None:
    j = job("j", t=0)
    found = verdict(j, "node a lost", RequeueRules(True, 5))
    assert found.requeue and found.end_as is JobState.QUEUED
    assert found.reason == "node a lost; requeued (restart 1 of at most 5)"
    j.restarts = 3
    assert "restart 4 of at most 5" in verdict(j, "x", RequeueRules(True, 5)).reason


def test_no_requeue_and_the_masters_default_end_it_node_lost() -> None:
    own = job("own", t=0, stop=StopRules(requeue=False))
    found = verdict(own, "node a lost", RequeueRules(True, 5))
    assert not found.requeue and found.end_as is JobState.NODE_LOST
    assert found.reason == "node a lost; the job may not be requeued (--no-requeue)"
    plain = job("plain", t=0)
    found = verdict(plain, "node a lost", RequeueRules(False, 5))
    assert not found.requeue and "(requeue_default = false)" in found.reason
    # The job's own word wins over the default, both ways.
    wants = job("wants", t=0, stop=StopRules(requeue=True))
    assert verdict(wants, "x", RequeueRules(False, 5)).requeue


def test_max_requeues_caps_the_restarts() -> None:
    j = job("j", t=0)
    j.restarts = 2
    found = verdict(j, "GPU 1 of node a failed: Xid 79", RequeueRules(True, 2))
    assert not found.requeue
    assert found.reason == ("GPU 1 of node a failed: Xid 79; not requeued again: it was "
                            "requeued 2 time(s), max_requeues is 2")
    assert not verdict(job("k", t=0), "x", RequeueRules(True, 0)).requeue


def test_the_jobs_stop_rule_or_the_masters_default_decides() -> None:
    for wanted, default, expected in ((None, True, True), (None, False, False),
                                      (True, False, True), (False, True, False)):
        spec = job("j", t=0, stop=StopRules(requeue=wanted)).spec
        assert may_requeue(spec, RequeueRules(default, 5)) is expected
    # An environment variable of the old name means nothing to the master any more.
    env = job("j", t=0, env={"TRELLIS_REQUEUE": "0"})
    assert verdict(env, "x", RequeueRules(True, 5)).requeue


# -- SchedulingCore.requeue ----------------------------------------------------------------


def test_requeue_waits_for_the_parts_then_queues_with_one_more_restart(
        core: SchedulingCore) -> None:
    core.submit(job("wide", gpus=8, t=0))
    nodes = run(core, "wide")
    assert sorted(nodes) == ["a", "b"]
    transition, stop = core.requeue("wide", "node a lost; requeued", 5)
    assert transition is None and sorted(stop) == ["a", "b"]
    wide = core.jobs["wide"]
    assert wide.end_as == "queued" and wide.stopping
    # The lost node's part is counted as exited; the healthy one still runs: no requeue yet.
    transition, _ = core.node_exited("wide", "a", None, None, 6)
    assert transition is None and wide.state is JobState.RUNNING
    transition, _ = core.node_exited("wide", "b", None, 15, 7)
    assert transition is not None and transition.state is JobState.QUEUED
    assert transition.event == "requeued" and transition.reason == "node a lost; requeued"
    assert wide.restarts == 1 and wide.placement is None and wide.node_states == {}
    assert wide.start_time is None and wide.exit_code is None and wide.signal is None
    assert wide.end_as == "" and not wide.stopping and wide.requeue_priority == 0
    assert core.cluster.jobs_on("a") == [] and core.cluster.jobs_on("b") == []
    # It runs again, and a second requeue counts a second restart.
    run(core, "wide", 8)
    core.requeue("wide", "again", 9)
    for node in ("a", "b"):
        core.node_exited("wide", node, None, None, 10)
    assert wide.state is JobState.QUEUED and wide.restarts == 2


def test_a_requeued_job_keeps_its_place_unlike_a_preempted_one(core: SchedulingCore) -> None:
    core.submit(job("first", gpus=8, t=0))
    run(core, "first")
    core.submit(job("urgent", gpus=1, t=5, priority=10))
    core.submit(job("later", gpus=1, t=6))
    core.requeue("first", "node a lost", 7)
    for node in ("a", "b"):
        core.node_exited("first", node, None, None, 8)
    # Its own key: behind a job of higher priority, ahead of one submitted after it.
    assert [j.id for j in core.queue()] == ["urgent", "first", "later"]
    # A preempted job instead goes to the head of its array, whatever its priority.
    other = SchedulingCore(FifoPolicy())
    other.node_up(inventory("a", gpus=4, cpus=8))
    other.node_up(inventory("b", gpus=4, cpus=8))
    other.submit(job("first", gpus=8, t=0))
    run(other, "first")
    other.submit(job("urgent", gpus=1, t=5, priority=10))
    other.submit(job("later", gpus=1, t=6))
    other.policy = type("P", (), {"name": "p",
                                  "decide": lambda s, *a: [Preempt("first", "x")]})()
    other.schedule(7)
    for node in ("a", "b"):
        other.node_exited("first", node, None, 15, 8)
    assert [j.id for j in other.queue()] == ["first", "urgent", "later"]


def test_requeue_of_a_job_being_cancelled_leaves_the_cancel(core: SchedulingCore) -> None:
    core.submit(job("j", gpus=1, t=0))
    [node] = run(core, "j")
    core.cancel("j", 2)
    transition, stop = core.requeue("j", "node lost", 3)
    assert transition is None and stop == [node]
    transition, _ = core.node_exited("j", node, None, None, 4)
    assert transition is not None and transition.state is JobState.CANCELLED
    assert core.jobs["j"].restarts == 0


def test_requeue_of_queued_ended_and_unknown_jobs(core: SchedulingCore) -> None:
    core.submit(job("done", gpus=1, t=0))
    [node] = run(core, "done")
    core.node_exited("done", node, 0, None, 2)
    core.submit(job("q", gpus=16, t=0))  # never fits two 4-GPU nodes: stays queued
    assert core.requeue("q", "x", 1) == (None, [])
    assert core.jobs["q"].state is JobState.QUEUED and core.jobs["q"].restarts == 0
    with pytest.raises(JobError, match="already ended"):
        core.requeue("done", "x", 3)
    with pytest.raises(JobError, match="does not exist"):
        core.requeue("nope", "x", 3)


def test_requeue_when_every_part_exited_already_is_immediate(core: SchedulingCore) -> None:
    core.submit(job("j", gpus=1, t=0))
    [node] = run(core, "j")
    core.jobs["j"].node_states[node] = "exited"  # (a part whose exit was counted)
    transition, stop = core.requeue("j", "x", 2)
    assert stop == [] and transition is not None and transition.state is JobState.QUEUED
    assert core.jobs["j"].restarts == 1


def test_jobs_on_a_node_and_on_a_gpu(core: SchedulingCore) -> None:
    core.submit(job("wide", gpus=8, t=0))
    run(core, "wide")
    core.submit(job("cpu", gpus=0, cpus=1, t=1))
    run(core, "cpu", 2)
    active = core.active_jobs().values()
    assert [j.id for j in jobs_on_node(active, "a")] == sorted(
        j for j in ("wide", "cpu") if "a" in core.jobs[j].node_states)
    assert [j.id for j in jobs_on_gpu(active, "b", 3)] == ["wide"]
    core.jobs["wide"].node_states["b"] = "exited"
    assert jobs_on_gpu(core.active_jobs().values(), "b", 3) == []


# -- the Xid catalogue ---------------------------------------------------------------------


def test_xid_classes_follow_nvidias_catalogue() -> None:
    for xid in (13, 31, 43, 45):  # the application's own business
        assert classify(xid) is XidClass.APPLICATION and not is_fatal(xid)
    for xid in (48, 79, 95, 119, 74):  # a reset (or a reboot) before the GPU runs again
        assert classify(xid) is XidClass.FATAL and is_fatal(xid)
    for xid in (63, 92, 94, 999):  # watch: out of service, the job left alone
        assert classify(xid) is XidClass.OTHER and not is_fatal(xid)
    assert is_fatal(None)  # lost, or a reset required, without an Xid
    assert xid_reason(79) == "Xid 79 (GPU has fallen off the bus)"
    assert xid_reason(999) == "Xid 999"
