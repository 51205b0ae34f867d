"""SCHED²'s setup fixed before training: the offered load the paper implies and a locality
truth that is monotone in servers, keeps the paper's order and passes through §II-A."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest

from masterd.core.sched2.estimate import Estimator
from masterd.core.sched2.locality import spread_factor, spread_slowdown
from shared.model import JobKind, JobSpec
from sim.oracle import oracle_modeldb
from sim.studies import sched2 as study
from sim.truth import SCHED2_SLOWDOWNS, TruthModel
from sim.workloads import sched2 as workload

TRACES = Path(__file__).resolve().parents[3] / "shared" / "traces"
needs_trace = pytest.mark.skipif(not (TRACES / "philly-jobs.csv").exists(),
                                 reason=f"no Philly trace at {TRACES}")
MODELS = tuple(sorted(SCHED2_SLOWDOWNS, key=SCHED2_SLOWDOWNS.__getitem__))  # least sensitive first


def test_implied_load_is_littles_law_on_the_papers_figures() -> None:
    # 5,422 s / 172 s = 31.5 jobs running, × 2.64 GPUs = 83 GPUs of 120.
    assert abs(workload.IMPLIED_LOAD - 5422 / 172 * 2.64 / 120) < 0.005
    assert workload.IMPLIED_LOAD == 0.69
    assert workload.Sched2Options().load == workload.IMPLIED_LOAD
    with pytest.raises(ValueError, match="load must be a positive number"):
        workload.Sched2Options(load=0.0)


def test_expected_work_weights_the_mix() -> None:
    one = (workload.TraceJob(100.0, 1, "a"), workload.TraceJob(300.0, 1, "a"))
    multi = (workload.TraceJob(1000.0, 4, "a"),)
    assert workload.expected_work((one, multi), 0.75) == pytest.approx(0.75 * 200 + 0.25 * 4000)
    assert workload.expected_work((one + multi,), None) == pytest.approx((100 + 300 + 4000) / 3)


@needs_trace
def test_durations_are_scaled_to_the_asked_load() -> None:
    unscaled = workload.Sched2Options(load=None)
    assert workload.duration_scale(TRACES, unscaled) == 1.0
    raw = workload.expected_work(workload._candidates(TRACES, unscaled), 0.68)
    # The measurement: Philly's jobs at the 68% mix offer about 1.81.
    assert raw / (172 * 120) == pytest.approx(1.81, abs=0.03)
    for load in (0.5, workload.IMPLIED_LOAD, 1.2):
        opts = workload.Sched2Options(load=load)
        scale = workload.duration_scale(TRACES, opts)
        assert raw * scale / (172 * 120) == pytest.approx(load)
    truth = TruthModel(study.TRUTH)
    opts = workload.Sched2Options()
    loads = [workload.episode(TRACES, opts, e, truth).notes["offered_load"]
             for e in (0, 30, 31)]
    # Realised loads scatter around the target (a heavy-tailed mix over 1,000 jobs).
    assert 0.45 < sum(loads) / len(loads) < 1.0
    w = workload.episode(TRACES, opts, 30, truth)
    base = workload.episode(TRACES, unscaled, 30, truth)
    scale = workload.duration_scale(TRACES, opts)
    for a, b in zip(w.jobs[:50], base.jobs[:50], strict=True):
        assert a.spec.gpus == b.spec.gpus and a.submit == b.submit
        assert a.truth.known_duration == pytest.approx(b.truth.known_duration * scale)


def test_locality_form_passes_through_two_servers_and_grows_with_servers() -> None:
    assert spread_factor(1) == 0.0 and spread_factor(2) == 1.0
    factors = [spread_factor(s) for s in range(1, 17)]
    assert all(a < b for a, b in itertools.pairwise(factors))
    assert factors[-1] < 2.0
    assert spread_slowdown(5.9, 2) == pytest.approx(5.9)
    with pytest.raises(ValueError):
        spread_slowdown(0.5, 2)


def _slowdown(truth: TruthModel, model: str, gpus: int, servers: int) -> float:
    profile = truth.profile_for(model, JobKind.TRAINING)
    one = truth.placed_rate(profile, JobKind.TRAINING, 128, gpus, 1, False, False)[0]
    return one / truth.placed_rate(profile, JobKind.TRAINING, 128, gpus, servers, False,
                                   False)[0]


def test_truth_is_monotone_keeps_the_papers_order_and_fits_section_2a() -> None:
    truth = TruthModel(study.TRUTH)
    for model, measured in SCHED2_SLOWDOWNS.items():
        assert _slowdown(truth, model, 4, 2) == pytest.approx(measured)
    for gpus in (2, 3, 4, 8, 16):
        for servers in range(2, gpus + 1):
            row = [_slowdown(truth, m, gpus, servers) for m in MODELS]
            assert all(a < b for a, b in itertools.pairwise(row)), (gpus, servers)
            for m in MODELS:
                # Strictly slower on every added server, never near the efficiency floor.
                assert _slowdown(truth, m, gpus, servers) > _slowdown(truth, m, gpus,
                                                                      servers - 1)
                assert _slowdown(truth, m, gpus, servers) < 2 * SCHED2_SLOWDOWNS[m]


def test_profiles_match_the_truth_at_every_shape() -> None:
    truth = TruthModel(study.TRUTH)
    estimator = Estimator(oracle_modeldb(study.TRUTH, workload.GPU_MODEL))
    for model in MODELS:
        for gpus in (2, 4, 16):
            spec = JobSpec(name="x", command=("x",), user="u", gpus=gpus, model_type=model,
                           batch=128, iterations=1000)
            first = estimator._predict(spec, workload.GPU_MODEL, 1)
            for servers in range(2, min(gpus, 4) + 1):
                ratio = estimator._predict(spec, workload.GPU_MODEL, servers) / first
                assert math.isclose(ratio, _slowdown(truth, model, gpus, servers),
                                    rel_tol=1e-9)
