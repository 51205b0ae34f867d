"""QSSF's duration estimate (Helios §4.2.2, Algorithm 1's PRIORITY): pure and deterministic.

``estimate = α·rolling + (1−α)·ML`` (α = 0.1), or the rolling estimate alone where the ML one
is missing or not positive. QSSF's priority is ``GPUs × estimate`` (the policy multiplies).

The rolling estimate comes from the finished jobs seen so far (:class:`RollingHistory`, which
grows as jobs finish; the master and the simulator feed it the same way, so a replay
reproduces it):

1. the same user's finished jobs with a similar name → their mean duration (an exact name
   match alone when there is one, else up to two names of similarity ≥ 0.6, as the Helios
   artifact's ``get_close_matches(n=2, cutoff=0.6)``), preferring jobs with the same GPU count;
2. else the user's mean duration, same GPU count preferred;
3. else other users' jobs with a similar name;
4. else the mean of every finished job; with no history at all there is no rolling estimate.

Similarity is rapidfuzz's normalised Indel ratio (the measure of Python's ``difflib``, which
the artifact uses although the paper says Levenshtein). Means are plain means: the paper's
exponential decay is commented out in the artifact.

The estimate travels to the policy as job annotations (:data:`ESTIMATE_KEY`); the ML part is
computed by the master's estimator feature (a LightGBM model trained in a worker process) and
handed in as a number.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from rapidfuzz import fuzz, process

from shared.model import Job

ESTIMATE_KEY = "duration_estimate_s"  # what QSSF reads: the blended estimate, seconds
ML_KEY = "duration_ml_s"  # the ML part, where a model gave one
RECORDED_KEY = "recorded_duration_s"  # replays only: a trace's recorded duration (SJF)
ALPHA = 0.1
SIMILARITY = 0.6  # Helios' cutoff
MATCHES = 2  # names taken from a fuzzy match (artifact: n=2)

# Where a rolling estimate came from, best first.
USER_SIMILAR = "user-similar-name"
USER_MEAN = "user-mean"
OTHERS_SIMILAR = "others-similar-name"
CLUSTER_MEAN = "cluster-mean"


@dataclass
class _Sums:
    total: float = 0.0
    count: int = 0

    def add(self, value: float) -> None:
        self.total += value
        self.count += 1

    def merge(self, other: _Sums) -> None:
        self.total += other.total
        self.count += other.count

    @property
    def mean(self) -> float:
        return self.total / self.count


@dataclass
class _Names:
    """Durations by job name, and by (name, GPU count)."""

    by_name: dict[str, _Sums] = field(default_factory=dict)
    by_name_gpus: dict[tuple[str, int], _Sums] = field(default_factory=dict)
    by_gpus: dict[int, _Sums] = field(default_factory=dict)
    all: _Sums = field(default_factory=_Sums)

    def add(self, name: str, gpus: int, duration: float) -> None:
        self.by_name.setdefault(name, _Sums()).add(duration)
        self.by_name_gpus.setdefault((name, gpus), _Sums()).add(duration)
        self.by_gpus.setdefault(gpus, _Sums()).add(duration)
        self.all.add(duration)

    def similar(self, name: str) -> list[str]:
        """The exact name if present, else up to MATCHES names of similarity >= SIMILARITY
        (best first; ties keep the order names were first seen)."""
        if name in self.by_name:
            return [name]
        found = process.extract(name, self.by_name.keys(), scorer=fuzz.ratio,
                                score_cutoff=100 * SIMILARITY, limit=MATCHES)
        return [match for match, _, _ in found]

    def mean_of(self, names: list[str], gpus: int) -> float:
        """Mean over those names' jobs, only the same GPU count's if there are any."""
        same = _Sums()
        for name in names:
            sums = self.by_name_gpus.get((name, gpus))
            if sums is not None:
                same.merge(sums)
        if same.count:
            return same.mean
        merged = _Sums()
        for name in names:
            merged.merge(self.by_name[name])
        return merged.mean

    def mean_gpus(self, gpus: int) -> float:
        sums = self.by_gpus.get(gpus)
        return sums.mean if sums is not None else self.all.mean


@dataclass(frozen=True)
class Rolling:
    value_s: float
    source: str  # USER_SIMILAR, USER_MEAN, OTHERS_SIMILAR or CLUSTER_MEAN
    matched: tuple[str, ...] = ()  # the job names it was taken from (similar-name sources)


class RollingHistory:
    """Finished jobs' durations per user and name, summed (memory grows with distinct names,
    not with jobs)."""

    def __init__(self) -> None:
        self._users: dict[str, _Names] = {}
        self._everyone = _Names()

    def __len__(self) -> int:
        return self._everyone.all.count

    def record(self, user: str, name: str, gpus: int, duration_s: float) -> None:
        """A job finished after running ``duration_s`` seconds."""
        if not (duration_s >= 0 and math.isfinite(duration_s)):
            raise ValueError(f"a duration must be a finite number >= 0, got {duration_s!r}")
        self._users.setdefault(user, _Names()).add(name, gpus, duration_s)
        self._everyone.add(name, gpus, duration_s)

    def rolling(self, user: str, name: str, gpus: int) -> Rolling | None:
        mine = self._users.get(user)
        if mine is not None:
            names = mine.similar(name)
            if names:
                return Rolling(mine.mean_of(names, gpus), USER_SIMILAR, tuple(names))
            return Rolling(mine.mean_gpus(gpus), USER_MEAN)
        if not self._everyone.all.count:
            return None
        names = self._everyone.similar(name)
        if names:
            return Rolling(self._everyone.mean_of(names, gpus), OTHERS_SIMILAR, tuple(names))
        return Rolling(self._everyone.all.mean, CLUSTER_MEAN)


@dataclass(frozen=True)
class Estimate:
    """A job's duration estimate and both its parts, as ``trellisctl show`` explains it."""

    value_s: float | None  # what QSSF ranks by (times the GPU count); None: no estimate
    rolling_s: float | None
    rolling_source: str | None
    ml_s: float | None
    ml_source: str | None  # e.g. "lightgbm trained 2026-01-01T00:00:00Z on 5000 jobs"
    alpha: float
    matched: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, object]:
        return {"value_s": self.value_s, "rolling_s": self.rolling_s,
                "rolling_source": self.rolling_source, "ml_s": self.ml_s,
                "ml_source": self.ml_source, "alpha": self.alpha,
                "matched": list(self.matched)}


