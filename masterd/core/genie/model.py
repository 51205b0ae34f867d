"""GENIE's prediction model for one DL task (seeds/genie.md §5.1, Eq. 4–8).

A task ``t = <type, batch, iters>`` under placement ``s = <d_node, d_gpn>``:

- local batch ``b = batch / (d_node·d_gpn)`` (Eq. 6)
- ``sPR(b) = k0 + k1·b + k2·b²``: samples/s of one GPU (Eq. 7)
- ``Comm(s) = γ·((d_node−1)·d_gpn + λ·(d_gpn−1)) / (d_node·d_gpn − 1)``, 0 on one GPU and for
  inference (Eq. 8): the average path length from one GPU to the others, where a hop to another
  node weighs 1 and a hop inside the node weighs λ, scaled by γ. It is measured in "GPUs lost".
- ``PR(t, s) = (d_node·d_gpn − Comm(s))·sPR(b)`` (Eq. 5)
- ``Lat(t, s) = batch·iters / PR(t, s) + ν`` (Eq. 4)

Guards (the paper is silent; these keep the scheduler away from nonsense placements):

- a placement with more GPUs than samples in the global batch (local batch < 1) is infeasible;
- a local batch above ``max_local_batch`` (what fits in one GPU's memory, when profiled) is
  infeasible (Fig. 4: Inception-v3 cannot train with batch 128 on one K80);
- a fitted quadratic with ``k2 < 0`` turns down after its vertex, but the measured rate
  plateaus there (Observation 1), so ``sPR`` is held at its vertex value for larger batches;
- ``sPR ≤ 0`` or ``PR ≤ 0`` (communication eats every GPU) is infeasible: ``None``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


class ModelError(ValueError):
    """Coefficients or arguments that cannot describe a real task or placement."""


def _finite(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ModelError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(value):
        raise ModelError(f"{name} must be finite, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class Coefficients:
    """Fitted coefficients of one (model type, GPU model, calculation type)."""

    k0: float
    k1: float
    k2: float
    gamma: float = 0.0
    lam: float = 0.0
    nu: float = 0.0
    max_local_batch: float | None = None

    def __post_init__(self) -> None:
        for name in ("k0", "k1", "k2", "gamma", "lam", "nu"):
            object.__setattr__(self, name, _finite(name, getattr(self, name)))
        for name in ("gamma", "lam", "nu"):
            if getattr(self, name) < 0:
                raise ModelError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.max_local_batch is not None:
            limit = _finite("max_local_batch", self.max_local_batch)
            if limit < 1:
                raise ModelError(f"max_local_batch must be >= 1, got {limit}")
            object.__setattr__(self, "max_local_batch", limit)

    @property
    def plateau_batch(self) -> float | None:
        """The local batch where the quadratic peaks (k2 < 0), beyond which sPR is held."""
        if self.k2 < 0:
            return -self.k1 / (2.0 * self.k2)
        return None


def _check_shape(d_node: int, d_gpn: int) -> None:
    if d_node < 1 or d_gpn < 1:
        raise ModelError(f"placement <{d_node}, {d_gpn}> needs at least one node and one GPU")


def local_batch(batch: float, d_node: int, d_gpn: int) -> float:
    """Eq. 6: the batch each GPU processes under symmetric data parallelism."""
    _check_shape(d_node, d_gpn)
    return batch / (d_node * d_gpn)


def single_gpu_rate(c: Coefficients, local: float) -> float:
    """Eq. 7: samples/s of one GPU at local batch ``local`` (held at the plateau; may be ≤ 0)."""
    peak = c.plateau_batch
    if peak is not None and local > peak:
        local = peak
    return c.k0 + c.k1 * local + c.k2 * local * local


def comm_penalty(c: Coefficients, d_node: int, d_gpn: int, inference: bool = False) -> float:
    """Eq. 8: synchronisation overhead in GPU-equivalents; none on one GPU or for inference."""
    _check_shape(d_node, d_gpn)
    total = d_node * d_gpn
    if inference or total == 1:
        return 0.0
    return ((d_node - 1) * d_gpn + c.lam * (d_gpn - 1)) * c.gamma / (total - 1)


def processing_rate(
    c: Coefficients, batch: float, d_node: int, d_gpn: int, inference: bool = False
) -> float | None:
    """Eq. 5: samples/s of the whole task, or None when the placement is infeasible."""
    total = d_node * d_gpn
    local = local_batch(batch, d_node, d_gpn)
    if local < 1:
        return None
    if c.max_local_batch is not None and local > c.max_local_batch:
        return None
    spr = single_gpu_rate(c, local)
    if not spr > 0:
        return None
    rate = (total - comm_penalty(c, d_node, d_gpn, inference)) * spr
    return rate if rate > 0 and math.isfinite(rate) else None


def latency_from_rate(work: float, rate: float, nu: float) -> float:
    """Eq. 4 given PR: ``work`` is batch·iters samples."""
    return work / rate + nu


def latency(
    c: Coefficients,
    batch: float,
    iterations: float,
    d_node: int,
    d_gpn: int,
    inference: bool = False,
) -> float | None:
    """Eq. 4: predicted seconds from launch to completion, or None when infeasible."""
    rate = processing_rate(c, batch, d_node, d_gpn, inference)
    if rate is None:
        return None
    return latency_from_rate(batch * iterations, rate, c.nu)


def nominal_single_gpu_latency(
    c: Coefficients, batch: float, iterations: float
) -> float | None:
    """``Lat(t, <1,1>)`` as the QoS baseline (Eq. 9, 16), ignoring ``max_local_batch``.

    The ECT of a task that does not fit one GPU's memory is still defined relative to what one
    GPU would take, so the memory guard does not apply here; a non-positive rate does.
    """
    spr = single_gpu_rate(c, float(batch))
    if not spr > 0:
        return None
    return latency_from_rate(batch * iterations, spr, c.nu)
