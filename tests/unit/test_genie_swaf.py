"""SWAF scenarios (GENIE Fig. 11 and friends), job plans, and SWAF inside the SchedulingCore."""

from __future__ import annotations

import pytest

from masterd.core.cluster import ClusterState
from masterd.core.genie.modeldb import ModelDB, ModelDBError
from masterd.core.genie.plan import Estimator, GenieSettings, Platform
from masterd.core.genie.qos import cost
from masterd.core.policies import REGISTRY, make_policy
from masterd.core.policies.fifo import FifoPolicy
from masterd.core.policies.swaf import SwafPolicy
from masterd.core.policy import Start
from masterd.core.scheduler import SchedulingCore
from shared.model import JobKind, JobState, NodeAllocation, Placement, QosClass
from tests.unit.genie_support import (
    K80,
    cluster,
    job,
    node,
    ref_candidates,
    ref_decide,
    ref_rank,
)

DB = ModelDB.default()


def hold(state: ClusterState, node_name: str, gpus: int, cpus: int = 0) -> None:
    """Occupy some GPUs/cores of a node with an anonymous running job."""
    view = state.node(node_name)
    assert view is not None
    alloc = NodeAllocation(node_name, tuple(sorted(view.free_gpus))[:gpus],
                           tuple(sorted(view.free_cpus))[:cpus], 0)
    state.allocate(f"hold-{node_name}-{len(state.allocations)}", Placement((alloc,)))


def shape(decision: Start) -> tuple[int, int]:
    allocs = decision.placement.allocations
    return len(allocs), len(allocs[0].gpus)


def test_prior_job_overtakes_an_earlier_normal_job_with_more_allowance() -> None:
    """Fig. 11: w = e − (l + now) orders the queue, not arrival."""
    state = cluster(node("n1", 4))
    hold(state, "n1", 3)  # one GPU left
    normal = job("normal", gpus=1, qos=QosClass.NORMAL, submit=0.0, iterations=500)
    prior = job("prior", gpus=1, qos=QosClass.PRIOR, submit=100.0, iterations=500)
    queue = [normal, prior]
    policy = SwafPolicy(DB)
    decisions = policy.decide(state.snapshot({}), queue, now=120.0)
    assert [d.job_id for d in decisions] == ["prior"]
    w_normal = policy.explain("normal", 120.0)
    w_prior = policy.explain("prior", 120.0)
    assert w_normal is not None and w_prior is not None
    # Same task, so the same latency: e_normal = 2·L1, e_prior = 100 + L1, and L1 > 100.
    assert w_prior.waiting_allowance < w_normal.waiting_allowance
    assert w_normal.ect == pytest.approx(2 * (w_prior.ect - 100.0))
    # FIFO would have started the normal job.
    assert [d.job_id for d in FifoPolicy().decide(state.snapshot({}), queue, 120.0)] == [
        "normal"
    ]


def test_urgent_job_takes_its_fastest_placement() -> None:
    state = cluster(node("n1", 4), node("n2", 4))
    urgent = job("u", gpus=8, batch=256, iterations=2000, qos=QosClass.URGENT, submit=5.0)
    candidates, _ = ref_candidates(urgent, state.snapshot({}), DB, GenieSettings())
    fastest = min(candidates, key=lambda c: c.latency)
    best_cer = min(candidates, key=ref_rank)
    assert (fastest.d_node, fastest.d_gpn) != (best_cer.d_node, best_cer.d_gpn)

    decisions = SwafPolicy(DB).decide(state.snapshot({}), [urgent], now=5.0)
    assert len(decisions) == 1 and isinstance(decisions[0], Start)
    assert shape(decisions[0]) == (fastest.d_node, fastest.d_gpn)
    # The literal Algorithm 1 line 13 gives it the highest CER instead.
    literal = SwafPolicy(DB, urgent_placement="cer").decide(state.snapshot({}), [urgent], 5.0)
    assert shape(literal[0]) == (best_cer.d_node, best_cer.d_gpn)


