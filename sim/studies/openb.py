"""Study 3: SODA (§VI) on two workloads, with SODA's four mechanisms through the live code.

KELP-FIFO and KELP-DRF (FIFO and DRF with the contention eliminator partitioning memory
bandwidth, as the paper's baselines ran on KELP), SODA's arrays alone and SODA complete
(arrays + adaptive CPU allocator + inference placer + contention eliminator, sim/soda.py),
then SODA with each mechanism off in turn (SODA Figs. 12–15), on two workloads:

* ``soda_paper``: a cluster and job stream drawn from SODA's own published distributions
  (sim/workloads/soda_paper.py, fixed before any result was looked at);
* ``openb``: Alibaba's openb pods, compressed onto a subset of its nodes so that queues form.

Every replay runs on :class:`sim.soda.SodaSimulator`, so the ground truth of CPU cores, memory
bandwidth and query load (sim/soda_truth.py) acts on the baselines as well. GPU utilisation is
reported the paper's way (§III-A: the busy share of the GPUs in use) beside the active share
and the busy share of all GPUs. The inference placer is also replayed on a third, independent
workload: Alibaba's disaggregated DLRM inference instances (sim/soda_dlrm.py).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from masterd.core.arrays import ArrayConfig, DemandRecord, resize
from masterd.core.policies import make_policy, soda_arrays
from masterd.core.policy import Policy
from sim.engine import SimConfig, SimResult
from sim.metrics import time_weighted
from sim.progress import ProgressBar
from sim.soda import Mechanisms, SodaConfig, SodaSimulator, SodaStats
from sim.soda_dlrm import DlrmReplay, replay_dlrm
from sim.soda_truth import SodaTruthConfig
from sim.studies.common import (
    ReportError,
    Section,
    Study,
    finished,
    plot_cdf,
    pyplot,
    queue_stats,
    save_figure,
)
from sim.tables import Table, fmt
from sim.truth import TruthConfig, TruthModel
from sim.workloads import openb, soda_paper
from sim.workloads.base import LoadOptions, SimJob, Workload

# The paper's own figures, quoted next to ours (never computed here).
SODA_PAPER = {
    "source": "SODA §VI-B, §VI-C and §VI-G (seeds/soda.md); their FIFO and DRF run on KELP",
    "gpu_util_pct": {"fifo": 45.5, "drf": 45.1, "soda_full": 65.4},
    "gpu_active_pct": {"fifo": 90.2, "drf": 89.7, "soda_full": 76.3},
    "gpu_jobs_queued_over_1min_pct": {"fifo": 57.5, "drf": 49.5},
    "gpu_jobs_not_queued_pct": {"soda_full": 88.2},
    "cpu_jobs_within_10s_pct": {"fifo": 90.5, "drf": 90.6},
    "cpu_jobs_within_1min_pct": {"soda_full": 91.3},
    # §VI-G: without the contention eliminator GPU utilisation is 2.2 points lower.
    "no_eliminator_gpu_util_drop_points": 2.2,
    # §VI-D: 57.1% of GPU jobs got 1–5 more cores than asked, 33.6% 1–20 fewer.
    "parts_more_cores_pct": {"soda_full": 57.1},
    "parts_fewer_cores_pct": {"soda_full": 33.6},
}
# SODA §III-A measures utilisation over the GPUs in use: its GPU utilisation figures above
# (45.5 / 45.1 / 65.4) are busy shares of active GPUs, its active rates the share in use.


ALL_MECHANISMS = Mechanisms()


@dataclass(frozen=True)
class Variant:
    title: str
    policy: str  # fifo | drf | arrays
    mechanisms: Mechanisms
    migration: bool  # a preempted job keeps its progress (SODA migrates, §V-C)
    # When an array lends (ArrayConfig.lending): SODA's rule is "free" (§V-C: a small job
    # takes resources of the large-job array when its own is used up; migrated when large
    # jobs need them back).
    lending: str = "free"
    # The allocator may give more cores than asked (masterd.core.widen; §V-B, §VI-D); False:
    # a job's request is its ceiling (the allocator only takes cores away).
    widen: bool = True


# KELP (Zhu et al., HPCA 2019) partitions memory bandwidth between accelerated ML tasks and
# low-priority CPU tasks, throttling the CPU tasks when the ML tasks' bandwidth suffers; the
# paper's baselines are "KELP-FIFO" and "KELP-DRF" (§VI-A). Here that partitioning is noded's
# contention eliminator (MBA levels, then halving cores), the same code SODA full runs.
KELP = Mechanisms(allocator=False, placer=False, eliminator=True)

VARIANTS: dict[str, Variant] = {
    "fifo": Variant("KELP-FIFO", "fifo", KELP, False),
    "drf": Variant("KELP-DRF", "drf", KELP, False),
    "soda_arrays": Variant("SODA arrays (+ KELP partitioning)", "arrays", KELP, True),
    "soda_full": Variant("SODA full", "arrays", ALL_MECHANISMS, True),
    "no_allocator": Variant("SODA without the CPU allocator", "arrays",
                            replace(ALL_MECHANISMS, allocator=False), True),
    "no_placer": Variant("SODA without the inference placer", "arrays",
                         replace(ALL_MECHANISMS, placer=False), True),
    "no_eliminator": Variant("SODA without the contention eliminator", "arrays",
                             replace(ALL_MECHANISMS, eliminator=False), True),
    "no_arrays": Variant("SODA without the arrays (DRF)", "drf", ALL_MECHANISMS, True),
    "idle_lending": Variant("SODA full, arrays lend only while none of their jobs waits",
                            "arrays", ALL_MECHANISMS, True, lending="idle"),
    "no_widening": Variant("SODA full, a job's request its ceiling (cores only taken away)",
                           "arrays", ALL_MECHANISMS, True, widen=False),
    "plain_fifo": Variant("FIFO without KELP", "fifo", Mechanisms.none(), False),
}
MAIN = ("fifo", "drf", "soda_arrays", "soda_full")
ABLATION = ("no_allocator", "no_placer", "no_eliminator", "no_arrays", "idle_lending",
            "no_widening", "plain_fifo")
WORKLOADS = ("soda_paper", "openb")


@dataclass(frozen=True)
class OpenbStudy:
    # Pods created from this trace day on (most arrive in the last weeks); together with the
    # compression and the node subset this loads the GPUs so that queues form.
    since_day: float = 145.0
    arrival_scale: float = 20.0
    node_stride: int = 40
    variants: tuple[str, ...] = MAIN + ABLATION
    seed: int = 1
    limit: int | None = None
    # SODA's arrays are sized by resize() from the pods that ended in this many days before
    # the window (the policy's own history_days default).
    history_days: float = 7.0
    # Periodic passes (eliminator, placer, load) stop this long after the last arrival:
    # every figure is taken over the arrival window.
    tick_margin_s: float = 6 * 3600.0
    dlrm: bool = True
    dlrm_apps: int | None = None  # the DLRM replay's first N apps (None: all)
    # Which workloads to replay (of WORKLOADS) and the soda_paper generator's scale.
    workloads: tuple[str, ...] = WORKLOADS
    soda_paper_nodes: int = soda_paper.SodaPaperConfig.nodes
    soda_paper_days: float = soda_paper.SodaPaperConfig.days


def tiny() -> OpenbStudy:
    return replace(OpenbStudy(), since_day=0.0, arrival_scale=1.0, node_stride=1, dlrm=False,
                   soda_paper_nodes=2, soda_paper_days=0.25)


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--openb-arrival-scale", type=float)
    parser.add_argument("--openb-node-stride", type=int)
    parser.add_argument("--openb-since-day", type=float)
    parser.add_argument("--openb-variants",
                        help=f"comma-separated, of {', '.join(VARIANTS)}")


def apply_options(study: OpenbStudy, args: argparse.Namespace) -> OpenbStudy:
    for attr, value in (("arrival_scale", args.openb_arrival_scale),
                        ("node_stride", args.openb_node_stride),
                        ("since_day", args.openb_since_day)):
        if value is not None:
            study = replace(study, **{attr: value})
    if getattr(args, "openb_variants", None):
        names = tuple(v.strip() for v in args.openb_variants.split(",") if v.strip())
        unknown = [n for n in names if n not in VARIANTS]
        if unknown or not names:
            raise ReportError(f"--openb-variants: unknown {', '.join(unknown) or '(none)'}; "
                              f"known: {', '.join(VARIANTS)}")
        study = replace(study, variants=names)
    return study


# -- setup ----------------------------------------------------------------------------------


@dataclass
class Setup:
    workload: Workload
    services: frozenset[str]
    gpu_share: dict[str, float]
    arrays: ArrayConfig
    history_records: int
    window: tuple[float, float]
    # The allocator's per-GPU ceiling: a GPU's share of its node's cores, rounded up (the
    # most common GPU node shape of the workload).
    max_cores_per_gpu: int = 0
    name: str = "openb"
    text: str = ""  # the workload's own setup paragraph (soda_paper)


def cores_per_gpu(workload: Workload) -> int:
    shapes = [-(-len(n.cpus) // len(n.gpus)) for n in workload.nodes if n.gpus]
    return max(set(shapes), key=shapes.count) if shapes else 0


def _arrays(records: list[DemandRecord], since: float, history_days: float) -> ArrayConfig:
    base = ArrayConfig.from_table({
        "inner": {"small": "drf", "large": "drf", "cpu": "drf"},  # DRF in every array (§V-C)
        "gpu_jobs_borrow_cpu_cores": True,  # idle CPU-array cores lent to GPU jobs (§V-C)
        "history_days": history_days,
    })
    return resize(base, records, since)


def setup_soda_paper(study: OpenbStudy) -> Setup:
    """The soda_paper workload; its arrays sized from an earlier window of the same
    distributions (another seed), as §V-C sizes them from history."""
    truth = TruthModel(TruthConfig(), study.seed)
    cfg = soda_paper.SodaPaperConfig(nodes=study.soda_paper_nodes,
                                     days=study.soda_paper_days, seed=study.seed)
    workload = soda_paper.generate(cfg, truth)
    earlier = soda_paper.generate(replace(cfg, seed=study.seed + 1000), truth)
    since = cfg.days * 86_400.0
    records = history(earlier.jobs, since, study.history_days)
    jobs = workload.jobs
    window = (0.0, cfg.days * 86_400.0) if jobs else (0.0, 0.0)
    return Setup(workload, soda_paper.services_of(workload), {},
                 _arrays(records, since, study.history_days), len(records), window,
                 cores_per_gpu(workload), "soda_paper", soda_paper.describe(cfg, workload))


def history(jobs: list[SimJob], since: float, days: float) -> list[DemandRecord]:
    """What the pods that ended in the ``days`` before ``since`` (trace seconds) consumed."""
    out = []
    for job in jobs:
        runtime = job.truth.known_duration or 0.0
        end = job.submit + runtime
        if since - days * 86_400.0 <= end <= since:
            out.append(DemandRecord(end, job.spec.array_kind, job.spec.gpu_model,
                                    job.spec.gpus * runtime, job.spec.cpus * runtime))
    return out


def setup(study: OpenbStudy, trace_dir: Path) -> Setup:
    truth = TruthModel(TruthConfig(), study.seed)
    options = LoadOptions(seed=study.seed, limit=study.limit)
    since = study.since_day * 86_400.0
    workload = openb.load(trace_dir, options, truth, arrival_scale=study.arrival_scale,
                          node_stride=study.node_stride, since=since)
    # Every pod of the trace on the unscaled clock, for the arrays' history.
    everything = openb.load(trace_dir, options, truth)
    records = history(everything.jobs, since, study.history_days)
    arrays = _arrays(records, since, study.history_days)
    min_runtime = SodaTruthConfig().service_min_runtime_s
    services = frozenset(
        j.id for j in workload.jobs
        if j.spec.kind.value == "inference" and (j.truth.known_duration or 0.0) >= min_runtime
    )
    jobs = workload.jobs
    window = (jobs[0].submit, jobs[-1].submit) if jobs else (0.0, 0.0)
    return Setup(workload, services, openb.gpu_shares(trace_dir, options), arrays,
                 len(records), window, cores_per_gpu(workload))


def setup_for(name: str, study: OpenbStudy, trace_dir: Path) -> Setup:
    if name == "soda_paper":
        return setup_soda_paper(study)
    if name == "openb":
        return setup(study, trace_dir)
    raise ReportError(f"unknown SODA workload {name!r}; known: {', '.join(WORKLOADS)}")


def make(variant: Variant, s: Setup) -> Policy:
    if variant.policy == "arrays":
        return soda_arrays(replace(s.arrays, lending=variant.lending))
    return make_policy(variant.policy)


def run_variant(study: OpenbStudy, s: Setup, name: str, show: bool,
                ) -> tuple[SimResult, SodaStats, float]:
    variant = VARIANTS[name]
    config = SimConfig(seed=study.seed, preempt_keeps_progress=variant.migration)
    soda = SodaConfig(mechanisms=variant.mechanisms, services=s.services,
                      gpu_share=s.gpu_share, tick_until=s.window[1] + study.tick_margin_s,
                      max_cores_per_gpu=s.max_cores_per_gpu if variant.widen else 0)
    bar = ProgressBar(f"{s.name} {name}") if show else None
    started = time.monotonic()
    sim = SodaSimulator(s.workload, make(variant, s), config, soda, bar)
    result = sim.run()
    if bar is not None:
        bar.close(result.end_time, sum(r.state != "unfinished" for r in result.records),
                  len(result.records))
    return result, sim.stats, time.monotonic() - started


def _busy_of_active(result: SimResult, start: float, end: float) -> float | None:
    """SODA §III-A's GPU utilisation: busy GPU-time over active (allocated) GPU-time."""
    active = time_weighted([(t, a) for t, a, _ in result.usage], start, end)
    busy = time_weighted([(t, e) for t, _, e in result.usage], start, end)
    if active is None or busy is None or active <= 0:
        return None
    return 100.0 * busy / active


