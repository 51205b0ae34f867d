"""SODA's adaptive CPU allocator, tuning half (§V-B2, §VI-H): find a training job's best-fit
core count from GPU-utilisation feedback while the job runs.

The paper walks one core at a time from N_start. This tuner searches smarter, using what the
paper observed about the curve (utilisation rises with cores, then holds or drops slightly):

* **Reference first.** The job is launched with ``max_cores`` (the paper's "large parallelism
  at the beginning", §VI-H), so the first windows measure the plateau for free. A count
  *holds* when its mean utilisation is within ``tolerance`` points of that plateau; on a
  rising-then-flat curve, holding is monotone in the core count, so the best fit (the
  smallest holding count) can be found by bisection.
* **An optimal probe order.** For the bracket ``(lo, hi]`` (``lo`` known not to hold, ``hi``
  known to hold) the next count comes from a small dynamic programme over decision trees:
  a warm start (N_start from the owner's history) minimises the worst case for best fits
  within ``window`` cores of N_start first, then the overall worst case; a cold start (N_start
  is only a category default) minimises the overall worst case first. Over 1..32 that is at
  most 5 probes cold, and at most 4 for a best fit inside a warm window (3 near either end).
* **Noise-aware judgements.** The plateau estimate pools the windows of every count judged to
  hold. A judgement is accepted once the count's mean is ``confidence_z`` standard errors clear
  of the threshold; until then the same count is measured for another window (no re-pin), up
  to ``max_windows`` windows. For a warm start, a judgement that would send the search outside
  the history window needs ``leave_z`` standard errors, and the window wins a tie: a wrong exit
  costs several steps, a wrong stay at most the window's edge.

A *step* is one re-pin to a new core count that then gets measured; extra windows at the same
count are not steps but are counted in ``windows``. The final re-pin to ``best`` is not
measured and is not a step. Nothing here does I/O: noded pins, measures and feeds
``observe``.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

import numpy as np

log = logging.getLogger("trellis.tuner")

WARM_WINDOW = 3  # how far (cores) a history-based N_start is trusted to be from the best fit


class TunerError(ValueError):
    """A tuner was built with impossible bounds or fed an observation it did not ask for."""


class ProbePlan:
    """Which count to probe next for every bracket ``(lo, hi]`` of ``[min_cores, max_cores]``.

    ``window`` is the inclusive range of counts the best fit is expected in, or None.
    ``window_first`` makes the worst case inside the window the first criterion (warm start);
    otherwise the overall worst case comes first (cold start); the sum of probes over all
    answers (the expected count under a uniform prior) breaks ties. The tables are built
    once, on first use, in O(n^3) vectorised work (a fraction of a second for 128 cores), so
    one plan can be shared by every tuner with the same bounds and window.
    """

    def __init__(
        self,
        min_cores: int,
        max_cores: int,
        window: tuple[int, int] | None = None,
        window_first: bool = False,
    ) -> None:
        if min_cores < 1 or max_cores < min_cores:
            raise TunerError(
                f"core bounds must satisfy 1 <= min_cores <= max_cores "
                f"(min_cores={min_cores}, max_cores={max_cores})"
            )
        self.min_cores = min_cores
        self.max_cores = max_cores
        self.window = window
        self.window_first = window_first
        self._tables: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    def _build(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Tables indexed [i, j] for the bracket (lo, hi] = (base + i, base + j):
        worst probes for window answers (-1: none inside), worst probes overall, and the
        probe to make (the DP's choice)."""
        base = self.min_cores - 1
        n = self.max_cores - base
        win = np.full((n + 1, n + 1), -1, dtype=np.int64)
        worst = np.zeros((n + 1, n + 1), dtype=np.int64)
        total = np.zeros((n + 1, n + 1), dtype=np.int64)
        probe = np.full((n + 1, n + 1), -1, dtype=np.int64)
        if self.window is not None:
            for i in range(n):
                if self.window[0] <= base + i + 1 <= self.window[1]:
                    win[i, i + 1] = 0
        # Lexicographic order packed into one integer: every component is far below scale.
        scale = np.int64(1 << 21)
        for width in range(2, n + 1):
            for i in range(0, n - width + 1):
                j = i + width
                w = np.maximum(win[i, i + 1 : j], win[i + 1 : j, j])
                w = np.where(w >= 0, w + 1, -1)
                b = np.maximum(worst[i, i + 1 : j], worst[i + 1 : j, j]) + 1
                t = total[i, i + 1 : j] + total[i + 1 : j, j] + width
                first, second = (w + 1, b) if self.window_first else (b, w + 1)
                k = int(np.argmin((first * scale + second) * scale + t))
                win[i, j], worst[i, j], total[i, j] = w[k], b[k], t[k]
                probe[i, j] = base + i + 1 + k
        return win, worst, probe

    def _table(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self._tables is None:
            self._tables = self._build()
        return self._tables

    def _index(self, lo: int, hi: int) -> tuple[int, int]:
        if not (self.min_cores - 1 <= lo < hi <= self.max_cores):
            raise TunerError(f"bracket ({lo}, {hi}] is empty or outside the plan's bounds")
        base = self.min_cores - 1
        return lo - base, hi - base

    def probe(self, lo: int, hi: int) -> int:
        """The count to probe when the best fit is known to lie in ``(lo, hi]``."""
        i, j = self._index(lo, hi)
        if j - i < 2:
            raise TunerError(f"bracket ({lo}, {hi}] holds one count: nothing to probe")
        return int(self._table()[2][i, j])

    def worst_case(self, lo: int, hi: int) -> tuple[int, int]:
        """(worst probes for answers inside the window, worst probes overall) for a bracket."""
        i, j = self._index(lo, hi)
        win, worst, _ = self._table()
        return (max(int(win[i, j]), 0), int(worst[i, j]))


@dataclass
class _Count:
    """Window means measured at one core count."""

    samples: list[float] = field(default_factory=list)

    @property
    def mean(self) -> float:
        return sum(self.samples) / len(self.samples)


class CoreTuner:
    """Per-job state machine: ask ``next_count()``, pin, measure one window, ``observe()``.

    ``next_count()`` returns the count the job must run at for the next measurement window, or
    None once ``converged``; then ``best`` is the best-fit count to pin for the rest of the run.

    Parameters:
      n_start: the allocator's starting point (``masterd.core.cores.initial_cores``).
      min_cores, max_cores: the counts the job may be given; ``max_cores`` is the plateau
        reference, so it should be as many cores as the node can lend during tuning.
      tolerance: utilisation points below the plateau that still count as "holds".
      noise: standard deviation (points) of one window's mean utilisation; 0 trusts single
        windows. noded can estimate it from the spread of samples inside a window.
      warm: N_start came from the owner's history (trust it within ``window`` cores).
      launch_cores: the count the job runs at when tuning begins (default ``max_cores``);
        its first windows are free, and any other launch count costs one step to reach the
        reference.
      reference_windows: windows measured at the reference before judging anything.
      confidence_z, max_windows: a judgement needs its mean to be ``confidence_z`` standard
        errors clear of the threshold, or ``max_windows`` windows at that count.
      leave_z: the stronger evidence a warm start needs before a judgement sends the search
        outside its window; when ``max_windows`` cannot provide it, the window wins.
      plan: a prebuilt :class:`ProbePlan` for the same bounds, to share its memo.
    """

    def __init__(
        self,
        n_start: int,
        *,
        max_cores: int,
        min_cores: int = 1,
        tolerance: float = 2.0,
        noise: float = 1.0,
        warm: bool = False,
        window: int = WARM_WINDOW,
        launch_cores: int | None = None,
        reference_windows: int = 5,
        confidence_z: float = 2.0,
        max_windows: int = 10,
        leave_z: float = 3.0,
        plan: ProbePlan | None = None,
    ) -> None:
        for name, value in (("n_start", n_start), ("min_cores", min_cores),
                            ("max_cores", max_cores), ("window", window)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TunerError(f"{name} must be an integer, got {value!r}")
        if min_cores < 1 or max_cores < min_cores:
            raise TunerError(
                f"core bounds must satisfy 1 <= min_cores <= max_cores "
                f"(min_cores={min_cores}, max_cores={max_cores})"
            )
        if not (math.isfinite(tolerance) and tolerance > 0):
            raise TunerError(f"tolerance must be a positive number of points, got {tolerance!r}")
        if not (math.isfinite(noise) and noise >= 0):
            raise TunerError(f"noise must be a finite number >= 0, got {noise!r}")
        if window < 0:
            raise TunerError(f"window must be >= 0, got {window}")
        if reference_windows < 1 or max_windows < 1:
            raise TunerError("reference_windows and max_windows must be at least 1")
        for name, z in (("confidence_z", confidence_z), ("leave_z", leave_z)):
            if not (math.isfinite(z) and z >= 0):
                raise TunerError(f"{name} must be a finite number >= 0, got {z!r}")
        self.n_start = min(max(n_start, min_cores), max_cores)
        self.min_cores = min_cores
        self.max_cores = max_cores
        self.tolerance = float(tolerance)
        self.noise = float(noise)
        self.warm = warm
        self.reference_windows = reference_windows
        self.confidence_z = float(confidence_z)
        self.leave_z = float(leave_z)
        self.max_windows = max_windows
        launch = max_cores if launch_cores is None else launch_cores
        if not min_cores <= launch <= max_cores:
            raise TunerError(
                f"launch_cores={launch} is outside [{min_cores}, {max_cores}]"
            )
        self.launch_cores = launch
        prior = (max(min_cores, self.n_start - window), min(max_cores, self.n_start + window))
        self.prior = prior  # counts the best fit is expected in (trusted when warm)
        if plan is None:
            plan = ProbePlan(min_cores, max_cores, prior, window_first=warm)
        elif (plan.min_cores, plan.max_cores, plan.window, plan.window_first) != (
            min_cores, max_cores, prior, warm
        ):
            raise TunerError(
                "the shared plan was built for different bounds, window or warm setting"
            )
        self.plan = plan

        self.history: list[tuple[int, float]] = []
        self.steps = 0
        self._counts: dict[int, _Count] = {}
        self._holds: dict[int, bool] = {}
        self._lo = min_cores - 1  # largest count known not to hold
        self._hi = max_cores  # smallest count known to hold (the reference holds by definition)
        self._pinned: int | None = None  # the count the job currently runs at
        self._pending: int | None = launch
        self._converged = False
        if min_cores == max_cores:
            self._finish("only one count is possible")

    # -- what the caller sees --------------------------------------------------------------
    @property
    def converged(self) -> bool:
        return self._converged

    @property
    def best(self) -> int | None:
        """The best-fit count once converged; before that, the smallest count judged to hold
        so far (None until the reference has been measured)."""
        if self._converged or self._reference_ready:
            return self._hi
        return None

    @property
    def windows(self) -> int:
        return len(self.history)

    @property
    def reference(self) -> float | None:
        """The plateau utilisation the judgements compare with (None until measured)."""
        if not self._reference_ready:
            return None
        samples = self._plateau_samples()
        return sum(samples) / len(samples)

    @property
    def bracket(self) -> tuple[int, int]:
        """``(lo, hi)``: the best fit is known to lie in ``lo+1 .. hi``."""
        return (self._lo, self._hi)

    def next_count(self) -> int | None:
        return None if self._converged else self._pending

    def observe(self, cores: int, utilisation: float) -> None:
        """Record one window's mean GPU utilisation (0-100) measured at ``cores``."""
        if self._converged:
            raise TunerError(f"tuning has converged (best={self._hi}); no more measurements")
        if cores != self._pending:
            raise TunerError(
                f"observed {cores} cores but the tuner asked for {self._pending}"
            )
        if isinstance(utilisation, bool) or not (
                isinstance(utilisation, int | float) and math.isfinite(utilisation)
                and 0.0 <= utilisation <= 100.0):
            raise TunerError(f"utilisation must be a number in [0, 100], got {utilisation!r}")
        if self._pinned is not None and cores != self._pinned:
            self.steps += 1
        self._pinned = cores
        self.history.append((cores, float(utilisation)))
        self._counts.setdefault(cores, _Count()).samples.append(float(utilisation))
        self._pending = self._decide(cores)

    # -- the state machine -------------------------------------------------------------------
    @property
    def _reference_ready(self) -> bool:
        ref = self._counts.get(self.max_cores)
        return ref is not None and len(ref.samples) >= self.reference_windows

    def _plateau_samples(self) -> list[float]:
        # Every count judged to hold sits on the plateau (up to the tolerance), so pooling
        # their windows with the reference's shrinks the error every judgement shares.
        pooled = [v for c, held in self._holds.items() if held for v in self._counts[c].samples]
        return pooled or self._counts[self.max_cores].samples

    def _threshold(self) -> float:
        s = self._plateau_samples()
        return sum(s) / len(s) - self.tolerance

    def _standard_error(self, count: int) -> float:
        n = len(self._counts[count].samples)
        n_ref = len(self._plateau_samples())
        return self.noise * math.sqrt(1.0 / n + 1.0 / n_ref)

    def _decide(self, cores: int) -> int | None:
        if not self._reference_ready:
            if cores == self.max_cores:
                return self.max_cores  # another reference window
            if len(self._counts[cores].samples) < self.reference_windows:
                return cores  # the launch count: its windows are free while we are here
            return self.max_cores
        if cores == self.max_cores and cores not in self._holds:
            self._holds[cores] = True
            log.debug("tuner reference cores=%d util=%.2f", cores, self._counts[cores].mean)
            if self.launch_cores != self.max_cores:
                # Judge the launch count now that the plateau is known; no re-pin is spent
                # on confirming it, so it is judged on the windows it already has.
                self._judge(self.launch_cores)
            return self._advance()
        if cores in self._holds:
            return self._advance()
        settled = self._verdict(cores)[1]
        if not settled and len(self._counts[cores].samples) < self.max_windows:
            return cores  # too close to call: measure this count for another window
        self._judge(cores)
        return self._advance()

    def _leaves_window(self, cores: int, holds: bool) -> bool:
        """Would this judgement put the best fit outside a warm start's window?"""
        if not self.warm:
            return False
        return (holds and cores < self.prior[0]) or (not holds and cores >= self.prior[1])

    def _verdict(self, cores: int) -> tuple[bool, bool]:
        """(holds, settled): which side of the threshold the mean is on, and whether it is far
        enough from it to trust. Leaving a warm window needs ``leave_z`` standard errors:
        a wrong exit costs extra steps, a wrong stay only a core."""
        mean, threshold = self._counts[cores].mean, self._threshold()
        holds = mean >= threshold
        if self.noise == 0:
            return holds, True
        z = self.leave_z if self._leaves_window(cores, holds) else self.confidence_z
        return holds, abs(mean - threshold) >= z * self._standard_error(cores)

    def _judge(self, cores: int) -> None:
        holds, settled = self._verdict(cores)
        if not settled and self._leaves_window(cores, holds):
            # The windows could not decide; a warm start's history is the better guide.
            holds = not holds
        self._holds[cores] = holds
        if holds:
            self._hi = min(self._hi, cores)
        else:
            self._lo = max(self._lo, cores)
        log.debug(
            "tuner judged cores=%d util=%.2f threshold=%.2f holds=%s bracket=(%d,%d]",
            cores, self._counts[cores].mean, self._threshold(), holds, self._lo, self._hi,
        )

    def _advance(self) -> int | None:
        if self._hi - self._lo <= 1:
            self._finish("bracket closed")
            return None
        return self.plan.probe(self._lo, self._hi)

    def _finish(self, why: str) -> None:
        self._converged = True
        self._pending = None
        log.info(
            "tuner converged best=%d n_start=%d steps=%d windows=%d reason=%r",
            self._hi, self.n_start, self.steps, len(self.history), why,
        )
