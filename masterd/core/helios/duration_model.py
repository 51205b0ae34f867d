"""QSSF's machine-learning duration estimate (Helios §4.2.2): a LightGBM regressor.

Features, as Helios lists them: GPU and CPU demand, the user, the tenant (Helios' VC), the job
name bucketed by similarity (names are too many and too sparse to encode one by one: each name
joins the first bucket whose representative it resembles by at least 0.6, else starts a
bucket of its own, in the order jobs were submitted), and the submission's month, weekday,
hour and minute (UTC). Users, tenants and buckets are category codes; one the model never
saw gets a code of its own that no tree splits on.

The target is ``log(1 + duration)``: durations span seconds to weeks, and squared error on
raw seconds would let a handful of week-long jobs decide every split. The estimate is the
inverse of the prediction.

Pure and deterministic: the master's estimator feature trains it in a worker process from the
journal's finished jobs and keeps the result (:meth:`DurationModel.to_json`) in its state
directory (:meth:`DurationModel.save`); prediction is one small row per job.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from rapidfuzz import fuzz, process

from masterd.core.helios.estimate import SIMILARITY

FEATURES = ("gpus", "cpus", "user", "tenant", "name_bucket", "month", "weekday", "hour",
            "minute")
CATEGORICAL = ("user", "tenant", "name_bucket")
MAX_BUCKETS = 5000  # representatives compared per name: bounds the cost of a lookup
PARAMS = {
    "objective": "regression", "metric": "l1", "learning_rate": 0.05, "num_leaves": 63,
    "min_data_in_leaf": 20, "seed": 1, "deterministic": True, "force_row_wise": True,
    "num_threads": 2, "verbose": -1,
}
ROUNDS = 300
FORMAT = 1


@dataclass(frozen=True)
class JobRow:
    """What the model knows of a job (at submission) and, for training, how long it ran."""

    user: str
    tenant: str
    name: str
    gpus: int
    cpus: int
    submit_time: float  # epoch seconds
    duration_s: float | None = None


class NameBuckets:
    """Job names grouped by similarity, in the order they were first seen."""

    def __init__(self, representatives: Sequence[str] = ()) -> None:
        self.representatives = list(representatives)
        self._known: dict[str, int] = {name: i for i, name in enumerate(self.representatives)}

    def bucket(self, name: str, grow: bool = False) -> int:
        """The bucket of ``name``; a new one if it resembles none (only when ``grow``; else
        the code one past the last, which the model has never seen)."""
        known = self._known.get(name)
        if known is not None:
            return known
        found = process.extractOne(name, self.representatives, scorer=fuzz.ratio,
                                   score_cutoff=100 * SIMILARITY)
        if found is not None:
            index = found[2]
        elif grow and len(self.representatives) < MAX_BUCKETS:
            index = len(self.representatives)
            self.representatives.append(name)
        else:
            index = len(self.representatives)
        if grow:
            self._known[name] = index
        return index


def _calendar(t: float) -> tuple[int, int, int, int]:
    stamp = np.datetime64(int(t), "s")
    days = stamp.astype("datetime64[D]")
    months = stamp.astype("datetime64[M]")
    month = int((months - stamp.astype("datetime64[Y]")).astype(int)) + 1
    weekday = (int(days.astype(int)) + 3) % 7
    seconds = int((stamp - days).astype(int))
    return month, weekday, seconds // 3600, (seconds % 3600) // 60


class DurationModel:
    def __init__(self, booster: Any, users: dict[str, int], tenants: dict[str, int],
                 buckets: NameBuckets, meta: dict[str, Any]) -> None:
        self.booster = booster  # a lightgbm.Booster
        self.users = users
        self.tenants = tenants
        self.buckets = buckets
        self.meta = meta

    def row(self, job: JobRow) -> list[float]:
        return _encode(job, self.users, self.tenants, self.buckets, grow=False)

    def predict(self, jobs: Sequence[JobRow]) -> list[float]:
        """Estimated durations, seconds."""
        if not jobs:
            return []
        x = np.array([self.row(j) for j in jobs], dtype=float)
        out = self.booster.predict(x, num_threads=1)
        return [float(math.expm1(max(v, 0.0))) for v in out]

    def encoders_json(self) -> str:
        """Everything but the trees (LightGBM keeps those in its own text format)."""
        return json.dumps({"format": FORMAT, "users": self.users, "tenants": self.tenants,
                           "buckets": self.buckets.representatives, "meta": self.meta})

    def save(self, trees: Path, encoders: Path) -> None:
        """Write both files (the caller makes the replacement atomic)."""
        self.booster.save_model(str(trees))
        encoders.write_text(self.encoders_json())

    @classmethod
    def load(cls, trees: Path, encoders: Path) -> DurationModel:
        """Read a saved model. LightGBM parses its file in C with the GIL released, so a
        thread can load a large model beside the event loop."""
        import lightgbm as lgb

        try:
            data = json.loads(encoders.read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"{encoders}: not readable as a duration model: {exc}") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError(f"{encoders}: not a duration model of this version")
        try:
            booster = lgb.Booster(model_file=str(trees))
        except lgb.basic.LightGBMError as exc:
            raise ValueError(f"{trees}: not a LightGBM model: {exc}") from None
        return cls(booster, dict(data["users"]), dict(data["tenants"]),
                   NameBuckets(data["buckets"]), dict(data["meta"]))


def _code(table: dict[str, int], key: str, grow: bool) -> int:
    code = table.get(key)
    if code is None:
        if not grow:
            return len(table)  # unseen: a category no split names
        code = table[key] = len(table)
    return code


def _encode(job: JobRow, users: dict[str, int], tenants: dict[str, int],
            buckets: NameBuckets, grow: bool) -> list[float]:
    month, weekday, hour, minute = _calendar(job.submit_time)
    return [float(job.gpus), float(job.cpus), float(_code(users, job.user, grow)),
            float(_code(tenants, job.tenant, grow)), float(buckets.bucket(job.name, grow)),
            float(month), float(weekday), float(hour), float(minute)]


def train(jobs: Sequence[JobRow], meta: dict[str, Any] | None = None,
          rounds: int = ROUNDS) -> DurationModel:
    """Fit on finished jobs (oldest first: buckets form in submission order)."""
    import lightgbm as lgb

    usable = [j for j in jobs if j.duration_s is not None and j.duration_s >= 0]
    if len(usable) < 2:
        raise ValueError(f"too few finished jobs to train on ({len(usable)})")
    users: dict[str, int] = {}
    tenants: dict[str, int] = {}
    buckets = NameBuckets()
    x = np.array([_encode(j, users, tenants, buckets, grow=True) for j in usable], dtype=float)
    y = np.log1p(np.array([j.duration_s for j in usable], dtype=float))
    data = lgb.Dataset(x, y, feature_name=list(FEATURES), categorical_feature=list(CATEGORICAL),
                       free_raw_data=True)
    booster = lgb.train(PARAMS, data, num_boost_round=rounds)
    fitted = np.expm1(np.maximum(booster.predict(x, num_threads=1), 0.0))
    actual = np.expm1(y)
    info = dict(meta or {})
    info.update(jobs=len(usable), rounds=rounds,
                train_mae_s=float(np.mean(np.abs(fitted - actual))),
                users=len(users), tenants=len(tenants), buckets=len(buckets.representatives))
    return DurationModel(booster, users, tenants, buckets, info)
