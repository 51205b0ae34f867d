"""Liquid's RPC: ``liquid`` (the resource model: rows, held-out R² per label, last training
round), ``liquid_train`` (train now), and the ``usage`` and ``resources`` parts of a ``job``
result (what its parts really used, what the model predicts for it)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from masterd.core.scheduler import JobError
from masterd.service.master import Master
from shared.model import Job
from shared.rpcdoc import returns


@dataclass(frozen=True)
class NoParams:
    pass


def method_table(master: Master) -> dict[str, tuple[type, Callable[[Any], Awaitable[Any]]]]:
    liquid = master.features.liquid

    @returns("`enabled`, `version`, `trained_at`, `rows` and `test_rows` of the last fit, "
             "`r2` (held-out R² per label, nil where undefined), `label_means`, `last_round` "
             "(what the latest training round did); the model fields are nil before the first "
             "fit.")
    async def summary(_: NoParams) -> dict[str, Any]:
        """Liquid's resource model: its rows, held-out R² per label, last training round."""
        return liquid.summary()

    @returns("The round: `time`, `rows`, and either `skipped` (why nothing was fitted) or "
             "`r2`, `test_rows` and the new `version`.", ("not_supported",))
    async def train(_: NoParams) -> dict[str, Any]:
        """Train Liquid's resource model now (in a worker process)."""
        if not master.config.liquid.model:
            raise JobError("not_supported", "the resource model is off ([master.liquid] "
                           "model = false)")
        return await liquid.retrain()

    return {"liquid": (NoParams, summary), "liquid_train": (NoParams, train)}


async def job_extras(master: Master, job: Job) -> dict[str, Any]:
    """The ``usage`` (per node, the newest report) and ``resources`` (predictions) of a job."""
    liquid = master.features.liquid
    return {"usage": await liquid.usage_of(job.id), "resources": liquid.prediction(job)}
