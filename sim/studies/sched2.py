"""Study: SCHED² (seeds/sched2.md §IV) — the learned selection against the paper's baselines.

Set up from the paper before any result was looked at (``sim.workloads.sched2``): 15 servers
× 8 GPUs, 1,000-job episodes resampled from Philly to 68% one-GPU jobs and a mean gap of
172 s, CV / NLP / Speech at 10 / 60 / 30% with §II-A's locality penalties, the held-out
episodes 30–59; ground truth as the paper's profile-driven simulator (no noise, no
interference); every policy's predictions exact (the oracle model database, as the paper's
profiles and SAF's oracle are).

Replayed: the trained agent (the model shipped in the package unless ``--sched2-model``), the
paper's baselines (SIF, DSIF, SAF, LRF, SPF, FIFO) and the registry's SJF, QSSF (Helios, its
estimate under Helios' error model, as the workload draws it) and SWAF (GENIE, with exactly
the GPUs asked — the paper's jobs keep their GPU count — and, reported apart,
SWAF free to give fewer GPUs), and the hold rule (``sched2-hold``: the shortest window job
packing places on its fewest servers, else "no job") at J = 10 and over the whole queue, the
baseline the agent must beat. Durations are scaled to the offered load the paper's figures
imply (0.69); a load sweep (0.5–1.2) repeats the comparisons, paired per episode with
bootstrap intervals (``sim.paired``). Settings: the paper's mix on every held-out episode; the
60% and 75% mixes and Philly as it is; the paper's Fig. 8 (arrival gaps scaled); and, to
measure what the window of J jobs costs, the shortest job in a window of J = 10, 30, 100
picked by a fixed rule instead of the agent.
"""

from __future__ import annotations

import argparse
import math
import shutil
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from masterd.core.policies import make_policy
from masterd.core.policies.sched2 import DEFAULT_MODEL, Sched2Policy
from masterd.core.policies.sched2_scorer import DEFAULT_SCORER, Sched2ScorerPolicy
from masterd.core.policy import Policy
from masterd.core.sched2.network import QNetwork, Shape, random_network
from masterd.core.sched2.packing import best_servers
from masterd.core.sched2.scorer import ScorerNetwork
from masterd.core.sched2.state import Observation
from sim.engine import SimConfig, SimResult, simulate
from sim.oracle import oracle_modeldb
from sim.paired import PairedRatio, paired_ratio, speedup
from sim.parallel import Runner, SerialRunner
from sim.sched2_metrics import EpisodeMetrics, episode_metrics
from sim.studies.common import (
    ReportError,
    Section,
    Study,
    check_policies,
    csv_list,
    pyplot,
    save_figure,
    title,
)
from sim.tables import Spread, Table, fmt
from sim.truth import SCHED2_SLOWDOWNS, TruthConfig, TruthModel
from sim.workloads import sched2 as workload

# The paper's own figures, quoted next to ours (never computed here).
SCHED2_PAPER = {
    "source": "SCHED² §IV-B, §IV-C, Fig. 7, 10, Table III (seeds/sched2.md)",
    "jct_speedup": 4.6,
    "makespan_speedup": 2.1,
    "effectiveness_ratio": 1.6,
    "effectiveness_by_mix": {0.60: 1.64, 0.68: 1.6, 0.75: 1.09},
    "run_s": {"sched2": 5422, "baseline": 8427},
    "wait_s": {"sched2": 557, "baseline": 19075},
    "relaxed_pct": {"sensitive": 15.4, "insensitive": 32.5},
    "wait_by_sensitivity_s": {"sensitive": 1466, "insensitive": 741},
}
TRUTH = TruthConfig(noise_sigma=0.0, interference=False)
# Trained at twice the paper's arrival gaps (trellis-sim train sched2 --mean-gap 344), for the
# Fig. 8 rows: its record is beside it.
GAP2_MODEL = DEFAULT_MODEL.with_name("sched2-15x8-j10-gap2.npz")
PAPER_BASELINES = ("sif", "dsif", "saf", "lrf", "spf", "fifo")
OTHER_BASELINES = ("sjf", "qssf", "swaf-exact")
# The hold rule (``sched2-hold``) at the agent's window J = 10, and over the whole queue.
HOLD = "sched2-hold"
HOLD_ALL = "sched2-hold-all"
HOLD_RULES = (HOLD, HOLD_ALL)
# Beyond the paper: the per-job scorer over the whole queue (its model in ``Cell.model``).
SCORER = "sched2-scorer"
MOLDABLE = "swaf"  # may give a job fewer GPUs than it asked for: reported, not "best"
WINDOW_RULE = "window-shortest"
SENSITIVE = frozenset(m for m, s in SCHED2_SLOWDOWNS.items() if s >= 2.0)
POLICY_TITLES = {"sched2": "SCHED² (learned)", "sif": "SIF", "dsif": "DSIF", "saf": "SAF",
                 "lrf": "LRF", "spf": "SPF", "qssf": "QSSF (Helios' error model)",
                 "swaf-exact": "SWAF, GPUs as asked",
                 "swaf": "SWAF, fewer GPUs allowed", "fifo": "FIFO",
                 HOLD: "hold rule, J = 10", HOLD_ALL: "hold rule, whole queue",
                 SCORER: "per-job scorer (learned, whole queue)"}


