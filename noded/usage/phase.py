"""Liquid's post phase (§6.1): a job's GPU utilisation falls below the threshold (15%) after
having been above it — training is over and the job saves its model.

Liquid cuts a job's phases where its utilisation crosses 15%. A training step can dip below
that for a sample (data loading, an evaluation pass), so the fall must last ``samples``
samples in a row; the first sample above the threshold ends the launching phase, whose length
is reported with the event (the pre phase Liquid's rule reads for the next job). The post
phase runs from the first sample of the fall that lasted (``post_from``) to the part's exit:
its length goes in the part's final usage report (``post_s``), which is what the master's
resource model learns phase lengths from.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class PhaseDetector:
    threshold_pct: float = 15.0
    samples: int = 3
    started: float | None = None
    trained_at: float | None = None  # first sample above the threshold
    below: int = 0
    below_from: float | None = None  # first sample of the current fall
    post_from: float | None = None  # first sample of the fall that became the post phase
    reported: bool = False

    def add(self, now: float, util_pct: float) -> bool:
        """Feed one sample; True exactly once, when the post phase begins."""
        if self.started is None:
            self.started = now
        if self.reported:
            return False
        if util_pct >= self.threshold_pct:
            if self.trained_at is None:
                self.trained_at = now
            self.below = 0
            return False
        if self.trained_at is None:
            return False  # still launching
        if self.below == 0:
            self.below_from = now
        self.below += 1
        if self.below >= self.samples:
            self.reported = True
            self.post_from = self.below_from
            return True
        return False

    def post_s(self, now: float) -> float | None:
        """How long the post phase has lasted at ``now`` (None: not in it)."""
        if self.post_from is None:
            return None
        return max(0.0, now - self.post_from)

    @property
    def pre_s(self) -> float | None:
        if self.started is None or self.trained_at is None:
            return None
        return self.trained_at - self.started