def _window_rate(result: SimResult, start: float, end: float, effective: bool) -> float | None:
    if not result.total_gpus:
        return None
    series = [(t, e if effective else a) for t, a, e in result.usage]
    value = time_weighted(series, start, end)
    return None if value is None else 100.0 * value / result.total_gpus


def summarise(result: SimResult, stats: SodaStats, s: Setup, variant: Variant,
              wall: float) -> dict[str, Any]:
    gpu = queue_stats([r for r in finished(result, gpu=True) if r.id not in s.services])
    cpu = queue_stats(finished(result, gpu=False))
    preemptions = sum(r.preemptions for r in result.records)
    changes = stats.core_changes
    waits = sum(stats.wait_reasons.values())
    training_s = sum(r.run_time for r in result.records
                     if r.kind.value == "training" and r.gpus)
    return {
        "jobs": sum(r.state != "service" for r in result.records),
        "rejected": sum(r.state == "rejected" for r in result.records),
        "unfinished": sum(r.state == "unfinished" for r in result.records),
        "gpu_active_pct": _window_rate(result, *s.window, effective=False),
        "gpu_util_pct": _window_rate(result, *s.window, effective=True),
        "gpu_busy_of_active_pct": _busy_of_active(result, *s.window),
        "gpu_jobs": gpu,
        "cpu_jobs": cpu,
        # A preempted job keeps its progress under SODA (migration), restarts otherwise.
        "migrations": preemptions if variant.migration else 0,
        "restarts": 0 if variant.migration else preemptions,
        "tuned_parts": stats.tuned_parts,
        "tuning_windows": stats.tuning_windows,
        "cores_returned": stats.cores_returned,
        "parts_fewer_cores_pct": 100.0 * sum(c < 0 for c in changes) / len(changes)
        if changes else None,
        "parts_more_cores_pct": 100.0 * sum(c > 0 for c in changes) / len(changes)
        if changes else None,
        "cores_widened": stats.cores_widened,
        "throttle_actions": stats.throttle_actions,
        "replica_launches": stats.replica_launches,
        "replica_retires": stats.replica_retires,
        "placer_preemptions": stats.placer_preemptions,
        "replicas_lost": stats.replicas_lost,
        "waits": {k: (100.0 * v / waits if waits else None)
                  for k, v in stats.wait_reasons.items()},
        # Tuned parts' windows against the run time of the training jobs (all attempts).
        "tuning_share_pct": 100.0 * stats.tuning_s / training_s if training_s else None,
        "replica_core_hours": stats.replica_core_s / 3600.0,
        "wall_s": wall,
    }


