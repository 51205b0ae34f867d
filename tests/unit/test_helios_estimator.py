"""QSSF's duration estimator as a master feature: history read back from the journal,
estimates attached before passes, a LightGBM model trained in the worker process (its file in
the state directory) refreshing the waiting jobs' estimates, and the accuracy window."""

from __future__ import annotations

from pathlib import Path

from masterd.core.helios.estimate import ESTIMATE_KEY, ML_KEY, USER_SIMILAR
from masterd.core.policies import make_policy
from masterd.core.scheduler import SchedulingCore
from masterd.features.helios.estimator import DurationEstimator
from masterd.features.helios.trainer import MODEL_FILE
from masterd.journal.store import Store
from shared.model import Job, JobSpec, JobState
from tests.unit.feature_context import FeatureHarness


def spec(name: str, user: str = "alice", gpus: int = 1) -> JobSpec:
    return JobSpec(name=name, command=("true",), user=user, gpus=gpus, cpus=1)


def finished_jobs(count: int) -> list[tuple[int, Job]]:
    """Evaluation jobs run a minute, training jobs two hours."""
    jobs = []
    for i in range(count):
        short = i % 2 == 0
        job = Job(id=f"old-{i}", spec=spec(("eval-" if short else "train-") + str(i % 3),
                                           user=f"u{i % 4}"),
                  submit_time=1.6e9 + 60 * i, state=JobState.FINISHED)
        job.start_time = job.submit_time + 5
        job.end_time = job.start_time + (60.0 if short else 7200.0)
        jobs.append((i + 1, job))
    return jobs


async def test_estimates_history_training_and_accuracy(tmp_path: Path) -> None:
    Store(tmp_path / "master.db").insert_jobs(finished_jobs(120))
    harness = FeatureHarness(tmp_path, now=1.7e9,
                             core=SchedulingCore(make_policy("qssf")))
    harness.config = type(harness.config)(state_dir=str(tmp_path))
    estimator = DurationEstimator(harness.ctx, "qssf")
    try:
        harness.events.restored.emit()
        assert len(estimator.core.history) == 120
        # Rolling estimate at once, before any model exists.
        waiting = Job(id="new-eval", spec=spec("eval-1", user="u0"), submit_time=1.7e9)
        harness.core.submit(waiting)
        harness.events.before_pass.emit()
        assert waiting.annotations[ESTIMATE_KEY] == 60.0
        assert estimator.estimates["new-eval"].rolling_source == USER_SIMILAR
        # Training in the worker: the model file appears, the waiting job gets an ML part.
        result = await estimator.retrain()
        assert result.get("jobs") == 120, result
        assert (tmp_path / MODEL_FILE).exists()
        assert ML_KEY in waiting.annotations
        blended = waiting.annotations[ESTIMATE_KEY]
        assert blended == 0.1 * 60.0 + 0.9 * waiting.annotations[ML_KEY]
        assert 20 < waiting.annotations[ML_KEY] < 600
        long = Job(id="new-train", spec=spec("train-2", user="u1"), submit_time=1.7e9)
        harness.core.submit(long)
        harness.events.before_pass.emit()
        assert long.annotations[ESTIMATE_KEY] > 10 * waiting.annotations[ESTIMATE_KEY]
        explained = estimator.explain(long)
        assert explained is not None and explained["ml_source"].startswith("lightgbm")
        # A job that finishes joins the history and the accuracy window.
        long.state, long.start_time, long.end_time = JobState.FINISHED, 1.7e9, 1.7e9 + 7000
        estimator.job_ended(long)
        summary = estimator.summary()
        assert summary["history_jobs"] == 121
        assert summary["accuracy"]["jobs"] == 1
        assert summary["accuracy"]["estimate_mae_s"] is not None
        # A new estimator (a restarted master) loads the model file instead of training.
        again = DurationEstimator(harness.ctx, "qssf")
        await again._start_model(0)
        assert again.model is not None and again.model.meta["jobs"] == 120
    finally:
        await harness.close()


async def test_too_little_history_is_reported_not_raised(tmp_path: Path) -> None:
    Store(tmp_path / "master.db").insert_jobs(finished_jobs(5))
    harness = FeatureHarness(tmp_path)
    harness.config = type(harness.config)(state_dir=str(tmp_path))
    estimator = DurationEstimator(harness.ctx, "qssf")
    try:
        result = await estimator.retrain()
        assert "training needs 50" in result["error"]
        assert estimator.model is None
    finally:
        await harness.close()
