"""Scenarios for the multi-array policy, applied through a real SchedulingCore."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import pytest

from masterd.core.arrays import ArrayId, ArrayPolicy, ArraySummary
from masterd.core.arrays.accounting import allocs
from masterd.core.cluster import ClusterSnapshot
from masterd.core.policies import POLICIES, soda_arrays
from masterd.core.policies.fifo import FifoPolicy
from masterd.core.policy import Decision, Preempt, Start
from shared.model import Job, JobState, NodeAllocation, Placement
from tests.unit.arrays_fixtures import (
    complete_preemption,
    cpu_node,
    finish,
    gpu_node,
    job,
    make_core,
    preempts,
    run_pass,
    starts,
)

LARGE, SMALL = ArrayId("large", "A100"), ArrayId("small", "A100")
GPU_CPU, CPU = ArrayId("gpu-cpu", "A100"), ArrayId("cpu")


def policy(**table: object) -> ArrayPolicy:
    table.setdefault("models", {"*": {"large": 8, "cpu_job_cores": 4}})
    table.setdefault("inner", {"small": "fifo", "large": "fifo", "cpu": "drf"})
    return soda_arrays(**table)


def two_nodes(pol: ArrayPolicy, *extra: object):  # n1 is the large node, n2 the small one
    return make_core(pol, [gpu_node("n1"), gpu_node("n2"), *extra])  # type: ignore[list-item]


def borrowed(pol: ArrayPolicy, core, job_id: str) -> set[ArrayId]:
    amap = pol.array_map(core.snapshot())
    j = core.jobs[job_id]
    home = amap.home(j.spec)
    return set(amap.borrowed_units(allocs(j.placement), home))


def test_jobs_start_in_their_own_arrays() -> None:
    pol = policy()
    core = two_nodes(pol, cpu_node("c1", cores=8))
    small, large, cpu = job(gpus=1, cpus=2), job(gpus=4, cpus=4), job(cpus=2)
    for j in (small, large, cpu):
        core.submit(j)
    applied = starts(run_pass(core, 1.0))
    assert set(applied) == {small.id, large.id, cpu.id}
    assert applied[small.id].placement.nodes == ("n2",)
    assert applied[large.id].placement.nodes == ("n1",)
    for j in (small, large, cpu):
        assert borrowed(pol, core, j.id) == set()
    # The CPU job sits on CPU-job cores (12-15 on GPU nodes, or the CPU node).
    alloc = applied[cpu.id].placement.allocations[0]
    assert alloc.node == "c1" or set(alloc.cpus) <= {12, 13, 14, 15}


def _fill_small_and_borrow(core, pol: ArrayPolicy) -> list[Job]:
    """Fill n2 with 1-GPU jobs, then three 2-GPU jobs borrow n1 at t=1, 2, 3."""
    for i in range(8):
        core.submit(job(gpus=1, cpus=1, submit=0.0, job_id=f"s{i}"))
    assert len(starts(run_pass(core, 0.5))) == 8
    borrowers = []
    for t in (1.0, 2.0, 3.0):
        b = job(gpus=2, cpus=1, submit=t, job_id=f"b{int(t)}")
        core.submit(b)
        result = pol.plan(core.snapshot(), core.queue(), t)
        assert result.notes[b.id] == "borrowing 2 gpus of large:A100"
        assert set(starts(run_pass(core, t))) == {b.id}
        assert borrowed(pol, core, b.id) == {LARGE}
        borrowers.append(b)
    return borrowers


def test_borrowers_are_preempted_most_recent_first_and_requeued_at_the_head() -> None:
    pol = policy()
    core = two_nodes(pol)
    b1, b2, _ = _fill_small_and_borrow(core, pol)
    big = job(gpus=4, cpus=2, submit=4.0, job_id="big")
    core.submit(big)
    # n1 has 2 GPUs free; the owner needs 4: exactly one borrower goes, the newest.
    result = pol.plan(core.snapshot(), core.queue(), 4.0)
    assert result.decisions == [Preempt("b3", "large:A100 needs its resources back for job big")]
    assert result.notes["big"] == "waiting: large:A100 reclaims it from b3"
    assert preempts(run_pass(core, 4.0)).keys() == {"b3"}
    assert core.jobs["b3"].reason.startswith("preempted")
    # Until b3's parts exit, later passes ask for nothing more.
    assert set(preempts(pol.decide(core.snapshot(), core.queue(), 4.5))) <= {"b3"}
    complete_preemption(core, "b3", 5.0)
    assert [j.id for j in core.queue()] == ["b3", "big"]
    applied = starts(run_pass(core, 6.0))
    assert set(applied) == {"big"}
    assert applied["big"].placement.nodes == ("n1",)
    assert core.jobs["b3"].state is JobState.QUEUED
    # When the owner finishes, the loan is made again.
    finish(core, "big", 7.0)
    assert set(starts(run_pass(core, 8.0))) == {"b3"}
    assert borrowed(pol, core, "b3") == {LARGE}
    assert {b1.id, b2.id} <= set(core.running())


def test_borrowers_are_derived_from_placements_after_a_restart() -> None:
    pol = policy()
    core = two_nodes(pol)
    _fill_small_and_borrow(core, pol)
    core.submit(job(gpus=4, cpus=2, submit=4.0, job_id="big"))
    fresh = policy()  # a restarted master: no memory of who borrowed
    snapshot, queue = core.snapshot(), core.queue()
    assert fresh.summary(snapshot, queue) == pol.summary(snapshot, queue)
    assert fresh.decide(snapshot, queue, 4.0) == pol.decide(snapshot, queue, 4.0)
    assert preempts(fresh.decide(snapshot, queue, 4.0)).keys() == {"b3"}


def test_summary_reports_size_use_and_loans() -> None:
    pol = policy()
    core = two_nodes(pol, cpu_node("c1", cores=8))
    _fill_small_and_borrow(core, pol)
    core.submit(job(gpus=4, cpus=2, submit=4.0))
    core.submit(job(cpus=1, submit=4.0))
    core.submit(job(cpus=1, submit=4.0, model=None))
    by_name = {s.name: s for s in pol.summary(core.snapshot(), core.queue())}
    assert by_name["large:A100"] == ArraySummary(
        "large:A100", "A100", "large", "gpus", size=8, used=6, borrowed_out=6, borrowed_in=0,
        queued=1,
    )
    assert by_name["small:A100"] == ArraySummary(
        "small:A100", "A100", "small", "gpus", size=8, used=8, borrowed_out=0, borrowed_in=6,
        queued=0,
    )
    assert by_name["gpu-cpu:A100"].size == 24 and by_name["gpu-cpu:A100"].used == 11
    assert by_name["cpu"].size == 16 and by_name["cpu"].queued == 2
    assert by_name["cpu"].unit == "cores"


def test_cpu_jobs_borrow_gpu_job_cores_and_give_them_back() -> None:
    pol = policy(models={"*": {"large": 0, "cpu_job_cores": 2}})
    core = make_core(pol, [gpu_node("g", gpus=4, cores=8)])
    for t in range(4):
        core.submit(job(cpus=2, submit=float(t), job_id=f"c{t}"))
        run_pass(core, float(t))
    assert set(core.running()) == {"c0", "c1", "c2", "c3"}
    assert borrowed(pol, core, "c0") == set()
    assert all(borrowed(pol, core, f"c{t}") == {GPU_CPU} for t in (1, 2, 3))
    gpu = job(gpus=1, cpus=2, submit=5.0, job_id="gpu")
    core.submit(gpu)
    assert preempts(run_pass(core, 5.0)).keys() == {"c3"}
    complete_preemption(core, "c3", 6.0)
    assert core.queue()[0].id == "c3"
    applied = starts(run_pass(core, 7.0))
    assert set(applied) == {"gpu"}
    assert core.jobs["c3"].state is JobState.QUEUED


def test_gpu_jobs_borrow_idle_cpu_job_cores_only_when_enabled_and_give_them_back() -> None:
    # One 4-GPU, 8-core node: 6 cores for GPU jobs, 2 for CPU jobs.
    table = {"models": {"*": {"large": 0, "cpu_job_cores": 2}}}
    off = policy(**table)
    core = make_core(off, [gpu_node("g", gpus=4, cores=8)])
    core.submit(job(gpus=1, cpus=4, job_id="a"))
    core.submit(job(gpus=1, cpus=4, job_id="b"))
    assert set(starts(run_pass(core, 1.0))) == {"a"}  # b would need a CPU-job core

    on = policy(gpu_jobs_borrow_cpu_cores=True, **table)
    core = make_core(on, [gpu_node("g", gpus=4, cores=8)])
    core.submit(job(gpus=1, cpus=4, job_id="a"))
    core.submit(job(gpus=1, cpus=4, job_id="b"))
    assert set(starts(run_pass(core, 1.0))) == {"a", "b"}
    assert borrowed(on, core, "b") == {CPU}
    # A CPU job claims its array back: the borrower is preempted and re-queued first.
    core.submit(job(cpus=2, submit=2.0, job_id="c"))
    assert preempts(run_pass(core, 2.0)).keys() == {"b"}
    complete_preemption(core, "b", 3.0)
    assert set(starts(run_pass(core, 4.0))) == {"c"}
    assert core.queue()[0].id == "b"


def _large_owner_waits_beside_a_full_small_array(core) -> None:  # type: ignore[no-untyped-def]
    """l1 holds 4 of n1's GPUs, s0-s7 fill n2; l2 (8 GPUs) waits for n1, s8 for a GPU."""
    core.submit(job(gpus=4, cpus=1, job_id="l1"))
    for i in range(8):
        core.submit(job(gpus=1, cpus=1, job_id=f"s{i}"))
    run_pass(core, 1.0)
    core.submit(job(gpus=8, cpus=1, submit=2.0, job_id="l2"))  # waits: n1 has only 4 free
    core.submit(job(gpus=1, cpus=1, submit=3.0, job_id="s8"))


