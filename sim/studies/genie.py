"""Study 1: the GENIE workload (GENIE §7.1–7.2, Fig. 13).

SWAF against the paper's baselines (and SJF for reference) on GENIE's synthetic workload,
over arrival densities and seeds; QoS guarantee (Eq. 14), makespan, normalised latency.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from masterd.core.policies import make_policy
from sim.engine import SimConfig
from sim.metrics import summarise
from sim.studies.common import (
    Replay,
    ReportError,
    Section,
    Study,
    check_policies,
    csv_list,
    finished,
    plot_cdf,
    pyplot,
    replay,
    save_figure,
    title,
)
from sim.tables import Spread, Table, fmt
from sim.workloads import genie

# The paper's own figures, quoted next to ours (never computed here).
GENIE_PAPER = {
    "source": "GENIE §7.2.1 (seeds/genie.md)",
    "qos_improvement_pct": 67.4,
    "makespan_reduction_pct": 28.2,
}

GENIE_BASELINES = ("fifo", "capacity", "min-min", "weighted-fair", "tetris-perf", "tetris-cer")


@dataclass(frozen=True)
class GenieStudy:
    densities: tuple[float, ...] = (5.0, 10.0, 20.0)
    seeds: tuple[int, ...] = (1, 2, 3)
    hours: float = 24.0
    policies: tuple[str, ...] = ("swaf", *GENIE_BASELINES, "sjf")


def tiny() -> GenieStudy:
    return GenieStudy(densities=(5.0, 20.0), seeds=(1, 2), hours=2.0,
                      policies=("swaf", "fifo", "tetris-cer", "sjf"))


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--genie-seeds", help="comma-separated seeds (default 1,2,3)")
    parser.add_argument("--genie-densities", help="comma-separated tasks/hour (default 5,10,20)")


def apply_options(study: GenieStudy, args: argparse.Namespace) -> GenieStudy:
    if args.genie_seeds:
        study = replace(study, seeds=tuple(csv_list(args.genie_seeds, int, "--genie-seeds")))
    if args.genie_densities:
        study = replace(study, densities=tuple(
            csv_list(args.genie_densities, float, "--genie-densities")))
    return study


def _pct_change(ours: float | None, base: float | None, lower_is_better: bool) -> float | None:
    if ours is None or base is None or base == 0:
        return None
    change = (ours - base) / base * 100.0
    return -change if lower_is_better else change


def run(study: GenieStudy, trace_dir: Path, out_dir: Path, show: bool) -> Section:
    """Replay the synthetic GENIE workload (``trace_dir`` is not used)."""
    check_policies(study.policies, "genie policies")
    if "swaf" not in study.policies:
        raise ReportError("the GENIE study compares SWAF against baselines: include swaf")
    section = Section("genie", "GENIE workload (GENIE §7.1–7.2, Fig. 13)")
    started = time.monotonic()
    runs: dict[tuple[float, str], list[Replay]] = {}
    jobs_per: dict[float, list[int]] = {}
    platform = ""
    for density in study.densities:
        for seed in study.seeds:
            workload = genie.generate(
                genie.GenieOptions(density=density, hours=study.hours, seed=seed)
            )
            platform = str(workload.notes.get("platform", ""))
            jobs_per.setdefault(density, []).append(len(workload.jobs))
            config = SimConfig(seed=seed)
            for name in study.policies:
                result, wall = replay(f"genie d{density:g} {name} s{seed}", workload,
                                      lambda name=name: make_policy(name), config, show)
                summary = summarise(result)
                runs.setdefault((density, name), []).append(
                    Replay({"density": density, "seed": seed, "policy": name}, result,
                           summary, wall)
                )

    def spread(density: float, name: str, key: str, scale: float = 1.0) -> Spread | None:
        values = [r.summary[key] for r in runs[(density, name)] if r.summary[key] is not None]
        return Spread.of([v * scale for v in values])

    seeds = ", ".join(map(str, study.seeds))
    section.text(
        f"**Setup (generated).** GENIE's platform ({platform} GPUs, Table 1), Poisson arrivals "
        f"at {', '.join(f'{d:g}' for d in study.densities)} tasks/h over {study.hours:g} h, "
        f"seeds {seeds}; tasks per seed: "
        + "; ".join(f"density {d:g}: {fmt(Spread.of(v), '{:.0f}')}" for d, v in jobs_per.items())
        + ". Every policy runs unchanged from `masterd.core.policies`; SWAF and the "
        "prediction-based baselines use GENIE's own model database (not the simulator's "
        "truth). Each cell is the mean over the seeds with (min–max) when they differ. QoS "
        "guarantee: Eq. 14, tasks done by their ECT; normalised latency: Eq. 15–16 (walltime "
        "from first start over the single-GPU latency); SJF is shown for reference and is not "
        "a baseline of the paper."
    )
    main = section.table(Table(
        "genie-main",
        ["density (tasks/h)", "policy", "QoS guarantee %", "makespan h", "avg norm. latency",
         "avg JCT h", "GPU utilisation %"],
        ["{:g}", "{}", "{:.1f}", "{:.1f}", "{:.3f}", "{:.2f}", "{:.1f}"],
        caption="Mean over seeds (min–max).",
    ))
    for density in study.densities:
        for name in study.policies:
            main.add(density, title(name), spread(density, name, "qos_pct"),
                     spread(density, name, "makespan_s", 1 / 3600),
                     spread(density, name, "avg_norm_latency"),
                     spread(density, name, "avg_jct_s", 1 / 3600),
                     spread(density, name, "gpu_utilisation", 100))

    baselines = [p for p in study.policies if p in GENIE_BASELINES]
    versus = section.table(Table(
        "genie-vs-best",
        ["density (tasks/h)", "best baseline (QoS)", "its QoS %", "SWAF QoS %",
         "QoS change %", "best baseline (makespan)", "its makespan h", "SWAF makespan h",
         "makespan reduction %"],
        ["{:g}", "{}", "{:.1f}", "{:.1f}", "{:+.1f}", "{}", "{:.1f}", "{:.1f}", "{:+.1f}"],
        caption="GENIE against the best baseline at each density, on means over seeds, as "
                "the paper reports it: relative change of the QoS-guarantee percentage and "
                "relative reduction of the makespan (positive = SWAF better).",
    ))
    qos_changes: list[float] = []
    makespan_changes: list[float] = []
    for density in study.densities:
        means = {n: (spread(density, n, "qos_pct"), spread(density, n, "makespan_s", 1 / 3600))
                 for n in study.policies}
        ours_q, ours_m = means["swaf"]
        with_q = [n for n in baselines if means[n][0] is not None]
        with_m = [n for n in baselines if means[n][1] is not None]
        best_q = max(with_q, key=lambda n: means[n][0].mean) if with_q else None  # type: ignore[union-attr]
        best_m = min(with_m, key=lambda n: means[n][1].mean) if with_m else None  # type: ignore[union-attr]
        bq = means[best_q][0].mean if best_q else None  # type: ignore[union-attr]
        bm = means[best_m][1].mean if best_m else None  # type: ignore[union-attr]
        dq = _pct_change(ours_q.mean if ours_q else None, bq, lower_is_better=False)
        dm = _pct_change(ours_m.mean if ours_m else None, bm, lower_is_better=True)
        if dq is not None:
            qos_changes.append(dq)
        if dm is not None:
            makespan_changes.append(dm)
        versus.add(density, title(best_q) if best_q else None, bq,
                   ours_q.mean if ours_q else None, dq, title(best_m) if best_m else None, bm,
                   ours_m.mean if ours_m else None, dm)
    headline = section.table(Table(
        "genie-headline",
        ["GENIE vs best baseline", "ours (best over densities)", "ours (worst)",
         "paper (up to)"],
        ["{}", "{:+.1f}", "{:+.1f}", "{:+.1f}"],
        caption=f"Paper: {GENIE_PAPER['source']}.",
    ))
    headline.add("QoS-guarantee % change", max(qos_changes, default=None),
                 min(qos_changes, default=None), GENIE_PAPER["qos_improvement_pct"])
    headline.add("makespan reduction %", max(makespan_changes, default=None),
                 min(makespan_changes, default=None), GENIE_PAPER["makespan_reduction_pct"])

    # Generated findings: which policy leads each metric at each density.
    lines = []
    for density in study.densities:
        qos = {n: spread(density, n, "qos_pct") for n in study.policies}
        mk = {n: spread(density, n, "makespan_s", 1 / 3600) for n in study.policies}
        top_q = max((n for n in qos if qos[n]), key=lambda n: qos[n].mean, default=None)  # type: ignore[union-attr]
        top_m = min((n for n in mk if mk[n]), key=lambda n: mk[n].mean, default=None)  # type: ignore[union-attr]
        lines.append(
            f"- density {density:g}: highest QoS guarantee {title(top_q) if top_q else 'n/a'} "
            f"({fmt(qos[top_q].mean if top_q else None)} %), shortest makespan "  # type: ignore[union-attr]
            f"{title(top_m) if top_m else 'n/a'} ({fmt(mk[top_m].mean if top_m else None)} h)."  # type: ignore[union-attr]
        )
    section.text("**Who leads (generated, all policies including SJF).**\n\n" + "\n".join(lines))

    plt = pyplot()
    if plt is not None:
        _plots(plt, study, runs, out_dir, section)
    section.data = {
        "config": asdict(study),
        "paper": GENIE_PAPER,
        "runs": [dict(r.key, wall_s=r.wall_s, summary=r.summary)
                 for group in runs.values() for r in group],
    }
    section.wall_s = time.monotonic() - started
    return section


def _plots(plt: Any, study: GenieStudy, runs: dict, out_dir: Path, section: Section) -> None:
    densities = list(study.densities)
    fig, axes = plt.subplots(1, len(densities), figsize=(4 * len(densities), 3.4), squeeze=False)
    for ax, density in zip(axes[0], densities, strict=True):
        for name in study.policies:
            jcts = [r.jct / 3600 for rep in runs[(density, name)] for r in finished(rep.result)
                    if r.jct is not None]
            plot_cdf(ax, jcts, title(name))
        ax.set_title(f"{density:g} tasks/h (all seeds)", fontsize=9)
        ax.set_xlabel("JCT (h)")
        ax.grid(True, alpha=0.3)
    axes[0][0].set_ylabel("CDF of tasks")
    axes[0][-1].legend(fontsize=7)
    save_figure(plt, fig, out_dir / "genie_jct_cdf.png")
    section.figures.append(("genie_jct_cdf.png", "GENIE workload: JCT CDF per policy and "
                                                  "arrival density (all seeds pooled)."))

    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.6))
    for name in study.policies:
        for ax, key, scale in ((left, "qos_pct", 1.0), (right, "makespan_s", 1 / 3600)):
            pts = []
            for density in densities:
                vals = [r.summary[key] * scale for r in runs[(density, name)]
                        if r.summary[key] is not None]
                if vals:
                    s = Spread.of(vals)
                    pts.append((density, s.mean, s.mean - s.low, s.high - s.mean))  # type: ignore[union-attr]
            if pts:
                ax.errorbar([p[0] for p in pts], [p[1] for p in pts],
                            yerr=[[p[2] for p in pts], [p[3] for p in pts]], marker="o",
                            capsize=2, label=title(name), linewidth=1)
    left.set_ylabel("QoS guarantee % (Eq. 14)")
    right.set_ylabel("makespan (h)")
    for ax in (left, right):
        ax.set_xlabel("arrival density (tasks/h)")
        ax.grid(True, alpha=0.3)
    right.legend(fontsize=7)
    save_figure(plt, fig, out_dir / "genie_qos_makespan.png")
    section.figures.append(("genie_qos_makespan.png", "GENIE workload: QoS guarantee and "
                            "makespan per arrival density (mean, bars: min–max over seeds)."))

    density = max(densities)
    seed = study.seeds[0]
    fig, ax = plt.subplots(figsize=(8, 3.6))
    for name in study.policies:
        rep = next(r for r in runs[(density, name)] if r.key["seed"] == seed)
        total = rep.result.total_gpus or 1
        ax.plot([s.time / 3600 for s in rep.result.samples],
                [100 * s.effective_gpus / total for s in rep.result.samples],
                label=title(name), linewidth=1)
    ax.set_xlabel("time (h)")
    ax.set_ylabel("GPU utilisation %")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    save_figure(plt, fig, out_dir / "genie_gpu_util.png")
    section.figures.append(("genie_gpu_util.png", f"GENIE workload: GPU utilisation over time "
                            f"at {density:g} tasks/h, seed {seed} (GPUs weighted by the "
                            "share of linear scaling they deliver)."))


STUDY = Study(name="genie", label="GENIE", config=GenieStudy, run=run, tiny=tiny,
              add_options=add_options, apply_options=apply_options)
