"""Liquid's resources feature: usage journal, resource model, predictions, post phases.

* ``job_usage`` from a node is journalled (``liquid_usage``); a part's final report also
  stores the job's features and the report's per-task labels, which is what the model trains on.
* Every ``[master.liquid] retrain_s`` (and once the journal is read back) the newest
  ``max_rows`` final reports are read and the forests fitted in the master's worker process
  (:func:`masterd.features.liquid.forest.fit`); a busy worker skips the round. The held-out R²
  per label is journalled with the ``liquid_model`` event and served by the ``liquid`` RPC.
* Before each pass, waiting and running jobs the current model has not predicted get their
  predictions (``JobActions.annotate``, keys of :mod:`masterd.core.liquid.demand`).
* ``job_phase`` (post) from a node lends the job's GPUs (``JobActions.post_phase``) and notes
  when the post phase began, for Liquid's pre-scheduling rule; the phase lengths noded puts
  in final reports (``pre_s``, ``post_s``) are labels like the others, so the predictions
  include ``liquid.pre_s`` and ``liquid.post_s`` once enough jobs have reported them.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from masterd.core.liquid import demand as keys
from masterd.features.liquid.forest import MIN_ROWS, Model, fit
from masterd.features.liquid.jobfeatures import features_of, labels_of
from masterd.journal.liquid import create_tables, insert_usage, job_usage, training_rows
from masterd.runtime.context import FeatureContext
from masterd.runtime.workers import WorkerBusy
from shared.messages import JobPhase, JobUsage
from shared.model import Job, JobState

log = logging.getLogger("trellis.master.liquid")

# Model label -> Job.annotations key, and the scale between them.
ANNOTATIONS = {
    "gpu_util": (keys.GPU_UTIL, 1.0),
    "gpu_util_std": (keys.GPU_UTIL_STD, 1.0),
    "gpu_mem_mib": (keys.GPU_MEM, 1.0),
    "cpu": (keys.CPU, 1.0),
    "mem_mib": (keys.MEM, 1.0),
    "net_mbps": (keys.NET, 1.0),
    # Phase lengths noded measured: pre-scheduling's rule reads them (§6.1).
    "pre_s": (keys.PRE_S, 1.0),
    "post_s": (keys.POST_S, 1.0),
}


class LiquidResources:
    def __init__(self, ctx: FeatureContext) -> None:
        self.ctx = ctx
        self.model: Model | None = None
        self.version = 0
        self.trained_at: float | None = None
        self.last_round: dict[str, Any] | None = None
        self._predicted: dict[str, int] = {}  # job id -> model version that predicted it
        ctx.journal.now(create_tables)
        ctx.events.restored.subscribe(self.start)
        ctx.events.before_pass.subscribe(self.before_pass)
        ctx.events.node_event.subscribe(self.node_event)
        ctx.events.job_forgotten.subscribe(lambda job: self._predicted.pop(job.id, None))

    # -- lifecycle -----------------------------------------------------------------------
    def start(self) -> None:
        config = self.ctx.config().liquid
        if not config.model:
            return
        self.ctx.tasks.spawn(self.retrain())
        if config.retrain_s > 0:
            self.ctx.tasks.every(config.retrain_s, self.retrain, "liquid-retrain")

    async def retrain(self) -> dict[str, Any]:
        """Fit the model on the journal's newest usage rows; what the round did."""
        config = self.ctx.config().liquid
        rows = await self.ctx.journal.call(training_rows, config.max_rows)
        outcome: dict[str, Any] = {"time": self.ctx.clock(), "rows": len(rows)}
        if len(rows) < MIN_ROWS:  # not worth starting a worker process for
            outcome["skipped"] = f"too few usage reports to learn from (need {MIN_ROWS})"
            self.last_round = outcome
            return outcome
        try:
            model = await self.ctx.workers.run(fit, rows, config.seed, name="liquid-train")
        except WorkerBusy:
            outcome["skipped"] = "the worker is busy"
            self.last_round = outcome
            log.info("liquid_model skipped rows=%d reason=worker_busy", len(rows))
            return outcome
        if model is None:
            outcome["skipped"] = "no label had enough usage reports to learn from"
            self.last_round = outcome
            return outcome
        self.model = model
        self.version += 1
        self.trained_at = self.ctx.clock()
        outcome.update(r2=dict(model.r2), test_rows=model.test_rows, version=self.version)
        self.last_round = outcome
        r2 = {k: (None if v != v else round(v, 4)) for k, v in model.r2.items()}
        await self.ctx.journal.persist([], [(self.trained_at, None, None, "liquid_model",
                                             {"rows": model.rows, "test_rows": model.test_rows,
                                              "r2": r2, "version": self.version})])
        log.info("liquid_model trained rows=%d test_rows=%d mean_r2=%s", model.rows,
                 model.test_rows, model.mean_r2)
        self.predict_all()
        return outcome

    # -- predictions ---------------------------------------------------------------------
    def before_pass(self) -> None:
        if self.model is None:
            return
        core = self.ctx.core
        waiting = [j for j in core.queue() if self._predicted.get(j.id) != self.version]
        self._annotate(waiting)

    def predict_all(self) -> None:
        core = self.ctx.core
        self._annotate([*core.queue(), *core.active_jobs().values()])

    def _annotate(self, jobs: list[Job]) -> None:
        model = self.model
        if model is None or not jobs:
            return
        predictions = model.predict_many([features_of(j.spec) for j in jobs])
        for job, predicted in zip(jobs, predictions, strict=True):
            values = {}
            for label, value in predicted.items():
                key, scale = ANNOTATIONS[label]
                values[key] = max(0.0, value * scale)
            if keys.GPU_UTIL in values:
                values[keys.GPU_UTIL] = min(1.0, values[keys.GPU_UTIL])
            self.ctx.jobs.annotate(job.id, values)
            self._predicted[job.id] = self.version

    def prediction(self, job: Job) -> dict[str, float]:
        return {k: v for k, v in job.annotations.items() if k.startswith("liquid.")}

    # -- node events ---------------------------------------------------------------------
    async def node_event(self, node: str, body: Any) -> None:
        if isinstance(body, JobUsage):
            await self._usage(node, body)
        elif isinstance(body, JobPhase):
            self._phase(node, body)

    async def _usage(self, node: str, usage: JobUsage) -> None:
        job = self.ctx.core.job(usage.job_id)
        report = {k: v for k, v in dataclasses.asdict(usage).items() if k != "job_id"}
        features = labels = None
        if usage.final and job is not None:
            workers = 1
            if job.placement is not None:
                parts = [a for a in job.placement.allocations if a.node == node]
                workers = max(1, sum(len(a.gpus) for a in parts))
            features = features_of(job.spec)
            labels = labels_of(report, workers)
        await self.ctx.journal.call(insert_usage, [(
            usage.job_id, node, self.ctx.clock(), usage.final, report, features, labels)])
        log.debug("job=%s node=%s usage final=%s", usage.job_id, node, usage.final)

    def _phase(self, node: str, phase: JobPhase) -> None:
        job = self.ctx.core.job(phase.job_id)
        if job is None or job.state is not JobState.RUNNING:
            return
        self.ctx.jobs.annotate(job.id, {keys.POST_SINCE: self.ctx.clock()})
        lent = self.ctx.jobs.post_phase(job.id)
        log.info("job=%s node=%s phase=post util=%.1f lent=%s", job.id, node, phase.gpu_util,
                 lent)

    # -- views ---------------------------------------------------------------------------
    async def usage_of(self, job_id: str) -> list[dict[str, Any]]:
        return await self.ctx.journal.call(job_usage, job_id)

    def summary(self) -> dict[str, Any]:
        model = self.model
        return {
            "enabled": self.ctx.config().liquid.model,
            "version": self.version,
            "trained_at": self.trained_at,
            "rows": None if model is None else model.rows,
            "test_rows": None if model is None else model.test_rows,
            "r2": None if model is None else {k: (None if v != v else v)
                                              for k, v in model.r2.items()},
            "label_means": None if model is None else dict(model.mean),
            "last_round": self.last_round,
        }
