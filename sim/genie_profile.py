"""GENIE's lightweight profiling (§5.1.5, §6) run against the simulated platform.

The replay's model database is not written by hand: before a study replays a seed, every
(model type, calculation type) is profiled on the simulated platform as ``trellisctl profile``
would profile it on a real one. The campaign is the live profiler's own
(``masterd.features.genie.profiler.plan_runs``: B single-GPU runs at different batch sizes,
then for training G runs ``<1, g>`` and N runs ``<n, 1>`` at one fixed global batch); each
run is placed by the master's placement code (``placement.realise`` on an idle cluster), runs
at the speed the simulator's ground truth gives that placement, with the truth's seeded
per-job noise and no neighbours (the paper profiles "when the GPU cluster has enough available
resources"); its throughput reports are reduced by the profiler's ``measured_rate`` and its
wall time gives ν; the coefficients come from the same ``fit.fit_profile``. Nothing here
fits anything itself.

:func:`prediction_errors` measures the database against the replay, as GENIE Fig. 15 does:
per replayed task, the latency the model predicts for the placement the task ran on against
the latency it really had (start to end), interference and noise included.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from masterd.core.cluster import ClusterState
from masterd.core.genie.fit import (
    FitError,
    LatencySample,
    PlacementSample,
    ThroughputSample,
    fit_profile,
)
from masterd.core.genie.model import latency
from masterd.core.genie.modeldb import ModelDB, ModelEntry
from masterd.core.placement import FreePool, realise
from masterd.features.genie.profiler import ProfileRequest, measured_rate, plan_runs
from shared.model import JobKind, JobSpec, NodeInventory, QosClass
from sim.engine import JobRecord
from sim.truth import NodeTopology, TruthModel, TruthParams, shape_of

KINDS: tuple[tuple[str, JobKind], ...] = (
    ("training", JobKind.TRAINING),
    ("inference", JobKind.INFERENCE),
)


class ProfilingError(ValueError):
    """The simulated platform cannot be profiled as asked."""


@dataclass(frozen=True)
class ProfileSetup:
    """How the simulated campaigns are run (the paper's §5.1.5 numbers where it gives any)."""

    iterations: int = 100  # "each experiment only needs approximately 100 iterations"
    report_interval_s: float = 1.0  # the metrics channel's default period (noded)
    max_nodes: int | None = None  # runs <n, 1> up to this (default: the live profiler's 4)
    cpus_per_gpu: int = 1


@dataclass(frozen=True)
class CampaignRecord:
    """One simulated campaign: what was profiled, its runs and the fit's own errors."""

    model_type: str
    kind: str
    batches: tuple[int, ...]
    global_batch: int | None
    runs: int
    single_gpu_error: float  # mean relative error of sPR against the B runs
    placement_error: float | None  # of PR against the N + G runs (training)


@dataclass
class PlatformProfile:
    db: ModelDB
    campaigns: list[CampaignRecord] = field(default_factory=list)


def profile_batches(largest: int) -> tuple[int, ...]:
    """B: powers of two from 1 up to the largest global batch tasks of the type use."""
    if largest < 4:
        raise ProfilingError(f"largest batch must be at least 4 to fit k0..k2, got {largest}")
    return tuple(2 ** i for i in range(int(math.log2(largest)) + 1))


def profile_platform(
    nodes: Sequence[NodeInventory],
    truth: TruthModel,
    model_batches: Mapping[str, int],
    setup: ProfileSetup | None = None,
) -> PlatformProfile:
    """Profile every model type of ``model_batches`` (type -> largest global batch its tasks
    use), training and inference, on the GPU model of ``nodes``."""
    setup = setup or ProfileSetup()
    models = {g.model for n in nodes for g in n.gpus}
    if len(models) != 1:
        raise ProfilingError(f"profile one GPU model at a time, the nodes have {sorted(models)}")
    gpu_model = models.pop()
    gpu_nodes = [n for n in nodes if n.gpus]
    max_nodes = min(setup.max_nodes or min(len(gpu_nodes), 4), len(gpu_nodes))
    max_gpn = max(len(n.gpus) for n in gpu_nodes)
    topology = NodeTopology.of(nodes)
    inventories = {n.name: n for n in nodes}
    profile = PlatformProfile(ModelDB(default_gpu_model=gpu_model))
    for model_type in sorted(model_batches):
        batches = profile_batches(model_batches[model_type])
        for kind_name, kind in KINDS:
            request = ProfileRequest(
                model_type=model_type, command=("trellis-sim-profile",), user="sim",
                gpu_model=gpu_model, kind=kind_name, batches=batches,
                global_batch=max(batches) if kind is JobKind.TRAINING else None,
                iterations=setup.iterations, max_nodes=max_nodes,
                cpus_per_gpu=setup.cpus_per_gpu,
            )
            single: list[ThroughputSample] = []
            placed: list[PlacementSample] = []
            timed: list[LatencySample] = []
            runs = plan_runs(request, max_nodes, max_gpn)
            for phase, d_node, d_gpn, batch in runs:
                rate, seconds = _run(nodes, inventories, truth, topology, request, phase,
                                     d_node, d_gpn, batch, setup)
                if phase == "batch":
                    single.append(ThroughputSample(batch, rate))
                else:
                    placed.append(PlacementSample(d_node, d_gpn, rate))
                timed.append(LatencySample(d_node, d_gpn, batch, setup.iterations, seconds))
            try:
                fit = fit_profile(single, placed, request.global_batch, timed,
                                  inference=kind is JobKind.INFERENCE)
            except FitError as exc:
                raise ProfilingError(f"profiling {model_type} ({kind_name}) on {gpu_model}: "
                                     f"{exc}") from None
            profile.db.put(ModelEntry(
                model_type=model_type, gpu_model=gpu_model, kind=kind_name,
                coefficients=fit.coefficients,
                source=f"trellis-sim lightweight profiling ({len(runs)} runs, seed "
                       f"{truth.seed})",
            ))
            profile.campaigns.append(CampaignRecord(
                model_type=model_type, kind=kind_name, batches=batches,
                global_batch=request.global_batch, runs=len(runs),
                single_gpu_error=fit.single_gpu.mean_relative,
                placement_error=fit.placements.mean_relative if fit.placements else None,
            ))
    return profile


def _run(
    nodes: Sequence[NodeInventory],
    inventories: Mapping[str, NodeInventory],
    truth: TruthModel,
    topology: NodeTopology,
    request: ProfileRequest,
    phase: str,
    d_node: int,
    d_gpn: int,
    batch: int,
    setup: ProfileSetup,
) -> tuple[float, float]:
    """One profiling run on an idle platform: (measured samples/s, wall seconds)."""
    kind = JobKind(request.kind)
    gpus = d_node * d_gpn
    spec = JobSpec(
        name=f"profile-{request.model_type}-{phase}", command=request.command,
        user=request.user, kind=kind, qos=QosClass.NORMAL, gpus=gpus,
        gpu_model=request.gpu_model, cpus=request.cpus_per_gpu * gpus,
        model_type=request.model_type, batch=batch, iterations=request.iterations,
        max_nodes=d_node,
    )
    state = ClusterState()
    for node in nodes:
        state.upsert_node(node)
    placement = realise(spec, FreePool(state.snapshot({})), d_node, d_gpn)
    if placement is None:
        raise ProfilingError(f"profiling run <{d_node}, {d_gpn}> does not fit the platform")
    key = f"profile/{request.model_type}/{request.kind}/{phase}/{d_node}x{d_gpn}/b{batch}"
    params = TruthParams(model_type=request.model_type, batch=batch,
                         iterations=request.iterations)
    job = truth.job_truth(key, kind, gpus, params, topology)
    speed = truth.speed(job, shape_of(placement, inventories))
    compute_s = job.work / speed
    # The run reports its throughput once per interval while it computes; the profiler drops
    # the first report as warm-up when there are three or more and takes the median.
    reports = [speed] * max(1, math.floor(compute_s / setup.report_interval_s))
    rate = measured_rate(reports)
    assert rate is not None
    return rate, job.startup_s + compute_s


# -- accuracy over a replay (GENIE Fig. 15) ------------------------------------------------------


@dataclass(frozen=True)
class TaskLatency:
    model_type: str
    kind: str
    predicted_s: float
    measured_s: float

    @property
    def relative_error(self) -> float:
        return abs(self.predicted_s - self.measured_s) / self.measured_s


def replayed_latencies(
    db: ModelDB, specs: Mapping[str, JobSpec], records: Iterable[JobRecord]
) -> list[TaskLatency]:
    """Predicted against measured latency of every task that ran once, start to end.

    Tasks preempted, retried or unfinished are left out (their latency is not one
    placement's), and so are placements that are not symmetric (no ``<d_node, d_gpn>``
    describes them).
    """
    out: list[TaskLatency] = []
    gpu_model = db.default_gpu_model or ""
    for r in records:
        if r.state != "finished" or r.attempts != 1 or r.preemptions or r.retries:
            continue
        spec = specs.get(r.id)
        if spec is None or spec.batch is None or spec.iterations is None:
            continue
        d_node = r.nodes_used
        if d_node < 1 or r.gpus_used % d_node or r.first_start is None or r.end is None:
            continue
        kind = "inference" if spec.kind is JobKind.INFERENCE else "training"
        resolved = db.resolve(spec.model_type, gpu_model, kind)
        if resolved is None:
            continue
        predicted = latency(resolved.coefficients, spec.batch, spec.iterations, d_node,
                            r.gpus_used // d_node, inference=kind == "inference")
        measured = r.end - r.first_start
        if predicted is None or measured <= 0:
            continue
        out.append(TaskLatency(spec.model_type or "", kind, predicted, measured))
    return out
