"""Study 1: the GENIE workload (GENIE §7.1–7.2, Fig. 13, Fig. 15), set up as the paper sets it.

SWAF against the paper's baselines (and SJF for reference) on GENIE's synthetic workload:

- placements: the policies that choose placements from the model (SWAF, Tetris+CER,
  Tetris+Perf) consider every placement within the platform (``shape_mode="any"``,
  Algorithm 1 line 3); the black-box baselines place tasks as asked. The ``cap`` mode (at most
  the GPUs a task asked for, the live master's default) is replayed beside it;
- the model database comes from the project's own lightweight profiler run against the
  simulated platform before each seed's replays (``sim.genie_profile``); its accuracy over the
  replayed tasks is reported in Fig. 15's form;
- QoS guarantee per class (urgent / prior / normal), interference on and off;
- densities × two task-length mixes × seeds; SWAF with ``late_tasks="defer"`` beside the
  paper's SWAF and SJF at the densities where overload sets in.

Every replay is one seeded task for a :class:`~sim.parallel.Runner`: serial or on Dask, the
numbers are the same.
"""

from __future__ import annotations

import argparse
import math
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from masterd.core.genie.modeldb import ModelDB
from masterd.core.policies import make_policy
from masterd.core.policy import Policy
from sim.engine import SimConfig, simulate
from sim.genie_profile import (
    CampaignRecord,
    TaskLatency,
    profile_platform,
    replayed_latencies,
)
from sim.metrics import percentile, summarise
from sim.parallel import Runner, SerialRunner
from sim.studies.common import (
    ReportError,
    Section,
    Study,
    check_policies,
    csv_list,
    plot_cdf,
    pyplot,
    save_figure,
    title,
)
from sim.tables import Spread, Table, fmt
from sim.truth import TruthConfig, TruthModel
from sim.workloads import genie
from sim.workloads.assign import BATCHES

# The paper's own figures, quoted next to ours (never computed here).
GENIE_PAPER = {
    "source": "GENIE §7.2.1, §7.2.3 (seeds/genie.md)",
    "qos_improvement_pct": 67.4,
    "makespan_reduction_pct": 28.2,
    "prediction_error_mean_pct": 5.0,  # "less than 5%" (§5.1.5, Fig. 8)
    "prediction_error_p95_pct": 11.0,  # "< 11%" at density 20 (Fig. 15)
}

GENIE_BASELINES = ("fifo", "capacity", "min-min", "weighted-fair", "tetris-perf", "tetris-cer")
# Policies that choose a task's placement from the prediction model.
MODEL_PLACED = frozenset({"swaf", "tetris-perf", "tetris-cer"})
# Policies that take a model database (ECTs, latencies, CER).
WITH_MODELDB = frozenset({"swaf", "sjf", "min-min", "weighted-fair", "tetris-perf",
                          "tetris-cer"})
DEFER = "swaf-defer"  # SWAF with late_tasks="defer" (beyond the paper)
# Ablations of two of the paper's rules, each beside the paper's row:
URGENT_FASTEST = "swaf-urgent-fastest"  # urgent tasks on their fastest placement, not line 13's
CAPACITY_LEND = "capacity-lend"  # Capacity lending idle GPUs (and reclaiming them)
VARIANT_LABELS = {"defer": DEFER, "urgent-fastest": URGENT_FASTEST, "lend": CAPACITY_LEND}
LABEL_POLICY = {DEFER: "swaf", URGENT_FASTEST: "swaf", CAPACITY_LEND: "capacity"}
LABEL_TITLES = {
    DEFER: "SWAF, late tasks deferred",
    URGENT_FASTEST: "SWAF, urgent on fastest (ablation)",
    CAPACITY_LEND: "Capacity, lending (ablation)",
}
CLASSES = ("urgent", "prior", "normal")


@dataclass(frozen=True)
class GenieStudy:
    densities: tuple[float, ...] = (5.0, 10.0, 20.0, 40.0)
    seeds: tuple[int, ...] = (1, 2, 3, 4, 5)
    hours: float = 24.0
    lengths: tuple[str, ...] = genie.LENGTHS  # today's mix and GENIE's hours-to-weeks tasks
    policies: tuple[str, ...] = ("swaf", *GENIE_BASELINES, "sjf")
    defer_densities: tuple[float, ...] = (20.0, 40.0)  # where SWAF-defer is replayed
    compare_cap: bool = True  # model-placed policies also under shape_mode="cap"
    compare_interference: bool = True  # every policy also without interference
    compare_builtin_db: bool = True  # SWAF also with the hand-written model table
    ablations: bool = True  # SWAF with urgent on fastest, Capacity lending (beside the paper's)
    decompose_error: bool = True  # SWAF's prediction error with noise / interference off


def tiny() -> GenieStudy:
    return GenieStudy(densities=(5.0, 20.0), seeds=(1, 2), hours=2.0, lengths=("short",),
                      policies=("swaf", "fifo", "tetris-cer", "sjf"), defer_densities=(20.0,))


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--genie-seeds", help="comma-separated seeds (default 1,2,3,4,5)")
    parser.add_argument("--genie-densities",
                        help="comma-separated tasks/hour (default 5,10,20,40)")
    parser.add_argument("--genie-lengths",
                        help="comma-separated task-length mixes: short, long (default both)")


