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


@dataclass(frozen=True)
class NoParams:
    pass


def method_table(master: Master) -> dict[str, tuple[type, Callable[[Any], Awaitable[Any]]]]:
    features = master.features

    async def estimator(_: NoParams) -> dict[str, Any]:
        return features.estimator.summary()

    async def estimator_train(_: NoParams) -> dict[str, Any]:
        features.estimator.summary()  # refuses when the estimator is not running
        return await features.estimator.retrain()

    async def power(_: NoParams) -> dict[str, Any]:
        return features.power.summary()

    return {"estimator": (NoParams, estimator), "estimator_train": (NoParams, estimator_train),
            "power": (NoParams, power)}


def job_extras(master: Master, job: Job) -> dict[str, Any]:
    estimate = master.features.estimator.explain(job)
    return {"estimate": estimate} if estimate is not None else {}
