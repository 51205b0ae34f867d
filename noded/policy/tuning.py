"""One job part's tuning session (SODA §V-B2, §VI-H): which count to pin, which cores to hold.

:class:`PartTuning` wraps :class:`~noded.policy.tuner.CoreTuner` with what a driver carries
out: the re-pin to N_start at launch, one re-pin before each probe, the cores still *held*
(the top of the tuner's bracket: the tuner will never ask for more, so the rest go back at
once) and the final pin to the best fit. Every change comes out as a :class:`Pin`, which
noded's async loop (noded/tuning.py) applies to the cgroup and reports as ``cores_changed``,
and which the simulator (sim/soda.py) applies to its cluster state. Counts only: the driver
maps a count to the first cores of its own ranking. Nothing here does I/O or reads a clock.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from noded.policy.tuner import CoreTuner
from shared.config import TunerConfig


def rank_cores(cpus: Iterable[int], numa_of: dict[int, int], gpu_numa: set[int]) -> list[int]:
    """The order a part's cores are used in: its GPUs' NUMA nodes first, then by id; a part
    always runs on a prefix of it, so growing and shrinking move as few threads as possible."""
    return sorted(cpus, key=lambda c: (numa_of.get(c, 0) not in gpu_numa if gpu_numa else 0, c))


@dataclass(frozen=True)
class Pin:
    """A change to carry out: run on ``pinned`` cores, hold ``held`` (``pinned <= held``)."""

    pinned: int
    held: int
    step: int
    utilisation: float | None  # the window just measured (None before the first)
    measured: int | None  # the count that window was measured at
    converged: bool
    reason: str
    repin: bool  # the pinned count changed: move the job's threads before reporting


class PartTuning:
    """The tuning of one job part holding ``max_cores`` cores (its whole budget).

    ``pinned``/``step`` resume an unfinished session (noded after a restart): the part keeps
    running where it was. Raises :class:`~noded.policy.tuner.TunerError` for impossible bounds.
    """

    def __init__(
        self,
        *,
        n_start: int,
        warm: bool,
        launch_cores: int,
        min_cores: int,
        max_cores: int,
        config: TunerConfig,
        pinned: int | None = None,
        step: int = 0,
    ) -> None:
        self.max_cores = max_cores
        low = min(min_cores, max_cores)
        resumed = pinned is not None
        self.pinned = pinned if pinned is not None else max_cores
        self.step = step
        launch = min(max(launch_cores, low), max_cores)
        if resumed:
            launch = min(max(self.pinned, low), max_cores)
        self.launch = launch
        self.tuner = CoreTuner(
            n_start, max_cores=max_cores, min_cores=low, tolerance=config.tolerance,
            noise=config.noise, warm=warm, launch_cores=launch,
            reference_windows=config.reference_windows, confidence_z=config.confidence_z,
            max_windows=config.max_windows,
        )
        self.held = max_cores
        self.utilisation: float | None = None
        self.measured: int | None = None

    @property
    def converged(self) -> bool:
        return self.tuner.converged

    @property
    def best(self) -> int | None:
        return self.tuner.best

    def _pin(self, converged: bool, reason: str, repin: bool) -> Pin:
        return Pin(self.pinned, self.held, self.step, self.utilisation, self.measured,
                   converged, reason, repin)

    def begin(self) -> Pin | None:
        """At the start: the re-pin to the launch count (N_start), if the part is not there."""
        if self.launch == self.pinned:
            return None
        self.pinned = self.launch
        return self._pin(False, "launch at N_start", True)

    def next_window(self) -> Pin | None:
        """Before a window: the re-pin to the count the tuner wants measured, if it moved."""
        count = self.tuner.next_count()
        if count is None or count == self.pinned:
            return None
        self.pinned = count
        self.step += 1
        self.held = max(self.pinned, self.tuner.bracket[1])
        return self._pin(False, "probe", True)

    def observe(self, utilisation: float) -> Pin | None:
        """One window's mean GPU utilisation at the pinned count; the change it leads to."""
        self.tuner.observe(self.pinned, utilisation)
        self.utilisation, self.measured = utilisation, self.pinned
        if self.tuner.converged:
            best = self.tuner.best
            assert best is not None
            repin = best != self.pinned
            if repin:
                self.pinned = best
                self.step += 1
            self.held = best
            return self._pin(True, f"converged after {self.tuner.windows} window(s)", repin)
        top = max(self.pinned, self.tuner.bracket[1])
        if top < self.held:
            self.held = top  # the tuner will never ask for more: hand the rest back now
            return self._pin(False, "bracket narrowed", False)
        return None