def apply_options(study: GenieStudy, args: argparse.Namespace) -> GenieStudy:
    if args.genie_seeds:
        study = replace(study, seeds=tuple(csv_list(args.genie_seeds, int, "--genie-seeds")))
    if args.genie_densities:
        study = replace(study, densities=tuple(
            csv_list(args.genie_densities, float, "--genie-densities")))
    if args.genie_lengths:
        chosen = tuple(t.strip() for t in args.genie_lengths.split(",") if t.strip())
        bad = [t for t in chosen if t not in genie.LENGTHS]
        if bad or not chosen:
            raise ReportError(f"--genie-lengths: expected some of {', '.join(genie.LENGTHS)}, "
                              f"got {args.genie_lengths!r}")
        study = replace(study, lengths=chosen)
    return study


# -- one replay, as a task a runner can ship anywhere -----------------------------------------


@dataclass(frozen=True)
class Cell:
    lengths: str
    density: float
    seed: int
    hours: float
    policy: str  # registry name
    # "" (the paper's rules), "defer" (SWAF's late_tasks), "urgent-fastest" (SWAF's urgent
    # tasks on their fastest placement) or "lend" (Capacity lends idle GPUs)
    variant: str = ""
    shape_mode: str = "any"  # for MODEL_PLACED policies
    interference: bool = True
    noise: bool = True  # the ground truth's per-run noise (profiling runs and replayed tasks)
    modeldb: str = "profiled"  # "profiled" (by sim.genie_profile) or "builtin"
    keep_samples: bool = False  # utilisation series for the plot
    keep_latencies: bool = False  # predicted against measured latency per task (Fig. 15)

    @property
    def label(self) -> str:
        return VARIANT_LABELS.get(self.variant, self.policy)


@dataclass
class CellResult:
    cell: Cell
    summary: dict[str, Any]
    jcts_h: list[float]
    samples: list[tuple[float, float]] = field(default_factory=list)  # (h, utilisation %)
    latencies: list[TaskLatency] = field(default_factory=list)
    campaigns: list[CampaignRecord] = field(default_factory=list)
    offered: genie.OfferedLoad | None = None
    wall_s: float = 0.0


def build_policy(cell: Cell, db: ModelDB) -> Policy:
    options: dict[str, Any] = {}
    if cell.policy in WITH_MODELDB:
        options["modeldb"] = db
    if cell.policy in MODEL_PLACED:
        options["shape_mode"] = cell.shape_mode
    if cell.variant == "defer":
        options["late_tasks"] = "defer"
    if cell.policy == "swaf":
        # Algorithm 1 line 13: an urgent task (ECT 0, never met) takes the highest-CER
        # placement overall like any task that cannot meet its ECT; "fastest" is the ablation.
        options["urgent_placement"] = "fastest" if cell.variant == "urgent-fastest" else "cer"
    if cell.policy == "capacity":
        # GENIE §7.1: "Each model type can only access its own allocated resources."
        options["lend"] = cell.variant == "lend"
    return make_policy(cell.policy, **options)


def largest_batches() -> dict[str, int]:
    """Per model type, the largest global batch the workload's tasks use (profiling's B)."""
    return {model: max(batches) for model, batches in BATCHES.items()}


def replay_cell(cell: Cell) -> CellResult:
    """Generate the seed's workload, profile its platform, replay one policy (pure: the cell
    alone decides the outcome)."""
    started = time.monotonic()
    workload = genie.generate(genie.GenieOptions(
        density=cell.density, hours=cell.hours, seed=cell.seed, lengths=cell.lengths))
    truth = TruthConfig(interference=cell.interference)
    if not cell.noise:
        truth = replace(truth, noise_sigma=0.0)
    # Long tasks keep the cluster busy for months: sample utilisation hourly, not every few
    # minutes of a replay that long (the samples feed only plots and fragmentation).
    config = SimConfig(seed=cell.seed, truth=truth,
                       sample_interval=3600.0 if cell.lengths == "long" else None)
    profile = profile_platform(workload.nodes, TruthModel(truth, cell.seed), largest_batches())
    db = profile.db if cell.modeldb == "profiled" else ModelDB.default()
    result = simulate(workload, build_policy(cell, db), config)
    out = CellResult(
        cell=cell,
        summary=summarise(result),
        jcts_h=[r.jct / 3600 for r in result.records
                if r.state == "finished" and r.jct is not None],
        offered=genie.offered_load(workload, cell.hours),
    )
    if cell.keep_samples:
        total = result.total_gpus or 1
        out.samples = [(s.time / 3600, 100 * s.effective_gpus / total) for s in result.samples]
    if cell.keep_latencies:
        out.latencies = replayed_latencies(db, {j.id: j.spec for j in workload.jobs},
                                           result.records)
        out.campaigns = profile.campaigns
    out.wall_s = time.monotonic() - started
    return out