@dataclass(frozen=True)
class Sched2Study:
    model: str = ""  # empty: the model shipped in the package
    episodes: tuple[int, ...] = tuple(workload.TEST_EPISODES)  # the paper's mix
    jobs: int = 1000
    baselines: tuple[str, ...] = (*PAPER_BASELINES, *OTHER_BASELINES, *HOLD_RULES, MOLDABLE)
    mixes: tuple[float | None, ...] = (0.60, 0.75, None)  # beside 0.68; None: Philly as is
    gap_scales: tuple[float, ...] = (2.0, 4.0)  # Fig. 8: arrival gaps × these
    # (gap scale, model file): a model trained at that gap, evaluated there beside the main
    # one (a row of its own); the main model is evaluated at every gap scale.
    gap_models: tuple[tuple[float, str], ...] = ((2.0, str(GAP2_MODEL)),)
    other_episodes: int = 5  # held-out episodes per mix and per gap scale
    windows: tuple[int, ...] = (10, 30, 100)  # the window rule's J
    window_episodes: int = 10
    # The load sweep (durations scaled; the paper's Fig. 8 varies the load by the gaps):
    # beside the implied load of the main rows, ``other_episodes`` episodes each.
    loads: tuple[float, ...] = (0.5, 0.8, 1.0, 1.2)
    load_policies: tuple[str, ...] = (*PAPER_BASELINES, "swaf-exact", "qssf", *HOLD_RULES)
    # Beyond the paper: the per-job scorer (empty: the model shipped in the package), on the
    # paper's mix and at every load of the sweep; "-": not replayed.
    scorer_model: str = ""


def tiny() -> Sched2Study:
    return Sched2Study(episodes=(30,), jobs=60, baselines=("sif", "fifo", "swaf-exact", HOLD,
                                                            HOLD_ALL),
                       mixes=(None,), gap_scales=(2.0,), other_episodes=1, windows=(10, 30),
                       window_episodes=1, gap_models=(), loads=(1.2,),
                       load_policies=("sif", HOLD, HOLD_ALL))


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sched2-model", help="SCHED² model (.npz) to evaluate (default: "
                        "the one shipped in the package)")
    parser.add_argument("--sched2-episodes", help="held-out episodes on the paper's mix, "
                        "comma-separated (default 30..59)")
    parser.add_argument("--sched2-other-episodes", type=int,
                        help="held-out episodes per other mix and gap scale (default 5)")
    parser.add_argument("--sched2-gap-model", action="append", metavar="SCALE:FILE",
                        help="also evaluate a model trained at this gap scale, there")
    parser.add_argument("--sched2-scorer-model", help="the per-job scorer (.npz) to evaluate "
                        "(default: the one shipped in the package; '-': none)")


def apply_options(study: Sched2Study, args: argparse.Namespace) -> Sched2Study:
    if args.sched2_model:
        study = replace(study, model=args.sched2_model)
    if args.sched2_episodes:
        chosen = tuple(csv_list(args.sched2_episodes, int, "--sched2-episodes"))
        if any(e in workload.TRAIN_EPISODES for e in chosen):
            raise ReportError("--sched2-episodes: episodes 0-29 are the training episodes")
        study = replace(study, episodes=chosen)
    if args.sched2_gap_model:
        pairs = []
        for item in args.sched2_gap_model:
            scale, sep, path = item.partition(":")
            try:
                if not sep or not path:
                    raise ValueError
                pairs.append((float(scale), path))
            except ValueError:
                raise ReportError(f"--sched2-gap-model {item!r}: expected SCALE:FILE") from None
        study = replace(study, gap_models=tuple(pairs))
    if args.sched2_scorer_model:
        study = replace(study, scorer_model=args.sched2_scorer_model)
    if args.sched2_other_episodes is not None:
        if args.sched2_other_episodes < 1:
            raise ReportError("--sched2-other-episodes must be at least 1")
        study = replace(study, other_episodes=args.sched2_other_episodes)
    return study