# -- the section ------------------------------------------------------------------------------


def run(study: OpenbStudy, trace_dir: Path, out_dir: Path, show: bool) -> Section:
    unknown = [v for v in study.variants if v not in VARIANTS]
    if unknown:
        raise ReportError(f"openb variants: unknown {', '.join(unknown)}")
    section = Section("openb", "openb trace and SODA's published workload (SODA §VI)")
    started = time.monotonic()
    data: dict[str, Any] = {}
    for name in study.workloads:
        s = setup_for(name, study, trace_dir)
        data[name] = _workload_section(section, study, s, out_dir, show)
    dlrm: DlrmReplay | None = None
    if study.dlrm:
        dlrm = replay_dlrm(trace_dir, seed=study.seed, apps=study.dlrm_apps)
        section.text(dlrm.setup_text())
        section.table(dlrm.table())
    openb_data = data.get("openb", {})
    section.data = {
        "config": asdict(study),
        "paper": SODA_PAPER,
        **openb_data,  # the openb replay's figures where they always were
        "workloads": data,
        "dlrm": dlrm.data() if dlrm is not None else None,
    }
    section.wall_s = time.monotonic() - started
    return section


def _soda_paper_text(s: Setup) -> str:
    return (
        f"{s.text} Figures are averaged over the window "
        f"({fmt((s.window[1] - s.window[0]) / 3600, '{:.0f}')} h). The services run the "
        "whole window: plain jobs under the baselines, the inference placer's services under "
        "SODA. SODA's arrays: DRF inside every array, sized by `resize()` from the "
        f"{s.history_records} jobs that ended in the week before the window, drawn from the "
        f"same distributions with another seed (large-job array "
        f"{fmt(100 * s.arrays.default.large.value, '{:.1f}')}% of the GPUs, CPU-job array "
        f"{fmt(100 * s.arrays.default.cpu_job_cores.value, '{:.1f}')}% of each node's cores). "
        f"SODA full's allocator may give a part up to {s.max_cores_per_gpu} cores per GPU "
        "(a GPU's share of its node's cores, rounded up) from the CPU-job array's idle "
        "cores (`masterd/core/widen.py`)."
    )