def cells(study: GenieStudy) -> list[Cell]:
    """Every replay of the study, in a fixed order (the order results are reported in)."""
    out: list[Cell] = []
    model_placed = [p for p in study.policies if p in MODEL_PLACED]
    for lengths in study.lengths:
        for density in study.densities:
            for seed in study.seeds:
                base = Cell(lengths, density, seed, study.hours, "swaf")
                for name in study.policies:
                    out.append(replace(
                        base, policy=name,
                        keep_samples=(lengths == study.lengths[0]
                                      and density == max(study.densities)
                                      and seed == study.seeds[0]),
                        keep_latencies=name == "swaf"))
                if density in study.defer_densities and "swaf" in study.policies:
                    out.append(replace(base, variant="defer"))
                if study.ablations:
                    if "swaf" in study.policies:
                        out.append(replace(base, variant="urgent-fastest"))
                    if "capacity" in study.policies:
                        out.append(replace(base, policy="capacity", variant="lend"))
                if study.compare_interference:
                    out += [replace(base, policy=n, interference=False,
                                    keep_latencies=n == "swaf" and study.decompose_error)
                            for n in study.policies]
                if study.decompose_error and "swaf" in study.policies:
                    # Fig. 15's error taken apart: without noise, without interference, and
                    # without both (what is left is the fit's form against the truth's).
                    out += [replace(base, noise=False, keep_latencies=True),
                            replace(base, noise=False, interference=False,
                                    keep_latencies=True)]
                    if not study.compare_interference:
                        out.append(replace(base, interference=False, keep_latencies=True))
                if study.compare_cap:
                    out += [replace(base, policy=n, shape_mode="cap") for n in model_placed]
                if study.compare_builtin_db and "swaf" in study.policies:
                    out.append(replace(base, modeldb="builtin"))
    return out


# -- the section ---------------------------------------------------------------------------


def _pct_change(ours: float | None, base: float | None, lower_is_better: bool) -> float | None:
    if ours is None or base is None or base == 0:
        return None
    change = (ours - base) / base * 100.0
    return -change if lower_is_better else change


def _title(label: str) -> str:
    return LABEL_TITLES.get(label, title(label))


class Results:
    """The replays of one study, looked up by what they varied."""

    def __init__(self, results: list[CellResult]) -> None:
        self.by: dict[tuple[Any, ...], list[CellResult]] = defaultdict(list)
        for r in results:
            c = r.cell
            self.by[(c.lengths, c.density, c.label, c.shape_mode, c.interference,
                     c.modeldb, c.noise)].append(r)

    def runs(self, lengths: str, density: float, label: str, shape_mode: str = "any",
             interference: bool = True, modeldb: str = "profiled",
             noise: bool = True) -> list[CellResult]:
        policy = LABEL_POLICY.get(label, label)
        mode = shape_mode if policy in MODEL_PLACED else "any"
        return self.by.get((lengths, density, label, mode, interference, modeldb, noise), [])

    def offered(self, lengths: str, density: float) -> list[genie.OfferedLoad]:
        """The offered load of each seed's workload at one density (one per seed)."""
        seen: dict[int, genie.OfferedLoad] = {}
        for key, runs in self.by.items():
            if key[0] == lengths and key[1] == density:
                for r in runs:
                    if r.offered is not None:
                        seen.setdefault(r.cell.seed, r.offered)
        return [seen[s] for s in sorted(seen)]

    def offered_ratio(self, lengths: str, density: float) -> Spread | None:
        return Spread.of([o.ratio for o in self.offered(lengths, density)])

    def spread(self, runs: list[CellResult], key: str, scale: float = 1.0) -> Spread | None:
        return Spread.of([r.summary[key] * scale for r in runs if r.summary[key] is not None])

    def qos_class(self, runs: list[CellResult], qos: str) -> Spread | None:
        values = [r.summary["qos_pct_by_class"].get(qos) for r in runs]
        return Spread.of([v for v in values if v is not None])


def best_baseline(
    res: Results, lengths: str, density: float, baselines: list[str]
) -> dict[str, Any]:
    """SWAF against the best baseline at one density, on means over seeds (the paper's form)."""
    qos = {n: res.spread(res.runs(lengths, density, n), "qos_pct") for n in ["swaf", *baselines]}
    mk = {n: res.spread(res.runs(lengths, density, n), "makespan_s", 1 / 3600)
          for n in ["swaf", *baselines]}
    with_q = [n for n in baselines if qos[n] is not None]
    with_m = [n for n in baselines if mk[n] is not None]
    best_q = max(with_q, key=lambda n: qos[n].mean) if with_q else None  # type: ignore[union-attr]
    best_m = min(with_m, key=lambda n: mk[n].mean) if with_m else None  # type: ignore[union-attr]
    bq = qos[best_q].mean if best_q else None  # type: ignore[union-attr]
    bm = mk[best_m].mean if best_m else None  # type: ignore[union-attr]
    ours_q = qos["swaf"].mean if qos["swaf"] else None
    ours_m = mk["swaf"].mean if mk["swaf"] else None
    return {
        "best_qos": best_q, "best_qos_value": bq, "swaf_qos": ours_q,
        "qos_change_pct": _pct_change(ours_q, bq, lower_is_better=False),
        "best_makespan": best_m, "best_makespan_h": bm, "swaf_makespan_h": ours_m,
        "makespan_reduction_pct": _pct_change(ours_m, bm, lower_is_better=True),
    }


def error_stats(latencies: list[TaskLatency]) -> tuple[int, float | None, float | None]:
    errors = [100.0 * t.relative_error for t in latencies]
    if not errors:
        return 0, None, None
    return len(errors), math.fsum(errors) / len(errors), percentile(errors, 95)


def signed_error_pct(latencies: list[TaskLatency]) -> float | None:
    """Mean of (measured − predicted) / measured, in %: positive when tasks ran slower than
    predicted (what unpredicted interference does), where the absolute error cannot tell."""
    if not latencies:
        return None
    return 100.0 * math.fsum((t.measured_s - t.predicted_s) / t.measured_s
                             for t in latencies) / len(latencies)