# -- one replay ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cell:
    setting: str  # "mix" | "gap" | "window"
    share: float | None  # one-GPU share (None: Philly as it is)
    gap_scale: float
    episode: int
    policy: str  # registry name, "swaf-exact", or WINDOW_RULE
    model: str
    trace_dir: str
    jobs: int = 1000
    window: int = 10
    keep_series: bool = False
    load: float | None = workload.IMPLIED_LOAD  # expected offered load (durations scaled)


@dataclass
class CellResult:
    cell: Cell
    metrics: EpisodeMetrics
    offered_load: float
    one_gpu_share: float
    # Table III: multi-GPU jobs by sensitivity -> (jobs, relaxed locality, summed wait s)
    sensitivity: dict[str, tuple[int, int, float]]
    series: list[tuple[float, float]] = field(default_factory=list)  # (h, fragmentation)
    wall_s: float = 0.0


class ShortestInWindow:
    """A fixed rule in the agent's place: the shortest job (ideal time) among the allowed
    ones of the window, never "no job". Measures what a window of J jobs allows."""

    def __init__(self, shape: Shape) -> None:
        self.shape = shape

    def act(self, observation: Observation) -> int:
        step = self.shape.job_step
        allowed = np.flatnonzero(observation.mask[:-1])
        return int(min(allowed, key=lambda i: observation.jobs[i * step]))

    def reward(self, value: float) -> None:
        """A rule does not learn."""


def options_of(cell: Cell) -> workload.Sched2Options:
    base = workload.Sched2Options(one_gpu_share=cell.share, jobs=cell.jobs, load=cell.load)
    return replace(base, mean_gap_s=base.mean_gap_s * cell.gap_scale)


def build_policy(cell: Cell, network: QNetwork | None, opts: workload.Sched2Options) -> Policy:
    db = oracle_modeldb(TRUTH, workload.GPU_MODEL)
    if cell.policy == "sched2":
        return Sched2Policy(model=network, modeldb=db)
    if cell.policy == SCORER:
        return Sched2ScorerPolicy(model=cell.model or None, modeldb=db)
    if cell.policy == WINDOW_RULE:
        shape = Shape(opts.servers, opts.gpus_per_server, cell.window)
        return Sched2Policy(model=random_network(shape), modeldb=db,
                            agent=ShortestInWindow(shape))
    if cell.policy == HOLD_ALL:
        return make_policy(HOLD, modeldb=db, window=0)
    if cell.policy == "swaf-exact":
        return make_policy("swaf", modeldb=db, shape_mode="exact")
    if cell.policy in ("fifo", "lrf", "qssf"):  # no model: FIFO order, free GPUs, estimates
        return make_policy(cell.policy)
    return make_policy(cell.policy, modeldb=db)


def replay_cell(cell: Cell) -> CellResult:
    """One episode under one policy (pure: the cell alone decides the outcome)."""
    started = time.monotonic()
    opts = options_of(cell)
    w = workload.episode(Path(cell.trace_dir), opts, cell.episode, TruthModel(TRUTH))
    network = QNetwork.load(cell.model) if cell.policy == "sched2" else None
    result = simulate(w, build_policy(cell, network, opts), SimConfig(seed=1, truth=TRUTH))
    metrics = episode_metrics(w, result, opts.gpus_per_server)
    out = CellResult(cell, metrics, float(w.notes["offered_load"]),
                     float(w.notes["one_gpu_share"]),
                     sensitivity(w, result, opts.gpus_per_server))
    if cell.keep_series:
        out.series = [(s.time / 3600, s.fragmentation) for s in result.samples]
    out.wall_s = time.monotonic() - started
    return out


def sensitivity(w: Any, result: SimResult, gpus_per_server: int
                ) -> dict[str, tuple[int, int, float]]:
    models = {j.id: j.spec.model_type for j in w.jobs}
    out: dict[str, list[float]] = {"sensitive": [0, 0, 0.0], "insensitive": [0, 0, 0.0]}
    for r in result.records:
        if r.gpus < 2 or r.state != "finished" or r.first_start is None:
            continue
        row = out["sensitive" if models.get(r.id) in SENSITIVE else "insensitive"]
        row[0] += 1
        row[1] += r.nodes_used > best_servers(r.gpus, gpus_per_server)
        row[2] += r.first_start - r.submit
    return {k: (int(v[0]), int(v[1]), float(v[2])) for k, v in out.items()}


