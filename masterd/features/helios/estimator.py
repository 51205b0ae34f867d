"""QSSF's duration estimator in the live master (Helios §4.2.2); runs when the policy is qssf.

* At start (``restored``) the newest ``history_jobs`` finished jobs of the journal fill the
  rolling history, and the LightGBM model of the state directory (``helios-duration.json``),
  if any, is loaded in a thread.
* Before each pass, every waiting job without an estimate gets one: the ML part (the model's
  prediction, attached as ``duration_ml_s``) blended with the rolling part by
  :class:`masterd.core.helios.estimate.QssfEstimator`, attached as ``duration_estimate_s``
  (``JobActions.annotate``), which the qssf policy ranks by (times the job's GPUs).
* A job that finishes joins the rolling history; its estimate and run time join the
  accuracy window (``trellisctl estimator``).
* Every ``retrain_interval_s`` (and at start, once ``min_jobs`` finished jobs exist) the
  model is retrained in the master's worker process from the journal; the worker also
  predicts the waiting jobs, whose estimates are then refreshed. A busy worker skips the round.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from masterd.core.helios.duration_model import DurationModel, JobRow
from masterd.core.helios.estimate import ESTIMATE_KEY, ML_KEY, Estimate, QssfEstimator
from masterd.core.scheduler import JobError
from masterd.features.helios.trainer import MODEL_FILE, load_model, train_duration
from masterd.journal.helios import finished_from_store
from masterd.runtime.context import FeatureContext
from masterd.runtime.workers import WorkerBusy, WorkerError
from shared.model import Job, JobState

log = logging.getLogger("trellis.master.estimator")

REFRESH_SLICE = 256  # waiting jobs re-estimated per turn of the event loop after a retrain


@dataclass(frozen=True)
class Outcome:
    """A finished job's estimate against what it ran."""

    job_id: str
    estimate_s: float | None
    rolling_s: float | None
    ml_s: float | None
    actual_s: float


def job_row(job: Job) -> JobRow:
    spec = job.spec
    return JobRow(user=spec.user, tenant=spec.tenant, name=spec.name, gpus=spec.gpus,
                  cpus=spec.cpus, submit_time=job.submit_time)


