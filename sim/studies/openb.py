"""Study 3: the openb trace (SODA §VI), with SODA's four mechanisms through the live code.

FIFO, DRF, SODA's arrays alone and SODA complete (arrays + adaptive CPU allocator + inference
placer + contention eliminator, sim/soda.py) on Alibaba's openb pods, compressed onto a subset
of its nodes so that queues form; then SODA with each mechanism off in turn (SODA Figs.
12–15). Every replay runs on :class:`sim.soda.SodaSimulator`, so the ground truth of CPU
cores, memory bandwidth and query load (sim/soda_truth.py) acts on the baselines as well. The
inference placer is also replayed on a second, independent workload: Alibaba's disaggregated
DLRM inference instances (sim/soda_dlrm.py).
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
from sim.workloads import openb
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
}

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


VARIANTS: dict[str, Variant] = {
    "fifo": Variant("FIFO", "fifo", Mechanisms.none(), False),
    "drf": Variant("DRF", "drf", Mechanisms.none(), False),
    "soda_arrays": Variant("SODA arrays only", "arrays", Mechanisms.none(), True),
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
}
MAIN = ("fifo", "drf", "soda_arrays", "soda_full")
ABLATION = ("no_allocator", "no_placer", "no_eliminator", "no_arrays", "idle_lending")


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


def tiny() -> OpenbStudy:
    return replace(OpenbStudy(), since_day=0.0, arrival_scale=1.0, node_stride=1, dlrm=False)


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
    base = ArrayConfig.from_table({
        "inner": {"small": "drf", "large": "drf", "cpu": "drf"},  # DRF in every array (§V-C)
        "gpu_jobs_borrow_cpu_cores": True,  # idle CPU-array cores lent to GPU jobs (§V-C)
        "history_days": study.history_days,
    })
    arrays = resize(base, records, since)
    min_runtime = SodaTruthConfig().service_min_runtime_s
    services = frozenset(
        j.id for j in workload.jobs
        if j.spec.kind.value == "inference" and (j.truth.known_duration or 0.0) >= min_runtime
    )
    jobs = workload.jobs
    window = (jobs[0].submit, jobs[-1].submit) if jobs else (0.0, 0.0)
    return Setup(workload, services, openb.gpu_shares(trace_dir, options), arrays,
                 len(records), window)


def make(variant: Variant, s: Setup) -> Policy:
    if variant.policy == "arrays":
        return soda_arrays(replace(s.arrays, lending=variant.lending))
    return make_policy(variant.policy)


def run_variant(study: OpenbStudy, s: Setup, name: str, show: bool,
                ) -> tuple[SimResult, SodaStats, float]:
    variant = VARIANTS[name]
    config = SimConfig(seed=study.seed, preempt_keeps_progress=variant.migration)
    soda = SodaConfig(mechanisms=variant.mechanisms, services=s.services,
                      gpu_share=s.gpu_share, tick_until=s.window[1] + study.tick_margin_s)
    bar = ProgressBar(f"openb {name}") if show else None
    started = time.monotonic()
    sim = SodaSimulator(s.workload, make(variant, s), config, soda, bar)
    result = sim.run()
    if bar is not None:
        bar.close(result.end_time, sum(r.state != "unfinished" for r in result.records),
                  len(result.records))
    return result, sim.stats, time.monotonic() - started


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
    section = Section("openb", "openb trace (SODA §VI)")
    started = time.monotonic()
    s = setup(study, trace_dir)
    notes = s.workload.notes
    stats: dict[str, dict[str, Any]] = {}
    results: dict[str, SimResult] = {}
    for name in study.variants:
        result, sstats, wall = run_variant(study, s, name, show)
        results[name] = result
        stats[name] = summarise(result, sstats, s, VARIANTS[name], wall)
    jobs = s.workload.jobs
    gpu_pods = sum(1 for j in jobs if j.spec.gpus)
    arrays = s.arrays.default
    section.text(
        f"**Setup (generated).** `openb-pods.csv` pods created from trace day "
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
        "MBM), each the code the daemons run. The network partition is out: openb's pods "
        "run on one node each, so no multi-node GPU job ever shares a NIC."
    )
    cols = ["variant", "GPU active %", "GPU utilisation %", "GPU jobs: avg queueing s",
            "p99 s", "queued > 1 min %", "not queued %", "CPU jobs: avg queueing s", "p99 s",
            "within 10 s %", "within 1 min %", "migrations", "restarts", "rejected"]
    forms = ["{}", "{:.1f}", "{:.1f}", "{:.0f}", "{:.0f}", "{:.1f}", "{:.1f}", "{:.0f}",
             "{:.0f}", "{:.1f}", "{:.1f}", "{:d}", "{:d}", "{:d}"]

    def row(table: Table, name: str) -> None:
        st = stats[name]
        g, c = st["gpu_jobs"], st["cpu_jobs"]
        table.add(VARIANTS[name].title, st["gpu_active_pct"], st["gpu_util_pct"], g["avg_s"],
                  g["p99_s"], g["over_1min_pct"], g["not_queued_pct"], c["avg_s"], c["p99_s"],
                  c["within_10s_pct"], c["within_1min_pct"], st["migrations"], st["restarts"],
                  st["rejected"])

    main = section.table(Table("openb-main", cols, forms))
    for name in study.variants:
        if name in MAIN:
            row(main, name)
    ablated = [n for n in study.variants if n in ABLATION]
    if ablated:
        ablation = section.table(Table(
            "openb-ablation", cols, forms,
            caption="SODA with each mechanism off in turn (cf. SODA Figs. 12–15 and §VI-G), "
                    "and with the arrays lending only while none of their own jobs waits (the "
                    "rule this study ran before SODA's §V-C rule).",
        ))
        for name in ("soda_full", *ablated):
            if name in stats:
                row(ablation, name)
    mech = section.table(Table(
        "openb-mechanisms",
        ["variant", "parts tuned", "training time in tuning windows %", "cores handed back",
         "parts ending with fewer cores %", "throttle actions", "replicas launched",
         "CPU-replica core-hours", "placer preemptions"],
        ["{}", "{:d}", "{:.1f}", "{:d}", "{:.1f}", "{:d}", "{:d}", "{:.0f}", "{:d}"],
        caption="What each mechanism did.",
    ))
    why = section.table(Table(
        "openb-waits",
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
                 st["cores_returned"], st["parts_fewer_cores_pct"], st["throttle_actions"],
                 st["replica_launches"], st["replica_core_hours"], st["placer_preemptions"])
        w = st["waits"]
        why.add(VARIANTS[name].title, w["gpus"], w["cores"], w["memory"], w["both"],
                w["held_model"], w["held_array"], w["held"])
    side = section.table(Table(
        "openb-soda",
        ["metric", "variant", "SODA paper", "ours"],
        ["{}", "{}", "{:.1f}", "{:.1f}"],
        caption=f"Theirs: {SODA_PAPER['source']}; their cluster: 80 nodes, 400 GPUs, one "
                "month of a production trace.",
    ))
    paper_rows: list[tuple[str, str, Callable[[dict[str, Any]], Any]]] = [
        ("GPU utilisation %", "gpu_util_pct", lambda st: st["gpu_util_pct"]),
        ("GPU active %", "gpu_active_pct", lambda st: st["gpu_active_pct"]),
        ("GPU jobs queued > 1 min %", "gpu_jobs_queued_over_1min_pct",
         lambda st: st["gpu_jobs"]["over_1min_pct"]),
        ("GPU jobs not queued %", "gpu_jobs_not_queued_pct",
         lambda st: st["gpu_jobs"]["not_queued_pct"]),
        ("CPU jobs scheduled within 10 s %", "cpu_jobs_within_10s_pct",
         lambda st: st["cpu_jobs"]["within_10s_pct"]),
        ("CPU jobs scheduled within 1 min %", "cpu_jobs_within_1min_pct",
         lambda st: st["cpu_jobs"]["within_1min_pct"]),
    ]
    for label, key, pick in paper_rows:
        for name, theirs in SODA_PAPER[key].items():  # type: ignore[union-attr]
            if name in stats:
                side.add(label, VARIANTS[name].title, theirs, pick(stats[name]))
    if "soda_full" in stats and "fifo" in stats:
        side.add("GPU utilisation gain over FIFO, points", VARIANTS["soda_full"].title,
                 65.4 - 45.5, _diff(stats["soda_full"], stats["fifo"]))
    if "soda_full" in stats and "no_eliminator" in stats:
        side.add("GPU utilisation lost without the eliminator, points",
                 VARIANTS["no_eliminator"].title, SODA_PAPER["no_eliminator_gpu_util_drop_points"],
                 _diff(stats["soda_full"], stats["no_eliminator"]))

    dlrm: DlrmReplay | None = None
    if study.dlrm:
        dlrm = replay_dlrm(trace_dir, seed=study.seed, apps=study.dlrm_apps)
        section.text(dlrm.setup_text())
        section.table(dlrm.table())
    _plots(section, results, s.window, out_dir)
    section.data = {
        "config": asdict(study),
        "paper": SODA_PAPER,
        "workload_notes": notes,
        "arrival_window_s": list(s.window),
        "services": len(s.services),
        "history_records": s.history_records,
        "arrays": {"large_share": arrays.large.value,
                   "cpu_job_cores_share": arrays.cpu_job_cores.value},
        "runs": stats,
        "dlrm": dlrm.data() if dlrm is not None else None,
    }
    section.wall_s = time.monotonic() - started
    return section


def _diff(a: dict[str, Any], b: dict[str, Any]) -> float | None:
    if a["gpu_util_pct"] is None or b["gpu_util_pct"] is None:
        return None
    return a["gpu_util_pct"] - b["gpu_util_pct"]


def _plots(section: Section, results: dict[str, SimResult], window: tuple[float, float],
           out_dir: Path) -> None:
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
    save_figure(plt, fig, out_dir / "openb_gpu_util.png")
    section.figures.append(("openb_gpu_util.png", "openb: GPU active and utilised (busy) "
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
    save_figure(plt, fig, out_dir / "openb_queue_cdf.png")
    section.figures.append(("openb_queue_cdf.png", "openb: queueing delay CDF of GPU and "
                            "CPU jobs (cf. SODA Fig. 15a)."))


STUDY = Study(name="openb", label="openb", config=OpenbStudy, run=run, tiny=tiny,
              add_options=add_options, apply_options=apply_options)