def _workload_section(section: Section, study: OpenbStudy, s: Setup, out_dir: Path,
                      show: bool) -> dict[str, Any]:
    """Replay every variant on one workload; its tables and figures; its data."""
    notes = s.workload.notes
    stats: dict[str, dict[str, Any]] = {}
    results: dict[str, SimResult] = {}
    for name in study.variants:
        result, sstats, wall = run_variant(study, s, name, show)
        results[name] = result
        stats[name] = summarise(result, sstats, s, VARIANTS[name], wall)
    p = s.name  # table ids and figure names: "openb-main", "soda_paper-main", ...
    jobs = s.workload.jobs
    gpu_pods = sum(1 for j in jobs if j.spec.gpus)
    arrays = s.arrays.default
    if s.name == "soda_paper":
        section.text(_soda_paper_text(s))
    else:
        section.text(
        f"**Setup: openb (generated).** `openb-pods.csv` pods created from trace day "
        f"{study.since_day:g} on ({len(jobs)} of {notes['pods_in_trace']} pods: "
        f"{gpu_pods} GPU pods, {len(jobs) - gpu_pods} CPU pods) with creation times divided "
        f"by {study.arrival_scale:g} (runtimes kept), on every {study.node_stride}th node of "
        f"`openb-gpu-nodes.csv` ({notes['nodes']} of {notes['nodes_listed']} nodes: "
        f"{notes['gpus']} GPUs, {notes['cpu_cores']} cores). Fractional GPU requests are "
        f"rounded up to whole GPUs ({notes['fractional_gpu_pods_rounded_up']} pods), and such "
        "a pod keeps its GPU busy at most the share it asked for. Figures are averaged over "
        f"the arrival window ({fmt((s.window[1] - s.window[0]) / 3600, '{:.1f}')} h). "
        "Every replay runs the same ground truth of CPU cores, memory bandwidth and query load "
        "(`sim/soda_truth.py`: throughput against cores per model category, contention "
        "slowdown, a daily load curve), so a baseline's jobs are starved, slowed and hold "
        f"GPUs at night as much as SODA's. {len(s.services)} latency-sensitive GPU pods that "
        "run a day or more are inference services: a plain job under the baselines, the "
        "inference placer's service under SODA (excluded from the GPU-job queueing figures "
        "everywhere). SODA's arrays: DRF inside every array (§V-C), sized by `resize()` from "
        f"the {s.history_records} pods that ended in the {study.history_days:g} days before "
        f"the window (large-job array {fmt(100 * arrays.large.value, '{:.1f}')}% of each "
        f"model's GPUs, CPU-job array {fmt(100 * arrays.cpu_job_cores.value, '{:.1f}')}% of "
        "each node's cores), an array's free units lent until one of its own jobs could "
        "start on them (`lending = \"free\"`), idle CPU-array cores lent to GPU jobs, "
        "preempted borrowers migrated (progress kept). SODA full adds the adaptive CPU "
        "allocator (the master's N_start and noded's tuning session), the inference placer "
        "(the master's) and the contention eliminator (noded's controller on simulated "
        "MBM), each the code the daemons run; KELP-FIFO and KELP-DRF run the contention "
        "eliminator too (KELP's memory-bandwidth partitioning). SODA full's allocator may "
        f"give a part up to {s.max_cores_per_gpu} cores per GPU from idle CPU-array cores. "
        "The network partition is out: openb's pods "
        "run on one node each, so no multi-node GPU job ever shares a NIC."
        )
    cols = ["variant", "GPU active %", "GPU busy of active % (paper's)", "GPU busy of all %",
            "GPU jobs: avg queueing s",
            "p99 s", "queued > 1 min %", "not queued %", "CPU jobs: avg queueing s", "p99 s",
            "within 10 s %", "within 1 min %", "migrations", "restarts", "rejected"]
    forms = ["{}", "{:.1f}", "{:.1f}", "{:.1f}", "{:.0f}", "{:.0f}", "{:.1f}", "{:.1f}", "{:.0f}",
             "{:.0f}", "{:.1f}", "{:.1f}", "{:d}", "{:d}", "{:d}"]

    def row(table: Table, name: str) -> None:
        st = stats[name]
        g, c = st["gpu_jobs"], st["cpu_jobs"]
        table.add(VARIANTS[name].title, st["gpu_active_pct"], st["gpu_busy_of_active_pct"],
                  st["gpu_util_pct"], g["avg_s"],
                  g["p99_s"], g["over_1min_pct"], g["not_queued_pct"], c["avg_s"], c["p99_s"],
                  c["within_10s_pct"], c["within_1min_pct"], st["migrations"], st["restarts"],
                  st["rejected"])

    main = section.table(Table(f"{p}-main", cols, forms, caption=f"{p}."))
    for name in study.variants:
        if name in MAIN:
            row(main, name)
    ablated = [n for n in study.variants if n in ABLATION]
    if ablated:
        ablation = section.table(Table(
            f"{p}-ablation", cols, forms,
            caption="SODA with each mechanism off in turn (cf. SODA Figs. 12–15 and §VI-G), "
                    "and with the arrays lending only while none of their own jobs waits (the "
                    "rule this study ran before SODA's §V-C rule), with a job's request as its "
                    f"cores' ceiling, and plain FIFO without KELP's partitioning ({p}).",
        ))
        for name in ("soda_full", *ablated):
            if name in stats:
                row(ablation, name)
    mech = section.table(Table(
        f"{p}-mechanisms",
        ["variant", "parts tuned", "training time in tuning windows %", "cores given beyond "
         "requests", "cores handed back", "parts ending with more cores %",
         "parts ending with fewer cores %", "throttle actions", "replicas launched",
         "CPU-replica core-hours", "placer preemptions"],
        ["{}", "{:d}", "{:.1f}", "{:d}", "{:d}", "{:.1f}", "{:.1f}", "{:d}", "{:d}", "{:.0f}",
         "{:d}"],
        caption=f"What each mechanism did ({p}).",
    ))
    why = section.table(Table(
        f"{p}-waits",
        ["variant", "GPUs busy %", "GPUs free, cores short %", "GPUs free, memory short %",
         "GPUs free, both short %", "fits another model's array %",
         "fits the other array of its model %", "fits, held back %"],
        ["{}", "{:.1f}", "{:.1f}", "{:.1f}", "{:.1f}", "{:.1f}", "{:.1f}", "{:.1f}"],
        caption="Why GPU jobs waited: each queued GPU job at each sample, by what the best "
                "node of its GPU model lacked (no node had its GPUs free; one had, but not "
                "the cores, the memory or both), or, where a node would have fit it, where "
                "that node was under SODA's arrays (only nodes of another GPU model than the "
                "job's array; only the other GPU array of its model, large or small) or that "
                "the policy held it back (its order; for the arrays, inside the job's own "
                "array).",
    ))
    for name in study.variants:
        st = stats[name]
        mech.add(VARIANTS[name].title, st["tuned_parts"], st["tuning_share_pct"],
                 st["cores_widened"], st["cores_returned"], st["parts_more_cores_pct"],
                 st["parts_fewer_cores_pct"], st["throttle_actions"],
                 st["replica_launches"], st["replica_core_hours"], st["placer_preemptions"])
        w = st["waits"]
        why.add(VARIANTS[name].title, w["gpus"], w["cores"], w["memory"], w["both"],
                w["held_model"], w["held_array"], w["held"])
    side = section.table(Table(
        f"{p}-soda",
        ["metric", "variant", "SODA paper", "ours"],
        ["{}", "{}", "{:.1f}", "{:.1f}"],
        caption=f"{p} against the paper. Theirs: {SODA_PAPER['source']}; their cluster: 80 "
                "nodes, 400 GPUs, one month of a production trace. The paper's GPU utilisation "
                "is the busy share of the GPUs in use (§III-A).",
    ))
    paper_rows: list[tuple[str, str, Callable[[dict[str, Any]], Any]]] = [
        ("GPU utilisation (busy of active) %", "gpu_util_pct",
         lambda st: st["gpu_busy_of_active_pct"]),
        ("GPU active %", "gpu_active_pct", lambda st: st["gpu_active_pct"]),
        ("GPU jobs queued > 1 min %", "gpu_jobs_queued_over_1min_pct",
         lambda st: st["gpu_jobs"]["over_1min_pct"]),
        ("GPU jobs not queued %", "gpu_jobs_not_queued_pct",
         lambda st: st["gpu_jobs"]["not_queued_pct"]),
        ("CPU jobs scheduled within 10 s %", "cpu_jobs_within_10s_pct",
         lambda st: st["cpu_jobs"]["within_10s_pct"]),
        ("CPU jobs scheduled within 1 min %", "cpu_jobs_within_1min_pct",
         lambda st: st["cpu_jobs"]["within_1min_pct"]),
        ("training parts ending with more cores than asked %", "parts_more_cores_pct",
         lambda st: st["parts_more_cores_pct"]),
        ("training parts ending with fewer cores than asked %", "parts_fewer_cores_pct",
         lambda st: st["parts_fewer_cores_pct"]),
    ]
    for label, key, pick in paper_rows:
        for name, theirs in SODA_PAPER[key].items():  # type: ignore[union-attr]
            if name in stats:
                side.add(label, VARIANTS[name].title, theirs, pick(stats[name]))
    if "soda_full" in stats and "fifo" in stats:
        side.add("GPU utilisation (busy of active) gain over KELP-FIFO, points",
                 VARIANTS["soda_full"].title, 65.4 - 45.5,
                 _diff(stats["soda_full"], stats["fifo"]))
    if "soda_full" in stats and "no_eliminator" in stats:
        side.add("GPU utilisation lost without the eliminator, points",
                 VARIANTS["no_eliminator"].title, SODA_PAPER["no_eliminator_gpu_util_drop_points"],
                 _diff(stats["soda_full"], stats["no_eliminator"]))

    _plots(section, results, s.window, out_dir, p)
    return {
        "workload_notes": notes,
        "arrival_window_s": list(s.window),
        "services": len(s.services),
        "history_records": s.history_records,
        "arrays": {"large_share": arrays.large.value,
                   "cpu_job_cores_share": arrays.cpu_job_cores.value},
        "runs": stats,
    }


