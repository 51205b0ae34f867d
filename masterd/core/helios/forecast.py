"""CES's forecaster: busy nodes some hours ahead from their own history (Helios §4.3.2).

The series is one value per step (the maximum of each 10-minute bucket). A forecast is made
at an *origin* ``o``, the last step whose value is known, for the steps ``o + h``,
``h = 1 .. horizon``. It is strictly causal: every feature of a row uses values at or before
``o`` and nothing later; the target's own calendar (month, day, hour, minute, weekday, day of
year, ISO week, as the Helios artifact) is known in advance. One LightGBM model serves every
horizon (``h`` is a feature):

* the latest value ``y[o]``; mean, median and standard deviation of the last 3 and 6 steps
  (30 min and 1 h, the artifact's windows);
* the value 3 h before the target and a day before it, where those lie at or before ``o``
  (missing otherwise; LightGBM routes missing values itself).

The Helios artifact computes its rolling features on the series it predicts, shifted by one
hour, and a 3-h lag, while forecasting 3–5 h ahead: some of its features are values the
forecast should not know yet. The replay (``sim/studies/ces.py``) measures what that leak is
worth; this module never reads past the origin.

Training is deterministic (fixed seed, thread count and LightGBM's deterministic mode), so
the master and the replay fit the same model from the same history.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

STEP_S = 600.0  # one step: 10 minutes
DAY_STEPS = 144
LAG_3H = 18
LOOKBACK = DAY_STEPS  # values an origin needs behind it for every feature
FEATURES = ("month", "day", "hour", "minute", "weekday", "dayofyear", "week", "horizon",
            "last", "mean3", "median3", "std3", "mean6", "median6", "std6", "lag3h_target",
            "lag1d_target")

# Helios' LightGBM settings (CES_Philly.py): bagging 0.85 every round, early stopping after
# 200 rounds without improvement on the validation set, at most 10k rounds.
LGB_PARAMS = {
    "objective": "regression", "metric": "rmse", "bagging_fraction": 0.85, "bagging_freq": 1,
    "learning_rate": 0.1, "num_leaves": 31, "seed": 1, "deterministic": True,
    "force_row_wise": True, "num_threads": 2, "verbose": -1,
}
MAX_ROUNDS = 10_000
EARLY_STOP = 200
# Training takes every ORIGIN_STRIDE-th origin: neighbouring origins share nearly all their
# features, and one forecast per 30 minutes of history keeps a month's fit within a minute.
ORIGIN_STRIDE = 3


def calendar(times: np.ndarray) -> np.ndarray:
    """(n, 7) month, day, hour, minute, weekday (Mon 0), day of year, ISO week of UTC epoch
    seconds."""
    stamps = times.astype("datetime64[s]")
    days = stamps.astype("datetime64[D]")
    months = stamps.astype("datetime64[M]")
    years = stamps.astype("datetime64[Y]")
    month = (months - years).astype(int) + 1
    day = (days - months).astype(int) + 1
    seconds = (stamps - days).astype(int)
    hour, minute = seconds // 3600, (seconds % 3600) // 60
    weekday = (days.astype(int) + 3) % 7  # 1970-01-01 was a Thursday
    dayofyear = (days - years).astype(int) + 1
    # ISO week: the week of this date's Thursday.
    thursday = days + (3 - weekday)
    week = (thursday - thursday.astype("datetime64[Y]")).astype(int) // 7 + 1
    return np.stack([month, day, hour, minute, weekday, dayofyear, week], axis=1).astype(float)


def _window_stats(y: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean, median and sample std of the ``width`` values ending at each index (NaN where
    fewer exist)."""
    n = len(y)
    mean = np.full(n, np.nan)
    median = np.full(n, np.nan)
    std = np.full(n, np.nan)
    if n >= width:
        windows = np.lib.stride_tricks.sliding_window_view(y, width)
        mean[width - 1:] = windows.mean(axis=1)
        median[width - 1:] = np.median(windows, axis=1)
        std[width - 1:] = windows.std(axis=1, ddof=1) if width > 1 else 0.0
    return mean, median, std


def features(y: np.ndarray, times: np.ndarray, origins: np.ndarray, horizon: int) -> np.ndarray:
    """Rows for every origin and every ``h = 1 .. horizon`` (origin-major): shape
    ``(len(origins) * horizon, len(FEATURES))``. ``times[i]`` is step i's start; steps are
    STEP_S apart. Only ``y[: origin + 1]`` enters an origin's rows."""
    y = np.asarray(y, dtype=float)
    origins = np.asarray(origins, dtype=int)
    if len(origins) and (origins.min() < 0 or origins.max() >= len(y)):
        raise ValueError("an origin lies outside the series")
    stats = [*_window_stats(y, 3), *_window_stats(y, 6)]
    h = np.tile(np.arange(1, horizon + 1), len(origins))
    o = np.repeat(origins, horizon)
    target = o + h
    target_times = times[0] + target * STEP_S
    cols = [calendar(target_times), h[:, None].astype(float), y[o][:, None]]
    cols += [s[o][:, None] for s in stats]
    for lag in (LAG_3H, DAY_STEPS):
        src = target - lag
        known = (src <= o) & (src >= 0)
        value = np.full(len(o), np.nan)
        value[known] = y[src[known]]
        cols.append(value[:, None])
    return np.hstack(cols)