def trained_episodes(meta: Mapping[str, Any]) -> Any:
    """Episodes a model was trained for: those run (``episodes_done``, a run stopped early
    has fewer than the ``episodes`` it asked for; older files lack it)."""
    return meta.get("episodes_done", meta.get("episodes", "n/a"))


def scorer_path(study: Sched2Study) -> str | None:
    if study.scorer_model == "-":
        return None
    return study.scorer_model or str(DEFAULT_SCORER)


def cells(study: Sched2Study, model: str, trace_dir: Path) -> list[Cell]:
    """Every replay of the study, in the order it is reported."""
    policies = ("sched2", *study.baselines)
    base = Cell("mix", 0.68, 1.0, 0, "sched2", model, str(trace_dir), study.jobs)
    out = [replace(base, episode=e, policy=p, keep_series=e == study.episodes[0])
           for e in study.episodes for p in policies]
    scorer = scorer_path(study)
    if scorer is not None:
        out += [replace(base, episode=e, policy=SCORER, model=scorer)
                for e in study.episodes]
        out += [replace(base, setting=load_setting(load), load=load, episode=e, policy=SCORER,
                        model=scorer)
                for load in study.loads for e in tuple(workload.TEST_EPISODES)[
                    :study.other_episodes]]
    others = tuple(workload.TEST_EPISODES)[:study.other_episodes]
    out += [replace(base, share=share, episode=e, policy=p)
            for share in study.mixes for e in others for p in policies]
    out += [replace(base, setting="gap", gap_scale=g, episode=e, policy=p)
            for g in study.gap_scales for e in others for p in policies]
    out += [replace(base, setting="gap-model", gap_scale=g, episode=e, model=path)
            for g, path in study.gap_models for e in others]
    out += [replace(base, setting=load_setting(load), load=load, episode=e, policy=p)
            for load in study.loads for e in others
            for p in ("sched2", *study.load_policies)]
    windows = tuple(workload.TEST_EPISODES)[:study.window_episodes]
    out += [replace(base, setting="window", episode=e, policy=WINDOW_RULE, window=j)
            for j in study.windows for e in windows]
    return out


def load_setting(load: float) -> str:
    return f"load {load:g}"


def run(study: Sched2Study, trace_dir: Path, out_dir: Path, show: bool) -> Section:
    return run_on(study, trace_dir, out_dir, show, SerialRunner())


# -- the section ---------------------------------------------------------------------------


def _key(c: Cell) -> tuple[Any, ...]:
    return (c.setting, c.share, c.gap_scale, c.policy, c.window)


class Results:
    def __init__(self, results: Sequence[CellResult]) -> None:
        self.by: dict[tuple[Any, ...], list[CellResult]] = defaultdict(list)
        for r in results:
            self.by[_key(r.cell)].append(r)

    def runs(self, setting: str, share: float | None, gap: float, policy: str,
             window: int = 10) -> list[CellResult]:
        return self.by.get((setting, share, gap, policy, window), [])

    def mean(self, runs: Sequence[CellResult], attr: str) -> float | None:
        values = [getattr(r.metrics, attr) for r in runs]
        values = [v for v in values if v is not None and math.isfinite(v)]
        return math.fsum(values) / len(values) if values else None

    def spread(self, runs: Sequence[CellResult], attr: str, scale: float = 1.0
               ) -> Spread | None:
        values = [getattr(r.metrics, attr) for r in runs]
        return Spread.of([v * scale for v in values if v is not None and math.isfinite(v)])


# Lower is better for these; effectiveness and good locality higher.
LOWER = {"jct_s": True, "makespan_s": True, "effectiveness": False}


def versus_best(res: Results, setting: str, share: float | None, gap: float,
                baselines: Sequence[str]) -> dict[str, Any]:
    """SCHED² against the best baseline per metric (the paper's form), on episode means."""
    out: dict[str, Any] = {}
    ours_runs = res.runs(setting, share, gap, "sched2")
    for metric, lower in LOWER.items():
        ours = res.mean(ours_runs, metric)
        scored = {b: res.mean(res.runs(setting, share, gap, b), metric) for b in baselines}
        scored = {b: v for b, v in scored.items() if v is not None}
        if ours is None or not scored:
            out[metric] = (None, None)
            continue
        best = min(scored, key=scored.__getitem__) if lower else max(scored,
                                                                     key=scored.__getitem__)
        ratio = scored[best] / ours if lower else ours / scored[best]
        out[metric] = (best, ratio)
    return out


