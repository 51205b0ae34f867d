"""GENIE's lightweight profiler in the live master (seeds/genie.md §5.1.5, §6).

A *campaign* profiles one model type on one GPU model with B + N + G real jobs:

* B runs on one GPU at different global batch sizes (``batches``) give k0..k2 (Eq. 7);
* for training, G runs ``<1, g>`` (g = 2..``max_gpus_per_node``) and N runs ``<n, 1>``
  (n = 2..``max_nodes``) at one fixed ``global_batch`` give γ and λ (Eq. 8): a run across
  nodes measures γ, a run inside one node γ·λ;
* every run's wall time gives the start-up overhead ν (Eq. 4).

Each run is an ordinary job (journalled, visible in ``trellisctl jobs``, cancellable) whose
command has ``{batch}``, ``{iterations}``, ``{d_node}`` and ``{d_gpn}`` replaced, and whose
environment carries ``TRELLIS_BATCH`` and ``TRELLIS_ITERATIONS``. The scheduler starts runs
only on resources no waiting job can use (``masterd.core.profiling``). A run reports its
throughput on the metrics channel (``samples_per_sec``, noded/metrics_channel.py); its rate
is the median of rank 0's reports, the first one dropped as warm-up when there are three or
more. When every run has ended the coefficients are fitted (``fit.fit_profile``), stored in
the model database with the fit errors, and the policies use them from the next pass.

A run that fails, is cancelled or reports nothing is left out of the fit; the campaign fails
(with the fitting error naming what is missing) only if too few runs are left. Campaigns are
kept in the journal's ``genie_profiles`` table; rates are written when each run ends, so a
master restart loses only the reports of runs still going (those runs count as failed).
"""

from __future__ import annotations

import contextlib
import logging
import statistics
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from masterd.core.genie.fit import (
    FitError,
    FitResult,
    LatencySample,
    PlacementSample,
    ThroughputSample,
    fit_profile,
)
from masterd.core.genie.modeldb import ModelDBError, ModelEntry, normalise
from masterd.core.scheduler import JobError, Transition
from masterd.features.genie.models import ModelStore
from masterd.journal.profiles import create_tables, read_campaigns, write_campaign
from masterd.runtime.context import FeatureContext
from shared.messages import JobMetric
from shared.model import Job, JobKind, JobSpec, JobState, QosClass

log = logging.getLogger("trellis.master.profiler")

RATE_METRIC = "samples_per_sec"
MAX_REPORTS = 10_000  # per run, in memory


@dataclass
class ProfileRun:
    job_id: str
    phase: str  # "batch" (one GPU, varying batch) | "gpus" (<1, g>) | "nodes" (<n, 1>)
    d_node: int
    d_gpn: int
    batch: int
    state: str = "pending"  # pending | done | failed
    rate: float | None = None
    seconds: float | None = None
    reports: int = 0
    reason: str = ""


@dataclass
class Campaign:
    id: str
    model_type: str
    gpu_model: str
    kind: str
    family: str | None
    params_m: float | None
    batches: list[int]
    global_batch: int | None
    iterations: int
    command: list[str]
    user: str
    tenant: str
    created: float
    runs: list[ProfileRun] = field(default_factory=list)
    state: str = "running"  # running | fitted | failed
    finished: float | None = None
    error: str = ""
    fit: dict[str, Any] | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Campaign:
        fields = dict(data)
        fields["runs"] = [ProfileRun(**r) for r in fields.get("runs", [])]
        return cls(**fields)


@dataclass(frozen=True)
class ProfileRequest:
    model_type: str
    command: tuple[str, ...]
    user: str
    gpu_model: str | None = None
    kind: str = "training"
    batches: tuple[int, ...] = (8, 16, 32, 64)
    global_batch: int | None = None
    iterations: int = 100
    max_nodes: int | None = None
    max_gpus_per_node: int | None = None
    cpus_per_gpu: int = 1
    memory_mib: int = 0
    tenant: str = "default"
    family: str | None = None
    params_m: float | None = None
    env: Mapping[str, str] = field(default_factory=dict)