def test_choice_moves_to_a_faster_placement_as_the_deadline_nears() -> None:
    state = cluster(node("n1", 4), node("n2", 4))
    for name in ("n1", "n2"):
        hold(state, name, 4)  # full: the job keeps waiting while time passes
    j = job("p", gpus=8, batch=256, iterations=3000, qos=QosClass.PRIOR, submit=0.0)
    policy = SwafPolicy(DB)
    snapshot = state.snapshot({})
    assert policy.decide(snapshot, [j], now=0.0) == []
    first = policy.explain("p")
    assert first is not None and first.meets_ect
    later = first.ect - first.latency + 1.0  # the first choice can no longer make it
    policy.decide(snapshot, [j], now=later)
    second = policy.explain("p")
    assert second is not None
    assert second.latency < first.latency
    assert second.placement.cer < first.placement.cer
    assert second.meets_ect == (second.latency <= second.ect - later)
    # Once nothing can make it, the highest CER is taken again (Algorithm 1 line 13).
    policy.decide(snapshot, [j], now=first.ect)
    third = policy.explain("p")
    assert third is not None and not third.meets_ect
    assert third.placement == first.placement
    # Replaying an earlier time restores the earlier choice.
    policy.decide(snapshot, [j], now=0.0)
    assert policy.explain("p") == first


def test_a_job_that_does_not_fit_is_skipped_and_later_ones_start() -> None:
    state = cluster(node("n1", 4))
    big = job("big", gpus=4, qos=QosClass.URGENT, submit=0.0)
    small = job("small", gpus=1, qos=QosClass.NORMAL, submit=1.0)
    hold(state, "n1", 2)
    policy = SwafPolicy(DB, shape_mode="exact")
    decisions = policy.decide(state.snapshot({}), [big, small], now=2.0)
    assert [d.job_id for d in decisions] == ["small"]
    assert FifoPolicy().decide(state.snapshot({}), [big, small], 2.0) == []


def test_an_explicit_deadline_overrides_the_class() -> None:
    state = cluster(node("n1", 4))
    hold(state, "n1", 3)
    prior = job("prior", gpus=1, qos=QosClass.PRIOR, submit=0.0)
    rushed = job("rushed", gpus=1, qos=QosClass.NORMAL, submit=50.0, deadline=60.0)
    policy = SwafPolicy(DB)
    assert [d.job_id for d in policy.decide(state.snapshot({}), [prior, rushed], 55.0)] == [
        "rushed"
    ]
    prior_choice = policy.explain("prior")
    rushed_choice = policy.explain("rushed")
    assert prior_choice is not None and rushed_choice is not None
    assert rushed_choice.ect == 60.0
    assert rushed_choice.waiting_allowance < prior_choice.waiting_allowance


def test_cpu_only_jobs_are_packed_after_gpu_jobs() -> None:
    state = cluster(node("n1", 2, cpus=4))
    cpu_first = job("cpu", gpus=0, cpus=4, submit=0.0, model_type=None)
    gpu_later = job("gpu", gpus=1, cpus=2, submit=10.0)
    decisions = SwafPolicy(DB).decide(state.snapshot({}), [cpu_first, gpu_later], 10.0)
    assert [d.job_id for d in decisions] == ["gpu"]
    small_cpu = job("cpu2", gpus=0, cpus=2, submit=0.0, model_type=None)
    decisions = SwafPolicy(DB).decide(state.snapshot({}), [small_cpu, gpu_later], 10.0)
    assert [d.job_id for d in decisions] == ["gpu", "cpu2"]


def test_a_job_without_model_information_runs_at_the_default_rate() -> None:
    state = cluster(node("n1", 4), node("n2", 4))
    opaque = job("opaque", gpus=4, batch=None, iterations=None, model_type=None)
    policy = SwafPolicy(DB, default_duration_s=7200.0)
    decisions = policy.decide(state.snapshot({}), [opaque], 0.0)
    assert len(decisions) == 1 and decisions[0].placement.gpu_count == 4
    # Packed on one node: the cheapest shape with the same (linear) rate.
    assert shape(decisions[0]) == (1, 4)
    choice = policy.explain("opaque")
    assert choice is not None
    assert choice.latency == pytest.approx(7200.0 / 4)
    assert choice.ect == pytest.approx(2 * 7200.0)
    assert choice.model_fallback == "no prediction model: default rate"


def test_an_unknown_model_type_uses_a_similar_one_and_says_so() -> None:
    state = cluster(node("n1", 4))
    hold(state, "n1", 4)
    j = job("vgg", model_type="VGG19", family="cnn", params_m=143.0, gpus=2)
    policy = SwafPolicy(DB)
    policy.decide(state.snapshot({}), [j], 0.0)
    choice = policy.explain("vgg")
    assert choice is not None and "Alexnet" in choice.model_fallback