def _mix_label(share: float | None) -> str:
    return "Philly as it is" if share is None else f"{round(100 * share)}% one-GPU"


def run_on(study: Sched2Study, trace_dir: Path, out_dir: Path, show: bool,
           runner: Runner) -> Section:
    names = [b for b in study.baselines if b not in ("swaf-exact", HOLD_ALL)]
    check_policies(names, "sched2 baselines")
    missing = [g for g, _ in study.gap_models if g not in study.gap_scales]
    if missing:
        raise ReportError(f"sched2 gap models at scales {missing} that are not replayed "
                          f"(gap scales: {list(study.gap_scales)})")
    for _, path in study.gap_models:
        QNetwork.load(path)  # a bad file fails now, not after an hour of replays
    model = study.model or str(DEFAULT_MODEL)
    network = QNetwork.load(model)  # fails here, with the reason, before any replay
    scorer = scorer_path(study)
    scorer_meta = dict(ScorerNetwork.load(scorer).meta) if scorer is not None else {}
    network.check(servers=workload.Sched2Options().servers,
                  gpus_per_server=workload.Sched2Options().gpus_per_server)
    section = Section("sched2", "SCHED² (SCHED² §IV, Fig. 7–10, Table III)")
    started = time.monotonic()
    results = runner.map(replay_cell, cells(study, model, trace_dir), "SCHED² replays")
    res = Results(results)
    comparable = [b for b in study.baselines if b != MOLDABLE]
    paper = [b for b in comparable if b in PAPER_BASELINES]
    meta = network.meta
    main = res.runs("mix", 0.68, 1.0, "sched2")
    loads = [r.offered_load for r in main]
    section.text(
        f"The trained agent ({Path(model).name}: {trained_episodes(meta)} training "
        f"episodes, seed {meta.get('seed', 'n/a')}, kept after episode "
        f"{meta.get('chosen_after_episodes', 'n/a')}, "
        f"{fmt((meta.get('train_seconds') or math.nan) / 60, '{:.0f}')} min of training; "
        f"the paper trained 2,400 episodes) against the baselines on {len(main)} held-out "
        f"episodes of {study.jobs} jobs at the paper's mix (15 servers × 8 GPUs, mean gap "
        f"172 s). Offered load before locality penalties: {fmt(Spread.of(loads), '{:.2f}')} "
        "× the cluster (GPU-seconds asked over GPU-seconds offered while jobs arrive). Means "
        "over episodes, min–max in brackets. Effectiveness is Eq. 2 with the truth's times; "
        "good locality is the share of multi-GPU jobs on the fewest servers they fit."
        + ("" if scorer is None else
           f" Beyond the paper, the per-job scorer ({Path(scorer).name}: "
           f"{trained_episodes(scorer_meta)} training "
           "episodes at loads "
           f"{', '.join(f'{x:g}' for x in scorer_meta.get('loads') or []) or 'n/a'}, seed "
           f"{scorer_meta.get('seed', 'n/a')}, kept after episode "
           f"{scorer_meta.get('chosen_after_episodes', 'n/a')}) scores every waiting job "
           "that fits instead of a window of ten."))
    table = section.table(Table(
        "sched2-main",
        ["policy", "JCT h", "makespan h", "effectiveness", "good locality %",
         "fragmentation (Eq. 1)", "wait h", "run h"],
        ["{}", "{:.1f}", "{:.0f}", "{:.3f}", "{:.0f}", "{:.3f}", "{:.1f}", "{:.2f}"]))
    for p in ("sched2", SCORER, *study.baselines):
        runs = res.runs("mix", 0.68, 1.0, p)
        if not runs:
            continue
        good = res.mean(runs, "good_locality")
        table.rows.append([
            POLICY_TITLES.get(p, title(p)), res.spread(runs, "jct_s", 1 / 3600),
            res.spread(runs, "makespan_s", 1 / 3600), res.spread(runs, "effectiveness"),
            None if good is None else 100 * good, res.mean(runs, "fragmentation"),
            _hours(res.mean(runs, "wait_s")), _hours(res.mean(runs, "run_s"))])
    section.text(
        "SCHED² against the best baseline of each metric (the paper's form: JCT and makespan "
        "as the baseline's ÷ ours, effectiveness as ours ÷ the baseline's; above 1 means "
        "SCHED² is better). \"Paper's\" counts SIF, DSIF, SAF, LRF, SPF and FIFO; \"all\" adds "
        "SJF, QSSF and SWAF with the GPUs asked. SWAF allowed fewer GPUs is left out of both: it "
        "changes the jobs, which neither SCHED² nor the paper's baselines may.")
    vs = section.table(Table(
        "sched2-vs-best",
        ["setting", "baselines", "JCT speed-up (best)", "makespan speed-up (best)",
         "effectiveness ratio (best)", "paper's JCT / makespan / effectiveness"],
        ["{}", "{}", "{}", "{}", "{}", "{}"]))
    settings: list[tuple[str, str, float | None, float]] = [
        ("mix", _mix_label(0.68), 0.68, 1.0),
        *[("mix", _mix_label(s), s, 1.0) for s in study.mixes],
        *[("gap", f"68%, gaps × {g:g}", 0.68, g) for g in study.gap_scales]]
    # A model trained at a gap scale, against the same baselines' replays there.
    for g, path in study.gap_models:
        for r in res.runs("gap-model", 0.68, g, "sched2"):
            res.by[("gap-trained", 0.68, g, "sched2", 10)].append(r)
        for b in comparable:
            res.by[("gap-trained", 0.68, g, b, 10)] = res.runs("gap", 0.68, g, b)
        settings.append(("gap-trained", f"68%, gaps × {g:g}, model trained there "
                         f"({Path(path).name})", 0.68, g))
    summary: dict[str, Any] = {}
    for setting, label, share, gap in settings:
        for group, members in (("paper's", paper), ("all", comparable)):
            v = versus_best(res, setting, share, gap, members)
            if all(r is None for _, r in v.values()):
                continue
            quote = "n/a"
            if setting == "mix" and share == 0.68:
                quote = (f"{SCHED2_PAPER['jct_speedup']} / {SCHED2_PAPER['makespan_speedup']}"
                         f" / {SCHED2_PAPER['effectiveness_ratio']}")
            elif setting == "mix" and share in SCHED2_PAPER["effectiveness_by_mix"]:
                quote = f"effectiveness {SCHED2_PAPER['effectiveness_by_mix'][share]}"
            vs.rows.append([label, group, *[_ratio(v[m]) for m in LOWER], quote])
            summary[f"{label} / {group}"] = {m: {"best": b, "ratio": r}
                                             for m, (b, r) in v.items()}
    _paired_table(section, res, study, paper)
    _sensitivity_table(section, res, comparable)
    _window_table(section, res, study)
    _load_table(section, res, study, settings)
    _plots(section, res, study, out_dir, comparable)
    section.data = {"paper": SCHED2_PAPER, "study": asdict(study), "model": model,
                    "model_meta": dict(meta), "scorer": scorer, "scorer_meta": scorer_meta,
                    "versus_best": summary,
                    "replays": len(results)}
    section.wall_s = time.monotonic() - started
    return section


