"""The GENIE baselines (§7.1): Capacity, Min-Min, Weighted Fair, Tetris+Perf/CER, and SJF."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from masterd.core.genie.modeldb import ModelDB
from masterd.core.genie.plan import GenieSettings
from masterd.core.policies import make_policy
from masterd.core.policies.capacity import CapacityPolicy
from masterd.core.policies.weighted_fair import WeightedFairPolicy
from masterd.core.policy import Start
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
    policy = CapacityPolicy(quotas={"ResNet50": 0.5, "*": 0.5})
    # ResNet50 holds 3 of its 4 GPUs: a 2-GPU job exceeds the quota and blocks its type,
    # even though a 1-GPU ResNet job behind it would fit; LSTM has its own quota.
    assert started(policy.decide(state.snapshot(running), queue, 5.0)) == ["lstm"]


def test_capacity_default_splits_equally_between_present_types() -> None:
    policy = CapacityPolicy()
    assert policy.limits({"a", "b", "c"}, 12) == {"a": 4, "b": 4, "c": 4}
    state = cluster(node("n1", 4))
    queue = [job("r1", gpus=2, submit=0), job("r2", gpus=2, submit=1),
             job("l1", model_type="LSTM", gpus=2, submit=2)]
    # Two types share 4 GPUs: 2 each, so the second ResNet job waits for its share.
    assert started(policy.decide(state.snapshot({}), queue, 3.0)) == ["r1", "l1"]


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
