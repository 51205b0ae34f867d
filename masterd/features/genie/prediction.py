"""What GENIE predicts for one job, for ``trellisctl show`` (the ``prediction`` of ``job``).

The prediction is computed from the master's live model database and the current platform
with the same code the policies use (``genie.plan``), so it says which model the job resolved
to — and whether that is a stand-in (``fallback``: another GPU model, a similar model type,
or no model at all and a default rate) — its predicted latency on the chosen placement, its
ECT (Eq. 9) or deadline. Where the running policy orders jobs by waiting allowance (SWAF,
alone or inside SODA's arrays) and the job is waiting, the policy's own ``explain`` gives the
placement it chose and the allowance ``w = e − (l + now)`` (Eq. 13).
"""

from __future__ import annotations

from typing import Any

from masterd.core.arrays.policy import ArrayPolicy
from masterd.core.genie import model as perf
from masterd.core.genie.modeldb import ModelDB, Resolution
from masterd.core.genie.plan import Estimator, GenieSettings, JobPlan, Platform
from masterd.core.policies.swaf import Choice, SwafPolicy
from masterd.core.policy import Policy
from masterd.runtime.context import CoreView
from shared.model import Job, JobKind, JobState


def _inner_policy(policy: ArrayPolicy, core: CoreView, job: Job) -> Policy | None:
    home = policy.array_map(core.snapshot()).home(job.spec)
    if home is None:
        return None
    # The array's ordering policy (created on first use, as the pass itself would).
    return policy.inner_for(home.job_array)


def ordering_policy(core: CoreView, job: Job) -> Policy | None:
    base = core.policy
    if isinstance(base, ArrayPolicy):
        return _inner_policy(base, core, job)
    return base


def settings_of(policy: Policy | None) -> GenieSettings:
    settings = getattr(policy, "settings", None)
    return settings if isinstance(settings, GenieSettings) else GenieSettings()


def _model(db: ModelDB, res: Resolution, kind: str) -> dict[str, Any]:
    entry = db.get(res.model_type, res.gpu_model, kind) or db.get(
        res.model_type, res.gpu_model, "training")
    c = res.coefficients
    return {
        "model_type": res.model_type,
        "gpu_model": res.gpu_model,
        "source": entry.source if entry is not None else "",
        "coefficients": {"k0": c.k0, "k1": c.k1, "k2": c.k2, "gamma": c.gamma, "lam": c.lam,
                         "nu": c.nu, "max_local_batch": c.max_local_batch},
    }


def _shape(core: CoreView, job: Job) -> tuple[str | None, int, int] | None:
    if job.placement is None or not job.placement.allocations:
        return None
    first = job.placement.allocations[0]
    view = core.node(first.node)
    gpu_model = view.inventory.gpu_model if view is not None else None
    return gpu_model, len(job.placement.allocations), len(first.gpus)


def predict(core: CoreView, db: ModelDB, job: Job, now: float) -> dict[str, Any] | None:
    spec = job.spec
    if spec.gpus == 0:
        return None  # CPU jobs have no GENIE model
    policy = ordering_policy(core, job)
    settings = settings_of(policy)
    platform = Platform.from_snapshot(core.snapshot())
    inference = spec.kind is JobKind.INFERENCE
    kind = "inference" if inference else "training"
    plan: JobPlan = Estimator(db, settings).plan(job, platform)
    out: dict[str, Any] = {
        "model_type": spec.model_type, "kind": kind, "batch": spec.batch,
        "iterations": spec.iterations, "model": None, "fallback": True, "fallback_reason": "",
        "single_gpu_latency_s": plan.single_gpu_latency, "ect": plan.ect,
        "deadline": spec.deadline, "qos": spec.qos.value, "placement": None,
        "predicted_latency_s": None, "waiting_allowance_s": None, "meets_ect": None,
        "explained_by": None,
    }

    shape = _shape(core, job)
    chosen = plan.choose(now)
    if shape is not None:
        group = next((g for g in plan.groups if g.gpu_model == shape[0]), None)
        gpu_model, d_node, d_gpn = shape
    elif chosen is not None:
        c = plan.candidates[chosen[0]]
        group = plan.groups[c.group]
        gpu_model, d_node, d_gpn = c.gpu_model, c.d_node, c.d_gpn
    else:
        group = plan.groups[0] if plan.groups else None
        gpu_model, d_node, d_gpn = (group.gpu_model if group else None), 0, 0

    res = group.resolution if group is not None else None
    if res is not None:
        out["model"] = _model(db, res, kind)
        out["fallback"] = res.fallback
        out["fallback_reason"] = res.reason
    elif spec.batch is None or spec.iterations is None:
        out["fallback_reason"] = (
            f"no prediction model: the job gives no batch/iterations; default rate "
            f"{settings.default_rate:g} samples/s per GPU")
    else:
        out["fallback_reason"] = (
            f"no prediction model: model type {spec.model_type!r} is not profiled and nothing "
            f"similar is (give --model-family/--model-params-m); default rate "
            f"{settings.default_rate:g} samples/s per GPU")

    if d_node and group is not None:
        if res is not None:
            rate = perf.processing_rate(res.coefficients, float(spec.batch or 0), d_node, d_gpn,
                                        inference)
        else:
            rate = d_node * d_gpn * settings.default_rate
        latency = perf.latency_from_rate(group.work, rate, group.nu) if rate else None
        out["placement"] = {"gpu_model": gpu_model, "d_node": d_node, "d_gpn": d_gpn,
                            "rate": rate}
        out["predicted_latency_s"] = latency
        if job.start_time is not None and latency is not None:
            out["predicted_end"] = job.start_time + latency
            if job.end_time is not None and job.state is JobState.FINISHED:
                actual = job.end_time - job.start_time
                out["actual_latency_s"] = actual
                out["prediction_error"] = (latency - actual) / actual if actual > 0 else None
        if job.start_time is not None:
            out["met_ect"] = (job.end_time <= plan.ect) if job.end_time is not None else None

    if job.state is JobState.QUEUED and isinstance(policy, SwafPolicy):
        choice: Choice | None = policy.explain(job.id, now)
        if choice is not None:
            c = choice.placement
            out["placement"] = {"gpu_model": c.gpu_model, "d_node": c.d_node,
                                "d_gpn": c.d_gpn, "rate": c.rate, "cer": c.cer}
            out["predicted_latency_s"] = choice.latency
            out["ect"] = choice.ect
            out["waiting_allowance_s"] = choice.waiting_allowance
            out["meets_ect"] = choice.meets_ect
            out["explained_by"] = policy.name
    return out