def _paired(res: Results, setting: str, a: str, b: str) -> dict[str, PairedRatio] | None:
    """``a`` against ``b`` on the episodes both replayed: effectiveness a ÷ b, JCT and
    makespan speed-ups b ÷ a, with paired bootstrap 95% intervals (``sim.paired``)."""
    ra = {r.cell.episode: r.metrics for r in res.runs(setting, 0.68, 1.0, a)}
    rb = {r.cell.episode: r.metrics for r in res.runs(setting, 0.68, 1.0, b)}
    both = sorted(ra.keys() & rb.keys())
    if not both:
        return None
    return {
        "effectiveness": paired_ratio([ra[e].effectiveness for e in both],
                                      [rb[e].effectiveness for e in both]),
        "jct_s": speedup([ra[e].jct_s for e in both], [rb[e].jct_s for e in both]),
        "makespan_s": speedup([ra[e].makespan_s for e in both],
                              [rb[e].makespan_s for e in both]),
    }


def _ci(r: PairedRatio) -> str:
    return f"{r.ratio:.3f} [{r.low:.3f}, {r.high:.3f}]"


def _paired_table(section: Section, res: Results, study: Sched2Study,
                  paper: Sequence[str]) -> None:
    """The agent and the hold rule against each other and the baselines, at every load."""
    section.text(
        "Paired per episode (the same held-out episodes under each policy), with bootstrap "
        "95% intervals over episodes: effectiveness as a ratio, JCT and makespan as "
        "speed-ups (the other's mean ÷ the first's); above 1 the first is better. \"best of "
        "paper's six\" is the one of SIF, DSIF, SAF, LRF, SPF and FIFO with the best mean "
        "effectiveness at that load. The agent counts as working only where it beats the "
        "hold rule, the fixed rule inside its own action space; the scorer, which sees the "
        "whole queue, where it beats the hold rule over the whole queue.")
    table = section.table(Table(
        "sched2-paired", ["load", "episodes", "comparison", "effectiveness", "JCT speed-up",
                          "makespan speed-up"], ["{}", "{}", "{}", "{}", "{}", "{}"]))
    rows = [("mix", f"{workload.IMPLIED_LOAD:g} (implied)")] + [
        (load_setting(load), f"{load:g}") for load in study.loads]
    for setting, label in rows:
        scored = {b: res.mean(res.runs(setting, 0.68, 1.0, b), "effectiveness")
                  for b in paper}
        scored = {b: v for b, v in scored.items() if v is not None}
        best = max(scored, key=scored.__getitem__) if scored else None
        pairs = [("sched2", HOLD), (HOLD, best), ("sched2", best), (HOLD, "swaf-exact"),
                 (HOLD, "qssf"), (HOLD, HOLD_ALL), (SCORER, HOLD), (SCORER, HOLD_ALL),
                 (SCORER, best)]
        for a, b in pairs:
            if b is None:
                continue
            v = _paired(res, setting, a, b)
            if v is None:
                continue
            name = (f"{POLICY_TITLES.get(a, title(a))} vs "
                    f"{POLICY_TITLES.get(b, title(b))}"
                    + (" (best of paper's six)" if b == best else ""))
            table.rows.append([label, str(v["jct_s"].episodes), name,
                               _ci(v["effectiveness"]), _ci(v["jct_s"]),
                               _ci(v["makespan_s"])])