def test_an_array_with_a_waiting_owner_does_not_lend() -> None:
    pol = policy()
    core = two_nodes(pol)
    _large_owner_waits_beside_a_full_small_array(core)
    result = pol.plan(core.snapshot(), core.queue(), 3.0)
    assert result.decisions == []
    assert result.notes["s8"] == "waiting: small:A100 is full"
    # An owner that could never fit its array does not stop it lending.
    finish(core, "l1", 4.0)
    core.cancel("l2", 4.0)
    core.submit(job(gpus=16, cpus=1, submit=5.0, job_id="l3"))
    applied = starts(run_pass(core, 5.0))
    assert set(applied) == {"s8"} and borrowed(pol, core, "s8") == {LARGE}


def test_free_lending_lends_past_a_waiting_owner_and_reclaims_when_it_could_start() -> None:
    pol = policy(lending="free")
    core = two_nodes(pol)
    _large_owner_waits_beside_a_full_small_array(core)
    # l2 could not start even with every loan back (l1 holds n1's other 4): n1's 4 free
    # GPUs are lent (SODA §V-C) instead of kept idle for it.
    applied = starts(run_pass(core, 3.0))
    assert set(applied) == {"s8"} and borrowed(pol, core, "s8") == {LARGE}
    # Once l1 ends, l2 fits n1 with the loan back: the borrower is preempted for it.
    finish(core, "l1", 4.0)
    assert preempts(run_pass(core, 4.0)).keys() == {"s8"}
    complete_preemption(core, "s8", 5.0)
    assert set(starts(run_pass(core, 6.0))) == {"l2"}
    assert core.jobs["s8"].state is JobState.QUEUED


