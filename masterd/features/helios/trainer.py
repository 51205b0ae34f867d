"""What the master's worker process runs for Helios: fitting the duration and busy-node
models from the journal. Top-level functions with plain arguments and results (pickled to and
from the worker); nothing here touches the event loop.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from masterd.core.helios import duration_model, forecast
from masterd.journal.backends import open_reader
from masterd.journal.helios import finished_jobs

MODEL_FILE = "helios-duration.json"  # encoders and meta; the trees beside it:
TREES_FILE = "helios-duration.lgb.txt"
FORECAST_FILE = "helios-forecast.txt"


def save_model(model: duration_model.DurationModel, state_dir: Path) -> None:
    """Both files, each replaced atomically; the encoders last, so a reader that finds new
    encoders finds the trees they go with."""
    tmp_trees = state_dir / f".{TREES_FILE}.{os.getpid()}.tmp"
    tmp_encoders = state_dir / f".{MODEL_FILE}.{os.getpid()}.tmp"
    model.save(tmp_trees, tmp_encoders)
    os.replace(tmp_trees, state_dir / TREES_FILE)
    os.replace(tmp_encoders, state_dir / MODEL_FILE)


def load_model(state_dir: str | Path) -> duration_model.DurationModel:
    return duration_model.DurationModel.load(Path(state_dir) / TREES_FILE,
                                             Path(state_dir) / MODEL_FILE)


def train_duration(journal: str, state_dir: str, max_jobs: int, min_jobs: int,
                   queued: list[duration_model.JobRow]) -> dict[str, Any]:
    """Fit the duration model on the newest ``max_jobs`` finished jobs, write it to the state
    directory and predict ``queued``. Raises ValueError with fewer than ``min_jobs``."""
    started = time.monotonic()
    db = open_reader(journal)
    try:
        rows = finished_jobs(db, max_jobs)
    finally:
        db.close()
    if len(rows) < min_jobs:
        raise ValueError(f"{len(rows)} finished jobs in the journal; training needs {min_jobs}")
    model = duration_model.train(rows, {"trained_at": time.time()})
    save_model(model, Path(state_dir))
    return {"meta": dict(model.meta, seconds=time.monotonic() - started),
            "predictions": model.predict(queued)}


def train_forecaster(steps: list[int], busy: list[float], horizon: int) -> dict[str, Any]:
    """Fit the busy-node forecaster on a history of (step, busy) (the newest ~fifth stops
    training early); returns the model text."""
    started = time.monotonic()
    first = steps[0]
    n = steps[-1] - first + 1
    series = [float("nan")] * n
    for step, value in zip(steps, busy, strict=True):
        series[step - first] = value
    for i in range(1, n):  # steps without a sample carry the previous value
        if series[i] != series[i]:
            series[i] = series[i - 1]
    times = [(first + i) * forecast.STEP_S for i in range(n)]
    valid_from = max(forecast.LOOKBACK + horizon + 1, n - max(n // 5, horizon + 1))
    fit = forecast.fit(series, times, valid_from, n, horizon)
    return {"model": fit.model, "rounds": fit.rounds, "rows": fit.train_rows,
            "seconds": time.monotonic() - started, "trained_at": time.time()}
