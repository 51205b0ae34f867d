"""Fitting GENIE's coefficients from lightweight profiling (seeds/genie.md §5.1.5).

B single-GPU runs at different batch sizes give k0..k2 (Eq. 7) by linear least squares;
N + G runs at one fixed global batch give γ and λ (Eq. 8). Eq. 8 is linear in γ and μ = γ·λ:

    Comm(s) = γ·x(s) + μ·y(s),  x = (d_node−1)·d_gpn / (D−1),  y = (d_gpn−1) / (D−1),
    D = d_node·d_gpn

and each run's observed penalty is ``D − PR_measured / sPR(batch / D)`` (Eq. 5), so γ and μ come
from a two-variable non-negative least squares and λ = μ/γ. Optional timed runs give ν (Eq. 4).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from masterd.core.genie.model import (
    Coefficients,
    ModelError,
    local_batch,
    processing_rate,
    single_gpu_rate,
)


class FitError(ValueError):
    """The profiling runs cannot determine the coefficients."""


@dataclass(frozen=True)
class ThroughputSample:
    """One single-GPU run: local batch size -> measured samples/s."""

    batch: float
    rate: float


@dataclass(frozen=True)
class PlacementSample:
    """One run at the fixed global batch on ``d_node`` nodes × ``d_gpn`` GPUs -> samples/s."""

    d_node: int
    d_gpn: int
    rate: float


@dataclass(frozen=True)
class LatencySample:
    """One timed run: ``seconds`` from launch to completion of ``iterations`` at ``batch``."""

    d_node: int
    d_gpn: int
    batch: float
    iterations: float
    seconds: float


@dataclass(frozen=True)
class FitQuality:
    rmse: float  # samples/s
    mean_relative: float  # mean |predicted − measured| / measured


@dataclass(frozen=True)
class FitResult:
    coefficients: Coefficients
    single_gpu: FitQuality  # of sPR against the B single-GPU runs
    placements: FitQuality | None  # of PR against the N + G runs (None for inference)
    startup_rmse: float | None  # of Lat against the timed runs, when given


def _errors(predicted: Sequence[float], measured: Sequence[float]) -> FitQuality:
    p = np.asarray(predicted, dtype=float)
    m = np.asarray(measured, dtype=float)
    return FitQuality(
        rmse=float(np.sqrt(np.mean((p - m) ** 2))),
        mean_relative=float(np.mean(np.abs(p - m) / m)),
    )


def _positive(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise FitError(f"{name} must be a number, got {value!r}")
    if not (math.isfinite(value) and value > 0):
        raise FitError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def fit_single_gpu(samples: Sequence[ThroughputSample]) -> tuple[float, float, float, FitQuality]:
    """Least-squares k0, k1, k2 of Eq. 7 from single-GPU runs (needs 3 distinct batches)."""
    batches = [_positive(f"samples[{i}].batch", s.batch) for i, s in enumerate(samples)]
    rates = [_positive(f"samples[{i}].rate", s.rate) for i, s in enumerate(samples)]
    if len(set(batches)) < 3:
        raise FitError(
            f"need single-GPU runs at 3 or more distinct batch sizes, got {sorted(set(batches))}"
        )
    b = np.asarray(batches)
    design = np.column_stack([np.ones_like(b), b, b * b])
    (k0, k1, k2), *_ = np.linalg.lstsq(design, np.asarray(rates), rcond=None)
    fitted = Coefficients(float(k0), float(k1), float(k2))
    predicted = [single_gpu_rate(fitted, x) for x in batches]
    return float(k0), float(k1), float(k2), _errors(predicted, rates)


def _nnls_gamma_mu(x: np.ndarray, y: np.ndarray, c: np.ndarray) -> tuple[float, float]:
    """Minimise |γx + μy − c|² over γ > 0, μ ≥ 0 (or γ = μ = 0, no penalty at all)."""
    options: list[tuple[float, float]] = [(0.0, 0.0)]
    design = np.column_stack([x, y])
    (g, mu), *_ = np.linalg.lstsq(design, c, rcond=None)
    if g > 0 and mu >= 0:
        options.append((float(g), float(mu)))
    xx = float(x @ x)
    if xx > 0:
        g_only = float(x @ c) / xx
        if g_only > 0:
            options.append((g_only, 0.0))
    return min(options, key=lambda o: float(np.sum((o[0] * x + o[1] * y - c) ** 2)))


def fit_comm(
    samples: Sequence[PlacementSample], global_batch: float, spr: Coefficients
) -> tuple[float, float]:
    """γ and λ of Eq. 8 from runs at one global batch, given the single-GPU fit ``spr``."""
    global_batch = _positive("global_batch", global_batch)
    xs: list[float] = []
    ys: list[float] = []
    cs: list[float] = []
    for i, s in enumerate(samples):
        if s.d_node < 1 or s.d_gpn < 1:
            raise FitError(f"samples[{i}]: placement <{s.d_node}, {s.d_gpn}> is not a placement")
        rate = _positive(f"samples[{i}].rate", s.rate)
        total = s.d_node * s.d_gpn
        if total == 1:
            continue  # Comm is 0 by definition: no information about γ or λ
        per_gpu = single_gpu_rate(spr, local_batch(global_batch, s.d_node, s.d_gpn))
        if not per_gpu > 0:
            raise FitError(
                f"samples[{i}]: the single-GPU fit predicts no throughput at local batch "
                f"{global_batch / total:g}; profile smaller placements or more batch sizes"
            )
        xs.append((s.d_node - 1) * s.d_gpn / (total - 1))
        ys.append((s.d_gpn - 1) / (total - 1))
        cs.append(total - rate / per_gpu)
    x, y = np.asarray(xs), np.asarray(ys)
    if len(cs) < 2 or np.linalg.matrix_rank(np.column_stack([x, y])) < 2:
        raise FitError(
            "need multi-GPU runs both across nodes (d_node > 1) and within a node (d_gpn > 1) "
            "to separate γ from λ"
        )
    gamma, mu = _nnls_gamma_mu(x, y, np.asarray(cs))
    lam = mu / gamma if gamma > 0 else 0.0
    return gamma, lam


def fit_profile(
    single_gpu: Sequence[ThroughputSample],
    placements: Sequence[PlacementSample] = (),
    global_batch: float | None = None,
    timed: Sequence[LatencySample] = (),
    inference: bool = False,
    max_local_batch: float | None = None,
) -> FitResult:
    """All coefficients of one (model type, GPU model, calculation type) from B + N + G runs.

    Inference has no synchronisation (Comm = 0), so it needs no placement runs.
    """
    k0, k1, k2, spr_error = fit_single_gpu(single_gpu)
    base = Coefficients(k0, k1, k2, max_local_batch=max_local_batch)
    gamma = lam = 0.0
    placement_error: FitQuality | None = None
    if not inference:
        if global_batch is None:
            raise FitError("global_batch is required to fit γ and λ for training")
        gamma, lam = fit_comm(placements, global_batch, base)
        with_comm = Coefficients(k0, k1, k2, gamma, lam, max_local_batch=max_local_batch)
        predicted: list[float] = []
        measured: list[float] = []
        for s in placements:
            rate = processing_rate(with_comm, global_batch, s.d_node, s.d_gpn)
            predicted.append(rate if rate is not None else 0.0)
            measured.append(s.rate)
        placement_error = _errors(predicted, measured)
    nu, startup_rmse = _fit_startup(
        Coefficients(k0, k1, k2, gamma, lam, max_local_batch=max_local_batch), timed, inference
    )
    try:
        coefficients = Coefficients(k0, k1, k2, gamma, lam, nu, max_local_batch)
    except ModelError as exc:
        raise FitError(f"the fit produced unusable coefficients: {exc}") from None
    return FitResult(coefficients, spr_error, placement_error, startup_rmse)


def _fit_startup(
    c: Coefficients, timed: Sequence[LatencySample], inference: bool
) -> tuple[float, float | None]:
    """ν of Eq. 4: the mean of measured time minus predicted compute time (never negative)."""
    if not timed:
        return 0.0, None
    residuals: list[float] = []
    for i, s in enumerate(timed):
        seconds = _positive(f"timed[{i}].seconds", s.seconds)
        iterations = _positive(f"timed[{i}].iterations", s.iterations)
        batch = _positive(f"timed[{i}].batch", s.batch)
        if s.d_node < 1 or s.d_gpn < 1:
            raise FitError(f"timed[{i}]: placement <{s.d_node}, {s.d_gpn}> is not a placement")
        rate = processing_rate(c, batch, s.d_node, s.d_gpn, inference)
        if rate is None:
            raise FitError(f"timed[{i}]: the fitted model finds that placement infeasible")
        residuals.append(seconds - batch * iterations / rate)
    nu = max(0.0, float(np.mean(residuals)))
    return nu, float(np.sqrt(np.mean(np.square(np.asarray(residuals) - nu))))
