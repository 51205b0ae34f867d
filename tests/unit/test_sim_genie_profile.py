"""Profiling the simulated platform with the live profiler's campaign and fit; Fig. 15's error."""

from __future__ import annotations

from dataclasses import replace

import pytest

from masterd.core.genie.modeldb import ModelDB
from masterd.core.policies import make_policy
from sim.engine import SimConfig, simulate
from sim.genie_profile import (
    ProfilingError,
    profile_batches,
    profile_platform,
    replayed_latencies,
)
from sim.truth import TruthConfig, TruthModel
from sim.workloads import genie


def test_batches_are_powers_of_two_up_to_the_largest() -> None:
    assert profile_batches(256) == (1, 2, 4, 8, 16, 32, 64, 128, 256)
    with pytest.raises(ProfilingError, match="at least 4"):
        profile_batches(2)


def test_campaign_recovers_the_truth_where_the_model_can_describe_it() -> None:
    nodes = genie.generate(genie.GenieOptions(density=5.0, hours=1.0)).nodes
    exact = TruthConfig(noise_sigma=0.0)
    profile = profile_platform(nodes, TruthModel(exact, 1), {"resnet50": 128})
    # Inference of ResNet-50 saturates at local batch 128 in the truth: B = 1..128 lies on one
    # quadratic, so the fit is the truth's, and its wall times give ν exactly.
    truth = exact.profiles["resnet50"][1]
    fitted = profile.db.get("resnet50", "K80", "inference")
    assert fitted is not None
    c = fitted.coefficients
    assert (c.k0, c.k1, c.k2) == pytest.approx((truth.k0, truth.k1, truth.k2), rel=1e-6)
    assert c.nu == pytest.approx(truth.startup_s, rel=1e-6)
    assert (c.gamma, c.lam) == (0.0, 0.0)
    # Training: B + N + G = 8 + 3 + 3 runs on 4 x 4 GPUs, and a communication penalty found.
    train = next(r for r in profile.campaigns if r.kind == "training")
    assert train.runs == 8 + 3 + 3 and train.global_batch == 128
    trained = profile.db.get("resnet50", "K80", "training")
    assert trained is not None and trained.coefficients.gamma > 0
    # Noise makes each run differ: another seed, another database.
    noisy = [profile_platform(nodes, TruthModel(TruthConfig(), s), {"resnet50": 128})
             for s in (1, 2)]
    a, b = (p.db.get("resnet50", "K80", "inference") for p in noisy)
    assert a is not None and b is not None and a.coefficients != b.coefficients
    with pytest.raises(ProfilingError, match="one GPU model"):
        v100 = replace(genie.GENIE_PLATFORM, gpu_model="V100", prefix="v")
        mixed = [*nodes[:1], *genie.generate(genie.GenieOptions(platform=v100)).nodes]
        profile_platform(mixed, TruthModel(exact, 1), {"resnet50": 128})


def test_replayed_latencies_compare_prediction_and_measurement() -> None:
    workload = genie.generate(genie.GenieOptions(density=5.0, hours=3.0, seed=4))
    exact = TruthConfig(noise_sigma=0.0, interference=False)
    profile = profile_platform(workload.nodes, TruthModel(exact, 4),
                               {m: 256 for m in ("alexnet", "googlenet", "resnet50",
                                                 "inception-v3", "lstm", "seq2seq")})
    result = simulate(workload, make_policy("swaf", modeldb=profile.db, shape_mode="any"),
                      SimConfig(seed=4, truth=exact))
    specs = {j.id: j.spec for j in workload.jobs}
    lats = replayed_latencies(profile.db, specs, result.records)
    assert len(lats) == sum(r.state == "finished" for r in result.records)
    for t in lats:
        assert t.predicted_s > 0 and t.measured_s > 0
        assert t.relative_error == abs(t.predicted_s - t.measured_s) / t.measured_s
    # Inference jobs on one GPU are predicted exactly (their fit is exact, nothing interferes).
    assert any(t.kind == "inference" and t.relative_error < 1e-6 for t in lats)
    # A database that knows nothing predicts nothing.
    assert replayed_latencies(ModelDB(), specs, result.records) == []
