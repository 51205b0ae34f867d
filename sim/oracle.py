"""A model database holding the simulator's *true* coefficients: policies with perfect knowledge.

Policies normally predict with their own model database, whose coefficients differ from the
truth on purpose. Handing a GENIE-family policy (SJF, SWAF, ...) this database instead makes its
latency predictions those of the ground truth, so SJF becomes the "perfect knowledge" bound of
Helios §4.2.3. Two gaps remain and are measured by :func:`prediction_errors`: the prediction
model has no locality term (a packed job of more GPUs than one PCIe switch or socket holds runs
slightly slower than predicted) and declared iteration counts are rounded to whole iterations.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from masterd.core.genie.model import Coefficients, latency
from masterd.core.genie.modeldb import ModelDB, ModelEntry
from shared.model import JobKind
from sim.truth import ModelProfile, NodeTopology, TruthConfig
from sim.workloads.base import SimJob

ORACLE_SOURCE = "trellis-sim ground truth (oracle)"


def _coefficients(profile: ModelProfile, startup: bool) -> Coefficients:
    return Coefficients(
        k0=profile.k0,
        k1=profile.k1,
        k2=profile.k2,
        gamma=profile.gamma,
        lam=profile.lam,
        # Known-duration jobs have no start-up phase in the truth model: their duration is all.
        nu=profile.startup_s if startup else 0.0,
    )


def oracle_modeldb(
    truth: TruthConfig, gpu_model: str, known_duration: bool = True
) -> ModelDB:
    """Every truth profile as a model database entry for ``gpu_model`` (also the default, so
    labels such as ``P40-vc<id>`` resolve to it)."""
    entries = []
    for model_type, (train, infer) in sorted(truth.profiles.items()):
        for kind, profile in (("training", train), ("inference", infer)):
            entries.append(
                ModelEntry(
                    model_type=model_type,
                    gpu_model=gpu_model,
                    kind=kind,
                    coefficients=_coefficients(profile, startup=not known_duration),
                    source=ORACLE_SOURCE,
                )
            )
    return ModelDB(entries, default_gpu_model=gpu_model)


def predicted_duration(
    db: ModelDB, job: SimJob, topo: NodeTopology
) -> float | None:
    """What a GENIE-family policy with ``db`` predicts for ``job`` on its requested GPUs,
    packed on the fewest nodes (the shape SJF ranks by)."""
    spec = job.spec
    if spec.batch is None or spec.iterations is None or spec.gpus < 1:
        return None
    kind = "inference" if spec.kind is JobKind.INFERENCE else "training"
    resolved = db.resolve(spec.model_type, db.default_gpu_model or "", kind)
    if resolved is None:
        return None
    d_node, _, _ = topo.reference(spec.gpus)
    if spec.gpus % d_node:
        return None  # uneven shapes are ranked by the policy's fallback, not measured here
    return latency(resolved.coefficients, spec.batch, spec.iterations, d_node,
                   spec.gpus // d_node, inference=kind == "inference")


def prediction_errors(
    db: ModelDB, jobs: Iterable[SimJob], topo: NodeTopology, min_duration: float = 60.0
) -> dict[str, float | int | None]:
    """Relative error |predicted / trace duration − 1| over jobs of at least ``min_duration``
    seconds (shorter ones are dominated by rounding to whole iterations)."""
    errors = []
    for job in jobs:
        duration = job.truth.known_duration
        if duration is None or duration < min_duration:
            continue
        predicted = predicted_duration(db, job, topo)
        if predicted is None:
            continue
        errors.append(abs(predicted / duration - 1.0))
    if not errors:
        return {"jobs": 0, "mean_pct": None, "max_pct": None}
    errors.sort()
    return {
        "jobs": len(errors),
        "mean_pct": 100.0 * math.fsum(errors) / len(errors),
        "p99_pct": 100.0 * errors[max(0, math.ceil(0.99 * len(errors)) - 1)],
        "max_pct": 100.0 * errors[-1],
    }
