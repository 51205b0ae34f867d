"""Helios' RPC: ``estimator`` (QSSF's duration estimator: accuracy over the newest finished
jobs, the model and its last training), ``estimator_train`` (retrain now), ``power`` (Cluster
Energy Saving: node counts by power state, wake-ups, node-hours saved, the last decision), and
the ``estimate`` part of a ``job`` result (the estimate, both parts and their sources)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from masterd.service.master import Master
from shared.model import Job
from shared.rpcdoc import returns


@dataclass(frozen=True)
class NoParams:
    pass


def method_table(master: Master) -> dict[str, tuple[type, Callable[[Any], Awaitable[Any]]]]:
    features = master.features

    @returns("`alpha`, `history_jobs`, `model` (the trained model's metadata, or nil), "
             "`model_source`, `last_training` (the latest round, or nil) and `accuracy` (mean "
             "absolute and relative errors of the estimates and of their parts over the newest "
             "finished jobs).", ("not_supported",))
    async def estimator(_: NoParams) -> dict[str, Any]:
        """QSSF's duration estimator: its model, last training and accuracy (qssf policy)."""
        return features.estimator.summary()

    @returns("The round: `time` and either `skipped`, `error`, or what was trained.",
             ("not_supported",))
    async def estimator_train(_: NoParams) -> dict[str, Any]:
        """Retrain the duration estimator now (in a worker process)."""
        features.estimator.summary()  # refuses when the estimator is not running
        return await features.estimator.retrain()

    @returns("`counts` (nodes by power state), `params`, `wakeups`, `nodes_woken`, "
             "`node_hours_saved`, `failures`, `last_decision`, `history_steps`, `forecaster` "
             "and `nodes` (each managed node's power state).", ("not_supported",))
    async def power(_: NoParams) -> dict[str, Any]:
        """Cluster Energy Saving: node power states, wake-ups, node-hours saved."""
        return features.power.summary()

    return {"estimator": (NoParams, estimator), "estimator_train": (NoParams, estimator_train),
            "power": (NoParams, power)}


def job_extras(master: Master, job: Job) -> dict[str, Any]:
    estimate = master.features.estimator.explain(job)
    return {"estimate": estimate} if estimate is not None else {}
