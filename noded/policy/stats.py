"""Peaks, means and standard deviations kept as samples come (Welford's update): the
node's usage accumulator, pure so the simulator meters with the same code (sim/liquid_meter)."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class Running:
    count: int = 0
    mean: float = 0.0
    _m2: float = 0.0
    peak: float | None = None

    def add(self, value: float) -> None:
        self.count += 1
        delta = value - self.mean
        self.mean += delta / self.count
        self._m2 += delta * (value - self.mean)
        self.peak = value if self.peak is None else max(self.peak, value)

    @property
    def std(self) -> float:
        return math.sqrt(self._m2 / self.count) if self.count else 0.0

    def value(self) -> float | None:
        return self.mean if self.count else None