def test_lending_must_be_idle_or_free() -> None:
    with pytest.raises(ValueError, match="lending: must be one of idle, free, got 'always'"):
        policy(lending="always")


def test_no_borrowing_when_disabled() -> None:
    pol = policy(borrowing=False)
    core = two_nodes(pol)
    for i in range(9):
        core.submit(job(gpus=1, cpus=1, job_id=f"s{i}"))
    assert len(starts(run_pass(core, 1.0))) == 8
    assert [j.id for j in core.queue()] == ["s8"]


def test_a_blocked_fifo_head_borrows_and_the_jobs_behind_it_start_at_home() -> None:
    pol = policy()
    core = two_nodes(pol)
    for i in range(7):
        core.submit(job(gpus=1, cpus=1, job_id=f"s{i}"))
    run_pass(core, 1.0)
    core.submit(job(gpus=2, cpus=1, submit=2.0, job_id="head"))
    core.submit(job(gpus=1, cpus=1, submit=3.0, job_id="next"))
    applied = starts(run_pass(core, 3.0))
    assert set(applied) == {"head", "next"}
    assert applied["head"].placement.nodes == ("n1",)
    assert applied["next"].placement.nodes == ("n2",)


def test_quotas_block_jobs_even_on_free_resources() -> None:
    pol = policy(tenants={"vision": {"quota": {"small": {"gpus": 2}}}})
    core = two_nodes(pol)
    for i in range(3):
        core.submit(job(gpus=1, cpus=1, tenant="vision", job_id=f"v{i}"))
    core.submit(job(gpus=1, cpus=1, tenant="speech", submit=1.0, job_id="other"))
    result = pol.plan(core.snapshot(), core.queue(), 1.0)
    assert set(starts(result.decisions)) == {"v0", "v1", "other"}
    assert result.notes["v2"].startswith("waiting: over quota of tenant vision in small:A100")
    run_pass(core, 1.0)
    assert [j.id for j in core.queue()] == ["v2"]
    finish(core, "v0", 2.0)
    assert set(starts(run_pass(core, 3.0))) == {"v2"}


