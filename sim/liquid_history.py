"""The resource model in the testbed replay: trained on the usage the testbed's earlier jobs
left, as the nodes metered it, predicting for the jobs replayed (the same
:mod:`masterd.features.liquid` code the master runs).

Liquid learns from earlier runs of the same routine jobs (§4.2; its own were pre-run "with
random computing resource requirement ... and random model parameters", §7.2). The replay
makes them: ``runs`` past jobs of the testbed's models with seeded worker counts and lengths,
arriving at random (mean ``arrival_s`` apart) on the testbed's cluster and placed by the
``random`` policy, run by the same ground truth as the study (computing, launching, the
parameter servers' traffic sharing NICs, at the study's calibration), and metered part by
part through noded's accumulators, the ``job_usage`` wire schema and the master's label code
(:mod:`sim.liquid_meter`, with measurement noise drawn apart from the truth). The forests are
fitted on those rows (:func:`masterd.features.liquid.forest.fit`, with Liquid's settings)
and the replayed jobs get the predictions as annotations, as the live feature attaches them.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from masterd.core.liquid.demand import GPU_MEM, GPU_UTIL, NET
from masterd.core.policies import make_policy
from masterd.features.liquid.forest import Model, fit
from masterd.features.liquid.jobfeatures import features_of
from shared.model import Job, JobKind, JobSpec
from sim.engine import SimConfig
from sim.liquid_meter import MeterConfig, MeteredSimulator, Row, UsageMeter
from sim.psnet import PsNetwork, SyncProfile
from sim.truth import TruthParams
from sim.workloads.base import SimJob, Workload
from sim.workloads.liquid import (
    BATCH_PER_WORKER,
    LiquidTestbed,
    build_testbed,
    testbed_truth,
)

LOCAL_MBPS = 10_000.0  # as the study: a worker beside its PS exchanges through the host


@dataclass(frozen=True)
class History:
    runs: int = 400
    arrival_s: float = 60.0  # mean gap between the past jobs' arrivals (Poisson)
    workers: tuple[int, ...] = (1, 2, 3, 4)
    steps: tuple[int, int] = (500, 3000)
    meter: MeterConfig = field(default_factory=MeterConfig)
    seed: int = 1


def history_workload(profiles: Mapping[str, SyncProfile], testbed: LiquidTestbed,
                     config: History) -> Workload:
    rng = random.Random(f"liquid-history/{config.seed}")
    models = sorted(profiles)
    jobs: list[SimJob] = []
    t = 0.0
    for i in range(config.runs):
        model = rng.choice(models)
        workers = rng.choice(config.workers)
        steps = rng.randint(*config.steps)
        t += rng.expovariate(1.0 / config.arrival_s)
        spec = JobSpec(name=f"h{i}", user="liquid", kind=JobKind.TRAINING, gpus=workers,
                       gpu_model="T4", cpus=2 * workers, memory_mib=8192 * workers,
                       model_type=model, batch=BATCH_PER_WORKER * workers, iterations=steps,
                       command=("python3", "train.py", "--model", model, "--batch-size",
                                str(BATCH_PER_WORKER), "--workers", str(workers), "--steps",
                                str(steps)))
        jobs.append(SimJob(id=f"h{i:04d}", spec=spec, submit=t, truth=TruthParams(
            model_type=model, batch=BATCH_PER_WORKER * workers, iterations=steps)))
    nodes = build_testbed(testbed).nodes
    workload = Workload(name="liquid-history", jobs=jobs, nodes=nodes, notes={})
    workload.sort()
    return workload


def history_rows(profiles: Mapping[str, SyncProfile], testbed: LiquidTestbed,
                 config: History) -> list[Row]:
    """The final usage reports of the past runs, as the master's training rows."""
    workload = history_workload(profiles, testbed, config)
    network = PsNetwork(testbed.nic_mbps / 8.0, LOCAL_MBPS, profiles)
    sim = MeteredSimulator(
        workload, make_policy("random", seed=config.seed),
        SimConfig(seed=config.seed, truth=testbed_truth(testbed.launch_s)),
        network=network, meter=UsageMeter(config.meter, config.seed))
    sim.run()
    return sim.rows


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


def train(profiles: Mapping[str, SyncProfile], testbed: LiquidTestbed,
          config: History) -> tuple[Model, dict[str, Any]]:
    rows = history_rows(profiles, testbed, config)
    model = fit(rows, seed=config.seed)
    if model is None:
        raise ValueError("the replay's history trained no model")
    return model, {"runs": config.runs, "rows": len(rows), "test_rows": model.test_rows,
                   "r2": {k: round(v, 4) for k, v in model.r2.items()},
                   "label_means": {k: round(v, 3) for k, v in model.mean.items()},
                   "meter": {"interval_s": config.meter.interval_s,
                             "util_noise_pct": config.meter.util_noise_pct,
                             "bytes_noise": config.meter.bytes_noise,
                             "memory_noise": config.meter.memory_noise},
                   "placed_by": "random", "arrival_s": config.arrival_s}
