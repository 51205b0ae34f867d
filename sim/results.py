"""``trellis-sim report``: the GENIE, Helios (Philly) and SODA (openb) studies, side by side.

Runs the three studies through the real scheduling core, then writes ``results.md`` (every
figure generated from the measured numbers), ``results.json`` (the same tables plus every run's
summary) and PNG plots under ``results/``. Each study's hand-written explanation is read from
``<notes>/<study>.md`` and included verbatim; it may only state numbers that also appear in the
generated text, which :func:`check_notes` enforces.
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from masterd.core.policies import REGISTRY, make_policy
from masterd.core.policy import Policy
from sim.engine import SimConfig, SimResult, simulate
from sim.metrics import mean, percentile, summarise, time_weighted
from sim.oracle import oracle_modeldb, prediction_errors
from sim.partition import simulate_partitioned
from sim.progress import ProgressBar
from sim.tables import Spread, Table, fmt
from sim.truth import NodeTopology, TruthConfig, TruthModel
from sim.workloads import genie, openb, philly
from sim.workloads.base import LoadOptions, Workload

log = logging.getLogger("trellis.sim.results")

STUDIES = ("genie", "philly", "openb")
NOTES_DIR = Path(__file__).resolve().parents[1] / "docs" / "results-notes"

# The papers' own figures, quoted next to ours (never computed here).
GENIE_PAPER = {
    "source": "GENIE §7.2.1 (seeds/genie.md)",
    "qos_improvement_pct": 67.4,
    "makespan_reduction_pct": 28.2,
}
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
SODA_PAPER = {
    "source": "SODA §VI-B and §VI-C (seeds/soda.md); their FIFO and DRF run on KELP",
    "gpu_util_pct": {"fifo": 45.5, "drf": 45.1, "soda-arrays": 65.4},
    "gpu_active_pct": {"fifo": 90.2, "drf": 89.7, "soda-arrays": 76.3},
    "gpu_jobs_queued_over_1min_pct": {"fifo": 57.5, "drf": 49.5},
    "gpu_jobs_not_queued_pct": {"soda-arrays": 88.2},
    "cpu_jobs_within_10s_pct": {"fifo": 90.5, "drf": 90.6},
    "cpu_jobs_within_1min_pct": {"soda-arrays": 91.3},
}

GENIE_BASELINES = ("fifo", "capacity", "min-min", "weighted-fair", "tetris-perf", "tetris-cer")
POLICY_TITLES = {
    "swaf": "SWAF (GENIE)",
    "fifo": "FIFO",
    "capacity": "Capacity",
    "min-min": "Min-Min",
    "weighted-fair": "Weighted Fair",
    "tetris-perf": "Tetris+Perf",
    "tetris-cer": "Tetris+CER",
    "sjf": "SJF",
    "drf": "DRF",
    "soda-arrays": "SODA arrays",
}
# GENIE-family policies: they accept a model database (used for SJF's perfect knowledge).
PREDICTING = frozenset({"swaf", "sjf", "min-min", "weighted-fair", "tetris-perf", "tetris-cer",
                        "capacity"})
QUEUED_THRESHOLD_S = 1.0  # a job "queued" if it waited at least this long (Helios' count)


class ReportError(ValueError):
    """The report cannot be produced as configured (bad option, notes stating numbers...)."""


def title(policy: str) -> str:
    return POLICY_TITLES.get(policy, policy)


# -- configuration ---------------------------------------------------------------------------


@dataclass(frozen=True)
class GenieStudy:
    densities: tuple[float, ...] = (5.0, 10.0, 20.0)
    seeds: tuple[int, ...] = (1, 2, 3)
    hours: float = 24.0
    policies: tuple[str, ...] = ("swaf", *GENIE_BASELINES, "sjf")


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


@dataclass(frozen=True)
class ReportConfig:
    out: Path
    trace_dir: Path
    genie: GenieStudy | None = field(default_factory=GenieStudy)
    philly: PhillyStudy | None = field(default_factory=PhillyStudy)
    openb: OpenbStudy | None = field(default_factory=OpenbStudy)
    notes_dir: Path = NOTES_DIR
    progress: bool = True
    command: str = "trellis-sim report"


def _check_policies(names: Sequence[str], where: str) -> None:
    unknown = [n for n in names if n not in REGISTRY]
    if unknown:
        raise ReportError(f"{where}: unknown policies {', '.join(unknown)}; "
                          f"registered: {', '.join(sorted(REGISTRY))}")


def _day(text: str, what: str) -> float:
    try:
        stamp = datetime.fromisoformat(text)
    except ValueError:
        raise ReportError(f"{what}: {text!r} is not a date (YYYY-MM-DD)") from None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=UTC)
    return stamp.timestamp()


# -- running replays -------------------------------------------------------------------------


@dataclass
class Replay:
    """One replay: its result, its summary and the wall time it took."""

    key: dict[str, Any]
    result: SimResult
    summary: dict[str, Any]
    wall_s: float


def _replay(
    label: str,
    workload: Workload,
    factory: Callable[[], Policy],
    config: SimConfig,
    show: bool,
    partitioned: bool = False,
) -> tuple[SimResult, float]:
    bar = ProgressBar(label) if show else None
    started = time.monotonic()
    if partitioned:
        result = simulate_partitioned(workload, factory, config, bar)
    else:
        result = simulate(workload, factory(), config, bar)
    if bar is not None:
        done = sum(r.state != "unfinished" for r in result.records)
        bar.close(result.end_time, done, len(result.records))
    return result, time.monotonic() - started


def _finished(result: SimResult, gpu: bool | None = None) -> list:
    return [
        r for r in result.records
        if r.state == "finished" and (gpu is None or (r.gpus > 0) == gpu)
    ]


def _queue_stats(records: Sequence, threshold: float = QUEUED_THRESHOLD_S) -> dict[str, Any]:
    delays = [r.queue_delay for r in records if r.queue_delay is not None]
    n = len(delays)
    return {
        "jobs": n,
        "avg_s": mean(delays),
        "p99_s": percentile(delays, 99),
        "queued": sum(d >= threshold for d in delays),
        "over_1min_pct": 100.0 * sum(d > 60 for d in delays) / n if n else None,
        "not_queued_pct": 100.0 * sum(d < threshold for d in delays) / n if n else None,
        "within_10s_pct": 100.0 * sum(d <= 10 for d in delays) / n if n else None,
        "within_1min_pct": 100.0 * sum(d <= 60 for d in delays) / n if n else None,
    }


def _pct_change(ours: float | None, base: float | None, lower_is_better: bool) -> float | None:
    if ours is None or base is None or base == 0:
        return None
    change = (ours - base) / base * 100.0
    return -change if lower_is_better else change


# -- the document ----------------------------------------------------------------------------


@dataclass
class Section:
    study: str
    heading: str
    parts: list[str | Table] = field(default_factory=list)
    figures: list[tuple[str, str]] = field(default_factory=list)  # (file name, caption)
    data: dict[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0

    def text(self, line: str) -> None:
        self.parts.append(line)

    def table(self, table: Table) -> Table:
        self.parts.append(table)
        return table

    def generated_markdown(self) -> str:
        out = []
        for part in self.parts:
            out.append(part.markdown() if isinstance(part, Table) else part)
        for name, caption in self.figures:
            out.append(f"![{caption}](results/{name})\n*{caption}*")
        return "\n\n".join(out)

    def tables(self) -> list[Table]:
        return [p for p in self.parts if isinstance(p, Table)]


_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?")


def numbers_in(text: str) -> set[str]:
    return set(_NUMBER.findall(text))


def check_notes(notes: str, generated: str, where: str) -> None:
    """Hand-written notes may only repeat numbers the generated text states."""
    stray = sorted(numbers_in(notes) - numbers_in(generated))
    if stray:
        raise ReportError(
            f"{where} states number(s) {', '.join(stray)} that the generated tables do not; "
            "refer to the tables instead"
        )


def read_notes(notes_dir: Path, study: str) -> str:
    path = notes_dir / f"{study}.md"
    try:
        return path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ReportError(f"cannot read the explanation of study {study}: {path}: "
                          f"{exc.strerror}") from None


# -- plots -----------------------------------------------------------------------------------


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.warning("plots_skipped reason=matplotlib_not_installed")
        return None
    return plt


def _save(plt: Any, fig: Any, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=72)
    plt.close(fig)


def _cdf(ax: Any, values: Sequence[float], label: str, log_x: bool = False) -> None:
    xs = sorted(values)
    if not xs:
        return
    if log_x:
        xs = [max(x, 1.0) for x in xs]
    ys = [(i + 1) / len(xs) for i in range(len(xs))]
    step = max(1, len(xs) // 400)  # a few hundred points draw the same curve, smaller PNG
    ax.plot([*xs[::step], xs[-1]], [*ys[::step], 1.0], label=label, linewidth=1.2)


# -- study 1: GENIE --------------------------------------------------------------------------


def run_genie(study: GenieStudy, out_dir: Path, show: bool) -> Section:
    _check_policies(study.policies, "genie policies")
    if "swaf" not in study.policies:
        raise ReportError("the GENIE study compares SWAF against baselines: include swaf")
    section = Section("genie", "1. GENIE workload (GENIE §7.1–7.2, Fig. 13)")
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
                result, wall = _replay(f"genie d{density:g} {name} s{seed}", workload,
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

    plt = _pyplot()
    if plt is not None:
        _genie_plots(plt, study, runs, out_dir, section)
    section.data = {
        "config": asdict(study),
        "paper": GENIE_PAPER,
        "runs": [dict(r.key, wall_s=r.wall_s, summary=r.summary)
                 for group in runs.values() for r in group],
    }
    section.wall_s = time.monotonic() - started
    return section


def _genie_plots(plt: Any, study: GenieStudy, runs: dict, out_dir: Path,
                 section: Section) -> None:
    densities = list(study.densities)
    fig, axes = plt.subplots(1, len(densities), figsize=(4 * len(densities), 3.4), squeeze=False)
    for ax, density in zip(axes[0], densities, strict=True):
        for name in study.policies:
            jcts = [r.jct / 3600 for rep in runs[(density, name)] for r in _finished(rep.result)
                    if r.jct is not None]
            _cdf(ax, jcts, title(name))
        ax.set_title(f"{density:g} tasks/h (all seeds)", fontsize=9)
        ax.set_xlabel("JCT (h)")
        ax.grid(True, alpha=0.3)
    axes[0][0].set_ylabel("CDF of tasks")
    axes[0][-1].legend(fontsize=7)
    _save(plt, fig, out_dir / "genie_jct_cdf.png")
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
    _save(plt, fig, out_dir / "genie_qos_makespan.png")
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
    _save(plt, fig, out_dir / "genie_gpu_util.png")
    section.figures.append(("genie_gpu_util.png", f"GENIE workload: GPU utilisation over time "
                            f"at {density:g} tasks/h, seed {seed} (GPUs weighted by the "
                            "share of linear scaling they deliver)."))


# -- study 2: Philly -------------------------------------------------------------------------


def _philly_stats(result: SimResult) -> dict[str, Any]:
    done = _finished(result)
    q = _queue_stats(done)
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


def run_philly(study: PhillyStudy, trace_dir: Path, out_dir: Path, show: bool) -> Section:
    policies = list(dict.fromkeys([*study.policies, *study.other_policies]))
    _check_policies(policies, "philly policies")
    for needed in ("fifo", "sjf"):
        if needed not in study.policies:
            raise ReportError(f"the Philly study compares FIFO and SJF: include {needed}")
    if not study.vc_scales:
        raise ReportError("philly: give at least one VC scale")
    since, until = _day(study.since, "philly since"), _day(study.until, "philly until")
    section = Section("philly", "2. Philly trace (Helios §4.2.3, Table 3)")
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
            result, wall = _replay(f"philly x{scale:g} {name}", workload, factory(name), config,
                                   show, partitioned=True)
            stats = _philly_stats(result)
            stats["wall_s"] = wall
            results[(name, scale)] = stats
            curves[(name, scale)] = [r.jct for r in _finished(result) if r.jct is not None]
    full: dict[str, dict[str, Any]] = {}
    full_stats: dict[str, Any] = {}
    if study.full_trace_pair:
        workload = philly.load(trace_dir, options, truth, per_vc=True)
        workload_notes["full"] = workload.notes
        durations = [j.truth.known_duration or 0.0 for j in workload.jobs]
        full_stats = {"jobs": len(workload.jobs), "avg_duration_s": mean(durations),
                      "avg_gpus": mean([float(j.spec.gpus) for j in workload.jobs])}
        for name in ("fifo", "sjf"):
            result, wall = _replay(f"philly full {name}", workload, factory(name), config,
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

    plt = _pyplot()
    if plt is not None:
        heavy = min(study.vc_scales)
        fig, ax = plt.subplots(figsize=(6.5, 3.8))
        for (name, scale), jcts in curves.items():
            if name in ("fifo", "sjf") and scale in study.vc_scales:
                _cdf(ax, jcts, f"{title(name)} x{scale:g}", log_x=True)
        ax.set_xscale("log")
        ax.set_xlabel("JCT (s)")
        ax.set_ylabel("CDF of jobs")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
        _save(plt, fig, out_dir / "philly_jct_cdf.png")
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
        _save(plt, fig, out_dir / "philly_vc_queue.png")
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


# -- study 3: openb --------------------------------------------------------------------------


def _window_rate(result: SimResult, start: float, end: float, effective: bool) -> float | None:
    if not result.total_gpus:
        return None
    series = [(t, e if effective else a) for t, a, e in result.usage]
    value = time_weighted(series, start, end)
    return None if value is None else 100.0 * value / result.total_gpus


def run_openb(study: OpenbStudy, trace_dir: Path, out_dir: Path, show: bool) -> Section:
    _check_policies(study.policies, "openb policies")
    section = Section("openb", "3. openb trace (SODA §VI)")
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
        result, wall = _replay(f"openb {name}", workload,
                               lambda name=name: make_policy(name, **options.get(name, {})),
                               config, show)
        results[name] = result
        gpu = _queue_stats(_finished(result, gpu=True))
        cpu = _queue_stats(_finished(result, gpu=False))
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

    plt = _pyplot()
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
        _save(plt, fig, out_dir / "openb_gpu_util.png")
        section.figures.append(("openb_gpu_util.png", "openb: GPU active and utilised share "
                                "over the arrival window (cf. SODA Figs. 12–13)."))
        fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.6))
        for name, result in results.items():
            for ax, gpu in ((left, True), (right, False)):
                delays = [r.queue_delay for r in _finished(result, gpu=gpu)
                          if r.queue_delay is not None]
                _cdf(ax, delays, title(name), log_x=True)
        for ax, what in ((left, "GPU jobs"), (right, "CPU jobs")):
            ax.set_xscale("log")
            ax.set_xlabel("queueing delay (s; < 1 s drawn at 1 s)")
            ax.set_title(what, fontsize=9)
            ax.grid(True, alpha=0.3)
        left.set_ylabel("CDF")
        right.legend(fontsize=7)
        _save(plt, fig, out_dir / "openb_queue_cdf.png")
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


# -- the report ------------------------------------------------------------------------------


def render(sections: Sequence[Section], config: ReportConfig,
           notes: dict[str, str]) -> str:
    total = sum(s.wall_s for s in sections)
    head = [
        "# Reproducing the papers, side by side",
        "",
        "<!-- Generated by `trellis-sim report`; do not edit. Explanations live in "
        "docs/results-notes/. -->",
        "",
        f"Generated by `{config.command}`: every replay drives the master's own scheduling "
        "core (`masterd.core`) with the simulator's virtual clock (docs/simulator.md). All "
        "numbers below are measured by this run, except the columns that quote a paper. "
        f"The replays took {fmt(total / 60, '{:.1f}')} min on the machine that generated this "
        "page; the tables are also in `results/results.json`.",
    ]
    body = ["\n".join(head)]
    for section in sections:
        generated = section.generated_markdown()
        body.append(f"## {section.heading}\n\n{generated}\n\n### Why (hand-written)\n\n"
                    f"{notes[section.study]}")
    return "\n\n".join(body) + "\n"


def run_report(config: ReportConfig) -> list[Path]:
    """Run the configured studies and write results.md, results/results.json and plots."""
    figures = config.out / "results"
    figures.mkdir(parents=True, exist_ok=True)
    chosen = [s for s in STUDIES if getattr(config, s) is not None]
    if not chosen:
        raise ReportError("no study selected")
    notes = {s: read_notes(config.notes_dir, s) for s in chosen}  # fail before hours of work
    sections: list[Section] = []
    if config.genie is not None:
        sections.append(run_genie(config.genie, figures, config.progress))
    if config.philly is not None:
        sections.append(run_philly(config.philly, config.trace_dir, figures, config.progress))
    if config.openb is not None:
        sections.append(run_openb(config.openb, config.trace_dir, figures, config.progress))
    for section in sections:
        check_notes(notes[section.study], f"{section.heading}\n{section.generated_markdown()}",
                    str(config.notes_dir / f"{section.study}.md"))
    markdown = render(sections, config, notes)
    written = []
    path = config.out / "results.md"
    path.write_text(markdown, encoding="utf-8")
    written.append(path)
    document = {
        "command": config.command,
        "studies": {
            s.study: {
                "heading": s.heading,
                "wall_s": s.wall_s,
                "tables": [t.to_json() for t in s.tables()],
                "figures": [name for name, _ in s.figures],
                "data": s.data,
            }
            for s in sections
        },
    }
    path = figures / "results.json"
    path.write_text(json.dumps(document, indent=1, sort_keys=True, default=_json_default) + "\n")
    written.append(path)
    written += [figures / name for s in sections for name, _ in s.figures]
    return written


def _json_default(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, tuple | set | frozenset):
        return list(value)
    return str(value)


def tiny_config(out: Path, trace_dir: Path, notes_dir: Path = NOTES_DIR) -> ReportConfig:
    """A configuration that runs in seconds (for tests and a quick look)."""
    return ReportConfig(
        out=out,
        trace_dir=trace_dir,
        genie=GenieStudy(densities=(5.0, 20.0), seeds=(1, 2), hours=2.0,
                         policies=("swaf", "fifo", "tetris-cer", "sjf")),
        philly=replace(PhillyStudy(), vc_scales=(1.0, 0.5), other_policies=("drf",),
                       other_scale=0.5),
        openb=replace(OpenbStudy(), since_day=0.0, arrival_scale=1.0, node_stride=1),
        notes_dir=notes_dir,
        progress=False,
        command="trellis-sim report --tiny",
    )