def _diff(a: dict[str, Any], b: dict[str, Any]) -> float | None:
    """Points of the paper's utilisation (busy share of the GPUs in use) between runs."""
    if a["gpu_busy_of_active_pct"] is None or b["gpu_busy_of_active_pct"] is None:
        return None
    return a["gpu_busy_of_active_pct"] - b["gpu_busy_of_active_pct"]


def _plots(section: Section, results: dict[str, SimResult], window: tuple[float, float],
           out_dir: Path, p: str) -> None:
    plt = pyplot()
    if plt is None:
        return
    shown = {n: r for n, r in results.items() if n in MAIN}
    fig, ax = plt.subplots(figsize=(8, 3.6))
    for name, result in shown.items():
        total = result.total_gpus or 1
        xs = [s.time / 3600 for s in result.samples if s.time <= window[1]]
        ax.plot(xs, [100 * s.allocated_gpus / total for s in result.samples[:len(xs)]],
                label=f"{VARIANTS[name].title} active", linewidth=1)
        ax.plot(xs, [100 * s.effective_gpus / total for s in result.samples[:len(xs)]],
                label=f"{VARIANTS[name].title} utilised", linewidth=1, linestyle="--")
    ax.set_xlabel("time (h, compressed)")
    ax.set_ylabel("% of GPUs")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    save_figure(plt, fig, out_dir / f"{p}_gpu_util.png")
    section.figures.append((f"{p}_gpu_util.png", f"{p}: GPU active and utilised (busy) "
                            "share over the arrival window (cf. SODA Figs. 12–13)."))
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.6))
    for name, result in shown.items():
        for ax, gpu in ((left, True), (right, False)):
            delays = [r.queue_delay for r in finished(result, gpu=gpu)
                      if r.queue_delay is not None]
            plot_cdf(ax, delays, VARIANTS[name].title, log_x=True)
    for ax, what in ((left, "GPU jobs"), (right, "CPU jobs")):
        ax.set_xscale("log")
        ax.set_xlabel("queueing delay (s; < 1 s drawn at 1 s)")
        ax.set_title(what, fontsize=9)
        ax.grid(True, alpha=0.3)
    left.set_ylabel("CDF")
    right.legend(fontsize=7)
    save_figure(plt, fig, out_dir / f"{p}_queue_cdf.png")
    section.figures.append((f"{p}_queue_cdf.png", f"{p}: queueing delay CDF of GPU and "
                            "CPU jobs (cf. SODA Fig. 15a)."))


STUDY = Study(name="openb", label="openb", config=OpenbStudy, run=run, tiny=tiny,
              add_options=add_options, apply_options=apply_options)