def test_quota_counts_jobs_the_inner_policy_starts_together() -> None:
    pol = policy(tenants={"vision": {"quota": {"small:A100": {"gpus": 3}}}})
    core = two_nodes(pol)
    core.submit(job(gpus=2, cpus=1, tenant="vision", job_id="v0"))
    core.submit(job(gpus=2, cpus=1, tenant="vision", submit=1.0, job_id="v1"))
    core.submit(job(gpus=2, cpus=1, tenant="speech", submit=2.0, job_id="s0"))
    result = pol.plan(core.snapshot(), core.queue(), 1.0)
    assert set(starts(result.decisions)) == {"v0", "s0"}
    assert "quota" in result.notes["v1"]


def test_over_quota_tenant_may_run_only_on_borrowed_resources() -> None:
    pol = policy(tenants={"vision": {"borrow_over_quota": True,
                                     "quota": {"small": {"gpus": 1}}}})
    core = two_nodes(pol)
    core.submit(job(gpus=1, cpus=1, tenant="vision", job_id="v0"))
    core.submit(job(gpus=1, cpus=1, tenant="vision", submit=1.0, job_id="v1"))
    applied = starts(run_pass(core, 1.0))
    assert applied["v0"].placement.nodes == ("n2",)
    assert applied["v1"].placement.nodes == ("n1",)
    assert borrowed(pol, core, "v1") == {LARGE}
    # The loan does not count against the quota, and is reclaimed like any other.
    core.submit(job(gpus=8, cpus=1, submit=2.0, job_id="big"))
    assert preempts(run_pass(core, 2.0)).keys() == {"v1"}


def test_gpu_jobs_naming_no_model_borrow_other_models() -> None:
    pol = policy(default_gpu_model="A100", models={"*": {"large": 0, "cpu_job_cores": 2}})
    core = make_core(pol, [gpu_node("a", gpus=2, model="A100"),
                           gpu_node("v", gpus=4, model="V100")])
    core.submit(job(gpus=2, cpus=1, model="A100", job_id="a0"))
    core.submit(job(gpus=1, cpus=1, submit=1.0, job_id="any"))
    result = pol.plan(core.snapshot(), core.queue(), 1.0)
    assert starts(result.decisions)["any"].placement.nodes == ("v",)
    assert result.notes["any"] == "borrowing 1 gpus of small:V100, 1 cores of gpu-cpu:V100"
    run_pass(core, 1.0)
    core.submit(job(gpus=3, cpus=1, model="V100", submit=2.0, job_id="v0"))
    core.submit(job(gpus=1, cpus=1, model="V100", submit=3.0, job_id="v1"))
    applied = run_pass(core, 3.0)
    assert set(starts(applied)) == {"v0"}
    assert preempts(applied).keys() == {"any"}


def test_jobs_of_unknown_models_wait_with_a_reason() -> None:
    pol = policy()
    core = two_nodes(pol)
    core.submit(job(gpus=1, model="H100", job_id="h"))
    result = pol.plan(core.snapshot(), core.queue(), 1.0)
    assert result.decisions == []
    assert result.notes["h"] == "waiting: no node of GPU model H100 is known"