def blend(rolling: Rolling | None, ml_s: float | None, ml_source: str | None,
          alpha: float = ALPHA) -> Estimate:
    """α·rolling + (1−α)·ML; the rolling part alone where ML is missing or <= 0; the ML
    part alone where there is no history yet."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be within [0, 1], got {alpha!r}")
    usable_ml = ml_s if ml_s is not None and ml_s > 0 and math.isfinite(ml_s) else None
    rolling_s = rolling.value_s if rolling is not None else None
    if rolling_s is not None and usable_ml is not None:
        value: float | None = alpha * rolling_s + (1.0 - alpha) * usable_ml
    elif rolling_s is not None:
        value = rolling_s
    else:
        value = usable_ml
    return Estimate(value_s=value, rolling_s=rolling_s,
                    rolling_source=rolling.source if rolling is not None else None,
                    ml_s=ml_s, ml_source=ml_source if ml_s is not None else None,
                    alpha=alpha, matched=rolling.matched if rolling is not None else ())


class QssfEstimator:
    """The rolling history and the blend, as one object both drivers use: the master's
    estimator feature (which adds the ML part as the ``duration_ml_s`` annotation first) and
    the simulator (an :class:`sim.engine.Annotator`)."""

    def __init__(self, alpha: float = ALPHA, ml_source: str | None = None) -> None:
        self.alpha = alpha
        self.ml_source = ml_source
        self.history = RollingHistory()

    def estimate(self, job: Job) -> Estimate:
        """The job's estimate, the ML part read from its annotations (if any)."""
        return self.estimate_with(job, job.annotations.get(ML_KEY))

    def estimate_with(self, job: Job, ml_s: float | None) -> Estimate:
        spec = job.spec
        rolling = self.history.rolling(spec.user, spec.name, spec.gpus)
        return blend(rolling, ml_s, self.ml_source, self.alpha)

    def finished(self, job: Job, run_time: float) -> None:
        self.history.record(job.spec.user, job.spec.name, job.spec.gpus, run_time)

    def submitted(self, job: Job, now: float) -> None:
        """Replays: attach the estimate at once (the master goes through JobActions)."""
        value = self.estimate(job).value_s
        if value is not None:
            job.annotations[ESTIMATE_KEY] = value
