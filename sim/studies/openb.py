"""Study 3: the openb trace (SODA §VI).

FIFO, DRF and SODA's multi-array scheduler on Alibaba's openb pods, compressed onto a subset
of its nodes so that queues form: GPU active and utilisation rates, queueing of GPU and CPU
jobs, next to SODA's own figures.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from masterd.core.policies import make_policy
from sim.engine import SimConfig, SimResult
from sim.metrics import time_weighted
from sim.studies.common import (
    Section,
    Study,
    check_policies,
    finished,
    plot_cdf,
    pyplot,
    queue_stats,
    replay,
    save_figure,
    title,
)
from sim.tables import Table, fmt
from sim.truth import TruthConfig, TruthModel
from sim.workloads import openb
from sim.workloads.base import LoadOptions

# The paper's own figures, quoted next to ours (never computed here).
SODA_PAPER = {
    "source": "SODA §VI-B and §VI-C (seeds/soda.md); their FIFO and DRF run on KELP",
    "gpu_util_pct": {"fifo": 45.5, "drf": 45.1, "soda-arrays": 65.4},
    "gpu_active_pct": {"fifo": 90.2, "drf": 89.7, "soda-arrays": 76.3},
    "gpu_jobs_queued_over_1min_pct": {"fifo": 57.5, "drf": 49.5},
    "gpu_jobs_not_queued_pct": {"soda-arrays": 88.2},
    "cpu_jobs_within_10s_pct": {"fifo": 90.5, "drf": 90.6},
    "cpu_jobs_within_1min_pct": {"soda-arrays": 91.3},
}


@dataclass(frozen=True)
class OpenbStudy:
    # Pods created from this trace day on (most arrive in the last weeks); together with the
    # compression and the node subset this loads the GPUs so that queues form while SODA's
    # multi-array policy (whose passes grow with the queue) still replays in minutes.
    since_day: float = 145.0
    arrival_scale: float = 20.0
    node_stride: int = 40
    policies: tuple[str, ...] = ("fifo", "drf", "soda-arrays")
    seed: int = 1
    limit: int | None = None


def tiny() -> OpenbStudy:
    return replace(OpenbStudy(), since_day=0.0, arrival_scale=1.0, node_stride=1)


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--openb-arrival-scale", type=float)
    parser.add_argument("--openb-node-stride", type=int)
    parser.add_argument("--openb-since-day", type=float)


def apply_options(study: OpenbStudy, args: argparse.Namespace) -> OpenbStudy:
    for attr, value in (("arrival_scale", args.openb_arrival_scale),
                        ("node_stride", args.openb_node_stride),
                        ("since_day", args.openb_since_day)):
        if value is not None:
            study = replace(study, **{attr: value})
    return study


def _window_rate(result: SimResult, start: float, end: float, effective: bool) -> float | None:
    if not result.total_gpus:
        return None
    series = [(t, e if effective else a) for t, a, e in result.usage]
    value = time_weighted(series, start, end)
    return None if value is None else 100.0 * value / result.total_gpus


def run(study: OpenbStudy, trace_dir: Path, out_dir: Path, show: bool) -> Section:
    check_policies(study.policies, "openb policies")
    section = Section("openb", "openb trace (SODA §VI)")
    started = time.monotonic()
    truth = TruthModel(TruthConfig(), study.seed)
    workload = openb.load(trace_dir, LoadOptions(seed=study.seed, limit=study.limit), truth,
                          arrival_scale=study.arrival_scale, node_stride=study.node_stride,
                          since=study.since_day * 86400.0)
    notes = workload.notes
    config = SimConfig(seed=study.seed)
    window = (workload.jobs[0].submit, workload.jobs[-1].submit) if workload.jobs else (0.0, 0.0)
    options: dict[str, dict[str, Any]] = {
        # SODA: DRF inside every array (§V-C).
        "soda-arrays": {"inner": {"small": "drf", "large": "drf", "cpu": "drf"}},
    }
    stats: dict[str, dict[str, Any]] = {}
    results: dict[str, SimResult] = {}
    for name in study.policies:
        result, wall = replay(f"openb {name}", workload,
                              lambda name=name: make_policy(name, **options.get(name, {})),
                              config, show)
        results[name] = result
        gpu = queue_stats(finished(result, gpu=True))
        cpu = queue_stats(finished(result, gpu=False))
        stats[name] = {
            "jobs": len(result.records),
            "rejected": sum(r.state == "rejected" for r in result.records),
            "unfinished": sum(r.state == "unfinished" for r in result.records),
            "gpu_active_pct": _window_rate(result, *window, effective=False),
            "gpu_util_pct": _window_rate(result, *window, effective=True),
            "gpu_jobs": gpu,
            "cpu_jobs": cpu,
            "preemptions": sum(r.preemptions for r in result.records),
            "wall_s": wall,
        }
    gpu_pods = sum(1 for j in workload.jobs if j.spec.gpus)
    section.text(
        f"**Setup (generated).** `openb-pods.csv` pods created from trace day "
        f"{study.since_day:g} on ({len(workload.jobs)} of {notes['pods_in_trace']} pods: "
        f"{gpu_pods} GPU pods, {len(workload.jobs) - gpu_pods} CPU pods) with creation times "
        f"divided by {study.arrival_scale:g} (runtimes kept), on every {study.node_stride}th "
        f"node of `openb-gpu-nodes.csv` ({notes['nodes']} of {notes['nodes_listed']} nodes: "
        f"{notes['gpus']} GPUs, {notes['cpu_cores']} cores). As recorded, the pods never "
        "occupy more than a small share of the trace's GPUs and nothing would queue; the "
        "compression and the node subset make queues form. Fractional GPU requests are "
        f"rounded up to whole GPUs ({notes['fractional_gpu_pods_rounded_up']} pods). GPU active "
        "and utilisation rates are averaged over the arrival window (first to last arrival, "
        f"{fmt((window[1] - window[0]) / 3600, '{:.1f}')} h), when load is offered; the drain "
        "afterwards is dominated by a few pods that run for weeks. SODA arrays: the "
        "multi-array scheduler of SODA §V-C with DRF inside each array and default array "
        "sizes; the adaptive CPU allocator, inference placer and contention eliminator are "
        "not part of a replay."
    )
    main = section.table(Table(
        "openb-main",
        ["policy", "GPU active %", "GPU utilisation %", "GPU jobs: avg queueing s",
         "p99 s", "queued > 1 min %", "not queued %", "CPU jobs: avg queueing s", "p99 s",
         "within 10 s %", "within 1 min %", "preemptions", "rejected"],
        ["{}", "{:.1f}", "{:.1f}", "{:.0f}", "{:.0f}", "{:.1f}", "{:.1f}", "{:.0f}", "{:.0f}",
         "{:.1f}", "{:.1f}", "{:d}", "{:d}"],
    ))
    for name in study.policies:
        s = stats[name]
        g, c = s["gpu_jobs"], s["cpu_jobs"]
        main.add(title(name), s["gpu_active_pct"], s["gpu_util_pct"], g["avg_s"], g["p99_s"],
                 g["over_1min_pct"], g["not_queued_pct"], c["avg_s"], c["p99_s"],
                 c["within_10s_pct"], c["within_1min_pct"], s["preemptions"], s["rejected"])
    side = section.table(Table(
        "openb-soda",
        ["metric", "policy", "SODA paper", "ours"],
        ["{}", "{}", "{:.1f}", "{:.1f}"],
        caption=f"Theirs: {SODA_PAPER['source']}; their cluster: 80 nodes, 400 GPUs, one "
                "month of a production trace.",
    ))
    paper_rows: list[tuple[str, str, str, Callable[[dict[str, Any]], Any]]] = [
        ("GPU utilisation %", "gpu_util_pct", "", lambda s: s["gpu_util_pct"]),
        ("GPU active %", "gpu_active_pct", "", lambda s: s["gpu_active_pct"]),
        ("GPU jobs queued > 1 min %", "gpu_jobs_queued_over_1min_pct", "",
         lambda s: s["gpu_jobs"]["over_1min_pct"]),
        ("GPU jobs not queued %", "gpu_jobs_not_queued_pct", "",
         lambda s: s["gpu_jobs"]["not_queued_pct"]),
        ("CPU jobs scheduled within 10 s %", "cpu_jobs_within_10s_pct", "",
         lambda s: s["cpu_jobs"]["within_10s_pct"]),
        ("CPU jobs scheduled within 1 min %", "cpu_jobs_within_1min_pct", "",
         lambda s: s["cpu_jobs"]["within_1min_pct"]),
    ]
    for label, key, _, pick in paper_rows:
        for name, theirs in SODA_PAPER[key].items():  # type: ignore[union-attr]
            if name in stats:
                side.add(label, title(name), theirs, pick(stats[name]))

    plt = pyplot()
    if plt is not None:
        fig, ax = plt.subplots(figsize=(8, 3.6))
        for name, result in results.items():
            total = result.total_gpus or 1
            xs = [s.time / 3600 for s in result.samples if s.time <= window[1]]
            ax.plot(xs, [100 * s.allocated_gpus / total for s in result.samples[:len(xs)]],
                    label=f"{title(name)} active", linewidth=1)
            ax.plot(xs, [100 * s.effective_gpus / total for s in result.samples[:len(xs)]],
                    label=f"{title(name)} utilised", linewidth=1, linestyle="--")
        ax.set_xlabel("time (h, compressed)")
        ax.set_ylabel("% of GPUs")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
        save_figure(plt, fig, out_dir / "openb_gpu_util.png")
        section.figures.append(("openb_gpu_util.png", "openb: GPU active and utilised share "
                                "over the arrival window (cf. SODA Figs. 12–13)."))
        fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.6))
        for name, result in results.items():
            for ax, gpu in ((left, True), (right, False)):
                delays = [r.queue_delay for r in finished(result, gpu=gpu)
                          if r.queue_delay is not None]
                plot_cdf(ax, delays, title(name), log_x=True)
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
    section.data = {
        "config": asdict(study),
        "paper": SODA_PAPER,
        "workload_notes": notes,
        "arrival_window_s": list(window),
        "runs": stats,
    }
    section.wall_s = time.monotonic() - started
    return section


STUDY = Study(name="openb", label="openb", config=OpenbStudy, run=run, tiny=tiny,
              add_options=add_options, apply_options=apply_options)