def _hours(seconds: float | None) -> float | None:
    return None if seconds is None else seconds / 3600


def _ratio(value: tuple[str | None, float | None]) -> str:
    best, ratio = value
    if best is None or ratio is None:
        return "n/a"
    return f"{fmt(ratio, '{:.2f}')}× ({POLICY_TITLES.get(best, title(best))})"


def _best_by_effectiveness(res: Results, baselines: Sequence[str]) -> str | None:
    scored = {b: res.mean(res.runs("mix", 0.68, 1.0, b), "effectiveness") for b in baselines}
    scored = {b: v for b, v in scored.items() if v is not None}
    return max(scored, key=scored.__getitem__) if scored else None


def _sensitivity_table(section: Section, res: Results, baselines: Sequence[str]) -> None:
    best = _best_by_effectiveness(res, baselines)
    section.text(
        "Table III's form: multi-GPU jobs of locality-sensitive models (VGG16, Transformer: "
        "5.9× and 2.7× slower over two servers) and insensitive ones (DeepSpeech, Inception3: "
        "1.6× and 1.4×), the share not given the best locality (\"relaxed\") and their mean "
        "wait, for SCHED², the per-job scorer, the hold rule and the baseline with the best "
        "effectiveness, paper's mix.")
    table = section.table(Table(
        "sched2-sensitivity",
        ["policy", "sensitive relaxed %", "insensitive relaxed %", "sensitive wait h",
         "insensitive wait h"], ["{}", "{:.1f}", "{:.1f}", "{:.2f}", "{:.2f}"]))
    p = SCHED2_PAPER
    for name in dict.fromkeys(("sched2", SCORER, HOLD, best)):
        runs = res.runs("mix", 0.68, 1.0, name) if name is not None else []
        if not runs:
            continue
        totals = {k: [0, 0, 0.0] for k in ("sensitive", "insensitive")}
        for r in runs:
            for k, (jobs, relaxed, wait) in r.sensitivity.items():
                totals[k][0] += jobs
                totals[k][1] += relaxed
                totals[k][2] += wait
        row: list[Any] = [POLICY_TITLES.get(name, title(name))]
        for k in ("sensitive", "insensitive"):
            jobs = totals[k][0]
            row.append(100 * totals[k][1] / jobs if jobs else None)
        for k in ("sensitive", "insensitive"):
            jobs = totals[k][0]
            row.append(totals[k][2] / jobs / 3600 if jobs else None)
        table.rows.append(row)
    table.rows.append(["paper, SCHED²", p["relaxed_pct"]["sensitive"],
                       p["relaxed_pct"]["insensitive"],
                       p["wait_by_sensitivity_s"]["sensitive"] / 3600,
                       p["wait_by_sensitivity_s"]["insensitive"] / 3600])


