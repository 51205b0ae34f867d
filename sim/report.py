"""Side-by-side comparison tables, JSON/CSV files and PNG plots of a set of replays."""

from __future__ import annotations

import csv
import json
import logging
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sim.engine import SimResult
from sim.metrics import summarise

log = logging.getLogger("trellis.sim.report")


@dataclass
class Run:
    label: str  # workload label, e.g. "genie-d10" or "philly"
    density: float | None
    result: SimResult
    summary: dict[str, Any]


def make_run(label: str, density: float | None, result: SimResult) -> Run:
    summary = summarise(result)
    summary["label"] = label
    summary["density"] = density
    return Run(label, density, result, summary)


# (row title, summary key, scale, format)
TABLE_ROWS: tuple[tuple[str, str, float, str], ...] = (
    ("jobs", "jobs", 1, "{:.0f}"),
    ("finished", "finished", 1, "{:.0f}"),
    ("rejected (never fit)", "rejected", 1, "{:.0f}"),
    ("unfinished", "unfinished", 1, "{:.0f}"),
    ("QoS guarantee % (Eq.14)", "qos_pct", 1, "{:.1f}"),
    ("makespan h", "makespan_s", 1 / 3600, "{:.2f}"),
    ("avg norm. latency (Eq.15)", "avg_norm_latency", 1, "{:.3f}"),
    ("avg slowdown (JCT/Lat11)", "avg_slowdown", 1, "{:.2f}"),
    ("avg JCT h", "avg_jct_s", 1 / 3600, "{:.3f}"),
    ("p99 JCT h", "p99_jct_s", 1 / 3600, "{:.2f}"),
    ("avg queueing h", "avg_queue_s", 1 / 3600, "{:.3f}"),
    ("p99 queueing h", "p99_queue_s", 1 / 3600, "{:.2f}"),
    ("queued jobs (waited >= 1 s)", "queued_jobs", 1, "{:.0f}"),
    ("avg JCT s", "avg_jct_s", 1, "{:.0f}"),
    ("avg queueing s", "avg_queue_s", 1, "{:.0f}"),
    ("node utilisation % (arrivals)", "node_utilisation", 100, "{:.1f}"),
    ("GPU active %", "gpu_active_rate", 100, "{:.1f}"),
    ("GPU utilisation %", "gpu_utilisation", 100, "{:.1f}"),
    ("fragmentation (SCHED2 Eq.1)", "fragmentation", 1, "{:.3f}"),
    ("preemptions", "preemptions", 1, "{:.0f}"),
    ("failure retries", "retries", 1, "{:.0f}"),
)


def aggregate(runs: Sequence[Run]) -> dict[tuple[str, str], dict[str, Any]]:
    """Mean over seeds of every numeric summary field, per (label, policy)."""
    groups: dict[tuple[str, str], list[Run]] = defaultdict(list)
    for run in runs:
        groups[(run.label, run.summary["policy"])].append(run)
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for key, members in groups.items():
        merged: dict[str, Any] = {"seeds": [m.summary["seed"] for m in members]}
        for _, field, _, _ in TABLE_ROWS:
            values = [m.summary[field] for m in members if m.summary[field] is not None]
            merged[field] = math.fsum(values) / len(values) if values else None
        merged["density"] = members[0].density
        out[key] = merged
    return out


