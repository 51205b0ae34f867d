"""The GENIE baselines (§7.1): Capacity, Min-Min, Weighted Fair, Tetris+Perf/CER, and SJF."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from masterd.core.genie.modeldb import ModelDB
from masterd.core.genie.plan import GenieSettings
from masterd.core.policies import make_policy
from masterd.core.policies.capacity import CapacityPolicy, largest_remainder
from masterd.core.policies.weighted_fair import WeightedFairPolicy
from masterd.core.policy import Preempt, Start
from masterd.core.scheduler import SchedulingCore
from shared.model import Job, JobKind, NodeAllocation, Placement, QosClass
from tests.unit.genie_support import cluster, job, node, ref_candidates, ref_rank
from tests.unit.test_genie_swaf_props import check_no_double_allocation, clusters, jobs

DB = ModelDB.default()
BASELINES = ["capacity", "min-min", "weighted-fair", "tetris-perf", "tetris-cer", "sjf"]


def started(decisions: list) -> list[str]:
    return [d.job_id for d in decisions]


def one_gpu_free():
    state = cluster(node("n1", 4))
    state.allocate("hold", Placement((NodeAllocation("n1", (0, 1, 2), (), 0),)))
    return state


def test_min_min_serves_the_earliest_ect_first() -> None:
    state = one_gpu_free()
    normal = job("normal", gpus=1, qos=QosClass.NORMAL, submit=0.0)
    urgent = job("urgent", gpus=1, qos=QosClass.URGENT, submit=50.0)
    assert started(make_policy("min-min").decide(state.snapshot({}), [normal, urgent],
                                                  60.0)) == ["urgent"]


def test_weighted_fair_blends_arrival_and_ect() -> None:
    state = one_gpu_free()
    normal = job("normal", gpus=1, qos=QosClass.NORMAL, submit=0.0)
    prior = job("prior", gpus=1, qos=QosClass.PRIOR, submit=50.0)
    queue = [normal, prior]
    snapshot = state.snapshot({})
    assert started(WeightedFairPolicy(weight=1.0).decide(snapshot, queue, 60.0)) == ["normal"]
    assert started(WeightedFairPolicy(weight=0.0).decide(snapshot, queue, 60.0)) == ["prior"]
    with pytest.raises(ValueError, match="weight"):
        WeightedFairPolicy(weight=1.5)


def test_sjf_starts_the_shortest_predicted_job() -> None:
    state = one_gpu_free()
    long = job("long", gpus=1, iterations=100_000, submit=0.0)
    short = job("short", gpus=1, iterations=100, submit=10.0)
    assert started(make_policy("sjf").decide(state.snapshot({}), [long, short], 20.0)) == [
        "short"
    ]


def test_tetris_perf_and_cer_pick_their_placements_and_ignore_qos() -> None:
    state = cluster(node("n1", 4), node("n2", 4))
    j = job("j", gpus=8, batch=256, qos=QosClass.NORMAL, submit=0.0)
    candidates, _ = ref_candidates(j, state.snapshot({}), DB, GenieSettings())
    top = max(c.rate for c in candidates)
    fastest = min((c for c in candidates if c.rate == top), key=ref_rank)
    assert fastest != min(candidates, key=ref_rank)
    best_cer = min(candidates, key=ref_rank)
    for name, want in (("tetris-perf", fastest), ("tetris-cer", best_cer)):
        d = make_policy(name).decide(state.snapshot({}), [j], 0.0)
        assert len(d) == 1 and isinstance(d[0], Start)
        allocs = d[0].placement.allocations
        assert (len(allocs), len(allocs[0].gpus)) == (want.d_node, want.d_gpn), name
    # QoS-blind: queue order, even when a later job is urgent.
    state = one_gpu_free()
    normal = job("normal", gpus=1, submit=0.0)
    urgent = job("urgent", gpus=1, qos=QosClass.URGENT, submit=5.0)
    for name in ("tetris-perf", "tetris-cer"):
        assert started(make_policy(name).decide(state.snapshot({}), [normal, urgent],
                                                9.0)) == ["normal"]


def running_job(job_id: str, model_type: str, placement: Placement) -> Job:
    j = job(job_id, model_type=model_type, gpus=placement.gpu_count)
    j.placement = placement
    return j


def test_capacity_quota_blocks_a_type_but_not_the_others() -> None:
    state = cluster(node("n1", 4), node("n2", 4))
    held = Placement((NodeAllocation("n1", (0, 1, 2), (), 0),))
    state.allocate("r1", held)
    running = {"r1": running_job("r1", "ResNet50", held)}
    queue = [
        job("resnet", model_type="ResNet50", gpus=2, submit=0.0),
        job("resnet-small", model_type="resnet-50", gpus=1, submit=1.0),
        job("lstm", model_type="LSTM", gpus=2, submit=2.0),
    ]
    strict = CapacityPolicy(quotas={"ResNet50": 0.5, "*": 0.5}, lend=False)
    # ResNet50 holds 3 of its 4 GPUs: a 2-GPU job exceeds the quota and blocks its type,
    # even though a 1-GPU ResNet job behind it would fit; LSTM has its own quota.
    assert started(strict.decide(state.snapshot(running), queue, 5.0)) == ["lstm"]
    # Lending: once LSTM has its share, the idle GPUs go to ResNet's queue, in order.
    lending = CapacityPolicy(quotas={"ResNet50": 0.5, "*": 0.5})
    assert started(lending.decide(state.snapshot(running), queue, 5.0)) == [
        "lstm", "resnet", "resnet-small"]


def test_capacity_shares_leave_no_gpu_stranded() -> None:
    policy = CapacityPolicy()
    assert policy.guarantees({"a", "b", "c"}, 12) == {"a": 4, "b": 4, "c": 4}
    six = policy.guarantees({"a", "b", "c", "d", "e", "f"}, 16)
    assert sorted(six.values()) == [2, 2, 3, 3, 3, 3] and sum(six.values()) == 16
    assert largest_remainder({"x": 0.5, "y": 0.25}, 10) == {"x": 5, "y": 3}  # round(7.5)
    quotas = CapacityPolicy(quotas={"ResNet50": 0.5, "*": 0.5})
    assert quotas.guarantees({"resnet50", "lstm", "alexnet"}, 8) == {
        "resnet50": 4, "alexnet": 2, "lstm": 2}
    state = cluster(node("n1", 4))
    queue = [job("r1", gpus=2, submit=0), job("r2", gpus=2, submit=1),
             job("l1", model_type="LSTM", gpus=2, submit=2)]
    # Two types share 4 GPUs: 2 each, so the second ResNet job waits for its share.
    assert started(policy.decide(state.snapshot({}), queue, 3.0)) == ["r1", "l1"]


def test_capacity_lends_idle_gpus_and_reclaims_them_for_their_owner() -> None:
    core = SchedulingCore(CapacityPolicy())
    for name in ("n1", "n2"):
        core.node_up(node(name, 4))
    # Only ResNet jobs at first: the share is all 8 GPUs.
    for i in range(4):
        core.submit(job(f"r{i}", gpus=2, submit=float(i)))
    starts = core.schedule(10.0)
    assert [d.job_id for d in starts] == ["r0", "r1", "r2", "r3"]
    for d in starts:
        for n in d.placement.nodes:
            core.node_started(d.job_id, n, 10.0 + int(d.job_id[1]))
    # An LSTM job arrives: it is owed half the cluster, so the newest ResNet borrowers go.
    core.submit(job("l0", model_type="LSTM", gpus=4, submit=20.0))
    decided = core.schedule(20.0)
    assert all(isinstance(d, Preempt) for d in decided)
    assert sorted(d.job_id for d in decided) == ["r2", "r3"]
    for d in decided:
        job_ = core.jobs[d.job_id]
        for n in list(job_.node_states):
            core.node_exited(d.job_id, n, None, 15, 21.0)
    # The reclaimed GPUs go to the owner, and the preempted borrowers wait at the head.
    assert [d.job_id for d in core.schedule(21.0)] == ["l0"]
    assert [j.id for j in core.queue()] == ["r2", "r3"]
    # No preemption without a share owed: a borrower type's own jobs are not reclaimed.
    again = core.schedule(22.0)
    assert again == []


def test_capacity_job_larger_than_its_share_is_neither_owed_nor_preempted() -> None:
    state = cluster(node("n1", 4), node("n2", 4))
    big_place = Placement((NodeAllocation("n1", (0, 1, 2, 3), (), 0),))
    state.allocate("big", big_place)
    big = running_job("big", "LSTM", big_place)
    big.start_time = 1.0
    running = {"big": big}
    # Two types, 4 GPUs each; LSTM's 4-GPU job is its type's only one: not a borrower.
    queue = [job("r8", gpus=8, submit=2.0), job("l1", model_type="LSTM", gpus=1, submit=3.0)]
    decided = CapacityPolicy().decide(state.snapshot(running), queue, 5.0)
    assert not any(isinstance(d, Preempt) for d in decided)
    # The 8-GPU ResNet job cannot fit; LSTM is at its share, so l1 borrows the idle GPUs.
    assert started([d for d in decided if isinstance(d, Start)]) == ["l1"]


@pytest.mark.parametrize(
    ("quotas", "message"),
    [({}, "non-empty"), ({"ResNet50": 0}, "fraction"), ({"a": 0.7, "b": 0.7}, "more than 1"),
     ({"": 0.5}, "not a model type"), ({"a": "half"}, "fraction")],
)
def test_capacity_refuses_bad_quotas(quotas: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CapacityPolicy(quotas=quotas)


def test_cpu_only_jobs_are_placed_by_every_baseline() -> None:
    state = cluster(node("n1", 2, cpus=8))
    queue = [job("g", gpus=1, cpus=2, submit=0), job("c", gpus=0, cpus=2, model_type=None,
                                                     kind=JobKind.CPU, submit=1)]
    for name in BASELINES:
        assert set(started(make_policy(name).decide(state.snapshot({}), queue, 2.0))) == {
            "g", "c"}, name


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(state=clusters(), queue=jobs("b", 10), now=st.floats(0, 5e4),
       name=st.sampled_from(BASELINES))
def test_baselines_never_give_a_gpu_or_core_twice(state, queue, now, name) -> None:
    decisions = make_policy(name).decide(state.snapshot({}), queue, now)
    assert len({d.job_id for d in decisions}) == len(decisions)
    assert {d.job_id for d in decisions} <= {j.id for j in queue}
    check_no_double_allocation(state, decisions)
    for d in decisions:
        state.allocate(d.job_id, d.placement)
