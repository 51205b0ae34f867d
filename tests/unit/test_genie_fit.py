"""Fitting GENIE's coefficients from B + N + G profiling runs recovers the truth."""

from __future__ import annotations

import numpy as np
import pytest

from masterd.core.genie import model as perf
from masterd.core.genie.fit import (
    FitError,
    LatencySample,
    PlacementSample,
    ThroughputSample,
    fit_comm,
    fit_profile,
    fit_single_gpu,
)
from masterd.core.genie.model import Coefficients

TRUTH = Coefficients(k0=8.0, k1=1.5, k2=-0.008, gamma=0.9, lam=0.35, nu=25.0)
GLOBAL_BATCH = 256
BATCHES = [1, 2, 4, 8, 16, 24, 32, 48, 64, 80]
# N runs across nodes (one GPU each) and G runs inside one node, as §5.1.5 describes.
PLACEMENTS = [(n, 1) for n in (2, 3, 4, 6, 8)] + [(1, g) for g in (2, 3, 4, 6, 8)] + [(2, 4)]


def runs(noise: float, seed: int = 7) -> tuple[list, list, list]:
    rng = np.random.default_rng(seed)

    def noisy(x: float) -> float:
        return float(x * (1 + rng.normal(0, noise)))

    single = [ThroughputSample(b, noisy(perf.single_gpu_rate(TRUTH, b))) for b in BATCHES]
    placed = []
    for dn, dg in PLACEMENTS:
        rate = perf.processing_rate(TRUTH, GLOBAL_BATCH, dn, dg)
        assert rate is not None
        placed.append(PlacementSample(dn, dg, noisy(rate)))
    timed = []
    for dn, dg, batch, iters in [(1, 1, 32, 500), (1, 4, 128, 800), (2, 2, 64, 300)]:
        lat = perf.latency(TRUTH, batch, iters, dn, dg)
        assert lat is not None
        timed.append(LatencySample(dn, dg, batch, iters, noisy(lat)))
    return single, placed, timed


def test_exact_samples_recover_the_coefficients_exactly() -> None:
    single, placed, timed = runs(noise=0.0)
    result = fit_profile(single, placed, GLOBAL_BATCH, timed)
    c = result.coefficients
    for name in ("k0", "k1", "k2", "gamma", "lam", "nu"):
        assert getattr(c, name) == pytest.approx(getattr(TRUTH, name), rel=1e-6, abs=1e-9)
    assert result.single_gpu.rmse < 1e-9
    assert result.placements is not None and result.placements.mean_relative < 1e-9
    assert result.startup_rmse is not None and result.startup_rmse < 1e-6


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_noisy_samples_recover_the_coefficients_closely(seed: int) -> None:
    single, placed, timed = runs(noise=0.01, seed=seed)
    result = fit_profile(single, placed, GLOBAL_BATCH, timed)
    c = result.coefficients
    assert c.k0 == pytest.approx(TRUTH.k0, abs=1.0)
    assert c.k1 == pytest.approx(TRUTH.k1, rel=0.05)
    assert c.k2 == pytest.approx(TRUTH.k2, rel=0.2)
    assert c.gamma == pytest.approx(TRUTH.gamma, rel=0.2)
    assert c.lam == pytest.approx(TRUTH.lam, abs=0.15)
    assert c.nu == pytest.approx(TRUTH.nu, abs=10.0)
    # The paper reports < 5% prediction error for the lightweight profiler.
    assert result.single_gpu.mean_relative < 0.05
    assert result.placements is not None and result.placements.mean_relative < 0.05
    # Predictions on placements never profiled stay close too.
    for dn, dg in [(3, 2), (4, 4)]:
        predicted = perf.processing_rate(c, GLOBAL_BATCH, dn, dg)
        truth = perf.processing_rate(TRUTH, GLOBAL_BATCH, dn, dg)
        assert predicted == pytest.approx(truth, rel=0.05)


def test_single_gpu_fit_alone() -> None:
    k0, k1, k2, err = fit_single_gpu([ThroughputSample(b, 3 + 2 * b + 0.5 * b * b)
                                      for b in (1, 2, 3, 5)])
    assert (k0, k1, k2) == pytest.approx((3, 2, 0.5))
    assert err.rmse == pytest.approx(0, abs=1e-9)


def test_no_communication_overhead_fits_gamma_zero() -> None:
    spr = Coefficients(k0=10, k1=1, k2=0)
    placed = []
    for dn, dg in [(2, 1), (4, 1), (1, 2), (1, 4)]:
        rate = perf.processing_rate(spr, 64, dn, dg)
        assert rate is not None
        placed.append(PlacementSample(dn, dg, rate * 1.001))  # a hair better than ideal
    gamma, lam = fit_comm(placed, 64, spr)
    assert gamma == 0.0 and lam == 0.0


def test_inference_needs_no_placement_runs() -> None:
    single, _, _ = runs(noise=0.0)
    result = fit_profile(single, inference=True)
    assert result.coefficients.gamma == 0.0 and result.placements is None
    assert result.coefficients.nu == 0.0 and result.startup_rmse is None


def test_max_local_batch_is_carried_into_the_coefficients() -> None:
    single, placed, _ = runs(noise=0.0)
    result = fit_profile(single, placed, GLOBAL_BATCH, max_local_batch=96)
    assert result.coefficients.max_local_batch == 96


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: fit_single_gpu([ThroughputSample(8, 10), ThroughputSample(16, 12)]),
         "3 or more distinct batch sizes"),
        (lambda: fit_single_gpu([ThroughputSample(b, 10) for b in (1, 2, 2, 1)]),
         "3 or more distinct batch sizes"),
        (lambda: fit_single_gpu([ThroughputSample(b, -1.0) for b in (1, 2, 3)]),
         r"samples\[0\].rate"),
        (lambda: fit_single_gpu([ThroughputSample(float("nan"), 1.0)]), r"samples\[0\].batch"),
        (lambda: fit_comm([PlacementSample(2, 1, 10), PlacementSample(4, 1, 18)], 64,
                          Coefficients(k0=10, k1=0, k2=0)),
         "within a node"),
        (lambda: fit_comm([PlacementSample(0, 1, 10)], 64, Coefficients(k0=10, k1=0, k2=0)),
         "not a placement"),
        (lambda: fit_profile(runs(0.0)[0], runs(0.0)[1]), "global_batch is required"),
    ],
)
def test_bad_profiling_data_gets_a_clear_error(call, message: str) -> None:
    with pytest.raises(FitError, match=message):
        call()