def test_jobs_wait_for_their_gpu_model_and_start_when_it_registers() -> None:
    state = cluster(node("n1", 4))
    j = job("v100", gpus=2, gpu_model="Tesla V100")
    policy = SwafPolicy(DB)
    assert policy.decide(state.snapshot({}), [j], 0.0) == []
    state.upsert_node(node("v1", 4, gpu_model="Tesla V100"))
    decisions = policy.decide(state.snapshot({}), [j], 1.0)
    assert [d.job_id for d in decisions] == ["v100"]
    assert decisions[0].placement.nodes == ("v1",)


def test_shape_modes_cap_and_exact() -> None:
    state = cluster(node("n1", 4), node("n2", 4))
    # A small batch gains nothing from many GPUs: in cap mode GENIE gives it fewer.
    j = job("small-batch", gpus=8, batch=8, iterations=100)
    capped = SwafPolicy(DB).decide(state.snapshot({}), [j], 0.0)
    assert capped[0].placement.gpu_count < 8
    exact = SwafPolicy(DB, shape_mode="exact").decide(state.snapshot({}), [j], 0.0)
    assert exact[0].placement.gpu_count == 8
    # max_nodes bounds the spread.
    one_node = job("one", gpus=8, batch=512, max_nodes=1)
    d = SwafPolicy(DB, shape_mode="exact").decide(state.snapshot({}), [one_node], 0.0)
    assert d == []  # 8 GPUs do not fit one 4-GPU node


def test_shape_mode_any_considers_every_placement_of_the_platform() -> None:
    state = cluster(node("n1", 4), node("n2", 4))
    # A large-batch Prior job asking for one GPU: cap keeps it there and it cannot meet its
    # ECT (its single-GPU latency) once it has waited; "any" spreads it to meet it.
    j = job("big-batch", gpus=1, batch=96, iterations=2000, qos=QosClass.PRIOR)
    capped = SwafPolicy(DB).decide(state.snapshot({}), [j], 60.0)
    assert capped[0].placement.gpu_count == 1
    spread = SwafPolicy(DB, shape_mode="any")
    anywhere = spread.decide(state.snapshot({}), [j], 60.0)
    assert anywhere[0].placement.gpu_count > 1
    # Every shape of the 2 x 4 platform was a candidate, whatever the job asked for.
    shapes = {(c.d_node, c.d_gpn) for c in spread.estimator.plan(
        j, Platform.from_snapshot(state.snapshot({}))).candidates}
    assert shapes == {(n, g) for n in (1, 2) for g in (1, 2, 3, 4)}
    # Black-box baselines still place as asked.
    fifo = FifoPolicy().decide(state.snapshot({}), [j], 60.0)
    assert fifo[0].placement.gpu_count == 1


def test_late_tasks_defer_lets_jobs_that_can_still_meet_their_ect_go_first() -> None:
    state = cluster(node("n1", 4))
    hold(state, "n1", 3)  # one GPU left, on one node: every job runs on <1, 1>
    # "late" waited so long that no placement meets its ECT; "ontime" still can.
    late = job("late", gpus=1, max_nodes=1, qos=QosClass.PRIOR, submit=0.0, iterations=500)
    ontime = job("ontime", gpus=1, max_nodes=1, qos=QosClass.NORMAL, submit=5000.0,
                 iterations=500)
    queue = [late, ontime]
    serve = SwafPolicy(DB)
    assert [d.job_id for d in serve.decide(state.snapshot({}), queue, 5000.0)] == ["late"]
    explained = serve.explain("late")
    assert explained is not None and not explained.meets_ect and not explained.deferred
    defer = SwafPolicy(DB, late_tasks="defer")
    assert [d.job_id for d in defer.decide(state.snapshot({}), queue, 5000.0)] == ["ontime"]
    explained = defer.explain("late")
    assert explained is not None and explained.deferred
    assert [c.job_id for c in defer.waiting_order()] == ["ontime", "late"]
    # An urgent job (ECT 0, placed as soon as possible) is never deferred.
    urgent = job("urgent", gpus=1, max_nodes=1, qos=QosClass.URGENT, submit=4000.0,
                 iterations=500)
    decided = SwafPolicy(DB, late_tasks="defer").decide(state.snapshot({}),
                                                        [ontime, urgent], 5000.0)
    assert [d.job_id for d in decided] == ["urgent"]