def training_set(y: np.ndarray, times: np.ndarray, first: int, last: int, horizon: int,
                 stride: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Every ``stride``-th origin in ``[first, last - horizon]`` with its targets up to
    ``last`` (inclusive): features and the values they should predict."""
    first = max(first, LOOKBACK)
    origins = np.arange(first, last - horizon + 1, stride)
    if not len(origins):
        return np.empty((0, len(FEATURES))), np.empty(0)
    x = features(y, times, origins, horizon)
    targets = (np.repeat(origins, horizon) + np.tile(np.arange(1, horizon + 1), len(origins)))
    return x, np.asarray(y, dtype=float)[targets]


@dataclass(frozen=True)
class Fit:
    model: str  # LightGBM's model text: what the master keeps in its state directory
    rounds: int
    train_rows: int
    valid_rows: int
    horizon: int


def fit(y: Sequence[float], times: Sequence[float], train_end: int, valid_end: int,
        horizon: int, max_rounds: int = MAX_ROUNDS) -> Fit:
    """Train on targets up to ``train_end`` (exclusive), stop early on targets in
    ``[train_end, valid_end)``; without a validation range, train ``min(max_rounds, 300)``
    rounds."""
    import lightgbm as lgb

    ys = np.asarray(y, dtype=float)
    ts = np.asarray(times, dtype=float)
    x_train, y_train = training_set(ys, ts, 0, train_end - 1, horizon, ORIGIN_STRIDE)
    if not len(y_train):
        raise ValueError(f"too little history to train a forecaster: {len(ys)} steps, "
                         f"need more than {LOOKBACK + horizon}")
    x_valid, y_valid = training_set(ys, ts, train_end - horizon, valid_end - 1, horizon,
                                    ORIGIN_STRIDE)
    # Validation rows are those whose target lies in the validation range.
    if len(y_valid):
        origins = np.arange(max(train_end - horizon, LOOKBACK), valid_end - 1 - horizon + 1,
                            ORIGIN_STRIDE)
        targets = (np.repeat(origins, horizon) + np.tile(np.arange(1, horizon + 1),
                                                         len(origins)))
        keep = targets >= train_end
        x_valid, y_valid = x_valid[keep], y_valid[keep]
    train = lgb.Dataset(x_train, y_train, feature_name=list(FEATURES), free_raw_data=True)
    if len(y_valid):
        valid = lgb.Dataset(x_valid, y_valid, reference=train)
        booster = lgb.train(LGB_PARAMS, train, num_boost_round=max_rounds, valid_sets=[valid],
                            callbacks=[lgb.early_stopping(EARLY_STOP, verbose=False)])
    else:
        booster = lgb.train(LGB_PARAMS, train, num_boost_round=min(max_rounds, 300))
    rounds = booster.best_iteration or booster.current_iteration()
    return Fit(model=booster.model_to_string(num_iteration=rounds), rounds=rounds,
               train_rows=len(y_train), valid_rows=len(y_valid), horizon=horizon)


class Forecaster:
    """A trained model, answering "busy nodes at o+1 .. o+horizon"."""

    def __init__(self, model: str, horizon: int) -> None:
        import lightgbm as lgb

        self.booster = lgb.Booster(model_str=model)
        self.horizon = horizon

    def predict(self, y: Sequence[float], times: Sequence[float], origins: Sequence[int]
                ) -> np.ndarray:
        """(len(origins), horizon) forecasts, never below zero."""
        ys = np.asarray(y, dtype=float)
        x = features(ys, np.asarray(times, dtype=float), np.asarray(origins, dtype=int),
                     self.horizon)
        out = self.booster.predict(x, num_threads=1)
        return np.maximum(out, 0.0).reshape(len(origins), self.horizon)


def smape(predicted: Sequence[float], actual: Sequence[float]) -> float:
    """Symmetric mean absolute percentage error, in percent (Helios' definition; a pair of
    zeros counts as no error)."""
    p = np.asarray(predicted, dtype=float)
    a = np.asarray(actual, dtype=float)
    if p.shape != a.shape or not len(p):
        raise ValueError("SMAPE needs two series of the same, non-zero length")
    denom = np.abs(p) + np.abs(a)
    terms = np.where(denom > 0, np.abs(p - a) / np.where(denom > 0, denom, 1.0), 0.0)
    return float(200.0 * terms.mean()) if math.isfinite(terms.mean()) else math.nan