def error_decomposition(res: Results, lengths: str, density: float
                        ) -> list[tuple[bool, bool, dict[str, Any]]]:
    """SWAF's prediction error (mode any) at one density under each setting of the truth's
    noise and interference that was replayed: (noise, interference, {tasks, mean_pct,
    p95_pct, bias_pct}), both on first."""
    out = []
    for noise, interference in ((True, True), (False, True), (True, False), (False, False)):
        lats = [t for r in res.runs(lengths, density, "swaf", interference=interference,
                                    noise=noise) for t in r.latencies]
        if not lats:
            continue
        n, m, p = error_stats(lats)
        out.append((noise, interference, {"tasks": n, "mean_pct": m, "p95_pct": p,
                                          "bias_pct": signed_error_pct(lats)}))
    return out


def decomposition_key(noise: bool, interference: bool) -> str:
    return (f"noise={'on' if noise else 'off'},"
            f"interference={'on' if interference else 'off'}")


def makespan_vs(res: Results, lengths: str, density: float, label: str,
                base: str = "tetris-cer") -> float | None:
    """``label``'s mean makespan against ``base``'s, in % (positive = longer than base)."""
    ours = res.spread(res.runs(lengths, density, label), "makespan_s")
    theirs = res.spread(res.runs(lengths, density, base), "makespan_s")
    if ours is None or theirs is None or not theirs.mean:
        return None
    return (ours.mean - theirs.mean) / theirs.mean * 100.0


def offered_text(res: Results, lengths: str, density: float) -> str:
    """One density's offered load with its arithmetic: the mean over seeds, then each seed."""
    loads = res.offered(lengths, density)
    if not loads:
        return f"density {density:g}: n/a"
    ratio = math.fsum(o.ratio for o in loads) / len(loads)
    return (f"{lengths} mix, density {density:g}: **{ratio:.2f}** (mean over seeds; "
            + "; ".join(o.arithmetic() for o in loads) + ")")


def assumptions_text(study: GenieStudy) -> str:
    """What the study assumes that the paper does not say, listed so no reader takes it for
    the paper's setup (generated from the constants the workload and truth use)."""
    truth = TruthConfig()
    iters = "; ".join(f"{m} {k.value} {lo}–{hi}"
                      for (m, k), (lo, hi) in sorted(genie.ITERATIONS.items(),
                                                     key=lambda i: (i[0][1].value, i[0][0])))
    train = ", ".join(f"{g}: {w:.0%}" for g, w in genie.TRAINING_GPUS)
    infer = ", ".join(f"{g}: {w:.0%}" for g, w in genie.INFERENCE_GPUS)
    batches = "; ".join(f"{m} {'/'.join(map(str, b))}" for m, b in BATCHES.items())
    items = [
        f"iteration ranges (uniform; Table 3 says \"uniform\" without ranges): {iters} — "
        "a task's single-GPU latency is about ten minutes to a few hours (*short* mix); the "
        f"*long* mix draws it log-uniform over {genie.LONG_SPAN_S[0] / 3600:g} h–"
        f"{genie.LONG_SPAN_S[1] / 86400:g} days instead (§7.1 gives the span only);",
        f"batch sizes (uniform over): {batches};",
        f"requested GPU counts (the paper's model-placed policies choose their own; the "
        f"black-box baselines need one): training {train}; inference {infer}; two CPU cores "
        "per GPU; four tenants;",
        "Capacity's shares: equal among the model types present, whole GPUs by largest "
        "remainder (the paper gives no shares);",
        "the ground truth the tasks meet (not the paper's GPUs): a saturating single-GPU "
        "curve per model (Eq. 7's quadratic, flat past its peak) with plausible K80-class "
        "coefficients, scaled over GPUs by Eq. 5 with Eq. 8's Comm — the form GENIE's "
        "profiling fits, so the model-driven policies predict a truth of their own form "
        "(sim/truth.py) —, per-run lognormal noise "
        f"(σ = {truth.noise_sigma:g}), locality penalties, and interference of "
        f"{truth.alpha_pcie:g} per other job behind a shared PCIe switch and "
        f"{truth.alpha_net:g} per other multi-node job on a shared node, scaled by "
        f"{truth.batch_ref:g} / ({truth.batch_ref:g} + local batch) (Fig. 18's shape: "
        "more for small batches; its values are not in the text);",
        "SJF, SWAF with deferred late tasks and the ablation rows are not the paper's.",
    ]
    return "**Assumptions (ours, not the paper's).**\n\n" + "\n".join(f"- {i}" for i in items)


def run(study: GenieStudy, trace_dir: Path, out_dir: Path, show: bool) -> Section:
    """Replay the synthetic GENIE workload serially (``trace_dir`` is not used)."""
    return run_on(study, trace_dir, out_dir, show, SerialRunner())


