"""The GENIE study as the paper sets it up: which rules the paper's rows and the ablation rows
replay, the offered load's arithmetic, and the pieces of the prediction error's decomposition."""

from __future__ import annotations

from dataclasses import replace

import pytest

from masterd.core.genie.modeldb import ModelDB
from shared.model import JobKind, JobSpec
from sim.genie_profile import TaskLatency
from sim.studies import genie as study
from sim.truth import DEFAULT_PROFILES, TruthParams
from sim.workloads import genie
from sim.workloads.base import SimJob, Workload

DB = ModelDB.default()


def test_paper_rows_use_the_papers_rules_and_ablations_change_one_each() -> None:
    base = study.Cell("short", 10.0, 1, 24.0, "swaf")
    assert study.build_policy(base, DB).settings.urgent_placement == "cer"  # line 13
    fastest = replace(base, variant="urgent-fastest")
    assert fastest.label == study.URGENT_FASTEST
    assert study.build_policy(fastest, DB).settings.urgent_placement == "fastest"
    defer = replace(base, variant="defer")
    policy = study.build_policy(defer, DB)
    assert policy.late_tasks == "defer" and policy.settings.urgent_placement == "cer"

    capacity = replace(base, policy="capacity")
    assert study.build_policy(capacity, DB).lend is False  # §7.1: only its own share
    lending = replace(capacity, variant="lend")
    assert lending.label == study.CAPACITY_LEND and study.build_policy(lending, DB).lend is True


def test_cells_add_ablations_and_error_decomposition_once_each() -> None:
    config = study.GenieStudy(densities=(5.0,), seeds=(1,), lengths=("short",),
                              policies=("swaf", "capacity", "tetris-cer"), defer_densities=(),
                              compare_cap=False, compare_builtin_db=False)
    todo = study.cells(config)
    keys = [(c.label, c.interference, c.noise) for c in todo]
    assert len(keys) == len(set(keys))  # no replay twice
    assert ("swaf-urgent-fastest", True, True) in keys
    assert ("capacity-lend", True, True) in keys
    swaf = {(c.interference, c.noise): c for c in todo if c.label == "swaf"}
    # Fig. 15's error with each source of error switched off, latencies kept for each.
    assert set(swaf) == {(True, True), (False, True), (True, False), (False, False)}
    assert all(c.keep_latencies for c in swaf.values())
    bare = study.cells(replace(config, ablations=False, decompose_error=False))
    assert {c.label for c in bare} == {"swaf", "capacity", "tetris-cer"}
    assert all(c.noise for c in bare)


def test_offered_load_is_single_gpu_work_over_platform_capacity() -> None:
    load = genie.OfferedLoad(tasks=240, work_gpu_h=312.0, gpus=16, hours=24.0)
    assert load.capacity_gpu_h == 384.0
    assert load.ratio == pytest.approx(0.8125)
    assert load.arithmetic() == "240 tasks, 312 GPU-h ÷ (16 GPUs × 24 h) = 0.81"

    # Two tasks whose single-GPU latency follows from the truth's curve by hand.
    train, infer = DEFAULT_PROFILES["resnet50"]
    nodes = genie.generate(genie.GenieOptions(density=1.0, hours=1.0)).nodes
    jobs = []
    expected_s = 0.0
    for i, (kind, profile, gpus) in enumerate(((JobKind.TRAINING, train, 4),
                                               (JobKind.INFERENCE, infer, 2))):
        batch, iterations = 64, 3600
        spec = JobSpec(name=f"t{i}", command=("x",), user="u", kind=kind, gpus=gpus,
                       model_type="resnet50", batch=batch, iterations=iterations)
        jobs.append(SimJob(f"t{i}", spec, float(i), TruthParams("resnet50", batch, iterations)))
        expected_s += batch * iterations / profile.single_gpu_rate(batch) + profile.startup_s
    got = genie.offered_load(Workload("w", jobs, nodes), hours=2.0)
    assert got.tasks == 2 and got.gpus == 16
    assert got.work_gpu_h == pytest.approx(expected_s / 3600)  # requested GPUs do not count
    assert got.ratio == pytest.approx(expected_s / 3600 / 32)


def test_offered_load_grows_with_density() -> None:
    ratios = [genie.offered_load(genie.generate(genie.GenieOptions(density=d, hours=6.0)),
                                 6.0).ratio for d in (5.0, 20.0)]
    assert 2.0 < ratios[1] / ratios[0] < 8.0


def test_signed_error_says_which_way_tasks_missed() -> None:
    slower = TaskLatency("m", "training", predicted_s=90.0, measured_s=100.0)
    faster = TaskLatency("m", "training", predicted_s=110.0, measured_s=100.0)
    assert study.signed_error_pct([slower]) == pytest.approx(10.0)
    assert study.signed_error_pct([slower, faster]) == pytest.approx(0.0)
    assert study.error_stats([slower, faster])[1] == pytest.approx(10.0)  # |error| does not
    assert study.signed_error_pct([]) is None


def test_error_decomposition_takes_each_replayed_setting_of_the_truth() -> None:
    """One row per (noise, interference) replayed, both on first; settings not replayed
    (and other policies' latencies) are left out."""
    base = study.Cell("short", 5.0, 1, 24.0, "swaf", keep_latencies=True)

    def result(cell: study.Cell, *lats: TaskLatency) -> study.CellResult:
        return study.CellResult(cell, {}, [], latencies=list(lats))

    on = TaskLatency("m", "training", predicted_s=90.0, measured_s=100.0)
    quiet = TaskLatency("m", "training", predicted_s=104.0, measured_s=100.0)
    quiet_cell = replace(base, noise=False, interference=False)
    res = study.Results([result(base, on, on), result(quiet_cell, quiet),
                         result(replace(base, policy="fifo"), quiet)])
    rows = study.error_decomposition(res, "short", 5.0)
    assert [(n, i) for n, i, _ in rows] == [(True, True), (False, False)]
    assert rows[0][2] == {"tasks": 2, "mean_pct": pytest.approx(10.0), "p95_pct":
                          pytest.approx(10.0), "bias_pct": pytest.approx(10.0)}
    assert rows[1][2]["bias_pct"] == pytest.approx(-4.0)
    assert study.decomposition_key(False, True) == "noise=off,interference=on"


def test_live_default_keeps_urgent_jobs_on_their_request_under_cap() -> None:
    """Why the master keeps urgent_placement="fastest" (docs/policies/genie.md): under its
    default shape_mode="cap", Algorithm 1's rule gives an urgent job the cheapest shape, the
    one a normal job with the same request gets, fewer GPUs than it asked for."""
    from masterd.core.policies.swaf import SwafPolicy
    from shared.model import QosClass
    from tests.unit.genie_support import cluster, job, node

    state = cluster(node("n1", 4), node("n2", 4))

    def gpus(qos: QosClass, rule: str) -> int:
        task = job("t", gpus=4, batch=64, iterations=2000, qos=qos, submit=5.0)
        (start,) = SwafPolicy(DB, urgent_placement=rule).decide(state.snapshot({}), [task], 5.0)
        return start.placement.gpu_count

    assert SwafPolicy(DB).settings.urgent_placement == "fastest"
    assert gpus(QosClass.URGENT, "fastest") == 4
    assert gpus(QosClass.URGENT, "cer") == gpus(QosClass.NORMAL, "fastest") < 4
