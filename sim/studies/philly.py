"""Study 2: the Philly trace (Helios §4.2.3, Table 3).

FIFO against SJF with perfect knowledge on Helios' Philly evaluation period, one scheduling
core per virtual cluster, at several VC scales; other policies on one scale; the full trace.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from masterd.core.policies import make_policy
from masterd.core.policy import Policy
from sim.engine import SimConfig, SimResult
from sim.metrics import mean, percentile, summarise
from sim.oracle import oracle_modeldb, prediction_errors
from sim.studies.common import (
    QUEUED_THRESHOLD_S,
    ReportError,
    Section,
    Study,
    check_policies,
    csv_list,
    finished,
    plot_cdf,
    pyplot,
    queue_stats,
    replay,
    save_figure,
    title,
)
from sim.tables import Table, fmt
from sim.truth import NodeTopology, TruthConfig, TruthModel
from sim.workloads import philly
from sim.workloads.base import LoadOptions

# The paper's own figures, quoted next to ours (never computed here).
HELIOS_PHILLY = {
    "source": "Helios §4.2.3, Table 3, Philly column; Table 2 (seeds/helios.md)",
    "fifo_avg_jct_s": 86072,
    "sjf_avg_jct_s": 34272,
    "fifo_avg_queue_s": 56531,
    "sjf_avg_queue_s": 4731,
    "fifo_queued_jobs": 30282,
    "sjf_queued_jobs": 21437,
    "avg_duration_s": 28329,  # Table 2, the whole Philly trace Helios used
    "avg_gpus": 1.75,
}


@dataclass(frozen=True)
class PhillyStudy:
    since: str = "2017-10-01"  # Helios' Philly evaluation period: October and November 2017
    until: str = "2017-12-01"
    vc_scales: tuple[float, ...] = (1.0, 0.5, 0.25)
    policies: tuple[str, ...] = ("fifo", "sjf")
    # Policies replayed besides FIFO and SJF, on the VC scale named here (where queues form).
    other_policies: tuple[str, ...] = ("weighted-fair", "tetris-perf", "drf", "capacity")
    other_scale: float = 0.5
    full_trace_pair: bool = True
    seed: int = 1
    limit: int | None = None


def tiny() -> PhillyStudy:
    return replace(PhillyStudy(), vc_scales=(1.0, 0.5), other_policies=("drf",), other_scale=0.5)


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--philly-since", help="first submission date kept (default 2017-10-01)")
    parser.add_argument("--philly-until", help="end of the window (default 2017-12-01)")
    parser.add_argument("--philly-vc-scales",
                        help="comma-separated VC scales (default 1,0.5,0.25)")
    parser.add_argument("--philly-others", help="policies replayed besides FIFO and SJF "
                        "(comma-separated; empty for none)")
    parser.add_argument("--no-philly-full", action="store_true",
                        help="skip the full-trace FIFO/SJF pair")


def apply_options(study: PhillyStudy, args: argparse.Namespace) -> PhillyStudy:
    if args.philly_since:
        study = replace(study, since=args.philly_since)
    if args.philly_until:
        study = replace(study, until=args.philly_until)
    if args.philly_vc_scales:
        study = replace(study, vc_scales=tuple(
            csv_list(args.philly_vc_scales, float, "--philly-vc-scales")))
    if args.philly_others is not None:
        others = tuple(t.strip() for t in args.philly_others.split(",") if t.strip())
        study = replace(study, other_policies=others)
    if args.no_philly_full:
        study = replace(study, full_trace_pair=False)
    return study


def _day(text: str, what: str) -> float:
    try:
        stamp = datetime.fromisoformat(text)
    except ValueError:
        raise ReportError(f"{what}: {text!r} is not a date (YYYY-MM-DD)") from None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=UTC)
    return stamp.timestamp()


def _philly_stats(result: SimResult) -> dict[str, Any]:
    done = finished(result)
    q = queue_stats(done)
    jct = [r.jct for r in done if r.jct is not None]
    summary = summarise(result)
    return {
        "jobs": len(result.records),
        "finished": len(done),
        "rejected": sum(r.state == "rejected" for r in result.records),
        "unfinished": sum(r.state == "unfinished" for r in result.records),
        "avg_jct_s": mean(jct),
        "p99_jct_s": percentile(jct, 99),
        "avg_queue_s": q["avg_s"],
        "queued_jobs": q["queued"],
        "gpu_active_pct": None if summary["gpu_active_rate"] is None
        else 100 * summary["gpu_active_rate"],
        "per_vc_avg_queue_s": {t: v["avg_queue_s"] for t, v in summary["queue_by_tenant"].items()},
    }


def run(study: PhillyStudy, trace_dir: Path, out_dir: Path, show: bool) -> Section:
    policies = list(dict.fromkeys([*study.policies, *study.other_policies]))
    check_policies(policies, "philly policies")
    for needed in ("fifo", "sjf"):
        if needed not in study.policies:
            raise ReportError(f"the Philly study compares FIFO and SJF: include {needed}")
    if not study.vc_scales:
        raise ReportError("philly: give at least one VC scale")
    since, until = _day(study.since, "philly since"), _day(study.until, "philly until")
    section = Section("philly", "Philly trace (Helios §4.2.3, Table 3)")
    started = time.monotonic()
    # Helios' simulator runs each job for exactly its recorded duration: no noise, no
    # interference (a spread placement still pays its communication cost in our truth model).
    truth_config = TruthConfig(noise_sigma=0.0, interference=False)
    truth = TruthModel(truth_config, study.seed)
    config = SimConfig(seed=study.seed, truth=truth_config)
    oracle = oracle_modeldb(truth_config, philly.philly_node_group(1).gpu_model)
    options = LoadOptions(seed=study.seed, limit=study.limit)

    def factory(name: str) -> Callable[[], Policy]:
        # SJF with perfect knowledge: it ranks by the truth's own coefficients.
        if name == "sjf":
            return lambda: make_policy("sjf", modeldb=oracle)
        return lambda: make_policy(name)

    results: dict[tuple[str, float], dict[str, Any]] = {}
    workload_notes: dict[str, Any] = {}
    oracle_error: dict[str, Any] = {}
    curves: dict[tuple[str, float], list[float]] = {}
    scales = list(dict.fromkeys([*study.vc_scales, study.other_scale]
                                if study.other_policies else study.vc_scales))
    window_stats: dict[str, Any] = {}
    for scale in scales:
        workload = philly.load(trace_dir, options, truth, per_vc=True, since=since,
                               until=until, vc_scale=scale)
        workload_notes[f"{scale:g}"] = workload.notes
        if not window_stats:
            durations = [j.truth.known_duration or 0.0 for j in workload.jobs]
            window_stats = {
                "jobs": len(workload.jobs),
                "avg_duration_s": mean(durations),
                "avg_gpus": mean([float(j.spec.gpus) for j in workload.jobs]),
                "gpu_hours": math.fsum(d * j.spec.gpus for d, j in
                                       zip(durations, workload.jobs, strict=True)) / 3600,
            }
            oracle_error = prediction_errors(oracle, workload.jobs,
                                             NodeTopology.of(workload.nodes))
        names = [*study.policies]
        if scale == study.other_scale:
            names += [p for p in study.other_policies if p not in names]
        for name in names:
            result, wall = replay(f"philly x{scale:g} {name}", workload, factory(name), config,
                                  show, partitioned=True)
            stats = _philly_stats(result)
            stats["wall_s"] = wall
            results[(name, scale)] = stats
            curves[(name, scale)] = [r.jct for r in finished(result) if r.jct is not None]
    full: dict[str, dict[str, Any]] = {}
    full_stats: dict[str, Any] = {}
    if study.full_trace_pair:
        workload = philly.load(trace_dir, options, truth, per_vc=True)
        workload_notes["full"] = workload.notes
        durations = [j.truth.known_duration or 0.0 for j in workload.jobs]
        full_stats = {"jobs": len(workload.jobs), "avg_duration_s": mean(durations),
                      "avg_gpus": mean([float(j.spec.gpus) for j in workload.jobs])}
        for name in ("fifo", "sjf"):
            result, wall = replay(f"philly full {name}", workload, factory(name), config,
                                  show, partitioned=True)
            full[name] = dict(_philly_stats(result), wall_s=wall)

    base = workload_notes[f"{scales[0]:g}"]
    section.text(
        f"**Setup (generated).** `philly-jobs.csv` jobs submitted from {study.since} to "
        f"{study.until} (Helios' Philly evaluation period): {window_stats['jobs']} of "
        f"{base['jobs_in_trace']} jobs, mean recorded duration "
        f"{fmt(window_stats['avg_duration_s'], '{:.0f}')} s on "
        f"{fmt(window_stats['avg_gpus'], '{:.2f}')} GPUs. Each virtual cluster is scheduled "
        f"separately on its own nodes (`--per-vc`: one scheduling core per VC, nodes sized by "
        f"`philly-vcs.csv`, {base['virtual_clusters']} VCs, {base['nodes']} nodes × 8 GPUs at "
        f"scale 1); a VC scale s gives each VC round(s × its nodes) nodes (at least one) to "
        f"load the VCs more heavily. Jobs of VCs missing from `philly-vcs.csv` "
        f"({', '.join(base['vcs_without_size']) or 'none'}): "
        f"{base['jobs_in_vcs_without_size']}; they have no nodes and the core rejects them as "
        "never fitting, as it does jobs larger than their VC ever is (counts per scale below). "
        "Jobs run exactly their recorded duration when packed as they ran (no noise, no "
        "interference). SJF has perfect knowledge: it ranks by a model database holding the "
        "simulator's true coefficients, whose predictions differ from the recorded durations by "
        f"{fmt(oracle_error.get('mean_pct'), '{:.2f}')} % on average and "
        f"{fmt(oracle_error.get('max_pct'), '{:.1f}')} % at most over the "
        f"{oracle_error.get('jobs', 0)} jobs of at least a minute (the prediction model has no "
        "PCIe/socket locality term). Queued jobs: jobs that waited at least "
        f"{QUEUED_THRESHOLD_S:g} s."
    )
    main = section.table(Table(
        "philly-main",
        ["VC scale", "nodes", "policy", "avg JCT s", "avg queueing s", "queued jobs",
         "p99 JCT s", "GPU active %", "rejected", "jobs larger than VC"],
        ["{:g}", "{:d}", "{}", "{:.0f}", "{:.0f}", "{:d}", "{:.0f}", "{:.1f}", "{:d}", "{:d}"],
        caption=f"Jobs submitted {study.since} to {study.until}, per-VC scheduling.",
    ))
    for scale in scales:
        notes = workload_notes[f"{scale:g}"]
        for name in policies:
            stats = results.get((name, scale))
            if stats is None:
                continue
            main.add(scale, notes["nodes"], title(name), stats["avg_jct_s"],
                     stats["avg_queue_s"], stats["queued_jobs"], stats["p99_jct_s"],
                     stats["gpu_active_pct"], stats["rejected"], notes["jobs_larger_than_vc"])

    side = section.table(Table(
        "philly-helios",
        ["", "Helios Table 3", *[f"ours, scale {s:g}" for s in study.vc_scales],
         *(["ours, full trace, scale 1"] if full else [])],
        ["{}", "{:.0f}", *["{:.0f}"] * len(study.vc_scales), *(["{:.0f}"] if full else [])],
        caption=f"Theirs: {HELIOS_PHILLY['source']}. Ratio = FIFO / SJF.",
    ))
    rows: list[tuple[str, Any, str, str]] = [
        ("FIFO avg JCT s", HELIOS_PHILLY["fifo_avg_jct_s"], "fifo", "avg_jct_s"),
        ("SJF avg JCT s", HELIOS_PHILLY["sjf_avg_jct_s"], "sjf", "avg_jct_s"),
        ("FIFO avg queueing s", HELIOS_PHILLY["fifo_avg_queue_s"], "fifo", "avg_queue_s"),
        ("SJF avg queueing s", HELIOS_PHILLY["sjf_avg_queue_s"], "sjf", "avg_queue_s"),
        ("FIFO queued jobs", HELIOS_PHILLY["fifo_queued_jobs"], "fifo", "queued_jobs"),
        ("SJF queued jobs", HELIOS_PHILLY["sjf_queued_jobs"], "sjf", "queued_jobs"),
    ]
    for label, theirs, name, key in rows:
        cells = [results[(name, s)][key] for s in study.vc_scales]
        if full:
            cells.append(full[name][key])
        side.add(label, theirs, *cells)
    ratio_cells = []
    for s in study.vc_scales:
        f, j = results[("fifo", s)]["avg_jct_s"], results[("sjf", s)]["avg_jct_s"]
        ratio_cells.append(f / j if f is not None and j else None)
    if full:
        f, j = full["fifo"]["avg_jct_s"], full["sjf"]["avg_jct_s"]
        ratio_cells.append(f / j if f is not None and j else None)
    ratio = Table("philly-ratio", side.columns, ["{}", *["{:.2f}"] * (len(side.columns) - 1)])
    ratio.add("avg JCT ratio FIFO / SJF",
              HELIOS_PHILLY["fifo_avg_jct_s"] / HELIOS_PHILLY["sjf_avg_jct_s"], *ratio_cells)
    section.table(ratio)
    workload_table = section.table(Table(
        "philly-workload",
        ["workload", "jobs", "avg duration s", "avg GPUs"],
        ["{}", "{:d}", "{:.0f}", "{:.2f}"],
        caption="What was replayed against what Helios replayed (their Table 2 gives the "
                "whole Philly trace; the job count there is about 103k).",
    ))
    workload_table.add("Helios (Table 2)", None, HELIOS_PHILLY["avg_duration_s"],
                       HELIOS_PHILLY["avg_gpus"])
    workload_table.add(f"ours, {study.since} to {study.until}", window_stats["jobs"],
                       window_stats["avg_duration_s"], window_stats["avg_gpus"])
    if full_stats:
        workload_table.add("ours, full trace", full_stats["jobs"], full_stats["avg_duration_s"],
                           full_stats["avg_gpus"])

    plt = pyplot()
    if plt is not None:
        heavy = min(study.vc_scales)
        fig, ax = plt.subplots(figsize=(6.5, 3.8))
        for (name, scale), jcts in curves.items():
            if name in ("fifo", "sjf") and scale in study.vc_scales:
                plot_cdf(ax, jcts, f"{title(name)} x{scale:g}", log_x=True)
        ax.set_xscale("log")
        ax.set_xlabel("JCT (s)")
        ax.set_ylabel("CDF of jobs")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
        save_figure(plt, fig, out_dir / "philly_jct_cdf.png")
        section.figures.append(("philly_jct_cdf.png", "Philly: JCT CDF of FIFO and SJF per VC "
                                "scale (log scale)."))
        fifo_q = results[("fifo", heavy)]["per_vc_avg_queue_s"]
        sjf_q = results[("sjf", heavy)]["per_vc_avg_queue_s"]
        top = sorted(fifo_q, key=lambda v: -(fifo_q[v] or 0.0))[:10]
        fig, ax = plt.subplots(figsize=(7, 3.6))
        xs = range(len(top))
        ax.bar([x - 0.2 for x in xs], [(fifo_q[v] or 0) / 3600 for v in top], width=0.4,
               label="FIFO")
        ax.bar([x + 0.2 for x in xs], [(sjf_q.get(v) or 0) / 3600 for v in top], width=0.4,
               label="SJF")
        ax.set_xticks(list(xs))
        ax.set_xticklabels(top, rotation=30, fontsize=7)
        ax.set_ylabel("avg queueing (h)")
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=8)
        save_figure(plt, fig, out_dir / "philly_vc_queue.png")
        section.figures.append(("philly_vc_queue.png", f"Philly: average queueing delay of "
                                f"the ten most-queued VCs at VC scale {heavy:g} (cf. Helios "
                                "Fig. 13)."))
    section.data = {
        "config": asdict(study),
        "paper": HELIOS_PHILLY,
        "workload_notes": workload_notes,
        "window": window_stats,
        "oracle_prediction_error": oracle_error,
        "runs": [dict(policy=n, vc_scale=s, **{k: v for k, v in st.items()})
                 for (n, s), st in results.items()],
        "full_trace": full,
        "full_trace_workload": full_stats,
    }
    section.wall_s = time.monotonic() - started
    return section


STUDY = Study(name="philly", label="Philly", config=PhillyStudy, run=run, tiny=tiny,
              add_options=add_options, apply_options=apply_options)