def run_on(study: GenieStudy, trace_dir: Path, out_dir: Path, show: bool,
           runner: Runner) -> Section:
    check_policies(study.policies, "genie policies")
    if "swaf" not in study.policies:
        raise ReportError("the GENIE study compares SWAF against baselines: include swaf")
    section = Section("genie", "GENIE workload (GENIE §7.1–7.2, Fig. 13, Fig. 15)")
    started = time.monotonic()
    todo = cells(study)
    results = runner.map(replay_cell, todo, "GENIE replays")
    res = Results(results)
    baselines = [p for p in study.policies if p in GENIE_BASELINES]
    densities = ", ".join(f"{d:g}" for d in study.densities)
    seeds = ", ".join(map(str, study.seeds))
    tasks = defaultdict(list)
    for r in results:
        if r.cell.policy == "fifo" and r.cell.interference:
            tasks[(r.cell.lengths, r.cell.density)].append(r.summary["jobs"])

    section.text(
        f"**Setup (generated).** GENIE's platform (4x4 K80 GPUs, Table 1), Poisson arrivals "
        f"at {densities} tasks/h over {study.hours:g} h, seeds {seeds} (each cell: mean over "
        "the seeds, min–max in brackets when they differ); tasks per seed: "
        + "; ".join(f"{ln} mix, density {d:g}: {fmt(Spread.of(v), '{:.0f}')}"
                    for (ln, d), v in tasks.items())
        + ". Task lengths: *short* is today's mix (single-GPU latency of about ten minutes "
        "to a few hours); *long* follows §7.1's \"from a couple of hours to weeks\" "
        "(single-GPU latency log-uniform over 2 h–2 weeks). Placements: SWAF, Tetris+Perf "
        "and Tetris+CER choose among every placement within the platform "
        "(`shape_mode = \"any\"`, Algorithm 1 line 3); the other policies place each task "
        "as asked (its requested GPU count, packed). Model database: before each seed's "
        "replays, every model type is profiled on the simulated platform by the live "
        "profiler's campaign and fit (B + N + G runs; ground truth with its per-run noise, "
        "no neighbours); every GENIE-family policy (SWAF, Tetris, Min-Min, Weighted Fair, "
        "SJF) predicts with that database. SWAF as Algorithm 1 has it: an urgent task "
        "(ECT 0, never met) takes the highest-CER placement overall (line 13, "
        "`urgent_placement = \"cer\"`). Capacity as §7.1 has it: each model type uses only "
        "its own share of the GPUs (`lend = false`). QoS guarantee: Eq. 14, also per class; "
        "normalised latency: Eq. 15–16. SJF is not a baseline of the paper. "
        f"{len(todo)} replays, run {getattr(runner, 'description', 'serially')}."
    )
    section.text(
        "**Offered load (generated)** = the work offered ÷ what the platform can do over the "
        "arrival window: Σ of every task's single-GPU latency (noise-free ground truth, in "
        "GPU-hours; one GPU is the cheapest way to run a task, so this is the least the work "
        f"needs) ÷ (16 GPUs × {study.hours:g} h). Above 1 the window's work cannot finish "
        "within the window under any policy; the tables carry it beside each density.\n\n"
        + "\n".join(f"- {offered_text(res, ln, d)}"
                     for ln in study.lengths for d in study.densities)
    )
    section.text(assumptions_text(study))

    # Profiled database: the fit's own errors, and Fig. 15 over the replayed tasks.
    fits = section.table(Table(
        "genie-profile",
        ["model type", "kind", "profiling runs (B+N+G)", "sPR fit error %",
         "PR fit error %"],
        ["{}", "{}", "{:d}", "{:.1f}", "{:.1f}"],
        caption="The profiled model database: each campaign's runs and the fit's mean "
                "relative error against its own runs (mean over seeds, min–max).",
    ))
    campaigns: dict[tuple[str, str], list[CampaignRecord]] = defaultdict(list)
    first = study.lengths[0]
    for r in results:
        if r.cell.lengths == first and r.cell.keep_latencies and r.cell.density == min(
                study.densities):
            for c in r.campaigns:
                campaigns[(c.model_type, c.kind)].append(c)
    for (model, kind), recs in sorted(campaigns.items()):
        placement = [100 * c.placement_error for c in recs if c.placement_error is not None]
        fits.add(model, kind, recs[0].runs, Spread.of([100 * c.single_gpu_error for c in recs]),
                 Spread.of(placement))

    accuracy = section.table(Table(
        "genie-prediction-error",
        ["task lengths", "model type", "tasks", "mean error %", "p95 error %"],
        ["{}", "{}", "{:d}", "{:.1f}", "{:.1f}"],
        caption="Prediction accuracy in Fig. 15's form: |predicted − measured| / measured "
                "latency of every task SWAF ran (mode any, interference on), on the "
                "placement it ran on, over all densities and seeds. Paper: mean under "
                f"{GENIE_PAPER['prediction_error_mean_pct']:g} %, p95 under "
                f"{GENIE_PAPER['prediction_error_p95_pct']:g} %.",
    ))
    by_density = section.table(Table(
        "genie-prediction-error-density",
        ["task lengths", "density (tasks/h)", "tasks", "mean error %", "p95 error %"],
        ["{}", "{:g}", "{:d}", "{:.1f}", "{:.1f}"],
        caption="The same errors per arrival density (all model types).",
    ))
    error_data: dict[str, Any] = {}
    for lengths in study.lengths:
        pooled: dict[str, list[TaskLatency]] = defaultdict(list)
        for density in study.densities:
            runs = res.runs(lengths, density, "swaf")
            lats = [t for r in runs for t in r.latencies]
            by_density.add(lengths, density, *error_stats(lats))
            for t in lats:
                pooled[t.model_type].append(t)
        everything = [t for ts in pooled.values() for t in ts]
        for model in sorted(pooled):
            accuracy.add(lengths, model, *error_stats(pooled[model]))
        n, m, p = error_stats(everything)
        accuracy.add(lengths, "all", n, m, p)
        error_data[lengths] = {"tasks": n, "mean_pct": m, "p95_pct": p}

    headline = Table(
        "genie-headline",
        ["task lengths", "GENIE vs best baseline", "ours (best over densities)",
         "ours (worst)", "paper (up to)"],
        ["{}", "{}", "{:+.1f}", "{:+.1f}", "{:+.1f}"],
        caption=f"Paper: {GENIE_PAPER['source']}.",
    )
    versus_data: dict[str, Any] = {}
    for lengths in study.lengths:
        main = section.table(Table(
            f"genie-main-{lengths}",
            ["density (tasks/h)", "offered load", "policy", "QoS guarantee %", "urgent %",
             "prior %", "normal %", "makespan h", "avg norm. latency", "GPU utilisation %"],
            ["{:g}", "{:.2f}", "{}", "{:.1f}", "{:.1f}", "{:.1f}", "{:.1f}", "{:.1f}",
             "{:.3f}", "{:.1f}"],
            caption=f"{lengths.capitalize()} tasks, every placement (mode any), interference "
                    "on, profiled database: QoS guarantee overall and per class. SWAF and "
                    "Capacity follow the paper's rules; the ablation rows change one rule "
                    "each.",
        ))
        for density in study.densities:
            labels = list(study.policies)
            if density in study.defer_densities:
                labels.insert(1, DEFER)
            if study.ablations:
                for extra, after in ((URGENT_FASTEST, "swaf"), (CAPACITY_LEND, "capacity")):
                    if after in labels:
                        labels.insert(labels.index(after) + 1, extra)
            for label in labels:
                runs = res.runs(lengths, density, label)
                main.add(density, res.offered_ratio(lengths, density), _title(label),
                         res.spread(runs, "qos_pct"),
                         *(res.qos_class(runs, q) for q in CLASSES),
                         res.spread(runs, "makespan_s", 1 / 3600),
                         res.spread(runs, "avg_norm_latency"),
                         res.spread(runs, "gpu_utilisation", 100))

        versus = section.table(Table(
            f"genie-vs-best-{lengths}",
            ["density (tasks/h)", "offered load", "best baseline (QoS)", "its QoS %",
             "SWAF QoS %", "QoS change %", "best baseline (makespan)", "its makespan h",
             "SWAF makespan h", "makespan reduction %"],
            ["{:g}", "{:.2f}", "{}", "{:.1f}", "{:.1f}", "{:+.1f}", "{}", "{:.1f}", "{:.1f}",
             "{:+.1f}"],
            caption=f"{lengths.capitalize()} tasks: SWAF against the best of the paper's "
                    "baselines at each density, on means over seeds, as the paper reports it: "
                    "relative change of the QoS guarantee and relative reduction of the "
                    "makespan (positive = SWAF better).",
        ))
        qos_changes: list[float] = []
        mk_changes: list[float] = []
        versus_data[lengths] = {}
        for density in study.densities:
            b = best_baseline(res, lengths, density, baselines)
            versus_data[lengths][str(density)] = b
            if b["qos_change_pct"] is not None:
                qos_changes.append(b["qos_change_pct"])
            if b["makespan_reduction_pct"] is not None:
                mk_changes.append(b["makespan_reduction_pct"])
            versus.add(density, res.offered_ratio(lengths, density),
                       title(b["best_qos"]) if b["best_qos"] else None,
                       b["best_qos_value"], b["swaf_qos"], b["qos_change_pct"],
                       title(b["best_makespan"]) if b["best_makespan"] else None,
                       b["best_makespan_h"], b["swaf_makespan_h"], b["makespan_reduction_pct"])
        headline.add(lengths, "QoS-guarantee % change", max(qos_changes, default=None),
                     min(qos_changes, default=None), GENIE_PAPER["qos_improvement_pct"])
        headline.add(lengths, "makespan reduction %", max(mk_changes, default=None),
                     min(mk_changes, default=None), GENIE_PAPER["makespan_reduction_pct"])
    section.parts.append(headline)

    ablation_data: dict[str, Any] = {}
    if study.ablations:
        for lengths in study.lengths:
            table = section.table(Table(
                f"genie-ablations-{lengths}",
                ["density (tasks/h)", "offered load", "policy", "QoS guarantee %",
                 "urgent %", "makespan h", "makespan vs Tetris+CER %", "GPU utilisation %"],
                ["{:g}", "{:.2f}", "{}", "{:.1f}", "{:.1f}", "{:.1f}", "{:+.1f}", "{:.1f}"],
                caption=f"{lengths.capitalize()} tasks, mode any, interference on: each "
                        "paper rule beside its ablation. SWAF gives an urgent task the "
                        "highest-CER placement (Algorithm 1 line 13) or its fastest one; "
                        "Capacity keeps each model type to its own share (§7.1) or lends idle "
                        "GPUs and reclaims them by preemption. Makespan against Tetris+CER's "
                        "(positive = longer).",
            ))
            ablation_data[lengths] = {}
            for density in study.densities:
                row: dict[str, Any] = {}
                for label in ("swaf", URGENT_FASTEST, "tetris-cer", "capacity",
                              CAPACITY_LEND):
                    runs = res.runs(lengths, density, label)
                    if not runs:
                        continue
                    vs = makespan_vs(res, lengths, density, label)
                    qos = res.spread(runs, "qos_pct")
                    mk = res.spread(runs, "makespan_s", 1 / 3600)
                    table.add(density, res.offered_ratio(lengths, density), _title(label), qos,
                              res.qos_class(runs, "urgent"), mk, vs,
                              res.spread(runs, "gpu_utilisation", 100))
                    row[label] = {"qos_pct": qos.mean if qos else None,
                                  "makespan_h": mk.mean if mk else None,
                                  "makespan_vs_tetris_cer_pct": vs}
                ablation_data[lengths][f"{density:g}"] = row

    decomposition: dict[str, Any] = {}
    if study.decompose_error:
        table = section.table(Table(
            "genie-prediction-error-decomposition",
            ["task lengths", "density (tasks/h)", "offered load", "per-run noise",
             "interference", "tasks", "mean error %", "p95 error %",
             "measured slower than predicted %"],
            ["{}", "{:g}", "{:.2f}", "{}", "{}", "{:d}", "{:.1f}", "{:.1f}", "{:+.2f}"],
            caption="Fig. 15's error taken apart: SWAF (mode any) replayed on the same "
                    "workloads with the ground truth's per-run noise (profiling runs and tasks) "
                    "and its interference each switched off. With both off, what is left is "
                    "the fit's form: GENIE's quadratic in the local batch (Eq. 7) against the "
                    "truth's curve that flattens past saturation. Last column: mean of "
                    "(measured − predicted) / measured, the bias interference adds.",
        ))
        for lengths in study.lengths:
            decomposition[lengths] = {}
            for density in study.densities:
                rows = {}
                for noise, interference, e in error_decomposition(res, lengths, density):
                    table.add(lengths, density, res.offered_ratio(lengths, density),
                              "on" if noise else "off", "on" if interference else "off",
                              e["tasks"], e["mean_pct"], e["p95_pct"], e["bias_pct"])
                    rows[decomposition_key(noise, interference)] = e
                decomposition[lengths][f"{density:g}"] = rows

    defer_densities = [d for d in study.densities if d in study.defer_densities]
    if defer_densities:
        defer = section.table(Table(
            "genie-defer",
            ["task lengths", "density (tasks/h)", "policy", "QoS guarantee %", "prior %",
             "normal %", "makespan h"],
            ["{}", "{:g}", "{}", "{:.1f}", "{:.1f}", "{:.1f}", "{:.1f}"],
            caption="Beyond GENIE: SWAF with tasks that can no longer meet their ECT on any "
                    "placement deferred behind those that still can (`late_tasks = "
                    "\"defer\"`), beside SWAF as the paper defines it and SJF (mode any, "
                    "interference on).",
        ))
        for lengths in study.lengths:
            for density in defer_densities:
                for label in ("swaf", DEFER, "sjf"):
                    runs = res.runs(lengths, density, label)
                    if runs:
                        defer.add(lengths, density, _title(label), res.spread(runs, "qos_pct"),
                                  res.qos_class(runs, "prior"), res.qos_class(runs, "normal"),
                                  res.spread(runs, "makespan_s", 1 / 3600))

    if study.compare_interference:
        for lengths in study.lengths:
            table = section.table(Table(
                f"genie-interference-{lengths}",
                ["density (tasks/h)", "policy", "QoS % (interference on)", "QoS % (off)",
                 "makespan h (on)", "makespan h (off)"],
                ["{:g}", "{}", "{:.1f}", "{:.1f}", "{:.1f}", "{:.1f}"],
                caption=f"{lengths.capitalize()} tasks, mode any: the ground truth with and "
                        "without PCIe/network interference (which no policy predicts).",
            ))
            for density in study.densities:
                for name in study.policies:
                    on = res.runs(lengths, density, name)
                    off = res.runs(lengths, density, name, interference=False)
                    table.add(density, title(name), res.spread(on, "qos_pct"),
                              res.spread(off, "qos_pct"),
                              res.spread(on, "makespan_s", 1 / 3600),
                              res.spread(off, "makespan_s", 1 / 3600))

    model_placed = [p for p in study.policies if p in MODEL_PLACED]
    if study.compare_cap and model_placed:
        for lengths in study.lengths:
            table = section.table(Table(
                f"genie-shapes-{lengths}",
                ["density (tasks/h)", "policy", "QoS % (any)", "QoS % (cap)",
                 "makespan h (any)", "makespan h (cap)"],
                ["{:g}", "{}", "{:.1f}", "{:.1f}", "{:.1f}", "{:.1f}"],
                caption=f"{lengths.capitalize()} tasks: every placement (`any`) against at "
                        "most the requested GPUs (`cap`, the live master's default), for the "
                        "policies that place from the model (interference on).",
            ))
            for density in study.densities:
                for name in model_placed:
                    a = res.runs(lengths, density, name)
                    c = res.runs(lengths, density, name, shape_mode="cap")
                    table.add(density, title(name), res.spread(a, "qos_pct"),
                              res.spread(c, "qos_pct"), res.spread(a, "makespan_s", 1 / 3600),
                              res.spread(c, "makespan_s", 1 / 3600))

    if study.compare_builtin_db:
        table = section.table(Table(
            "genie-modeldb",
            ["task lengths", "density (tasks/h)", "SWAF QoS % (profiled)",
             "SWAF QoS % (built-in table)", "makespan h (profiled)", "makespan h (built-in)"],
            ["{}", "{:g}", "{:.1f}", "{:.1f}", "{:.1f}", "{:.1f}"],
            caption="SWAF (mode any) with the profiled database against the hand-written "
                    "table the live master starts with (`ModelDB.default()`).",
        ))
        for lengths in study.lengths:
            for density in study.densities:
                p = res.runs(lengths, density, "swaf")
                b = res.runs(lengths, density, "swaf", modeldb="builtin")
                table.add(lengths, density, res.spread(p, "qos_pct"), res.spread(b, "qos_pct"),
                          res.spread(p, "makespan_s", 1 / 3600),
                          res.spread(b, "makespan_s", 1 / 3600))

    lines = []
    for lengths in study.lengths:
        for density in study.densities:
            labels = [*study.policies, DEFER] if density in study.defer_densities else list(
                study.policies)
            qos = {n: res.spread(res.runs(lengths, density, n), "qos_pct") for n in labels}
            mk = {n: res.spread(res.runs(lengths, density, n), "makespan_s", 1 / 3600)
                  for n in labels}
            top_q = max((n for n in qos if qos[n]), key=lambda n: qos[n].mean,  # type: ignore[union-attr]
                        default=None)
            top_m = min((n for n in mk if mk[n]), key=lambda n: mk[n].mean,  # type: ignore[union-attr]
                        default=None)
            lines.append(
                f"- {lengths}, density {density:g}: highest QoS guarantee "
                f"{_title(top_q) if top_q else 'n/a'} "
                f"({fmt(qos[top_q].mean if top_q else None)} %), shortest makespan "  # type: ignore[union-attr]
                f"{_title(top_m) if top_m else 'n/a'} "
                f"({fmt(mk[top_m].mean if top_m else None)} h)."  # type: ignore[union-attr]
            )
    section.text("**Who leads (generated, every policy including SJF and SWAF-defer, mode "
                 "any, interference on).**\n\n" + "\n".join(lines))

    plt = pyplot()
    if plt is not None:
        _plots(plt, study, res, out_dir, section)
    section.data = {
        "config": asdict(study),
        "paper": GENIE_PAPER,
        "prediction_error": error_data,
        "prediction_error_decomposition": decomposition,
        "offered_load": {ln: {f"{d:g}": [asdict(o) | {"ratio": o.ratio}
                                          for o in res.offered(ln, d)]
                              for d in study.densities} for ln in study.lengths},
        "ablations": ablation_data,
        "versus_best": versus_data,
        "runs": [dict(asdict(r.cell), summary=r.summary) for r in results],
    }
    section.wall_s = time.monotonic() - started
    return section


