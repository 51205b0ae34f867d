"""The RPC of the operators' say over jobs: ``hold``, ``release`` and ``update``, served by
the job controls feature (``masterd.features.holds``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from masterd.features.holds import HoldParams, JobControls, UpdateParams
from shared.model import Job
from shared.rpcdoc import returns

View = Callable[[Job], dict[str, Any]]


def method_table(controls: JobControls, view: View) -> Mapping[str, tuple[type, Any]]:
    """The entries for :class:`masterd.api.rpc.Rpc`'s method table; ``view`` is the job
    view (``masterd.api.rpc.job_view`` with the master's wire cache)."""

    @returns("`job`: the job's [job view](#job-view), `held` = `user` or `admin`, `wait` = "
             "`held`. Holding a held job again changes nothing (an admin's hold replaces a "
             "user's).", ("unknown_job", "job_finished", "job_not_queued", "forbidden"))
    async def hold(p: HoldParams) -> dict[str, Any]:
        """Keep a queued job from starting until it is released (Slurm's `scontrol hold`).
        A client may hold only its own user's jobs; a job that started cannot be held."""
        return {"job": view(await controls.hold(p.id))}

    @returns("`job`: the job's [job view](#job-view), `held` = `\"\"`.",
             ("unknown_job", "job_finished", "job_not_held", "forbidden"))
    async def release(p: HoldParams) -> dict[str, Any]:
        """Let a held job be scheduled again. Only an admin releases an admin's hold."""
        return {"job": view(await controls.release(p.id))}

    @returns("`job`: the job's [job view](#job-view) with the new values. Each change is "
             "journalled as an `updated` event with the old and new value of each field.",
             ("unknown_job", "job_finished", "forbidden", "invalid_params"))
    async def update(p: UpdateParams) -> dict[str, Any]:
        """Change a job's QoS class, time limit or priority (Slurm's `scontrol update`). A
        client may only lower what concerns its own user's job (qos urgent > prior > normal,
        a shorter time limit, a lower priority) and use only the QoS classes the master's
        `qos_urgent_users`/`qos_prior_users` allow it; admins may change anything."""
        return {"job": view(await controls.update(p))}

    return {"hold": (HoldParams, hold), "release": (HoldParams, release),
            "update": (UpdateParams, update)}
