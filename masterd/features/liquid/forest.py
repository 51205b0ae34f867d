"""Liquid's resource-requirement model (§4.2): one random forest per label, with the settings
of Liquid's code (``RandomForestRegressor(n_estimators=70, max_depth=13, min_samples_split=10,
min_samples_leaf=5)``).

:func:`fit` runs in a worker process (scikit-learn, CPU-heavy): it measures R² on held-out
jobs first (Liquid's evaluation: a random test set, 50 jobs where there are enough), then fits
on every row and returns the forests as plain arrays (:class:`Forest`). The master predicts
with those arrays, a few NumPy operations per tree level, so a prediction never needs
scikit-learn on the event loop and a model crosses the process boundary as a few arrays.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from masterd.features.liquid.jobfeatures import FEATURES, LABELS, vector

RF_SETTINGS: dict[str, Any] = {"n_estimators": 70, "max_depth": 13, "min_samples_split": 10,
                               "min_samples_leaf": 5}
TEST_JOBS = 50  # Liquid §7.2: "the size of the test set is 50"
MIN_ROWS = 10  # fewer rows than this train nothing


@dataclass(frozen=True)
class Forest:
    """A fitted forest as arrays: node ``i`` of tree ``t`` splits on ``feature[t, i]`` at
    ``threshold[t, i]`` (left when <=), a leaf has ``left[t, i] == -1`` and holds
    ``value[t, i]``."""

    feature: np.ndarray
    threshold: np.ndarray
    left: np.ndarray
    right: np.ndarray
    value: np.ndarray
    depth: int

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Mean over trees for each row of ``x`` (rows, features)."""
        trees = self.feature.shape[0]
        rows = x.shape[0]
        t = np.arange(trees)[None, :].repeat(rows, axis=0)
        r = np.arange(rows)[:, None].repeat(trees, axis=1)
        node = np.zeros((rows, trees), dtype=np.int64)
        for _ in range(self.depth + 1):
            left = self.left[t, node]
            leaf = left < 0
            if leaf.all():
                break
            feature = np.where(leaf, 0, self.feature[t, node])
            go_left = x[r, feature] <= self.threshold[t, node]
            node = np.where(leaf, node, np.where(go_left, left, self.right[t, node]))
        return self.value[t, node].mean(axis=1)


@dataclass(frozen=True)
class Model:
    """One forest per label, and how well each did on held-out jobs."""

    forests: Mapping[str, Forest]
    r2: Mapping[str, float]  # held-out R² per label (NaN where not measurable)
    rows: int
    test_rows: int
    mean: Mapping[str, float] = field(default_factory=dict)  # label means, for reports
    features: tuple[str, ...] = FEATURES

    def predict(self, features: Mapping[str, Any]) -> dict[str, float]:
        x = np.asarray([vector(features, self.features)], dtype=np.float64)
        return {label: float(f.predict(x)[0]) for label, f in self.forests.items()}

    def predict_many(self, rows: Sequence[Mapping[str, Any]]) -> list[dict[str, float]]:
        if not rows:
            return []
        x = np.asarray([vector(r, self.features) for r in rows], dtype=np.float64)
        columns = {label: f.predict(x) for label, f in self.forests.items()}
        return [{label: float(v[i]) for label, v in columns.items()} for i in range(len(rows))]

    @property
    def mean_r2(self) -> float | None:
        values = [v for v in self.r2.values() if not math.isnan(v)]
        return sum(values) / len(values) if values else None


def export(estimator: Any) -> Forest:
    trees = [e.tree_ for e in estimator.estimators_]
    size = max(t.node_count for t in trees)
    n = len(trees)
    feature = np.zeros((n, size), dtype=np.int64)
    threshold = np.zeros((n, size), dtype=np.float64)
    left = np.full((n, size), -1, dtype=np.int64)
    right = np.full((n, size), -1, dtype=np.int64)
    value = np.zeros((n, size), dtype=np.float64)
    for i, tree in enumerate(trees):
        count = tree.node_count
        feature[i, :count] = np.maximum(tree.feature, 0)
        threshold[i, :count] = tree.threshold
        left[i, :count] = tree.children_left
        right[i, :count] = tree.children_right
        value[i, :count] = tree.value[:, 0, 0]
    return Forest(feature, threshold, left, right, value, max(t.max_depth for t in trees))


def _r2(truth: np.ndarray, predicted: np.ndarray) -> float:
    total = float(((truth - truth.mean()) ** 2).sum())
    if total <= 0:
        return math.nan
    return 1.0 - float(((truth - predicted) ** 2).sum()) / total


def fit(rows: Sequence[tuple[Mapping[str, Any], Mapping[str, float]]], seed: int = 0,
        test_jobs: int = TEST_JOBS, features: tuple[str, ...] = FEATURES,
        labels: tuple[str, ...] = LABELS, serve: bool = True) -> Model | None:
    """Train on (features, labels) rows; None with fewer than :data:`MIN_ROWS`. Runs in a
    worker process. ``features``/``labels``: the columns (a job's, by default); ``serve``:
    also fit on every row the forests that predict (else only measure held-out R²)."""
    from sklearn.ensemble import RandomForestRegressor

    if len(rows) < MIN_ROWS:
        return None
    x_all = np.asarray([vector(f, features) for f, _ in rows], dtype=np.float64)
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    test_n = min(test_jobs, len(rows) // 5) if len(rows) >= 2 * MIN_ROWS else 0
    test, train = order[:test_n], order[test_n:]
    forests: dict[str, Forest] = {}
    r2: dict[str, float] = {}
    means: dict[str, float] = {}
    for label in labels:
        have = [i for i in range(len(rows)) if label in rows[i][1]]
        if len(have) < MIN_ROWS:
            continue
        y_all = np.full(len(rows), np.nan)
        for i in have:
            y_all[i] = rows[i][1][label]
        means[label] = float(np.nanmean(y_all))
        tr = [i for i in train if i in set(have)]
        te = [i for i in test if i in set(have)]
        r2[label] = math.nan
        if te and len(tr) >= MIN_ROWS:
            held = RandomForestRegressor(random_state=seed, **RF_SETTINGS)
            held.fit(x_all[tr], y_all[tr])
            r2[label] = _r2(y_all[te], held.predict(x_all[te]))
        if serve:
            final = RandomForestRegressor(random_state=seed, **RF_SETTINGS)
            final.fit(x_all[have], y_all[have])
            forests[label] = export(final)
    if not forests and not r2:
        return None
    return Model(forests, r2, len(rows), test_n, means, features)


__all__ = ["FEATURES", "LABELS", "Forest", "Model", "fit"]