def test_drf_orders_the_cpu_array_with_tenant_weights() -> None:
    pol = policy(models={"*": {"large": 0, "cpu_job_cores": 0}},
                 tenants={"a": {"weight": 3.0}})
    core = make_core(pol, [cpu_node("c", cores=8)])
    for i in range(8):
        core.submit(job(cpus=1, tenant="a", submit=float(i)))
    for i in range(8):
        core.submit(job(cpus=1, tenant="b", submit=10.0 + i))
    run_pass(core, 20.0)
    tenants = [j.spec.tenant for j in core.running().values()]
    assert tenants.count("a") == 6 and tenants.count("b") == 2


class _Recorder:
    name = "recorder"
    calls: list[tuple[str, int]] = []

    def decide(self, snapshot: ClusterSnapshot, queue: Sequence[Job], now: float
               ) -> list[Decision]:
        _Recorder.calls.append((queue[0].spec.array_kind, snapshot.total_gpus))
        return FifoPolicy().decide(snapshot, queue, now)


def test_gpu_arrays_default_to_swaf_when_it_is_registered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pol = soda_arrays(models={"*": {"large": 8}})
    core = two_nodes(pol)
    core.submit(job(gpus=1, cpus=1))
    run_pass(core, 1.0)  # no swaf registered: FIFO places it
    assert len(core.running()) == 1
    _Recorder.calls = []
    monkeypatch.setitem(POLICIES, "swaf", _Recorder)
    pol = soda_arrays(models={"*": {"large": 8}})
    core = two_nodes(pol)
    core.submit(job(gpus=1, cpus=1))
    core.submit(job(gpus=4, cpus=1))
    run_pass(core, 1.0)
    # Each GPU array's inner policy saw only that array's 8 GPUs.
    assert sorted(_Recorder.calls) == [("large", 8), ("small", 8)]


class _Rogue:
    """An inner policy that ignores the array: reaches outside it and reuses GPUs."""

    name = "rogue"

    def decide(self, snapshot: ClusterSnapshot, queue: Sequence[Job], now: float
               ) -> list[Decision]:
        out: list[Decision] = []
        for j in queue:
            out.append(Start(j.id, Placement((NodeAllocation("n1", (0,), (0,)),))))
            out.append(Start(j.id, Placement((NodeAllocation("n2", (0,), (0,)),))))
        out.append(Start("ghost", Placement((NodeAllocation("n2", (1,), (1,)),))))
        out.append(Preempt("someone-else", "rogue"))
        return out


def test_inner_decisions_outside_the_array_or_reusing_units_are_dropped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    pol = policy(models={"*": {"large": 8}})
    pol = soda_arrays(pol.config, inner_factories={"small": _Rogue})
    core = two_nodes(pol)
    core.submit(job(gpus=1, cpus=1, job_id="x"))
    core.submit(job(gpus=1, cpus=1, job_id="y"))
    with caplog.at_level(logging.WARNING, logger="trellis.arrays"):
        decisions = pol.decide(core.snapshot(), core.queue(), 1.0)
    # x gets n2's GPU 0 (n1 is the large array); y's copies are all taken or outside.
    assert decisions == [Start("x", Placement((NodeAllocation("n2", (0,), (0,)),)))]
    assert "inner_decision_dropped" in caplog.text
    assert "outside the array" in caplog.text and "not free" in caplog.text


class _Spy:
    name = "spy"
    seen: list[ClusterSnapshot] = []

    def decide(self, snapshot: ClusterSnapshot, queue: Sequence[Job], now: float
               ) -> list[Decision]:
        _Spy.seen.append(snapshot)
        return []


def test_inner_policies_see_running_jobs_cut_to_their_array() -> None:
    base = policy(models={"*": {"large": 8, "cpu_job_cores": 2}})
    pol = soda_arrays(base.config, inner_factories={"large": _Spy})
    core = two_nodes(soda_arrays(base.config))
    core.submit(job(gpus=4, cpus=2, job_id="large-job"))
    for i in range(4):  # 2 CPU-job cores per node: two jobs at home, two borrow
        core.submit(job(cpus=2, submit=float(i), job_id=f"c{i}"))
    run_pass(core, 1.0)
    assert len(core.running()) == 5
    core.submit(job(gpus=4, cpus=1, submit=5.0))
    _Spy.seen = []
    pol.decide(core.snapshot(), core.queue(), 5.0)
    (view,) = _Spy.seen
    assert set(view.nodes) == {"n1"}
    gpu_cores = pol.array_map(core.snapshot()).nodes["n1"].gpu_job_cpus
    for j in view.running.values():
        assert j.placement is not None
        for alloc in j.placement.allocations:
            assert alloc.node == "n1" and set(alloc.cpus) <= gpu_cores
    # The large job and the CPU jobs borrowing n1's GPU-job cores occupy the large array;
    # CPU jobs on CPU-job cores (or on n2) do not.
    borrowers_on_n1 = {
        i for i, j in core.running().items()
        if j.placement.nodes == ("n1",) and borrowed(pol, core, i)
    }
    assert borrowers_on_n1
    assert set(view.running) == {"large-job"} | borrowers_on_n1
    assert view.running["large-job"] is core.jobs["large-job"]  # uncut jobs are not copied


