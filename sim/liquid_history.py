"""The resource model in the testbed replay: trained on the history the testbed's jobs would
leave, predicting for the jobs replayed (the same :mod:`masterd.features.liquid` code the
master runs).

Liquid learns from earlier runs of the same routine jobs (§4.2). The replay has no such runs,
so it makes them: ``runs`` past jobs of the testbed's models with seeded worker counts, each
"measured" as noded would have measured it on a cluster that placed every worker away from
its parameter server: GPU utilisation (compute share of an iteration), network bandwidth per
worker (``2·G`` per iteration) and GPU memory, each with seeded lognormal measurement noise
(``noise``). The forests are fitted on them (:func:`masterd.features.liquid.forest.fit`, with
Liquid's settings) and the replayed jobs get the predictions as annotations, as the live
feature attaches them.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from masterd.core.liquid.demand import GPU_MEM, GPU_UTIL, NET
from masterd.features.liquid.forest import Model, fit
from masterd.features.liquid.jobfeatures import features_of
from shared.model import Job, JobKind, JobSpec
from sim.psnet import SyncProfile
from sim.workloads.liquid import BATCH_PER_WORKER

MEMORY_MIB = {"resnet50": 5200.0, "inception-v3": 4600.0, "vgg16": 7400.0}


@dataclass(frozen=True)
class History:
    runs: int = 400
    noise: float = 0.08
    nic_mbps: float = 1875.0
    seed: int = 1


def measured(profile: SyncProfile, workers: int, nic_mbps: float) -> dict[str, float]:
    """What a run of ``workers`` workers, each on another node than its PS, uses."""
    flows = max(1, workers)
    sync = 2 * profile.gradient_mb / (nic_mbps / flows)
    step = profile.compute_s + sync
    return {"gpu_util": profile.compute_s / step, "net_mbps": 2 * profile.gradient_mb / step}


def history_rows(profiles: Mapping[str, SyncProfile],
                 config: History) -> list[tuple[dict[str, float], dict[str, float]]]:
    rng = random.Random(f"liquid-history/{config.seed}")
    models = sorted(profiles)
    rows = []
    for i in range(config.runs):
        model = rng.choice(models)
        workers = rng.choice((1, 2, 3, 4))
        steps = rng.randint(500, 3000)
        spec = JobSpec(name=f"h{i}", user="liquid", kind=JobKind.TRAINING, gpus=workers,
                       gpu_model="T4", cpus=2 * workers, memory_mib=8192 * workers,
                       model_type=model, batch=BATCH_PER_WORKER * workers, iterations=steps,
                       command=("python3", "train.py", "--model", model, "--batch-size",
                                str(BATCH_PER_WORKER), "--workers", str(workers), "--steps",
                                str(steps)))
        truth = measured(profiles[model], workers, config.nic_mbps)
        truth["gpu_mem_mib"] = MEMORY_MIB.get(model, 4000.0)

        def noisy(value: float) -> float:
            return value * math.exp(rng.gauss(0.0, config.noise))

        labels = {k: noisy(v) for k, v in truth.items()}
        labels["gpu_util"] = min(1.0, labels["gpu_util"])
        rows.append((features_of(spec), labels))
    return rows


class ModelAnnotator:
    """Predictions for replayed jobs as they arrive (an :class:`~sim.engine.Annotator`)."""

    def __init__(self, model: Model) -> None:
        self.model = model

    def submitted(self, job: Job, now: float) -> None:
        predicted = self.model.predict(features_of(job.spec))
        keys = {"gpu_util": GPU_UTIL, "net_mbps": NET, "gpu_mem_mib": GPU_MEM}
        job.annotations.update({keys[k]: max(0.0, v) for k, v in predicted.items()
                                if k in keys})

    def finished(self, job: Job, run_time: float) -> None:
        """The live feature re-trains periodically; a replay of minutes keeps one model."""


def train(profiles: Mapping[str, SyncProfile], config: History) -> tuple[Model, dict[str, Any]]:
    rows = history_rows(profiles, config)
    model = fit(rows, seed=config.seed)
    if model is None:
        raise ValueError("the replay's history trained no model")
    return model, {"runs": config.runs, "test_rows": model.test_rows,
                   "r2": {k: round(v, 4) for k, v in model.r2.items()}}