def substitute(command: tuple[str, ...], run: ProfileRun, iterations: int) -> tuple[str, ...]:
    values = {"{batch}": run.batch, "{iterations}": iterations, "{d_node}": run.d_node,
              "{d_gpn}": run.d_gpn}
    out = []
    for arg in command:
        for key, value in values.items():
            arg = arg.replace(key, str(value))
        out.append(arg)
    return tuple(out)


def measured_rate(reports: list[float]) -> float | None:
    if not reports:
        return None
    usable = reports[1:] if len(reports) >= 3 else reports
    return float(statistics.median(usable))


def plan_runs(req: ProfileRequest, max_nodes: int, max_gpn: int) -> list[tuple[str, int, int, int]]:
    """(phase, d_node, d_gpn, batch) of every run of a campaign."""
    runs = [("batch", 1, 1, b) for b in sorted(set(req.batches))]
    if req.kind == "training":
        assert req.global_batch is not None
        runs += [("gpus", 1, g, req.global_batch) for g in range(2, max_gpn + 1)]
        runs += [("nodes", n, 1, req.global_batch) for n in range(2, max_nodes + 1)]
    return runs


class Profiler:
    def __init__(self, ctx: FeatureContext, models: ModelStore) -> None:
        self.ctx = ctx
        self.models = models
        self.clock = ctx.clock
        ctx.journal.now(create_tables)
        self.campaigns: dict[str, Campaign] = {}
        for data in ctx.journal.now(read_campaigns):
            try:
                campaign = Campaign.from_dict(data)
            except (TypeError, KeyError) as exc:
                log.error("profile campaign %s in the journal is unusable: %s",
                          data.get("id"), exc)
                continue
            self.campaigns[campaign.id] = campaign
        # job id -> (campaign, run) for runs still pending: what the scheduler treats as
        # profiling runs and where metrics go.
        self._runs: dict[str, tuple[Campaign, ProfileRun]] = {}
        for campaign in self.campaigns.values():
            for run in campaign.runs:
                if run.state == "pending":
                    self._runs[run.job_id] = (campaign, run)
        self._reports: dict[str, list[float]] = {}
        ctx.events.restored.subscribe(self.restore)
        ctx.events.job_metric.subscribe(self.on_metric)
        ctx.events.job_transition.subscribe(self.on_transition)

    # -- what the scheduler asks -------------------------------------------------------------
    def is_run(self, job_id: str) -> bool:
        return job_id in self._runs

    def any_runs(self) -> bool:
        return bool(self._runs)

    # -- starting a campaign ---------------------------------------------------------------------
    def _platform(self, gpu_model: str | None) -> tuple[str, int, int, int]:
        """(GPU model, nodes of that model, most GPUs on one such node, fewest cores)."""
        models: dict[str, list[int]] = {}
        cores: dict[str, int] = {}
        for view in self.ctx.core.nodes():
            inv = view.inventory
            if inv.gpus:
                model = inv.gpus[0].model
                models.setdefault(model, []).append(len(inv.gpus))
                cores[model] = min(cores.get(model, len(inv.cpus)), len(inv.cpus))
        if not models:
            raise JobError("unsatisfiable", "no GPU node is registered: nothing to profile on")
        if gpu_model is None:
            if len(models) > 1:
                raise JobError(
                    "invalid_params",
                    f"the cluster has several GPU models ({', '.join(sorted(models))}): "
                    "say which one to profile with gpu_model",
                )
            gpu_model = next(iter(models))
        if gpu_model not in models:
            raise JobError(
                "unsatisfiable",
                f"no node with GPU model {gpu_model!r} is registered "
                f"(known: {', '.join(sorted(models))})",
            )
        return gpu_model, len(models[gpu_model]), max(models[gpu_model]), cores[gpu_model]

    def _next_id(self) -> str:
        numbers = [int(c.id.rsplit("-", 1)[1]) for c in self.campaigns.values()
                   if c.id.rsplit("-", 1)[-1].isdigit()]
        return f"profile-{max(numbers, default=0) + 1}"

    def check(self, req: ProfileRequest) -> tuple[ProfileRequest, int, int, int]:
        """Validate a request against the cluster; fill in defaults. Returns the request, the
        most nodes and GPUs per node its runs use, and the fewest cores such a node has."""
        if not normalise(req.model_type):
            raise JobError("invalid_params", "model_type must contain a letter or digit")
        if req.kind not in ("training", "inference"):
            raise JobError("invalid_params",
                           f"kind must be training or inference, got {req.kind!r}")
        if not req.command:
            raise JobError("invalid_params", "command must not be empty")
        if len(set(req.batches)) < 3:
            raise JobError("invalid_params",
                           f"batches: need 3 or more distinct batch sizes to fit k0..k2, got "
                           f"{sorted(set(req.batches))}")
        gpu_model, nodes, gpn, cores = self._platform(req.gpu_model)
        max_nodes = min(req.max_nodes or min(nodes, 4), nodes)
        max_gpn = min(req.max_gpus_per_node or gpn, gpn)
        global_batch = req.global_batch
        if req.kind == "training":
            if max_nodes < 2:
                raise JobError(
                    "unsatisfiable",
                    f"fitting γ needs runs across 2 or more nodes of {gpu_model}; "
                    f"{'the cluster has' if nodes < 2 else 'max_nodes allows'} {max_nodes}",
                )
            if max_gpn < 2:
                raise JobError(
                    "unsatisfiable",
                    f"fitting λ needs runs on 2 or more GPUs of one {gpu_model} node; "
                    f"{'its nodes have' if gpn < 2 else 'max_gpus_per_node allows'} {max_gpn}",
                )
            global_batch = global_batch or max(req.batches)
            widest = max(max_nodes, max_gpn)
            if global_batch < widest:
                raise JobError(
                    "invalid_params",
                    f"global_batch {global_batch} leaves a GPU without samples on "
                    f"{widest} GPUs; use at least {widest}",
                )
        else:
            global_batch = None
        return (replace(req, gpu_model=gpu_model, global_batch=global_batch),
                max_nodes, max_gpn, cores)

    async def start(self, request: ProfileRequest) -> Campaign:
        req, max_nodes, max_gpn, cores = self.check(request)
        assert req.gpu_model is not None
        gpu_model = req.gpu_model
        self.ctx.jobs.check_user(req.user)
        now = self.clock()
        campaign = Campaign(
            id=self._next_id(), model_type=req.model_type, gpu_model=gpu_model, kind=req.kind,
            family=req.family, params_m=req.params_m, batches=sorted(set(req.batches)),
            global_batch=req.global_batch, iterations=req.iterations,
            command=list(req.command), user=req.user, tenant=req.tenant, created=now,
        )
        for i, (phase, d_node, d_gpn, batch) in enumerate(plan_runs(req, max_nodes, max_gpn)):
            campaign.runs.append(ProfileRun(f"{campaign.id}-r{i}", phase, d_node, d_gpn, batch))
        for run in campaign.runs:
            if run.job_id in self.ctx.core.jobs:
                raise JobError("duplicate_job", f"job id {run.job_id!r} is taken")
        specs = [(run, self._spec(req, campaign, run, cores)) for run in campaign.runs]
        self.campaigns[campaign.id] = campaign
        for run in campaign.runs:
            self._runs[run.job_id] = (campaign, run)
        await self._save(campaign, "profile_started", {
            "model_type": campaign.model_type, "gpu_model": gpu_model,
            "runs": len(campaign.runs)})
        submitted: list[str] = []
        current = ""
        try:
            for run, spec in specs:
                current = run.job_id
                await self.ctx.jobs.submit(spec, run.job_id)
                submitted.append(run.job_id)
        except JobError as exc:
            for run in campaign.runs:
                self._runs.pop(run.job_id, None)
                if run.state == "pending":
                    run.state, run.reason = "failed", "campaign aborted"
            for job_id in submitted:
                with contextlib.suppress(JobError):
                    await self.ctx.jobs.cancel(job_id)
            campaign.state, campaign.error = "failed", f"submitting {current}: {exc}"
            campaign.finished = self.clock()
            await self._save(campaign, "profile_failed", {"error": campaign.error})
            raise
        log.info("profile=%s started model_type=%s gpu_model=%s runs=%d", campaign.id,
                 campaign.model_type, gpu_model, len(campaign.runs))
        return campaign

    def _spec(self, req: ProfileRequest, campaign: Campaign, run: ProfileRun,
              cores: int) -> JobSpec:
        gpus = run.d_node * run.d_gpn
        # Cores per node are capped at what the smallest such node has: asking for more would
        # keep the run waiting forever, and it is its GPUs that are measured.
        per_node = min(cores, req.cpus_per_gpu * run.d_gpn)
        env = dict(req.env)
        env.update({
            "TRELLIS_PROFILE": campaign.id,
            "TRELLIS_BATCH": str(run.batch),
            "TRELLIS_ITERATIONS": str(req.iterations),
        })
        try:
            return JobSpec(
                name=f"{campaign.id}-{run.phase}",
                command=substitute(req.command, run, req.iterations),
                user=req.user,
                kind=JobKind(req.kind),
                tenant=req.tenant,
                qos=QosClass.NORMAL,
                gpus=gpus,
                gpu_model=campaign.gpu_model,
                cpus=per_node * run.d_node,
                memory_mib=req.memory_mib,
                env=env,
                model_type=req.model_type,
                model_family=req.family,
                model_params_m=req.params_m,
                batch=run.batch,
                iterations=req.iterations,
                max_nodes=run.d_node,
            )
        except ValueError as exc:
            raise JobError("invalid_params", f"profiling run {run.job_id}: {exc}") from None

    # -- what runs report ------------------------------------------------------------------
    def on_metric(self, node: str, job: Job, metric: JobMetric) -> None:
        hit = self._runs.get(job.id)
        if hit is None or metric.name != RATE_METRIC:
            return
        if job.placement is None or job.placement.allocations[0].node != node:
            return  # rank 0's node speaks for the job
        reports = self._reports.setdefault(job.id, [])
        if len(reports) < MAX_REPORTS:
            reports.append(metric.value)

    async def on_transition(self, job: Job, transition: Transition) -> None:
        hit = self._runs.get(job.id)
        if hit is None:
            return
        campaign, run = hit
        if transition.state is JobState.QUEUED:
            self._reports.pop(job.id, None)  # preempted or refused: it starts over
            return
        if not transition.state.terminal:
            return
        reports = self._reports.pop(job.id, [])
        del self._runs[job.id]
        run.reports = len(reports)
        if job.start_time is not None and job.end_time is not None:
            run.seconds = max(0.0, job.end_time - job.start_time)
        if transition.state is JobState.FINISHED:
            run.rate = measured_rate(reports)
            if run.rate is None or run.rate <= 0:
                run.state = "failed"
                run.reason = (f"reported no {RATE_METRIC} on its metrics channel "
                              "(TRELLIS_METRICS_FILE)")
            else:
                run.state = "done"
        else:
            run.state = "failed"
            run.reason = f"{transition.state.value}: {transition.reason or job.reason}"
        log.info("profile=%s run=%s state=%s rate=%s reports=%d", campaign.id, run.job_id,
                 run.state, f"{run.rate:.2f}" if run.rate else "-", run.reports)
        if any(r.state == "pending" for r in campaign.runs):
            await self._save(campaign, None, None)
            return
        await self._finish(campaign)

    def restore(self) -> None:
        """After the master restored its jobs: settle runs that ended while it was down."""
        for job_id, (_campaign, run) in list(self._runs.items()):
            job = self.ctx.core.job(job_id)
            if job is not None and not job.state.terminal:
                continue
            del self._runs[job_id]
            run.state = "failed"
            run.reason = ("its job is gone" if job is None else
                          "ended while the master was down; its reports were lost")
        for campaign in self.campaigns.values():
            if campaign.state == "running" and not any(
                r.state == "pending" for r in campaign.runs
            ):
                self.ctx.tasks.spawn(self._finish(campaign))

    # -- fitting ---------------------------------------------------------------------------
    async def _finish(self, campaign: Campaign) -> None:
        campaign.finished = self.clock()
        try:
            result = self._fit(campaign)
        except FitError as exc:
            campaign.state, campaign.error = "failed", str(exc)
            failed = [f"{r.job_id}: {r.reason}" for r in campaign.runs if r.state == "failed"]
            if failed:
                campaign.error += "; failed runs: " + "; ".join(failed[:5])
            log.warning("profile=%s failed: %s", campaign.id, campaign.error)
            await self._save(campaign, "profile_failed", {"error": campaign.error})
            return
        c = result.coefficients
        campaign.fit = {
            "k0": c.k0, "k1": c.k1, "k2": c.k2, "gamma": c.gamma, "lam": c.lam, "nu": c.nu,
            "single_gpu_rmse": result.single_gpu.rmse,
            "single_gpu_error": result.single_gpu.mean_relative,
            "placement_rmse": result.placements.rmse if result.placements else None,
            "placement_error": result.placements.mean_relative if result.placements else None,
            "startup_rmse": result.startup_rmse,
        }
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(campaign.finished))
        error = campaign.fit["single_gpu_error"]
        if campaign.fit["placement_error"] is not None:
            error = max(error, campaign.fit["placement_error"])
        try:
            entry = ModelEntry(
                model_type=campaign.model_type, gpu_model=campaign.gpu_model,
                kind=campaign.kind, coefficients=c, family=campaign.family,
                params_m=campaign.params_m,
                source=f"profiled by {campaign.id} at {stamp} UTC "
                       f"(fit error {100 * error:.1f}%)",
            )
        except ModelDBError as exc:
            campaign.state, campaign.error = "failed", f"cannot store the fit: {exc}"
            await self._save(campaign, "profile_failed", {"error": campaign.error})
            return
        campaign.state = "fitted"
        await self._save(campaign, "profile_fitted", {
            "model_type": campaign.model_type, "gpu_model": campaign.gpu_model,
            **campaign.fit})
        await self.models.put([entry], f"profile {campaign.id}")
        log.info("profile=%s fitted model_type=%s k=(%.4g, %.4g, %.4g) gamma=%.3f lam=%.3f "
                 "nu=%.3f error=%.2f%%", campaign.id, campaign.model_type, c.k0, c.k1, c.k2,
                 c.gamma, c.lam, c.nu, 100 * error)
        self.ctx.request_pass()

    @staticmethod
    def _fit(campaign: Campaign) -> FitResult:
        done = [r for r in campaign.runs if r.state == "done" and r.rate]
        single = [ThroughputSample(r.batch, r.rate) for r in done  # type: ignore[arg-type]
                  if r.phase == "batch"]
        placements = [PlacementSample(r.d_node, r.d_gpn, r.rate)  # type: ignore[arg-type]
                      for r in done if r.phase != "batch"]
        timed = [LatencySample(r.d_node, r.d_gpn, r.batch, campaign.iterations, r.seconds)
                 for r in done if r.seconds]
        return fit_profile(single, placements, campaign.global_batch, timed,
                           inference=campaign.kind == "inference")

    # -- persistence and views -------------------------------------------------------------
    async def _save(self, campaign: Campaign, kind: str | None,
                    detail: dict[str, Any] | None) -> None:
        event = None
        if kind is not None:
            event = (self.clock(), None, None, kind, {"profile": campaign.id, **(detail or {})})
        await self.ctx.journal.call(write_campaign, asdict(campaign), event)

    def view(self, campaign: Campaign) -> dict[str, Any]:
        data = asdict(campaign)
        data["runs_done"] = sum(1 for r in campaign.runs if r.state == "done")
        data["runs_failed"] = sum(1 for r in campaign.runs if r.state == "failed")
        data["runs_pending"] = sum(1 for r in campaign.runs if r.state == "pending")
        return data

    def get(self, campaign_id: str) -> Campaign:
        campaign = self.campaigns.get(campaign_id)
        if campaign is None:
            raise JobError("unknown_profile", f"profile campaign {campaign_id!r} does not exist")
        return campaign