def test_plan_records_have_strictly_falling_latency_in_cer_order() -> None:
    state = cluster(*(node(f"n{i}", 8) for i in range(4)))
    estimator = Estimator(DB, GenieSettings())
    platform = Platform.from_snapshot(state.snapshot({}))
    assert platform.models[0].nodes == 4 and platform.models[0].gpus_per_node == 8
    for model_type in ("ResNet50", "LSTM", "Alexnet"):
        plan = estimator.plan(job("j", model_type=model_type, gpus=32, batch=512), platform)
        cers = [plan.candidates[i].cer for i in plan.records]
        assert cers == sorted(cers, reverse=True)
        assert all(a > b for a, b in zip(plan.record_latencies, plan.record_latencies[1:],
                                         strict=False))
        # The last record is the fastest placement of all.
        fastest = min(plan.latency(i) for i in range(len(plan.candidates)))
        assert plan.record_latencies[-1] == fastest


def test_inference_and_training_plans_differ_by_communication() -> None:
    state = cluster(node("n1", 4), node("n2", 4))
    platform = Platform.from_snapshot(state.snapshot({}))
    estimator = Estimator(DB, GenieSettings())
    train = estimator.plan(job("t", gpus=8, batch=256), platform)
    infer = estimator.plan(job("i", gpus=8, batch=256, kind=JobKind.INFERENCE), platform)
    assert infer.record_latencies[-1] < train.record_latencies[-1]
    # Inference has no synchronisation: its fastest shape uses every GPU it may.
    fastest = infer.candidates[infer.records[-1]]
    assert fastest.gpus == 8


def test_registry_builds_every_policy_and_refuses_bad_options(tmp_path) -> None:
    for name in ("swaf", "capacity", "min-min", "weighted-fair", "tetris-perf", "tetris-cer",
                 "sjf", "fifo"):
        assert name in REGISTRY
        assert make_policy(name).name == name
    path = tmp_path / "db.toml"
    DB.save(path)
    assert isinstance(make_policy("swaf", modeldb=str(path), theta=0.2), SwafPolicy)
    with pytest.raises(ValueError, match="theta"):
        make_policy("swaf", theta=-1)
    with pytest.raises(ValueError, match="shape_mode"):
        make_policy("swaf", shape_mode="every")
    with pytest.raises(ValueError, match="late_tasks"):
        make_policy("swaf", late_tasks="drop")
    with pytest.raises(ValueError, match="urgent_placement"):
        make_policy("swaf", urgent_placement="slowest")
    with pytest.raises(ValueError, match="default_rate"):
        make_policy("sjf", default_rate=0)
    with pytest.raises(ModelDBError, match="cannot read"):
        make_policy("swaf", modeldb=str(tmp_path / "nope.json"))
    with pytest.raises(TypeError):
        make_policy("swaf", colour="blue")


def test_swaf_drives_the_scheduling_core_end_to_end() -> None:
    core = SchedulingCore(make_policy("swaf"))
    core.node_up(node("n1", 4))
    core.node_up(node("n2", 4))
    jobs = [
        job("a", gpus=4, qos=QosClass.NORMAL, submit=0.0, batch=256),
        job("b", gpus=4, qos=QosClass.PRIOR, submit=1.0, batch=256),
        job("c", gpus=8, qos=QosClass.URGENT, submit=2.0, batch=512),
    ]
    for j in jobs:
        core.check_submittable(j.spec)
        core.submit(j)
    first = core.schedule(now=3.0)
    started = [d.job_id for d in first]
    assert started[0] == "c"  # urgent first, on its fastest placement: every GPU
    assert core.placement_of("c") is not None and core.placement_of("c").gpu_count == 8
    assert core.jobs["a"].state is JobState.QUEUED
    for n in core.placement_of("c").nodes:
        core.node_started("c", n, 4.0)
    assert core.jobs["c"].state is JobState.RUNNING
    for n in core.placement_of("c").nodes:
        core.node_exited("c", n, 0, None, 500.0)
    assert core.jobs["c"].state is JobState.FINISHED
    second = core.schedule(now=500.0)
    assert {d.job_id for d in second} == {"a", "b"}
    assert second[0].job_id == "b"  # prior before normal
    assert core.schedule(now=501.0) == []