def _plots(plt: Any, study: GenieStudy, res: Results, out_dir: Path, section: Section) -> None:
    lengths = study.lengths[0]
    densities = list(study.densities)
    fig, axes = plt.subplots(1, len(densities), figsize=(4 * len(densities), 3.4), squeeze=False)
    for ax, density in zip(axes[0], densities, strict=True):
        for name in study.policies:
            jcts = [j for r in res.runs(lengths, density, name) for j in r.jcts_h]
            plot_cdf(ax, jcts, title(name))
        ax.set_title(f"{density:g} tasks/h (all seeds)", fontsize=9)
        ax.set_xlabel("JCT (h)")
        ax.grid(True, alpha=0.3)
    axes[0][0].set_ylabel("CDF of tasks")
    axes[0][-1].legend(fontsize=7)
    save_figure(plt, fig, out_dir / "genie_jct_cdf.png")
    section.figures.append(("genie_jct_cdf.png", f"GENIE workload ({lengths} tasks, mode any): "
                            "JCT CDF per policy and arrival density (all seeds pooled)."))

    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.6))
    for name in study.policies:
        for ax, key, scale in ((left, "qos_pct", 1.0), (right, "makespan_s", 1 / 3600)):
            pts = []
            for density in densities:
                s = res.spread(res.runs(lengths, density, name), key, scale)
                if s is not None:
                    pts.append((density, s.mean, s.mean - s.low, s.high - s.mean))
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
    section.figures.append(("genie_qos_makespan.png", f"GENIE workload ({lengths} tasks, mode "
                            "any): QoS guarantee and makespan per arrival density (mean, "
                            "bars: min–max over seeds)."))

    density = max(densities)
    seed = study.seeds[0]
    fig, ax = plt.subplots(figsize=(8, 3.6))
    for name in study.policies:
        kept = [r for r in res.runs(lengths, density, name) if r.samples]
        if kept:
            ax.plot([t for t, _ in kept[0].samples], [u for _, u in kept[0].samples],
                    label=title(name), linewidth=1)
    ax.set_xlabel("time (h)")
    ax.set_ylabel("GPU utilisation %")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    save_figure(plt, fig, out_dir / "genie_gpu_util.png")
    section.figures.append(("genie_gpu_util.png", f"GENIE workload ({lengths} tasks, mode "
                            f"any): GPU utilisation over time at {density:g} tasks/h, seed "
                            f"{seed} (GPUs weighted by the share of linear scaling they "
                            "deliver)."))


STUDY = Study(name="genie", label="GENIE", config=GenieStudy, run=run, tiny=tiny,
              add_options=add_options, apply_options=apply_options, run_on=run_on)