class DurationEstimator:
    def __init__(self, ctx: FeatureContext, policy: str) -> None:
        self.ctx = ctx
        self.enabled = policy == "qssf"
        config = ctx.config().estimator
        self.core = QssfEstimator(alpha=config.alpha)
        self.model: DurationModel | None = None
        self.estimates: dict[str, Estimate] = {}  # job id -> its estimate, while in memory
        self.outcomes: deque[Outcome] = deque(maxlen=config.accuracy_window)
        self.last_training: dict[str, Any] | None = None  # the last round, failed or not
        self._training = False
        if self.enabled:
            ctx.events.restored.subscribe(self.start)
            ctx.events.before_pass.subscribe(self.before_pass)
            ctx.events.job_ended.subscribe(self.job_ended)
            ctx.events.job_forgotten.subscribe(lambda job: self.estimates.pop(job.id, None))

    @property
    def model_path(self) -> Path:
        return Path(self.ctx.config().state_dir) / MODEL_FILE

    # -- lifecycle -----------------------------------------------------------------------
    def start(self) -> None:
        """After the restore, before serving: the journal is read from this thread."""
        config = self.ctx.config().estimator
        history = self.ctx.journal.now(finished_from_store, config.history_jobs)
        for row in history:
            self.core.history.record(row.user, row.name, row.gpus, row.duration_s or 0.0)
        log.info("estimator history loaded jobs=%d", len(history))
        self.ctx.tasks.spawn(self._start_model(len(history)), "estimator-load")
        if config.retrain_interval_s > 0:
            self.ctx.tasks.every(config.retrain_interval_s, self.retrain, "estimator-retrain")

    async def _start_model(self, finished: int) -> None:
        if self.model_path.exists():
            try:
                self.model = await asyncio.to_thread(load_model, self.model_path.parent)
                self.core.ml_source = self._source()
                log.info("estimator model loaded path=%s jobs=%s", self.model_path,
                         self.model.meta.get("jobs"))
                self._refresh_all()
                return
            except (OSError, ValueError, KeyError) as exc:
                log.warning("estimator model not usable path=%s error=%s; retraining",
                            self.model_path, exc)
        if finished >= self.ctx.config().estimator.min_jobs:
            await self.retrain()

    def _source(self) -> str | None:
        if self.model is None:
            return None
        trained = self.model.meta.get("trained_at")
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(trained)) if trained else "?"
        return f"lightgbm trained {when} on {self.model.meta.get('jobs')} jobs"

    # -- estimates -----------------------------------------------------------------------
    def before_pass(self) -> None:
        waiting = [j for j in self.ctx.core.queue() if ESTIMATE_KEY not in j.annotations]
        if waiting:
            self._attach(waiting, None)

    def _attach(self, jobs: list[Job], ml: list[float] | None) -> None:
        if ml is None and self.model is not None:
            ml = self.model.predict([job_row(j) for j in jobs])
        for k, job in enumerate(jobs):
            values: dict[str, float] = {}
            if ml is not None:
                values[ML_KEY] = ml[k]
            # The blend reads the ML part from the job's annotations.
            estimate = self.core.estimate(job) if ml is None else \
                self.core.estimate_with(job, ml[k])
            self.estimates[job.id] = estimate
            if estimate.value_s is not None:
                values[ESTIMATE_KEY] = estimate.value_s
            if values:
                self.ctx.jobs.annotate(job.id, values)

    def _refresh_all(self) -> None:
        queue = list(self.ctx.core.queue())
        if queue:
            self._attach(queue, None)

    def job_ended(self, job: Job) -> None:
        if job.state is not JobState.FINISHED or job.start_time is None or job.end_time is None:
            return
        actual = job.end_time - job.start_time
        self.core.finished(job, actual)
        estimate = self.estimates.get(job.id)
        if estimate is not None:
            self.outcomes.append(Outcome(job.id, estimate.value_s, estimate.rolling_s,
                                         estimate.ml_s, actual))

    # -- training ------------------------------------------------------------------------
    async def retrain(self) -> dict[str, Any]:
        """One round: fit in the worker, load the model off the loop, refresh estimates."""
        if self._training:
            return {"skipped": "a training round is already running"}
        self._training = True
        config = self.ctx.config().estimator
        started = self.ctx.clock()
        queue = list(self.ctx.core.queue())
        try:
            result = await self.ctx.workers.run(
                train_duration, self.ctx.journal.location,
                config_state(self.ctx), config.max_jobs, config.min_jobs,
                [job_row(j) for j in queue], name="helios-duration-train")
            model = await asyncio.to_thread(load_model, self.model_path.parent)
        except WorkerBusy:
            self.last_training = {"time": started, "skipped": "the worker is busy"}
            return self.last_training
        except (WorkerError, ValueError, OSError) as exc:
            self.last_training = {"time": started, "error": str(exc)}
            log.warning("estimator training failed: %s", exc)
            return self.last_training
        finally:
            self._training = False
        self.model = model
        self.core.ml_source = self._source()
        predictions = dict(zip([j.id for j in queue], result["predictions"], strict=True))
        # In slices, yielding between them: a long queue's refresh must not stall the loop.
        for start in range(0, len(queue), REFRESH_SLICE):
            part = [j for j in queue[start:start + REFRESH_SLICE]
                    if j.state is JobState.QUEUED and j.id in self.ctx.core.jobs]
            self._attach(part, [predictions[j.id] for j in part])
            await asyncio.sleep(0)
        still = [j for j in queue if j.state is JobState.QUEUED]
        self.last_training = {"time": started, **result["meta"]}
        log.info("estimator trained jobs=%s seconds=%.1f refreshed=%d", result["meta"]["jobs"],
                 result["meta"]["seconds"], len(still))
        await self.ctx.journal.persist([], [(self.ctx.clock(), None, None, "estimator_trained",
                                             {k: v for k, v in result["meta"].items()})])
        return self.last_training

    # -- views ---------------------------------------------------------------------------
    def explain(self, job: Job) -> dict[str, Any] | None:
        estimate = self.estimates.get(job.id)
        if estimate is None:
            return None
        out = estimate.as_dict()
        value = job.annotations.get(ESTIMATE_KEY, estimate.value_s)
        out["priority_gpu_s"] = None if value is None else max(job.spec.gpus, 1) * value
        return out

    def summary(self) -> dict[str, Any]:
        if not self.enabled:
            raise JobError("not_supported", "the duration estimator runs under the qssf "
                           f"policy; this master runs {self.ctx.core.policy_name!r}")
        return {"alpha": self.core.alpha, "history_jobs": len(self.core.history),
                "model": None if self.model is None else dict(self.model.meta),
                "model_source": self._source(), "last_training": self.last_training,
                "accuracy": accuracy(list(self.outcomes))}


def config_state(ctx: FeatureContext) -> str:
    return ctx.config().state_dir


def accuracy(outcomes: list[Outcome]) -> dict[str, Any]:
    """Mean absolute error (s) and mean relative error of the estimate and of its parts."""

    def errors(pick: str) -> tuple[float | None, float | None]:
        pairs = [(getattr(o, pick), o.actual_s) for o in outcomes if getattr(o, pick)
                 is not None]
        if not pairs:
            return None, None
        mae = sum(abs(e - a) for e, a in pairs) / len(pairs)
        rel = [abs(e - a) / a for e, a in pairs if a > 0]
        return mae, (sum(rel) / len(rel) if rel else None)

    out: dict[str, Any] = {"jobs": len(outcomes)}
    for name, pick in (("estimate", "estimate_s"), ("rolling", "rolling_s"), ("ml", "ml_s")):
        mae, rel = errors(pick)
        out[f"{name}_mae_s"] = mae
        out[f"{name}_mean_relative_error"] = rel
    return out
