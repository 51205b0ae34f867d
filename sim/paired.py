"""Paired per-episode bootstrap of a ratio of means: how sure a comparison of two policies is.

Two policies replayed on the same episodes give paired values ``a[i]``, ``b[i]``. The ratio
of their means is resampled by drawing episodes with replacement (the same draw for both, so
the pairing is kept) ``resamples`` times, seeded; the interval is the 2.5th and 97.5th
percentiles. Episodes, not jobs, are the unit: jobs of one episode share its queue.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class PairedRatio:
    ratio: float  # mean(a) / mean(b) on every episode
    low: float
    high: float
    episodes: int

    def as_list(self) -> list[float]:
        return [self.low, self.high]


def paired_ratio(a: Sequence[float], b: Sequence[float], resamples: int = 10000,
                 seed: int = 1, level: float = 0.95) -> PairedRatio:
    """mean(a) / mean(b) with a paired bootstrap interval at ``level``."""
    if len(a) != len(b) or not a:
        raise ValueError(f"need the same non-zero number of episodes, got {len(a)} and {len(b)}")
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
        raise ValueError("every paired value must be a finite number")
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(x), size=(resamples, len(x)))
    ratios = x[draws].mean(axis=1) / y[draws].mean(axis=1)
    tail = (1.0 - level) / 2 * 100
    low, high = np.percentile(ratios, [tail, 100 - tail])
    return PairedRatio(float(x.mean() / y.mean()), float(low), float(high), len(x))


def speedup(a: Sequence[float], b: Sequence[float], **kw: object) -> PairedRatio:
    """How many times lower ``a``'s mean is than ``b``'s (JCT, makespan): mean(b) / mean(a)."""
    return paired_ratio(b, a, **kw)  # type: ignore[arg-type]