def test_resized_arrays_turn_jobs_on_moved_nodes_into_borrowers() -> None:
    from masterd.core.arrays import DemandRecord, resize

    pol = policy(models={"*": {"large": 0, "cpu_job_cores": 2}})
    core = two_nodes(pol)
    for i in range(4):
        core.submit(job(gpus=2, cpus=1, submit=float(i), job_id=f"s{i}"))
    run_pass(core, 1.0)
    assert {s.name: s.size for s in pol.summary(core.snapshot(), core.queue())}[
        "large:A100"] == 0
    # A week dominated by large jobs: half the GPUs move to the large array.
    history = [DemandRecord(86_400.0, "large", "A100", 3e6, 1e5),
               DemandRecord(86_400.0, "small", "A100", 1e6, 1e5)]
    new = resize(pol.config, history, now=2 * 86_400.0)
    assert new.for_model("A100").large.value == 0.75
    pol.reconfigure(new)
    by_name = {s.name: s for s in pol.summary(core.snapshot(), core.queue())}
    assert by_name["large:A100"].size == 8
    moved = {i for i, j in core.running().items() if j.placement.nodes == ("n1",)}
    assert moved and by_name["large:A100"].borrowed_out == 2 * len(moved)
    core.submit(job(gpus=8, cpus=1, submit=3.0, job_id="big"))
    assert set(preempts(run_pass(core, 3.0))) == moved


def test_drained_nodes_are_neither_used_nor_lent() -> None:
    pol = policy()
    core = two_nodes(pol)
    core.set_drained("n1", True)
    for i in range(9):
        core.submit(job(gpus=1, cpus=1, job_id=f"s{i}"))
    assert len(starts(run_pass(core, 1.0))) == 8
    assert all(j.placement.nodes == ("n2",) for j in core.running().values())
    assert {s.name: s.size for s in pol.summary(core.snapshot(), core.queue())}[
        "large:A100"] == 8  # the map keeps a drained node where it was
    core.set_drained("n1", False)
    applied = starts(run_pass(core, 2.0))
    assert set(applied) == {"s8"} and applied["s8"].placement.nodes == ("n1",)


def test_a_job_its_array_can_never_hold_is_told_why_it_waits() -> None:
    """The demo cluster's case: borrowing off, the large-job array one node's 4 GPUs of 16;
    an 8-GPU job was told it was first in line while nothing would ever start it."""
    from dataclasses import replace as _replace

    from masterd.core.policies import make_policy
    from masterd.core.scheduler import SchedulingCore
    from masterd.core.waiting import WaitExplainer
    from tests.unit.helpers import inventory, job

    for borrowing, way in ((False, "with borrowing off it runs only once the array grows"),
                           (True, "it runs only on what other arrays lend it")):
        core = SchedulingCore(make_policy("soda-arrays", borrowing=borrowing,
                                          models={"*": {"large": 0.25}}))
        for i in range(4):
            core.node_up(_replace(inventory(f"n{i}", gpus=4, cpus=8)))
        core.submit(job("big", gpus=8, cpus=1, t=0))
        core.schedule(1)
        code, sentence = WaitExplainer(core).why(core.jobs["big"])
        if borrowing and core.jobs["big"].state.value != "queued":
            continue  # it borrowed the other arrays' GPUs and started
        assert code == "policy" and sentence.startswith(
            "waiting: array large:A100 holds 4 GPUs, fewer than the 8 this job asks"), (
            borrowing, code, sentence)
        assert way in sentence