def test_decisions_match_the_reference_on_a_mixed_queue() -> None:
    state = cluster(node("a1", 8), node("a2", 8), node("b1", 4, gpu_model="Tesla V100"))
    hold(state, "a1", 5, 3)
    queue = [
        job("j1", gpus=4, qos=QosClass.NORMAL, submit=0.0),
        job("j2", gpus=2, model_type="LSTM", batch=128, qos=QosClass.PRIOR, submit=3.0),
        job("j3", gpus=8, model_type="Alexnet", batch=512, qos=QosClass.URGENT, submit=4.0),
        job("j4", gpus=1, model_type=None, batch=None, iterations=None, submit=5.0),
        job("j5", gpus=0, cpus=3, model_type=None, submit=6.0),
        job("j6", gpus=3, model_type="Seq2seq", kind=JobKind.INFERENCE, gpu_model=K80,
            submit=7.0),
    ]
    policy = SwafPolicy(DB)
    snapshot = state.snapshot({})
    decisions = policy.decide(snapshot, queue, 10.0)
    assert decisions == ref_decide(snapshot, queue, 10.0, DB, policy.settings)
    assert {d.job_id for d in decisions} >= {"j3", "j5"}


def test_cache_follows_requeues_and_ids_that_change_meaning() -> None:
    state = cluster(node("n1", 4), node("n2", 4))
    a = job("a", gpus=4, submit=0.0)
    b = job("b", gpus=8, submit=1.0, qos=QosClass.PRIOR)
    policy = SwafPolicy(DB)
    snapshot = state.snapshot({})
    first = policy.decide(snapshot, [a, b], 2.0)
    assert first == ref_decide(snapshot, [a, b], 2.0, DB, policy.settings)
    # The start failed and the core re-queued both with a higher priority, between passes.
    a.requeue_priority = b.requeue_priority = 1
    assert policy.decide(snapshot, [a, b], 3.0) == SwafPolicy(DB).decide(snapshot, [a, b], 3.0)
    # The same ids come back as different jobs, one of them CPU-only.
    a2 = job("a", gpus=0, cpus=2, model_type=None, submit=4.0)
    b2 = job("b", gpus=1, submit=4.0, qos=QosClass.URGENT)
    got = policy.decide(snapshot, [a2, b2], 5.0)
    assert got == ref_decide(snapshot, [a2, b2], 5.0, DB, policy.settings)
    assert [d.placement.gpu_count for d in got] == [1, 0]
    assert policy.explain("a") is None


def test_a_node_joining_a_large_cluster_does_not_replan_the_queue() -> None:
    state = cluster(*(node(f"n{i:02d}", 8) for i in range(32)))
    for i in range(32):
        hold(state, f"n{i:02d}", 8)
    queue = [job(f"j{i}", gpus=1 + i % 16, batch=64 + i, submit=float(i)) for i in range(40)]
    queue.append(job("wide", gpus=64, batch=4096, submit=50.0))
    policy = SwafPolicy(DB)
    planned: list[str] = []
    real_plan = policy.estimator.plan

    def counting_plan(j, platform):
        planned.append(j.id)
        return real_plan(j, platform)

    policy.estimator.plan = counting_plan  # type: ignore[method-assign]
    policy.decide(state.snapshot({}), queue, 60.0)
    assert len(planned) == len(queue)
    planned.clear()
    state.upsert_node(node("n32", 8))
    decisions = policy.decide(state.snapshot({}), queue, 61.0)
    # Only the job that may spread over more than 32 nodes sees a different platform.
    assert planned == ["wide"]
    assert decisions == ref_decide(state.snapshot({}), queue, 61.0, DB, policy.settings)
    # Kept plans report cost and CER for the cluster as it is now (N = 33).
    started = {d.job_id for d in decisions}
    waiting = next(j for j in queue if j.id not in started and j.id != "wide")
    choice = policy.explain(waiting.id)
    assert choice is not None
    p = choice.placement
    assert p.cost == pytest.approx(cost(p.d_node, p.d_gpn, 33, 8, 0.4))
    assert p.cer == pytest.approx(p.rate / p.cost)