def comparison_table(runs: Sequence[Run]) -> str:
    agg = aggregate(runs)
    labels = list(dict.fromkeys(r.label for r in runs))
    policies = list(dict.fromkeys(r.summary["policy"] for r in runs))
    blocks = []
    for label in labels:
        seeds = sorted({r.summary["seed"] for r in runs if r.label == label})
        head = f"{label}  (mean of seeds {','.join(map(str, seeds))})"
        title_w = max(len(t) for t, *_ in TABLE_ROWS)
        col_w = max(10, *(len(p) for p in policies))
        lines = [head, " " * title_w + "  " + "  ".join(p.rjust(col_w) for p in policies)]
        for title, field, scale, fmt in TABLE_ROWS:
            cells = []
            for policy in policies:
                value = agg.get((label, policy), {}).get(field)
                cells.append(("-" if value is None else fmt.format(value * scale)).rjust(col_w))
            lines.append(title.ljust(title_w) + "  " + "  ".join(cells))
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def write_outputs(
    runs: Sequence[Run], out: Path, notes: dict[str, Any], job_csv: bool = False
) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    agg = aggregate(runs)
    document = {
        "runs": [r.summary for r in runs],
        "mean_over_seeds": [
            {"label": label, "policy": policy, **values}
            for (label, policy), values in agg.items()
        ],
        "notes": notes,
    }
    path = out / "summary.json"
    path.write_text(json.dumps(document, indent=2, sort_keys=True, default=str) + "\n")
    written.append(path)
    flat_fields = ["label", "density", "policy", "seed"] + [f for _, f, _, _ in TABLE_ROWS] + [
        "events", "passes", "end_time_s",
    ]
    path = out / "runs.csv"
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=flat_fields, extrasaction="ignore")
        writer.writeheader()
        for run in runs:
            writer.writerow({k: run.summary.get(k) for k in flat_fields})
    written.append(path)
    path = out / "queue_by_tenant.csv"
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["label", "policy", "seed", "tenant", "jobs", "avg_queue_s", "p99_queue_s"])
        for run in runs:
            for tenant, stats in run.summary["queue_by_tenant"].items():
                writer.writerow([run.label, run.summary["policy"], run.summary["seed"], tenant,
                                 stats["jobs"], stats["avg_queue_s"], stats["p99_queue_s"]])
    written.append(path)
    path = out / "timeseries.csv"
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["label", "policy", "seed", "time_s", "gpus_active", "gpus_utilised",
                         "total_gpus", "queued", "running", "fragmentation", "nodes_down"])
        for run in runs:
            for smp in run.result.samples:
                writer.writerow([run.label, run.summary["policy"], run.summary["seed"],
                                 smp.time, smp.allocated_gpus, smp.effective_gpus,
                                 run.result.total_gpus, smp.queued, smp.running,
                                 smp.fragmentation, smp.nodes_down])
    written.append(path)
    if job_csv:
        for run in runs:
            path = out / f"jobs-{run.label}-{run.summary['policy']}-s{run.summary['seed']}.csv"
            with path.open("w", newline="") as handle:
                writer = csv.writer(handle)
                writer.writerow(["id", "tenant", "qos", "kind", "gpus", "submit", "first_start",
                                 "end", "state", "jct", "queue_delay", "run_time", "ect",
                                 "lat11", "gpus_used", "nodes_used", "preemptions",
                                 "retries", "reason"])
                for r in run.result.records:
                    writer.writerow([r.id, r.tenant, r.qos.value, r.kind.value, r.gpus,
                                     r.submit, r.first_start, r.end, r.state, r.jct,
                                     r.queue_delay, r.run_time, r.ect, r.lat11, r.gpus_used,
                                     r.nodes_used, r.preemptions, r.retries, r.reason])
            written.append(path)
    return written


def write_plots(runs: Sequence[Run], out: Path) -> list[Path]:
    """PNG plots if matplotlib is importable; returns the files written (none without it)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.warning("plots_skipped reason=matplotlib_not_installed")
        return []
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    labels = list(dict.fromkeys(r.label for r in runs))
    policies = list(dict.fromkeys(r.summary["policy"] for r in runs))
    for label in labels:
        fig, ax = plt.subplots(figsize=(6, 4))
        for policy in policies:
            jcts = sorted(
                rec.jct / 3600 for run in runs
                if run.label == label and run.summary["policy"] == policy
                for rec in run.result.records if rec.jct is not None and rec.state == "finished"
            )
            if jcts:
                ys = [(i + 1) / len(jcts) for i in range(len(jcts))]
                ax.step(jcts, ys, where="post", label=policy)
        ax.set_xscale("log")
        ax.set_xlabel("job completion time (h)")
        ax.set_ylabel("CDF")
        ax.set_title(f"JCT CDF — {label}")
        ax.grid(True, alpha=0.3)
        ax.legend()
        path = out / f"jct_cdf_{label}.png"
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)

        fig, ax = plt.subplots(figsize=(7, 4))
        for policy in policies:
            first = next(
                (r for r in runs if r.label == label and r.summary["policy"] == policy), None
            )
            if first is None or not first.result.total_gpus:
                continue
            total = first.result.total_gpus
            xs = [s.time / 3600 for s in first.result.samples]
            ax.plot(xs, [100 * s.allocated_gpus / total for s in first.result.samples],
                    label=f"{policy} active", linewidth=1)
            ax.plot(xs, [100 * s.effective_gpus / total for s in first.result.samples],
                    label=f"{policy} utilised", linewidth=1, linestyle="--")
        ax.set_xlabel("time (h)")
        ax.set_ylabel("% of GPUs")
        ax.set_title(f"GPU utilisation over time — {label} (first seed)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
        path = out / f"gpu_util_{label}.png"
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)

    densities = sorted({r.density for r in runs if r.density is not None})
    if len(densities) > 1:
        agg = aggregate(runs)
        fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
        for policy in policies:
            points = sorted(
                (values["density"], values["qos_pct"], values["makespan_s"])
                for (label, p), values in agg.items()
                if p == policy and values["density"] is not None
            )
            xs = [d for d, _, _ in points]
            left.plot(xs, [q if q is not None else math.nan for _, q, _ in points],
                      marker="o", label=policy)
            right.plot(xs, [m / 3600 if m is not None else math.nan for _, _, m in points],
                       marker="o", label=policy)
        left.set_xlabel("arrival density (jobs/h)")
        left.set_ylabel("QoS guarantee %")
        right.set_xlabel("arrival density (jobs/h)")
        right.set_ylabel("makespan (h)")
        for ax in (left, right):
            ax.grid(True, alpha=0.3)
            ax.legend()
        path = out / "qos_makespan_by_density.png"
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written
