"""Helios' pure parts: consolidated placement, the QSSF policy, SJF's Helios options, the
rolling estimate and its blend, CES decisions (Algorithm 2) and the causal forecaster."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from masterd.core.consolidate import consolidate
from masterd.core.helios import ces, forecast
from masterd.core.helios.duration_model import JobRow, NameBuckets, train
from masterd.core.helios.estimate import (
    CLUSTER_MEAN,
    ESTIMATE_KEY,
    ML_KEY,
    OTHERS_SIMILAR,
    RECORDED_KEY,
    USER_MEAN,
    USER_SIMILAR,
    QssfEstimator,
    RollingHistory,
    blend,
)
from masterd.core.placement import FreePool
from masterd.core.policies import make_policy
from masterd.core.policy import Start
from masterd.core.scheduler import SchedulingCore
from shared.model import Job, JobSpec
from sim.cluster import NodeGroup, build_cluster


def cluster(nodes: int = 3, gpus: int = 8) -> SchedulingCore:
    core = SchedulingCore(make_policy("fifo"))
    for inv in build_cluster([NodeGroup(count=nodes, gpus_per_node=gpus, cpu_cores=16)]):
        core.node_up(inv)
    return core


def spec(gpus: int, name: str = "job", user: str = "alice", cpus: int = 0) -> JobSpec:
    return JobSpec(name=name, command=("true",), user=user, gpus=gpus, cpus=cpus)


def occupy(core: SchedulingCore, job_id: str, node: str, gpus: int) -> None:
    job = Job(id=job_id, spec=spec(gpus), submit_time=0.0)
    core.submit(job)
    pool = FreePool(core.snapshot())
    placement = consolidate(spec(gpus), pool)
    assert placement is not None
    # Force the node: re-place on the named node by taking its first free GPUs.
    view = core.cluster.node(node)
    assert view is not None
    from shared.model import NodeAllocation, Placement
    core.cluster.allocate(job_id, Placement((NodeAllocation(
        node, tuple(sorted(view.free_gpus))[:gpus], (), 0),)))


def test_consolidate_picks_the_fullest_node_that_fits() -> None:
    core = cluster()
    occupy(core, "a", "node-0000", 6)  # 2 free
    occupy(core, "b", "node-0001", 3)  # 5 free
    pool = FreePool(core.snapshot())
    placement = consolidate(spec(2), pool)
    assert placement is not None and placement.nodes == ("node-0000",)
    placement = consolidate(spec(4), pool)
    assert placement is not None and placement.nodes == ("node-0001",)


def test_consolidate_multi_node_needs_whole_free_nodes() -> None:
    core = cluster()
    occupy(core, "a", "node-0000", 1)
    # 16 GPUs: two whole nodes are needed, only two are entirely free.
    pool = FreePool(core.snapshot())
    placement = consolidate(spec(16), pool)
    assert placement is not None and set(placement.nodes) == {"node-0001", "node-0002"}
    # 12 GPUs = one whole node + 4 on the fullest node that fits (node-0000, 7 free).
    placement = consolidate(spec(12), pool)
    assert placement is not None
    by_node = {a.node: len(a.gpus) for a in placement.allocations}
    assert sorted(by_node.values()) == [4, 8] and by_node["node-0000"] == 4
    occupy(core, "c", "node-0001", 1)
    # No longer two whole free nodes: the job waits (packing would split it 7+8+1).
    assert consolidate(spec(16), FreePool(core.snapshot())) is None
    # A 4-GPU job still fits one node; it is never split 2x2.
    placement = consolidate(spec(4), FreePool(core.snapshot()))
    assert placement is not None and len(placement.allocations) == 1


def test_qssf_orders_by_gpu_time_and_stops_at_the_first_misfit() -> None:
    core = cluster(nodes=1)
    policy = make_policy("qssf")
    jobs = [Job(id="long1", spec=spec(1), submit_time=0.0,
                annotations={ESTIMATE_KEY: 5000.0}),
            Job(id="wide", spec=spec(8), submit_time=1.0, annotations={ESTIMATE_KEY: 100.0}),
            Job(id="short2", spec=spec(2), submit_time=2.0, annotations={ESTIMATE_KEY: 60.0}),
            Job(id="none", spec=spec(1), submit_time=3.0)]  # default 3600 s
    decisions = policy.decide(core.snapshot(), jobs, 0.0)
    # short2 (120 GPU-s) first; then wide (800 GPU-s) does not fit the 6 left: the pass stops
    # there, so neither long1 nor the unestimated job overtakes it.
    assert [d.job_id for d in decisions] == ["short2"]
    assert all(isinstance(d, Start) for d in decisions)
    backfilling = make_policy("qssf", backfill=True)
    started = [d.job_id for d in backfilling.decide(core.snapshot(), jobs, 0.0)]
    assert started == ["short2", "none", "long1"]


def test_sjf_helios_options() -> None:
    core = cluster(nodes=1)
    jobs = [Job(id="big", spec=spec(8), submit_time=0.0, annotations={RECORDED_KEY: 50.0}),
            Job(id="a", spec=spec(4), submit_time=1.0, annotations={RECORDED_KEY: 10.0}),
            Job(id="b", spec=spec(2), submit_time=2.0, annotations={RECORDED_KEY: 90.0})]
    core.submit(Job(id="run", spec=spec(2), submit_time=0.0))
    taken = consolidate(spec(2), FreePool(core.snapshot()))
    assert taken is not None
    core.cluster.allocate("run", taken)
    stopping = make_policy("sjf", rank="recorded", backfill=False, placement="consolidate")
    # Ranked a (10) < big (50) < b (90): a fits, big does not, b would fit but SJF stops.
    assert [d.job_id for d in stopping.decide(core.snapshot(), jobs, 0.0)] == ["a"]
    skipping = make_policy("sjf", rank="recorded", placement="consolidate")
    assert [d.job_id for d in skipping.decide(core.snapshot(), jobs, 0.0)] == ["a", "b"]
    with pytest.raises(ValueError, match="rank must be one of"):
        make_policy("sjf", rank="magic")
    with pytest.raises(ValueError, match="placement must be one of"):
        make_policy("fifo", placement="spread")


def test_rolling_estimate_follows_helios_order() -> None:
    history = RollingHistory()
    assert history.rolling("alice", "resnet-a", 1) is None  # nothing finished yet
    history.record("alice", "resnet50-train", 1, 100.0)
    history.record("alice", "resnet50-train", 4, 400.0)
    history.record("alice", "bert-large", 1, 1000.0)
    history.record("bob", "gpt-pretrain", 8, 9000.0)
    # Exact name, same GPU count preferred.
    r = history.rolling("alice", "resnet50-train", 4)
    assert r is not None and (r.value_s, r.source) == (400.0, USER_SIMILAR)
    # Similar name (>= 0.6): the mean of that name's jobs with the same GPU count.
    r = history.rolling("alice", "resnet50-trainx", 1)
    assert r is not None and r.source == USER_SIMILAR and r.value_s == 100.0
    # No similar name: the user's mean, same GPU count preferred.
    r = history.rolling("alice", "zzz", 1)
    assert r is not None and (r.source, r.value_s) == (USER_MEAN, 550.0)
    # A new user: other users' similar names, else the cluster mean.
    r = history.rolling("carol", "gpt-pretrain2", 8)
    assert r is not None and (r.source, r.value_s) == (OTHERS_SIMILAR, 9000.0)
    r = history.rolling("carol", "qqqq", 2)
    assert r is not None and r.source == CLUSTER_MEAN
    assert r.value_s == pytest.approx((100 + 400 + 1000 + 9000) / 4)
    with pytest.raises(ValueError):
        history.record("alice", "x", 1, math.nan)


def test_blend_uses_alpha_and_falls_back() -> None:
    history = RollingHistory()
    history.record("u", "n", 1, 100.0)
    rolling = history.rolling("u", "n", 1)
    assert blend(rolling, 1000.0, "ml").value_s == pytest.approx(0.1 * 100 + 0.9 * 1000)
    assert blend(rolling, -5.0, "ml").value_s == 100.0  # ML <= 0: rolling alone
    assert blend(rolling, None, None).value_s == 100.0
    assert blend(None, 50.0, "ml").value_s == 50.0  # no history yet: ML alone
    assert blend(None, None, None).value_s is None
    with pytest.raises(ValueError):
        blend(rolling, 1.0, None, alpha=2.0)


def test_qssf_estimator_as_replay_annotator() -> None:
    estimator = QssfEstimator()
    first = Job(id="1", spec=spec(1, "train-a"), submit_time=0.0)
    estimator.submitted(first, 0.0)
    assert ESTIMATE_KEY not in first.annotations  # nothing to go on yet
    estimator.finished(first, 300.0)
    second = Job(id="2", spec=spec(1, "train-b"), submit_time=1.0, annotations={ML_KEY: 600.0})
    estimator.submitted(second, 1.0)
    assert second.annotations[ESTIMATE_KEY] == pytest.approx(0.1 * 300 + 0.9 * 600)


def test_duration_model_learns_names_and_round_trips(tmp_path: Path) -> None:
    rows = []
    for i in range(400):
        short = i % 2 == 0
        rows.append(JobRow(user=f"u{i % 5}", tenant="t", name=("eval-" if short else "train-")
                           + str(i % 7), gpus=1 if short else 4, cpus=2,
                           submit_time=1.5e9 + 600 * i, duration_s=60.0 if short else 6000.0))
    model = train(rows)
    model.save(tmp_path / "trees.txt", tmp_path / "encoders.json")
    again = type(model).load(tmp_path / "trees.txt", tmp_path / "encoders.json")
    probe = [JobRow("u1", "t", "eval-3", 1, 2, 1.5e9), JobRow("u1", "t", "train-3", 4, 2, 1.5e9)]
    short, long = again.predict(probe)
    assert short < 200 < 3000 < long
    assert model.predict(probe) == again.predict(probe)
    buckets = NameBuckets()
    assert buckets.bucket("resnet-1", grow=True) == buckets.bucket("resnet-2", grow=True) == 0
    assert buckets.bucket("bert", grow=True) == 1
    assert buckets.bucket("zzzzzz") == 2  # unseen, not added


def test_ces_step_powers_down_and_wakes_per_algorithm_2() -> None:
    params = ces.CesParams(buffer=2, history_steps=2, future_steps=3, history_threshold=0.1,
                           future_threshold=0.0, min_decrease=1, cooldown_steps=2)
    state = ces.CesState(powered=20)
    falling = [12.0, 11.0]
    flat_forecast = [8.0] * 6
    result = ces.step(params, state, 0, falling, 8, flat_forecast, 20)
    assert (result.powered, result.shed, result.woken) == (10, 10, 0)
    # A rise right after the near future: keep the nodes.
    state = ces.CesState(powered=20)
    rising = [8.0] * 3 + [30.0] * 3
    assert ces.step(params, state, 0, falling, 8, rising, 20).shed == 0
    # Busy above powered: wake to busy + buffer, then hold for the cool-down.
    state = ces.CesState(powered=10)
    result = ces.step(params, state, 5, [9.0, 9.0], 12, flat_forecast, 20)
    assert (result.powered, result.woken) == (14, 4)
    low = [4.0] * 6
    held = ces.step(params, state, 6, [14.0, 13.0], 5, low, 20)
    assert held.shed == 0  # still cooling down (until step 7)
    assert ces.step(params, state, 7, [14.0, 13.0], 5, low, 20).shed == 7
    # The forecast above the busy count now (future trend < threshold): keep them.
    state = ces.CesState(powered=14)
    assert ces.step(params, state, 9, [14.0, 13.0], 5, flat_forecast, 20).shed == 0
    # Never beyond the total; vanilla keeps busy + buffer at every step.
    assert ces.wake_for(params, 10, 30, 20) == 10
    state = ces.CesState(powered=20)
    assert ces.vanilla_step(params, state, 3, 20).powered == 5
    assert ces.vanilla_step(params, state, 6, 20).woken == 3


def test_forecast_features_are_causal() -> None:
    rng = np.random.default_rng(1)
    y = rng.integers(0, 100, 400).astype(float)
    times = 1.5e9 + np.arange(400) * forecast.STEP_S
    origin = 250
    before = forecast.features(y, times, np.array([origin]), 30)
    changed = y.copy()
    changed[origin + 1:] = -1000.0  # the future is anything at all
    after = forecast.features(changed, times, np.array([origin]), 30)
    np.testing.assert_array_equal(before, after)
    changed[origin] = 12345.0  # the origin's own value does count
    assert not np.array_equal(before, forecast.features(changed, times, np.array([origin]), 30))


def test_forecaster_learns_a_daily_wave() -> None:
    steps = 12 * forecast.DAY_STEPS
    t = np.arange(steps)
    y = np.round(50 + 30 * np.sin(2 * np.pi * t / forecast.DAY_STEPS))
    times = 1.5e9 + t * forecast.STEP_S
    fit = forecast.fit(y, times, 9 * forecast.DAY_STEPS, 11 * forecast.DAY_STEPS, 12,
                       max_rounds=200)
    model = forecast.Forecaster(fit.model, 12)
    origin = 11 * forecast.DAY_STEPS + 20
    predicted = model.predict(y, times, [origin])[0]
    actual = y[origin + 1:origin + 13]
    assert forecast.smape(predicted, actual) < 10.0
    assert forecast.smape([0.0, 1.0], [0.0, 1.0]) == 0.0