def _window_table(section: Section, res: Results, study: Sched2Study) -> None:
    if not study.windows:
        return
    n = study.window_episodes
    section.text(
        f"What the window costs, on the first {n} held-out episodes of the paper's mix: a "
        "fixed rule in the agent's place (the shortest ideal time among the window's jobs "
        "that fit, never \"no job\") for several J, beside the agent (J = 10) and the best "
        "whole-queue baselines on the same episodes.")
    table = section.table(Table("sched2-window", ["selection", "J", "effectiveness",
                                                  "JCT h", "good locality %"],
                                ["{}", "{}", "{:.3f}", "{:.1f}", "{:.0f}"]))
    episodes = set(tuple(workload.TEST_EPISODES)[:n])

    def row(label: str, window: str, runs: list[CellResult]) -> None:
        runs = [r for r in runs if r.cell.episode in episodes]
        if runs:
            good = res.mean(runs, "good_locality")
            table.rows.append([label, window, res.mean(runs, "effectiveness"),
                               _hours(res.mean(runs, "jct_s")),
                               None if good is None else 100 * good])

    for j in study.windows:
        row("shortest in window (rule)", str(j), res.runs("window", 0.68, 1.0, WINDOW_RULE, j))
    row("SCHED² agent", "10", res.runs("mix", 0.68, 1.0, "sched2"))
    for b in ("sif", "swaf-exact"):
        row(POLICY_TITLES.get(b, b), "whole queue", res.runs("mix", 0.68, 1.0, b))


def _load_table(section: Section, res: Results, study: Sched2Study,
                settings: list[tuple[str, str, float | None, float]]) -> None:
    section.text(
        "The workloads: offered load before locality penalties, one-GPU share, and SCHED²'s "
        "mean wait and run time beside the paper's (Fig. 10: SCHED² 557 s wait, 5,422 s run; "
        "its baselines 19,075 s and 8,427 s).")
    table = section.table(Table(
        "sched2-load", ["setting", "episodes", "offered load", "one-GPU %",
                        "SCHED² wait h", "SCHED² run h"],
        ["{}", "{}", "{:.2f}", "{:.1f}", "{:.2f}", "{:.2f}"]))
    for setting, label, share, gap in settings:
        runs = res.runs(setting, share, gap, "sched2")
        if not runs:
            continue
        table.rows.append([label, str(len(runs)),
                           math.fsum(r.offered_load for r in runs) / len(runs),
                           100 * math.fsum(r.one_gpu_share for r in runs) / len(runs),
                           _hours(res.mean(runs, "wait_s")), _hours(res.mean(runs, "run_s"))])
    table.rows.append(["paper (68%, its trace)", "30", None, 68.0, 557 / 3600, 5422 / 3600])


def _plots(section: Section, res: Results, study: Sched2Study, out_dir: Path,
           baselines: Sequence[str]) -> None:
    plt = pyplot()
    if plt is None:
        return
    first = study.episodes[0]
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for name in ("sched2", *baselines):
        runs = [r for r in res.runs("mix", 0.68, 1.0, name) if r.cell.episode == first]
        if runs and runs[0].series:
            xs, ys = zip(*runs[0].series, strict=True)
            ax.plot(xs, ys, label=POLICY_TITLES.get(name, title(name)), linewidth=1.0)
    ax.set_xlabel("hours")
    ax.set_ylabel("fragmentation (Eq. 1)")
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3)
    name = "sched2_fragmentation.png"
    save_figure(plt, fig, out_dir / name)
    section.figures.append((name, f"Fragmentation over time, held-out episode {first} "
                                  "(the paper's Fig. 9)"))
    curve = Path(study.model or DEFAULT_MODEL).with_suffix(".png")
    if curve.exists():
        shutil.copyfile(curve, out_dir / "sched2_training_curve.png")
        section.figures.append(("sched2_training_curve.png",
                                "Training curve of the evaluated model"))
    scorer = scorer_path(study)
    scorer_curve = Path(scorer).with_suffix(".png") if scorer is not None else None
    if scorer_curve is not None and scorer_curve.exists():
        shutil.copyfile(scorer_curve, out_dir / "sched2_scorer_training_curve.png")
        section.figures.append(("sched2_scorer_training_curve.png",
                                "Training curve of the evaluated per-job scorer"))


STUDY = Study(name="sched2", label="SCHED²", config=Sched2Study, run=run, tiny=tiny,
              add_options=add_options, apply_options=apply_options, run_on=run_on)
