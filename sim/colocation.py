"""Ground truth for jobs sharing one GPU, from measured pairs (``traces/gpu-colocation.csv``).

Lucid (ASPLOS'23) profiled ~1,400 pairs of training jobs sharing a GPU: each row gives both
jobs (model, dataset, batch, AMP) and each one's speed normalised to running alone. The replay
uses those measurements as they are:

* a job that shares a GPU is given a *profile* (one of the jobs the file measured), drawn with
  a seed per job: openb records no model, so which DL job a pod is stays an assumption;
* its speed beside others is the product of its measured speed beside each of them; a pair
  measured in several rows (other AMP settings, the two orders) averages them; a pair never
  measured falls back to the mean speed of the job's model beside the other's model, then to
  the job's model beside anything, then to the mean over all pairs;
* a measured speed above 1 (measurement noise: sharing a GPU does not speed a job up) counts
  as 1.

How busy a shared GPU is follows: each job contributes its share of the GPU (its request) at the
speed it gets. Nothing here is fitted or tuned; the table is the file.
"""

from __future__ import annotations

import csv
import random
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

COLOCATION_FILE = "gpu-colocation.csv"


@dataclass(frozen=True, order=True)
class Profile:
    model: str
    dataset: str
    batch: int
    amp: int

    def __str__(self) -> str:
        return f"{self.model}/{self.dataset}/b{self.batch}{'/amp' if self.amp else ''}"


class ColocationError(ValueError):
    """The measurement file cannot be used; the message names the file and the line."""


@dataclass
class ColocationTable:
    pairs: dict[tuple[Profile, Profile], float]  # (job, beside) -> job's normalised speed
    by_model: dict[tuple[str, str], float]
    model_any: dict[str, float]
    overall: float
    profiles: tuple[Profile, ...]
    rows: int

    @classmethod
    def load(cls, path: Path) -> ColocationTable:
        sums: dict[tuple[Profile, Profile], list[float]] = defaultdict(list)
        try:
            handle = path.open(newline="", encoding="utf-8")
        except OSError as exc:
            raise ColocationError(f"{path}: cannot open: {exc.strerror}") from None
        rows = 0
        with handle:
            reader = csv.DictReader(handle)
            for line, row in enumerate(reader, start=2):
                try:
                    a = Profile(row["model1"], row["dataset1"], int(row["batchsize1"]),
                                int(row["amp1"]))
                    b = Profile(row["model2"], row["dataset2"], int(row["batchsize2"]),
                                int(row["amp2"]))
                    sa, sb = float(row["speed1"]), float(row["speed2"])
                except (KeyError, TypeError, ValueError) as exc:
                    raise ColocationError(f"{path}:{line}: {exc}") from None
                if not (sa > 0 and sb > 0):
                    raise ColocationError(f"{path}:{line}: speeds must be positive")
                sums[(a, b)].append(min(sa, 1.0))
                sums[(b, a)].append(min(sb, 1.0))
                rows += 1
        if not rows:
            raise ColocationError(f"{path}: no measured pairs")
        pairs = {k: sum(v) / len(v) for k, v in sums.items()}
        models: dict[tuple[str, str], list[float]] = defaultdict(list)
        alone: dict[str, list[float]] = defaultdict(list)
        for (a, b), speed in pairs.items():
            models[(a.model, b.model)].append(speed)
            alone[a.model].append(speed)
        return cls(
            pairs=pairs,
            by_model={k: sum(v) / len(v) for k, v in models.items()},
            model_any={k: sum(v) / len(v) for k, v in alone.items()},
            overall=sum(pairs.values()) / len(pairs),
            profiles=tuple(sorted({a for a, _ in pairs})),
            rows=rows,
        )

    def pair_speed(self, job: Profile, beside: Profile) -> float:
        found = self.pairs.get((job, beside))
        if found is not None:
            return found
        found = self.by_model.get((job.model, beside.model))
        if found is not None:
            return found
        return self.model_any.get(job.model, self.overall)

    def speed(self, job: Profile, beside: Iterable[Profile]) -> float:
        out = 1.0
        for other in beside:
            out *= self.pair_speed(job, other)
        return out

    def assign(self, seed: int, job_id: str) -> Profile:
        """The profile a job is taken to have (seeded by the replay's seed and the job)."""
        return self.profiles[random.Random(f"{seed}/colocation/{job_id}").randrange(
            len(self.profiles))]

    def measured_share(self, profiles: Sequence[Profile]) -> float:
        """Share of the ordered pairs among ``profiles`` that the file measured directly."""
        total = hit = 0
        for a in profiles:
            for b in profiles:
                if a != b:
                    total += 1
                    hit += (a, b) in self.pairs
        return hit / total if total else 1.0
